//! The real parts every execution test stands on, wired once: a SQLite ledger file in a temporary
//! directory, the CRM stand on an ephemeral loopback port, the HTTP adapters for its three shapes,
//! and the engine — plus the few ways a test looks at them (the operation's event stream, the
//! stand's objects and request log).
//!
//! The same scenarios run twice: in the `execution` test binary on a SQLite ledger file, and in
//! `execution_kurrentdb` (which holds this whole suite as one module) on the KurrentDB store over the protocol
//! stand, and in `execution_postgres` on the PostgreSQL store in a database of its own on the
//! binary's private cluster (`tests/postgres_server`). [`backend`] tells which; [`LedgerStore`] is either store behind one type.
//!
//! Nothing here sleeps and hopes: every wait is either "until a time the ledger recorded" or a
//! poll with a deadline that fails the test with what it saw.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use opledger_crm_stand::{
    Fault, FaultKind, FaultMethod, LoggedRequest, Shape as StandShape, Stand, StandAdmin,
    StandConfig, StandObject,
};
use opledger_domain::app::{IntentRequest, Ledger, RecordedIntent};
use opledger_domain::codec;
use opledger_domain::command::Command;
use opledger_domain::contract::{RetryPolicy, SendBinding};
use opledger_domain::engine::{Engine, EnginePolicy, Report};
use opledger_domain::event::{IntentRecorded, OperationEvent};
use opledger_domain::ids::{
    AccountId, ActionName, AttemptId, CredentialFingerprint, OperationId, ProviderId,
    StreamVersion, TenantId, WorkerId,
};
use opledger_domain::ports::IdSource;
use opledger_domain::provider::{
    operation_label, BindingQuery, Providers, SendOutcome, SendRequest,
};
use opledger_domain::state::{OperationState, Status};
use opledger_domain::store::{EventStore, StreamName, MAX_READ_BATCH};
use opledger_kurrentdb_stand::KurrentDbStand;
use opledger_providers::presets::{stand_document, StandSettings};
use opledger_providers::{
    render_all, AccountSpec, Connector, Credentials, HttpProviders, Overrides,
    Shape as ProviderShape,
};
use opledger_readmodel::{ReadModelError, ReadModelRunner, ReadModels, RunReport};
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_runtime::workers::{WorkerConfig, WorkerError, WorkerStats, Workers};
use opledger_store::AnyStore;
use opledger_store::{KurrentDbStore, PostgresStore, SqliteStore};
use serde_json::json;
use tempfile::TempDir;

/// The engine every test drives: the production types, nothing stubbed.
pub type TestEngine = Engine<LedgerStore, SystemClock, RandomIds, HttpProviders>;
/// The ledger underneath it.
pub type TestLedger = Ledger<LedgerStore, SystemClock, RandomIds>;

/// Which event store the scenarios run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    KurrentDb,
    Postgres,
}

/// The store of this test binary: `execution_kurrentdb` runs on KurrentDB, `execution_postgres`
/// on PostgreSQL, `execution` on SQLite.
pub fn backend() -> Backend {
    match env!("CARGO_CRATE_NAME") {
        "execution_kurrentdb" => Backend::KurrentDb,
        "execution_postgres" => Backend::Postgres,
        _ => Backend::Sqlite,
    }
}

/// Either store, so the engine's type does not depend on the backend.
pub type LedgerStore = AnyStore;

/// Opens the ledger at `location`: a file path for SQLite, a connection string for KurrentDB.
pub async fn open_store(location: &str) -> LedgerStore {
    match backend() {
        Backend::Sqlite => AnyStore::Sqlite(
            SqliteStore::open(location)
                .await
                .expect("open the ledger file"),
        ),
        Backend::KurrentDb => AnyStore::KurrentDb(
            KurrentDbStore::connect(location)
                .await
                .expect("connect to the KurrentDB stand"),
        ),
        Backend::Postgres => AnyStore::Postgres(
            PostgresStore::connect(location)
                .await
                .expect("connect to the test PostgreSQL"),
        ),
    }
}

/// The account operations are bound to, and the token the stand knows it by.
pub const ACCOUNT: &str = "acct-1";
pub const ACCOUNT_TOKEN: &str = "token-acct-1";
/// The stand's second default account.
pub const OTHER_ACCOUNT: &str = "acct-2";
pub const OTHER_ACCOUNT_TOKEN: &str = "token-acct-2";
/// The worker id of the harness's engine.
pub const WORKER: &str = "worker-a";

