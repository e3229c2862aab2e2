//! `verify` in bounded memory: a verifier that tracks only a few streams judges a log in which
//! operations are decided long after they were recorded exactly as one that tracks them all —
//! a forgotten stream's earlier events are read back when it is active again — and never holds
//! more than its limit.

use opledger_domain::app::{IntentRequest, Ledger};
use opledger_domain::ids::{ActorId, StreamVersion};
use opledger_domain::store::{EventStore, LogStart, RecordedEvent, MAX_READ_BATCH};
use opledger_domain::verify::{Finding, Verifier, MAX_TRACKED_STREAMS};
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_store::MemoryStore;
use serde_json::json;

/// Operations recorded before the first is decided: far more than the small verifier tracks.
const OPERATIONS: usize = 40;
/// The small verifier's limit.
const TRACKED: usize = 4;

fn request(n: usize) -> IntentRequest {
    IntentRequest {
        tenant: "acme".into(),
        owner: None,
        provider: "crm".into(),
        account: "acct-1".into(),
        credential_fingerprint: "fp-1".into(),
        action: "create_task".into(),
        args: json!({"title": format!("Task {n}")}),
        source_id: None,
        requires_approval: true,
    }
}

/// Walks the whole log as `opledger verify` does, reading back forgotten streams, and checks the
/// verifier never tracks more than `limit` streams.
async fn walk(store: &MemoryStore, verifier: &mut Verifier, limit: usize) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut start = LogStart::Beginning;
    loop {
        let batch = store.read_all(start, MAX_READ_BATCH).await.expect("reads");
        let Some(last) = batch.last() else { break };
        start = LogStart::After(last.position);
        for event in &batch {
            if verifier.needs_history(event) {
                let earlier: Vec<RecordedEvent> = store
                    .read_stream(&event.stream, StreamVersion::FIRST, MAX_READ_BATCH)
                    .await
                    .expect("the stream reads");
                verifier.seed(event, &earlier);
            }
            findings.extend(verifier.check(event));
            assert!(verifier.tracked_streams() <= limit);
        }
    }
    findings
}

/// Walks `log` (in position order, as read) with seeding from `log` itself: what the walk over
/// a store does, for a log tampered with in memory.
fn walk_log(log: &[RecordedEvent], verifier: &mut Verifier, limit: usize) -> Vec<Finding> {
    let mut findings = Vec::new();
    for event in log {
        if verifier.needs_history(event) {
            let earlier: Vec<RecordedEvent> = log
                .iter()
                .filter(|stored| stored.stream == event.stream && stored.version < event.version)
                .cloned()
                .collect();
            verifier.seed(event, &earlier);
        }
        findings.extend(verifier.check(event));
        assert!(verifier.tracked_streams() <= limit);
    }
    findings
}

/// Records `OPERATIONS` intents awaiting approval, then approves each in the order recorded.
async fn recorded_then_decided() -> MemoryStore {
    let store = MemoryStore::new();
    let ledger = Ledger::new(store.clone(), SystemClock, RandomIds);
    let mut intents = Vec::new();
    for n in 0..OPERATIONS {
        let recorded = ledger.record_intent(request(n)).await.expect("recorded");
        intents.push(recorded.intent().clone());
    }
    for intent in &intents {
        ledger
            .approve(
                intent.operation_id,
                ActorId::new("boss").expect("a valid actor"),
                intent.args_hash.clone(),
            )
            .await
            .expect("approved");
    }
    store
}

#[tokio::test]
async fn a_verifier_tracking_few_streams_reports_what_one_tracking_all_reports_in_a_tampered_log() {
    let store = recorded_then_decided().await;
    let mut log = store
        .read_all(LogStart::Beginning, MAX_READ_BATCH)
        .await
        .expect("reads");
    assert_eq!(log.len(), 2 * OPERATIONS, "the whole log in one read");
    // The first operation's decision is edited; the third's intent is removed.
    let first_decision = OPERATIONS;
    log[first_decision].data = br#"{"edited": true}"#.to_vec();
    log.remove(2);

    let found_by_small = walk_log(&log, &mut Verifier::with_limit(false, TRACKED), TRACKED);
    let found_by_full = walk_log(&log, &mut Verifier::new(false), MAX_TRACKED_STREAMS);
    assert_eq!(found_by_small, found_by_full);
    assert!(found_by_small.len() >= 2, "{found_by_small:#?}");
}

#[tokio::test]
async fn a_verifier_tracking_few_streams_finds_nothing_in_a_clean_log_and_stays_within_its_limit() {
    // Decided in the order recorded, long after: each decision extends a forgotten stream.
    let store = recorded_then_decided().await;

    let mut small = Verifier::with_limit(false, TRACKED);
    let mut full = Verifier::new(false);
    let found_by_small = walk(&store, &mut small, TRACKED).await;
    let found_by_full = walk(&store, &mut full, MAX_TRACKED_STREAMS).await;
    assert_eq!(found_by_small, found_by_full);
    assert!(found_by_small.is_empty(), "{found_by_small:?}");
    assert_eq!(small.events(), full.events());
    assert_eq!(small.streams(), OPERATIONS as u64);
    assert!(
        small.seeded_streams() >= OPERATIONS as u64 - TRACKED as u64,
        "forgotten streams were read back: {}",
        small.seeded_streams()
    );
    assert_eq!(full.seeded_streams(), 0, "the full verifier forgot nothing");
}
