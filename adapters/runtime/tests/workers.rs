//! The workers on a real SQLite ledger file damaged behind the ledger's back with plain SQL.
//!
//! What is checked: an event the workers cannot decode does not stop them; it is counted, its
//! operation is never driven (a person must look), and a later operation is still driven to its
//! outcome.

use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opledger_domain::app::{IntentRequest, Ledger};
use opledger_domain::contract::{Deduplication, LookupSupport, ProviderCapabilities};
use opledger_domain::engine::{Engine, EnginePolicy};
use opledger_domain::ids::{
    ActionName, CredentialFingerprint, ExternalObjectId, OperationId, ProviderId, StreamVersion,
    WorkerId,
};
use opledger_domain::provider::{
    ArgProblem, Binding, BindingQuery, LookupOutcome, LookupRequest, Providers, SendOutcome,
    SendRequest, Unbound,
};
use opledger_domain::state::Status;
use opledger_domain::store::{EventStore, StreamName};
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_runtime::workers::{WorkerConfig, Workers};
use opledger_store::SqliteStore;
use serde_json::json;

/// Longer than any healthy run needs to drive one operation.
const TEST_DEADLINE: Duration = Duration::from_secs(30);

/// A provider that confirms every send at once and remembers which operations it was sent.
#[derive(Clone, Default)]
struct ConfirmingCrm {
    sent: Arc<Mutex<Vec<OperationId>>>,
}

impl ConfirmingCrm {
    fn sent(&self) -> Vec<OperationId> {
        self.sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Providers for ConfirmingCrm {
    fn bind(&self, _query: &BindingQuery<'_>) -> Result<Binding, Unbound> {
        Ok(Binding {
            capabilities: ProviderCapabilities {
                deduplication: Deduplication::UniqueLabel,
                lookup: LookupSupport::Consistent,
            },
            credential_fingerprint: CredentialFingerprint::new("fp-1")
                .expect("a valid fingerprint"),
        })
    }

    fn check_args(
        &self,
        _provider: &ProviderId,
        _action: &ActionName,
        _args: &serde_json::Value,
    ) -> Result<(), Vec<ArgProblem>> {
        Ok(())
    }

    fn action_description(&self, _provider: &ProviderId, _action: &ActionName) -> Option<String> {
        Some("create a task".to_owned())
    }

    fn execute(&self, request: &SendRequest) -> impl Future<Output = SendOutcome> + Send {
        let mut sent = self.sent.lock().unwrap_or_else(PoisonError::into_inner);
        sent.push(request.operation_id);
        let external_id = ExternalObjectId::new(format!("task-{}", sent.len()));
        async move {
            SendOutcome::Confirmed {
                external_id: external_id.expect("a valid external id"),
                provider_request_id: None,
            }
        }
    }

    fn lookup(&self, request: &LookupRequest) -> impl Future<Output = LookupOutcome> + Send {
        let evidence = format!("nothing labelled {}", request.label);
        async move {
            LookupOutcome::NotFound {
                authoritative: true,
                evidence,
            }
        }
    }
}

fn request(title: &str) -> IntentRequest {
    IntentRequest {
        tenant: "acme".into(),
        owner: None,
        provider: "crm".into(),
        account: "acct-1".into(),
        credential_fingerprint: "fp-1".into(),
        action: "create_task".into(),
        args: json!({"title": title}),
        source_id: None,
        requires_approval: false,
    }
}

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

async fn eventually<T, F: Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            started.elapsed() < TEST_DEADLINE,
            "{what} within {TEST_DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_event_is_counted_its_operation_set_aside_and_a_later_operation_still_driven(
) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("ledger.db");
    // A pending operation, whose stream then gains an event nobody can read.
    let damaged = {
        let store = SqliteStore::open(&db).await.expect("the ledger opens");
        let ledger = Ledger::new(store.clone(), SystemClock, RandomIds);
        let recorded = ledger
            .record_intent(request("Call the client"))
            .await
            .expect("recorded");
        store.close().await.expect("the ledger closes");
        recorded.intent().operation_id
    };
    let damaged_stream = StreamName::for_operation(damaged);
    append_garbage(&db, &damaged_stream.to_string());

    let store = SqliteStore::open(&db)
        .await
        .expect("the damaged ledger opens");
    let crm = ConfirmingCrm::default();
    let engine = Arc::new(Engine::new(
        Ledger::new(store.clone(), SystemClock, RandomIds),
        crm.clone(),
        EnginePolicy::default(),
        WorkerId::new("worker-1").expect("a valid worker id"),
    ));
    let workers = Workers::spawn(
        Arc::clone(&engine),
        WorkerConfig {
            idle_poll_ms: 20,
            redrive_pause_ms: 20,
            ..WorkerConfig::default()
        },
    );
    let counters = workers.counters();
    let later = engine
        .ledger()
        .record_intent(request("Send the invoice"))
        .await
        .expect("recorded")
        .intent()
        .operation_id;
    eventually("the later operation succeeds", || async {
        let loaded = engine
            .ledger()
            .get(later)
            .await
            .expect("the later one loads");
        matches!(loaded.state.status, Status::Succeeded { .. }).then_some(())
    })
    .await;
    assert_eq!(
        counters.undecodable_events(),
        1,
        "read live, before shutdown"
    );
    let stats = workers.shutdown().await.expect("the workers stop cleanly");

    assert_eq!(stats.undecodable_events, 1, "{stats:?}");
    assert_eq!(stats.set_aside_operations, 1, "{stats:?}");
    // During catch-up the damaged operation may be dispatched once between its first event and
    // the undecodable one; that drive fails to load it and sends nothing. Once set aside it is
    // never driven again (the workers would otherwise retry it every redrive pause).
    assert!(stats.failed_drives <= 1, "{stats:?}");
    assert_eq!(
        crm.sent(),
        vec![later],
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
