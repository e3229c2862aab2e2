//! `opledger serve`: picks the server's configuration and its shutdown signal, and runs the HTTP
//! service (the `opledger-http-api` crate).
//!
//! Without `--config` it runs the embedded default with the CRM stand in-process as a demo
//! provider, so `opledger serve` alone gives a working API. Shutdown is SIGTERM or Ctrl-C; a second
//! signal ends the process at once.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use opledger_crm_stand::{Stand, StandConfig};
use opledger_domain::ids::{AccountId, ProviderId, TenantId};
use opledger_http_api::config::personal::{PersonalDataSettings, DEFAULT_KEK_ENV};
use opledger_http_api::{Limits, Principal, ServeConfig, StoreUrl};
use opledger_providers::{render_all, AccountSpec, Connector, Credentials, Overrides};
use opledger_subjects::{key_store_path, Kek};
use tracing::warn;

use crate::cli::{CliError, ServeArgs};

/// The embedded default's tokens: for a first look on a laptop, printed at start.
pub const DEMO_TENANT_TOKEN: &str = "demo-tenant-token";
const DEMO_OPERATOR_TOKEN: &str = "demo-operator-token";
const DEMO_ACCOUNT: &str = "demo";
/// The embedded default's one tenant, for whom `opledger mcp` without `--config` acts.
pub const DEMO_TENANT: &str = "demo";
/// The CRM stand's token for the demo account (`bench store --open-per-mille` binds to it).
pub const DEMO_CRM_TOKEN: &str = "demo-crm-token";

