//! The duplicates read model: every sign that one request may have become two objects.
//!
//! Three kinds, from the strongest to the weakest:
//! - **detected**: the ledger recorded `DuplicateDetected` — a second object showed up for an
//!   operation already confirmed with another (design rule 7);
//! - **shared external ids**: one external object named by more than one operation; derived by a
//!   query over the external-id index of [`crate::id_index`], nothing to fold here;
//! - **possible duplicate intents**: two operations of the same tenant asking the same provider
//!   account for the same action with the same arguments within
//!   [`POSSIBLE_DUPLICATE_WINDOW_S`], from different deliveries (or deliveries that named none).
//!   That is what an agent that retried by recording a *new* intent looks like — and also what
//!   "make another such task" looks like, which is legitimate (design rule 2). So these are only
//!   flagged for a person, never blocked, and the argument hash is never an identity.
//!
//! A redelivery of the same source id resolves to the same operation and records nothing new, so
//! it is never flagged. This module must never read a clock: "within the window" compares the
//! times recorded in the two intents.

use chrono::{DateTime, Duration, Utc};
use opledger_domain::args::ArgsHash;
use opledger_domain::event::{IntentRecorded, OperationEvent};
use opledger_domain::ids::{
    AccountId, ActionName, ExternalObjectId, GlobalPosition, OperationId, ProviderId, SourceId,
    TenantId,
};

use crate::context::FoldContext;

/// How far apart two identical intents may be recorded and still be flagged, in seconds.
pub const POSSIBLE_DUPLICATE_WINDOW_S: i64 = 10 * 60;
/// Most earlier identical intents one new intent is compared with (and so flagged against); the
/// newest are taken. Bounds the work and the rows one burst of identical requests can cause: a
/// burst of any size stays connected for a reviewer, because each of its intents is flagged
/// against its nearest predecessors, which were flagged against theirs.
pub const MAX_SIMILAR_INTENTS_CHECKED: usize = 8;

/// A `DuplicateDetected` fact, as the read model lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetectedDuplicate {
    /// Where the fact sits in the log; also its identity in the read model.
    pub position: GlobalPosition,
    /// The operation.
    pub operation_id: OperationId,
    /// The provider the objects live at.
    pub provider: ProviderId,
    /// The account the objects live in.
    pub account: AccountId,
    /// The object the operation stays confirmed with.
    pub confirmed_external_id: ExternalObjectId,
    /// The other object.
    pub duplicate_external_id: ExternalObjectId,
    /// How it was found.
    pub found_by: String,
    /// When.
    pub at: DateTime<Utc>,
}

/// An earlier intent with the same tenant, provider, account, action and arguments, as the
/// runner found it in the read model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimilarIntent {
    /// Its operation.
    pub operation_id: OperationId,
    /// The delivery that asked for it, if named.
    pub source_id: Option<SourceId>,
    /// When it was recorded.
    pub recorded_at: DateTime<Utc>,
}

/// What the runner must look up before folding an `IntentRecorded`: the earlier intents that may
/// be its duplicates. Comparing only these (rather than every operation) keeps the fold bounded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimilarIntentQuery {
    /// The new intent's operation, to leave out.
    pub operation_id: OperationId,
    /// Same tenant.
    pub tenant: TenantId,
    /// Same provider: an account id is only unique within its provider.
    pub provider: ProviderId,
    /// Same account.
    pub account: AccountId,
    /// Same action: the same arguments for another action are another request.
    pub action: ActionName,
    /// Same arguments.
    pub args_hash: ArgsHash,
    /// Recorded at or after this time…
    pub from: DateTime<Utc>,
    /// …and at or before this one.
    pub to: DateTime<Utc>,
    /// At most this many, the newest first.
    pub limit: usize,
}

