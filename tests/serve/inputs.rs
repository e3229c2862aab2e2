//! Every bad input gets a clear 4xx in the one error shape, and nothing is written.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{Harness, TENANT_A_TOKEN};

fn assert_error(status: StatusCode, body: &Value, expected: StatusCode, code: &str, what: &str) {
    assert_eq!(status, expected, "{what}: {body}");
    assert_eq!(body["error"]["code"], code, "{what}: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.len() > 10),
        "{what}: the message must say what is wrong: {body}"
    );
}

#[tokio::test]
async fn bad_requests_are_refused_with_a_clear_error_and_write_nothing() {
    let harness = Harness::new("max_body_bytes = 4096").await;
    let server = harness.serve();
    let (_, existing) = server.record(TENANT_A_TOKEN, "crm", "kept", None).await;
    let id = existing["operation_id"].as_str().expect("id").to_owned();
    // The workers send it; once it has settled, only a bad request could move the log.
    server
        .wait_for_state(TENANT_A_TOKEN, &id, &["succeeded"])
        .await;
    let head = server.log_head().await;
    let valid = json!({"provider": "crm", "account": "acct-1", "action": "create_task", "args": {"title": "x"}});
    let with = |key: &str, value: Value| {
        let mut body = valid.clone();
        body[key] = value;
        body
    };
    let cases: Vec<(&str, Vec<u8>, StatusCode, &str)> = vec![
        (
            "malformed JSON",
            b"{\"provider\": ".to_vec(),
            StatusCode::BAD_REQUEST,
            "malformed_json",
        ),
        (
            "not JSON at all",
            b"provider=crm".to_vec(),
            StatusCode::BAD_REQUEST,
            "malformed_json",
        ),
        (
            "a wrong type",
            with("args", json!("a string")).to_string().into_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "a number for text",
            with("provider", json!(7)).to_string().into_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "an unknown field",
            with("priority", json!("high")).to_string().into_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "a missing field",
            json!({"provider": "crm"}).to_string().into_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "an unknown provider",
            with("provider", json!("salesforce"))
                .to_string()
                .into_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "an unknown account",
            with("account", json!("acct-9")).to_string().into_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "an empty action",
            with("action", json!("")).to_string().into_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "an oversized body",
            with("args", json!({"text": "x".repeat(8_000)}))
                .to_string()
                .into_bytes(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
        ),
    ];
    for (what, body, expected, code) in cases {
        let (status, answer) = server
            .call_raw("/v1/operations", TENANT_A_TOKEN, body)
            .await;
        assert_error(status, &answer, expected, code, what);
    }
    // A new user's first try put `execute` in the body: the refusal says where it goes.
    let (status, answer) = server
        .call_raw(
            "/v1/operations",
            TENANT_A_TOKEN,
            with("execute", json!(true)).to_string().into_bytes(),
        )
        .await;
    assert_error(
        status,
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_input",
        "execute in the body",
    );
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("`execute` is a query parameter")
            && message.contains("/v1/operations?execute=true"),
        "{message}"
    );
    let gets: Vec<(String, StatusCode, &str)> = vec![
        (
            "/v1/operations?limit=0".into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "/v1/operations?limit=1001".into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "/v1/operations?state=exploded".into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "/v1/operations?older_than=-3d".into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "/v1/operations?colour=red".into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "/v1/operations/not-a-uuid".into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "/v1/events?types=everything".into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "/v1/events?after=minus-one".into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        ),
        (
            "/v1/nothing-here".into(),
            StatusCode::NOT_FOUND,
            "no_such_route",
        ),
        (
            "/v1/operations/%FF".into(),
            StatusCode::BAD_REQUEST,
            "invalid_path",
        ),
    ];
    for (path, expected, code) in gets {
        let (status, answer) = server
            .call(Method::GET, &path, Some(TENANT_A_TOKEN), None)
            .await;
        assert_error(status, &answer, expected, code, &path);
    }
    for wait in ["-1", "soon", "999999999"] {
        let path = format!("/v1/operations/{id}/execute?wait_ms={wait}");
        let (status, answer) = server
            .call(Method::POST, &path, Some(TENANT_A_TOKEN), None)
            .await;
        assert_error(
            status,
            &answer,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            &path,
        );
    }
    let bad_approvals = [
        json!({"approver": "", "args_hash": existing["args_hash"]}),
        json!({"approver": "boss", "args_hash": "md5:abc"}),
        json!({"approver": "boss"}),
    ];
    for body in bad_approvals {
        let (status, answer) = server
            .post(
                &format!("/v1/operations/{id}/approve"),
                TENANT_A_TOKEN,
                &body,
            )
            .await;
        assert_error(
            status,
            &answer,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            &body.to_string(),
        );
    }
    let (status, answer) = server.call(Method::GET, "/v1/operations", None, None).await;
    assert_error(
        status,
        &answer,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "no token",
    );
    let (status, answer) = server
        .call(
            Method::GET,
            "/v1/operations",
            Some("not-a-known-token-at-all"),
            None,
        )
        .await;
    assert_error(
        status,
        &answer,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "unknown token",
    );
    let (status, answer) = server
        .call(Method::DELETE, "/v1/operations", Some(TENANT_A_TOKEN), None)
        .await;
    assert_error(
        status,
        &answer,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "DELETE",
    );

    assert_eq!(
        server.log_head().await,
        head,
        "a refused request wrote to the ledger"
    );
    assert_eq!(harness.objects().await.len(), 1);
}

