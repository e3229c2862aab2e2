//! `opledger demo`: the article's story, played against real parts.
//!
//! A real SQLite ledger file, the fault-injecting CRM stand on a loopback port, the HTTP
//! adapters and the engine. Three scenarios:
//! 1. a lookup-only CRM applies the task and the response is lost: unknown, the lagging search
//!    finds the task once it is indexed, succeeded — one task, and the agent names it; then the
//!    same tool call is delivered again and finds the same operation;
//! 2. the same CRM, but the request never arrived: an empty search after the index lag does not
//!    allow another create, so a person is asked;
//! 3. a CRM with idempotency keys loses the request: the key lookup says it never arrived, and
//!    the same operation is retried with the same key — one task.
//!
//! The last line is computed, not written: `demo: scenarios=N passed=N duplicates=0` counts the
//! stand's stored objects and the ledger's states.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use opledger_crm_stand::{
    Fault, FaultKind, FaultMethod, Shape as StandShape, Stand, StandAdmin, StandConfig, StandObject,
};
use opledger_domain::app::IntentRequest;
use opledger_domain::contract::RetryPolicy;
use opledger_domain::engine::{Engine, EnginePolicy, Report};
use opledger_domain::ids::{AccountId, ActionName, OperationId, ProviderId, TenantId, WorkerId};
use opledger_domain::in_span::InSpanExt;
use opledger_domain::provider::{operation_label, BindingQuery, Providers};
use opledger_domain::state::{OperationState, Status};
use opledger_providers::presets::{stand_document, StandSettings};
use opledger_providers::{
    render_all, AccountSpec, Connector, Credentials, HttpProviders, Overrides,
    Shape as ProviderShape,
};
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_store::SqliteStore;

use crate::cli::{CliError, DemoArgs};
use crate::intent::open_ledger;
use opledger_http_api::render::timeline;

/// The demo's search index lag, in milliseconds (the stand's and the adapter's).
const SEARCH_LAG_MS: u64 = 1_000;
/// The longest one scenario may take before it counts as failed.
const SCENARIO_DEADLINE: Duration = Duration::from_secs(20);
const ACCOUNT: &str = "acct-1";
/// The demo's tenant, which owns the demo account.
const TENANT: &str = "acme";

type DemoEngine = Engine<SqliteStore, SystemClock, RandomIds, HttpProviders>;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Settles as succeeded with exactly one object at the CRM.
    OneObject,
    /// Ends with a person, with no object at the CRM.
    ReviewWithoutObject,
}

struct Scenario {
    title: &'static str,
    provider: &'static str,
    shape: StandShape,
    fault: FaultKind,
    expect: Expect,
}

pub async fn run(args: DemoArgs) -> Result<(), CliError> {
    let path = args.db.unwrap_or_else(|| fresh_path("demo"));
    let stand = Stand::start(
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        StandConfig {
            search_lag_ms: SEARCH_LAG_MS,
            ..StandConfig::default()
        },
    )
    .await
    .map_err(|error| CliError::Other(format!("cannot start the CRM stand: {error}")))?;
    println!(
        "opledger demo — ledger {} — CRM stand {}",
        path.display(),
        stand.base_url()
    );
    let admin =
        StandAdmin::new(stand.base_url()).map_err(|error| CliError::Other(error.to_string()))?;
    let engine = engine(&path, &stand.base_url()).await?;
    let result = tokio::select! {
        result = scenarios(&engine, &admin) => result,
        _ = tokio::signal::ctrl_c() => Err(CliError::Interrupted),
    };
    let closed = engine.ledger().store().clone().close().await;
    stand.shutdown().await;
    let (total, passed, duplicates) = result?;
    closed?;
    println!(
        "\nInspect any operation: opledger status --db {} <operation_id>",
        path.display()
    );
    println!("demo: scenarios={total} passed={passed} duplicates={duplicates}");
    if passed == total && duplicates == 0 {
        Ok(())
    } else {
        Err(CliError::Other(format!(
            "{} of {total} scenarios failed",
            total - passed
        )))
    }
}

