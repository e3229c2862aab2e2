//! One operation of the review queue as JSON, as `review list --json` prints it and
//! `GET /v1/review` answers it.

use chrono::Utc;
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
