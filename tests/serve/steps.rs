//! Steps the caller's own code carries out, end to end: the API's record, claim and outcome
//! routes on a real server, and a real Python process guarding a function with `Ledger.step`,
//! killed with SIGKILL after its function ran (the step goes to a person and is never run again)
//! or before it could run (a retry claims it and runs it once).
//!
//! The Python process uses the synchronous client, which needs nothing beyond the standard
//! library, so the machine's `python3` runs it as a user's script would.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::support::{Harness, Server, DEADLINE, TENANT_A_TOKEN, TENANT_B_TOKEN};

/// The claim's lease in these tests: short, so a killed process's step is swept soon.
const LEASE_MS: u64 = 600;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

async fn record_step(server: &Server, key: &str, args: Value) -> (StatusCode, Value) {
    let (status, _, body) = server
        .post_with_headers(
            "/v1/steps",
            TENANT_A_TOKEN,
            &[("idempotency-key", key)],
            &json!({"provider": "billing", "action": "charge", "args": args}),
        )
        .await;
    (status, body)
}

async fn claim(server: &Server, operation_id: &str, body: Value) -> (StatusCode, Value) {
    server
        .post(
            &format!("/v1/operations/{operation_id}/claim"),
            TENANT_A_TOKEN,
            &body,
        )
        .await
}

async fn report(
    server: &Server,
    operation_id: &str,
    attempt_id: &str,
    body: Value,
) -> (StatusCode, Value) {
    server
        .post(
            &format!("/v1/operations/{operation_id}/attempts/{attempt_id}/outcome"),
            TENANT_A_TOKEN,
            &body,
        )
        .await
}

async fn event_types(server: &Server, operation_id: &str) -> Vec<String> {
    let (status, history) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{operation_id}/events"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{history}");
    history["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|event| event["type"].as_str().expect("a type").to_owned())
        .collect()
}

