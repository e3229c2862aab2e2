//! The API's own idempotency: `POST /v1/operations` takes an `Idempotency-Key` header with
//! Stripe's semantics. The key is the request's source id, scoped to the tenant: the same key and
//! body find the operation the first request recorded (and say so in `Idempotent-Replayed`),
//! the same key with another body is refused, and nothing reaches the CRM twice.

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::support::{Harness, Server, ACCOUNT, TENANT_A_TOKEN, TENANT_B_TOKEN};

const EXECUTE: &str = "/v1/operations?execute=true&wait_ms=5000";

fn create_task(title: &str) -> Value {
    json!({"provider": "crm", "account": ACCOUNT, "action": "create_task", "args": {"title": title}})
}

async fn keyed(
    server: &Server,
    token: &str,
    key: &str,
    body: &Value,
) -> (StatusCode, Option<String>, Value) {
    let (status, headers, answer) = server
        .post_with_headers(EXECUTE, token, &[("Idempotency-Key", key)], body)
        .await;
    let replayed = headers
        .get("idempotent-replayed")
        .map(|value| value.to_str().expect("ASCII").to_owned());
    (status, replayed, answer)
}

#[tokio::test]
async fn the_same_key_with_the_same_body_answers_the_first_operation_and_sends_nothing_again() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let body = create_task("Call the client");
    let (status, replayed, first) = keyed(&server, TENANT_A_TOKEN, "key-1", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(replayed, None, "a first request is no replay");
    assert_eq!(first["state"], "succeeded", "{first}");
    assert_eq!(first["source_id"], "key-1", "the key is the source id");
    let requests = harness.admin.requests().await.expect("the request log");

    let (status, replayed, again) = keyed(&server, TENANT_A_TOKEN, "key-1", &body).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(replayed.as_deref(), Some("true"));
    assert_eq!(again["operation_id"], first["operation_id"]);
    assert_eq!(again["external_id"], first["external_id"]);
    assert_eq!(again["created"], false);

    // The key and the source id are one name: the same value in the body is the same request.
    let mut with_source = body.clone();
    with_source["source_id"] = json!("key-1");
    let (status, _, same) = keyed(&server, TENANT_A_TOKEN, "key-1", &with_source).await;
    assert_eq!(status, StatusCode::OK, "{same}");
    assert_eq!(same["operation_id"], first["operation_id"]);

    assert_eq!(
        harness.admin.requests().await.expect("the request log"),
        requests,
        "no replay reached the CRM"
    );
    assert_eq!(harness.objects().await.len(), 1, "one task");
}

#[tokio::test]
async fn the_same_key_with_another_body_is_refused_and_records_nothing() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let (status, _, first) = keyed(
        &server,
        TENANT_A_TOKEN,
        "key-2",
        &create_task("Call the client"),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{first}");

    let (status, replayed, other) = keyed(
        &server,
        TENANT_A_TOKEN,
        "key-2",
        &create_task("Email the client"),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{other}");
    assert_eq!(replayed, None);
    assert_eq!(other["error"]["code"], "idempotency_key_reused", "{other}");
    let message = other["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("Idempotency-Key"), "{message}");
    assert!(message.contains("new key"), "says what to do: {message}");

    // Another owner is another request too (Stripe compares the whole body).
    let mut owned = create_task("Call the client");
    owned["owner"] = json!("someone-else");
    let (status, _, owner) = keyed(&server, TENANT_A_TOKEN, "key-2", &owned).await;
    assert_eq!(status, StatusCode::CONFLICT, "{owner}");
    assert_eq!(owner["error"]["code"], "idempotency_key_reused", "{owner}");
    assert_eq!(
        harness.objects().await.len(),
        1,
        "only the first request's task"
    );
}

#[tokio::test]
async fn a_key_belongs_to_its_tenant() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let body = create_task("Call the client");
    let (status, _, a) = keyed(&server, TENANT_A_TOKEN, "shared-key", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{a}");
    let (status, replayed, b) = keyed(&server, TENANT_B_TOKEN, "shared-key", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{b}");
    assert_eq!(replayed, None);
    assert_ne!(a["operation_id"], b["operation_id"]);
    assert_eq!(harness.objects().await.len(), 2, "one task per tenant");
}

#[tokio::test]
async fn a_key_and_a_different_source_id_in_one_request_are_refused() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let mut body = create_task("Call the client");
    body["source_id"] = json!("toolcall-9");
    let (status, _, refused) = keyed(&server, TENANT_A_TOKEN, "key-9", &body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("Idempotency-Key"), "{message}");
    assert!(
        harness.objects().await.is_empty(),
        "nothing recorded or sent"
    );
}