/// The longest any operation may take to settle, on a loaded two-core machine. Healthy runs need
/// well under a second plus whatever lease or backoff the test itself configures.
pub const SETTLE_DEADLINE: Duration = Duration::from_secs(20);
/// Shortest and longest pause between two looks at an operation that is not due yet.
const MIN_PAUSE: Duration = Duration::from_millis(5);
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// The three CRM shapes, each registered under its own provider id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crm {
    /// Stripe-style `Idempotency-Key`; the lookup asks for the key.
    Keyed,
    /// A unique external label enforced atomically; the lookup asks for the label.
    Labelled,
    /// No deduplication; the lookup is a lagging search by a custom label field.
    Plain,
}

impl Crm {
    pub const ALL: [Crm; 3] = [Crm::Keyed, Crm::Labelled, Crm::Plain];

    pub fn provider(self) -> ProviderId {
        ProviderId::new(match self {
            Crm::Keyed => "crm-keyed",
            Crm::Labelled => "crm-labelled",
            Crm::Plain => "crm-plain",
        })
        .expect("a valid provider id")
    }

    fn adapter_shape(self) -> ProviderShape {
        match self {
            Crm::Keyed => ProviderShape::Keyed,
            Crm::Labelled => ProviderShape::Labelled,
            Crm::Plain => ProviderShape::Plain,
        }
    }

    fn stand_shape(self) -> StandShape {
        match self {
            Crm::Keyed => StandShape::Keyed,
            Crm::Labelled => StandShape::Labelled,
            Crm::Plain => StandShape::Plain,
        }
    }

    /// The HTTP method of a create in this shape (the labelled shape creates with an upsert).
    fn create_method(self) -> &'static str {
        match self {
            Crm::Keyed | Crm::Plain => "POST",
            Crm::Labelled => "PUT",
        }
    }

    /// A fault that hits the next create of this shape, and no lookup.
    pub fn create_fault(self, kind: FaultKind) -> Fault {
        let method = match self {
            Crm::Keyed | Crm::Plain => FaultMethod::Post,
            Crm::Labelled => FaultMethod::Put,
        };
        Fault::new(kind).shape(self.stand_shape()).method(method)
    }

    /// A fault that hits the next lookup of this shape, and no create.
    pub fn lookup_fault(self, kind: FaultKind) -> Fault {
        Fault::new(kind)
            .shape(self.stand_shape())
            .method(FaultMethod::Get)
    }
}

/// What a test may change about the parts. The defaults are short timeouts and small backoffs,
/// so an unclear send is noticed and reconciled in milliseconds.
#[derive(Clone, Debug)]
pub struct Setup {
    /// How long the stand keeps an idempotency key, on its clock.
    pub stand_key_retention_s: u64,
    /// How long a plain task stays invisible to the stand's search, on its clock.
    pub stand_search_lag_ms: u64,
    /// The adapters' whole-request timeout.
    pub request_timeout_ms: u64,
    /// The adapters' connect timeout.
    pub connect_timeout_ms: u64,
    /// The key retention the keyed adapter promises the ledger.
    pub key_retention_s: u64,
    /// The part of it a retry may never use.
    pub key_safety_margin_s: u64,
    /// The search lag the plain adapter promises the ledger.
    pub search_lag_ms: u64,
    /// How the engine paces and bounds its work.
    pub policy: EnginePolicy,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            stand_key_retention_s: 86_400,
            stand_search_lag_ms: 2_000,
            request_timeout_ms: 800,
            connect_timeout_ms: 300,
            key_retention_s: 86_400,
            key_safety_margin_s: 3_600,
            search_lag_ms: 2_000,
            policy: EnginePolicy {
                lease_ms: 5_000,
                retry: RetryPolicy {
                    max_attempts: 3,
                    max_total_ms: 60_000,
                    max_reconciliations: 20,
                },
                backoff_base_ms: 20,
                backoff_max_ms: 200,
            },
        }
    }
}

