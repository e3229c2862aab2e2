//! `opledger serve`: the HTTP service agents and services talk to.
//!
//! One process holds the ledger (the embedded SQLite file by default), the engine and its
//! background workers, the read-model runner, and the API. Start-up checks the whole
//! configuration before opening or binding anything. Shutdown (SIGTERM or Ctrl-C) stops
//! accepting, ends the event streams, lets requests in progress finish (an execute call stops
//! waiting, but a send already made is recorded), waits (bounded) for the workers' drives, and
//! closes the store after its last acknowledged append is durable. An acknowledged intent is
//! never lost: the API answers 2xx only after the ledger's append returned.
//!
//! Without `--config` it runs the embedded default with the CRM stand in-process as a demo
//! provider, so `opledger serve` alone gives a working API.

//! opledger's HTTP service as a library: the API agents and services talk to (`opledger serve`).
//!
//! [`run`] serves one [`ServeConfig`] until a shutdown future resolves. One process holds the
//! ledger (the embedded SQLite file, a KurrentDB cluster or a PostgreSQL database), the engine and its background
//! workers, the read-model runner, and the API. The configuration is checked whole before anything
//! is opened or bound ([`config::load`]). Shutdown stops accepting, ends the event streams, lets
//! requests in progress finish (an execute call stops waiting, but a send already made is
//! recorded), waits (bounded) for the workers' drives, and closes the store after its last
//! acknowledged append is durable. It must never answer 2xx before the ledger's append returned,
//! so an acknowledged intent is never lost.
//!
//! Files: `config/` the TOML configuration and its limits; `auth.rs` bearer tokens and scopes;
//! `api/` the routes (`operations.rs` record and execute, `queries.rs` lists and traces,
//! `review.rs` decisions); `events.rs` the SSE feed of outcomes; `metrics.rs` Prometheus;
//! `error.rs` the error body every route answers with; `console.rs` the operator console's files; `openapi.json` the OpenAPI document;
//! [`render`] what the API and the CLI both show; [`input`] what they both parse.
//!
//! The binary (`bin/serve.rs`) only picks the configuration (a file, or the embedded default with
//! the CRM stand in-process) and the shutdown signal.

mod api;
mod auth;
pub mod claims;
pub mod config;
pub mod connections;
mod console;
mod error;
mod events;
pub mod input;
pub mod log;
mod metrics;
pub mod personal;
mod process_metrics;
pub mod render;
mod webhooks;

/// The ledger the server keeps (see [`AnyStore`]).
pub type ServeStore = opledger_store::AnyStore;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use opledger_domain::app::{AppError, Ledger};
use opledger_domain::engine::Engine;
use opledger_domain::error::ValidationError;
use opledger_domain::ids::{TenantId, WorkerId};
use opledger_domain::store::StoreError;
pub use opledger_mcp;
use opledger_providers::HttpProviders;
use opledger_readmodel::{ReadModelError, ReadModelRunner, ReadModels, RunnerHealth};
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_runtime::workers::{WorkerConfig, Workers};
use opledger_store::{KurrentDbStore, PostgresStore, SqliteStore};
use tokio::sync::{watch, Semaphore};
use tracing::{info, warn};

use self::auth::Tokens;
pub use self::config::{Limits, Principal, ServeConfig, StoreUrl};
use self::events::TenantCache;
use self::metrics::RequestMetrics;

/// How far behind the log the read models may be for the server to be ready, in positions
/// (events for SQLite; byte offsets for KurrentDB): within it start-up catches them up before
/// serving and `/healthz` answers ready; beyond it they catch up in the background, the server
/// serves meanwhile, and `/healthz` answers 503 `catching_up`. Start-up never does work that
/// grows with the history; 10,000 events take well under a second to apply.
pub const READY_LAG_POSITIONS: u64 = 10_000;

