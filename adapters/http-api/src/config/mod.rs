//! `opledger serve`'s configuration: one TOML file (see `opledger.example.toml` at the top of the
//! repository), checked whole before anything is opened or bound.
//!
//! Every error names the field and the line of the file it is on, because an operator reading
//! "invalid config" at 3 a.m. needs to know where to look. Secrets (tenant, operator and provider
//! tokens) may be written inline for a laptop, but belong in environment variables (`token_env`),
//! which are read here, once, at start.
//!
//! Files: this one holds the checked configuration ([`ServeConfig`]), the error, the file's
//! top-level shape and the checker that walks it; each section is checked in the file named for
//! it: `tokens.rs` (`[[tenants]]`, `[[operators]]`, `[[approvers]]`), `connectors.rs`,
//! `engine.rs`, `limits.rs`, `metrics.rs`, `mcp.rs`, `store.rs`, `webhooks.rs`, `personal.rs`
//! (`[personal_data]`) and `log.rs` (`[log]`); `tests.rs` holds their refusals.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};

use opledger_domain::engine::EnginePolicy;
use opledger_providers::mcp::McpConnector;
use opledger_providers::Connector;
use opledger_readmodel::MAX_LINGER_MS;
use opledger_runtime::workers::MAX_SEND_DELAY_MS;
use serde::Deserialize;
use toml::Spanned;

mod connectors;
mod engine;
mod limits;
mod log;
mod mcp;
mod metrics;
pub mod personal;
mod store;
#[cfg(test)]
mod tests;
mod tokens;
mod webhooks;

use self::connectors::ConnectorEntry;
use self::engine::EngineSection;
use self::limits::LimitsSection;
use self::mcp::McpSection;
use self::metrics::MetricsSection;
use self::tokens::{tenant_ids, Operator, TokenHolder};

pub use self::connectors::{read_connector_file, MAX_CONNECTOR_FILE_BYTES};
pub use self::limits::{
    Limits, DEFAULT_HEADER_READ_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_ADDRESS, MAX_BODY_LIMIT_BYTES, MAX_CONNECTIONS_LIMIT,
    MAX_EXECUTES_LIMIT, MAX_IDLE_TIMEOUT_MS, MAX_SSE_LIMIT, MAX_WAIT_LIMIT_MS,
    MIN_HEADER_READ_TIMEOUT_MS,
};
pub use self::tokens::{Principal, MIN_TOKEN_CHARS};

/// How long the background workers leave a fresh send to an API caller who may execute it, in
/// milliseconds: executing on request is the fast path, the workers are the safety net.
pub const DEFAULT_WORKER_SEND_DELAY_MS: u64 = 1_000;
/// Most operations the workers drive at once when the file does not say.
pub const DEFAULT_WORKERS: usize = opledger_runtime::workers::DEFAULT_MAX_CONCURRENT;
/// Where the server listens when neither the file nor `--listen` says: loopback only, so a first
/// start never exposes the API.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);
/// How long a read-model batch waits for more events after its first, in milliseconds: a few
/// large commits cost far less than many small ones, and an operation whose events all land in
/// one batch has its row written once. A listing waiting for the read models cuts the wait short
/// (`ReadModels::hurry`), so reading your own writes does not pay for it.
pub const DEFAULT_READ_MODEL_LINGER_MS: u64 = 200;
/// The largest configuration file read, in bytes.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;
/// Most tenants, operators or providers one file may name.
pub const MAX_ENTRIES: usize = 10_000;

/// A configuration error, with the file and line it points at when there is one.
#[derive(Debug, thiserror::Error)]
#[error("{file}{}: {field}: {message}", line.map(|line| format!(":{line}")).unwrap_or_default())]
pub struct ConfigError {
    /// The file.
    pub file: String,
    /// The 1-based line, when the problem is at a place in the file.
    pub line: Option<usize>,
    /// The field, as a dotted path (`tenants[1].token_env`).
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

/// The store a server keeps its ledger in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// The embedded SQLite file.
    Sqlite(PathBuf),
    /// A KurrentDB / EventStoreDB connection string.
    KurrentDb(String),
    /// A PostgreSQL URL (`postgres://user@host:5432/database`; the password may come from
    /// `PGPASSWORD`).
    Postgres(String),
}

