//! The operator console (adapters/console) end to end in a real browser: Debian's headless
//! Chromium driven by playwright-core from npm, against a spawned `opledger serve` and the CRM
//! stand. The scenario itself is adapters/console/tests/browser/console.test.mjs; this test
//! provides what it stands on and fails (never skips) when any of it cannot be had:
//!
//! - Chromium at /usr/bin/chromium, installed with apt-get when missing (`bash .ci/run` on a fresh
//!   Debian machine runs as root);
//! - the script's npm packages (playwright-core, axe-core), installed with `npm ci` from the
//!   committed lock file into the target directory and reused while the lock is the same;
//! - the screenshots it takes go to docs/console, where the book's console page shows them, so they stay
//!   true to the console each test run.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::npm;
use super::python::python_venv::run;
use super::support::{
    Harness, Server, ACCOUNT, ACCOUNT_TOKEN, APPROVER_B_TOKEN, OPERATOR_B_TOKEN, OPERATOR_TOKEN,
    SEARCH_LAG_MS, TENANT_A_TOKEN, TENANT_B_TOKEN,
};

const CHROMIUM: &str = "/usr/bin/chromium";
/// An operator scoped to tenants A and B, added to the harness's configuration for this test.
const OPERATOR_AB_TOKEN: &str = "operator-a-and-b-0123456789";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn browser_tests() -> PathBuf {
    repo().join("adapters/console/tests/browser")
}

/// Installs Debian's Chromium when it is missing. Fails the test if it cannot: a browser test
/// that skips would pass on exactly the machines where nobody looked.
fn ensure_chromium() {
    crate::postgres_server::apt::install(&["chromium"], CHROMIUM, || Path::new(CHROMIUM).exists())
        .unwrap_or_else(|error| panic!("the console tests need Chromium: {error}"));
}

/// The folder holding `node_modules` with the lock file's packages, made once per lock file.
fn node_modules() -> PathBuf {
    static MADE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MADE.get_or_init(|| {
        npm::installed(
            &browser_tests(),
            "console-browser",
            &["playwright-core", "axe-core"],
            "the console's browser-test packages",
        )
    })
    .clone()
}