#[tokio::test]
async fn every_documented_route_is_served() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let (status, spec) = server
        .call(Method::GET, "/v1/openapi.json", None, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let id = "00000000-0000-4000-8000-000000000000";
    for (path, methods) in spec["paths"].as_object().expect("paths") {
        for method in methods.as_object().expect("methods").keys() {
            if path == "/v1/events" {
                continue; // a stream; tests/serve/stream.rs covers it
            }
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
            let concrete = path.replace("{id}", id);
            let (status, body) = server
                .call(
                    method.clone(),
                    &concrete,
                    Some(TENANT_A_TOKEN),
                    Some(&json!({})),
                )
                .await;
            assert_ne!(body["error"]["code"], "no_such_route", "{method} {path}");
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        }
    }
}

#[tokio::test]
async fn arguments_over_their_own_limit_are_refused_even_when_the_body_fits() {
    let harness = Harness::new("max_body_bytes = 1048576").await;
    let server = harness.serve();
    let body = json!({"provider": "crm", "account": "acct-1", "action": "create_task",
        "args": {"text": "x".repeat(100_000)}});
    let (status, answer) = server.post("/v1/operations", TENANT_A_TOKEN, &body).await;
    assert_error(
        status,
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_input",
        "100 KB of arguments",
    );
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("args")),
        "{answer}"
    );
    assert_eq!(server.log_head().await, 0);
}

#[tokio::test]
async fn execute_calls_are_bounded_and_a_refused_one_writes_nothing() {
    use opledger_crm_stand::{FaultKind, Shape};
    let harness = Harness::new("max_concurrent_executes = 1").await;
    let server = harness.serve();
    harness
        .fault(Shape::Keyed, FaultKind::LateResponse { delay_ms: 5_000 }, 1)
        .await;
    let (_, slow) = server.record(TENANT_A_TOKEN, "crm", "slow", None).await;
    let slow_id = slow["operation_id"].as_str().expect("id").to_owned();
    let path = format!(
        "{}/v1/operations/{slow_id}/execute?wait_ms=10000",
        server.base
    );
    let holding = tokio::spawn(async move {
        reqwest::Client::new()
            .post(path)
            .bearer_auth(TENANT_A_TOKEN)
            .send()
            .await
            .map(|response| response.status())
    });
    // Wait until the slow send holds the one place (the stand has the task, its answer held).
    let started = std::time::Instant::now();
    while harness.objects().await.is_empty() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the send never arrived"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let head = server.log_head().await;
    let body = json!({"provider": "crm", "account": "acct-1", "action": "create_task",
        "args": {"title": "second"}});
    let (status, refused) = server
        .post("/v1/operations?execute=true", TENANT_A_TOKEN, &body)
        .await;
    assert_error(
        status,
        &refused,
        StatusCode::SERVICE_UNAVAILABLE,
        "too_many_executes",
        "a second execute while the first holds the only place",
    );
    assert_eq!(
        server.log_head().await,
        head,
        "the refused call recorded nothing"
    );
    assert_eq!(
        holding.await.expect("task").expect("answered"),
        StatusCode::OK
    );
    let (status, done) = server
        .post("/v1/operations?execute=true", TENANT_A_TOKEN, &body)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{done}");
}

#[test]
fn a_bad_configuration_is_refused_with_its_file_line_and_field_before_anything_opens() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("serve.toml");
    let ledger = dir.path().join("ledger.db");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nstore = \"sqlite://{}\"\n\n[[tenants]]\nid = \"acme\"\ntoken_env = \"OPLEDGER_TEST_UNSET_TOKEN\"\n",
            ledger.display()
        ),
    )
    .expect("written");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["serve", "--config"])
        .arg(&config)
        .env_remove("OPLEDGER_TEST_UNSET_TOKEN")
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("serve.toml:6: tenants[0].token_env:")
            && stderr.contains("OPLEDGER_TEST_UNSET_TOKEN"),
        "{stderr}"
    );
    assert!(!ledger.exists(), "nothing was opened");
}

#[tokio::test]
async fn metrics_ask_for_their_own_token_when_one_is_configured() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nstore = \"sqlite://{}\"\n\n[metrics]\ntoken = \"scraper-0123456789abcdef\"\n\n[[tenants]]\nid = \"acme\"\ntoken = \"{TENANT_A_TOKEN}\"\n",
            dir.path().join("ledger.db").display()
        ),
    )
    .expect("written");
    let server = crate::support::Server::start_with(
        &["serve", "--config", &config.display().to_string()],
        dir.path(),
    );
    let (status, body) = server.call(Method::GET, "/metrics", None, None).await;
    assert_error(
        status,
        &body,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "no token",
    );
    let (status, _) = server
        .call(Method::GET, "/metrics", Some(TENANT_A_TOKEN), None)
        .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a tenant token is not the scraper's"
    );
    let response = reqwest::Client::new()
        .get(format!("{}/metrics", server.base))
        .bearer_auth("scraper-0123456789abcdef")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response
        .text()
        .await
        .expect("text")
        .contains("opledger_operations{state=\"pending\"} 0"));
    let (status, _) = server.call(Method::GET, "/healthz", None, None).await;
    assert_eq!(status, StatusCode::OK, "health stays open for probes");
}
