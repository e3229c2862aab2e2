//! The workers on a real SQLite ledger file damaged behind the ledger's back with plain SQL.
//!
//! What is checked: an operation whose stream the workers cannot decode does not stop them; it is
//! counted, set aside (never driven again, a person must look), and the other due operations are
//! still driven to their outcome.

mod support;

use std::path::Path;
use std::sync::Arc;

use opledger_domain::app::Ledger;
use opledger_domain::engine::{Engine, EnginePolicy};
use opledger_domain::ids::{StreamVersion, WorkerId};
use opledger_domain::state::Status;
use opledger_domain::store::{EventStore, StreamName};
use opledger_readmodel::{catch_up, ReadModels};
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_runtime::workers::{WorkerConfig, Workers};
use opledger_store::{SqliteOptions, SqliteStore};

use support::{eventually, request, ConfirmingCrm};

/// Appends an event no opledger can decode to `stream`, as a damaged disk or a foreign writer
/// might leave it: the next version, a valid type name, data that is not JSON.
fn append_garbage(db: &Path, stream: &str) {
    let connection = rusqlite::Connection::open(db).expect("opens the file directly");
    connection
        .execute_batch(&format!(
            "INSERT INTO events (stream_id, version, stream, event_id, event_type, data, metadata)
                 SELECT stream_id, last_version + 1, name, randomblob(16), 'AttemptStarted',
                        CAST('\u{1}not json' AS BLOB), CAST('{{}}' AS BLOB)
                 FROM streams WHERE name = '{stream}';
             UPDATE streams SET last_version = last_version + 1 WHERE name = '{stream}';"
        ))
        .expect("the garbage event is written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_operation_is_counted_set_aside_and_the_other_due_operations_still_driven() {
    // The unreadable event is written into the file behind the store's back. With the
    // transparency log's tree on, the store would (rightly) refuse every later append as an
    // inserted event; this test is about the workers, so its ledger keeps no tree.
    const WITHOUT_TREE: SqliteOptions = SqliteOptions { log_tree: false };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("ledger.db");
    let views = dir.path().join("ledger.db.views");
    // Two pending operations, in the read models' work queue; then one stream gains an event
    // nobody can read, which the read models have not applied (they stop at such an event).
    let (damaged, healthy) = {
        let store = SqliteStore::open_with(&db, WITHOUT_TREE)
            .await
            .expect("the ledger opens");
        let ledger = Ledger::new(store.clone(), SystemClock, RandomIds);
        let mut ids = Vec::new();
        for title in ["Call the client", "Send the invoice"] {
            let recorded = ledger
                .record_intent(request(title))
                .await
                .expect("recorded");
            ids.push(recorded.intent().operation_id);
        }
        let read_models = ReadModels::open(&views)
            .await
            .expect("the read models open");
        catch_up(&store, &read_models, None, |_| {})
            .await
            .expect("caught up");
        store.close().await.expect("the ledger closes");
        (ids[0], ids[1])
    };
    let damaged_stream = StreamName::for_operation(damaged);
    append_garbage(&db, &damaged_stream.to_string());

    let store = SqliteStore::open_with(&db, WITHOUT_TREE)
        .await
        .expect("the damaged ledger opens");
    let read_models = ReadModels::open(&views)
        .await
        .expect("the read models open");
    let crm = ConfirmingCrm::default();
    let engine = Arc::new(Engine::new(
        Ledger::new(store.clone(), SystemClock, RandomIds),
        crm.clone(),
        EnginePolicy::default(),
        WorkerId::new("worker-1").expect("a valid worker id"),
    ));
    let workers = Workers::spawn(
        Arc::clone(&engine),
        read_models,
        WorkerConfig {
            idle_poll_ms: 20,
            redrive_pause_ms: 20,
            ..WorkerConfig::default()
        },
    );
    let counters = workers.counters();
    eventually("the healthy operation succeeds", || async {
        let loaded = engine.ledger().get(healthy).await.expect("it loads");
        matches!(loaded.state.status, Status::Succeeded { .. }).then_some(())
    })
    .await;
    eventually("the damaged operation is counted", || async {
        (counters.undecodable_events() == 1).then_some(())
    })
    .await;
    let stats = workers.shutdown().await.expect("the workers stop cleanly");

    assert_eq!(stats.undecodable_events, 1, "{stats:?}");
    assert_eq!(stats.set_aside_operations, 1, "{stats:?}");
    // Set aside at its first drive: the queue offers it at every look, and it is not driven again.
    assert_eq!(stats.failed_drives, 1, "{stats:?}");
    assert_eq!(
        crm.sent(),
        vec![healthy],
        "nothing was sent for the damaged operation"
    );
    let damaged_events = store
        .read_stream(&damaged_stream, StreamVersion::FIRST, 100)
        .await
        .expect("the stream reads");
    assert_eq!(
        damaged_events.len(),
        2,
        "nothing was appended to the damaged operation"
    );
    store.close().await.expect("the ledger closes");
}