/// The environment variable holding the console test's webhook secret, and the secret.
const WEBHOOK_SECRET_ENV: &str = "CONSOLE_TEST_WEBHOOK_SECRET";
const WEBHOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[tokio::test]
async fn an_operator_resolves_a_lost_request_in_the_console_in_a_real_browser() {
    let modules = tokio::task::spawn_blocking(|| {
        ensure_chromium();
        node_modules()
    })
    .await
    .expect("the browser and the packages are installed");
    let harness = Harness::new("").await;
    // The harness's configuration plus an operator who sees two tenants (whose listings must
    // name one), without changing the configuration every other serve test shares.
    let config = harness.instance_config(
        0,
        &[(
            "[[approvers]]",
            &format!(
                "[[operators]]\nid = \"ab-reviewer\"\ntoken = \"{OPERATOR_AB_TOKEN}\"\ntenants = [\"tenant-a\", \"tenant-b\"]\n\n[[approvers]]"
            ),
        )],
    );
    // An outcome webhook whose receiver is gone (a loopback port nobody listens on), so the
    // console has a failing endpoint with attempts to show.
    let gone = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port");
    let mut text = std::fs::read_to_string(&config).expect("the configuration");
    text.push_str(&format!(
        "\n[[webhooks]]\nid = \"ops-feed\"\nurl = \"http://{gone}/hooks\"\nsecret_env = \"{WEBHOOK_SECRET_ENV}\"\nevents = [\"all\"]\n"
    ));
    std::fs::write(&config, text).expect("the configuration with a webhook");
    let server = Server::start_with_env(
        &["serve", "--config", &config.display().to_string()],
        harness.dir.path(),
        &[(WEBHOOK_SECRET_ENV, WEBHOOK_SECRET)],
    );
    let shots = repo().join("docs/console");
    std::fs::create_dir_all(&shots).expect("the screenshots folder");
    let mut node = Command::new("node");
    node.arg(browser_tests().join("console.test.mjs"))
        .env("OPLEDGER_BASE_URL", &server.base)
        .env("OPLEDGER_STAND_URL", harness.stand_url())
        .env("OPLEDGER_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env("OPLEDGER_OPERATOR_B_TOKEN", OPERATOR_B_TOKEN)
        .env("OPLEDGER_OPERATOR_AB_TOKEN", OPERATOR_AB_TOKEN)
        .env("OPLEDGER_TENANT_A_TOKEN", TENANT_A_TOKEN)
        .env("OPLEDGER_TENANT_B_TOKEN", TENANT_B_TOKEN)
        .env("OPLEDGER_APPROVER_B_TOKEN", APPROVER_B_TOKEN)
        .env("OPLEDGER_ACCOUNT", ACCOUNT)
        .env("OPLEDGER_ACCOUNT_TOKEN", ACCOUNT_TOKEN)
        .env("OPLEDGER_SEARCH_LAG_MS", SEARCH_LAG_MS.to_string())
        .env("OPLEDGER_NODE_MODULES", &modules)
        .env("OPLEDGER_SCREENSHOTS", &shots);
    let printed = tokio::task::spawn_blocking(move || run(&mut node, "the console's browser test"))
        .await
        .expect("node ran");
    println!("{printed}");
    assert!(
        printed.contains("all console checks passed"),
        "the browser test did not reach its end:\n{printed}"
    );
}

#[tokio::test]
async fn the_console_is_served_with_its_policy_and_unknown_files_are_404() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let client = reqwest::Client::new();
    for path in [
        "/console",
        "/console/",
        "/console/app.js",
        "/console/pages/review.js",
    ] {
        let response = client
            .get(format!("{}{path}", server.base))
            .send()
            .await
            .expect("the server answers");
        assert_eq!(response.status(), reqwest::StatusCode::OK, "{path}");
        let policy = response.headers()["content-security-policy"]
            .to_str()
            .expect("ASCII");
        assert_eq!(policy, opledger_console::CONTENT_SECURITY_POLICY, "{path}");
        assert!(response.headers().get("set-cookie").is_none(), "{path}");
    }
    let missing = client
        .get(format!("{}/console/secrets.js", server.base))
        .send()
        .await
        .expect("the server answers");
    assert_eq!(missing.status(), reqwest::StatusCode::NOT_FOUND);
}

/// Operations the scale test seeds waiting for review: more than a page of the API's largest
/// (1,000), so only paging reaches the last.
const WAITING_ITEMS: usize = 1_100;
/// Operations seeded at once: the store's one writer commits their appends together, so more
/// at once means fewer, larger commits (256 writes 1M settled operations in a few minutes where
/// waves of 100 waited on each wave's slowest).
const SEED_CONCURRENCY: usize = 256;

/// Runs `one(n)` for every n in `0..count`, `SEED_CONCURRENCY` at a time, each worker taking the
/// next n as soon as it is free (no wave waits for its slowest).
async fn seed_each<F, Fut>(count: usize, one: F)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let next = std::sync::atomic::AtomicUsize::new(0);
    let worker = || async {
        loop {
            let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n >= count {
                return;
            }
            one(n).await;
        }
    };
    futures_util::future::join_all((0..SEED_CONCURRENCY).map(|_| worker())).await;
}

