//! `opledger serve`'s configuration: one TOML file (see `opledger.example.toml` at the top of the
//! repository), checked whole before anything is opened or bound.
//!
//! Every error names the field and the line of the file it is on, because an operator reading
//! "invalid config" at 3 a.m. needs to know where to look. Secrets (tenant, operator and provider
//! tokens) may be written inline for a laptop, but belong in environment variables (`token_env`),
//! which are read here, once, at start.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};

use opledger_domain::contract::RetryPolicy;
use opledger_domain::engine::EnginePolicy;
use opledger_domain::ids::{AccountId, ProviderId, TenantId};
use opledger_providers::document::{parse_any, AnyDocument};
use opledger_providers::mcp::spec::McpAccount;
use opledger_providers::mcp::{McpConnector, McpDocument};
use opledger_providers::{
    presets, AccountSpec, Connector, ConnectorError, Credentials, Overrides, Secret, SecretSource,
};
use opledger_readmodel::MAX_LINGER_MS;
use opledger_runtime::workers::{MAX_CONCURRENT_LIMIT, MAX_SEND_DELAY_MS};
use serde::Deserialize;
use toml::Spanned;

mod log;
pub mod personal;
mod store;
mod webhooks;

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
/// The shortest token accepted: shorter ones are guessable.
pub const MIN_TOKEN_CHARS: usize = 16;
/// The largest request body any configuration may allow, in bytes.
pub const MAX_BODY_LIMIT_BYTES: usize = 16 * 1024 * 1024;
/// Most concurrent SSE streams any configuration may allow.
pub const MAX_SSE_LIMIT: usize = 10_000;
/// Most concurrent execute calls any configuration may allow.
pub const MAX_EXECUTES_LIMIT: usize = 100_000;
/// The longest `wait_ms` any configuration may allow an execute call, in milliseconds.
pub const MAX_WAIT_LIMIT_MS: u64 = 10 * 60 * 1000;
/// How long a connection may take to deliver a request's headers, from its accept (or from the
/// first byte of a later request on it), in milliseconds, when the file does not say. A client
/// sends its headers in one write, so they arrive within a round trip; 10 s leaves room for a
/// congested link and closes a slowloris connection (half a header, then nothing) long before
/// it matters.
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// The shortest header read timeout any configuration may set, in milliseconds: below it an
/// honest client on a slow link would lose its requests (the tests use it to stay quick).
pub const MIN_HEADER_READ_TIMEOUT_MS: u64 = 100;
/// How long a keep-alive connection may wait for its next request, in milliseconds, when the file
/// does not say. Longer than the idle expiry of common client pools (Go's and reqwest's 90 s), so
/// a client drops an idle connection before the server does and never sends a request on one the
/// server is closing at that very moment.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 120_000;
/// The longest idle timeout any configuration may set, in milliseconds.
pub const MAX_IDLE_TIMEOUT_MS: u64 = 60 * 60 * 1000;
/// Most connections open at once when the file does not say. A half-open connection costs about
/// 27 KiB (measured: docs/src/performance.md), so a flood holding them all costs ~108 MiB,
/// for at most `header_read_timeout_ms` each.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4_096;
/// Most connections open at once from one client address when the file does not say: one
/// address's flood leaves the other places to everyone else.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;
/// The most connections any configuration may allow: each holds a file descriptor.
pub const MAX_CONNECTIONS_LIMIT: usize = 1_000_000;

const _: () = assert!(
    MIN_HEADER_READ_TIMEOUT_MS <= DEFAULT_HEADER_READ_TIMEOUT_MS
        && DEFAULT_HEADER_READ_TIMEOUT_MS <= DEFAULT_IDLE_TIMEOUT_MS
        && DEFAULT_IDLE_TIMEOUT_MS <= MAX_IDLE_TIMEOUT_MS
);
const _: () = assert!(
    DEFAULT_MAX_CONNECTIONS_PER_ADDRESS <= DEFAULT_MAX_CONNECTIONS
        && DEFAULT_MAX_CONNECTIONS <= MAX_CONNECTIONS_LIMIT
);

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

/// Who a bearer token belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// A tenant's agents and services: their own operations only.
    Tenant(TenantId),
    /// A person working the review queue, for some tenants or all.
    Operator {
        /// Their name, recorded as the reviewer.
        name: String,
        /// The tenants whose queue they work (`None`: every tenant).
        tenants: Option<BTreeSet<TenantId>>,
    },
    /// A person who approves or denies operations awaiting approval, for some tenants or all.
    /// Once a tenant has an approver, its own token can no longer approve: an agent holding the
    /// tenant's token cannot approve its own request.
    Approver {
        /// Their name, recorded as the approver.
        name: String,
        /// The tenants whose operations they decide (`None`: every tenant).
        tenants: Option<BTreeSet<TenantId>>,
    },
}

/// Request limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Most concurrent SSE streams.
    pub max_sse_connections: usize,
    /// Most concurrent SSE streams of one tenant (or one operator or approver).
    pub max_sse_connections_per_holder: usize,
    /// The longest an execute call may wait, in milliseconds.
    pub max_wait_ms: u64,
    /// The wait of an execute call that names none, in milliseconds.
    pub default_wait_ms: u64,
    /// How long shutdown waits for requests in progress before dropping them, in milliseconds.
    pub shutdown_grace_ms: u64,
    /// How long, after a shutdown signal, `/readyz` answers 503 while requests are still
    /// accepted and served, before the listener closes, in milliseconds: time for a load
    /// balancer or Kubernetes' endpoints to stop sending traffic here.
    pub shutdown_drain_ms: u64,
    /// Most execute calls driving or waiting at once (each holds a drive or a timer).
    pub max_concurrent_executes: usize,
    /// How long a connection may take to deliver a request's headers, in milliseconds: from its
    /// accept for the first request, from the request's first byte for later ones.
    pub header_read_timeout_ms: u64,
    /// How long a keep-alive connection may wait for its next request's headers, in milliseconds.
    pub idle_timeout_ms: u64,
    /// Most connections open at once; the next one is answered 503 and closed.
    pub max_connections: usize,
    /// Most connections open at once from one client address; the next one from it is answered
    /// 429 and closed.
    pub max_connections_per_address: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 256 * 1024,
            max_sse_connections: 64,
            max_sse_connections_per_holder: 16,
            max_wait_ms: 30_000,
            default_wait_ms: 5_000,
            shutdown_grace_ms: 35_000,
            shutdown_drain_ms: 0,
            max_concurrent_executes: 1_024,
            header_read_timeout_ms: DEFAULT_HEADER_READ_TIMEOUT_MS,
            idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
        }
    }
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

