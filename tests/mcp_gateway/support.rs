//! What every gateway test stands on: a SQLite ledger file, the engine, and one upstream MCP
//! server registered as a connector from its document — real servers installed from PyPI and npm
//! into environments made once and reused, started by the connector as child processes (or
//! reached over Streamable HTTP), behind a relay that can kill them with SIGKILL.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opledger_domain::app::{IntentRequest, Ledger};
use opledger_domain::codec;
use opledger_domain::contract::RetryPolicy;
use opledger_domain::engine::{Engine, EnginePolicy, Report};
use opledger_domain::ids::{OperationId, ProviderId, StreamVersion, WorkerId};
use opledger_domain::state::{OperationState, Status};
use opledger_domain::store::{EventStore, StreamName, MAX_READ_BATCH};
use opledger_providers::document::{parse_any, AnyDocument};
use opledger_providers::mcp::McpConnector;
use opledger_providers::{render_all, HttpProviders};
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_store::SqliteStore;
use serde_json::Value;
use tempfile::TempDir;

use super::python::python_venv;

pub type GatewayEngine = Engine<SqliteStore, SystemClock, RandomIds, HttpProviders>;

/// The tenant every operation is recorded for, and its account at the upstream.
pub const TENANT: &str = "acme";
pub const ACCOUNT: &str = "main";
/// The provider id every test's upstream is registered under.
pub const PROVIDER: &str = "upstream";

/// Longest an operation may take to settle before the test fails.
const SETTLE_DEADLINE: Duration = Duration::from_secs(30);

/// The PyPI packages of the upstreams: the two reference servers (pinned, as their behaviour on
/// a repeat is what the tests are about) and the SDK the fault-injecting server is written with.
/// `mcp<2`: mcp-server-sqlite is written against the SDK's 1.x API.
const PYTHON_REQUIREMENTS: &[&str] = &[
    "mcp>=1.20,<2",
    "mcp-server-sqlite==2025.4.25",
    "mcp-server-git==2026.10.10",
];

/// The python of the upstreams' environment, made once per target directory.
pub fn python() -> PathBuf {
    python_venv::python_with("mcp-upstreams", PYTHON_REQUIREMENTS)
}

/// The environment's python, as text for a document.
pub fn python_text() -> String {
    python().to_str().expect("a UTF-8 path").to_owned()
}

/// The arguments that run the server of the environment's package `module` (`mcp_server_git`):
/// through the python itself, as the environment is made aside and moved into place, which
/// leaves its console scripts pointing at the old place.
pub fn server_args(module: &str) -> Vec<String> {
    vec![
        "-c".to_owned(),
        format!("import sys; from {module} import main; sys.exit(main())"),
    ]
}

