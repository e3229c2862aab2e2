//! A tenant never sees, lists, executes, reviews or subscribes to another tenant's operations:
//! every such request answers exactly as for an operation that does not exist.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{
    Harness, APPROVER_B_TOKEN, A_ONLY_ACCOUNT, OPERATOR_B_TOKEN, OPERATOR_TOKEN, TENANT_A_TOKEN,
    TENANT_B_TOKEN,
};

#[tokio::test]
async fn another_tenants_operation_answers_404_everywhere_as_if_it_did_not_exist() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    // Awaiting approval, so nothing but a request could move it.
    let body = json!({"provider": "crm", "account": "acct-1", "action": "create_task",
        "args": {"title": "A's task"}, "source_id": "a-call-1", "requires_approval": true});
    let (_, recorded) = server.post("/v1/operations", TENANT_A_TOKEN, &body).await;
    let id = recorded["operation_id"].as_str().expect("id").to_owned();
    let missing = "00000000-0000-4000-8000-000000000000";
    let approval = json!({"approver": "b", "args_hash": recorded["args_hash"]});
    for (method, path, body) in [
        (Method::GET, format!("/v1/operations/{id}"), None),
        (Method::GET, format!("/v1/operations/{id}/events"), None),
        (
            Method::POST,
            format!("/v1/operations/{id}/execute?wait_ms=0"),
            None,
        ),
        (
            Method::POST,
            format!("/v1/operations/{id}/approve"),
            Some(approval.clone()),
        ),
        (Method::GET, format!("/v1/trace/{id}"), None),
        (Method::GET, "/v1/trace/a-call-1".to_owned(), None),
    ] {
        let (status, body_b) = server
            .call(method.clone(), &path, Some(TENANT_B_TOKEN), body.as_ref())
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {body_b}");
        assert_eq!(body_b["error"]["code"], "not_found");
        // The answer for a missing operation has the same shape: nothing tells the two apart.
        let missing_path = path.replace(&id, missing);
        if missing_path != path {
            let (missing_status, missing_body) = server
                .call(
                    method.clone(),
                    &missing_path,
                    Some(TENANT_B_TOKEN),
                    body.as_ref(),
                )
                .await;
            assert_eq!(missing_status, status, "{missing_path}");
            assert_eq!(missing_body["error"]["code"], body_b["error"]["code"]);
        }
    }
    // B's listing is empty, and naming A's operation as a cursor is refused like a stranger's.
    let (status, listed) = server
        .call(Method::GET, "/v1/operations", Some(TENANT_B_TOKEN), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["operations"].as_array().map(Vec::len), Some(0));
    let (status, _) = server
        .call(
            Method::GET,
            &format!("/v1/operations?after={id}"),
            Some(TENANT_B_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = server
        .call(
            Method::GET,
            "/v1/operations?tenant=tenant-a",
            Some(TENANT_B_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Nothing was sent on B's behalf, and A's operation is untouched.
    assert!(harness.objects().await.is_empty());
    let (_, own) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{id}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(own["state"], "awaiting_approval");
    assert_eq!(own["version"], 0);
}

#[tokio::test]
async fn a_tenants_event_stream_carries_only_its_own_operations() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    // Operations awaiting approval: nothing happens to them but their recording.
    let a = server.marker(TENANT_A_TOKEN).await;
    let b = server.marker(TENANT_B_TOKEN).await;
    let a_again = server.marker(TENANT_A_TOKEN).await;
    let b_last = server.marker(TENANT_B_TOKEN).await;
    let mut stream = server.events(TENANT_B_TOKEN, "?types=all", None).await;
    assert_eq!(stream.status, StatusCode::OK);
    // Everything up to B's last operation, which was recorded after all of A's.
    let events = stream
        .until(|event| event.data["operation_id"] == b_last.as_str())
        .await;
    let ids: Vec<&str> = events
        .iter()
        .filter_map(|event| event.data["operation_id"].as_str())
        .collect();
    assert_eq!(ids, [b.as_str(), b_last.as_str()], "{events:?}");
    assert!(!ids.contains(&a.as_str()) && !ids.contains(&a_again.as_str()));
}

#[tokio::test]
async fn review_is_an_operator_scope_and_a_scoped_operator_sees_only_its_tenants() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let (status, body) = server
        .call(Method::GET, "/v1/review", Some(TENANT_A_TOKEN), None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (_, recorded) = server.record(TENANT_A_TOKEN, "crm", "A", None).await;
    let id = recorded["operation_id"].as_str().expect("id").to_owned();
    let decision = json!({"decision": "abandon", "note": "n"});
    let (status, _) = server
        .post(
            &format!("/v1/operations/{id}/review"),
            TENANT_A_TOKEN,
            &decision,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = server
        .post(
            &format!("/v1/operations/{id}/review"),
            OPERATOR_B_TOKEN,
            &decision,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // An operator with every tenant in scope reaches it; it is not in review, so it is refused.
    let (status, refused) = server
        .post(
            &format!("/v1/operations/{id}/review"),
            OPERATOR_TOKEN,
            &decision,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    // An operator token cannot record.
    let (status, _) = server.record(OPERATOR_TOKEN, "crm", "x", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_tenant_with_an_approver_cannot_approve_its_own_requests_and_the_approver_is_recorded() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let recorded = server
        .record_for_approval(TENANT_B_TOKEN, "Refund 500 EUR")
        .await;
    let id = recorded["operation_id"].as_str().expect("id").to_owned();
    let approval = json!({"approver": "the agent itself", "args_hash": recorded["args_hash"]});
    let path = format!("/v1/operations/{id}/approve");
    let (status, refused) = server.post(&path, TENANT_B_TOKEN, &approval).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    let (status, _) = server.post(&path, OPERATOR_TOKEN, &approval).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "an operator does not approve"
    );
    let (_, a_recorded) = server.record(TENANT_A_TOKEN, "crm", "A", None).await;
    let a_path = format!(
        "/v1/operations/{}/approve",
        a_recorded["operation_id"].as_str().expect("id")
    );
    let (status, _) = server.post(&a_path, APPROVER_B_TOKEN, &approval).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "B's approver does not see A's operations"
    );

    let by_approver = json!({"args_hash": recorded["args_hash"]});
    let (status, approved) = server.post(&path, APPROVER_B_TOKEN, &by_approver).await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    assert_eq!(approved["state"], "pending");
    let (_, history) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{id}/events"),
            Some(TENANT_B_TOKEN),
            None,
        )
        .await;
    let grant = history["events"]
        .as_array()
        .expect("events")
        .iter()
        .find(|event| event["type"] == "ApprovalGranted")
        .expect("an approval");
    assert_eq!(
        grant["data"]["approver"], "b-approver",
        "recorded under the token's name"
    );
}

/// Records a create_task on `account` of `crm` for `token`, with `args`.
async fn record_on(
    server: &crate::support::Server,
    token: &str,
    account: &str,
    args: serde_json::Value,
    requires_approval: bool,
) -> (StatusCode, serde_json::Value) {
    let body = json!({"provider": "crm", "account": account, "action": "create_task",
        "args": args, "requires_approval": requires_approval});
    server.post("/v1/operations", token, &body).await
}

#[tokio::test]
async fn an_account_of_another_tenant_is_refused_at_record_and_nothing_is_written() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let head = server.log_head().await;
    let (status, refused) = record_on(
        &server,
        TENANT_B_TOKEN,
        A_ONLY_ACCOUNT,
        json!({"title": "B's task"}),
        false,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("invalid `account`")
            && message.contains("is not an account of provider `crm` that this tenant may use"),
        "{refused}"
    );
    // The owner records on it.
    let (status, recorded) = record_on(
        &server,
        TENANT_A_TOKEN,
        A_ONLY_ACCOUNT,
        json!({"title": "A's task"}),
        true,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    assert_eq!(
        server.log_head().await,
        head + 1,
        "only A's intent was written"
    );
    assert!(harness.objects().await.is_empty());
}

#[tokio::test]
async fn arguments_outside_the_actions_schema_are_refused_naming_each_field_and_nothing_is_written()
{
    let harness = Harness::new("").await;
    let server = harness.serve();
    let head = server.log_head().await;
    let (status, refused) = record_on(
        &server,
        TENANT_A_TOKEN,
        "acct-1",
        json!({"title": 7, "due": "x".repeat(101)}),
        false,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["error"]["code"], "invalid_input");
    let pointers: Vec<&str> = refused["error"]["fields"]
        .as_array()
        .expect("the failing fields are listed")
        .iter()
        .filter_map(|field| field["pointer"].as_str())
        .collect();
    assert!(pointers.contains(&"/args/title"), "{refused}");
    assert!(pointers.contains(&"/args/due"), "{refused}");
    let body = json!({"provider": "crm", "account": "acct-1", "action": "delete_everything",
        "args": {}});
    let (status, unknown) = server.post("/v1/operations", TENANT_A_TOKEN, &body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{unknown}");
    assert!(
        unknown["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("create_task")),
        "the known actions are named: {unknown}"
    );
    assert_eq!(server.log_head().await, head, "nothing was written");
}

#[tokio::test]
async fn an_account_handed_to_another_tenant_after_recording_is_not_sent_but_goes_to_a_person() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let (status, recorded) = record_on(
        &server,
        TENANT_A_TOKEN,
        A_ONLY_ACCOUNT,
        json!({"title": "A's task"}),
        true,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    let id = recorded["operation_id"].as_str().expect("id").to_owned();
    let (code, _) = server.terminate();
    assert_eq!(code, Some(0));
    // The operator moves the account to tenant B while A's operation waits for its approval.
    let config = std::fs::read_to_string(&harness.config).expect("the configuration");
    let moved = config.replace(
        "tenants = [\"tenant-a\"]\ntoken = \"token-acct-2\"",
        "tenants = [\"tenant-b\"]\ntoken = \"token-acct-2\"",
    );
    assert_ne!(moved, config, "the account's owner changed");
    std::fs::write(&harness.config, moved).expect("written");
    let server = harness.serve();
    let approval = json!({"approver": "a-lead", "args_hash": recorded["args_hash"]});
    let (status, approved) = server
        .post(
            &format!("/v1/operations/{id}/approve"),
            TENANT_A_TOKEN,
            &approval,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    let settled = server
        .wait_for_state(TENANT_A_TOKEN, &id, &["needs_review"])
        .await;
    assert!(
        settled["review_reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("that this tenant may use")),
        "{settled}"
    );
    assert_eq!(settled["attempts"], 0, "nothing was sent: {settled}");
    assert!(harness.objects().await.is_empty());
}