impl Setup {
    /// The three CRMs at `base_url`, each able to act in exactly `accounts` (name, token).
    pub fn providers(&self, base_url: &str, accounts: &[(&str, &str)]) -> HttpProviders {
        // Every test account is owned by the tests' tenant, `acme`.
        let accounts: Vec<AccountSpec> = accounts
            .iter()
            .map(|(account, token)| AccountSpec {
                id: account_id(account),
                tenants: vec![TenantId::new("acme").expect("a valid tenant")],
                credentials: Credentials::token(*token),
            })
            .collect();
        let settings = StandSettings {
            key_retention_s: Some((self.key_retention_s, self.key_safety_margin_s)),
            search_lag_ms: Some(self.search_lag_ms),
        };
        HttpProviders::new(Crm::ALL.map(|crm| {
            let document = stand_document(crm.adapter_shape(), settings);
            let overrides = Overrides {
                id: Some(crm.provider()),
                base_url: Some(base_url.to_owned()),
                accounts: accounts.clone(),
                request_timeout_ms: Some(self.request_timeout_ms),
                connect_timeout_ms: Some(self.connect_timeout_ms),
                ..Overrides::default()
            };
            Connector::build(&document, overrides)
                .unwrap_or_else(|errors| panic!("{}", render_all(&errors)))
        }))
        .expect("the test provider configurations are valid")
    }
}

pub fn account_id(name: &str) -> AccountId {
    AccountId::new(name).expect("a valid account id")
}

pub fn worker_id(name: &str) -> WorkerId {
    WorkerId::new(name).expect("a valid worker id")
}

/// A ledger file, a stand and an engine over both.
pub struct Harness {
    pub setup: Setup,
    pub admin: StandAdmin,
    pub engine: Arc<TestEngine>,
    stand: Stand,
    path: PathBuf,
    /// The KurrentDB stand holding the ledger, when the backend is KurrentDB.
    kurrentdb: Option<KurrentDbStand>,
    /// The URL of the harness's own database, when the backend is PostgreSQL.
    postgres: Option<String>,
    /// Keeps the ledger file until the harness is dropped.
    _dir: TempDir,
}

impl Harness {
    pub async fn start() -> Self {
        Self::with(Setup::default()).await
    }

    pub async fn with(setup: Setup) -> Self {
        let dir = TempDir::new().expect("a temporary directory");
        let path = dir.path().join("ledger.db");
        let stand = Stand::start(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            StandConfig {
                key_retention_s: setup.stand_key_retention_s,
                search_lag_ms: setup.stand_search_lag_ms,
                ..StandConfig::default()
            },
        )
        .await
        .expect("the CRM stand starts on an ephemeral loopback port");
        let admin = stand.admin().expect("an admin client for the stand");
        let kurrentdb = match backend() {
            Backend::Sqlite | Backend::Postgres => None,
            Backend::KurrentDb => Some(
                KurrentDbStand::start()
                    .await
                    .expect("the KurrentDB stand starts on an ephemeral loopback port"),
            ),
        };
        let postgres = (backend() == Backend::Postgres).then(|| {
            let server = super::postgres_server::server();
            server.url(&server.database())
        });
        let location = store_location(&path, kurrentdb.as_ref(), postgres.as_deref());
        let store = open_store(&location).await;
        let providers = setup.providers(&stand.base_url(), &[(ACCOUNT, ACCOUNT_TOKEN)]);
        let engine = Arc::new(Engine::new(
            Ledger::new(store, SystemClock, RandomIds),
            providers,
            setup.policy,
            worker_id(WORKER),
        ));
        Self {
            setup,
            admin,
            engine,
            stand,
            path,
            kurrentdb,
            postgres,
            _dir: dir,
        }
    }

    /// Where the ledger is: the file path (SQLite) or the stand's connection string (KurrentDB).
    pub fn store_location(&self) -> String {
        store_location(
            &self.path,
            self.kurrentdb.as_ref(),
            self.postgres.as_deref(),
        )
    }

    pub fn ledger(&self) -> &TestLedger {
        self.engine.ledger()
    }