/// The OpenAPI description of every route, served at `/v1/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration is wrong; nothing was opened or bound.
    #[error("{0}")]
    Config(String),
    /// An input (an address, a name) is invalid.
    #[error("{0}")]
    Invalid(#[from] ValidationError),
    /// The ledger refused or failed.
    #[error("{0}")]
    App(#[from] AppError),
    /// The store could not be opened or failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The read models failed.
    #[error("{0}")]
    ReadModel(#[from] ReadModelError),
    /// Something at the edge failed: the listening socket, the KurrentDB connection, the server.
    #[error("{0}")]
    Io(String),
    /// Webhook delivery could not start (its journal).
    #[error("{0}")]
    Webhooks(#[from] opledger_webhooks::WebhookError),
}

impl From<render::RenderError> for ServeError {
    fn from(error: render::RenderError) -> Self {
        match error {
            render::RenderError::App(error) => Self::App(error),
            render::RenderError::Store(error) => Self::Store(error),
            render::RenderError::ReadModel(error) => Self::ReadModel(error),
            other => Self::Io(other.to_string()),
        }
    }
}

/// The engine the server drives operations with.
pub type ServeEngine = Engine<ServeStore, SystemClock, RandomIds, HttpProviders>;

/// What every request handler shares.
pub struct Shared {
    /// The engine (and, through it, the ledger and the providers).
    pub engine: Arc<ServeEngine>,
    /// The read models, kept up to date by the runner.
    pub read_models: ReadModels,
    /// Whether the runner is following the log, retrying after a fault, or stopped.
    pub runner_health: RunnerHealth,
    /// Who each bearer token is.
    pub tokens: Tokens,
    /// Request limits.
    pub limits: Limits,
    /// Request counts and latencies.
    pub requests: RequestMetrics,
    /// Places for event streams.
    pub sse: Arc<Semaphore>,
    /// Streams open per tenant or person.
    pub streams: events::StreamsPerHolder,
    /// Places for execute calls driving or waiting.
    pub executes: Arc<Semaphore>,
    /// Becomes `true` when the server is shutting down.
    pub shutdown: watch::Receiver<bool>,
    /// Which operation belongs to which tenant, for the event streams.
    pub tenants: TenantCache,
    /// The tenants whose approvals need an approver token.
    pub approval_guard: auth::Scope,
    /// The digest of the token `/metrics` asks for, if any.
    pub metrics_token: Option<[u8; 32]>,
    /// `/metrics` answers nobody (several tenants, no scraper token, not declared open).
    pub metrics_closed: bool,
    /// The webhook metrics carry the endpoint's id (else they are summed over endpoints).
    pub metrics_by_endpoint: bool,
    /// What the background workers counted (undecodable events), for `/metrics`.
    pub worker_counters: opledger_runtime::workers::WorkerCounters,
    /// The OpenAPI document as served: [`OPENAPI`] with this server's configured limits.
    pub openapi: axum::body::Bytes,
    /// Outcome webhooks: the endpoints' tasks and what operators ask of them.
    pub webhooks: Arc<opledger_webhooks::Webhooks>,
    /// What the accept loop counted (open, refused, timed out), for `/metrics`.
    pub connections: Arc<connections::ConnectionCounters>,
    /// Operators' claims on review items (beside the ledger: see `claims.rs`).
    pub claims: claims::Claims,
    /// Browser origins `/mcp` answers besides loopback ones.
    pub mcp_allowed_origins: Vec<String>,
    /// The tenants whose own webhook endpoints may post to loopback.
    pub webhook_loopback_tenants: std::collections::BTreeSet<opledger_domain::ids::TenantId>,
    /// The transparency log's signing key, when one is configured.
    pub log_signer: Option<Arc<opledger_domain::checkpoint::LogSigner>>,
    /// Set when a shutdown signal came: `/readyz` answers 503 while requests are still served
    /// for `shutdown_drain_ms`, before the listener closes.
    pub draining: std::sync::atomic::AtomicBool,
    /// This instance's id (`instance_id`, or `serve-<pid>-<random>`).
    pub instance_id: String,
    /// The key store and cipher for personal data (`[personal_data]`), when configured.
    pub subjects: Option<Arc<opledger_subjects::Subjects>>,
    /// Each tenant's privacy settings (which values are personal, how long they are kept).
    pub privacy:
        std::collections::BTreeMap<opledger_domain::ids::TenantId, config::personal::TenantPrivacy>,
}

/// An instance id when the configuration names none: the process id for the operator reading
/// it, and a random suffix, because processes in separate containers (PID namespaces) are all
/// process 1.
pub fn default_instance_id() -> String {
    // Two instances drawing the same 32 random bits is a one in four billion chance per pair;
    // a configured `instance_id` removes it.
    use opledger_domain::ports::IdSource;
    format!(
        "serve-{}-{:08x}",
        std::process::id(),
        RandomIds.random_below(1 << 32)
    )
}

/// Serves until `until` resolves, then shuts down cleanly; `ready` learns the bound address.
pub async fn run(
    config: ServeConfig,
    until: impl std::future::Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> Result<(), ServeError> {
    // Bound first: a port in use is found before the ledger is opened.
    let (listener, local) = bind(config.listen).await?;
    if config.metrics_closed {
        let note = "/metrics is closed: several tenants are configured and its counters show each one's activity; give the scraper a token ([metrics] token_env), or declare it open ([metrics] open = true)";
        warn!("{note}");
        eprintln!("{note}");
    }
    if let Some(warning) = connections::fit_descriptor_limit(&config.limits) {
        warn!("{warning}");
        eprintln!("{warning}");
    }
    let service = Service::start(config, Output::Stdout).await?;
    println!(
        "opledger serve: listening on http://{local} (ledger {}, read models {})",
        service.ledger_name,
        service.read_models_path.display()
    );
    info!(%local, "serving");
    if let Some(ready) = ready {
        let _ = ready.send(local);
    }
    let grace_end = serve_until(
        listener,
        Arc::clone(&service.shared),
        until,
        service.stop.clone(),
        service.stopping.clone(),
        service.limits,
    )
    .await;
    service.stop(grace_end).await
}

/// Serves MCP on stdin and stdout for `tenant` (`opledger mcp`) over the same service `serve`
/// runs, without listening anywhere, until the client closes the pipe or `until` resolves.
/// Stdout carries the protocol only: everything this prints goes to stderr.
pub async fn run_mcp_stdio(
    config: ServeConfig,
    tenant: TenantId,
    until: impl std::future::Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let service = Service::start(config, Output::Stderr).await?;
    eprintln!(
        "opledger mcp: serving tenant {tenant} on stdio (ledger {}, read models {})",
        service.ledger_name,
        service.read_models_path.display()
    );
    let server = opledger_mcp::McpServer::for_tenant(
        Arc::new(api::McpLedger(Arc::clone(&service.shared))),
        tenant,
    );
    let served = opledger_mcp::serve_stdio(server, until).await;
    let _ = service.stop.send(true);
    let grace_end = tokio::time::Instant::now()
        + std::time::Duration::from_millis(service.limits.shutdown_grace_ms);
    let stopped = service.stop(grace_end).await;
    served.map_err(|error| ServeError::Io(error.to_string()))?;
    stopped
}

/// Where the service's own lines go: stdout for `serve`, stderr when stdout is the MCP pipe.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Output {
    Stdout,
    Stderr,
}

impl Output {
    /// Prints one line of the service's own where it belongs.
    fn line(self, line: &str) {
        match self {
            Self::Stdout => println!("{line}"),
            Self::Stderr => eprintln!("{line}"),
        }
    }
}

/// The running service without its front (HTTP or stdio): the ledger, the engine and its
/// workers, the read-model runner, and what every request shares.
struct Service {
    shared: Arc<Shared>,
    /// The checkpoint publisher, when a signing key is configured.
    publisher: Option<tokio::task::JoinHandle<()>>,
    webhooks: Arc<opledger_webhooks::Webhooks>,
    workers: Workers,
    runner: tokio::task::JoinHandle<Result<opledger_readmodel::RunReport, ReadModelError>>,
    store: ServeStore,
    stop: watch::Sender<bool>,
    stopping: watch::Receiver<bool>,
    executes: Arc<Semaphore>,
    limits: Limits,
    ledger_name: String,
    read_models_path: PathBuf,
    output: Output,
}

impl Service {
    /// Opens the ledger and the read models (caught up), and starts the engine's workers.
    async fn start(config: ServeConfig, output: Output) -> Result<Self, ServeError> {
        let (ledger_name, read_models_path) = locations(&config);
        let instance_id = config
            .instance_id
            .clone()
            .unwrap_or_else(default_instance_id);
        info!(%instance_id, "this instance's id (in attempts, PostgreSQL's application_name, /metrics)");
        let store = open_store(
            &config.store,
            &config.store_limits,
            &config.log,
            &instance_id,
        )
        .await?;
        let (subjects, privacy) = personal::open_key_store(&config, &store)?;
        let log_signer = log::signer_of(&config.log).map_err(ServeError::Config)?;
        let read_models = ReadModels::open(&read_models_path).await?;
        catch_up_or_leave_to_runner(&store, &read_models, output).await?;
        let mut providers =
            HttpProviders::new(config.providers).map_err(|e| ServeError::Config(e.to_string()))?;
        for upstream in config.upstreams {
            // Said at start, not at the first call: the upstream's calls wait until a person
            // logs in (each not sent, with what to do).
            if let Some(file) = upstream.login_file().filter(|file| !file.exists()) {
                tracing::warn!(provider = %upstream.id(), file = %file.display(), "no one has logged in to this upstream yet; its calls wait until someone runs `opledger connectors login {}`", upstream.id());
            }
            providers
                .insert_mcp(upstream)
                .map_err(|e| ServeError::Config(e.to_string()))?;
        }
        // The engine's worker id: attempts carry it, and shutdown marks unknown only the
        // attempts in flight under it, so it must be this instance's alone.
        let worker = WorkerId::new(instance_id.clone())?;
        let mut ledger = Ledger::new(store.clone(), SystemClock, RandomIds);
        if let Some(subjects) = &subjects {
            ledger = ledger.with_personal_data(Arc::clone(subjects) as _);
        }
        let engine = Arc::new(Engine::try_new(ledger, providers, config.policy, worker)?);
        let (stop, stopping) = watch::channel(false);
        let workers = Workers::spawn(
            Arc::clone(&engine),
            read_models.clone(),
            WorkerConfig {
                max_concurrent: config.workers,
                send_delay_ms: config.worker_send_delay_ms,
                ..WorkerConfig::default()
            },
        );
        let runner_health = RunnerHealth::new();
        let runner = spawn_runner(
            &store,
            &read_models,
            &runner_health,
            config.read_model_linger_ms,
            &stopping,
        );
        let journal = webhooks::journal_for(&store, &config.store, &read_models_path).await?;
        let webhooks = Arc::new(match journal {
            Some(journal) => {
                opledger_webhooks::Webhooks::start_with(
                    &store,
                    Arc::new(webhooks::OutcomeRender {
                        store: store.clone(),
                        engine: Arc::clone(&engine),
                        states: std::sync::Mutex::default(),
                    }),
                    config.webhooks,
                    journal,
                    webhooks::lease_settings(config.webhook_lease_ms),
                    stopping.clone(),
                )
                .await?
            }
            None => opledger_webhooks::Webhooks::none(),
        });
        let claims = match &store {
            ServeStore::Postgres(postgres) => claims::Claims::Postgres(postgres.review_claims()),
            _ => claims::Claims::open_file(&claims::claims_path(&config.store, &read_models_path))?,
        };
        let limits = config.limits;
        let tokens = Tokens::new(config.tokens);
        let executes = Arc::new(Semaphore::new(limits.max_concurrent_executes));
        let shared = Arc::new(Shared {
            engine,
            read_models,
            runner_health,
            approval_guard: auth::guarded_by_approvers(&tokens),
            metrics_token: config.metrics_token.as_deref().map(auth::digest),
            metrics_closed: config.metrics_closed,
            metrics_by_endpoint: config.metrics_by_endpoint,
            tokens,
            limits,
            requests: RequestMetrics::default(),
            sse: Arc::new(Semaphore::new(limits.max_sse_connections)),
            streams: events::StreamsPerHolder::default(),
            executes: Arc::clone(&executes),
            shutdown: stopping.clone(),
            tenants: TenantCache::default(),
            openapi: openapi_for(&limits).into(),
            worker_counters: workers.counters(),
            webhooks: Arc::clone(&webhooks),
            connections: Arc::default(),
            claims,
            mcp_allowed_origins: config.mcp_allowed_origins,
            webhook_loopback_tenants: config.webhook_loopback_tenants,
            draining: std::sync::atomic::AtomicBool::new(false),
            instance_id,
            log_signer: log_signer.clone(),
            subjects,
            privacy,
        });
        // It ends at the stop signal; an erasure under way completes or is completed by the
        // next sweep (each step is idempotent).
        let _retention = personal::spawn_retention(&shared, stopping.clone());
        let publisher = log_signer.map(|signer| {
            log::spawn_publisher(store.clone(), signer, &config.log, stopping.clone())
        });
        Ok(Self {
            shared,
            publisher,
            webhooks,
            workers,
            runner,
            store,
            stop,
            stopping,
            executes,
            limits,
            ledger_name,
            read_models_path,
            output,
        })
    }

    /// Waits (until `grace_end`) for the sends made through the front to be recorded, stops the
    /// workers and the runner, and closes the store after its last acknowledged append is
    /// durable. Every step runs, whatever failed first, so the store is always closed cleanly.
    async fn stop(self, grace_end: tokio::time::Instant) -> Result<(), ServeError> {
        let _ = self.stop.send(true);
        wait_for_execute_drives(
            &self.executes,
            grace_end,
            self.limits.max_concurrent_executes,
        )
        .await;
        drop(self.shared);
        if let Some(publisher) = self.publisher {
            // It stops at the stop signal; a checkpoint being kept finishes first.
            let _ = publisher.await;
        }
        let worker_stats = self.workers.shutdown().await;
        let runner_result = self.runner.await;
        // A delivery under way is dropped: its checkpoint was not moved, so it repeats at start.
        self.webhooks.join().await;
        let closed = self.store.close().await;
        report_shutdown(worker_stats, runner_result, self.output);
        closed?;
        Ok(())
    }
}

/// Catches the read models up before serving when they are within [`READY_LAG_POSITIONS`] of
/// the log; otherwise only checks they belong to this ledger and leaves the rest to the runner,
/// so start-up does not grow with how far behind they are.
async fn catch_up_or_leave_to_runner(
    store: &ServeStore,
    read_models: &ReadModels,
    output: Output,
) -> Result<(), ServeError> {
    let lag = read_models.lag(store).await?;
    if lag.positions <= READY_LAG_POSITIONS {
        render::catch_up_showing_progress(
            store,
            read_models,
            None,
            "catching up the read models",
            false,
        )
        .await?;
    } else {
        opledger_readmodel::check_ledger(store, read_models).await?;
        let line = format!(
            "opledger: the read models are {} positions behind the log; they catch up in the background (/healthz answers 503 catching_up until then)",
            lag.positions
        );
        output.line(&line);
    }
    Ok(())
}

/// The ledger's name for the start line, and the read models' file. The read models are local to
/// each server, beside the SQLite ledger or in the working directory; with KurrentDB every
/// instance keeps its own, fed from the shared log.
fn locations(config: &ServeConfig) -> (String, PathBuf) {
    let (ledger_name, default_read_models) = match &config.store {
        StoreUrl::Sqlite(path) => {
            let mut read_models = path.clone().into_os_string();
            read_models.push(".views");
            (path.display().to_string(), PathBuf::from(read_models))
        }
        StoreUrl::KurrentDb(url) | StoreUrl::Postgres(url) => {
            (redacted(url), PathBuf::from("opledger.views"))
        }
    };
    let path = config.read_models.clone().unwrap_or(default_read_models);
    (ledger_name, path)
}

/// Binds the listening socket and reads back the address it got (port 0 picks a free one).
async fn bind(listen: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), ServeError> {
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|error| {
        ServeError::Io(format!(
            "cannot listen on {listen} ({error}); pick another address with --listen or `listen` in the config"
        ))
    })?;
    let local = listener
        .local_addr()
        .map_err(|error| ServeError::Io(format!("cannot read the bound address: {error}")))?;
    Ok((listener, local))
}

/// Opens the ledger the configuration names; PostgreSQL learns the instance's id as the
/// connections' `application_name`.
async fn open_store(
    store: &StoreUrl,
    limits: &opledger_store::postgres::StoreLimits,
    log: &log::LogSettings,
    instance_id: &str,
) -> Result<ServeStore, ServeError> {
    Ok(match store {
        StoreUrl::Sqlite(path) => ServeStore::Sqlite(
            SqliteStore::open_with(path, opledger_store::SqliteOptions { log_tree: log.tree })
                .await?,
        ),
        StoreUrl::KurrentDb(url) => ServeStore::KurrentDb(
            KurrentDbStore::connect(url)
                .await
                .map_err(|error| ServeError::Io(format!("cannot reach KurrentDB: {error}")))?,
        ),
        // The refusal already says which of URL, server, credentials or schema is wrong.
        StoreUrl::Postgres(url) => {
            let mut config = opledger_store::postgres::PostgresConfig::from_url(url)
                .map_err(|error| ServeError::Io(error.to_string()))?;
            config
                .apply(limits)
                .map_err(|error| ServeError::Io(error.to_string()))?;
            config.set_application_name(&format!("opledger {instance_id}"));
            ServeStore::Postgres(
                PostgresStore::connect_with(config)
                    .await
                    .map_err(|error| ServeError::Io(error.to_string()))?,
            )
        }
    })
}

/// The read-model runner, following the log until the server stops.
/// A run that fails on a storage fault (a full disk, say) starts again from its checkpoint after
/// a pause, so the read models resume once the cause is gone; `health` tells `/healthz` meanwhile.
fn spawn_runner(
    store: &ServeStore,
    read_models: &ReadModels,
    health: &RunnerHealth,
    linger_ms: u64,
    stopping: &watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Result<opledger_readmodel::RunReport, ReadModelError>> {
    let store = store.clone();
    let read_models = read_models.clone();
    let health = health.clone();
    let mut stopping = stopping.clone();
    tokio::spawn(async move {
        ReadModelRunner::new()
            .with_linger_ms(linger_ms)
            .run_supervised(&store, &read_models, &health, async move {
                let _ = stopping.wait_for(|stop| *stop).await;
            })
            .await
    })
}

/// Serves the API until `until` resolves, then drains: requests in progress get
/// `shutdown_grace_ms` to finish, because a client that never finishes its request must not keep
/// the store from closing. Connections are bounded in time and number (`connections.rs`).
async fn serve_until(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    until: impl std::future::Future<Output = ()> + Send + 'static,
    stop: watch::Sender<bool>,
    mut draining: watch::Receiver<bool>,
    limits: Limits,
) -> tokio::time::Instant {
    let grace = std::time::Duration::from_millis(limits.shutdown_grace_ms);
    let drain = std::time::Duration::from_millis(limits.shutdown_drain_ms);
    let stopped_at = Arc::new(std::sync::OnceLock::new());
    let stop_time = Arc::clone(&stopped_at);
    let counters = Arc::clone(&shared.connections);
    let drained = Arc::clone(&shared);
    let graceful = connections::serve(
        listener,
        api::router(shared),
        (&limits).into(),
        counters,
        async move {
            until.await;
            // Readiness fails first, while requests are still accepted and served, so that
            // traffic moves elsewhere before connections are refused.
            drained
                .draining
                .store(true, std::sync::atomic::Ordering::Relaxed);
            drop(drained);
            if !drain.is_zero() {
                info!(
                    drain_ms = limits.shutdown_drain_ms,
                    "shutdown signal: /readyz answers 503 while requests are still served"
                );
                tokio::time::sleep(drain).await;
            }
            let _ = stop_time.set(tokio::time::Instant::now());
            info!("shutting down: no new connections; finishing requests in progress");
            let _ = stop.send(true);
        },
    );
    tokio::select! {
        () = graceful => {}
        () = async {
            let _ = draining.wait_for(|stopping| *stopping).await;
            tokio::time::sleep(grace).await;
        } => {
            warn!(grace_ms = grace.as_millis() as u64, "requests still open after the shutdown grace are dropped");
        }
    }
    stopped_at
        .get()
        .map_or_else(tokio::time::Instant::now, |at| *at + grace)
}

/// An execute call answers at its deadline while its drive goes on, holding the call's place:
/// taking every place back waits, until `grace_end`, for each send made through the API to be
/// recorded before the store closes.
async fn wait_for_execute_drives(
    executes: &Semaphore,
    grace_end: tokio::time::Instant,
    max_concurrent_executes: usize,
) {
    let places = u32::try_from(max_concurrent_executes).unwrap_or(u32::MAX);
    if tokio::time::timeout_at(grace_end, executes.acquire_many(places))
        .await
        .is_err()
    {
        warn!(
            running = max_concurrent_executes - executes.available_permits(),
            "drives of execute calls still running after the shutdown grace; their attempts stay in flight until their lease, then are reconciled"
        );
    }
}

/// [`OPENAPI`] stating `limits`: the document ships with the default limits, and a server
/// configured otherwise must not describe a `wait_ms` it refuses (or a shorter one than it takes).
pub fn openapi_for(limits: &Limits) -> String {
    let mut document: serde_json::Value =
        serde_json::from_str(OPENAPI).expect("the OpenAPI document is JSON (a unit test reads it)");
    if let Some(paths) = document["paths"].as_object_mut() {
        for operation in paths
            .values_mut()
            .filter_map(serde_json::Value::as_object_mut)
        {
            for operation in operation.values_mut() {
                // `get_mut`, not `operation["parameters"]`: indexing a JSON object mutably
                // inserts the key, so a route without parameters would be served with
                // `"parameters": null`, which OpenAPI 3.1 refuses (an array or nothing).
                let Some(parameters) = operation
                    .get_mut("parameters")
                    .and_then(serde_json::Value::as_array_mut)
                else {
                    continue;
                };
                for parameter in parameters.iter_mut().filter(|p| p["name"] == "wait_ms") {
                    parameter["schema"]["maximum"] = limits.max_wait_ms.into();
                    parameter["schema"]["default"] = limits.default_wait_ms.into();
                }
            }
        }
    }
    document.to_string()
}

/// Says how the workers and the read-model runner ended.
fn report_shutdown(
    worker_stats: Result<
        opledger_runtime::workers::WorkerStats,
        opledger_runtime::workers::WorkerError,
    >,
    runner_result: Result<
        Result<opledger_readmodel::RunReport, ReadModelError>,
        tokio::task::JoinError,
    >,
    output: Output,
) {
    match worker_stats {
        Ok(stats) => {
            if stats.abandoned_at_shutdown > 0 {
                warn!(
                    abandoned = stats.abandoned_at_shutdown,
                    recorded_unknown = stats.recorded_unknown_at_shutdown,
                    "drives were still running at shutdown; their attempts were recorded as unknown and are reconciled at the next start"
                );
            }
            output.line(&format!(
                "opledger: stopped (workers drove {} time(s), {} still running at shutdown)",
                stats.drives, stats.abandoned_at_shutdown
            ));
        }
        Err(error) => warn!(%error, "the workers had stopped with an error"),
    }
    match runner_result {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => warn!(%error, "the read-model runner had stopped with an error"),
        Err(error) => warn!(%error, "the read-model runner failed"),
    }
}

/// A connection string without its password, for logs and the start line.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://…@{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod instance_tests {
    #[test]
    fn default_instance_ids_differ_between_instances_of_one_process_id() {
        let (a, b) = (super::default_instance_id(), super::default_instance_id());
        let pid = format!("serve-{}-", std::process::id());
        assert!(a.starts_with(&pid) && b.starts_with(&pid), "{a} {b}");
        assert_ne!(a, b);
        super::config::check_instance_id(&a).expect("a default id is a valid instance id");
    }

    #[test]
    fn an_instance_id_is_short_and_plain() {
        use super::config::check_instance_id;
        assert!(check_instance_id("opledger-7f9c4-x2l8q").is_ok());
        assert!(check_instance_id("").is_err());
        assert!(check_instance_id("a b").is_err());
        assert!(check_instance_id(&"x".repeat(49)).is_err());
    }
}
