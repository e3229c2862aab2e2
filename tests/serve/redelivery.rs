//! A redelivered tool call after the configuration changed: it answers the operation it
//! recorded (200, `created: false`), whatever changed — the account's token rotated, the account
//! removed — and sends nothing; only a new request needs the provider and account configured,
//! and the same source id with other arguments stays refused.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::support::{Harness, Server, ACCOUNT, TENANT_A_TOKEN};

/// The token the harness's configuration gives [`ACCOUNT`] (as the stand knows it).
const CONFIGURED_TOKEN: &str = "token-acct-1";

fn tool_call(source_id: &str, title: &str) -> Value {
    json!({
        "provider": "crm", "account": ACCOUNT, "action": "create_task",
        "args": {"title": title}, "source_id": source_id,
    })
}

async fn deliver(server: &Server, body: &Value) -> (StatusCode, Value) {
    server
        .call(
            Method::POST,
            "/v1/operations?execute=true&wait_ms=5000",
            Some(TENANT_A_TOKEN),
            Some(body),
        )
        .await
}

/// Rewrites the harness's configuration, replacing `from` with `to`, and starts a server on it.
fn restart_with(harness: &Harness, server: Server, from: &str, to: &str) -> Server {
    let (code, printed) = server.terminate();
    assert_eq!(code, Some(0), "{printed:?}");
    let text = std::fs::read_to_string(&harness.config).expect("the configuration reads");
    assert!(text.contains(from), "{from} is in the configuration");
    std::fs::write(&harness.config, text.replace(from, to)).expect("the configuration is written");
    harness.serve()
}

#[tokio::test]
async fn a_tool_call_redelivered_after_the_token_rotated_and_the_account_was_removed_finds_its_operation(
) {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let call = tool_call("toolcall-rotated", "Call the client");
    let (status, first) = deliver(&server, &call).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let operation_id = first["operation_id"].as_str().expect("an id").to_owned();
    let done = server
        .wait_for_state(TENANT_A_TOKEN, &operation_id, &["succeeded"])
        .await;
    assert_eq!(harness.objects().await.len(), 1);

    // The account's token is rotated, at the CRM and in the configuration, and the server restarted.
    let rotated = "token-acct-1-rotated";
    harness
        .admin
        .set_account_token(ACCOUNT, rotated)
        .await
        .expect("the stand takes the new token");
    let server = restart_with(
        &harness,
        server,
        &format!("token = \"{CONFIGURED_TOKEN}\""),
        &format!("token = \"{rotated}\""),
    );
    let requests = harness.admin.requests().await.expect("the request log");
    let (status, again) = deliver(&server, &call).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["created"], false);
    assert_eq!(again["operation_id"], first["operation_id"]);
    assert_eq!(again["state"], "succeeded");
    assert_eq!(again["external_id"], done["external_id"]);

    // Other arguments under the same source id are still another request.
    let (status, other) =
        deliver(&server, &tool_call("toolcall-rotated", "Email the client")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{other}");
    assert_eq!(other["error"]["code"], "source_id_reused");

    // The account is removed from the configuration: the redelivery still finds its operation,
    // while a new request for the account is refused as before.
    let server = restart_with(
        &harness,
        server,
        &format!("id = \"{ACCOUNT}\""),
        "id = \"acct-elsewhere\"",
    );
    let (status, removed) = deliver(&server, &call).await;
    assert_eq!(status, StatusCode::OK, "{removed}");
    assert_eq!(removed["created"], false);
    assert_eq!(removed["operation_id"], first["operation_id"]);
    assert_eq!(removed["state"], "succeeded");
    let (status, new) = deliver(&server, &tool_call("toolcall-new", "Call the client")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{new}");
    assert!(
        new["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("account"),
        "{new}"
    );

    assert_eq!(
        harness.admin.requests().await.expect("the request log"),
        requests,
        "no redelivery reached the CRM"
    );
    assert_eq!(harness.objects().await.len(), 1, "one task");
}
