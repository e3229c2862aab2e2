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

mod api;
mod auth;
pub mod config;
mod error;
mod events;
mod metrics;
/// The ledger the server keeps (see [`AnyStore`]).
pub type ServeStore = opledger_store::AnyStore;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use opledger_crm_stand::{Stand, StandConfig};
use opledger_domain::app::Ledger;
use opledger_domain::engine::Engine;
use opledger_domain::ids::{AccountId, ProviderId, TenantId, WorkerId};
use opledger_providers::{AccountConfig, HttpProvider, HttpProviderConfig, HttpProviders, Shape};
use opledger_readmodel::{ProjectionRunner, ReadModels};
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_runtime::workers::{WorkerConfig, Workers};
use opledger_store::{KurrentDbStore, SqliteStore};
use tokio::sync::{watch, Semaphore};
use tracing::{info, warn};

use self::auth::Tokens;
use self::config::{Limits, Principal, ServeConfig, StoreUrl};
use self::events::TenantCache;
use self::metrics::RequestMetrics;
use crate::cli::{CliError, ServeArgs};

/// The OpenAPI description of every route, served at `/v1/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// The embedded default's tokens: for a first look on a laptop, printed at start.
pub const DEMO_TENANT_TOKEN: &str = "demo-tenant-token";
const DEMO_OPERATOR_TOKEN: &str = "demo-operator-token";
const DEMO_ACCOUNT: &str = "demo";
const DEMO_CRM_TOKEN: &str = "demo-crm-token";

/// The engine the server drives operations with.
pub type ServeEngine = Engine<ServeStore, SystemClock, RandomIds, HttpProviders>;

/// What every request handler shares.
pub struct Shared {
    /// The engine (and, through it, the ledger and the providers).
    pub engine: Arc<ServeEngine>,
    /// The read models, kept up to date by the runner.
    pub read_models: ReadModels,
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
}

pub async fn run(args: ServeArgs) -> Result<(), CliError> {
    let (mut config, stand) = match &args.config {
        Some(path) => (
            config::load(path).map_err(|e| CliError::Config(e.to_string()))?,
            None,
        ),
        None => {
            let (config, stand) = embedded_default(&args.db).await?;
            (config, Some(stand))
        }
    };
    if let Some(listen) = &args.listen {
        config.listen = listen.parse::<SocketAddr>().map_err(|_| {
            opledger_domain::error::ValidationError::new(
                "--listen",
                format!("`{listen}` is not an address; write IP:port, e.g. 127.0.0.1:8080"),
            )
        })?;
    }
    // The demo tokens are printed and the same everywhere: never offer them beyond this machine.
    if stand.is_some() && !config.listen.ip().is_loopback() {
        return Err(opledger_domain::error::ValidationError::new(
            "--listen",
            format!(
                "{} is not a loopback address, and without --config the server runs with the public demo tokens; listen on 127.0.0.1, or write a configuration with your own tokens",
                config.listen
            ),
        )
        .into());
    }
    let result = serve(config, shutdown_signal(), None).await;
    if let Some(stand) = stand {
        stand.shutdown().await;
    }
    result
}