async fn engine(path: &std::path::Path, base_url: &str) -> Result<DemoEngine, CliError> {
    // The stand's plain and keyed shapes, as connector documents, with the demo's tenant owning
    // the demo account.
    let connector = |id: &str, shape: ProviderShape| -> Result<Connector, CliError> {
        let document = stand_document(
            shape,
            StandSettings {
                search_lag_ms: Some(SEARCH_LAG_MS),
                ..StandSettings::default()
            },
        );
        let overrides = Overrides {
            id: Some(ProviderId::new(id)?),
            base_url: Some(base_url.to_owned()),
            accounts: vec![AccountSpec {
                id: AccountId::new(ACCOUNT)?,
                tenants: vec![TenantId::new(TENANT)?],
                credentials: Credentials::token(format!("token-{ACCOUNT}")),
            }],
            request_timeout_ms: Some(1_000),
            connect_timeout_ms: Some(500),
            ..Overrides::default()
        };
        Connector::build(&document, overrides)
            .map_err(|errors| CliError::Other(render_all(&errors)))
    };
    let providers = HttpProviders::new([
        connector("crm-plain", ProviderShape::Plain)?,
        connector("crm-keyed", ProviderShape::Keyed)?,
    ])
    .map_err(|error| CliError::Other(error.to_string()))?;
    let ledger = open_ledger(path).await?;
    let policy = EnginePolicy {
        lease_ms: 5_000,
        retry: RetryPolicy {
            max_attempts: 3,
            max_total_ms: 60_000,
            max_reconciliations: 30,
        },
        backoff_base_ms: 100,
        backoff_max_ms: 400,
    };
    Ok(Engine::try_new(
        ledger,
        providers,
        policy,
        WorkerId::new("demo-worker")?,
    )?)
}

async fn scenarios(
    engine: &DemoEngine,
    admin: &StandAdmin,
) -> Result<(usize, usize, usize), CliError> {
    let scenarios = [
        Scenario {
            title: "The article's story: the CRM creates the task, the response is lost",
            provider: "crm-plain",
            shape: StandShape::Plain,
            fault: FaultKind::DropResponse,
            expect: Expect::OneObject,
        },
        Scenario {
            title: "Lookup-only CRM, the request never arrived: an empty search is no licence to create",
            provider: "crm-plain",
            shape: StandShape::Plain,
            fault: FaultKind::DropRequest,
            expect: Expect::ReviewWithoutObject,
        },
        Scenario {
            title: "CRM with idempotency keys, the request never arrived: a safe retry with the same key",
            provider: "crm-keyed",
            shape: StandShape::Keyed,
            fault: FaultKind::DropRequest,
            expect: Expect::OneObject,
        },
    ];
    let mut passed = 0;
    let mut duplicates = 0;
    for (number, scenario) in scenarios.iter().enumerate() {
        println!("\n{}. {}", number + 1, scenario.title);
        let (ok, extra) = play(engine, admin, scenario, number + 1).await?;
        passed += usize::from(ok);
        duplicates += extra;
        println!(
            "   => {}",
            if ok { "as expected" } else { "NOT as expected" }
        );
    }
    Ok((scenarios.len(), passed, duplicates))
}

/// Plays one scenario; returns whether it ended as expected and how many duplicate objects the
/// CRM holds for it.
async fn play(
    engine: &DemoEngine,
    admin: &StandAdmin,
    scenario: &Scenario,
    number: usize,
) -> Result<(bool, usize), CliError> {
    let request = tool_call(engine, scenario, number)?;
    let recorded = engine.ledger().record_intent(request.clone()).await?;
    let operation_id = recorded.intent().operation_id;
    let key = recorded.intent().idempotency_key.to_string();
    println!("   intent recorded: operation {operation_id}, key {key}");
    queue_fault(admin, scenario).await?;

    let first = drive(engine, operation_id).await?;
    println!(
        "   after the first send: {} — agent: \"{}\"",
        first.state().status.name(),
        first.sentence
    );
    let last = settle(engine, operation_id).await?;
    println!(
        "   finally: {} — agent: \"{}\"",
        last.state().status.name(),
        last.sentence
    );

    // The same tool call delivered again must find the same operation and send nothing.
    let again = engine.ledger().record_intent(request).await?;
    let redelivery_ok = !again.created && again.intent().operation_id == operation_id;
    println!(
        "   the tool call delivered again: {}",
        if redelivery_ok {
            "same operation, nothing sent"
        } else {
            "A SECOND OPERATION"
        }
    );

    let objects = objects_of(admin, &key, &operation_label(operation_id)).await?;
    let ids: Vec<&str> = objects.iter().map(|object| object.id.as_str()).collect();
    println!("   the CRM holds {} task(s) for it: {ids:?}", objects.len());
    println!("   timeline:");
    for line in timeline::lines(&timeline::history(engine.ledger().store(), operation_id).await?) {
        println!("     {line}");
    }
    let state = last.state();
    let ok = redelivery_ok && as_expected(scenario.expect, &objects, state);
    Ok((ok, objects.len().saturating_sub(1) + state.duplicates.len()))
}

