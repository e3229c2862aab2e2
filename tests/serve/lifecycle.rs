//! The lifecycle an agent platform runs: record, execute, answer truthfully; redelivery; approval
//! bound to the snapshot; the operator's review; listings, trace, history and metrics.

use opledger_crm_stand::{FaultKind, Shape};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{
    Harness, ACCOUNT, OPERATOR_B_TOKEN, OPERATOR_TOKEN, TENANT_A_TOKEN, TENANT_B_TOKEN,
};

#[tokio::test]
async fn an_intent_is_recorded_executed_and_confirmed_with_one_object_at_the_crm() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let (status, recorded) = server
        .record(TENANT_A_TOKEN, "crm", "Call the client", Some("toolcall-1"))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    assert_eq!(recorded["state"], "pending");
    assert_eq!(recorded["created"], true);
    assert!(recorded["idempotency_key"]
        .as_str()
        .is_some_and(|k| !k.is_empty()));
    let id = recorded["operation_id"].as_str().expect("an id").to_owned();

    let (status, executed) = server.execute(TENANT_A_TOKEN, &id, 5_000).await;
    assert_eq!(status, StatusCode::OK, "{executed}");
    assert_eq!(executed["state"], "succeeded");
    let external_id = executed["external_id"].as_str().expect("an external id");
    assert!(executed["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("Done") && m.contains(external_id)));
    let objects = harness.objects().await;
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert_eq!(objects[0].id, external_id);

    let (status, history) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{id}/events"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let types: Vec<&str> = history["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|event| event["type"].as_str())
        .collect();
    assert_eq!(
        types,
        ["IntentRecorded", "AttemptStarted", "AttemptSucceeded"]
    );

    // Executing a settled operation again sends nothing and says the same.
    let (_, again) = server.execute(TENANT_A_TOKEN, &id, 1_000).await;
    assert_eq!(again["external_id"], external_id);
    assert_eq!(harness.objects().await.len(), 1);

    let (status, listed) = server
        .call(
            Method::GET,
            "/v1/operations?state=succeeded",
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["operations"][0]["operation_id"], id.as_str());

    let (status, traced) = server
        .call(
            Method::GET,
            &format!("/v1/trace/{external_id}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{traced}");
    assert_eq!(traced["operation_id"], id.as_str());
    let (_, by_source) = server
        .call(
            Method::GET,
            "/v1/trace/toolcall-1",
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(by_source["operation_id"], id.as_str());

    let metrics = reqwest::get(format!("{}/metrics", server.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("opledger_undecodable_events_total 0"),
        "a healthy ledger has no event the workers skipped: {metrics}"
    );
    assert!(
        metrics.contains("opledger_operations{state=\"succeeded\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("opledger_intents_recorded_total 1"),
        "{metrics}"
    );
    assert!(metrics.contains("opledger_http_request_duration_seconds_bucket{method=\"POST\",route=\"/v1/operations/{id}/execute\""), "{metrics}");
}

#[tokio::test]
async fn a_redelivered_tool_call_finds_the_same_operation_and_other_arguments_are_refused() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let (first_status, first) = server
        .record(TENANT_A_TOKEN, "crm", "Call", Some("toolcall-7"))
        .await;
    assert_eq!(first_status, StatusCode::CREATED);
    let (again_status, again) = server
        .record(TENANT_A_TOKEN, "crm", "Call", Some("toolcall-7"))
        .await;
    assert_eq!(again_status, StatusCode::OK, "{again}");
    assert_eq!(again["created"], false);
    assert_eq!(again["operation_id"], first["operation_id"]);
    assert_eq!(again["idempotency_key"], first["idempotency_key"]);
    let (other_status, other) = server
        .record(TENANT_A_TOKEN, "crm", "Email", Some("toolcall-7"))
        .await;
    assert_eq!(other_status, StatusCode::CONFLICT, "{other}");
    assert_eq!(other["error"]["code"], "source_id_reused");
}

#[tokio::test]
async fn approval_is_bound_to_the_recorded_snapshot_and_nothing_is_sent_before_it() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let recorded = server
        .record_for_approval(TENANT_A_TOKEN, "Wire 10 000 EUR")
        .await;
    assert_eq!(recorded["state"], "awaiting_approval");
    let id = recorded["operation_id"].as_str().expect("id").to_owned();
    let (_, executed) = server.execute(TENANT_A_TOKEN, &id, 200).await;
    assert_eq!(executed["state"], "awaiting_approval");
    assert!(harness.objects().await.is_empty());

    let wrong = json!({"approver": "boss", "args_hash": format!("sha256:{}", "0".repeat(64))});
    let (status, refused) = server
        .post(
            &format!("/v1/operations/{id}/approve"),
            TENANT_A_TOKEN,
            &wrong,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"]["code"], "refused");

    let right = json!({"approver": "boss", "args_hash": recorded["args_hash"]});
    let (status, approved) = server
        .post(
            &format!("/v1/operations/{id}/approve"),
            TENANT_A_TOKEN,
            &right,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    assert_eq!(approved["state"], "pending");
    let settled = server
        .wait_for_state(TENANT_A_TOKEN, &id, &["succeeded"])
        .await;
    assert_eq!(harness.objects().await.len(), 1, "{settled}");
}

#[tokio::test]
async fn a_denied_operation_is_never_sent() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let recorded = server
        .record_for_approval(TENANT_A_TOKEN, "Delete everything")
        .await;
    let id = recorded["operation_id"].as_str().expect("id").to_owned();
    let deny = json!({"approver": "boss", "args_hash": recorded["args_hash"], "reason": "no"});
    let (status, denied) = server
        .post(&format!("/v1/operations/{id}/deny"), TENANT_A_TOKEN, &deny)
        .await;
    assert_eq!(status, StatusCode::OK, "{denied}");
    assert_eq!(denied["state"], "denied");
    let (_, executed) = server.execute(TENANT_A_TOKEN, &id, 200).await;
    assert_eq!(executed["state"], "denied");
    assert!(harness.objects().await.is_empty());
}

#[tokio::test]
async fn a_lost_request_on_a_lookup_only_crm_goes_to_the_operator_who_decides() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    harness.fault(Shape::Plain, FaultKind::DropRequest, 1).await;
    let (_, recorded) = server
        .record(TENANT_A_TOKEN, "crm-plain", "Call", None)
        .await;
    let id = recorded["operation_id"].as_str().expect("id").to_owned();
    let (_, executed) = server.execute(TENANT_A_TOKEN, &id, 200).await;
    assert!(
        executed["message"]
            .as_str()
            .is_some_and(|m| !m.starts_with("Done")),
        "the agent must not say done: {executed}"
    );
    let waiting = server
        .wait_for_state(TENANT_A_TOKEN, &id, &["needs_review"])
        .await;
    assert!(harness.objects().await.is_empty(), "{waiting}");

    let (status, queue) = server
        .call(Method::GET, "/v1/review", Some(OPERATOR_TOKEN), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{queue}");
    assert_eq!(queue["queue"][0]["operation_id"], id.as_str());
    assert!(queue["queue"][0]["reason"].is_string());
    // The person deciding sees what was asked, where it is bound, and every attempt and lookup.
    let detail = &queue["queue"][0]["detail"];
    assert_eq!(detail["description"], "create a task", "{detail}");
    assert_eq!(detail["args"]["title"], "Call", "{detail}");
    assert_eq!(detail["binding"]["provider"], "crm-plain", "{detail}");
    assert_eq!(detail["attempts"][0]["outcome"], "unknown", "{detail}");
    let lookups = detail["lookups"].as_array().map_or(0, Vec::len);
    assert_eq!(
        Some(lookups as u64),
        queue["queue"][0]["lookups"].as_u64(),
        "every lookup is listed: {detail}"
    );
    assert!(lookups >= 1, "{detail}");
    // An operator scoped to another tenant has an empty queue; it is tenant A's operation.
    let (status, scoped) = server
        .call(Method::GET, "/v1/review", Some(OPERATOR_B_TOKEN), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{scoped}");
    assert_eq!(
        scoped["queue"].as_array().map(Vec::len),
        Some(0),
        "{scoped}"
    );

    let stale =
        json!({"decision": "abandon", "note": "looked at old evidence", "expected_version": 0});
    let (status, refused) = server
        .post(
            &format!("/v1/operations/{id}/review"),
            OPERATOR_TOKEN,
            &stale,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"]["code"], "stale");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("new evidence arrived (") && m.contains("AttemptStarted")),
        "the refusal says what arrived: {refused}"
    );

    let decision = json!({"decision": "abandon", "note": "the client cancelled", "expected_version": waiting["version"]});
    let (status, decided) = server
        .post(
            &format!("/v1/operations/{id}/review"),
            OPERATOR_TOKEN,
            &decision,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    assert_eq!(decided["state"], "abandoned");
    // A second operator who looked at the same version is told who decided, and what.
    let late = json!({"decision": "retry", "note": "trying again", "expected_version": waiting["version"], "accept_duplicate_risk": true});
    let (status, refused) = server
        .post(
            &format!("/v1/operations/{id}/review"),
            OPERATOR_TOKEN,
            &late,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("oncall decided to abandon it at")
                && m.contains("the client cancelled")),
        "the refusal names who decided and what: {refused}"
    );
    let (_, queue) = server
        .call(Method::GET, "/v1/review", Some(OPERATOR_TOKEN), None)
        .await;
    assert_eq!(queue["queue"].as_array().map(Vec::len), Some(0), "{queue}");
}

#[tokio::test]
async fn listings_filter_by_state_and_age_and_page_with_next() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let mut recorded = Vec::new();
    for _ in 0..3 {
        recorded.push(server.marker(TENANT_A_TOKEN).await);
    }
    let list = |query: String| {
        let server = &server;
        async move {
            let (status, body) = server
                .call(
                    Method::GET,
                    &format!("/v1/operations{query}"),
                    Some(TENANT_A_TOKEN),
                    None,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{query}: {body}");
            let ids: Vec<String> = body["operations"]
                .as_array()
                .expect("operations")
                .iter()
                .filter_map(|row| row["operation_id"].as_str().map(str::to_owned))
                .collect();
            (ids, body["next"].as_str().map(str::to_owned))
        }
    };
    let (first_page, next) = list("?state=awaiting_approval&limit=2".into()).await;
    assert_eq!(first_page.len(), 2);
    let next = next.expect("a next page");
    let (second_page, none) = list(format!("?state=awaiting_approval&limit=2&after={next}")).await;
    assert_eq!(second_page.len(), 1);
    assert_eq!(none, None);
    let mut all: Vec<String> = first_page.into_iter().chain(second_page).collect();
    all.sort();
    recorded.sort();
    assert_eq!(
        all, recorded,
        "every operation exactly once across the pages"
    );
    let (old, _) = list("?older_than=10m".into()).await;
    assert!(
        old.is_empty(),
        "nothing was recorded ten minutes ago: {old:?}"
    );
    let (unknown, _) = list("?state=unknown".into()).await;
    assert!(unknown.is_empty());
}

async fn operation_in_review(harness: &Harness, server: &crate::support::Server) -> String {
    harness.fault(Shape::Plain, FaultKind::DropRequest, 1).await;
    let (_, recorded) = server
        .record(TENANT_A_TOKEN, "crm-plain", "Call", None)
        .await;
    let id = recorded["operation_id"].as_str().expect("id").to_owned();
    server.execute(TENANT_A_TOKEN, &id, 200).await;
    server
        .wait_for_state(TENANT_A_TOKEN, &id, &["needs_review"])
        .await;
    id
}

#[tokio::test]
async fn an_operator_confirms_an_object_found_by_hand_and_the_agent_may_then_say_done() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let id = operation_in_review(&harness, &server).await;
    let decision = json!({"decision": "confirm", "external_id": "found-by-hand-9", "note": "it is in the CRM"});
    let (status, decided) = server
        .post(
            &format!("/v1/operations/{id}/review"),
            OPERATOR_TOKEN,
            &decision,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    assert_eq!(decided["state"], "succeeded");
    assert_eq!(decided["external_id"], "found-by-hand-9");
    assert!(decided["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("Done")));
    assert!(
        harness.objects().await.is_empty(),
        "confirming sends nothing"
    );
}

#[tokio::test]
async fn an_operator_retry_without_deduplication_needs_the_risk_accepted_and_sends_once_more() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let id = operation_in_review(&harness, &server).await;
    let path = format!("/v1/operations/{id}/review");
    // The plain CRM deduplicates nothing: a retry could make a second task, so the operator
    // must say they accept that before anything is sent.
    let unacknowledged = json!({"decision": "retry", "note": "the CRM log shows it never arrived"});
    let (status, refused) = server.post(&path, OPERATOR_TOKEN, &unacknowledged).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"]["code"], "duplicate_risk_not_accepted");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("accept_duplicate_risk")),
        "{refused}"
    );
    let (_, still) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{id}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(
        still["state"], "needs_review",
        "a refused decision changes nothing"
    );
    assert!(harness.objects().await.is_empty(), "nothing was sent");

    let decision = json!({"decision": "retry", "note": "the CRM log shows it never arrived",
        "accept_duplicate_risk": true});
    let (status, decided) = server.post(&path, OPERATOR_TOKEN, &decision).await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    let settled = server
        .wait_for_state(TENANT_A_TOKEN, &id, &["succeeded"])
        .await;
    let objects = harness.objects().await;
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert_eq!(settled["external_id"], objects[0].id.as_str());
}

#[tokio::test]
async fn serve_without_a_configuration_gives_a_working_api_on_loopback_only() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("default.db");
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["serve", "--listen", "0.0.0.0:0", "--db"])
        .arg(&db)
        .output()
        .expect("runs");
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("loopback"));
    assert!(!db.exists(), "a refused start opens nothing");

    let server = crate::support::Server::start_with(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--db",
            &db.display().to_string(),
        ],
        dir.path(),
    );
    let body = json!({"provider": "crm", "account": "demo", "action": "create_task",
        "args": {"title": "first call"}});
    let (status, recorded) = server
        .call(
            Method::POST,
            "/v1/operations",
            Some("demo-tenant-token"),
            Some(&body),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    let id = recorded["operation_id"].as_str().expect("id");
    let (_, executed) = server.execute("demo-tenant-token", id, 5_000).await;
    assert_eq!(executed["state"], "succeeded", "{executed}");
    let (code, _) = server.terminate();
    assert_eq!(code, Some(0));
}

#[tokio::test]
async fn one_call_records_then_executes_and_a_redelivery_of_it_sends_nothing_more() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let body = json!({"provider": "crm", "account": "acct-1", "action": "create_task",
        "args": {"title": "in one call"}, "source_id": "one-call-1"});
    let path = "/v1/operations?execute=true&wait_ms=5000";
    let (status, answered) = server.post(path, TENANT_A_TOKEN, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{answered}");
    assert_eq!(answered["state"], "succeeded");
    assert_eq!(answered["created"], true);
    let (status, again) = server.post(path, TENANT_A_TOKEN, &body).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["external_id"], answered["external_id"]);
    assert_eq!(harness.objects().await.len(), 1);
    for bad in ["/v1/operations?execute=maybe", "/v1/operations?wait_ms=10"] {
        let (status, refused) = server.post(bad, TENANT_A_TOKEN, &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {refused}");
    }
}

#[tokio::test]
async fn concurrent_one_call_deliveries_of_one_tool_call_make_one_operation_and_one_object() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    // The plain CRM has no idempotency key: a second send would make a second object.
    let body = json!({"provider": "crm-plain", "account": "acct-1", "action": "create_task",
        "args": {"title": "delivered eight times at once"}, "source_id": "burst-1"});
    let path = "/v1/operations?execute=true&wait_ms=5000";
    let answers =
        futures_util::future::join_all((0..8).map(|_| server.post(path, TENANT_A_TOKEN, &body)))
            .await;
    let first_id = answers[0].1["operation_id"].clone();
    let mut created = 0;
    for (status, answer) in &answers {
        assert!(
            *status == StatusCode::CREATED || *status == StatusCode::OK,
            "{status}: {answer}"
        );
        assert_eq!(answer["operation_id"], first_id, "one operation: {answer}");
        created += usize::from(answer["created"] == true);
    }
    assert_eq!(
        created, 1,
        "exactly one delivery recorded the intent: {answers:?}"
    );
    // Whichever delivery's send won, the operation ends confirmed with one object at the CRM.
    let id = first_id.as_str().expect("an operation id");
    let (_, settled) = server.execute(TENANT_A_TOKEN, id, 5_000).await;
    assert_eq!(settled["state"], "succeeded", "{settled}");
    assert_eq!(settled["attempts"], 1, "one send: {settled}");
    assert_eq!(harness.objects().await.len(), 1);
}

#[tokio::test]
async fn listings_filter_by_provider_and_account_on_every_page() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    for (provider, title) in [
        ("crm", "One"),
        ("crm-plain", "Two"),
        ("crm", "Three"),
        ("crm-plain", "Four"),
        ("crm-plain", "Five"),
    ] {
        let (status, body) = server.record(TENANT_A_TOKEN, provider, title, None).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let listed = |query: String| {
        let server = &server;
        async move {
            let (status, body) = server
                .call(Method::GET, &query, Some(TENANT_A_TOKEN), None)
                .await;
            assert_eq!(status, StatusCode::OK, "{query}: {body}");
            body
        }
    };
    // Pages of one: the filter is the query's, so each page holds a match.
    let mut providers = Vec::new();
    let mut query = "/v1/operations?provider=crm-plain&limit=1".to_owned();
    loop {
        let page = listed(query.clone()).await;
        for operation in page["operations"].as_array().expect("operations") {
            providers.push(
                operation["provider"]
                    .as_str()
                    .expect("a provider")
                    .to_owned(),
            );
        }
        let Some(next) = page["next"].as_str() else {
            break;
        };
        query = format!("/v1/operations?provider=crm-plain&limit=1&after={next}");
    }
    assert_eq!(providers, ["crm-plain"; 3]);

    let by_account = listed(format!("/v1/operations?provider=crm&account={ACCOUNT}")).await;
    assert_eq!(by_account["operations"].as_array().map(Vec::len), Some(2));
    let elsewhere = listed("/v1/operations?account=another-account".to_owned()).await;
    assert_eq!(elsewhere["operations"], json!([]));

    let (status, refused) = server
        .call(
            Method::GET,
            "/v1/operations?provider=",
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert!(refused["error"]["message"]
        .as_str()
        .is_some_and(|message| message.contains("provider")));
}

#[tokio::test]
async fn whoami_names_the_kind_and_the_tenants_a_token_sees() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let (status, tenant) = server
        .call(Method::GET, "/v1/whoami", Some(TENANT_A_TOKEN), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{tenant}");
    assert_eq!(tenant["kind"], "tenant");
    assert_eq!(tenant["tenants"], json!([tenant["name"]]));
    let (status, operator) = server
        .call(Method::GET, "/v1/whoami", Some(OPERATOR_TOKEN), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{operator}");
    assert_eq!(operator["kind"], "operator");
    let (status, scoped) = server
        .call(Method::GET, "/v1/whoami", Some(OPERATOR_B_TOKEN), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{scoped}");
    assert_eq!(scoped["kind"], "operator");
    assert!(
        scoped["tenants"].is_array(),
        "a scoped operator names its tenants: {scoped}"
    );
    assert_ne!(scoped["tenants"], operator["tenants"]);
    let (status, _) = server
        .call(Method::GET, "/v1/whoami", Some("not-a-token"), None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn counts_by_state_agree_with_the_listings_for_each_tenant_and_for_all() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    // Executed to a settled state, so the workers change nothing between the count and the
    // listings it is compared with.
    for title in ["One", "Two", "Three", "Four"] {
        let (status, body) = server.record(TENANT_A_TOKEN, "crm", title, None).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let id = body["operation_id"].as_str().expect("an id");
        let (status, executed) = server.execute(TENANT_A_TOKEN, id, 5_000).await;
        assert_eq!(status, StatusCode::OK, "{executed}");
    }

    let counts = |token: &'static str, query: &'static str| {
        let server = &server;
        async move {
            let (status, body) = server
                .call(
                    Method::GET,
                    &format!("/v1/counts{query}"),
                    Some(token),
                    None,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            body
        }
    };
    let mine = counts(TENANT_A_TOKEN, "").await;
    let by_state = mine["by_state"].as_object().expect("by state");
    assert_eq!(by_state.len(), 9, "every API state: {mine}");
    for (state, count) in by_state {
        let (_, listed) = server
            .call(
                Method::GET,
                &format!("/v1/operations?state={state}&limit=1000"),
                Some(TENANT_A_TOKEN),
                None,
            )
            .await;
        let listed = listed["operations"].as_array().map_or(0, Vec::len);
        assert_eq!(count.as_u64(), Some(listed as u64), "{state}: {mine}");
    }
    assert_eq!(by_state["succeeded"], 4, "{mine}");
    let total: u64 = by_state.values().filter_map(Value::as_u64).sum();
    assert_eq!(total, 4);

    let everyone = counts(OPERATOR_TOKEN, "").await;
    assert_eq!(everyone["tenant"], Value::Null);
    let (_, theirs) = server.record(TENANT_B_TOKEN, "crm", "Theirs", None).await;
    let theirs = theirs["operation_id"].as_str().expect("an id");
    server
        .wait_for_state(TENANT_B_TOKEN, theirs, &["succeeded"])
        .await;
    let everyone = counts(OPERATOR_TOKEN, "").await;
    let all: u64 = everyone["by_state"]
        .as_object()
        .expect("by state")
        .values()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(all, 5, "every tenant's: {everyone}");
    let b = counts(TENANT_B_TOKEN, "").await;
    assert_eq!(b["by_state"]["succeeded"], 1, "{b}");
    assert_eq!(b["by_state"]["rejected"], 0, "{b}");
}

#[tokio::test]
async fn operations_are_found_by_an_arguments_value_and_by_owner_and_a_bad_search_is_refused() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let mut ids = Vec::new();
    for (title, owner) in [
        ("Call the client", "anna"),
        ("Call the supplier", "boris"),
        ("Call the client", "boris"),
    ] {
        let body = json!({
            "provider": "crm", "account": crate::support::ACCOUNT, "action": "create_task",
            "args": {"title": title}, "owner": owner,
        });
        let (status, recorded) = server
            .call(
                Method::POST,
                "/v1/operations",
                Some(TENANT_A_TOKEN),
                Some(&body),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{recorded}");
        ids.push(recorded["operation_id"].as_str().expect("an id").to_owned());
    }
    let found = |query: &'static str| {
        let server = &server;
        async move {
            let (status, body) = server
                .call(
                    Method::GET,
                    &format!("/v1/operations?{query}"),
                    Some(TENANT_A_TOKEN),
                    None,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{query}: {body}");
            body["operations"]
                .as_array()
                .expect("operations")
                .iter()
                .filter_map(|row| row["operation_id"].as_str().map(str::to_owned))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        found("arg=title:call%20THE%20client").await,
        vec![ids[0].clone(), ids[2].clone()],
        "whatever the case, oldest first"
    );
    assert_eq!(
        found("owner=boris&order=newest").await,
        vec![ids[2].clone(), ids[1].clone()]
    );
    assert_eq!(
        found("owner=boris&arg=title:Call%20the%20client").await,
        vec![ids[2].clone()]
    );
    assert!(
        found("arg=title:Call").await.is_empty(),
        "a value is matched whole"
    );
    let (status, refused) = server
        .call(
            Method::GET,
            "/v1/operations?arg=title",
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("arg") && m.contains("NAME:VALUE")),
        "{refused}"
    );
}
