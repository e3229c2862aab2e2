//! One operation of the review queue as JSON, as `review list --json` prints it and
//! `GET /v1/review` answers it.

use chrono::Utc;
use opledger_domain::event::OperationEvent;
use opledger_readmodel::ReviewItem;
use serde_json::json;

/// One operation of the review queue as JSON, as `review list --json` prints it and the server's
/// `GET /v1/review` answers it.
pub fn review_item_json(item: &ReviewItem, now: chrono::DateTime<Utc>) -> serde_json::Value {
    json!({
        "operation_id": item.operation_id,
        "state": item.state,
        "since": item.since,
        "age_s": (now - item.since).num_seconds().max(0),
        "tenant": item.tenant,
        "provider": item.provider,
        "account": item.account,
        "attempts": item.attempts,
        "lookups": item.lookups,
        "last_error": item.last_error,
        "last_lookup": item.last_lookup.as_ref().map(|lookup| json!({
            "result": lookup.result,
            "evidence": lookup.evidence,
            "at": lookup.at,
        })),
        "reason": item.review.as_ref().map(|review| &review.reason),
        "evidence": item.review.as_ref().map(|review| &review.evidence),
        "updated_at": item.updated_at,
    })
}

/// What a person deciding an operation needs beside the queue row, from its stream: the frozen
/// arguments, what it is bound to, every attempt with how it ended, and every lookup with its
/// evidence (the queue row carries only the last lookup).
pub fn review_detail_json(history: &[OperationEvent]) -> serde_json::Value {
    let intent = history.iter().find_map(|event| match event {
        OperationEvent::IntentRecorded(intent) => Some(intent),
        _ => None,
    });
    let mut attempts: Vec<serde_json::Value> = Vec::new();
    let mut lookups: Vec<serde_json::Value> = Vec::new();
    for event in history {
        match event {
            OperationEvent::AttemptStarted(started) => attempts.push(json!({
                "attempt_id": started.attempt_id,
                "attempt_number": started.attempt_number,
                "worker": started.worker,
                "started_at": started.at,
                "outcome": "in_flight",
            })),
            OperationEvent::ReconciliationRecorded(lookup) => lookups.push(json!({
                "result": lookup.result,
                "evidence": lookup.evidence,
                "at": lookup.at,
            })),
            other => {
                if let Some((attempt_id, outcome, detail)) = attempt_ending(other) {
                    end_attempt(&mut attempts, &attempt_id, outcome, &detail, other.at());
                }
            }
        }
    }
    json!({
        "args": intent.map(|intent| intent.args.as_map()),
        "args_hash": intent.map(|intent| &intent.args_hash),
        "binding": intent.map(|intent| json!({
            "tenant": intent.tenant,
            "provider": intent.provider,
            "account": intent.account,
            "action": intent.action,
            "credential_fingerprint": intent.credential_fingerprint,
            "idempotency_key": intent.idempotency_key,
        })),
        "attempts": attempts,
        "lookups": lookups,
    })
}

/// The attempt an event ends, how, and what was said; `None` for an event that ends none.
fn attempt_ending(event: &OperationEvent) -> Option<(String, &'static str, String)> {
    let ending = match event {
        OperationEvent::AttemptSucceeded(done) => (
            done.attempt_id.to_string(),
            "succeeded",
            format!("object {}", done.external_id),
        ),
        OperationEvent::AttemptRejected(refused) => (
            refused.attempt_id.to_string(),
            "rejected",
            format!("{}: {}", refused.code, refused.message),
        ),
        OperationEvent::OutcomeUnknown(unknown) => (
            unknown.attempt_id.to_string(),
            "unknown",
            unknown.error.clone(),
        ),
        OperationEvent::AttemptNotSent(not_sent) => (
            not_sent.attempt_id.to_string(),
            "not_sent",
            not_sent.reason.clone(),
        ),
        OperationEvent::LeaseExpired(expired) => (
            expired.attempt_id.to_string(),
            "unknown",
            format!("lease expired at {}", expired.lease_deadline),
        ),
        _ => return None,
    };
    Some(ending)
}

/// Writes how attempt `attempt_id` ended into its entry (the first ending counts: a late answer
/// is its own event in the timeline, not a rewrite of how the attempt ended then).
fn end_attempt(
    attempts: &mut [serde_json::Value],
    attempt_id: &str,
    outcome: &str,
    detail: &str,
    at: chrono::DateTime<Utc>,
) {
    let entry = attempts
        .iter_mut()
        .find(|entry| entry["attempt_id"].as_str() == Some(attempt_id));
    if let Some(entry) = entry.filter(|entry| entry["outcome"] == "in_flight") {
        entry["outcome"] = json!(outcome);
        entry["detail"] = json!(detail);
        entry["ended_at"] = json!(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_domain::event::{
        AttemptStarted, OutcomeUnknown, ReconciliationRecorded, ReconciliationResult,
    };
    use opledger_domain::ids::WorkerId;
    use opledger_domain::testing::{at_s, attempt, intent};

    #[test]
    fn a_review_detail_carries_the_arguments_the_binding_every_attempt_and_every_lookup() {
        let started = |n: u128| {
            OperationEvent::AttemptStarted(AttemptStarted {
                request: None,
                budget_wait: None,
                attempt_id: attempt(n),
                attempt_number: u32::try_from(n).expect("small"),
                worker: WorkerId::new("w-1").expect("valid"),
                lease_deadline: at_s(60),
                at: at_s(1),
            })
        };
        let lookup = |evidence: &str| {
            OperationEvent::ReconciliationRecorded(ReconciliationRecorded {
                result: ReconciliationResult::NotFound {
                    authoritative: false,
                },
                evidence: evidence.to_owned(),
                next_check_not_before: None,
                at: at_s(5),
            })
        };
        let history = vec![
            OperationEvent::IntentRecorded(intent(false)),
            started(1),
            OperationEvent::OutcomeUnknown(OutcomeUnknown {
                attempt_id: attempt(1),
                error: "read timed out".into(),
                check_not_before: None,
                at: at_s(2),
            }),
            lookup("first search: nothing"),
            lookup("second search: nothing"),
            started(2),
        ];
        let detail = review_detail_json(&history);
        assert_eq!(detail["binding"]["account"], "acct-1");
        assert_eq!(detail["binding"]["provider"], "crm");
        assert!(detail["args"].is_object(), "{detail}");
        let attempts = detail["attempts"].as_array().expect("attempts");
        assert_eq!(attempts.len(), 2);
        assert_eq!(attempts[0]["outcome"], "unknown");
        assert_eq!(attempts[0]["detail"], "read timed out");
        assert_eq!(attempts[1]["outcome"], "in_flight");
        let lookups = detail["lookups"].as_array().expect("lookups");
        assert_eq!(lookups.len(), 2, "every lookup, not only the last");
        assert_eq!(lookups[0]["evidence"], "first search: nothing");
    }
}