/// The agent's tool call of scenario `number`: one task to create through the scenario's CRM.
fn tool_call(
    engine: &DemoEngine,
    scenario: &Scenario,
    number: usize,
) -> Result<IntentRequest, CliError> {
    let provider = ProviderId::new(scenario.provider)?;
    let account = AccountId::new(ACCOUNT)?;
    let tenant = TenantId::new(TENANT)?;
    let fingerprint = engine
        .providers()
        .bind(&BindingQuery {
            tenant: &tenant,
            provider: &provider,
            account: &account,
            action: &ActionName::new("create_task")?,
        })
        .map_err(|unbound| CliError::Other(unbound.to_string()))?
        .credential_fingerprint;
    Ok(IntentRequest {
        tenant: TENANT.into(),
        owner: Some("manager-anna".into()),
        provider: provider.to_string(),
        account: account.to_string(),
        credential_fingerprint: fingerprint.to_string(),
        action: "create_task".into(),
        args: serde_json::json!({"title": "Call the client", "due": "2026-12-01"}),
        source_id: Some(format!("toolcall-demo-{number}")),
        requires_approval: false,
    })
}

/// Tells the stand to fault the scenario's first create, and says so.
async fn queue_fault(admin: &StandAdmin, scenario: &Scenario) -> Result<(), CliError> {
    admin
        .queue_fault(
            &Fault::new(scenario.fault.clone())
                .shape(scenario.shape)
                .method(FaultMethod::Post),
        )
        .await
        .map_err(|error| CliError::Other(error.to_string()))?;
    println!(
        "   the stand will {} the first create",
        scenario.fault.name().replace('_', " ")
    );
    Ok(())
}

/// The objects the stand stores for the operation: those with its idempotency key or its label.
async fn objects_of(
    admin: &StandAdmin,
    key: &str,
    label: &str,
) -> Result<Vec<StandObject>, CliError> {
    Ok(admin
        .objects(Some(ACCOUNT))
        .await
        .map_err(|error| CliError::Other(error.to_string()))?
        .into_iter()
        .filter(|object| {
            object.key.as_deref() == Some(key) || object.label.as_deref() == Some(label)
        })
        .collect())
}

/// Whether the CRM's objects and the operation's final state are what the scenario expects.
fn as_expected(expect: Expect, objects: &[StandObject], state: &OperationState) -> bool {
    match expect {
        Expect::OneObject => {
            objects.len() == 1
                && state.external_id().map(|id| id.as_str()) == Some(objects[0].id.as_str())
        }
        Expect::ReviewWithoutObject => objects.is_empty() && state.status == Status::NeedsReview,
    }
}

/// One drive, as a worker makes it (`opledger_runtime::workers`): in a `drive` span of its own,
/// which the engine joins to the trace the intent was recorded in, so that with trace export on
/// an operation's whole history is one trace (without it each step would start a trace).
async fn drive(engine: &DemoEngine, operation_id: OperationId) -> Result<Report, CliError> {
    let span = tracing::info_span!(parent: None, "drive", %operation_id);
    Ok(engine.drive(operation_id).in_span(span).await?)
}

/// Drives the operation until it is settled or waits for a person, sleeping until its next work
/// is due in between.
async fn settle(engine: &DemoEngine, operation_id: OperationId) -> Result<Report, CliError> {
    let deadline = Instant::now() + SCENARIO_DEADLINE;
    loop {
        let report = drive(engine, operation_id).await?;
        let state = report.state();
        let waiting_for_work = matches!(
            state.status,
            Status::Pending | Status::InFlight | Status::Unknown
        );
        if !waiting_for_work || Instant::now() >= deadline {
            return Ok(report);
        }
        let now = chrono::Utc::now();
        let pause = state
            .next_work()
            .and_then(|(due_at, _)| (due_at - now).to_std().ok())
            .unwrap_or(Duration::from_millis(20))
            .clamp(Duration::from_millis(20), Duration::from_secs(2));
        tokio::time::sleep(pause).await;
    }
}

/// A path for a fresh ledger file in the system's temporary directory.
fn fresh_path(purpose: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "opledger-{purpose}-{}.db",
        uuid::Uuid::new_v4().simple()
    ))
}
