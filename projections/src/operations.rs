//! The operations read model: one row per operation, as it stands now.
//!
//! What an operator or the agent-facing API shows first: where the operation is bound, what state
//! it is in, how many attempts it took, what it was confirmed with and what went wrong last. Every
//! field is taken from the operation's folded state after the event, so the row can never say
//! anything the ledger does not. It must never be used to decide a command: decisions fold the
//! stream itself, because a read model lags the log.

use chrono::{DateTime, Utc};
use opledger_domain::args::ArgsHash;
use opledger_domain::event::OperationEvent;
use opledger_domain::ids::{
    AccountId, ActionName, ExternalObjectId, GlobalPosition, OperationId, ProviderId, SourceId,
    StreamVersion, TenantId,
};
use opledger_domain::state::{OperationState, Status};

use crate::context::FoldContext;

/// Every state name an operation row can hold, as [`Status::name`] writes them.
pub const STATE_NAMES: [&str; 10] = [
    "new",
    "awaiting_approval",
    "denied",
    "pending",
    "in_flight",
    "succeeded",
    "rejected",
    "unknown",
    "needs_review",
    "abandoned",
];

/// One operation, as the read model holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationRow {
    /// The operation.
    pub operation_id: OperationId,
    /// Whose it is.
    pub tenant: TenantId,
    /// The external system it changes.
    pub provider: ProviderId,
    /// The account there it is bound to.
    pub account: AccountId,
    /// What it does there.
    pub action: ActionName,
    /// The hash of its frozen arguments.
    pub args_hash: ArgsHash,
    /// The delivery that asked for it, when one was named.
    pub source_id: Option<SourceId>,
    /// Its state's name (one of [`STATE_NAMES`]).
    pub state: &'static str,
    /// Attempts started so far.
    pub attempts: u32,
    /// The object the provider confirmed, once it has.
    pub external_id: Option<ExternalObjectId>,
    /// The latest error or refusal.
    pub last_error: Option<String>,
    /// When the intent was recorded.
    pub created_at: DateTime<Utc>,
    /// When the latest event happened.
    pub updated_at: DateTime<Utc>,
    /// The version of the latest event folded.
    pub stream_version: StreamVersion,
    /// The position of the latest event folded.
    pub last_position: GlobalPosition,
    /// While in flight: when the attempt's lease lapses.
    pub lease_deadline: Option<DateTime<Utc>>,
    /// While unresolved (unknown or needs review): when it last became unknown.
    pub unknown_since: Option<DateTime<Utc>>,
    /// While in review: why.
    pub needs_review_reason: Option<String>,
}

/// The operation's row after the event: the whole row, written over the previous one. `None`
/// only when the state after the event has no intent, which [`crate::read_models::project`]
/// reports as a broken stream.
pub fn change(ctx: &FoldContext<'_>, event: &OperationEvent) -> Option<OperationRow> {
    row(
        ctx.operation_id,
        ctx.after,
        ctx.version,
        ctx.position,
        event.at(),
    )
}

/// The row of an operation whose state, folded up to the event at `version` and `position`
/// (which happened at `event_at`), is `state`. The same row as [`change`] gives for that event;
/// a fold that keeps the state can so build the row once, when it writes it, instead of after
/// every event. `None` when the state has no intent.
pub fn row(
    operation_id: OperationId,
    state: &OperationState,
    version: StreamVersion,
    position: GlobalPosition,
    event_at: DateTime<Utc>,
) -> Option<OperationRow> {
    let intent = state.intent.as_ref()?;
    let unresolved = matches!(state.status, Status::Unknown | Status::NeedsReview);
    Some(OperationRow {
        operation_id,
        tenant: intent.tenant.clone(),
        provider: intent.provider.clone(),
        account: intent.account.clone(),
        action: intent.action.clone(),
        args_hash: intent.args_hash.clone(),
        source_id: intent.source_id.clone(),
        state: state.status.name(),
        attempts: state.attempts,
        external_id: state.external_id().cloned(),
        last_error: state.last_error.clone(),
        created_at: intent.at,
        // `evolve` sets it from every event; the event's own time is the same value, and keeps
        // the row complete should a state ever lack it.
        updated_at: state.updated_at.unwrap_or(event_at),
        stream_version: version,
        last_position: position,
        lease_deadline: match state.status {
            Status::InFlight => state.current_attempt.as_ref().map(|a| a.lease_deadline),
            _ => None,
        },
        // The folded state keeps the time of the last fall into unknown forever; once the
        // operation is resolved that time would only mislead, so the row shows it while it counts.
        unknown_since: state.unknown_since.filter(|_| unresolved),
        needs_review_reason: state.review_reason.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_models::test_support::{at, attempt, events, fold_all, intent, operation};
    use opledger_domain::event::{AttemptStarted, OutcomeUnknown, ReviewRequired};
    use opledger_domain::ids::WorkerId;

    #[test]
    fn the_row_shows_the_lease_while_in_flight_and_unknown_since_while_unresolved() {
        let started = OperationEvent::AttemptStarted(AttemptStarted {
            request: None,
            budget_wait: None,
            attempt_id: attempt(1),
            attempt_number: 1,
            worker: WorkerId::new("w").expect("valid"),
            lease_deadline: at(30),
            at: at(1),
        });
        let rows = fold_all(&[intent(operation(1), None, 0), started.clone()]);
        let in_flight = rows.last().expect("a row").operation.clone();
        assert_eq!(in_flight.state, "in_flight");
        assert_eq!(in_flight.lease_deadline, Some(at(30)));
        assert_eq!(in_flight.attempts, 1);
        assert_eq!(in_flight.created_at, at(0));
        assert_eq!(in_flight.stream_version, StreamVersion::new(1));

        let rows = fold_all(&[
            intent(operation(1), None, 0),
            started,
            OperationEvent::OutcomeUnknown(OutcomeUnknown {
                check_not_before: None,
                attempt_id: attempt(1),
                error: "timeout".into(),
                at: at(5),
            }),
            OperationEvent::ReviewRequired(ReviewRequired {
                reason: "no contract".into(),
                evidence: "nothing found".into(),
                at: at(9),
            }),
        ]);
        let review = &rows.last().expect("a row").operation;
        assert_eq!(review.state, "needs_review");
        assert_eq!(review.lease_deadline, None);
        assert_eq!(review.unknown_since, Some(at(5)));
        assert_eq!(review.needs_review_reason.as_deref(), Some("no contract"));
        assert_eq!(review.last_error.as_deref(), Some("timeout"));
        assert_eq!(review.updated_at, at(9));
    }

    #[test]
    fn a_resolved_operation_no_longer_shows_when_it_was_unknown() {
        let rows = fold_all(&events::unknown_then_found(operation(2), "731"));
        let row = &rows.last().expect("a row").operation;
        assert_eq!(row.state, "succeeded");
        assert_eq!(row.external_id.as_ref().map(|id| id.as_str()), Some("731"));
        assert_eq!(row.unknown_since, None);
    }

    #[test]
    fn state_names_cover_every_status() {
        for status in [
            Status::New,
            Status::AwaitingApproval,
            Status::Denied,
            Status::Pending,
            Status::InFlight,
            Status::Succeeded {
                external_id: ExternalObjectId::new("1").expect("valid"),
            },
            Status::Rejected,
            Status::Unknown,
            Status::NeedsReview,
            Status::Abandoned,
        ] {
            assert!(STATE_NAMES.contains(&status.name()), "{}", status.name());
        }
    }
}