    pub fn base_url(&self) -> String {
        self.stand.base_url()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Another engine over the same ledger (the same store handle), sending through `providers`
    /// as `worker`: a second worker, or this one after its configuration changed.
    pub fn engine_with(&self, providers: HttpProviders, worker: &str) -> TestEngine {
        Engine::new(
            self.ledger().clone(),
            providers,
            self.setup.policy,
            worker_id(worker),
        )
    }

    /// A second worker: its own engine and its own HTTP clients, over the same ledger file.
    pub fn second_worker(&self, worker: &str) -> Arc<TestEngine> {
        Arc::new(
            self.engine_with(
                self.setup
                    .providers(&self.base_url(), &[(ACCOUNT, ACCOUNT_TOKEN)]),
                worker,
            ),
        )
    }

    /// Makes the operation's first attempt with a fault that leaves its outcome unclear, records
    /// it as unknown as the engine would, and stops there — as a worker that stopped before it
    /// looked the operation up. Returns the operation as it stands then.
    pub async fn first_attempt_left_unknown(&self, operation_id: OperationId) -> OperationState {
        let (attempt_id, outcome) = claim_and_send(
            self.ledger(),
            self.engine.providers(),
            operation_id,
            WORKER,
            self.setup.policy.lease_ms,
            self.setup.policy.retry,
        )
        .await;
        let SendOutcome::Uncertain { error, .. } = outcome else {
            panic!("the fault was to make the outcome unclear: {outcome:?}");
        };
        let unknown = self
            .ledger()
            .execute(
                operation_id,
                &Command::RecordUnknown {
                    check_not_before: None,
                    attempt_id,
                    error,
                },
            )
            .await
            .expect("the unknown outcome is recorded")
            .state;
        assert_eq!(unknown.status, Status::Unknown);
        unknown
    }

    /// The agent's tool call: create a task at `crm` in [`ACCOUNT`], bound to the credentials
    /// the engine has configured for it now.
    pub fn request(&self, crm: Crm, source_id: Option<&str>) -> IntentRequest {
        let fingerprint = fingerprint_at(self.engine.providers(), crm.provider());
        IntentRequest {
            tenant: "acme".into(),
            owner: Some("manager-anna".into()),
            provider: crm.provider().to_string(),
            account: ACCOUNT.into(),
            credential_fingerprint: fingerprint.to_string(),
            action: "create_task".into(),
            args: json!({"title": "Call the client", "due": "2026-12-01"}),
            source_id: source_id.map(str::to_owned),
            requires_approval: false,
        }
    }

    pub async fn record(&self, request: IntentRequest) -> RecordedIntent {
        self.ledger()
            .record_intent(request)
            .await
            .expect("the intent is recorded")
    }

    pub async fn queue(&self, fault: Fault) {
        let queued = self
            .admin
            .queue_fault(&fault)
            .await
            .expect("the stand queues the fault");
        assert_eq!(queued, fault.times);
    }

    pub async fn drive(&self, operation_id: OperationId) -> Report {
        self.engine
            .drive(operation_id)
            .await
            .expect("the engine drives the operation")
    }

    pub async fn settle(&self, operation_id: OperationId) -> Report {
        settle(&self.engine, operation_id).await
    }

    /// Waits until the operation's next work is due (a lookup, a retry, a sweep), then drives it
    /// once.
    pub async fn drive_when_due(&self, operation_id: OperationId) -> Report {
        let state = self.state(operation_id).await;
        let (due_at, _) = state
            .next_work()
            .unwrap_or_else(|| panic!("the operation waits for no work: {state:?}"));
        wait_until(due_at).await;
        self.drive(operation_id).await
    }

    pub async fn state(&self, operation_id: OperationId) -> OperationState {
        self.ledger()
            .get(operation_id)
            .await
            .expect("the operation loads")
            .state
    }

    pub async fn events(&self, operation_id: OperationId) -> Vec<OperationEvent> {
        stream_events(self.ledger().store(), operation_id).await
    }

    pub async fn event_names(&self, operation_id: OperationId) -> Vec<&'static str> {
        names(&self.events(operation_id).await)
    }

    /// The objects the stand holds for the operation: by its key at the keyed CRM, by its
    /// label at the others. Only [`ACCOUNT`]'s objects are looked at.
    pub async fn objects_for(&self, crm: Crm, intent: &IntentRecorded) -> Vec<StandObject> {
        let label = operation_label(intent.operation_id);
        self.objects_in(ACCOUNT)
            .await
            .into_iter()
            .filter(|object| match crm {
                Crm::Keyed => object.key.as_deref() == Some(intent.idempotency_key.as_str()),
                Crm::Labelled | Crm::Plain => object.label.as_deref() == Some(label.as_str()),
            })
            .collect()
    }

    pub async fn objects_in(&self, account: &str) -> Vec<StandObject> {
        self.admin
            .objects(Some(account))
            .await
            .expect("the stand lists its objects")
    }