/// Two operations that may be one request made twice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PossibleDuplicateIntent {
    /// The later operation (in log order).
    pub operation_id: OperationId,
    /// The earlier one.
    pub earlier_operation_id: OperationId,
    /// Their tenant.
    pub tenant: TenantId,
    /// Their provider.
    pub provider: ProviderId,
    /// Their account.
    pub account: AccountId,
    /// Their action.
    pub action: ActionName,
    /// Their arguments' hash.
    pub args_hash: ArgsHash,
    /// The later one's delivery id.
    pub source_id: Option<SourceId>,
    /// The earlier one's delivery id.
    pub earlier_source_id: Option<SourceId>,
    /// How far apart they were recorded, in milliseconds.
    pub gap_ms: i64,
    /// When the later one was recorded.
    pub at: DateTime<Utc>,
    /// The later one's intent position in the log.
    pub position: GlobalPosition,
}

/// How one event changes the duplicates read model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DuplicateChange {
    /// A `DuplicateDetected` fact.
    Detected(DetectedDuplicate),
    /// A pair of intents flagged for a person.
    PossibleIntent(PossibleDuplicateIntent),
}

/// The window around an intent to look for similar ones in; `None` for any other event.
pub fn similar_intent_query(
    operation_id: OperationId,
    event: &OperationEvent,
) -> Option<SimilarIntentQuery> {
    let OperationEvent::IntentRecorded(intent) = event else {
        return None;
    };
    let (from, to) = similar_intent_range(intent);
    Some(SimilarIntentQuery {
        operation_id,
        tenant: intent.tenant.clone(),
        provider: intent.provider.clone(),
        account: intent.account.clone(),
        action: intent.action.clone(),
        args_hash: intent.args_hash.clone(),
        from,
        to,
        limit: MAX_SIMILAR_INTENTS_CHECKED,
    })
}

/// The time range [`similar_intent_query`] asks about around `intent` (first, last), for a
/// caller that matches the request by its own key and needs no copy of its names.
pub fn similar_intent_range(intent: &IntentRecorded) -> (DateTime<Utc>, DateTime<Utc>) {
    let window = window();
    // Times at the ends of the calendar cannot be widened; the intent's own time still is a
    // correct (narrower) bound.
    (
        intent.at.checked_sub_signed(window).unwrap_or(intent.at),
        intent.at.checked_add_signed(window).unwrap_or(intent.at),
    )
}

