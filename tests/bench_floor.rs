//! `opledger bench floor` as the peers' harness uses it: a real process, a real provider on
//! loopback, real HTTP calls, and the ledger file read back afterwards.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

/// Longest the floor may take to start or to stop.
const DEADLINE: Duration = Duration::from_secs(30);

/// A provider that creates an object per POST and remembers each call's idempotency key.
#[derive(Clone, Default)]
struct Provider {
    calls: Arc<AtomicU64>,
    keys: Arc<Mutex<Vec<String>>>,
}

async fn start_provider() -> (Provider, String) {
    let provider = Provider::default();
    let state = provider.clone();
    let app = Router::new().route(
        "/tasks",
        post(move |headers: HeaderMap| {
            let state = state.clone();
            async move {
                let id = state.calls.fetch_add(1, Ordering::SeqCst) + 1;
                let key = headers
                    .get("idempotency-key")
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                state.keys.lock().expect("keys").push(key);
                (StatusCode::CREATED, axum::Json(json!({ "id": id })))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let url = format!(
        "http://{}/tasks",
        listener.local_addr().expect("an address")
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (provider, url)
}

/// Where the floor's stderr goes: beside its ledger, to show when a check fails.
fn log_file(db: &std::path::Path) -> std::fs::File {
    std::fs::File::create(db.with_extension("log")).expect("a log file")
}

/// Starts the floor and returns it with the address it printed.
fn start_floor(provider_url: &str, db: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["bench", "floor", "--provider-url", provider_url, "--db"])
        .arg(db)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file(db))
        .spawn()
        .expect("the opledger binary starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let first = received
        .recv_timeout(DEADLINE)
        .expect("the floor prints its address");
    let address = first
        .strip_prefix("opledger bench floor: listening on ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_owned();
    (child, address)
}

fn stop(mut child: Child) -> std::process::ExitStatus {
    let pid = child.id().to_string();
    let sent = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the floor did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_records_sends_once_records_the_outcome_and_refuses_a_second_request() {
    let (provider, provider_url) = start_provider().await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("floor.db");
    let (child, address) = start_floor(&provider_url, &db);
    let client = reqwest::Client::new();
    let body = json!({
        "provider": "crm", "account": "bench", "action": "create_task",
        "args": {"title": "task 1"}, "source_id": "call-1",
    });
    let url = format!("{address}/v1/operations?execute=true");

    let first = client
        .post(&url)
        .json(&body)
        .send()
        .await
        .expect("an answer");
    assert_eq!(first.status(), StatusCode::CREATED);
    let answer: Value = first.json().await.expect("JSON");
    assert_eq!(answer["state"], "succeeded");
    assert_eq!(answer["external_id"], "1");
    assert_eq!(
        answer["stream_version"], 2,
        "intent, claim and outcome: versions 0 to 2"
    );

    let again = client
        .post(&url)
        .json(&body)
        .send()
        .await
        .expect("an answer");
    assert_eq!(
        again.status(),
        StatusCode::CONFLICT,
        "the floor records a source_id once"
    );
    let bad = client.post(&url).body("{").send().await.expect("an answer");
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        provider.calls.load(Ordering::SeqCst),
        1,
        "only the first request was sent"
    );
    let keys = provider.keys.lock().expect("keys").clone();
    assert!(
        keys[0].starts_with("opk_"),
        "the send carries the operation's key: {keys:?}"
    );

    let stopped = stop(child);
    assert!(
        stopped.success(),
        "SIGTERM stops the floor cleanly, not {stopped}; its stderr:\n{}",
        std::fs::read_to_string(db.with_extension("log")).unwrap_or_default()
    );
    let ledger = rusqlite::Connection::open(&db).expect("the ledger file opens");
    let types: Vec<String> = ledger
        .prepare("SELECT event_type FROM events ORDER BY position")
        .expect("a query")
        .query_map([], |row| row.get(0))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("event types");
    assert_eq!(
        types,
        ["IntentRecorded", "AttemptStarted", "AttemptSucceeded"]
    );
}

#[test]
fn the_floor_refuses_a_provider_url_that_is_not_http_and_an_existing_ledger() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_opledger"))
            .args(["bench", "floor"])
            .args(args)
            .output()
            .expect("the opledger binary runs")
    };
    let not_http = run(&["--provider-url", "ftp://127.0.0.1/tasks"]);
    assert!(!not_http.status.success());
    assert!(String::from_utf8_lossy(&not_http.stderr).contains("http://"));
    let existing = dir.path().join("there.db");
    std::fs::write(&existing, b"").expect("a file");
    let exists = run(&[
        "--provider-url",
        "http://127.0.0.1:9/tasks",
        "--db",
        existing.to_str().expect("UTF-8"),
    ]);
    assert!(!exists.status.success());
    assert!(String::from_utf8_lossy(&exists.stderr).contains("does not exist yet"));
    let both = run(&[
        "--provider-url",
        "http://127.0.0.1:9/tasks",
        "--without-ledger",
        "--db",
        dir.path().join("new.db").to_str().expect("UTF-8"),
    ]);
    assert!(!both.status.success());
    assert!(String::from_utf8_lossy(&both.stderr).contains("--without-ledger writes none"));
}
