//! Limits the server promises and the document states: `wait_ms` is an upper bound even while a
//! send hangs, `/metrics` stays bounded whatever unauthenticated clients send, and each bound the
//! OpenAPI document declares is exactly where the server starts refusing.

use std::time::{Duration, Instant};

use opledger_crm_stand::{FaultKind, Shape};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::contract;
use crate::support::{Harness, Server, ACCOUNT, TENANT_A_TOKEN};

/// Well under the providers' 2 s request timeout in the harness, well over an answer at once: a
/// call that waited for the hung send could not answer within it.
const ANSWER_BOUND: Duration = Duration::from_millis(1_500);
/// How long the stand holds the hung sends' answers (the request is applied at once): past the
/// 2 s request timeout, so each send ends unknown, and short enough that the keyed lookups, which
/// hear "in progress" and look again every second, find the object before the harness's budget
/// of 5 lookups is spent (a longer hold rightly ends in review).
const HELD_MS: u64 = 3_500;

#[tokio::test]
async fn an_execute_answers_at_its_wait_while_the_send_hangs_and_the_send_is_still_recorded() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    harness
        .fault(
            Shape::Keyed,
            FaultKind::LateResponse { delay_ms: HELD_MS },
            2,
        )
        .await;

    // Recorded and executed in one call, with no wait at all.
    let body = json!({"provider": "crm", "account": ACCOUNT, "action": "create_task",
        "args": {"title": "hung one-call"}});
    let started = Instant::now();
    let (status, one_call) = server
        .post(
            "/v1/operations?execute=true&wait_ms=0",
            TENANT_A_TOKEN,
            &body,
        )
        .await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::CREATED, "{one_call}");
    assert!(
        took < ANSWER_BOUND,
        "wait_ms=0 answered after {took:?}: {one_call}"
    );
    assert_in_flight(&one_call);

    // Recorded, then executed with a short wait.
    let (status, recorded) = server
        .record(TENANT_A_TOKEN, "crm", "hung two-call", None)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    let id = recorded["operation_id"].as_str().expect("an id");
    let started = Instant::now();
    let (status, executed) = server.execute(TENANT_A_TOKEN, id, 200).await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::OK, "{executed}");
    assert!(
        took < ANSWER_BOUND,
        "wait_ms=200 answered after {took:?}: {executed}"
    );
    assert_in_flight(&executed);

    // The sends went on after the answers: each ends confirmed (the timeout made it unknown, the
    // keyed lookup found the object), with exactly one object each at the CRM.
    for operation in [&one_call, &executed] {
        let id = operation["operation_id"].as_str().expect("an id");
        let settled = server
            .wait_for_state(TENANT_A_TOKEN, id, &["succeeded"])
            .await;
        assert!(settled["external_id"].is_string(), "{settled}");
    }
    assert_eq!(harness.objects().await.len(), 2);
}

#[track_caller]
fn assert_in_flight(answer: &Value) {
    assert_eq!(answer["state"], "in_flight", "{answer}");
    assert_eq!(answer["attempts"], 1, "{answer}");
    let message = answer["message"].as_str().unwrap_or_default();
    assert!(message.contains("not confirmed it yet"), "{answer}");
}

/// The request series of a Prometheus text page (the ledger's own follow the read models, which
/// may still be applying the intent recorded above).
fn series(page: &str) -> Vec<String> {
    page.lines()
        .filter(|line| line.starts_with("opledger_http_"))
        .map(|line| {
            line.rsplit_once(' ')
                .map_or(line, |(name, _)| name)
                .to_owned()
        })
        .collect()
}

async fn metrics_page(server: &Server) -> String {
    let response = reqwest::get(format!("{}/metrics", server.base))
        .await
        .expect("the server answers");
    assert_eq!(response.status(), StatusCode::OK);
    response.text().await.expect("a page")
}