    /// Every provider request the stand received, oldest first.
    pub async fn requests(&self) -> Vec<LoggedRequest> {
        self.admin
            .requests()
            .await
            .expect("the stand lists its requests")
    }

    /// The creates the stand received at `crm`'s shape, faulted ones included.
    pub async fn creates(&self, crm: Crm) -> Vec<LoggedRequest> {
        self.requests_with(crm.create_method()).await
    }

    /// The lookups (key, label or search) the stand received.
    pub async fn lookups(&self) -> Vec<LoggedRequest> {
        self.requests_with("GET").await
    }

    async fn requests_with(&self, method: &str) -> Vec<LoggedRequest> {
        self.requests()
            .await
            .into_iter()
            .filter(|request| request.method == method)
            .collect()
    }

    /// Closes the ledger file, as a stopping process does. The engine is unusable until
    /// [`Harness::reopen_store`].
    pub async fn close_store(&self) {
        self.ledger()
            .store()
            .clone()
            .close()
            .await
            .expect("the ledger closes");
    }

    /// Opens the ledger file again and builds a fresh engine over it, with freshly built
    /// providers: what a restarted process has.
    pub async fn reopen_store(&mut self) {
        let store = open_store(&self.store_location()).await;
        let providers = self
            .setup
            .providers(&self.stand.base_url(), &[(ACCOUNT, ACCOUNT_TOKEN)]);
        self.engine = Arc::new(Engine::new(
            Ledger::new(store, SystemClock, RandomIds),
            providers,
            self.setup.policy,
            worker_id(WORKER),
        ));
    }

    /// Starts the background workers as `opledger serve` does: the read models beside the ledger,
    /// fed by their runner from their checkpoint, and the workers reading their work queue.
    pub async fn spawn_workers(&self, config: WorkerConfig) -> BackgroundWorkers {
        let mut views = self.path.clone().into_os_string();
        views.push(".views");
        let read_models = ReadModels::open(PathBuf::from(views))
            .await
            .expect("the read models open");
        let (stop_runner, stopped) = tokio::sync::oneshot::channel::<()>();
        let store = self.engine.ledger().store().clone();
        let feed = read_models.clone();
        let runner = tokio::spawn(async move {
            ReadModelRunner::new()
                .run(&store, &feed, async move {
                    let _ = stopped.await;
                })
                .await
        });
        let workers = Workers::spawn(Arc::clone(&self.engine), read_models, config);
        BackgroundWorkers {
            workers,
            stop_runner,
            runner,
        }
    }

    /// Stops the ledger and the stand cleanly.
    pub async fn finish(self) {
        self.close_store().await;
        self.stand.shutdown().await;
    }
}

/// The workers and the read-model runner feeding their work queue (see
/// [`Harness::spawn_workers`]).
pub struct BackgroundWorkers {
    workers: Workers,
    stop_runner: tokio::sync::oneshot::Sender<()>,
    runner: tokio::task::JoinHandle<Result<RunReport, ReadModelError>>,
}

impl BackgroundWorkers {
    /// Stops the workers (as [`Workers::shutdown`]), then the runner.
    pub async fn shutdown(self) -> Result<WorkerStats, WorkerError> {
        let stats = self.workers.shutdown().await;
        let _ = self.stop_runner.send(());
        self.runner
            .await
            .expect("the runner task")
            .expect("the runner stops cleanly");
        stats
    }
}

fn store_location(
    path: &Path,
    kurrentdb: Option<&KurrentDbStand>,
    postgres: Option<&str>,
) -> String {
    match (kurrentdb, postgres) {
        (Some(stand), _) => stand.connection_string(),
        (None, Some(url)) => url.to_owned(),
        (None, None) => path.display().to_string(),
    }
}

/// Drives the operation until it no longer waits for work of its own (it succeeded, was
/// rejected, or waits for a person), sleeping until its next work is due in between. Fails the
/// test if that takes longer than [`SETTLE_DEADLINE`].
pub async fn settle(engine: &TestEngine, operation_id: OperationId) -> Report {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    loop {
        let report = engine
            .drive(operation_id)
            .await
            .expect("the engine drives the operation");
        let state = report.state();
        if !matches!(
            state.status,
            Status::Pending | Status::InFlight | Status::Unknown
        ) {
            return report;
        }
        assert!(
            Instant::now() < deadline,
            "operation {operation_id} did not settle within {SETTLE_DEADLINE:?}: {state:?}"
        );
        tokio::time::sleep(pause_until(state.next_work().map(|(due_at, _)| due_at))).await;
    }
}