/// One built `[[connectors]]` entry.
enum Built {
    Rest(Connector),
    Mcp(McpConnector),
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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpSection {
    #[serde(default)]
    allowed_origins: Vec<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetricsSection {
    token: Option<Spanned<String>>,
    token_env: Option<Spanned<String>>,
    /// Shows `/metrics` to anyone though several tenants are configured.
    open: Option<Spanned<bool>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EngineSection {
    lease_ms: Option<Spanned<u64>>,
    workers: Option<Spanned<usize>>,
    worker_send_delay_ms: Option<Spanned<u64>>,
    backoff_base_ms: Option<Spanned<u64>>,
    backoff_max_ms: Option<Spanned<u64>>,
    max_attempts: Option<Spanned<u32>>,
    max_total_ms: Option<Spanned<u64>>,
    max_reconciliations: Option<Spanned<u32>>,
}

impl EngineSection {
    /// Where the key the engine policy names (`OutOfRange::field`) is written, if it is.
    fn span_of(&self, field: &str) -> Option<Range<usize>> {
        match field {
            "lease_ms" => span(&self.lease_ms),
            "backoff_base_ms" => span(&self.backoff_base_ms),
            "backoff_max_ms" => span(&self.backoff_max_ms),
            "max_attempts" => span(&self.max_attempts),
            "max_total_ms" => span(&self.max_total_ms),
            "max_reconciliations" => span(&self.max_reconciliations),
            _ => None,
        }
    }
}

/// What an engine range protects, said after the range in a configuration error.
fn why_engine_range(field: &str) -> &'static str {
    match field {
        "lease_ms" => {
            " ms (longer than any send may take, short enough that a crashed send is swept soon)"
        }
        "backoff_base_ms" | "backoff_max_ms" => {
            " ms (the longest pause must be at least the first)"
        }
        "max_total_ms" => " ms",
        _ => "",
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsSection {
    max_body_bytes: Option<Spanned<usize>>,
    max_sse_connections: Option<Spanned<usize>>,
    max_sse_connections_per_holder: Option<Spanned<usize>>,
    max_wait_ms: Option<Spanned<u64>>,
    default_wait_ms: Option<Spanned<u64>>,
    shutdown_grace_ms: Option<Spanned<u64>>,
    shutdown_drain_ms: Option<Spanned<u64>>,
    max_concurrent_executes: Option<Spanned<usize>>,
    header_read_timeout_ms: Option<Spanned<u64>>,
    idle_timeout_ms: Option<Spanned<u64>>,
    max_connections: Option<Spanned<usize>>,
    max_connections_per_address: Option<Spanned<usize>>,
}

impl LimitsSection {
    /// The limits the section asks for, each key it leaves out at its default.
    fn resolved(&self) -> Limits {
        let section = self;
        let defaults = Limits::default();
        Limits {
            max_body_bytes: spanned_or(&section.max_body_bytes, defaults.max_body_bytes),
            max_sse_connections: spanned_or(
                &section.max_sse_connections,
                defaults.max_sse_connections,
            ),
            max_sse_connections_per_holder: spanned_or(
                &section.max_sse_connections_per_holder,
                defaults.max_sse_connections_per_holder,
            ),
            max_wait_ms: spanned_or(&section.max_wait_ms, defaults.max_wait_ms),
            default_wait_ms: spanned_or(&section.default_wait_ms, defaults.default_wait_ms),
            shutdown_grace_ms: spanned_or(&section.shutdown_grace_ms, defaults.shutdown_grace_ms),
            shutdown_drain_ms: spanned_or(&section.shutdown_drain_ms, defaults.shutdown_drain_ms),
            max_concurrent_executes: spanned_or(
                &section.max_concurrent_executes,
                defaults.max_concurrent_executes,
            ),
            header_read_timeout_ms: spanned_or(
                &section.header_read_timeout_ms,
                defaults.header_read_timeout_ms,
            ),
            idle_timeout_ms: spanned_or(&section.idle_timeout_ms, defaults.idle_timeout_ms),
            max_connections: spanned_or(&section.max_connections, defaults.max_connections),
            max_connections_per_address: spanned_or(
                &section.max_connections_per_address,
                defaults.max_connections_per_address,
            ),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenHolder {
    id: Spanned<String>,
    token: Option<Spanned<String>>,
    token_env: Option<Spanned<String>>,
    /// `"all"` or `"declared"`: which argument values of an operation with a subject are sealed.
    personal_data: Option<Spanned<String>>,
    /// Days after which a subject whose operations all settled is erased automatically.
    retention_days: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Operator {
    id: Spanned<String>,
    token: Option<Spanned<String>>,
    token_env: Option<Spanned<String>>,
    tenants: Option<Vec<Spanned<String>>>,
}

/// One `[[connectors]]` entry: a connector document (a preset shipped in the binary, a file, or
/// inline) and what this installation adds to it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConnectorEntry {
    /// The provider id to register under (default: the document's `id`).
    id: Option<Spanned<String>>,
    /// A connector shipped in the binary, by name (`opledger connectors list --presets`).
    preset: Option<Spanned<String>>,
    /// A connector file, relative to this configuration file.
    file: Option<Spanned<String>>,
    /// A connector document written here, as a TOML multi-line string.
    inline: Option<Spanned<String>>,
    base_url: Option<Spanned<String>>,
    request_timeout_ms: Option<Spanned<u64>>,
    connect_timeout_ms: Option<Spanned<u64>>,
    #[serde(default)]
    settings: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    accounts: Vec<ConnectorAccount>,
}

/// One account this installation adds to a connector.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConnectorAccount {
    id: Spanned<String>,
    tenants: Option<Vec<Spanned<String>>>,
    token: Option<Spanned<String>>,
    token_env: Option<Spanned<String>>,
    username_env: Option<Spanned<String>>,
    password_env: Option<Spanned<String>>,
    client_id_env: Option<Spanned<String>>,
    client_secret_env: Option<Spanned<String>>,
    refresh_token_env: Option<Spanned<String>>,
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
        let metrics_closed = metrics_token.is_none() && !open && tenant_ids(&tokens).len() > 1;
        let token_dir = match &store {
            StoreUrl::Sqlite(path) => path.parent().map(Path::to_path_buf),
            _ => None,
        }
        .unwrap_or_else(|| self.relative("."));
        let fingerprint_key = self.fingerprint_key(&file.credential_fingerprint_key_env)?;
        let (providers, upstreams) = self.connectors(
            &file.connectors,
            &tenant_ids(&tokens),
            &token_dir,
            fingerprint_key.as_ref(),
        )?;
        let tenant_names = tenant_ids(&tokens).iter().map(|t| t.to_string()).collect();
        let webhooks = self.webhooks(&file.webhooks, &tenant_names)?;
        self.webhooks_fit_the_store(&file.webhooks, &store)?;
        let webhook_lease_ms = self.webhook_lease_ms(&file.webhook_lease_ms)?;
        let mcp_allowed_origins = self.mcp_allowed_origins(&file.mcp)?;
        let log = self.log(file.log.as_ref())?;
        let personal_data = self.personal_data(file.personal_data.as_ref(), &file.tenants)?;
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
            providers,
            upstreams,
            webhooks,
            webhook_lease_ms,
            mcp_allowed_origins,
            log,
            instance_id: file.instance_id.map(Spanned::into_inner),
            personal_data,
        })
    }

    /// `[mcp] allowed_origins`: each a browser origin, `scheme://host[:port]` with nothing after.
    fn mcp_allowed_origins(&self, section: &McpSection) -> Result<Vec<String>, ConfigError> {
        if section.allowed_origins.len() > MAX_ENTRIES {
            return Err(self.error(
                None,
                "mcp.allowed_origins",
                format!(
                    "lists {}; at most {MAX_ENTRIES} are allowed",
                    section.allowed_origins.len()
                ),
            ));
        }
        section
            .allowed_origins
            .iter()
            .enumerate()
            .map(|(index, origin)| {
                let text = origin.get_ref().trim().to_ascii_lowercase();
                let well_formed = ["http://", "https://"]
                    .iter()
                    .find_map(|scheme| text.strip_prefix(scheme))
                    .is_some_and(|host| {
                        !host.is_empty()
                            && host.bytes().all(|byte| {
                                byte.is_ascii_alphanumeric() || b"-.:[]".contains(&byte)
                            })
                    });
                if well_formed {
                    Ok(text)
                } else {
                    Err(self.error(
                        Some(origin.span()),
                        &format!("mcp.allowed_origins[{index}]"),
                        format!(
                            "`{}` is no browser origin; write the scheme, host and port only, e.g. \"https://agent.example.com\" or \"http://localhost:3000\"",
                            origin.get_ref()
                        ),
                    ))
                }
            })
            .collect()
    }

    /// The engine section. Its ranges are the domain's ([`EnginePolicy::validate`]), so a file can
    /// never hold a policy the engine would refuse at its first claim; only the workers' count,
    /// which the engine does not know, is checked here.
    fn engine(&self, section: &EngineSection) -> Result<(EnginePolicy, usize), ConfigError> {
        let defaults = EnginePolicy::default();
        let retry_defaults = RetryPolicy::default();
        let workers = spanned_or(&section.workers, DEFAULT_WORKERS);
        if !(1..=MAX_CONCURRENT_LIMIT).contains(&workers) {
            return Err(self.error(
                span(&section.workers),
                "engine.workers",
                format!("is {workers}; use 1 to {MAX_CONCURRENT_LIMIT} concurrent drives"),
            ));
        }
        let policy = EnginePolicy {
            lease_ms: spanned_or(&section.lease_ms, defaults.lease_ms),
            retry: RetryPolicy {
                max_attempts: spanned_or(&section.max_attempts, retry_defaults.max_attempts),
                max_total_ms: spanned_or(&section.max_total_ms, retry_defaults.max_total_ms),
                max_reconciliations: spanned_or(
                    &section.max_reconciliations,
                    retry_defaults.max_reconciliations,
                ),
            },
            backoff_base_ms: spanned_or(&section.backoff_base_ms, defaults.backoff_base_ms),
            backoff_max_ms: spanned_or(&section.backoff_max_ms, defaults.backoff_max_ms),
        };
        policy.validate().map_err(|refused| {
            self.error(
                section.span_of(refused.field),
                &format!("engine.{}", refused.field),
                format!(
                    "is {}; use {} to {}{}",
                    refused.value,
                    refused.min,
                    refused.max,
                    why_engine_range(refused.field)
                ),
            )
        })?;
        Ok((policy, workers))
    }

    /// The token `/metrics` asks for, if any: never one a tenant or an operator holds.
    fn metrics_token(
        &self,
        metrics: &MetricsSection,
        tokens: &BTreeMap<String, Principal>,
    ) -> Result<Option<String>, ConfigError> {
        let Some(owner) = metrics.token.as_ref().or(metrics.token_env.as_ref()) else {
            return Ok(None);
        };
        let token = self.token("metrics", owner, &metrics.token, &metrics.token_env)?;
        if tokens.contains_key(&token) {
            return Err(self.error(
                Some(owner.span()),
                "metrics",
                "has the same token as a tenant or operator; give the scraper its own".into(),
            ));
        }
        Ok(Some(token))
    }

    fn limits(&self, section: &LimitsSection) -> Result<Limits, ConfigError> {
        let limits = section.resolved();
        let usize_ranges = [
            (
                &section.max_concurrent_executes,
                "max_concurrent_executes",
                limits.max_concurrent_executes,
                1,
                MAX_EXECUTES_LIMIT,
            ),
            (
                &section.max_body_bytes,
                "max_body_bytes",
                limits.max_body_bytes,
                1024,
                MAX_BODY_LIMIT_BYTES,
            ),
            (
                &section.max_sse_connections,
                "max_sse_connections",
                limits.max_sse_connections,
                1,
                MAX_SSE_LIMIT,
            ),
            (
                &section.max_sse_connections_per_holder,
                "max_sse_connections_per_holder",
                limits.max_sse_connections_per_holder,
                1,
                MAX_SSE_LIMIT,
            ),
        ];
        for (given, name, value, min, max) in usize_ranges {
            self.limit_in_range(span(given), name, value as u64, min as u64, max as u64, "")?;
        }
        self.limit_in_range(
            span(&section.shutdown_grace_ms),
            "shutdown_grace_ms",
            limits.shutdown_grace_ms,
            1_000,
            MAX_WAIT_LIMIT_MS,
            " (longer than max_wait_ms lets every execute call answer)",
        )?;
        self.limit_in_range(
            span(&section.shutdown_drain_ms),
            "shutdown_drain_ms",
            limits.shutdown_drain_ms,
            0,
            MAX_WAIT_LIMIT_MS,
            " (a few times the readiness probe's period, e.g. 10000 on Kubernetes)",
        )?;
        self.limit_in_range(
            span(&section.max_wait_ms),
            "max_wait_ms",
            limits.max_wait_ms,
            0,
            MAX_WAIT_LIMIT_MS,
            "",
        )?;
        self.connection_limits(section, &limits)?;
        if limits.default_wait_ms > limits.max_wait_ms {
            return Err(self.error(
                span(&section.default_wait_ms),
                "limits.default_wait_ms",
                format!(
                    "is {}, above max_wait_ms {}; make it at most max_wait_ms",
                    limits.default_wait_ms, limits.max_wait_ms
                ),
            ));
        }
        Ok(limits)
    }

    /// The connection limits: each in its range, the per-address one within the global one, and
    /// the idle timeout no shorter than the header read timeout (hyper measures an idle
    /// connection's wait and its next request's headers as one span, see `connections.rs`).
    fn connection_limits(
        &self,
        section: &LimitsSection,
        limits: &Limits,
    ) -> Result<(), ConfigError> {
        self.limit_in_range(
            span(&section.max_connections),
            "max_connections",
            limits.max_connections as u64,
            1,
            MAX_CONNECTIONS_LIMIT as u64,
            " (each open connection holds a file descriptor)",
        )?;
        self.limit_in_range(
            span(&section.max_connections_per_address),
            "max_connections_per_address",
            limits.max_connections_per_address as u64,
            1,
            limits.max_connections as u64,
            " (at most max_connections; behind a proxy every client has its address, so make it max_connections there)",
        )?;
        self.limit_in_range(
            span(&section.header_read_timeout_ms),
            "header_read_timeout_ms",
            limits.header_read_timeout_ms,
            MIN_HEADER_READ_TIMEOUT_MS,
            MAX_IDLE_TIMEOUT_MS,
            "",
        )?;
        self.limit_in_range(
            span(&section.idle_timeout_ms),
            "idle_timeout_ms",
            limits.idle_timeout_ms,
            limits.header_read_timeout_ms,
            MAX_IDLE_TIMEOUT_MS,
            " (no shorter than header_read_timeout_ms)",
        )
    }

    /// `limits.<name>` must lie in `min..=max`; `why` is said after the range.
    fn limit_in_range(
        &self,
        at: Option<Range<usize>>,
        name: &str,
        value: u64,
        min: u64,
        max: u64,
        why: &str,
    ) -> Result<(), ConfigError> {
        if (min..=max).contains(&value) {
            return Ok(());
        }
        Err(self.error(
            at,
            &format!("limits.{name}"),
            format!("is {value}; use {min} to {max}{why}"),
        ))
    }

    fn tokens(&self, file: &File) -> Result<BTreeMap<String, Principal>, ConfigError> {
        let mut tokens = BTreeMap::new();
        let mut tenants = BTreeSet::new();
        for (index, holder) in file.tenants.iter().enumerate() {
            let field = format!("tenants[{index}]");
            let tenant = TenantId::new(holder.id.get_ref().clone()).map_err(|error| {
                self.error(
                    Some(holder.id.span()),
                    &format!("{field}.id"),
                    error.message,
                )
            })?;
            if !tenants.insert(tenant.clone()) {
                return Err(self.error(
                    Some(holder.id.span()),
                    &format!("{field}.id"),
                    format!("tenant `{tenant}` is listed twice; list each tenant once"),
                ));
            }
            let token = self.token(&field, &holder.id, &holder.token, &holder.token_env)?;
            self.insert_token(&mut tokens, token, Principal::Tenant(tenant), &holder.id)?;
        }
        for (index, operator) in file.operators.iter().enumerate() {
            let (name, scope, token) = self.person("operators", index, operator, &tenants)?;
            let principal = Principal::Operator {
                name,
                tenants: scope,
            };
            self.insert_token(&mut tokens, token, principal, &operator.id)?;
        }
        for (index, approver) in file.approvers.iter().enumerate() {
            let (name, scope, token) = self.person("approvers", index, approver, &tenants)?;
            let principal = Principal::Approver {
                name,
                tenants: scope,
            };
            self.insert_token(&mut tokens, token, principal, &approver.id)?;
        }
        Ok(tokens)
    }

    /// An operator's or approver's name (recorded as the reviewer or approver), tenant scope
    /// (`None`: every tenant) and token.
    fn person(
        &self,
        section: &str,
        index: usize,
        person: &Operator,
        tenants: &BTreeSet<TenantId>,
    ) -> Result<(String, Option<BTreeSet<TenantId>>, String), ConfigError> {
        let field = format!("{section}[{index}]");
        let name = person.id.get_ref().trim().to_owned();
        if name.is_empty() || name.len() > 128 {
            return Err(self.error(
                Some(person.id.span()),
                &format!("{field}.id"),
                "must be 1 to 128 characters; it is recorded with every decision".into(),
            ));
        }
        let scope = match &person.tenants {
            None => None,
            Some(list) => {
                let mut scope = BTreeSet::new();
                for (position, tenant) in list.iter().enumerate() {
                    let id = TenantId::new(tenant.get_ref().clone()).map_err(|error| {
                        self.error(
                            Some(tenant.span()),
                            &format!("{field}.tenants[{position}]"),
                            error.message,
                        )
                    })?;
                    if !tenants.contains(&id) {
                        return Err(self.error(
                            Some(tenant.span()),
                            &format!("{field}.tenants[{position}]"),
                            format!("names tenant `{id}`, which is not under [[tenants]]; add it there or remove it here"),
                        ));
                    }
                    scope.insert(id);
                }
                Some(scope)
            }
        };
        let token = self.token(&field, &person.id, &person.token, &person.token_env)?;
        Ok((name, scope, token))
    }

    fn insert_token(
        &self,
        tokens: &mut BTreeMap<String, Principal>,
        token: String,
        principal: Principal,
        at: &Spanned<String>,
    ) -> Result<(), ConfigError> {
        if tokens.insert(token, principal).is_some() {
            return Err(self.error(
                Some(at.span()),
                "token",
                format!(
                    "`{}` has the same token as another tenant or operator; every token must be unique",
                    at.get_ref()
                ),
            ));
        }
        Ok(())
    }

    /// The token given inline or through an environment variable (exactly one of the two).
    fn token(
        &self,
        field: &str,
        owner: &Spanned<String>,
        inline: &Option<Spanned<String>>,
        env: &Option<Spanned<String>>,
    ) -> Result<String, ConfigError> {
        let (token, at, name) = match (inline, env) {
            (Some(token), None) => (token.get_ref().clone(), token.span(), "token"),
            (None, Some(variable)) => {
                let value = (self.env)(variable.get_ref()).ok_or_else(|| {
                    self.error(
                        Some(variable.span()),
                        &format!("{field}.token_env"),
                        format!(
                            "environment variable `{}` is not set; export it before starting the server",
                            variable.get_ref()
                        ),
                    )
                })?;
                (value, variable.span(), "token_env")
            }
            (Some(token), Some(_)) => {
                return Err(self.error(
                    Some(token.span()),
                    &format!("{field}.token"),
                    "is given together with token_env; keep one (token_env keeps the secret out of the file)".into(),
                ))
            }
            (None, None) => {
                return Err(self.error(
                    Some(owner.span()),
                    field,
                    "has no token; add token_env = \"VARIABLE\" (or token = \"…\" for local use)"
                        .into(),
                ))
            }
        };
        let token = token.trim().to_owned();
        // Kept out of every log line and answer (`opledger_domain::redact`).
        opledger_domain::redact::register(&token);
        if token.chars().count() < MIN_TOKEN_CHARS || token.chars().any(char::is_whitespace) {
            return Err(self.error(
                Some(at),
                &format!("{field}.{name}"),
                format!("the token must be at least {MIN_TOKEN_CHARS} characters without spaces; generate one, e.g. with `openssl rand -hex 24`"),
            ));
        }
        Ok(token)
    }

    /// Every `[[connectors]]` entry, built; `tenants` are the configured tenants, which every
    /// account's owners must be among.
    fn connectors(
        &self,
        entries: &[ConnectorEntry],
        tenants: &BTreeSet<TenantId>,
        token_dir: &Path,
        fingerprint_key: Option<&opledger_providers::credentials::FingerprintKey>,
    ) -> Result<(Vec<Connector>, Vec<McpConnector>), ConfigError> {
        let mut seen = BTreeSet::new();
        let mut built = Vec::with_capacity(entries.len());
        let mut upstreams = Vec::new();
        for (index, entry) in entries.iter().enumerate() {
            let field = format!("connectors[{index}]");
            let id = match self.connector(&field, entry, tenants, token_dir, fingerprint_key)? {
                Built::Rest(connector) => {
                    let id = connector.id().clone();
                    built.push(connector);
                    id
                }
                Built::Mcp(upstream) => {
                    let id = upstream.id().clone();
                    upstreams.push(upstream);
                    id
                }
            };
            if !seen.insert(id.clone()) {
                return Err(self.error(
                    entry.id.as_ref().map(Spanned::span),
                    &format!("{field}.id"),
                    format!(
                        "provider `{id}` is configured twice; give one of them another id = \"…\""
                    ),
                ));
            }
        }
        Ok((built, upstreams))
    }

    /// One connector: its document, then what this file adds, built with the environment.
    fn connector(
        &self,
        field: &str,
        entry: &ConnectorEntry,
        tenants: &BTreeSet<TenantId>,
        token_dir: &Path,
        fingerprint_key: Option<&opledger_providers::credentials::FingerprintKey>,
    ) -> Result<Built, ConfigError> {
        let document = match self.document(field, entry)? {
            AnyDocument::Rest(document) => *document,
            AnyDocument::Mcp(document) => {
                return self
                    .upstream(field, entry, &document, tenants)
                    .map(Built::Mcp)
            }
        };
        let mut overrides = self.overrides(field, entry, tenants)?;
        overrides.fingerprint_key = fingerprint_key.cloned();
        // Rotated OAuth2 refresh tokens are kept beside the ledger, one file per connector, so
        // a restart finds the token the provider last issued (never in the ledger's events).
        let provider = overrides.id.clone().unwrap_or_else(|| document.id.clone());
        overrides.token_file = Some(token_dir.join(format!("opledger-oauth-{provider}.json")));
        let env = |name: &str| (self.env)(name).map(std::ffi::OsString::from);
        Connector::with_env(&document, overrides, &env)
            .map(Built::Rest)
            .map_err(|errors| self.connector_errors(field, &errors))
    }

    /// An upstream MCP server: what an entry may add to its document is an id and accounts
    /// (owners only: the upstream has one identity, reached as its document says).
    fn upstream(
        &self,
        field: &str,
        entry: &ConnectorEntry,
        document: &McpDocument,
        tenants: &BTreeSet<TenantId>,
    ) -> Result<McpConnector, ConfigError> {
        let rest_only = [
            (entry.base_url.as_ref().map(Spanned::span), "base_url"),
            (
                entry.request_timeout_ms.as_ref().map(Spanned::span),
                "request_timeout_ms",
            ),
            (
                entry.connect_timeout_ms.as_ref().map(Spanned::span),
                "connect_timeout_ms",
            ),
            (
                entry.settings.values().next().map(Spanned::span),
                "settings",
            ),
        ];
        if let Some((at, key)) = rest_only.into_iter().find(|(at, _)| at.is_some()) {
            return Err(self.error(at, &format!("{field}.{key}"), format!("is for a REST connector; `{}` is an MCP upstream, whose document says how it is reached (its [upstream] and timeouts)", document.id)));
        }
        let id = match &entry.id {
            Some(id) => Some(ProviderId::new(id.get_ref().clone()).map_err(|error| {
                self.error(Some(id.span()), &format!("{field}.id"), error.message)
            })?),
            None => None,
        };
        let mut accounts = Vec::with_capacity(entry.accounts.len());
        for (position, account) in entry.accounts.iter().enumerate() {
            let account_field = format!("{field}.accounts[{position}]");
            let credentials = [
                &account.token,
                &account.token_env,
                &account.username_env,
                &account.password_env,
                &account.client_id_env,
                &account.client_secret_env,
                &account.refresh_token_env,
            ];
            if let Some(given) = credentials.into_iter().flatten().next() {
                return Err(self.error(Some(given.span()), &account_field, "an MCP upstream's account carries no credentials (the upstream has one identity: its document's env_from or headers_from); give id and tenants only".to_owned()));
            }
            let (id, owners) = self.account_owners(&account_field, account, tenants)?;
            accounts.push(McpAccount {
                id,
                tenants: owners,
            });
        }
        let env = |name: &str| (self.env)(name).map(std::ffi::OsString::from);
        McpConnector::build(document, id, &accounts, &env)
            .map_err(|errors| self.connector_errors(field, &errors))
    }

    /// The connector document an entry names: exactly one of `preset`, `file` and `inline`.
    fn document(&self, field: &str, entry: &ConnectorEntry) -> Result<AnyDocument, ConfigError> {
        let given = [&entry.preset, &entry.file, &entry.inline];
        let count = given.iter().filter(|source| source.is_some()).count();
        if count != 1 {
            let at = given
                .iter()
                .find_map(|source| source.as_ref().map(Spanned::span));
            return Err(self.error(
                at,
                field,
                format!("names {count} connector documents; give exactly one of preset = \"NAME\" (`opledger connectors list --presets` lists them), file = \"PATH\" or inline = '''…'''"),
            ));
        }
        let parsed = if let Some(preset) = &entry.preset {
            let (name, text) = presets::preset(preset.get_ref()).ok_or_else(|| {
                let known: Vec<&str> = presets::preset_names().collect();
                self.error(
                    Some(preset.span()),
                    &format!("{field}.preset"),
                    format!(
                        "`{}` is not a preset; the presets are {}",
                        preset.get_ref(),
                        known.join(", ")
                    ),
                )
            })?;
            parse_any(name, text)
        } else if let Some(file) = &entry.file {
            let path = self.relative(file.get_ref());
            let text = read_connector_file(&path).map_err(|message| {
                self.error(Some(file.span()), &format!("{field}.file"), message)
            })?;
            parse_any(&path.display().to_string(), &text)
        } else {
            let inline = entry.inline.as_ref().expect("exactly one source is given");
            self.inline_document(field, inline)
        };
        parsed.map_err(|errors| self.connector_errors(field, &errors))
    }

    /// A connector document written inside this file: its errors point at this file's lines.
    fn inline_document(
        &self,
        field: &str,
        inline: &Spanned<String>,
    ) -> Result<AnyDocument, Vec<ConnectorError>> {
        // The string's first line is the line its opening quotes are on; TOML drops a newline
        // right after them, so the document's line 1 is the next one.
        let opening_line = line_of(self.text, inline.span().start);
        let skipped = usize::from(
            self.text
                .get(inline.span().start..)
                .is_some_and(|rest| rest.starts_with("'''\n") || rest.starts_with("\"\"\"\n")),
        );
        parse_any(self.file, inline.get_ref()).map_err(|errors| {
            errors
                .into_iter()
                .map(|mut error| {
                    error.line = error.line.map(|line| line + opening_line + skipped - 1);
                    error.field = format!("{field}.inline.{}", error.field);
                    error
                })
                .collect()
        })
    }

    /// What an entry adds to its document: id, base URL, timeouts, settings and accounts.
    fn overrides(
        &self,
        field: &str,
        entry: &ConnectorEntry,
        tenants: &BTreeSet<TenantId>,
    ) -> Result<Overrides, ConfigError> {
        let id = match &entry.id {
            Some(id) => Some(ProviderId::new(id.get_ref().clone()).map_err(|error| {
                self.error(Some(id.span()), &format!("{field}.id"), error.message)
            })?),
            None => None,
        };
        let mut accounts = Vec::with_capacity(entry.accounts.len());
        for (position, account) in entry.accounts.iter().enumerate() {
            let account_field = format!("{field}.accounts[{position}]");
            accounts.push(self.account(&account_field, account, tenants)?);
        }
        Ok(Overrides {
            id,
            base_url: entry.base_url.as_ref().map(|url| url.get_ref().clone()),
            settings: entry
                .settings
                .iter()
                .map(|(name, value)| (name.clone(), value.get_ref().clone()))
                .collect(),
            accounts,
            request_timeout_ms: entry.request_timeout_ms.as_ref().map(|ms| *ms.get_ref()),
            connect_timeout_ms: entry.connect_timeout_ms.as_ref().map(|ms| *ms.get_ref()),
            token_file: None,
            fingerprint_key: None,
        })
    }

    /// The key credential fingerprints are keyed with, from the variable
    /// `credential_fingerprint_key_env` names (`None` when it is not set: the unkeyed form).
    fn fingerprint_key(
        &self,
        variable: &Option<Spanned<String>>,
    ) -> Result<Option<opledger_providers::credentials::FingerprintKey>, ConfigError> {
        let Some(variable) = variable else {
            return Ok(None);
        };
        let at = |message: String| {
            self.error(
                Some(variable.span()),
                "credential_fingerprint_key_env",
                message,
            )
        };
        let value = (self.env)(variable.get_ref()).ok_or_else(|| {
            at(format!(
                "environment variable `{}` is not set; export a key of at least {} bytes (e.g. `openssl rand -hex 32`) before starting the server",
                variable.get_ref(),
                opledger_providers::credentials::MIN_FINGERPRINT_KEY_BYTES
            ))
        })?;
        opledger_domain::redact::register(value.trim());
        opledger_providers::credentials::FingerprintKey::new(value.trim().as_bytes().to_vec())
            .map(Some)
            .map_err(|message| at(format!("`{}`: {message}", variable.get_ref())))
    }

    /// One account an entry adds, with its owners (configured tenants) and its credentials
    /// (read from the environment here, so a missing variable is named at its line).
    fn account(
        &self,
        field: &str,
        account: &ConnectorAccount,
        tenants: &BTreeSet<TenantId>,
    ) -> Result<AccountSpec, ConfigError> {
        let (id, owned_by) = self.account_owners(field, account, tenants)?;
        Ok(AccountSpec {
            id,
            tenants: owned_by,
            credentials: self.credentials(field, account)?,
        })
    }

    /// An account's id and owners (each a configured tenant).
    fn account_owners(
        &self,
        field: &str,
        account: &ConnectorAccount,
        tenants: &BTreeSet<TenantId>,
    ) -> Result<(AccountId, Vec<TenantId>), ConfigError> {
        let id = AccountId::new(account.id.get_ref().clone()).map_err(|error| {
            self.error(
                Some(account.id.span()),
                &format!("{field}.id"),
                error.message,
            )
        })?;
        let owners = account.tenants.as_deref().unwrap_or_default();
        if owners.is_empty() {
            return Err(self.error(
                Some(account.id.span()),
                &format!("{field}.tenants"),
                format!("account `{id}` names no tenant; add tenants = [\"…\"] with the tenants whose operations may use it"),
            ));
        }
        let mut owned_by = Vec::with_capacity(owners.len());
        for (position, tenant) in owners.iter().enumerate() {
            let at = format!("{field}.tenants[{position}]");
            let tenant_id = TenantId::new(tenant.get_ref().clone())
                .map_err(|error| self.error(Some(tenant.span()), &at, error.message))?;
            if !tenants.contains(&tenant_id) {
                return Err(self.error(
                    Some(tenant.span()),
                    &at,
                    format!("names tenant `{tenant_id}`, which is not under [[tenants]]; add it there or remove it here"),
                ));
            }
            owned_by.push(tenant_id);
        }
        Ok((id, owned_by))
    }

    /// An account's credentials: `token_env` (or `token` for local use), or `username_env` and
    /// `password_env` for basic authentication.
    fn credentials(
        &self,
        field: &str,
        account: &ConnectorAccount,
    ) -> Result<Credentials, ConfigError> {
        let secret = |variable: &Spanned<String>, name: &str| {
            (self.env)(variable.get_ref())
                .filter(|value| !value.trim().is_empty())
                .map(|value| SecretSource::Direct(Secret::new(value.trim())))
                .ok_or_else(|| {
                    self.error(
                        Some(variable.span()),
                        &format!("{field}.{name}"),
                        format!("environment variable `{}` is not set or empty; export the account's credential there", variable.get_ref()),
                    )
                })
        };
        if let Some(client_id) = &account.client_id_env {
            let others = [
                &account.token,
                &account.token_env,
                &account.username_env,
                &account.password_env,
            ];
            let Some(client_secret) = &account.client_secret_env else {
                return Err(self.error(
                    Some(client_id.span()),
                    &format!("{field}.client_secret_env"),
                    "an OAuth2 client needs its secret too; add client_secret_env = \"VARIABLE\""
                        .into(),
                ));
            };
            if others.iter().any(|other| other.is_some()) {
                return Err(self.error(
                    Some(account.id.span()),
                    field,
                    "gives an OAuth2 client and a token or a username and password; keep client_id_env, client_secret_env (and refresh_token_env) for an oauth2 connector".into(),
                ));
            }
            return Ok(Credentials::OAuth2 {
                client_id: secret(client_id, "client_id_env")?,
                client_secret: secret(client_secret, "client_secret_env")?,
                refresh_token: account
                    .refresh_token_env
                    .as_ref()
                    .map(|variable| secret(variable, "refresh_token_env"))
                    .transpose()?,
            });
        }
        if let Some(stray) = account
            .client_secret_env
            .as_ref()
            .or(account.refresh_token_env.as_ref())
        {
            return Err(self.error(
                Some(stray.span()),
                field,
                "gives an OAuth2 secret without client_id_env; an oauth2 account gives client_id_env, client_secret_env and, for the refresh_token grant, refresh_token_env".into(),
            ));
        }
        match (
            &account.token,
            &account.token_env,
            &account.username_env,
            &account.password_env,
        ) {
            (Some(token), None, None, None) if !token.get_ref().trim().is_empty() => Ok(
                Credentials::Token(SecretSource::Direct(Secret::new(token.get_ref().trim()))),
            ),
            (None, Some(variable), None, None) => {
                Ok(Credentials::Token(secret(variable, "token_env")?))
            }
            (None, None, Some(username), Some(password)) => Ok(Credentials::Basic {
                username: secret(username, "username_env")?,
                password: secret(password, "password_env")?,
            }),
            _ => Err(self.error(
                Some(account.id.span()),
                field,
                "needs exactly one of token_env = \"VARIABLE\", token = \"…\" (local use), username_env and password_env (basic authentication), or client_id_env, client_secret_env and refresh_token_env (oauth2)".into(),
            )),
        }
    }

    /// Every problem of a connector document or its build, as one error: the first names its
    /// place, and the message lists them all, each with its file, line and field.
    fn connector_errors(&self, field: &str, errors: &[ConnectorError]) -> ConfigError {
        let Some(first) = errors.first() else {
            return self.error(None, field, "could not be built".into());
        };
        // Problems of the build (overrides, the environment) have no line in the document:
        // they come from this entry.
        let (file, line, at) = if first.line.is_none() && first.file != self.file {
            (
                self.file.to_owned(),
                None,
                format!("{field}.{}", first.field),
            )
        } else {
            (first.file.clone(), first.line, first.field.clone())
        };
        let message = if errors.len() == 1 {
            first.message.clone()
        } else {
            format!(
                "{} (and {} more problem(s) in {field}):\n{}",
                first.message,
                errors.len() - 1,
                opledger_providers::render_all(errors)
            )
        };
        ConfigError {
            file,
            line,
            field: at,
            message,
        }
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

/// Most bytes of one connector file.
pub const MAX_CONNECTOR_FILE_BYTES: u64 = 1024 * 1024;

/// Reads a connector file, bounded by [`MAX_CONNECTOR_FILE_BYTES`].
pub fn read_connector_file(path: &Path) -> Result<String, String> {
    let size = std::fs::metadata(path)
        .map_err(|error| format!("`{}` cannot be read ({error}); write the path of a connector TOML file, relative to this configuration", path.display()))?
        .len();
    if size > MAX_CONNECTOR_FILE_BYTES {
        return Err(format!(
            "`{}` is {size} bytes; a connector file is at most {MAX_CONNECTOR_FILE_BYTES} bytes",
            path.display()
        ));
    }
    std::fs::read_to_string(path).map_err(|error| {
        format!(
            "`{}` cannot be read as UTF-8 text ({error})",
            path.display()
        )
    })
}

/// The tenants the tokens name.
fn tenant_ids(tokens: &BTreeMap<String, Principal>) -> BTreeSet<TenantId> {
    tokens
        .values()
        .filter_map(|principal| match principal {
            Principal::Tenant(tenant) => Some(tenant.clone()),
            _ => None,
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef0123";

    fn env(name: &str) -> Option<String> {
        match name {
            "ACME_TOKEN" => Some(TOKEN.into()),
            "OPS_TOKEN" => Some("ops-0123456789abcdef".into()),
            "CRM_TOKEN" => Some("crm-secret".into()),
            _ => None,
        }
    }

    fn check(text: &str) -> Result<ServeConfig, ConfigError> {
        parse("serve.toml", text, &env)
    }

    const GOOD: &str = r#"
listen = "127.0.0.1:9090"
store = "sqlite:///tmp/ledger.db"

[engine]
lease_ms = 20000
workers = 8

[[tenants]]
id = "acme"
token_env = "ACME_TOKEN"

[[operators]]
id = "oncall"
token_env = "OPS_TOKEN"
tenants = ["acme"]

[[connectors]]
id = "crm"
preset = "crm-stand-keyed"
base_url = "http://127.0.0.1:8787"

[[connectors.accounts]]
id = "acct-1"
tenants = ["acme"]
token_env = "CRM_TOKEN"
"#;

    #[test]
    fn connection_limits_out_of_range_are_refused_at_their_line_with_what_to_do() {
        let cases = [
            ("max_connections = 0", "limits.max_connections", "use 1 to"),
            (
                "max_connections = 10\nmax_connections_per_address = 20",
                "limits.max_connections_per_address",
                "use 1 to 10 (at most max_connections",
            ),
            (
                "max_connections_per_address = 5000",
                "limits.max_connections_per_address",
                "use 1 to 4096",
            ),
            (
                "header_read_timeout_ms = 50",
                "limits.header_read_timeout_ms",
                "use 100 to",
            ),
            (
                "header_read_timeout_ms = 1000\nidle_timeout_ms = 500",
                "limits.idle_timeout_ms",
                "use 1000 to 3600000 (no shorter than header_read_timeout_ms)",
            ),
        ];
        for (section, field, says) in cases {
            let text = format!("{GOOD}\n[limits]\n{section}\n");
            let error = check(&text).expect_err(section);
            let wrong_line = section.lines().last().expect("a line");
            let line = text
                .lines()
                .position(|l| l == wrong_line)
                .expect("in the text")
                + 1;
            assert_eq!(error.field, field, "{section}: {error}");
            assert_eq!(error.line, Some(line), "{section}: {error}");
            assert!(error.message.contains(says), "{section}: {error}");
        }
        let text = format!(
            "{GOOD}\n[limits]\nheader_read_timeout_ms = 300\nidle_timeout_ms = 1000\nmax_connections = 20\nmax_connections_per_address = 5\n"
        );
        let limits = check(&text).expect("valid").limits;
        assert_eq!(
            (
                limits.header_read_timeout_ms,
                limits.idle_timeout_ms,
                limits.max_connections,
                limits.max_connections_per_address
            ),
            (300, 1_000, 20, 5)
        );
    }

    #[test]
    fn a_complete_file_is_read_with_its_tokens_and_providers() {
        let config = check(GOOD).expect("valid");
        assert_eq!(config.listen.port(), 9090);
        assert_eq!(
            config.store,
            StoreUrl::Sqlite(PathBuf::from("/tmp/ledger.db"))
        );
        assert_eq!(config.policy.lease_ms, 20_000);
        assert_eq!(config.workers, 8);
        assert_eq!(
            config.tokens.get(TOKEN),
            Some(&Principal::Tenant(TenantId::new("acme").expect("id")))
        );
        assert!(matches!(
            config.tokens.get("ops-0123456789abcdef"),
            Some(Principal::Operator { tenants: Some(t), .. }) if t.len() == 1
        ));
        assert_eq!(config.providers.len(), 1);
    }

    #[test]
    fn errors_name_the_field_and_the_line() {
        let cases: [(&str, &str, &str, usize); 8] = [
            ("workers = 8", "workers = 0", "engine.workers", 7),
            (
                "token_env = \"ACME_TOKEN\"",
                "token_env = \"MISSING\"",
                "tenants[0].token_env",
                11,
            ),
            (
                "preset = \"crm-stand-keyed\"",
                "preset = \"soap\"",
                "connectors[0].preset",
                20,
            ),
            (
                "tenants = [\"acme\"]\ntoken_env = \"CRM_TOKEN\"",
                "tenants = [\"globex\"]\ntoken_env = \"CRM_TOKEN\"",
                "connectors[0].accounts[0].tenants[0]",
                25,
            ),
            (
                "token_env = \"CRM_TOKEN\"",
                "token_env = \"NO_SUCH_VARIABLE\"",
                "connectors[0].accounts[0].token_env",
                26,
            ),
            (
                "tenants = [\"acme\"]",
                "tenants = [\"other\"]",
                "operators[0].tenants[0]",
                16,
            ),
            (
                "listen = \"127.0.0.1:9090\"",
                "listen = \"localhost\"",
                "listen",
                2,
            ),
            (
                "store = \"sqlite:///tmp/ledger.db\"",
                "store = \"postgres://x\"",
                "store",
                3,
            ),
        ];
        for (from, to, field, line) in cases {
            let text = GOOD.replace(from, to);
            let error = check(&text).expect_err(to);
            assert_eq!(error.field, field, "{to}: {error}");
            assert_eq!(error.line, Some(line), "{to}: {error}");
            assert!(error
                .to_string()
                .starts_with(&format!("serve.toml:{line}: ")));
        }
    }

    #[test]
    fn every_engine_value_the_engine_would_refuse_is_refused_at_start_with_its_line() {
        use opledger_domain::command::{MAX_LEASE_MS, MIN_LEASE_MS};
        use opledger_domain::contract::{
            MAX_ATTEMPTS_LIMIT, MAX_RECONCILIATIONS_LIMIT, MAX_TOTAL_MS,
        };
        use opledger_domain::engine::MAX_BACKOFF_MS;
        // The default lease line is taken out, so `workers = 8` is line 6 and each key line 8.
        let cases = [
            ("lease_ms", "lease_ms = 900000".to_owned()),
            ("lease_ms", format!("lease_ms = {}", MAX_LEASE_MS + 1)),
            ("lease_ms", format!("lease_ms = {}", MIN_LEASE_MS - 1)),
            ("max_attempts", "max_attempts = 0".to_owned()),
            (
                "max_attempts",
                format!("max_attempts = {}", MAX_ATTEMPTS_LIMIT + 1),
            ),
            ("max_total_ms", "max_total_ms = 0".to_owned()),
            (
                "max_total_ms",
                format!("max_total_ms = {}", MAX_TOTAL_MS + 1),
            ),
            ("max_reconciliations", "max_reconciliations = 0".to_owned()),
            (
                "max_reconciliations",
                format!("max_reconciliations = {}", MAX_RECONCILIATIONS_LIMIT + 1),
            ),
            ("backoff_base_ms", "backoff_base_ms = 0".to_owned()),
            (
                "backoff_max_ms",
                format!("backoff_max_ms = {}", MAX_BACKOFF_MS + 1),
            ),
        ];
        for (field, line) in cases {
            let text = GOOD
                .replace("lease_ms = 20000\n", "")
                .replace("workers = 8", &format!("workers = 8\n\n{line}"));
            let error = check(&text).expect_err(&line);
            assert_eq!(error.field, format!("engine.{field}"), "{line}: {error}");
            assert_eq!(error.line, Some(8), "{line}: {error}");
            assert!(error.to_string().starts_with("serve.toml:8: "), "{error}");
        }
        // The largest lease the engine takes is taken: the file and the engine agree on the edge.
        let text = GOOD.replace("lease_ms = 20000", &format!("lease_ms = {MAX_LEASE_MS}"));
        assert_eq!(check(&text).expect("valid").policy.lease_ms, MAX_LEASE_MS);
    }

    #[test]
    fn a_connector_account_without_tenants_or_credentials_is_refused_at_its_line() {
        let no_tenants = GOOD.replace("tenants = [\"acme\"]\ntoken_env", "token_env");
        let error = check(&no_tenants).expect_err("no tenants");
        assert_eq!(error.field, "connectors[0].accounts[0].tenants");
        assert_eq!(error.line, Some(24), "{error}");
        let no_credentials = GOOD.replace("token_env = \"CRM_TOKEN\"\n", "");
        let error = check(&no_credentials).expect_err("no credentials");
        assert_eq!(error.field, "connectors[0].accounts[0]");
        assert!(error.message.contains("token_env"), "{error}");
    }

    #[test]
    fn an_oauth2_account_names_its_client_and_a_bad_one_is_refused_at_its_line() {
        let oauth = GOOD
            .replace("preset = \"crm-stand-keyed\"", "preset = \"salesforce-oauth2\"")
            .replace(
                "token_env = \"CRM_TOKEN\"",
                "client_id_env = \"CRM_TOKEN\"\nclient_secret_env = \"CRM_TOKEN\"\nrefresh_token_env = \"CRM_TOKEN\"",
            );
        let config = check(&oauth).expect("valid");
        let (_, _, fingerprint) = config.providers[0]
            .account_owners()
            .next()
            .expect("an account");
        assert!(fingerprint.as_str().starts_with("sha256:"));
        let no_secret = oauth.replace("client_secret_env = \"CRM_TOKEN\"\n", "");
        let error = check(&no_secret).expect_err("no secret");
        assert_eq!(error.field, "connectors[0].accounts[0].client_secret_env");
        assert_eq!(error.line, Some(26), "{error}");
        let mixed = oauth.replace("client_id_env", "token_env = \"CRM_TOKEN\"\nclient_id_env");
        let error = check(&mixed).expect_err("a token beside the client");
        assert!(
            error.message.contains("OAuth2 client and a token"),
            "{error}"
        );
        // A static connector refuses an OAuth2 client, naming what its auth takes.
        let static_auth = oauth.replace("salesforce-oauth2", "salesforce");
        let error = check(&static_auth).expect_err("bearer auth");
        assert!(error.message.contains("bearer auth"), "{error}");
    }

    #[test]
    fn a_connector_names_exactly_one_document() {
        let two = GOOD.replace(
            "preset = \"crm-stand-keyed\"",
            "preset = \"crm-stand-keyed\"\nfile = \"crm.toml\"",
        );
        let error = check(&two).expect_err("two documents");
        assert_eq!(error.field, "connectors[0]");
        assert!(error.message.contains("exactly one"), "{error}");
        let missing_file = GOOD.replace(
            "preset = \"crm-stand-keyed\"",
            "file = \"no-such-connector.toml\"",
        );
        let error = check(&missing_file).expect_err("no file");
        assert_eq!(error.field, "connectors[0].file");
        assert_eq!(error.line, Some(20));
    }

    #[test]
    fn an_inline_connector_is_read_and_its_errors_point_at_this_files_lines() {
        let inline = GOOD.replace(
            "preset = \"crm-stand-keyed\"",
            &format!(
                "inline = '''\n{}'''",
                opledger_providers::presets::preset("crm-stand-labelled")
                    .expect("a preset")
                    .1
            ),
        );
        let config = check(&inline).expect("an inline connector is valid");
        assert_eq!(config.providers.len(), 1);
        assert_eq!(config.providers[0].id().as_str(), "crm");
        // The same document with an unknown method, on a known line of this file.
        let broken = inline.replacen("method = \"PUT\"", "method = \"BREW\"", 1);
        let wanted = broken
            .lines()
            .position(|line| line.contains("\"BREW\""))
            .expect("the line")
            + 1;
        let error = check(&broken).expect_err("a bad method");
        assert_eq!(error.file, "serve.toml");
        assert_eq!(error.line, Some(wanted), "{error}");
        assert!(error.field.starts_with("connectors[0].inline."), "{error}");
    }

    #[test]
    fn a_connector_file_is_read_relative_to_the_configuration_and_its_errors_name_it() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let connector = dir.path().join("crm.toml");
        let text = opledger_providers::presets::preset("crm-stand-plain")
            .expect("a preset")
            .1
            .replace("lag_ms = 2000", "lag_ms = -1");
        std::fs::write(&connector, &text).expect("written");
        let config_path = dir.path().join("serve.toml");
        let serve = GOOD.replace("preset = \"crm-stand-keyed\"", "file = \"crm.toml\"");
        let error = parse(&config_path.display().to_string(), &serve, &env).expect_err("lag");
        assert_eq!(error.file, connector.display().to_string(), "{error}");
        let wanted = text
            .lines()
            .position(|line| line.contains("lag_ms = -1"))
            .expect("the line")
            + 1;
        assert_eq!(error.line, Some(wanted), "{error}");
        assert!(error.field.contains("lag_ms"), "{error}");
    }

    #[test]
    fn unknown_fields_and_bad_types_are_syntax_errors_with_a_line() {
        let error = check(&GOOD.replace("workers = 8", "workerz = 8")).expect_err("unknown");
        assert_eq!(error.line, Some(7));
        assert!(error.message.contains("workerz"), "{error}");
        let error = check(&GOOD.replace("workers = 8", "workers = \"eight\"")).expect_err("type");
        assert_eq!(error.line, Some(7), "{error}");
    }

    #[test]
    fn short_or_shared_tokens_are_refused() {
        let short = GOOD.replace("token_env = \"ACME_TOKEN\"", "token = \"short\"");
        assert_eq!(check(&short).expect_err("short").field, "tenants[0].token");
        let shared = GOOD.replace("token_env = \"OPS_TOKEN\"", "token_env = \"ACME_TOKEN\"");
        assert_eq!(check(&shared).expect_err("shared").field, "token");
    }

    #[test]
    fn the_example_in_the_repository_is_a_valid_configuration() {
        let text = include_str!("../../../opledger.example.toml");
        let env = |name: &str| match name {
            "ACME_API_TOKEN" => Some("acme-0123456789abcdef".to_owned()),
            "OPS_TOKEN" => Some("ops-0123456789abcdef".to_owned()),
            "APPROVER_TOKEN" => Some("approver-0123456789abcdef".to_owned()),
            "METRICS_TOKEN" => Some("metrics-0123456789abcdef".to_owned()),
            "HUBSPOT_ACCT1_TOKEN" => Some("hubspot-secret".to_owned()),
            "BILLING_WEBHOOK_SECRET" => Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()),
            _ => None,
        };
        let config = parse("opledger.example.toml", text, &env).expect("the example is valid");
        assert_eq!(config.tokens.len(), 3);
        assert!(config
            .tokens
            .values()
            .any(|principal| matches!(principal, Principal::Approver { name, .. } if name == "finance-lead")));
        assert_eq!(config.providers.len(), 1);
        assert_eq!(config.webhooks.len(), 1);
        assert_eq!(
            config.metrics_token.as_deref(),
            Some("metrics-0123456789abcdef")
        );
        let error = parse("opledger.example.toml", text, &|_| None).expect_err("no env");
        assert_eq!(error.field, "tenants[0].token_env");
    }

    fn with_store_table(table: &str) -> String {
        GOOD.replace("store = \"sqlite:///tmp/ledger.db\"\n", "") + "\n[store]\n" + table
    }

    #[test]
    fn a_store_table_sets_a_postgres_stores_pool_and_timeouts() {
        let config = check(&with_store_table(
            "url = \"postgres://ledger@db:5432/opledger\"\npool_size = 16\nround_trip_timeout_ms = 8000\n",
        ))
        .expect("valid");
        assert!(matches!(config.store, StoreUrl::Postgres(_)));
        assert_eq!(config.store_limits.pool_size, Some(16));
        assert_eq!(config.store_limits.round_trip_timeout_ms, Some(8000));
        assert_eq!(config.store_limits.statement_timeout_ms, None);
    }

    #[test]
    fn a_store_limit_out_of_bounds_unknown_or_on_another_store_is_refused_naming_it() {
        let postgres = "url = \"postgres://ledger@db:5432/opledger\"\n";
        for (table, expected) in [
            (
                format!("{postgres}pool_size = 0"),
                "pool_size is 0; it must be 1 to 64",
            ),
            (
                format!("{postgres}round_trip_timeout_ms = 1000"),
                "round_trip_timeout_ms is 1000 and statement_timeout_ms 5000",
            ),
            (
                format!("{postgres}connect_timeout_ms = 0"),
                "connect_timeout_ms and pool_wait_ms must be above 0",
            ),
            (
                format!("{postgres}pool_sise = 3"),
                "unknown field `pool_sise`",
            ),
            (
                "url = \"sqlite:///tmp/ledger.db\"\npool_size = 4".to_owned(),
                "only a PostgreSQL store has",
            ),
        ] {
            let error = check(&with_store_table(&table))
                .expect_err(&table)
                .to_string();
            assert!(
                error.contains(expected) && error.contains("store"),
                "{table}: {error}"
            );
        }
    }

    /// The keys the file's shape accepts in the section `path` (empty: the top level), as
    /// serde's refusal of an unknown key lists them; `None` when the section takes any key (a
    /// map of names) or is read elsewhere. `arrays`: the sections written `[[…]]`.
    fn keys_accepted_in(path: &[&str], arrays: &BTreeSet<String>) -> Option<Vec<String>> {
        let mut text = String::new();
        for depth in 1..=path.len() {
            let section = path[..depth].join(".");
            if arrays.contains(&section) {
                text.push_str(&format!("[[{section}]]\n"));
            } else {
                text.push_str(&format!("[{section}]\n"));
            }
        }
        text.push_str("no_such_key_anywhere = 1\n");
        let refusal = toml::from_str::<File>(&text).err()?.to_string();
        let listed = refusal.split("expected").nth(1)?;
        Some(
            listed
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect(),
        )
    }

    #[test]
    fn every_key_the_parser_accepts_is_named_in_the_example_the_reference_shows() {
        let example = include_str!("../../../opledger.example.toml");
        let words: BTreeSet<&str> = example
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .collect();
        // Every section the example shows, written or commented out (`# [mcp]`).
        let mut sections: BTreeSet<String> = BTreeSet::new();
        let mut arrays: BTreeSet<String> = BTreeSet::new();
        for line in example.lines() {
            let line = line.trim_start_matches(['#', ' ']);
            if let Some(name) = line
                .strip_prefix("[[")
                .and_then(|rest| rest.split("]]").next())
            {
                arrays.insert(name.to_owned());
                sections.insert(name.to_owned());
            } else if let Some(name) = line
                .strip_prefix('[')
                .and_then(|rest| rest.split(']').next())
            {
                if !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.')
                {
                    sections.insert(name.to_owned());
                }
            }
        }
        let mut checked = Vec::new();
        let mut missing = Vec::new();
        for section in std::iter::once(String::new()).chain(sections) {
            let path: Vec<&str> = section.split('.').filter(|part| !part.is_empty()).collect();
            let Some(keys) = keys_accepted_in(&path, &arrays) else {
                continue;
            };
            for key in keys {
                if !words.contains(key.as_str()) {
                    missing.push(format!("[{section}] {key}"));
                }
            }
            checked.push(section);
        }
        for expected in [
            "",
            "engine",
            "limits",
            "tenants",
            "connectors",
            "webhooks",
            "metrics",
        ] {
            assert!(
                checked.iter().any(|section| section == expected),
                "the keys of section `{expected}` were read from the parser: {checked:?}"
            );
        }
        assert!(
            missing.is_empty(),
            "keys the parser accepts that opledger.example.toml (the configuration reference) never names: {missing:?}"
        );
    }

    #[test]
    fn store_urls_are_sqlite_paths_kurrentdb_connection_strings_or_postgres_urls() {
        assert_eq!(
            parse_store("sqlite://ledger.db"),
            Ok(StoreUrl::Sqlite(PathBuf::from("ledger.db")))
        );
        assert!(matches!(
            parse_store("esdb://localhost:2113?tls=false"),
            Ok(StoreUrl::KurrentDb(_))
        ));
        assert_eq!(
            parse_store("postgres://ledger@db:5432/opledger"),
            Ok(StoreUrl::Postgres(
                "postgres://ledger@db:5432/opledger".into()
            ))
        );
        let no_database = parse_store("postgres://ledger:pw@db:5432").expect_err("no database");
        assert!(no_database.contains("names no database"), "{no_database}");
        assert!(!no_database.contains("pw"), "{no_database}");
        assert!(parse_store("sqlite://").is_err());
        assert!(parse_store("/var/ledger.db").is_err());
    }
}