/// Strings as a TOML array's items.
pub fn listed(items: &[String]) -> String {
    items
        .iter()
        .map(|item| quoted(item))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `tests/mcp_gateway/<file>`, as text for a document.
pub fn here(file: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp_gateway")
        .join(file)
        .to_str()
        .expect("a UTF-8 path")
        .to_owned()
}

/// A TOML string literal of `text` (paths in documents).
pub fn quoted(text: &str) -> String {
    toml_escape(text)
}

fn toml_escape(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

/// One upstream as a connector, with the engine over a fresh ledger.
pub struct Gateway {
    /// The test's folder (the ledger file, the fault file, the upstream's data), kept until the
    /// gateway is dropped.
    pub _dir: TempDir,
    pub engine: Arc<GatewayEngine>,
    /// The file a relay or the fault-injecting upstream reads its next fault from.
    pub fault_file: PathBuf,
}

impl Gateway {
    /// A gateway for the connector `document` (written for provider [`PROVIDER`]); the
    /// document's `env_from` variables are `OPLEDGER_FAULT_FILE` (the fault file) only.
    pub async fn start(dir: TempDir, document: &str) -> Self {
        Self::start_with_env(dir, document, Vec::new()).await
    }

    /// [`Gateway::start`] with more variables for the document to read (`(name, value)`).
    pub async fn start_with_env(dir: TempDir, document: &str, more: Vec<(String, String)>) -> Self {
        let connector = build_connector(&dir, document, more);
        Self::start_with_connector(dir, connector).await
    }

    /// A gateway for a connector built (and placed) by the test.
    pub async fn start_with_connector(dir: TempDir, connector: McpConnector) -> Self {
        let fault_file = dir.path().join("fault");
        let mut providers = HttpProviders::default();
        providers.insert_mcp(connector).expect("one provider");
        let store = SqliteStore::open(dir.path().join("ledger.db"))
            .await
            .expect("the ledger file opens");
        let engine = Engine::new(
            Ledger::new(store, SystemClock, RandomIds),
            providers,
            policy(),
            WorkerId::new("gateway-test").expect("a valid worker id"),
        );
        Self {
            _dir: dir,
            engine: Arc::new(engine),
            fault_file,
        }
    }
}

/// The connector `document` describes (written for provider [`PROVIDER`]), its `env_from`
/// variables `TEST_FAULT_FILE` (the fault file in `dir`) and `more` (`(name, value)`).
pub fn build_connector(dir: &TempDir, document: &str, more: Vec<(String, String)>) -> McpConnector {
    let fault_file = dir.path().join("fault");
    let parsed = match parse_any("upstream.toml", document) {
        Ok(AnyDocument::Mcp(document)) => document,
        Ok(AnyDocument::Rest(_)) => panic!("the test's document is an MCP one"),
        Err(errors) => panic!("the test's document loads:\n{}", render_all(&errors)),
    };
    let fault = fault_file.clone();
    let env = move |name: &str| {
        if name == "TEST_FAULT_FILE" {
            return Some(fault.clone().into_os_string());
        }
        more.iter()
            .find(|(variable, _)| variable == name)
            .map(|(_, value)| value.into())
    };
    McpConnector::build(&parsed, None, &[], &env)
        .unwrap_or_else(|errors| panic!("the connector builds:\n{}", render_all(&errors)))
}

impl Gateway {
    /// Arms one fault for the relay or the upstream (`kill_after write_query`, `die_before`).
    pub fn arm(&self, fault: &str) {
        std::fs::write(&self.fault_file, fault).expect("the fault is armed");
    }

    /// The faults that fired, in order.
    pub fn fired(&self) -> Vec<String> {
        let mut path = self.fault_file.clone().into_os_string();
        path.push(".fired");
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    pub fn connector(&self) -> &McpConnector {
        self.engine
            .providers()
            .mcp(&ProviderId::new(PROVIDER).expect("valid"))
            .expect("the upstream is registered")
    }

    /// Records the agent's call of `action` with `args` (the same `source_id` finds the same
    /// operation).
    pub async fn record(&self, action: &str, args: Value, source_id: &str) -> OperationId {
        let fingerprint = self
            .connector()
            .account_owners()
            .next()
            .expect("an account")
            .2
            .to_string();
        let recorded = self
            .engine
            .ledger()
            .record_intent(IntentRequest {
                tenant: TENANT.into(),
                owner: Some("agent".into()),
                provider: PROVIDER.into(),
                account: ACCOUNT.into(),
                credential_fingerprint: fingerprint,
                action: action.into(),
                args,
                source_id: Some(source_id.into()),
                requires_approval: false,
            })
            .await
            .expect("the intent is recorded");
        recorded.operation.operation_id
    }

    /// Drives the operation until it no longer waits for work of its own.
    pub async fn settle(&self, operation_id: OperationId) -> OperationState {
        let deadline = Instant::now() + SETTLE_DEADLINE;
        loop {
            let report: Report = self
                .engine
                .drive(operation_id)
                .await
                .expect("the engine drives the operation");
            let state = report.state().clone();
            if !matches!(
                state.status,
                Status::Pending | Status::InFlight | Status::Unknown
            ) {
                return state;
            }
            assert!(
                Instant::now() < deadline,
                "operation {operation_id} did not settle within {SETTLE_DEADLINE:?}: {state:?}"
            );
            let pause = state
                .next_work()
                .and_then(|(due, _)| (due - chrono::Utc::now()).to_std().ok())
                .unwrap_or(Duration::from_millis(5))
                .clamp(Duration::from_millis(5), Duration::from_millis(500));
            tokio::time::sleep(pause).await;
        }
    }

    /// The operation's event names, in order.
    pub async fn events(&self, operation_id: OperationId) -> Vec<&'static str> {
        let store = self.engine.ledger().store();
        let stream = StreamName::for_operation(operation_id);
        let mut names = Vec::new();
        let mut from = StreamVersion::FIRST;
        loop {
            let page = store
                .read_stream(&stream, from, MAX_READ_BATCH)
                .await
                .expect("the operation's stream reads");
            let Some(last) = page.last() else {
                return names;
            };
            from = last.version.next();
            names.extend(page.iter().map(|recorded| {
                codec::decode(recorded)
                    .expect("every stored event decodes")
                    .type_name()
            }));
        }
    }
}

/// Short timeouts and backoffs: an unclear call is looked up within milliseconds.
fn policy() -> EnginePolicy {
    EnginePolicy {
        lease_ms: 30_000,
        retry: RetryPolicy {
            max_attempts: 3,
            max_total_ms: 60_000,
            max_reconciliations: 20,
        },
        backoff_base_ms: 20,
        backoff_max_ms: 500,
    }
}

/// The external id of a succeeded operation.
pub fn succeeded_with(state: &OperationState) -> String {
    match &state.status {
        Status::Succeeded { external_id } => external_id.to_string(),
        other => panic!("the operation succeeded: {other:?} ({state:?})"),
    }
}
