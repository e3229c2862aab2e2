//! The id index read model: from any id an incident reviewer holds back to the operation.
//!
//! A reviewer starts from whatever they have — an attempt id in a worker's log, a CRM task id,
//! the tool-call id an agent used — and needs the operation, to replay its whole chain (intent →
//! attempts → responses → reconciliation → decision). This model indexes attempt ids, external
//! object ids and source (delivery) ids. External ids are indexed under their provider and
//! account, because `731` means different objects in different CRMs; the same object named by
//! two operations is how a shared external id (a duplicate) is found. It must never drop an id
//! once indexed: ids in the ledger are facts, and a fact stays traceable.

use chrono::{DateTime, Utc};
use opledger_domain::event::{
    AttemptStarted, IntentRecorded, LateResponse, OperationEvent, ReconciliationResult,
    ReviewDecision,
};
use opledger_domain::ids::{
    AccountId, AttemptId, ExternalObjectId, GlobalPosition, OperationId, ProviderId, SourceId,
    TenantId, WorkerId,
};

use crate::context::FoldContext;

/// How an operation names an external object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExternalIdRole {
    /// Named by a response or lookup, but neither the outcome nor a detected duplicate (a late
    /// confirmation for an operation that can no longer settle, a refused piece of evidence).
    Reported,
    /// A second object found after the operation was confirmed with another.
    Duplicate,
    /// The object the operation is confirmed with.
    Confirmed,
}

impl ExternalIdRole {
    /// The role's name as stored.
    pub fn name(self) -> &'static str {
        match self {
            Self::Reported => "reported",
            Self::Duplicate => "duplicate",
            Self::Confirmed => "confirmed",
        }
    }
}

/// How one event extends the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdIndexChange {
    /// An attempt started.
    Attempt {
        /// The attempt.
        attempt_id: AttemptId,
        /// Its operation.
        operation_id: OperationId,
        /// Its number.
        number: u32,
        /// The worker that made it.
        worker: WorkerId,
        /// When it started.
        started_at: DateTime<Utc>,
        /// Where it was recorded.
        position: GlobalPosition,
    },
    /// An intent named its delivery.
    Source {
        /// The tenant; source ids are unique per tenant.
        tenant: TenantId,
        /// The delivery id.
        source_id: SourceId,
        /// Its operation.
        operation_id: OperationId,
        /// Where it was recorded.
        position: GlobalPosition,
    },
    /// An event named an external object. When one operation names the same object again, the
    /// stronger role wins (confirmed over duplicate over reported) and the first position stays.
    ExternalId {
        /// The provider it lives at.
        provider: ProviderId,
        /// The account it lives in.
        account: AccountId,
        /// The object's id there.
        external_id: ExternalObjectId,
        /// The operation naming it.
        operation_id: OperationId,
        /// How the operation names it.
        role: ExternalIdRole,
        /// Where it was named.
        position: GlobalPosition,
    },
}

/// The index entries one event adds.
pub fn changes(ctx: &FoldContext<'_>, event: &OperationEvent) -> Vec<IdIndexChange> {
    let Some(intent) = ctx.after.intent.as_ref() else {
        return Vec::new();
    };
    let naming = Naming {
        ctx,
        intent,
        confirmed: ctx.after.external_id(),
    };
    let named =
        |external_id: &ExternalObjectId, role: ExternalIdRole| naming.change(external_id, role);
    match event {
        OperationEvent::IntentRecorded(recorded) => source_changes(ctx, recorded),
        OperationEvent::AttemptStarted(started) => vec![attempt_change(ctx, started)],
        OperationEvent::AttemptSucceeded(succeeded) => {
            vec![named(&succeeded.external_id, ExternalIdRole::Reported)]
        }
        OperationEvent::ReconciliationRecorded(reconciled) => match &reconciled.result {
            ReconciliationResult::Found { external_id, .. } => {
                vec![named(external_id, ExternalIdRole::Reported)]
            }
            _ => Vec::new(),
        },
        OperationEvent::ReviewResolved(resolved) => match &resolved.decision {
            ReviewDecision::ConfirmSucceeded { external_id } => {
                vec![named(external_id, ExternalIdRole::Reported)]
            }
            _ => Vec::new(),
        },
        OperationEvent::LateResponseReceived(late) => match &late.response {
            LateResponse::Succeeded { external_id, .. } => {
                vec![named(external_id, ExternalIdRole::Reported)]
            }
            LateResponse::Rejected { .. } => Vec::new(),
        },
        OperationEvent::DuplicateDetected(duplicate) => vec![
            named(&duplicate.confirmed_external_id, ExternalIdRole::Reported),
            named(&duplicate.duplicate_external_id, ExternalIdRole::Duplicate),
        ],
        OperationEvent::ApprovalGranted(_)
        | OperationEvent::ApprovalDenied(_)
        | OperationEvent::AttemptRejected(_)
        | OperationEvent::LookupClaimed(_)
        | OperationEvent::OutcomeUnknown(_)
        | OperationEvent::AttemptNotSent(_)
        | OperationEvent::SendPostponed(_)
        | OperationEvent::LookupPostponed(_)
        | OperationEvent::LeaseExpired(_)
        | OperationEvent::RetryScheduled(_)
        | OperationEvent::ReviewRequired(_) => Vec::new(),
    }
}