#[tokio::test]
async fn a_step_is_claimed_once_at_a_time_and_settled_by_what_its_caller_reports() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let (status, recorded) = record_step(&server, "order-1", json!({"order": "1"})).await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    assert_eq!(recorded["state"], "pending");
    assert_eq!(recorded["account"], "caller");
    let id = recorded["operation_id"].as_str().expect("an id").to_owned();

    // The same key finds the same step; another tenant cannot see it.
    let (status, again) = record_step(&server, "order-1", json!({"order": "1"})).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["operation_id"], id.as_str());
    let (status, other) = claim_as(&server, TENANT_B_TOKEN, &id).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{other}");

    let (status, claimed) =
        claim(&server, &id, json!({"lease_ms": 30_000, "caller": "job-1"})).await;
    assert_eq!(status, StatusCode::OK, "{claimed}");
    assert_eq!(claimed["idempotency_key"], recorded["idempotency_key"]);
    assert_eq!(claimed["operation"]["state"], "in_flight");
    let attempt = claimed["attempt_id"]
        .as_str()
        .expect("an attempt")
        .to_owned();

    // A second claimer is refused while the lease is live, and told who holds it until when.
    let (status, refused) = claim(&server, &id, json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"]["code"], "claimed");
    let message = refused["error"]["message"].as_str().expect("a message");
    assert!(
        message.contains("in_flight") && message.contains("caller:job-1"),
        "{message}"
    );
    // The same claim again (its answer lost) is the same claim.
    let (status, same) = claim(&server, &id, json!({"attempt_id": attempt})).await;
    assert_eq!(status, StatusCode::OK, "{same}");
    assert_eq!(same["attempt_id"], attempt.as_str());

    let (status, done) = report(
        &server,
        &id,
        &attempt,
        json!({"outcome": "succeeded", "external_id": "inv-1"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["state"], "succeeded");
    assert_eq!(done["external_id"], "inv-1");
    assert!(
        done["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Done") && m.contains("inv-1")),
        "{done}"
    );
    // Settled: nothing to claim, and the state is named.
    let (status, refused) = claim(&server, &id, json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("succeeded")),
        "{refused}"
    );
    // A different result reported afterwards is a detected duplicate; the success stands.
    let (status, duplicate) = report(
        &server,
        &id,
        &attempt,
        json!({"outcome": "succeeded", "external_id": "inv-2"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{duplicate}");
    assert_eq!(duplicate["external_id"], "inv-1");
    assert_eq!(duplicate["duplicates"], json!(["inv-2"]));
}

async fn claim_as(server: &Server, token: &str, operation_id: &str) -> (StatusCode, Value) {
    server
        .post(
            &format!("/v1/operations/{operation_id}/claim"),
            token,
            &json!({}),
        )
        .await
}

#[tokio::test]
async fn a_lapsed_claim_goes_to_a_person_and_a_late_success_settles_it() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let (_, recorded) = record_step(&server, "order-2", json!({"order": "2"})).await;
    let id = recorded["operation_id"].as_str().expect("an id").to_owned();
    let (status, claimed) = claim(&server, &id, json!({"lease_ms": LEASE_MS})).await;
    assert_eq!(status, StatusCode::OK, "{claimed}");
    let attempt = claimed["attempt_id"]
        .as_str()
        .expect("an attempt")
        .to_owned();

    let review = server
        .wait_for_state(TENANT_A_TOKEN, &id, &["needs_review"])
        .await;
    assert!(
        review["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("the caller's process stopped reporting")),
        "{review}"
    );
    assert!(
        review["review_reason"]
            .as_str()
            .is_some_and(|r| r.contains("caller's own code")),
        "{review}"
    );
    assert!(
        review["message"]
            .as_str()
            .is_some_and(|m| m.contains("a person is checking") && !m.contains("Done")),
        "{review}"
    );
    let (status, refused) = claim(&server, &id, json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");

    let (status, late) = report(
        &server,
        &id,
        &attempt,
        json!({"outcome": "succeeded", "external_id": "inv-2"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{late}");
    assert_eq!(late["state"], "succeeded");
    assert_eq!(late["external_id"], "inv-2");
    assert_eq!(
        event_types(&server, &id).await,
        [
            "IntentRecorded",
            "AttemptStarted",
            "LeaseExpired",
            "ReviewRequired",
            "LateResponseReceived"
        ]
    );
}

#[tokio::test]
async fn a_reported_failure_is_rejected_when_nothing_applied_and_a_persons_when_it_may_have() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    for (key, applied, state) in [
        ("order-3", "no", "rejected"),
        ("order-4", "unknown", "needs_review"),
    ] {
        let (_, recorded) = record_step(&server, key, json!({"order": key})).await;
        let id = recorded["operation_id"].as_str().expect("an id").to_owned();
        let (_, claimed) = claim(&server, &id, json!({})).await;
        let attempt = claimed["attempt_id"].as_str().expect("an attempt");
        let (status, reported) = report(
            &server,
            &id,
            attempt,
            json!({"outcome": "failed", "applied": applied, "code": "CardDeclined", "message": "declined"}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{reported}");
        assert_eq!(reported["state"], state, "{reported}");
    }
}

#[tokio::test]
async fn steps_and_connectors_never_take_each_others_part() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    // A step may not name a configured connector.
    let (status, _, refused) = server
        .post_with_headers(
            "/v1/steps",
            TENANT_A_TOKEN,
            &[],
            &json!({"provider": "crm", "action": "create_task", "args": {"title": "x"}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("connector")),
        "{refused}"
    );
    // A connector's operation is neither claimed nor reported by a caller.
    let recorded = server.record_for_approval(TENANT_A_TOKEN, "a task").await;
    let id = recorded["operation_id"].as_str().expect("an id");
    let (status, refused) = claim(&server, id, json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    let (status, refused) = report(
        &server,
        id,
        "00000000-0000-4000-8000-000000000001",
        json!({"outcome": "succeeded", "external_id": "731"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("connector")),
        "{refused}"
    );
    // A report needs what its outcome needs, named.
    let (_, step) = record_step(&server, "order-5", json!({"order": "5"})).await;
    let step_id = step["operation_id"].as_str().expect("an id");
    let (status, refused) = report(
        &server,
        step_id,
        "00000000-0000-4000-8000-000000000001",
        json!({"outcome": "failed"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("applied")),
        "{refused}"
    );
}

/// A run of `tests/serve/step_process.py` in `mode`, counting the function's runs in `runs`.
fn step_process(server: &Server, mode: &str, runs: &Path) -> Child {
    Command::new("python3")
        .arg(repo().join("tests/serve/step_process.py"))
        .args([mode, runs.to_str().expect("a UTF-8 path")])
        .env("PYTHONPATH", repo().join("adapters/python-client"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("OPLEDGER_BASE_URL", &server.base)
        .env("OPLEDGER_TOKEN", TENANT_A_TOKEN)
        .env("STEP_LEASE_MS", LEASE_MS.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 runs")
}

/// Waits until `child` prints `line`, then kills it with SIGKILL.
fn kill_after(mut child: Child, line: &str) {
    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, printed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let started = Instant::now();
    loop {
        let got = printed
            .recv_timeout(DEADLINE.saturating_sub(started.elapsed()))
            .unwrap_or_else(|error| panic!("the step process never printed `{line}` ({error})"));
        if got == line {
            break;
        }
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
}

/// Runs the step process to its end and returns what it printed.
fn finished(child: Child) -> String {
    let output = child.wait_with_output().expect("the step process ends");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).expect("UTF-8")
}

fn function_runs(runs: &Path) -> usize {
    std::fs::read_to_string(runs).map_or(0, |text| text.lines().count())
}

#[tokio::test]
async fn a_process_killed_after_its_function_ran_leaves_the_step_to_a_person_and_a_retry_never_runs_it_again(
) {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let runs = harness.dir.path().join("runs-after.log");
    kill_after(step_process(&server, "hang-after-run", &runs), "ran");
    assert_eq!(function_runs(&runs), 1);

    let step = wait_for_listed_step(&server).await;
    let id = step["operation_id"].as_str().expect("an id").to_owned();
    let review = server
        .wait_for_state(TENANT_A_TOKEN, &id, &["needs_review"])
        .await;
    assert!(
        review["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("stopped reporting")),
        "{review}"
    );

    // The same call again: the process is told the step is not confirmed; the function stays
    // run once.
    let printed = finished(step_process(&server, "run", &runs));
    assert_eq!(printed.trim(), "error StepNotConfirmed needs_review");
    assert_eq!(function_runs(&runs), 1);
}

#[tokio::test]
async fn a_process_killed_before_its_function_ran_leaves_the_step_to_a_retry_that_runs_it_once() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let runs = harness.dir.path().join("runs-before.log");
    kill_after(
        step_process(&server, "hang-before-claim", &runs),
        "recorded",
    );
    assert_eq!(function_runs(&runs), 0);
    let step = wait_for_listed_step(&server).await;
    let id = step["operation_id"].as_str().expect("an id").to_owned();
    let (_, pending) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{id}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(pending["state"], "pending", "{pending}");

    let printed = finished(step_process(&server, "run", &runs));
    assert_eq!(printed.trim(), "result inv-A-1");
    assert_eq!(function_runs(&runs), 1);
    // The key the function was given is the step's own.
    let key = std::fs::read_to_string(&runs).expect("the runs");
    assert_eq!(
        key.trim(),
        pending["idempotency_key"].as_str().expect("a key")
    );

    // Once more: the recorded outcome, without running the function.
    let printed = finished(step_process(&server, "run", &runs));
    assert_eq!(printed.trim(), "result inv-A-1");
    assert_eq!(function_runs(&runs), 1);
    let done = server
        .wait_for_state(TENANT_A_TOKEN, &id, &["succeeded"])
        .await;
    assert_eq!(done["external_id"], "inv-A-1");
}

/// The one step the test's process recorded, once the listing shows it.
async fn wait_for_listed_step(server: &Server) -> Value {
    let started = Instant::now();
    loop {
        let (status, page) = server
            .call(
                Method::GET,
                "/v1/operations?provider=billing",
                Some(TENANT_A_TOKEN),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        if let Some(step) = page["operations"].as_array().and_then(|rows| rows.first()) {
            return step.clone();
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the step was never listed: {page}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