/// Serves until `until` resolves, then shuts down cleanly; `ready` learns the bound address.
pub async fn serve(
    config: ServeConfig,
    until: impl std::future::Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> Result<(), CliError> {
    // The read models are local to each server, beside the SQLite ledger or in the working
    // directory; with KurrentDB every instance keeps its own, fed from the shared log.
    let (ledger_name, default_views) = match &config.store {
        StoreUrl::Sqlite(path) => {
            let mut views = path.clone().into_os_string();
            views.push(".views");
            (path.display().to_string(), PathBuf::from(views))
        }
        StoreUrl::KurrentDb(url) => (redacted(url), PathBuf::from("opledger.views")),
    };
    let views_path = config.views.clone().unwrap_or(default_views);
    // Bound first: a port in use is found before the ledger is opened.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|error| {
            CliError::Other(format!(
                "cannot listen on {} ({error}); pick another address with --listen or `listen` in the config",
                config.listen
            ))
        })?;
    let local = listener
        .local_addr()
        .map_err(|error| CliError::Other(format!("cannot read the bound address: {error}")))?;
    let store = match &config.store {
        StoreUrl::Sqlite(path) => ServeStore::Sqlite(SqliteStore::open(path).await?),
        StoreUrl::KurrentDb(url) => ServeStore::KurrentDb(
            KurrentDbStore::connect(url)
                .await
                .map_err(|error| CliError::Other(format!("cannot reach KurrentDB: {error}")))?,
        ),
    };
    let read_models = ReadModels::open(&views_path).await?;
    crate::views::catch_up_showing_progress(
        &store,
        &read_models,
        None,
        "catching up the read models",
        false,
    )
    .await?;
    let providers =
        HttpProviders::new(config.providers).map_err(|e| CliError::Config(e.to_string()))?;
    let worker = WorkerId::new(format!("serve-{}", std::process::id()))?;
    let engine = Arc::new(Engine::try_new(
        Ledger::new(store.clone(), SystemClock, RandomIds),
        providers,
        config.policy,
        worker,
    )?);
    let (stop, stopping) = watch::channel(false);
    let workers = Workers::spawn(
        Arc::clone(&engine),
        WorkerConfig {
            max_concurrent: config.workers,
            send_delay_ms: config.worker_send_delay_ms,
            ..WorkerConfig::default()
        },
    );
    let linger_ms = config.read_model_linger_ms;
    let runner = {
        let store = store.clone();
        let read_models = read_models.clone();
        let mut stopping = stopping.clone();
        tokio::spawn(async move {
            ProjectionRunner::new()
                .with_linger_ms(linger_ms)
                .run(&store, &read_models, async move {
                    let _ = stopping.wait_for(|stop| *stop).await;
                })
                .await
        })
    };
    let tokens = Tokens::new(config.tokens);
    let shared = Arc::new(Shared {
        engine: Arc::clone(&engine),
        read_models,
        approval_guard: auth::guarded_by_approvers(&tokens),
        metrics_token: config.metrics_token.as_deref().map(auth::digest),
        tokens,
        limits: config.limits,
        requests: RequestMetrics::default(),
        sse: Arc::new(Semaphore::new(config.limits.max_sse_connections)),
        streams: events::StreamsPerHolder::default(),
        executes: Arc::new(Semaphore::new(config.limits.max_concurrent_executes)),
        shutdown: stopping.clone(),
        tenants: TenantCache::default(),
    });
    println!(
        "opledger serve: listening on http://{local} (ledger {}, read models {})",
        ledger_name,
        views_path.display()
    );
    info!(%local, "serving");
    if let Some(ready) = ready {
        let _ = ready.send(local);
    }
    let grace = std::time::Duration::from_millis(config.limits.shutdown_grace_ms);
    let mut draining = stopping.clone();
    let graceful = axum::serve(listener, api::router(shared)).with_graceful_shutdown(async move {
        until.await;
        info!("shutting down: no new connections; finishing requests in progress");
        let _ = stop.send(true);
    });
    // Requests in progress get `shutdown_grace_ms` to finish; a client that never finishes its
    // request must not keep the store from closing.
    let served = tokio::select! {
        served = std::future::IntoFuture::into_future(graceful) => served,
        () = async {
            let _ = draining.wait_for(|stopping| *stopping).await;
            tokio::time::sleep(grace).await;
        } => {
            warn!(grace_ms = grace.as_millis() as u64, "requests still open after the shutdown grace are dropped");
            Ok(())
        }
    };
    // Every path below runs, whatever failed first, so the store is always closed cleanly.
    let worker_stats = workers.shutdown().await;
    let runner_result = runner.await;
    let closed = store.close().await;
    served.map_err(|error| CliError::Other(format!("the server failed: {error}")))?;
    match worker_stats {
        Ok(stats) => {
            if stats.abandoned_at_shutdown > 0 {
                warn!(
                    abandoned = stats.abandoned_at_shutdown,
                    recorded_unknown = stats.recorded_unknown_at_shutdown,
                    "drives were still running at shutdown; their attempts were recorded as unknown and are reconciled at the next start"
                );
            }
            println!(
                "opledger serve: stopped (workers drove {} time(s), {} still running at shutdown)",
                stats.drives, stats.abandoned_at_shutdown
            );
        }
        Err(error) => warn!(%error, "the workers had stopped with an error"),
    }
    match runner_result {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => warn!(%error, "the read-model runner had stopped with an error"),
        Err(error) => warn!(%error, "the read-model runner failed"),
    }
    closed?;
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT); a second signal ends the process at once (what was
/// acknowledged is already durable; an attempt in flight is swept to unknown at the next start).
async fn shutdown_signal() {
    first_signal().await;
    tokio::spawn(async {
        first_signal().await;
        eprintln!("second signal: stopping now");
        std::process::exit(130);
    });
}

async fn first_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = terminate.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(error) => {
                warn!(%error, "cannot watch SIGTERM; only Ctrl-C stops the server");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The configuration `opledger serve` runs with when given none: the SQLite ledger at `--db`, the
/// CRM stand in-process on a free loopback port as provider `crm` (keyed shape, account `demo`),
/// one tenant `demo` and one operator, with the demo tokens printed.
pub async fn embedded_default(db: &std::path::Path) -> Result<(ServeConfig, Stand), CliError> {
    let stand = Stand::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        StandConfig {
            accounts: vec![(DEMO_ACCOUNT.to_owned(), DEMO_CRM_TOKEN.to_owned())],
            ..StandConfig::default()
        },
    )
    .await
    .map_err(|error| CliError::Other(format!("cannot start the CRM stand: {error}")))?;
    let mut providers = Vec::new();
    for (id, shape) in [("crm", Shape::Keyed), ("crm-plain", Shape::Plain)] {
        let mut provider = HttpProviderConfig::new(
            shape,
            stand.base_url(),
            vec![AccountConfig::with_token(
                AccountId::new(DEMO_ACCOUNT)?,
                DEMO_CRM_TOKEN,
            )],
        );
        provider.request_timeout_ms = 5_000;
        providers.push(
            HttpProvider::new(ProviderId::new(id)?, &provider)
                .map_err(|error| CliError::Other(error.to_string()))?,
        );
    }
    let mut tokens = BTreeMap::new();
    tokens.insert(
        DEMO_TENANT_TOKEN.to_owned(),
        Principal::Tenant(TenantId::new("demo")?),
    );
    tokens.insert(
        DEMO_OPERATOR_TOKEN.to_owned(),
        Principal::Operator {
            name: "demo-operator".into(),
            tenants: None,
        },
    );
    println!(
        "opledger serve: no --config, so the embedded default: ledger {}, the CRM stand at {} as providers `crm` (keyed) and `crm-plain` (lookup only), account `demo`, tenant `demo` with token `{DEMO_TENANT_TOKEN}`, operator token `{DEMO_OPERATOR_TOKEN}` (demo tokens: never use them beyond this machine)",
        db.display(),
        stand.base_url()
    );
    let config = ServeConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
        store: StoreUrl::Sqlite(db.to_path_buf()),
        views: None,
        policy: opledger_domain::engine::EnginePolicy {
            lease_ms: 15_000,
            ..Default::default()
        },
        read_model_linger_ms: config::DEFAULT_READ_MODEL_LINGER_MS,
        workers: 16,
        worker_send_delay_ms: config::DEFAULT_WORKER_SEND_DELAY_MS,
        limits: Limits::default(),
        tokens,
        metrics_token: None,
        providers,
    };
    Ok((config, stand))
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