/// Writes `count` operations that wait for a person into the SQLite ledger at `db`, through the
/// ledger's own commands (intent, attempt, lost answer, hand-over) as the engine would record
/// them, without a round trip to a server per event. Tenant A's at `crm-plain` (a lookup-only
/// CRM: no safe retry); every tenth is tenant B's. Titles are `Incident task N`.
async fn seed_waiting(db: &Path, count: usize, settled: usize) {
    use opledger_domain::app::{IntentRequest, Ledger};
    use opledger_domain::command::Command;
    use opledger_domain::contract::{
        Deduplication, LookupSupport, ProviderCapabilities, RetryPolicy, SendBinding,
    };
    use opledger_domain::ids::WorkerId;
    use opledger_domain::ports::IdSource;
    use opledger_runtime::system::{RandomIds, SystemClock};
    use opledger_store::SqliteStore;

    let store = SqliteStore::open(db).await.expect("the ledger opens");
    let ledger = Ledger::new(store, SystemClock, RandomIds);
    let one = |n: usize| {
        let ledger = &ledger;
        async move {
            let tenant = if n % 10 == 9 { "tenant-b" } else { "tenant-a" };
            let intent = ledger
                .record_intent(IntentRequest {
                    tenant: tenant.into(),
                    owner: Some(format!("owner-{}", n % 7)),
                    provider: "crm-plain".into(),
                    account: ACCOUNT.into(),
                    credential_fingerprint: "seeded".into(),
                    action: "create_task".into(),
                    args: serde_json::json!({"title": format!("Incident task {n}")}),
                    source_id: Some(format!("incident-{n}")),
                    requires_approval: false,
                })
                .await
                .expect("the intent is recorded")
                .intent()
                .clone();
            let attempt_id = RandomIds.new_attempt_id();
            let commands = [
                Command::StartAttempt {
                    budget_wait: None,
                    attempt_id,
                    worker: WorkerId::new("seeder").expect("a worker id"),
                    lease_ms: 30_000,
                    binding: SendBinding {
                        account: intent.account.clone(),
                        credential_fingerprint: intent.credential_fingerprint.clone(),
                        args_hash: intent.args_hash.clone(),
                    },
                    capabilities: ProviderCapabilities {
                        deduplication: Deduplication::None,
                        lookup: LookupSupport::Consistent,
                    },
                    policy: RetryPolicy::default(),
                    request: None,
                },
                Command::RecordUnknown {
                    check_not_before: None,
                    attempt_id,
                    error: "read timeout after 2 s (the CRM was down)".into(),
                },
                Command::RequireReview {
                    reason: "the CRM neither honours idempotency keys nor enforces a unique label, and its search found nothing".into(),
                    evidence: "search by label found nothing".into(),
                },
            ];
            for command in commands {
                ledger
                    .execute(intent.operation_id, &command)
                    .await
                    .unwrap_or_else(|error| panic!("{}: {error}", command.name()));
            }
        }
    };
    // Settled ones first, as a ledger's history is before an incident: tenant A's, confirmed by
    // the keyed CRM, titled `Settled task N`, one of 50 owners. Each is three appends from the
    // state the last one returned (no stream read between them).
    let settle = |n: usize| {
        let ledger = &ledger;
        async move {
            let recorded = ledger
                .record_intent(IntentRequest {
                    tenant: "tenant-a".into(),
                    owner: Some(format!("owner-{}", n % 50)),
                    provider: "crm".into(),
                    account: ACCOUNT.into(),
                    credential_fingerprint: "seeded".into(),
                    action: "create_task".into(),
                    args: serde_json::json!({"title": format!("Settled task {n}")}),
                    source_id: None,
                    requires_approval: false,
                })
                .await
                .expect("the intent is recorded");
            let intent = recorded.intent().clone();
            let attempt_id = RandomIds.new_attempt_id();
            let start = Command::StartAttempt {
                budget_wait: None,
                attempt_id,
                worker: WorkerId::new("seeder").expect("a worker id"),
                lease_ms: 30_000,
                binding: SendBinding {
                    account: intent.account.clone(),
                    credential_fingerprint: intent.credential_fingerprint.clone(),
                    args_hash: intent.args_hash.clone(),
                },
                capabilities: ProviderCapabilities {
                    deduplication: Deduplication::IdempotencyKey {
                        retention_s: 86_400,
                        safety_margin_s: 3_600,
                    },
                    lookup: LookupSupport::Consistent,
                },
                policy: RetryPolicy::default(),
                request: None,
            };
            let started = ledger
                .execute_from(recorded.operation, &start)
                .await
                .expect("the attempt starts");
            let success = Command::RecordSuccess {
                attempt_id,
                external_id: opledger_domain::ids::ExternalObjectId::new(format!("task-{n}"))
                    .expect("an external id"),
                provider_request_id: None,
            };
            ledger
                .execute_from(started, &success)
                .await
                .expect("the success is recorded");
        }
    };
    seed_each(settled, settle).await;
    seed_each(count, one).await;
    ledger
        .store()
        .clone()
        .close()
        .await
        .expect("the ledger closes");
}