/// A checked configuration, ready to start a server.
#[derive(Debug)]
pub struct ServeConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The ledger.
    pub store: StoreUrl,
    /// A PostgreSQL store's pool and timeouts (`[store]`); unset ones keep their defaults.
    pub store_limits: opledger_store::postgres::StoreLimits,
    /// The read-model file (`None`: beside the SQLite ledger, or `opledger.views` for KurrentDB).
    pub read_models: Option<PathBuf>,
    /// How long a read-model batch waits for more events after its first, in milliseconds.
    pub read_model_linger_ms: u64,
    /// The engine's lease, retry budget and backoff.
    pub policy: EnginePolicy,
    /// Most operations the background workers drive at once.
    pub workers: usize,
    /// How long the workers leave a fresh send to the caller who may execute it, in ms.
    pub worker_send_delay_ms: u64,
    /// Request limits.
    pub limits: Limits,
    /// Every bearer token and whom it stands for.
    pub tokens: BTreeMap<String, Principal>,
    /// The token `/metrics` asks for (`None`: open, showing aggregates only).
    pub metrics_token: Option<String>,
    /// `/metrics` answers nobody: several tenants are configured and no scraper token, and it
    /// was not declared open (`[metrics] open = true`). Its counters show every tenant's activity.
    pub metrics_closed: bool,
    /// The webhook metrics are labelled by endpoint (`endpoint="billing"`). With several tenants
    /// an endpoint's counts are one tenant's activity, so they are summed over every endpoint
    /// unless `[metrics] endpoint_labels = true` asks for them one by one.
    pub metrics_by_endpoint: bool,
    /// The connectors and their accounts, built (their HTTP clients ready).
    pub providers: Vec<Connector>,
    /// The upstream MCP servers configured as connectors (their sessions start when first
    /// needed).
    pub upstreams: Vec<McpConnector>,
    /// The endpoints outcome events are delivered to (`[[webhooks]]`).
    pub webhooks: Vec<opledger_webhooks::Endpoint>,
    /// How long an instance's hold on an endpoint lasts unrenewed, in milliseconds, when
    /// instances share a PostgreSQL ledger (`webhook_lease_ms`).
    pub webhook_lease_ms: u64,
    /// Browser origins `/mcp` answers besides loopback ones (`[mcp] allowed_origins`), each
    /// `scheme://host[:port]` in lower case.
    pub mcp_allowed_origins: Vec<String>,
    /// The transparency log: signing key, checkpoint publishing, the tree switch (`[log]`).
    pub log: crate::log::LogSettings,
    /// This instance's name (`instance_id`); `None`: `serve-<pid>-<random>`, unique even
    /// between containers whose processes share a process id.
    pub instance_id: Option<String>,
    /// Personal data (`[personal_data]`): `None` when no key-encryption key is configured, and
    /// then an intent naming a data subject is refused.
    pub personal_data: Option<personal::PersonalDataSettings>,
    /// The tenants whose own webhook endpoints may post to loopback (`webhooks_to_loopback =
    /// true` in their `[[tenants]]` entry); every other tenant's may not.
    pub webhook_loopback_tenants: std::collections::BTreeSet<opledger_domain::ids::TenantId>,
}

/// The longest `instance_id`, in characters: it travels in every attempt event, log line and
/// PostgreSQL's `application_name` (63 bytes, with the `opledger ` before it).
pub const MAX_INSTANCE_ID_CHARS: usize = 48;

/// The `instance_id` a configuration's text names, read before the file is loaded (the traces
/// start first); `None` when it names none or does not parse (the loader then says why).
pub fn instance_id_in(text: &str) -> Option<String> {
    let table = text.parse::<toml::Table>().ok()?;
    table.get("instance_id")?.as_str().map(str::to_owned)
}

/// Checks an `instance_id`: 1 to [`MAX_INSTANCE_ID_CHARS`] letters, digits, `.`, `_` or `-`.
pub fn check_instance_id(id: &str) -> Result<(), String> {
    let fits = !id.is_empty()
        && id.chars().count() <= MAX_INSTANCE_ID_CHARS
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if fits {
        Ok(())
    } else {
        Err(format!(
            "`{id}` is not an instance id; write 1 to {MAX_INSTANCE_ID_CHARS} letters, digits, '.', '_' or '-', unique among the instances sharing a ledger (a pod name fits)"
        ))
    }
}

// ---- the file's shape (serde) ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<Spanned<String>>,
    instance_id: Option<Spanned<String>>,
    /// A URL, or a `[store]` table with the URL and the limits (`config/store.rs`).
    store: Option<Spanned<toml::Value>>,
    /// `views` is the key's older name, still read.
    #[serde(alias = "views")]
    read_models: Option<PathBuf>,
    read_model_linger_ms: Option<Spanned<u64>>,
    /// The environment variable holding the key credential fingerprints are keyed with.
    credential_fingerprint_key_env: Option<Spanned<String>>,
    #[serde(default)]
    engine: EngineSection,
    #[serde(default)]
    limits: LimitsSection,
    #[serde(default)]
    tenants: Vec<TokenHolder>,
    #[serde(default)]
    operators: Vec<Operator>,
    #[serde(default)]
    approvers: Vec<Operator>,
    #[serde(default)]
    connectors: Vec<ConnectorEntry>,
    #[serde(default)]
    metrics: MetricsSection,
    #[serde(default)]
    mcp: McpSection,
    #[serde(default)]
    webhooks: Vec<webhooks::WebhookEntry>,
    webhook_lease_ms: Option<Spanned<u64>>,
    /// `[log]`: the transparency log.
    log: Option<log::LogSection>,
    /// `[personal_data]`: the key-encryption key and the key store.
    personal_data: Option<personal::PersonalDataSection>,
    /// `[telemetry]` is read and checked by `adapters/telemetry` when the binary starts, before
    /// this file is loaded; here it is only allowed.
    #[serde(default)]
    #[allow(dead_code)]
    telemetry: Option<toml::Table>,
}