/// Sleeps until the wall clock the ledger decides with has reached `at`.
pub async fn wait_until(at: DateTime<Utc>) {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    while Utc::now() < at {
        assert!(
            Instant::now() < deadline,
            "{at} is further away than {SETTLE_DEADLINE:?}"
        );
        tokio::time::sleep(pause_until(Some(at))).await;
    }
}

/// Polls `check` until it returns `Some`, failing the test with `what` after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pause_until(due_at: Option<DateTime<Utc>>) -> Duration {
    due_at
        .and_then(|due_at| (due_at - Utc::now()).to_std().ok())
        .unwrap_or(MIN_PAUSE)
        .clamp(MIN_PAUSE, MAX_PAUSE)
}

/// Every event of the operation's stream, decoded.
pub async fn stream_events(store: &LedgerStore, operation_id: OperationId) -> Vec<OperationEvent> {
    let stream = StreamName::for_operation(operation_id);
    let mut events = Vec::new();
    let mut from = StreamVersion::FIRST;
    loop {
        let page = store
            .read_stream(&stream, from, MAX_READ_BATCH)
            .await
            .expect("read the operation's stream");
        let Some(last) = page.last() else {
            return events;
        };
        from = last.version.next();
        events.extend(
            page.iter()
                .map(|recorded| codec::decode(recorded).expect("every stored event decodes")),
        );
    }
}

pub fn names(events: &[OperationEvent]) -> Vec<&'static str> {
    events.iter().map(OperationEvent::type_name).collect()
}

/// What a worker does up to the moment it would record the provider's answer, exactly as the
/// engine does it: claim the operation with a conditional append (bound to the account, the
/// credentials configured now and the hash of the arguments it sends), then send it with the
/// operation's key and label. Returns the attempt and what the provider said; records nothing
/// about the answer.
pub async fn claim_and_send(
    ledger: &TestLedger,
    providers: &HttpProviders,
    operation_id: OperationId,
    worker: &str,
    lease_ms: u64,
    policy: RetryPolicy,
) -> (AttemptId, SendOutcome) {
    let loaded = ledger.get(operation_id).await.expect("the operation loads");
    let intent = loaded
        .state
        .intent
        .clone()
        .expect("a recorded operation has its intent");
    let attempt_id = ledger.ids().new_attempt_id();
    let bound = providers
        .bind(&BindingQuery {
            tenant: &intent.tenant,
            provider: &intent.provider,
            account: &intent.account,
            action: &intent.action,
        })
        .expect("the operation's binding is configured");
    let claim = Command::StartAttempt {
        request: None,
        budget_wait: None,
        attempt_id,
        worker: worker_id(worker),
        lease_ms,
        binding: SendBinding {
            account: intent.account.clone(),
            credential_fingerprint: bound.credential_fingerprint.clone(),
            args_hash: intent.args.hash(),
        },
        capabilities: bound.capabilities,
        policy,
    };
    let claimed = ledger
        .execute_from(loaded, &claim)
        .await
        .expect("the pending operation is claimed");
    assert_eq!(claimed.state.status, Status::InFlight);
    let outcome = providers
        .execute(&SendRequest {
            operation_id,
            attempt_id,
            tenant: intent.tenant.clone(),
            provider: intent.provider.clone(),
            account: intent.account.clone(),
            action: intent.action.clone(),
            args: intent.args.clone(),
            idempotency_key: intent.idempotency_key.clone(),
            label: operation_label(operation_id),
        })
        .await;
    (attempt_id, outcome)
}

/// The fingerprint of [`ACCOUNT`]'s credentials at `provider` as `providers` have them now, for
/// the tenant `acme` and the action `create_task`.
pub fn fingerprint_at(providers: &HttpProviders, provider: ProviderId) -> CredentialFingerprint {
    providers
        .bind(&BindingQuery {
            tenant: &TenantId::new("acme").expect("a valid tenant"),
            provider: &provider,
            account: &account_id(ACCOUNT),
            action: &ActionName::new("create_task").expect("a valid action"),
        })
        .expect("the account is configured")
        .credential_fingerprint
}