// Returns its failure instead of panicking so that the failing step's name and message end the
// test's output, after no backtrace: a CI log cut to its last lines still says what broke.
#[tokio::test]
async fn an_operator_works_through_an_incident_of_a_thousand_waiting_items_in_a_real_browser(
) -> Result<(), String> {
    let modules = tokio::task::spawn_blocking(|| {
        ensure_chromium();
        node_modules()
    })
    .await
    .expect("the browser and the packages are installed");
    let harness = Harness::new("").await;
    let config = harness.instance_config(
        0,
        &[(
            "[[approvers]]",
            &format!(
                "[[operators]]\nid = \"ab-reviewer\"\ntoken = \"{OPERATOR_AB_TOKEN}\"\ntenants = [\"tenant-a\", \"tenant-b\"]\n\n[[approvers]]"
            ),
        )],
    );
    // bench/console_review_load.sh runs this test with more (e.g. 10,000) to measure the pages.
    let waiting = std::env::var("OPLEDGER_CONSOLE_WAITING")
        .ok()
        .and_then(|text| text.parse::<usize>().ok())
        .unwrap_or(WAITING_ITEMS)
        .max(WAITING_ITEMS);
    // bench/console_load.sh adds settled operations (e.g. 1,000,000) to measure the console
    // on a ledger with a history.
    let settled = std::env::var("OPLEDGER_CONSOLE_OPERATIONS")
        .ok()
        .and_then(|text| text.parse::<usize>().ok())
        .unwrap_or(0);
    let seeded = std::time::Instant::now();
    seed_waiting(&harness.dir.path().join("ledger.db"), waiting, settled).await;
    println!(
        "seeded {waiting} waiting and {settled} settled operations in {} ms",
        seeded.elapsed().as_millis()
    );
    let server = Server::start_with_env(
        &["serve", "--config", &config.display().to_string()],
        harness.dir.path(),
        &[],
    );
    // A large seeded ledger is served before its read models have caught up with it (they answer
    // 503 until then): the browser starts once /healthz says ok, and the wait is printed.
    let caught_up = std::time::Instant::now();
    let allowed = std::time::Duration::from_secs(60 + (waiting + settled) as u64 / 1_000);
    loop {
        let (status, body) = server
            .call(reqwest::Method::GET, "/healthz", None, None)
            .await;
        if status == reqwest::StatusCode::OK {
            break;
        }
        assert!(
            caught_up.elapsed() < allowed,
            "the read models did not catch up within {allowed:?}: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    println!(
        "served: read models caught up {} ms after the start",
        caught_up.elapsed().as_millis()
    );
    let shots = repo().join("docs/console");
    let mut node = Command::new("node");
    node.arg(browser_tests().join("review_at_scale.test.mjs"))
        .env("OPLEDGER_BASE_URL", &server.base)
        .env("OPLEDGER_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env("OPLEDGER_OPERATOR_AB_TOKEN", OPERATOR_AB_TOKEN)
        .env("OPLEDGER_WAITING", waiting.to_string())
        .env("OPLEDGER_SETTLED", settled.to_string())
        .env("OPLEDGER_NODE_MODULES", &modules)
        .env("OPLEDGER_SCREENSHOTS", &shots);
    let output = tokio::task::spawn_blocking(move || node.output())
        .await
        .expect("the thread running node ended")
        .map_err(|error| format!("cannot start node: {error}"))?;
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{printed}");
    if output.status.success() && printed.contains("all scale checks passed") {
        return Ok(());
    }
    let failure: Vec<&str> = printed
        .lines()
        .skip_while(|line| !line.starts_with("FAILED at:"))
        .take(12)
        .collect();
    Err(format!(
        "the browser test did not reach its end (its whole output is above):\n{}",
        failure.join("\n")
    ))
}
