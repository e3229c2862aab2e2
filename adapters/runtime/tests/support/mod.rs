//! What the workers' tests share: a confirming CRM, intent requests, a store that records where
//! each read of the global log starts, the read-model runner and the workers started together,
//! and a bounded wait.

#![allow(dead_code)] // Each test file uses its own part of this.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opledger_domain::app::IntentRequest;
use opledger_domain::contract::{Deduplication, LookupSupport, ProviderCapabilities};
use opledger_domain::engine::Engine;
use opledger_domain::ids::{
    ActionName, CredentialFingerprint, ExternalObjectId, GlobalPosition, OperationId, ProviderId,
    StreamVersion,
};
use opledger_domain::ports::{Clock, IdSource};
use opledger_domain::provider::{
    ArgProblem, Binding, BindingQuery, LookupOutcome, LookupRequest, Providers, SendOutcome,
    SendRequest, Unbound,
};
use opledger_domain::store::{
    AppendOutcome, EventData, EventStore, ExpectedVersion, LogStart, RecordedEvent, StoreError,
    StreamName,
};
use opledger_readmodel::{ReadModelRunner, ReadModels, RunReport};
use opledger_runtime::workers::{WorkerConfig, Workers};
use serde_json::json;
use tokio::sync::oneshot;

/// Longer than any healthy run needs to drive one operation.
pub const TEST_DEADLINE: Duration = Duration::from_secs(30);

/// A provider that confirms every send at once and remembers which operations it was sent.
#[derive(Clone, Default)]
pub struct ConfirmingCrm {
    sent: Arc<Mutex<Vec<OperationId>>>,
}

impl ConfirmingCrm {
    pub fn sent(&self) -> Vec<OperationId> {
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
            earlier_fingerprints: Vec::new(),
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

pub fn request(title: &str) -> IntentRequest {
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

pub async fn eventually<T, F: Future<Output = Option<T>>>(
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

/// A store that records where every read and subscription of the global log starts.
#[derive(Clone)]
pub struct Recording<S> {
    inner: S,
    starts: Arc<Mutex<Vec<LogStart>>>,
}

impl<S> Recording<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            starts: Arc::default(),
        }
    }

    /// Where each read and subscription of the global log started, in order.
    pub fn log_starts(&self) -> Vec<LogStart> {
        self.starts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn record(&self, start: LogStart) {
        self.starts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(start);
    }
}

impl<S: EventStore> EventStore for Recording<S> {
    type Subscription = S::Subscription;

    fn append(
        &self,
        stream: &StreamName,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> impl Future<Output = Result<AppendOutcome, StoreError>> + Send {
        self.inner.append(stream, expected, events)
    }

    fn read_stream(
        &self,
        stream: &StreamName,
        from: StreamVersion,
        max_count: usize,
    ) -> impl Future<Output = Result<Vec<RecordedEvent>, StoreError>> + Send {
        self.inner.read_stream(stream, from, max_count)
    }

    fn read_all(
        &self,
        start: LogStart,
        max_count: usize,
    ) -> impl Future<Output = Result<Vec<RecordedEvent>, StoreError>> + Send {
        self.record(start);
        self.inner.read_all(start, max_count)
    }

    fn head_position(
        &self,
    ) -> impl Future<Output = Result<Option<GlobalPosition>, StoreError>> + Send {
        self.inner.head_position()
    }

    fn subscribe_all(
        &self,
        start: LogStart,
    ) -> impl Future<Output = Result<Self::Subscription, StoreError>> + Send {
        self.record(start);
        self.inner.subscribe_all(start)
    }
}

/// The read-model runner and the workers, started together as `opledger serve` starts them.
pub struct Running {
    pub workers: Workers,
    stop_runner: oneshot::Sender<()>,
    runner: tokio::task::JoinHandle<Result<RunReport, opledger_readmodel::ReadModelError>>,
}

impl Running {
    pub fn start<S, C, I, P>(
        engine: &Arc<Engine<S, C, I, P>>,
        store: S,
        read_models: &ReadModels,
        config: WorkerConfig,
    ) -> Self
    where
        S: EventStore + Clone + 'static,
        S::Subscription: 'static,
        C: Clock + 'static,
        I: IdSource + 'static,
        P: Providers + 'static,
    {
        let (stop_runner, stopped) = oneshot::channel();
        let feed = read_models.clone();
        let runner = tokio::spawn(async move {
            ReadModelRunner::new()
                .run(&store, &feed, async move {
                    let _ = stopped.await;
                })
                .await
        });
        let workers = Workers::spawn(Arc::clone(engine), read_models.clone(), config);
        Self {
            workers,
            stop_runner,
            runner,
        }
    }

    /// Stops the workers, then the runner; returns the workers' stats.
    pub async fn stop(self) -> opledger_runtime::workers::WorkerStats {
        let stats = self
            .workers
            .shutdown()
            .await
            .expect("the workers stop cleanly");
        let _ = self.stop_runner.send(());
        self.runner
            .await
            .expect("the runner task")
            .expect("the runner stops cleanly");
        stats
    }
}