/// The duplicates read model's changes for one event.
pub fn changes(ctx: &FoldContext<'_>, event: &OperationEvent) -> Vec<DuplicateChange> {
    match event {
        OperationEvent::DuplicateDetected(duplicate) => {
            let Some(intent) = ctx.after.intent.as_ref() else {
                return Vec::new();
            };
            vec![DuplicateChange::Detected(DetectedDuplicate {
                position: ctx.position,
                operation_id: ctx.operation_id,
                provider: intent.provider.clone(),
                account: intent.account.clone(),
                confirmed_external_id: duplicate.confirmed_external_id.clone(),
                duplicate_external_id: duplicate.duplicate_external_id.clone(),
                found_by: duplicate.found_by.clone(),
                at: duplicate.at,
            })]
        }
        OperationEvent::IntentRecorded(intent) => ctx
            .similar_intents
            .iter()
            .filter(|earlier| earlier.operation_id != ctx.operation_id)
            .filter(|earlier| different_deliveries(&intent.source_id, &earlier.source_id))
            .filter_map(|earlier| {
                let gap = (intent.at - earlier.recorded_at).abs();
                (gap <= window()).then(|| {
                    DuplicateChange::PossibleIntent(PossibleDuplicateIntent {
                        operation_id: ctx.operation_id,
                        earlier_operation_id: earlier.operation_id,
                        tenant: intent.tenant.clone(),
                        provider: intent.provider.clone(),
                        account: intent.account.clone(),
                        action: intent.action.clone(),
                        args_hash: intent.args_hash.clone(),
                        source_id: intent.source_id.clone(),
                        earlier_source_id: earlier.source_id.clone(),
                        gap_ms: gap.num_milliseconds(),
                        at: intent.at,
                        position: ctx.position,
                    })
                })
            })
            .take(MAX_SIMILAR_INTENTS_CHECKED)
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether two intents came from different deliveries. Without a source id nothing ties two
/// requests together, so a missing id on either side counts as different.
fn different_deliveries(a: &Option<SourceId>, b: &Option<SourceId>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a != b,
        _ => true,
    }
}

fn window() -> Duration {
    Duration::seconds(POSSIBLE_DUPLICATE_WINDOW_S)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_models::fold_event;
    use crate::read_models::test_support::{at, events, fold_all, intent, operation, source};
    use opledger_domain::ids::StreamVersion;

    fn similar(n: u128, source_id: Option<&str>, seconds: i64) -> SimilarIntent {
        SimilarIntent {
            operation_id: operation(n),
            source_id: source_id.map(source),
            recorded_at: at(seconds),
        }
    }

    fn flags(new_source: Option<&str>, at_s: i64, earlier: &[SimilarIntent]) -> Vec<OperationId> {
        let event = intent(operation(100), new_source, at_s);
        let folded = fold_event(
            operation(100),
            None,
            StreamVersion::FIRST,
            GlobalPosition::new(9),
            earlier,
            &event,
        )
        .expect("folds");
        folded
            .changes
            .duplicates
            .iter()
            .map(|change| match change {
                DuplicateChange::PossibleIntent(pair) => {
                    assert_eq!(pair.operation_id, operation(100));
                    assert_eq!(pair.position, GlobalPosition::new(9));
                    pair.earlier_operation_id
                }
                other => panic!("only pairs expected: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn identical_intents_from_other_deliveries_within_the_window_are_flagged() {
        let window = POSSIBLE_DUPLICATE_WINDOW_S;
        let earlier = [
            similar(1, Some("call-1"), 0),
            similar(2, None, 0),
            similar(3, Some("call-9"), 0),
            similar(4, Some("call-1"), -window - 1),
        ];
        assert_eq!(
            flags(Some("call-9"), 60, &earlier),
            vec![operation(1), operation(2)],
            "another source and no source are flagged; the same source is not"
        );
        assert_eq!(
            flags(None, window, &earlier),
            vec![operation(1), operation(2), operation(3)],
            "the window's edge is inside it; the older one is outside"
        );
        assert!(flags(None, window + 1, &earlier[..3]).is_empty());
    }

    #[test]
    fn the_lookup_window_spans_the_constant_around_the_intent_and_only_for_intents() {
        let event = intent(operation(1), None, 1000);
        let query = similar_intent_query(operation(1), &event).expect("an intent");
        assert_eq!(query.from, at(1000 - POSSIBLE_DUPLICATE_WINDOW_S));
        assert_eq!(query.to, at(1000 + POSSIBLE_DUPLICATE_WINDOW_S));
        assert_eq!(query.limit, MAX_SIMILAR_INTENTS_CHECKED);
        let later = events::unknown_then_found(operation(1), "1");
        assert!(similar_intent_query(operation(1), &later[1]).is_none());
    }

    #[test]
    fn a_detected_duplicate_is_recorded_with_its_position_and_binding() {
        let steps = fold_all(&events::late_duplicate(operation(7), "731", "732"));
        let detected: Vec<_> = steps
            .iter()
            .flat_map(|step| step.duplicates.clone())
            .collect();
        let [DuplicateChange::Detected(found)] = detected.as_slice() else {
            panic!("one detection: {detected:?}");
        };
        assert_eq!(found.confirmed_external_id.as_str(), "731");
        assert_eq!(found.duplicate_external_id.as_str(), "732");
        assert_eq!(found.account.as_str(), "acct-1");
        assert_eq!(found.position, GlobalPosition::new(steps.len() as u64));
    }
}