/// What an external id is indexed under: the operation's provider and account, and the object
/// it is confirmed with, whose role is always `Confirmed`.
struct Naming<'a> {
    ctx: &'a FoldContext<'a>,
    intent: &'a IntentRecorded,
    confirmed: Option<&'a ExternalObjectId>,
}

impl Naming<'_> {
    /// The entry for `external_id` named in `role`, unless it is the confirmed object.
    fn change(&self, external_id: &ExternalObjectId, role: ExternalIdRole) -> IdIndexChange {
        IdIndexChange::ExternalId {
            provider: self.intent.provider.clone(),
            account: self.intent.account.clone(),
            external_id: external_id.clone(),
            operation_id: self.ctx.operation_id,
            role: if self.confirmed == Some(external_id) {
                ExternalIdRole::Confirmed
            } else {
                role
            },
            position: self.ctx.position,
        }
    }
}

/// The entry of an intent's delivery id, if it names one.
fn source_changes(ctx: &FoldContext<'_>, recorded: &IntentRecorded) -> Vec<IdIndexChange> {
    recorded
        .source_id
        .iter()
        .map(|source_id| IdIndexChange::Source {
            tenant: recorded.tenant.clone(),
            source_id: source_id.clone(),
            operation_id: ctx.operation_id,
            position: ctx.position,
        })
        .collect()
}

/// The entry of a started attempt.
fn attempt_change(ctx: &FoldContext<'_>, started: &AttemptStarted) -> IdIndexChange {
    IdIndexChange::Attempt {
        attempt_id: started.attempt_id,
        operation_id: ctx.operation_id,
        number: started.attempt_number,
        worker: started.worker.clone(),
        started_at: started.at,
        position: ctx.position,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_models::test_support::{attempt, events, fold_all, intent, operation};

    fn external(changes: &[IdIndexChange]) -> Vec<(String, ExternalIdRole)> {
        changes
            .iter()
            .filter_map(|change| match change {
                IdIndexChange::ExternalId {
                    external_id, role, ..
                } => Some((external_id.to_string(), *role)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_source_id_and_each_attempt_are_indexed_to_their_operation() {
        let steps = fold_all(&[intent(operation(1), Some("call-1"), 0)]);
        assert!(matches!(
            steps[0].id_index.as_slice(),
            [IdIndexChange::Source { source_id, operation_id, .. }]
                if source_id.as_str() == "call-1" && *operation_id == operation(1)
        ));
        let steps = fold_all(&events::unknown_then_found(operation(1), "731"));
        assert!(matches!(
            steps[1].id_index.as_slice(),
            [IdIndexChange::Attempt { attempt_id, number: 1, .. }] if *attempt_id == attempt(1)
        ));
    }

    #[test]
    fn the_confirmed_object_and_a_late_second_object_get_their_roles() {
        let steps = fold_all(&events::late_duplicate(operation(1), "731", "732"));
        let all: Vec<_> = steps
            .iter()
            .flat_map(|step| external(&step.id_index))
            .collect();
        assert_eq!(
            all,
            vec![
                ("731".to_owned(), ExternalIdRole::Confirmed),
                ("732".to_owned(), ExternalIdRole::Reported),
                ("731".to_owned(), ExternalIdRole::Confirmed),
                ("732".to_owned(), ExternalIdRole::Duplicate),
            ],
            "the late response names 732 first; the detection then marks it a duplicate"
        );
        assert!(ExternalIdRole::Confirmed > ExternalIdRole::Duplicate);
        assert!(ExternalIdRole::Duplicate > ExternalIdRole::Reported);
    }
}