/// `opledger serve`.
pub async fn run(args: ServeArgs) -> Result<(), CliError> {
    let (mut config, stand) = match &args.config {
        Some(path) => (
            opledger_http_api::config::load(path).map_err(|e| CliError::Config(e.to_string()))?,
            None,
        ),
        None => {
            let (config, stand) = embedded_default(&args.db).await?;
            println!(
                "opledger serve: no --config, so {}, tenant `{DEMO_TENANT}` with token `{DEMO_TENANT_TOKEN}`, operator token `{DEMO_OPERATOR_TOKEN}` (demo tokens: never use them beyond this machine)",
                embedded_default_summary(&args.db, &stand, &config)
            );
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
    // The id the traces were started with (see `instance_id`), so spans, logs, metrics and the
    // ledger's events name this instance alike.
    config
        .instance_id
        .get_or_insert_with(|| default_instance_id().to_owned());
    let result = opledger_http_api::run(config, shutdown_signal(), None).await;
    if let Some(stand) = stand {
        stand.shutdown().await;
    }
    Ok(result?)
}

/// The id this process serves as when its configuration names none (`serve-<pid>-<random>`),
/// drawn once: the traces' resource takes it before the configuration is loaded.
fn default_instance_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(opledger_http_api::default_instance_id)
}

/// The id `serve` runs as, for the traces' `service.instance.id`: the configuration's
/// `instance_id` (read from its text; the loader checks it) or the default one.
pub fn instance_id(config_text: Option<&str>) -> String {
    config_text
        .and_then(opledger_http_api::config::instance_id_in)
        .unwrap_or_else(|| default_instance_id().to_owned())
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT); a second signal ends the process at once (what was
/// acknowledged is already durable; an attempt in flight is swept to unknown at the next start).
pub async fn shutdown_signal() {
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

/// The configuration `opledger serve` and `opledger mcp` run with when given none: the SQLite
/// ledger at `db`, the CRM stand in-process on a free loopback port as provider `crm` (keyed
/// shape, account `demo`), one tenant `demo` and one operator. It prints nothing: the caller says
/// what it runs ([`embedded_default_summary`]) where its own lines go, for `opledger mcp` never
/// on stdout, which is the protocol's.
pub async fn embedded_default(db: &std::path::Path) -> Result<(ServeConfig, Stand), CliError> {
    // Read before anything starts, so a key that is no key stops the start with nothing begun.
    let personal_data = personal_data_from_environment()?;
    let stand = Stand::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        StandConfig {
            accounts: vec![(DEMO_ACCOUNT.to_owned(), DEMO_CRM_TOKEN.to_owned())],
            ..StandConfig::default()
        },
    )
    .await
    .map_err(|error| CliError::Other(format!("cannot start the CRM stand: {error}")))?;
    let providers = embedded_providers(stand.base_url())?;
    let mut tokens = BTreeMap::new();
    tokens.insert(
        DEMO_TENANT_TOKEN.to_owned(),
        Principal::Tenant(TenantId::new(DEMO_TENANT)?),
    );
    tokens.insert(
        DEMO_OPERATOR_TOKEN.to_owned(),
        Principal::Operator {
            name: "demo-operator".into(),
            tenants: None,
        },
    );
    let config = ServeConfig {
        listen: opledger_http_api::config::DEFAULT_LISTEN,
        store: StoreUrl::Sqlite(db.to_path_buf()),
        store_limits: Default::default(),
        read_models: None,
        policy: opledger_domain::engine::EnginePolicy {
            lease_ms: 15_000,
            ..Default::default()
        },
        read_model_linger_ms: opledger_http_api::config::DEFAULT_READ_MODEL_LINGER_MS,
        workers: opledger_http_api::config::DEFAULT_WORKERS,
        worker_send_delay_ms: opledger_http_api::config::DEFAULT_WORKER_SEND_DELAY_MS,
        limits: Limits::default(),
        tokens,
        metrics_token: None,
        metrics_closed: false,
        metrics_by_endpoint: true,
        providers,
        upstreams: Vec::new(),
        webhooks: Vec::new(),
        webhook_lease_ms: opledger_webhooks::DEFAULT_WEBHOOK_LEASE_MS,
        mcp_allowed_origins: Vec::new(),
        log: opledger_http_api::log::LogSettings::from_environment()
            .map_err(crate::cli::CliError::Config)?,
        instance_id: None,
        personal_data,
        webhook_loopback_tenants: Default::default(),
    };
    Ok((config, stand))
}

/// The embedded default's connectors, sending to the stand at `base_url`: the stand's keyed and
/// plain shapes, through the same connector documents a user's configuration names as presets,
/// with the demo tenant owning the demo account. (`ops show` without `--config` words its
/// sentence from them, as `serve` without one does.)
pub fn embedded_providers(base_url: String) -> Result<Vec<Connector>, CliError> {
    let mut providers = Vec::new();
    for (id, preset) in [("crm", "crm-stand-keyed"), ("crm-plain", "crm-stand-plain")] {
        let overrides = Overrides {
            id: Some(ProviderId::new(id)?),
            base_url: Some(base_url.clone()),
            accounts: vec![AccountSpec {
                id: AccountId::new(DEMO_ACCOUNT)?,
                tenants: vec![TenantId::new(DEMO_TENANT)?],
                credentials: Credentials::token(DEMO_CRM_TOKEN),
            }],
            request_timeout_ms: Some(5_000),
            ..Overrides::default()
        };
        providers.push(
            Connector::from_preset(preset, overrides)
                .map_err(|errors| CliError::Other(render_all(&errors)))?,
        );
    }
    Ok(providers)
}

/// Personal data as a configuration without `[personal_data]` has it: on, with the key store
/// beside the ledger, when `$OPLEDGER_KEK` holds a key-encryption key; off when it is not set.
/// A value that is no key stops the start: a server that quietly ran without the key would
/// refuse every subject an agent names.
fn personal_data_from_environment() -> Result<Option<PersonalDataSettings>, CliError> {
    let text = match std::env::var(DEFAULT_KEK_ENV) {
        Ok(text) => text,
        Err(std::env::VarError::NotPresent) => return Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(CliError::Config(format!(
                "${DEFAULT_KEK_ENV} is not text; set it to 32 random bytes as 64 hex digits (`openssl rand -hex 32`), or unset it to run without personal data"
            )))
        }
    };
    let kek = Kek::parse(&text, &format!("${DEFAULT_KEK_ENV}"))
        .map_err(|error| CliError::Config(error.to_string()))?;
    Ok(Some(PersonalDataSettings {
        kek,
        key_store: None,
        tenants: Default::default(),
    }))
}

/// What the embedded default at `db` with `stand` is, in a phrase for the start-up line.
pub fn embedded_default_summary(
    db: &std::path::Path,
    stand: &Stand,
    config: &ServeConfig,
) -> String {
    let personal = match &config.personal_data {
        Some(settings) => format!(
            ", personal data on (key {} from ${DEFAULT_KEK_ENV}, keys in {})",
            settings.kek.id(),
            key_store_path(db).display()
        ),
        None => String::new(),
    };
    format!(
        "the embedded default: ledger {}, the CRM stand at {} as providers `crm` (keyed) and `crm-plain` (lookup only), account `{DEMO_ACCOUNT}`{personal}",
        db.display(),
        stand.base_url()
    )
}
