//! The durable work queue the workers read (schema version 3): it holds exactly the operations
//! that wait for the workers, with when each falls due; a send is offered only after the send
//! delay; an operation waiting for a person has no row until decided.

use chrono::Duration;
use opledger_domain::app::{IntentRequest, Ledger};
use opledger_domain::ids::{ActorId, OperationId, WorkerId};
use opledger_domain::ports::IdSource;
use opledger_domain::state::Work;
use opledger_domain::testing::{claim_of, t0, ManualClock};
use opledger_readmodel::{catch_up, ReadModels};
use opledger_runtime::system::RandomIds;
use opledger_store::MemoryStore;
use serde_json::json;

fn request(title: &str, requires_approval: bool) -> IntentRequest {
    IntentRequest {
        tenant: "acme".into(),
        owner: None,
        provider: "crm".into(),
        account: "acct-1".into(),
        credential_fingerprint: "fp-1".into(),
        action: "create_task".into(),
        args: json!({"title": title}),
        source_id: None,
        requires_approval,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_work_queue_offers_sends_after_their_delay_sweeps_at_the_lease_and_people_s_work_only_once_decided(
) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = MemoryStore::new();
    let ledger = Ledger::new(store.clone(), ManualClock::at(t0()), RandomIds);
    let send = ledger
        .record_intent(request("Call the client", false))
        .await
        .expect("recorded");
    let approval = ledger
        .record_intent(request("Pay the supplier", true))
        .await
        .expect("recorded");
    let claimed = ledger
        .record_intent(request("Book the room", false))
        .await
        .expect("recorded");
    let claim = claim_of(
        claimed.intent(),
        RandomIds.new_attempt_id(),
        WorkerId::new("w").expect("valid"),
    );
    ledger
        .execute_from(claimed.operation.clone(), &claim)
        .await
        .expect("claimed");
    let read_models = ReadModels::open(dir.path().join("views.db"))
        .await
        .expect("the read models open");
    catch_up(&store, &read_models, None, |_| {})
        .await
        .expect("caught up");

    assert_offers(
        &read_models,
        [send, claimed].map(|r| r.intent().operation_id),
    )
    .await;

    ledger
        .approve(
            approval.intent().operation_id,
            ActorId::new("boss").expect("valid"),
            approval.intent().args_hash.clone(),
        )
        .await
        .expect("approved");
    catch_up(&store, &read_models, None, |_| {})
        .await
        .expect("caught up");
    let queued = read_models
        .call(|store| store.queued_work())
        .await
        .expect("the queue counts");
    assert_eq!(queued, 3, "approved: now it waits for a send");
}

/// The queue holds the pending `send` and the claimed `sweep` only, and offers each at its time:
/// the send two seconds (its delay) after it fell due, the sweep when the lease runs out.
async fn assert_offers(read_models: &ReadModels, [send, sweep]: [OperationId; 2]) {
    let due = |at: chrono::DateTime<chrono::Utc>| {
        let read_models = read_models.clone();
        async move {
            read_models
                .call(move |store| store.due_work(at, Duration::seconds(2), 10))
                .await
                .expect("the queue reads")
        }
    };
    let queued = || async {
        read_models
            .call(|store| store.queued_work())
            .await
            .expect("the queue counts")
    };
    assert_eq!(
        queued().await,
        2,
        "the send and the claimed one; not the approval"
    );
    let now = due(t0()).await;
    assert!(now.due.is_empty(), "the send waits out its delay: {now:?}");
    assert_eq!(now.next_due_at, Some(t0() + Duration::seconds(2)));
    let after_delay = due(t0() + Duration::seconds(2)).await;
    let offered: Vec<_> = after_delay
        .due
        .iter()
        .map(|item| (item.operation_id, item.work))
        .collect();
    assert_eq!(offered, vec![(send, Work::Send)]);
    let after_lease = due(t0() + Duration::seconds(30)).await;
    let offered: Vec<_> = after_lease
        .due
        .iter()
        .map(|item| (item.operation_id, item.work))
        .collect();
    assert_eq!(
        offered,
        vec![(send, Work::Send), (sweep, Work::Sweep)],
        "the longest-waiting first"
    );
}