#[tokio::test]
async fn invented_methods_and_unknown_paths_add_at_most_a_few_series_to_metrics() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    // Every route once, so the page holds what a server in use holds.
    let (_, recorded) = server.record(TENANT_A_TOKEN, "crm", "counted", None).await;
    assert!(recorded["operation_id"].is_string(), "{recorded}");
    let _ = metrics_page(&server).await;
    let before = series(&metrics_page(&server).await);

    for n in 0..250 {
        let method = Method::from_bytes(format!("M{n}").as_bytes()).expect("a method token");
        let (status, _) = server.call(method.clone(), "/healthz", None, None).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        let (status, _) = server
            .call(method, &format!("/invented/{n}"), None, None)
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, _) = server
            .call(Method::GET, &format!("/v1/nothing-{n}"), None, None)
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    let page = metrics_page(&server).await;
    let after = series(&page);
    // Three new label sets at most — (other, /healthz, 405), (other, other, 404) and
    // (GET, other, 404) — each a counter and one histogram (its buckets, +Inf, sum and count).
    let per_label_set = 1 + 14 + 3;
    println!("series before {}, after {}", before.len(), after.len());
    assert!(
        after.len() <= before.len() + 3 * per_label_set,
        "{} series before, {} after 750 invented requests:\n{page}",
        before.len(),
        after.len()
    );
    assert!(!page.contains("M1"), "{page}");
    assert!(!page.contains("nothing-"), "{page}");
    // Every state shown is one the API names.
    let states = contract::document()["components"]["schemas"]["State"]["enum"]
        .as_array()
        .expect("the document's states")
        .clone();
    for line in page
        .lines()
        .filter(|line| line.starts_with("opledger_operations{"))
    {
        let state = line
            .split("state=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("a state label");
        assert!(states.contains(&json!(state)), "{line}");
    }
}

/// A number the document declares at `pointer` (a JSON pointer into it).
fn declared(pointer: &str) -> i64 {
    contract::document()
        .pointer(pointer)
        .and_then(Value::as_i64)
        .unwrap_or_else(|| panic!("the document declares no number at {pointer}"))
}

/// The schema of parameter `name` of `method path`.
fn parameter(path: &str, method: &str, name: &str) -> Value {
    contract::document()["paths"][path][method]["parameters"]
        .as_array()
        .and_then(|parameters| parameters.iter().find(|p| p["name"] == name))
        .map(|parameter| parameter["schema"].clone())
        .unwrap_or_else(|| panic!("{method} {path} has no parameter {name}"))
}

