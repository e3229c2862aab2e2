//! Storage faults on a real, size-limited filesystem (a tmpfs mounted by the test; the tests run
//! as root, as CI does): a full disk under the read models, or under the ledger itself, stalls the
//! read models for a while, `/healthz` says so, and once space is freed everything catches up
//! without a restart.
//!
//! "Read-only for a while" is not tested as such: as root, neither `chmod`, `chattr +i` nor a
//! read-only remount can take write access from a file SQLite already holds open (permissions are
//! checked at open; a remount is refused while a file is open for writing). A filesystem with no
//! space left is the fault that reaches an open file, so it stands for both.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::support::{Harness, Server, DEADLINE, OPERATOR_TOKEN, TENANT_A_TOKEN};

/// Big enough for a fresh ledger and read models with their write-ahead logs, small enough to
/// fill in a moment.
const TMPFS_SIZE: &str = "24m";

/// A tmpfs mounted at a fresh directory for one test, unmounted (lazily, so a child still
/// holding a file cannot keep it) when dropped.
struct SmallFilesystem {
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallFilesystem {
    fn mount() -> Self {
        let dir = tempfile::tempdir().expect("a mount point");
        let root = dir.path().to_path_buf();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={TMPFS_SIZE}"), "tmpfs"])
            .arg(&root)
            .output()
            .expect("mount runs");
        assert!(
            mounted.status.success(),
            "these tests mount a small tmpfs and so need root (CI runs as root): {}",
            String::from_utf8_lossy(&mounted.stderr)
        );
        Self { root, _dir: dir }
    }

    /// Writes a filler file until the filesystem has no space left.
    fn fill(&self) {
        use std::io::Write;
        let mut filler = std::fs::File::create(self.filler()).expect("filler created");
        let chunk = vec![0x5a_u8; 64 * 1024];
        loop {
            if filler.write_all(&chunk).is_err() {
                break;
            }
        }
        // Whatever part of the last chunk fit is on the filesystem now; a sync makes sure the
        // space is really taken.
        let _ = filler.sync_all();
    }

    fn free(&self) {
        std::fs::remove_file(self.filler()).expect("filler removed");
    }

    fn filler(&self) -> PathBuf {
        self.root.join("filler")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

impl Drop for SmallFilesystem {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.root).status();
    }
}

/// The harness's configuration with `views` (and `store`, if given) moved to other files.
fn moved_config(harness: &Harness, views: &Path, ledger: Option<&Path>) -> PathBuf {
    let mut text = std::fs::read_to_string(&harness.config).expect("the configuration");
    let views_line = format!(
        "views = \"{}\"",
        harness.dir.path().join("ledger.views").display()
    );
    assert!(text.contains(&views_line), "the views line is in the file");
    text = text.replace(&views_line, &format!("views = \"{}\"", views.display()));
    if let Some(ledger) = ledger {
        let store_line = format!(
            "store = \"sqlite://{}\"",
            harness.dir.path().join("ledger.db").display()
        );
        assert!(text.contains(&store_line), "the store line is in the file");
        text = text.replace(
            &store_line,
            &format!("store = \"sqlite://{}\"", ledger.display()),
        );
    }
    let path = harness.dir.path().join("moved.toml");
    std::fs::write(&path, text).expect("configuration written");
    path
}

/// What the servers of `harness` logged, to show beside a failure.
fn server_log(harness: &Harness) -> String {
    let mut log = String::new();
    for entry in std::fs::read_dir(harness.dir.path()).expect("the harness directory") {
        let path = entry.expect("an entry").path();
        if path
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("serve-"))
            && path.extension().is_some_and(|e| e == "log")
        {
            log.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
    log
}

async fn health(server: &Server) -> (StatusCode, Value) {
    server.call(Method::GET, "/healthz", None, None).await
}

/// Polls `/healthz` until `done` holds for its answer, or fails after `within`.
async fn health_until(
    server: &Server,
    within: Duration,
    what: &str,
    done: impl Fn(StatusCode, &Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        let (status, body) = health(server).await;
        if done(status, &body) {
            return body;
        }
        assert!(
            started.elapsed() < within,
            "/healthz never said {what}; last: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Records and executes one task; returns its id when the ledger took the intent.
async fn create_task(server: &Server, title: &str) -> Option<String> {
    let (status, recorded) = server.record(TENANT_A_TOKEN, "crm", title, None).await;
    if status != StatusCode::CREATED {
        return None;
    }
    let id = recorded["operation_id"].as_str()?.to_owned();
    let _ = server.execute(TENANT_A_TOKEN, &id, 2_000).await;
    Some(id)
}

/// The ids the listing of all operations shows.
async fn listed(server: &Server) -> Vec<String> {
    let (status, page) = server
        .call(
            Method::GET,
            "/v1/operations?limit=1000",
            Some(OPERATOR_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["operations"]
        .as_array()
        .expect("a page of operations")
        .iter()
        .filter_map(|operation| operation["operation_id"].as_str().map(str::to_owned))
        .collect()
}

async fn metric(server: &Server, name: &str) -> f64 {
    let response = reqwest::get(format!("{}/metrics", server.base))
        .await
        .expect("metrics answer");
    let text = response.text().await.expect("metrics text");
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} is not in /metrics:\n{text}"))
}

#[tokio::test]
async fn read_models_on_a_full_disk_report_degraded_and_catch_up_once_space_is_freed() {
    let disk = SmallFilesystem::mount();
    let harness = Harness::new("").await;
    let config = moved_config(&harness, &disk.path("ledger.views"), None);
    let server = harness.serve_with(&config);
    let before = create_task(&server, "before the disk fills")
        .await
        .expect("recorded");

    disk.fill();
    // The ledger is on another disk: every request still succeeds, but the read models cannot
    // write what these operations add.
    let mut during = Vec::new();
    for n in 0..5 {
        during.push(
            create_task(&server, &format!("while the disk is full {n}"))
                .await
                .expect("the ledger is not on the full disk"),
        );
    }
    let degraded = health_until(&server, DEADLINE, "degraded", |status, body| {
        status == StatusCode::SERVICE_UNAVAILABLE && body["status"] == "degraded"
    })
    .await;
    assert_eq!(
        degraded["read_model_runner"]["state"], "retrying",
        "{degraded}"
    );
    let reason = degraded["reason"].as_str().expect("a reason");
    assert!(
        reason.contains("full"),
        "the reason names the fault: {reason}"
    );
    assert!(
        degraded["probe"]
            .as_str()
            .is_some_and(|probe| probe.contains("do not restart")),
        "{degraded}"
    );
    assert_eq!(
        metric(&server, "opledger_read_model_runner_healthy").await,
        0.0
    );

    disk.free();
    let healthy = health_until(&server, DEADLINE, "ok, caught up", |status, body| {
        status == StatusCode::OK && body["status"] == "ok" && body["read_model_lag_positions"] == 0
    })
    .await;
    assert_eq!(healthy["read_model_lag_positions"], 0, "{healthy}");
    assert_eq!(healthy["read_model_runner"]["state"], "running");
    assert!(metric(&server, "opledger_read_model_runner_failures_total").await >= 1.0);
    assert_eq!(
        metric(&server, "opledger_read_model_runner_healthy").await,
        1.0
    );
    let shown = listed(&server).await;
    for id in std::iter::once(&before).chain(&during) {
        assert!(
            shown.contains(id),
            "{id} is listed after the catch-up: {shown:?}"
        );
    }
    // The workers read their work from the read models: the operations recorded while they
    // were stalled are driven to their end, not left where the fault found them.
    for id in &during {
        server
            .wait_for_state(TENANT_A_TOKEN, id, &["succeeded"])
            .await;
    }
}

#[tokio::test]
async fn a_ledger_on_a_full_disk_refuses_writes_and_everything_resumes_once_space_is_freed() {
    let disk = SmallFilesystem::mount();
    let harness = Harness::new("").await;
    let config = moved_config(
        &harness,
        &disk.path("ledger.views"),
        Some(&disk.path("ledger.db")),
    );
    let server = harness.serve_with(&config);
    let mut acknowledged = Vec::new();
    for n in 0..3 {
        acknowledged.push(
            create_task(&server, &format!("before {n}"))
                .await
                .expect("recorded"),
        );
    }

    disk.fill();
    // Keep asking while the disk is full: some answers are refusals, and whatever the ledger
    // acknowledged must be listed in the end.
    let mut refused = 0;
    for n in 0..20 {
        match create_task(&server, &format!("full {n}")).await {
            Some(id) => acknowledged.push(id),
            None => refused += 1,
        }
    }
    assert!(
        refused > 0,
        "a full disk refused no write: the test did not fill it"
    );

    disk.free();
    for n in 0..3 {
        acknowledged.push(
            create_task(&server, &format!("after {n}"))
                .await
                .expect("space is back: recorded"),
        );
    }
    let healthy = health_until(&server, DEADLINE, "ok, caught up", |status, body| {
        status == StatusCode::OK && body["status"] == "ok" && body["read_model_lag_positions"] == 0
    })
    .await;
    assert_eq!(
        healthy["read_model_lag_positions"],
        0,
        "{healthy}\n{}",
        server_log(&harness)
    );
    let shown = listed(&server).await;
    for id in &acknowledged {
        assert!(
            shown.contains(id),
            "{id} was acknowledged but is not listed: {shown:?}"
        );
    }
}

#[tokio::test]
async fn a_trace_while_the_read_models_are_stalled_finds_an_operation_id_and_says_not_yet_for_the_rest(
) {
    let disk = SmallFilesystem::mount();
    let harness = Harness::new("").await;
    let config = moved_config(&harness, &disk.path("ledger.views"), None);
    let server = harness.serve_with(&config);
    disk.fill();
    let id = create_task(&server, "recorded while the read models cannot write")
        .await
        .expect("the ledger is not on the full disk");
    let operation = server
        .wait_for_state(TENANT_A_TOKEN, &id, &["succeeded"])
        .await;
    let external_id = operation["external_id"]
        .as_str()
        .expect("a succeeded operation has its object's id")
        .to_owned();
    health_until(&server, DEADLINE, "degraded", |status, body| {
        status == StatusCode::SERVICE_UNAVAILABLE && body["status"] == "degraded"
    })
    .await;

    let trace = |query: String| {
        let server = &server;
        async move {
            server
                .call(
                    Method::GET,
                    &format!("/v1/trace/{query}"),
                    Some(TENANT_A_TOKEN),
                    None,
                )
                .await
        }
    };
    // The operation id is the ledger's own key: found without the read models.
    let (status, by_operation) = trace(id.clone()).await;
    assert_eq!(status, StatusCode::OK, "{by_operation}");
    assert_eq!(by_operation["operation_id"], id.as_str());
    // The object's id only the read models index: "not yet", never "does not exist".
    let (status, by_object) = trace(external_id.clone()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{by_object}");
    assert_eq!(by_object["error"]["code"], "read_models_behind");
    let message = by_object["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("retry"),
        "the answer says what to do: {message}"
    );

    disk.free();
    health_until(&server, DEADLINE, "ok, caught up", |status, body| {
        status == StatusCode::OK && body["status"] == "ok" && body["read_model_lag_positions"] == 0
    })
    .await;
    let (status, by_object) = trace(external_id).await;
    assert_eq!(status, StatusCode::OK, "{by_object}");
    assert_eq!(by_object["operation_id"], id.as_str());
    let (status, unknown) = trace("no-such-object-731".to_owned()).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "caught up, a miss is a miss: {unknown}"
    );
}
