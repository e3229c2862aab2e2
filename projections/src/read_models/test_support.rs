//! Small builders for the folds' unit tests: fixed times, ids and short realistic histories.

use chrono::{DateTime, TimeZone, Utc};
use opledger_domain::args::ArgsSnapshot;
use opledger_domain::event::{IntentRecorded, OperationEvent};
use opledger_domain::ids::{
    AccountId, ActionName, AttemptId, CredentialFingerprint, GlobalPosition, IdempotencyKey,
    OperationId, ProviderId, SourceId, StreamVersion, TenantId,
};
use uuid::Uuid;

use crate::read_models::{fold_event, Changes};

pub fn at(seconds: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + seconds, 0)
        .single()
        .expect("a valid test time")
}

pub fn operation(n: u128) -> OperationId {
    OperationId::from_uuid(Uuid::from_u128(n))
}

pub fn attempt(n: u128) -> AttemptId {
    AttemptId::from_uuid(Uuid::from_u128(1_000 + n))
}

pub fn source(text: &str) -> SourceId {
    SourceId::new(text).expect("a valid source id")
}

/// The intent every test operation starts with: the same tenant, account and arguments.
pub fn intent(operation_id: OperationId, source_id: Option<&str>, seconds: i64) -> OperationEvent {
    let args = ArgsSnapshot::new(serde_json::json!({"title": "Call the client"})).expect("valid");
    OperationEvent::IntentRecorded(IntentRecorded {
        operation_id,
        tenant: TenantId::new("acme").expect("valid"),
        owner: None,
        provider: ProviderId::new("crm").expect("valid"),
        account: AccountId::new("acct-1").expect("valid"),
        credential_fingerprint: CredentialFingerprint::new("fp").expect("valid"),
        action: ActionName::new("create_task").expect("valid"),
        args_hash: args.hash(),
        args,
        idempotency_key: IdempotencyKey::new("k").expect("valid"),
        source_id: source_id.map(source),
        requires_approval: false,
        executor: Default::default(),
        at: at(seconds),
    })
}

/// Folds one operation's history (its first event must be the intent) at positions 1, 2, …
pub fn fold_all(history: &[OperationEvent]) -> Vec<Changes> {
    let Some(OperationEvent::IntentRecorded(first)) = history.first() else {
        panic!("a history starts with its intent");
    };
    let operation_id = first.operation_id;
    let mut previous = None;
    let mut all = Vec::new();
    for (index, event) in history.iter().enumerate() {
        let version = StreamVersion::new(index as u64);
        let position = GlobalPosition::new(index as u64 + 1);
        let folded =
            fold_event(operation_id, previous, version, position, &[], event).expect("folds");
        previous = Some((folded.state, version));
        all.push(folded.changes);
    }
    all
}

/// Short histories as the decider writes them.
pub mod events {
    use super::*;
    use opledger_domain::event::{
        AttemptStarted, AttemptSucceeded, DuplicateDetected, LateResponse, LateResponseReceived,
        OutcomeUnknown, ReconciliationRecorded, ReconciliationResult, RetryScheduled,
        ReviewRequired,
    };
    use opledger_domain::ids::{ExternalObjectId, WorkerId};

    fn external(id: &str) -> ExternalObjectId {
        ExternalObjectId::new(id).expect("valid")
    }

    fn started(n: u128, seconds: i64) -> OperationEvent {
        OperationEvent::AttemptStarted(AttemptStarted {
            request: None,
            budget_wait: None,
            attempt_id: attempt(n),
            attempt_number: u32::try_from(n).expect("small"),
            worker: WorkerId::new("w").expect("valid"),
            lease_deadline: at(seconds + 30),
            at: at(seconds),
        })
    }

    fn timed_out(n: u128, seconds: i64) -> OperationEvent {
        OperationEvent::OutcomeUnknown(OutcomeUnknown {
            check_not_before: None,
            attempt_id: attempt(n),
            error: "timeout".into(),
            at: at(seconds),
        })
    }

    fn lookup(result: ReconciliationResult, evidence: &str, seconds: i64) -> OperationEvent {
        OperationEvent::ReconciliationRecorded(ReconciliationRecorded {
            result,
            evidence: evidence.into(),
            next_check_not_before: None,
            at: at(seconds),
        })
    }

    fn found(id: &str, seconds: i64) -> OperationEvent {
        lookup(
            ReconciliationResult::Found {
                external_id: external(id),
                account: AccountId::new("acct-1").expect("valid"),
            },
            "GET /tasks/…",
            seconds,
        )
    }

    fn not_found(seconds: i64) -> OperationEvent {
        lookup(
            ReconciliationResult::NotFound {
                authoritative: true,
            },
            "GET /tasks?label=… → []",
            seconds,
        )
    }

    fn succeeded(n: u128, id: &str, seconds: i64) -> OperationEvent {
        OperationEvent::AttemptSucceeded(AttemptSucceeded {
            attempt_id: attempt(n),
            external_id: external(id),
            provider_request_id: None,
            at: at(seconds),
        })
    }

    fn duplicate(confirmed: &str, other: &str, found_by: &str, seconds: i64) -> OperationEvent {
        OperationEvent::DuplicateDetected(DuplicateDetected {
            confirmed_external_id: external(confirmed),
            duplicate_external_id: external(other),
            found_by: found_by.into(),
            at: at(seconds),
        })
    }

    /// Sent, timed out, found by a lookup.
    pub fn unknown_then_found(operation_id: OperationId, id: &str) -> Vec<OperationEvent> {
        vec![
            intent(operation_id, None, 0),
            started(1, 1),
            timed_out(1, 5),
            found(id, 7),
        ]
    }

    /// Sent, timed out, nothing found, no safe retry: handed to a person.
    pub fn unknown_then_review(operation_id: OperationId) -> Vec<OperationEvent> {
        vec![
            intent(operation_id, None, 0),
            started(1, 1),
            timed_out(1, 5),
            not_found(7),
            OperationEvent::ReviewRequired(ReviewRequired {
                reason: "no safe retry".into(),
                evidence: "nothing found".into(),
                at: at(9),
            }),
        ]
    }

    /// Timed out, retried safely and confirmed as `confirmed`; then the first attempt's late
    /// response names `other`.
    pub fn late_duplicate(
        operation_id: OperationId,
        confirmed: &str,
        other: &str,
    ) -> Vec<OperationEvent> {
        vec![
            intent(operation_id, None, 0),
            started(1, 1),
            timed_out(1, 5),
            not_found(6),
            OperationEvent::RetryScheduled(RetryScheduled {
                not_before: at(6),
                reason: "unique label".into(),
                at: at(6),
            }),
            started(2, 7),
            succeeded(2, confirmed, 8),
            OperationEvent::LateResponseReceived(LateResponseReceived {
                attempt_id: attempt(1),
                response: LateResponse::Succeeded {
                    external_id: external(other),
                    provider_request_id: None,
                },
                at: at(9),
            }),
            duplicate(confirmed, other, "late response to attempt 1", 9),
        ]
    }

    /// Confirmed as `confirmed`; a later lookup finds `other` as well.
    pub fn found_duplicate_by_lookup(
        operation_id: OperationId,
        confirmed: &str,
        other: &str,
    ) -> Vec<OperationEvent> {
        vec![
            intent(operation_id, None, 0),
            started(1, 1),
            succeeded(1, confirmed, 2),
            found(other, 3),
            duplicate(confirmed, other, "reconciliation", 3),
        ]
    }
}