#[tokio::test]
async fn every_documented_bound_is_where_the_server_starts_refusing() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let waiting = server.record_for_approval(TENANT_A_TOKEN, "bounds").await;
    let id = waiting["operation_id"].as_str().expect("an id").to_owned();

    // wait_ms, on both routes: its bounds are taken, one past them is refused.
    let wait = parameter("/v1/operations/{id}/execute", "post", "wait_ms");
    let (min, max) = (
        wait["minimum"].as_i64().expect("min"),
        wait["maximum"].as_i64().expect("max"),
    );
    assert_eq!(parameter("/v1/operations", "post", "wait_ms"), wait);
    for (value, taken) in [(min - 1, false), (min, true), (max, true), (max + 1, false)] {
        // Awaiting approval: an execute has nothing to do and answers at once.
        let path = format!("/v1/operations/{id}/execute?wait_ms={value}");
        let (status, _) = server
            .call(Method::POST, &path, Some(TENANT_A_TOKEN), None)
            .await;
        assert_eq!(status == StatusCode::OK, taken, "{path}: {status}");
        if !taken {
            let body = json!({"provider": "crm", "account": ACCOUNT, "action": "create_task",
                "args": {"title": "never"}});
            let path = format!("/v1/operations?execute=true&wait_ms={value}");
            let (status, _) = server.post(&path, TENANT_A_TOKEN, &body).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}");
        }
    }

    // limit, on both listings.
    for (path, token) in [
        ("/v1/operations", TENANT_A_TOKEN),
        ("/v1/review", crate::support::OPERATOR_TOKEN),
    ] {
        let limit = parameter(path, "get", "limit");
        let (min, max) = (
            limit["minimum"].as_i64().expect("min"),
            limit["maximum"].as_i64().expect("max"),
        );
        for (value, taken) in [(min - 1, false), (min, true), (max, true), (max + 1, false)] {
            let query = format!("{path}?limit={value}");
            let (status, _) = server.call(Method::GET, &query, Some(token), None).await;
            assert_eq!(status == StatusCode::OK, taken, "{query}: {status}");
        }
    }

    // older_than's pattern and the state enum.
    for (query, taken) in [
        ("older_than=10m", true),
        ("older_than=500ms", true),
        ("older_than=10x", false),
        ("older_than=m", false),
        ("state=needs_review", true),
        ("state=new", false),
    ] {
        let path = format!("/v1/operations?{query}");
        let (status, _) = server
            .call(Method::GET, &path, Some(TENANT_A_TOKEN), None)
            .await;
        assert_eq!(status == StatusCode::OK, taken, "{path}: {status}");
    }

    // The trace id's length.
    let most = declared("/paths/~1v1~1trace~1{id}/get/parameters/0/schema/maxLength") as usize;
    for (length, taken) in [(most, true), (most + 1, false)] {
        let path = format!("/v1/trace/{}", "t".repeat(length));
        let (status, _) = server
            .call(Method::GET, &path, Some(TENANT_A_TOKEN), None)
            .await;
        // Taken: looked for (and not found); refused: 422.
        let expected = if taken {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::UNPROCESSABLE_ENTITY
        };
        assert_eq!(status, expected, "trace id of {length} bytes");
    }

    // Bodies: the server takes exactly what the document's request schema takes.
    let text_most = declared("/components/schemas/TextId/maxLength") as usize;
    let note_most = declared("/components/schemas/Note/maxLength") as usize;
    let record = |field: &str, value: Value| {
        let mut body = json!({"provider": "crm", "account": ACCOUNT, "action": "create_task",
            "args": {"title": "a bound"}, "requires_approval": true});
        body[field] = value;
        body
    };
    let mut records = Vec::new();
    for field in ["source_id", "owner"] {
        for value in [
            json!("s".repeat(text_most)),
            json!("s".repeat(text_most + 1)),
            json!(""),
            json!("   "),
            json!("tab\there"),
            json!(7),
        ] {
            records.push(record(field, value));
        }
    }
    records.push(record("unknown_field", json!(true)));
    for (n, mut body) in records.into_iter().enumerate() {
        if body["source_id"]
            .as_str()
            .is_some_and(|s| s.len() == text_most)
        {
            // Unique per case, still at the bound.
            body["source_id"] = json!(format!("{n:0>width$}", width = text_most));
        }
        let documented = contract::request_is_valid("RecordRequest", &body);
        let (status, answer) = server.post("/v1/operations", TENANT_A_TOKEN, &body).await;
        assert_eq!(status.is_success(), documented, "{body}: {status} {answer}");
        if !documented {
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
        }
    }

    // args_hash's pattern, and the deny reason's length.
    let hash = waiting["args_hash"].as_str().expect("a hash").to_owned();
    let hex = hash.trim_start_matches("sha256:");
    for bad in [
        format!("sha256:{}", &hex[1..]),
        format!("sha256:{hex}0"),
        format!("sha256:{}", hex.to_uppercase()),
        format!("SHA256:{hex}"),
        hex.to_owned(),
    ] {
        let body = json!({"approver": "boss", "args_hash": bad});
        assert!(
            !contract::request_is_valid("ApproveRequest", &body),
            "{body}"
        );
        let (status, _) = server
            .post(
                &format!("/v1/operations/{id}/approve"),
                TENANT_A_TOKEN,
                &body,
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    }
    let too_long =
        json!({"approver": "boss", "args_hash": hash, "reason": "r".repeat(note_most + 1)});
    assert!(!contract::request_is_valid("DenyRequest", &too_long));
    let (status, _) = server
        .post(
            &format!("/v1/operations/{id}/deny"),
            TENANT_A_TOKEN,
            &too_long,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let at_most = json!({"approver": "boss", "args_hash": hash, "reason": "r".repeat(note_most)});
    assert!(contract::request_is_valid("DenyRequest", &at_most));
    let (status, denied) = server
        .post(
            &format!("/v1/operations/{id}/deny"),
            TENANT_A_TOKEN,
            &at_most,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{denied}");

    // A review decision: external_id exactly with confirm.
    for (body, documented) in [
        (json!({"decision": "confirm", "note": "found"}), false),
        (
            json!({"decision": "retry", "external_id": "731", "note": "x"}),
            false,
        ),
        (
            json!({"decision": "abandon", "external_id": "731", "note": "x"}),
            false,
        ),
        (json!({"decision": "later", "note": "x"}), false),
    ] {
        assert_eq!(
            contract::request_is_valid("ReviewRequest", &body),
            documented,
            "{body}"
        );
        let (status, _) = server
            .post(
                &format!("/v1/operations/{id}/review"),
                crate::support::OPERATOR_TOKEN,
                &body,
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    }
}