/// Reads and checks the configuration file at `path`.
pub fn load(path: &Path) -> Result<ServeConfig, ConfigError> {
    let file = path.display().to_string();
    let whole = |field: &str, message: String| ConfigError {
        file: file.clone(),
        line: None,
        field: field.to_owned(),
        message,
    };
    let size = std::fs::metadata(path)
        .map_err(|error| {
            whole(
                "file",
                format!("cannot be read ({error}); pass --config with the path of a TOML file, or leave --config out for the embedded default"),
            )
        })?
        .len();
    if size > MAX_CONFIG_BYTES {
        return Err(whole(
            "file",
            format!("is {size} bytes; a configuration is at most {MAX_CONFIG_BYTES} bytes"),
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|error| whole("file", format!("cannot be read as UTF-8 text ({error})")))?;
    parse(&file, &text, &|name| std::env::var(name).ok())
}

/// Checks a configuration text; `env` reads an environment variable (tests pass their own).
pub fn parse(
    file: &str,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ServeConfig, ConfigError> {
    let parsed: File = toml::from_str(text).map_err(|error| ConfigError {
        file: file.to_owned(),
        line: error.span().map(|span| line_of(text, span.start)),
        field: "syntax".into(),
        // The parser's own message quotes the offending line; its first line is enough here.
        message: error.message().trim().to_owned(),
    })?;
    Checker { file, text, env }.check(parsed)
}

struct Checker<'a> {
    file: &'a str,
    text: &'a str,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Checker<'_> {
    fn error(&self, span: Option<Range<usize>>, field: &str, message: String) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            line: span.map(|span| line_of(self.text, span.start)),
            field: field.to_owned(),
            message,
        }
    }

    fn check(&self, file: File) -> Result<ServeConfig, ConfigError> {
        let listen = match &file.listen {
            Some(listen) => listen.get_ref().parse::<SocketAddr>().map_err(|_| {
                self.error(
                    Some(listen.span()),
                    "listen",
                    format!(
                        "`{}` is not an address; write IP:port, e.g. \"127.0.0.1:8080\"",
                        listen.get_ref()
                    ),
                )
            })?,
            None => DEFAULT_LISTEN,
        };
        let (store, store_limits) = self.store(file.store.as_ref())?;
        let (policy, workers) = self.engine(&file.engine)?;
        let worker_send_delay_ms = spanned_or(
            &file.engine.worker_send_delay_ms,
            DEFAULT_WORKER_SEND_DELAY_MS,
        );
        if worker_send_delay_ms > MAX_SEND_DELAY_MS {
            return Err(self.error(
                span(&file.engine.worker_send_delay_ms),
                "engine.worker_send_delay_ms",
                format!("is {worker_send_delay_ms}; use 0 to {MAX_SEND_DELAY_MS}"),
            ));
        }
        let limits = self.limits(&file.limits)?;
        for (name, count) in [
            ("tenants", file.tenants.len()),
            ("operators", file.operators.len()),
            ("approvers", file.approvers.len()),
            ("connectors", file.connectors.len()),
        ] {
            if count > MAX_ENTRIES {
                return Err(self.error(
                    None,
                    name,
                    format!("lists {count}; at most {MAX_ENTRIES} are allowed"),
                ));
            }
        }
        let tokens = self.tokens(&file)?;
        let metrics_token = self.metrics_token(&file.metrics, &tokens)?;
        let open = file
            .metrics
            .open
            .as_ref()
            .is_some_and(|open| *open.get_ref());
        if open && metrics_token.is_some() {
            return Err(self.error(
                span(&file.metrics.open),
                "metrics.open",
                "is given together with a token; keep the token (the scraper sends it) or open = true (anyone may read /metrics), not both".into(),
            ));
        }
        let several_tenants = tenant_ids(&tokens).len() > 1;
        let metrics_closed = metrics_token.is_none() && !open && several_tenants;
        let metrics_by_endpoint = file
            .metrics
            .endpoint_labels
            .as_ref()
            .map_or(!several_tenants, |labels| *labels.get_ref());
        let token_dir = match &store {
            StoreUrl::Sqlite(path) => path.parent().map(Path::to_path_buf),
            _ => None,
        }
        .unwrap_or_else(|| self.relative("."));
        let fingerprint_key = self.fingerprint_key(&file.credential_fingerprint_key_env)?;
        // Read before the connectors: an upstream's login is sealed under its key.
        let personal_data = self.personal_data(file.personal_data.as_ref(), &file.tenants)?;
        let (providers, upstreams) = self.connectors(
            &file.connectors,
            &tenant_ids(&tokens),
            &token_dir,
            fingerprint_key.as_ref(),
            personal_data.as_ref().map(|settings| &settings.kek),
        )?;
        let tenant_names = tenant_ids(&tokens).iter().map(|t| t.to_string()).collect();
        let webhooks = self.webhooks(&file.webhooks, &tenant_names)?;
        self.webhooks_fit_the_store(&file.webhooks, &store)?;
        let webhook_lease_ms = self.webhook_lease_ms(&file.webhook_lease_ms)?;
        let mcp_allowed_origins = self.mcp_allowed_origins(&file.mcp)?;
        let log = self.log(file.log.as_ref())?;
        let webhook_loopback_tenants = file
            .tenants
            .iter()
            .filter(|holder| {
                holder
                    .webhooks_to_loopback
                    .as_ref()
                    .is_some_and(|on| *on.get_ref())
            })
            .filter_map(|holder| {
                opledger_domain::ids::TenantId::new(holder.id.get_ref().clone()).ok()
            })
            .collect();
        if let Some(id) = &file.instance_id {
            check_instance_id(id.get_ref())
                .map_err(|message| self.error(Some(id.span()), "instance_id", message))?;
        }
        let read_model_linger_ms =
            spanned_or(&file.read_model_linger_ms, DEFAULT_READ_MODEL_LINGER_MS);
        if read_model_linger_ms > MAX_LINGER_MS {
            return Err(self.error(
                span(&file.read_model_linger_ms),
                "read_model_linger_ms",
                format!("is {read_model_linger_ms}; use 0 to {MAX_LINGER_MS}"),
            ));
        }
        Ok(ServeConfig {
            listen,
            store,
            store_limits,
            read_models: file.read_models,
            read_model_linger_ms,
            policy,
            workers,
            worker_send_delay_ms,
            limits,
            tokens,
            metrics_token,
            metrics_closed,
            metrics_by_endpoint,
            providers,
            upstreams,
            webhooks,
            webhook_lease_ms,
            mcp_allowed_origins,
            log,
            instance_id: file.instance_id.map(Spanned::into_inner),
            personal_data,
            webhook_loopback_tenants,
        })
    }

    /// `path` as written in this file: a relative path is taken from the file's directory.
    fn relative(&self, path: &str) -> PathBuf {
        let path = Path::new(path);
        if path.is_absolute() {
            return path.to_path_buf();
        }
        Path::new(self.file)
            .parent()
            .map_or_else(|| path.to_path_buf(), |dir| dir.join(path))
    }
}

/// Parses `sqlite:///abs/path`, `sqlite://relative/path`, a KurrentDB URL or a PostgreSQL URL.
pub fn parse_store(text: &str) -> Result<StoreUrl, String> {
    let text = text.trim();
    if let Some(path) = text.strip_prefix("sqlite://") {
        if path.is_empty() {
            return Err(
                "`sqlite://` names no file; write sqlite:///var/lib/opledger/opledger.db".into(),
            );
        }
        return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
    }
    if text.starts_with("kurrentdb://")
        || text.starts_with("kurrentdb+discover://")
        || text.starts_with("esdb://")
        || text.starts_with("esdb+discover://")
    {
        return Ok(StoreUrl::KurrentDb(text.to_owned()));
    }
    if opledger_store::postgres::SCHEMES
        .iter()
        .any(|scheme| text.starts_with(scheme))
    {
        // Checked here, so a URL without a user or database is refused with the config's line.
        opledger_store::postgres::PostgresConfig::from_url(text)
            .map_err(|error| error.to_string())?;
        return Ok(StoreUrl::Postgres(text.to_owned()));
    }
    Err(format!(
        "`{}` is not a store URL; write sqlite:///path/to/ledger.db, kurrentdb://host:2113 / esdb://host:2113, or postgres://user@host:5432/database",
        opledger_store::postgres::redact(text)
    ))
}

fn spanned_or<T: Copy>(value: &Option<Spanned<T>>, default: T) -> T {
    value.as_ref().map_or(default, |value| *value.get_ref())
}

fn span<T>(value: &Option<Spanned<T>>) -> Option<Range<usize>> {
    value.as_ref().map(Spanned::span)
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}
