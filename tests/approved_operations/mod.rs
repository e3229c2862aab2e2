//! A ledger fixture the audit tests share: approved operations written through the domain's
//! `Ledger`, on whatever store a test opened (a SQLite file, a PostgreSQL database).

use opledger_domain::app::{IntentRequest, Ledger};
use opledger_domain::ids::ActorId;
use opledger_domain::store::EventStore;
use opledger_runtime::system::{RandomIds, SystemClock};

/// Records `operations` approved operations on `store` (two events each: an intent and its
/// approval, so positions 2n−1 and 2n of a fresh log); returns their stream names in order.
pub async fn record_approved<S: EventStore + Clone>(store: &S, operations: usize) -> Vec<String> {
    record_approved_of(store, &["acme"], operations).await
}

/// As [`record_approved`], the operations' tenants taken from `tenants` in turn.
#[allow(dead_code)] // Not every test binary that shares the fixture uses it.
pub async fn record_approved_of<S: EventStore + Clone>(
    store: &S,
    tenants: &[&str],
    operations: usize,
) -> Vec<String> {
    let ledger = Ledger::new(store.clone(), SystemClock, RandomIds);
    let mut streams = Vec::new();
    for n in 0..operations {
        let recorded = ledger
            .record_intent(IntentRequest {
                tenant: tenants[n % tenants.len()].into(),
                owner: None,
                provider: "crm".into(),
                account: "acct-1".into(),
                credential_fingerprint: "fp-1".into(),
                action: "create_task".into(),
                args: serde_json::json!({"title": format!("Call client {n}")}),
                source_id: None,
                requires_approval: true,
            })
            .await
            .expect("recorded");
        let intent = recorded.intent().clone();
        ledger
            .approve(
                intent.operation_id,
                ActorId::new("boss").expect("valid"),
                intent.args_hash.clone(),
            )
            .await
            .expect("approved");
        streams.push(format!("operation-{}", intent.operation_id));
    }
    streams
}
