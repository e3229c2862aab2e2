//! Agents over MCP, with the official SDK's client (rmcp) against the real binary: `/mcp` on
//! `opledger serve` (Streamable HTTP, the bearer token as the tenant) and `opledger mcp` (a child
//! process on stdio). The tools are the configured actions the tenant may use; a first response
//! lost at the CRM answers "not confirmed yet", a retry with the same request_id finds the same
//! operation, and the CRM holds exactly one object.

use std::collections::BTreeMap;
use std::time::Instant;

use opledger_crm_stand::{FaultKind, Shape};
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientRequest, Request, Tool};
use rmcp::service::{PeerRequestOptions, RunningService};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::support::{
    Harness, Server, ACCOUNT, A_ONLY_ACCOUNT, DEADLINE, OPERATOR_TOKEN, TENANT_A_TOKEN,
    TENANT_B_TOKEN,
};

/// A tool call's wait, short so a lost response answers before the plain CRM's search (its lag
/// is the harness's SEARCH_LAG_MS, 200 ms) can show the object.
const SHORT_WAIT: &str = "default_wait_ms = 100";

type Client = RunningService<RoleClient, Progress>;

/// The client's handler: forwards progress notifications to the test.
#[derive(Clone)]
struct Progress(mpsc::UnboundedSender<f64>);

impl ClientHandler for Progress {
    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        let _ = self.0.send(params.progress);
    }
}

fn handler() -> (Progress, mpsc::UnboundedReceiver<f64>) {
    let (sender, receiver) = mpsc::unbounded_channel();
    (Progress(sender), receiver)
}

/// An MCP client of `/mcp` with `token`.
async fn http_client(base: &str, token: &str) -> (Client, mpsc::UnboundedReceiver<f64>) {
    let config =
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            format!("{base}/mcp"),
        )
        .auth_header(token);
    let (progress, received) = handler();
    let client = progress
        .serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("the MCP session starts over HTTP");
    (client, received)
}

/// An MCP client of `opledger mcp` for tenant A, started as a child process.
async fn stdio_client(harness: &Harness) -> Client {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_opledger"));
    command
        .args(["mcp", "--config"])
        .arg(&harness.config)
        .args(["--tenant", "tenant-a"])
        .env("RUST_LOG", "info")
        .current_dir(harness.dir.path());
    let log = std::fs::File::create(harness.dir.path().join("mcp.log")).expect("log file");
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(log)
        .spawn()
        .expect("opledger mcp starts");
    let (progress, _) = handler();
    progress
        .serve(transport)
        .await
        .expect("the MCP session starts on stdio")
}

fn arguments(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("arguments must be an object: {other}"),
    }
}

async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments(args)))
        .await
        .expect("the tool answers")
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|text| text.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn structured(result: &CallToolResult) -> &Value {
    result
        .structured_content
        .as_ref()
        .expect("structured content")
}

/// Asks `operation_status` until the operation succeeds; fails after the deadline.
async fn until_succeeded(client: &Client, operation_id: &str) -> CallToolResult {
    let started = Instant::now();
    loop {
        let status = call(
            client,
            "operation_status",
            json!({"operation_id": operation_id}),
        )
        .await;
        if structured(&status)["state"] == "succeeded" {
            return status;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "operation {operation_id} never succeeded: {}",
            text(&status)
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

async fn tools_by_name(client: &Client) -> BTreeMap<String, Tool> {
    client
        .list_all_tools()
        .await
        .expect("tools/list answers")
        .into_iter()
        .map(|tool| (tool.name.to_string(), tool))
        .collect()
}

/// The scenario the issue is done by: the first response is lost at the (plain, lookup-only) CRM,
/// the call answers "not confirmed yet", a retry with the same request_id finds the same operation,
/// which reconciliation confirms, and the CRM holds one task.
async fn a_lost_response_then_a_retry_with_the_same_request_id(harness: &Harness, client: &Client) {
    harness
        .fault(Shape::Plain, FaultKind::DropResponse, 1)
        .await;
    let args = json!({"title": "Call the client tomorrow", "request_id": "call-17"});
    let first = call(client, "crm_plain__create_task", args.clone()).await;
    assert_eq!(first.is_error, Some(false), "{}", text(&first));
    let answered = structured(&first).clone();
    assert!(
        ["unknown", "in_flight"].contains(&answered["state"].as_str().unwrap_or_default()),
        "{answered}"
    );
    let said = text(&first);
    assert!(said.contains("Not confirmed yet"), "{said}");
    assert!(said.contains("do not repeat"), "{said}");
    let operation_id = answered["operation_id"].as_str().expect("an id").to_owned();
    assert!(
        said.contains(&operation_id),
        "the text names the id: {said}"
    );

    // A client holding a listing from before tool names lost their `-` still reaches the tool.
    let retry = call(client, "crm-plain__create_task", args).await;
    assert_eq!(structured(&retry)["operation_id"], operation_id.as_str());
    assert_eq!(structured(&retry)["created"], false, "{}", text(&retry));

    let done = until_succeeded(client, &operation_id).await;
    assert!(text(&done).starts_with("Done"), "{}", text(&done));
    let objects = harness.objects().await;
    assert_eq!(objects.len(), 1, "one task at the CRM: {objects:?}");
    assert_eq!(
        structured(&done)["external_id"],
        json!(objects[0].id.to_string())
    );
    let creates = harness
        .admin
        .requests()
        .await
        .expect("the request log")
        .into_iter()
        .filter(|request| request.method == "POST")
        .count();
    assert_eq!(creates, 1, "the retry sent nothing");
}

#[tokio::test]
async fn over_http_a_lost_response_answers_not_confirmed_and_a_retry_finds_the_one_task() {
    let harness = Harness::new(SHORT_WAIT).await;
    let server = harness.serve();
    let (client, _) = http_client(&server.base, TENANT_A_TOKEN).await;
    a_lost_response_then_a_retry_with_the_same_request_id(&harness, &client).await;
    client.cancel().await.expect("the session ends");
}

#[tokio::test]
async fn over_stdio_a_lost_response_answers_not_confirmed_and_a_retry_finds_the_one_task() {
    let harness = Harness::new(SHORT_WAIT).await;
    let client = stdio_client(&harness).await;
    a_lost_response_then_a_retry_with_the_same_request_id(&harness, &client).await;
    client.cancel().await.expect("the session ends");
}

#[tokio::test]
async fn the_tools_are_the_tenants_actions_with_their_schema_and_hints() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let (a, _) = http_client(&server.base, TENANT_A_TOKEN).await;
    let tools = tools_by_name(&a).await;
    for name in [
        "crm__create_task",
        "crm_plain__create_task",
        "operation_status",
        "list_operations",
    ] {
        assert!(tools.contains_key(name), "{name} in {:?}", tools.keys());
    }
    // Tenant A owns two accounts at `crm`: the tool asks which, from those two only.
    let keyed = &tools["crm__create_task"];
    let schema = Value::Object((*keyed.input_schema).clone());
    assert_eq!(
        schema["properties"]["account"]["enum"],
        json!([ACCOUNT, A_ONLY_ACCOUNT])
    );
    assert!(schema["properties"]["title"].is_object(), "{schema}");
    assert!(schema["properties"]["request_id"].is_object(), "{schema}");
    let description = keyed.description.as_deref().unwrap_or_default();
    assert!(description.contains("request_id"), "{description}");
    let hints = keyed.annotations.clone().expect("annotations");
    assert_eq!(hints.read_only_hint, Some(false));
    assert_eq!(
        hints.idempotent_hint,
        Some(false),
        "a repeat creates another task"
    );
    assert!(keyed.output_schema.is_some());
    // One account at `crm-plain`: no account argument.
    let plain = Value::Object((*tools["crm_plain__create_task"].input_schema).clone());
    assert!(plain["properties"].get("account").is_none(), "{plain}");

    // Tenant B owns only the shared account: no enum offering tenant A's.
    let (b, _) = http_client(&server.base, TENANT_B_TOKEN).await;
    let tools = tools_by_name(&b).await;
    let schema = Value::Object((*tools["crm__create_task"].input_schema).clone());
    assert!(schema["properties"].get("account").is_none(), "{schema}");
    a.cancel().await.expect("the session ends");
    b.cancel().await.expect("the session ends");
}

#[tokio::test]
async fn get_actions_lists_the_mcp_tools_for_a_framework_without_a_request_id_argument() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let (a, _) = http_client(&server.base, TENANT_A_TOKEN).await;
    let tools = tools_by_name(&a).await;
    let (status, listed) = server
        .call(
            reqwest::Method::GET,
            "/v1/actions",
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{listed}");
    let actions = listed["actions"].as_array().expect("a list of actions");
    let names: Vec<&str> = actions.iter().filter_map(|a| a["name"].as_str()).collect();
    // Every action tool the MCP server offers, and nothing else (not its status and list tools).
    let action_tools: Vec<&str> = tools
        .keys()
        .map(String::as_str)
        .filter(|name| name.contains("__"))
        .collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, action_tools);
    for action in actions {
        let name = action["name"].as_str().expect("a name");
        let mut mcp = Value::Object((*tools[name].input_schema).clone());
        // The same schema as the MCP tool's, less the request_id the framework supplies.
        mcp["properties"]
            .as_object_mut()
            .expect("properties")
            .remove("request_id");
        assert_eq!(action["input_schema"], mcp, "{name}");
        let description = action["description"].as_str().expect("a description");
        assert!(!description.contains("request_id"), "{description}");
        assert!(description.contains("do not repeat"), "{description}");
    }
    let keyed = actions
        .iter()
        .find(|a| a["name"] == "crm__create_task")
        .expect("crm__create_task");
    assert_eq!(keyed["accounts"], json!([ACCOUNT, A_ONLY_ACCOUNT]));
    assert_eq!(keyed["deduplication"], "idempotency_key");
    assert_eq!(keyed["idempotent_hint"], false);
    let plain = actions
        .iter()
        .find(|a| a["name"] == "crm_plain__create_task")
        .expect("crm_plain__create_task");
    assert_eq!(plain["deduplication"], "none");
    assert!(plain["input_schema"]["properties"].get("account").is_none());

    // Tenant B sees only its own account; an operator token records nothing, so lists nothing.
    let (_, b) = server
        .call(
            reqwest::Method::GET,
            "/v1/actions",
            Some(TENANT_B_TOKEN),
            None,
        )
        .await;
    let keyed_b = b["actions"]
        .as_array()
        .and_then(|list| list.iter().find(|a| a["name"] == "crm__create_task"))
        .expect("tenant B's crm__create_task");
    assert_eq!(keyed_b["accounts"], json!([ACCOUNT]));
    let (status, refused) = server
        .call(
            reqwest::Method::GET,
            "/v1/actions",
            Some(super::support::OPERATOR_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::FORBIDDEN, "{refused}");
    a.cancel().await.expect("the session ends");
}

#[tokio::test]
async fn waiting_operations_show_in_list_operations_and_status_only_to_their_tenant() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let (a, _) = http_client(&server.base, TENANT_A_TOKEN).await;
    let (b, _) = http_client(&server.base, TENANT_B_TOKEN).await;
    // What is waiting shows in list_operations; an id that is not the tenant's is a refusal.
    let waiting = server
        .record_for_approval(TENANT_A_TOKEN, "Wire the money")
        .await;
    let listed = call(&a, "list_operations", json!({})).await;
    let rows = structured(&listed)["operations"]
        .as_array()
        .expect("rows")
        .clone();
    assert!(
        rows.iter()
            .any(|row| row["operation_id"] == waiting["operation_id"]
                && row["state"] == "awaiting_approval"),
        "{rows:?}"
    );
    let status = call(
        &a,
        "operation_status",
        json!({"operation_id": waiting["operation_id"]}),
    )
    .await;
    assert_eq!(structured(&status)["state"], "awaiting_approval");
    assert_eq!(status.is_error, Some(false));

    let hidden = call(
        &b,
        "operation_status",
        json!({"operation_id": waiting["operation_id"]}),
    )
    .await;
    assert_eq!(
        hidden.is_error,
        Some(true),
        "tenant A's operation is not B's to see"
    );
    assert_eq!(structured(&hidden)["state"], "not_recorded");
    let theirs = call(&b, "list_operations", json!({})).await;
    assert_eq!(
        structured(&theirs)["operations"],
        json!([]),
        "B lists none of A's"
    );
    a.cancel().await.expect("the session ends");
    b.cancel().await.expect("the session ends");
}

#[tokio::test]
async fn the_same_request_id_with_other_arguments_is_a_tool_error_and_nothing_is_sent() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let (client, _) = http_client(&server.base, TENANT_A_TOKEN).await;
    let first = call(
        &client,
        "crm__create_task",
        json!({"title": "Call", "account": ACCOUNT, "request_id": "r-1"}),
    )
    .await;
    assert_eq!(structured(&first)["state"], "succeeded", "{}", text(&first));
    let requests = harness.admin.requests().await.expect("the request log");

    let other = call(
        &client,
        "crm__create_task",
        json!({"title": "Email", "account": ACCOUNT, "request_id": "r-1"}),
    )
    .await;
    assert_eq!(other.is_error, Some(true));
    assert_eq!(structured(&other)["state"], "not_recorded");
    assert!(text(&other).contains("request_id"), "{}", text(&other));

    // The same request id under _meta names the same request as the argument does.
    let mut params = CallToolRequestParams::new("crm__create_task")
        .with_arguments(arguments(json!({"title": "Call", "account": ACCOUNT})));
    let mut meta = rmcp::model::RequestMetaObject::new();
    meta.0
        .insert(opledger_mcp::META_REQUEST_ID.to_owned(), json!("r-1"));
    params.meta = Some(meta);
    let by_meta = client.call_tool(params).await.expect("the tool answers");
    assert_eq!(
        structured(&by_meta)["operation_id"],
        structured(&first)["operation_id"]
    );
    assert_eq!(
        harness.admin.requests().await.expect("the request log"),
        requests,
        "nothing more reached the CRM"
    );
    assert_eq!(harness.objects().await.len(), 1);
    client.cancel().await.expect("the session ends");
}

#[tokio::test]
async fn a_call_that_waits_sends_progress_to_a_client_that_asked() {
    let harness = Harness::new("default_wait_ms = 5000").await;
    let server = harness.serve();
    let (client, mut progress) = http_client(&server.base, TENANT_A_TOKEN).await;
    let held_ms = 3 * opledger_mcp::PROGRESS_INTERVAL_MS / 2;
    harness
        .fault(
            Shape::Keyed,
            FaultKind::LateResponse { delay_ms: held_ms },
            1,
        )
        .await;
    let params = CallToolRequestParams::new("crm__create_task")
        .with_arguments(arguments(json!({"title": "Call", "account": ACCOUNT})));
    // A request sent with a progress token (the SDK's cancellable request carries one).
    let handle = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("the call is sent");
    let answer = handle.await_response().await.expect("the call answers");
    let rmcp::model::ServerResult::CallToolResult(result) = answer else {
        panic!("not a tool result: {answer:?}");
    };
    assert_eq!(
        structured(&result)["state"],
        "succeeded",
        "{}",
        text(&result)
    );
    let waited = tokio::time::timeout(DEADLINE, progress.recv())
        .await
        .expect("a progress notification came")
        .expect("the client is running");
    assert!(waited > 0.0, "progress counts the wait: {waited}");
    client.cancel().await.expect("the session ends");
}

#[tokio::test]
async fn a_cancelled_call_stops_waiting_and_its_send_is_still_recorded() {
    let harness = Harness::new("").await;
    let client = stdio_client(&harness).await;
    harness
        .fault(Shape::Keyed, FaultKind::LateResponse { delay_ms: 1_500 }, 1)
        .await;
    let args = json!({"title": "Call", "account": ACCOUNT, "request_id": "cancelled-1"});
    let params =
        CallToolRequestParams::new("crm__create_task").with_arguments(arguments(args.clone()));
    let handle = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("the call is sent");
    // The CRM has applied it and holds the response: the send is in flight.
    let started = Instant::now();
    while harness.objects().await.is_empty() {
        assert!(started.elapsed() < DEADLINE, "the CRM never got the task");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    handle
        .cancel(Some("the user changed their mind".into()))
        .await
        .expect("the cancellation is sent");

    // The same request id finds the operation, which the held response then confirms.
    let again = call(&client, "crm__create_task", args).await;
    assert_eq!(structured(&again)["created"], false, "{}", text(&again));
    let operation_id = structured(&again)["operation_id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let done = until_succeeded(&client, &operation_id).await;
    let objects = harness.objects().await;
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert_eq!(structured(&done)["external_id"], json!(objects[0].id));
    client.cancel().await.expect("the session ends");
    let log = std::fs::read_to_string(harness.dir.path().join("mcp.log")).expect("the log");
    assert!(
        log.contains("cancelled a tool call"),
        "the server saw the cancellation:\n{log}"
    );
}

#[tokio::test]
async fn mcp_without_a_tenant_token_is_refused() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let response = reqwest::Client::new()
        .post(format!("{}/mcp", server.base))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .send()
        .await
        .expect("the server answers");
    assert_eq!(response.status(), reqwest::StatusCode::UNAUTHORIZED);
    let operator = reqwest::Client::new()
        .post(format!("{}/mcp", server.base))
        .bearer_auth(super::support::OPERATOR_TOKEN)
        .header("content-type", "application/json")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .send()
        .await
        .expect("the server answers");
    assert_eq!(operator.status(), reqwest::StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn opledger_mcp_names_what_is_missing_when_no_tenant_or_a_wrong_one_is_given() {
    let harness = Harness::new("").await;
    let config = harness.config.display().to_string();
    for (args, expected) in [
        (vec!["mcp", "--config", &config], "--tenant"),
        (
            vec!["mcp", "--config", &config, "--tenant", "nobody"],
            "not in",
        ),
        (
            vec![
                "mcp",
                "--config",
                &config,
                "--token",
                super::support::OPERATOR_TOKEN,
            ],
            "act for a tenant",
        ),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_opledger"))
            .args(&args)
            .env_remove("OPLEDGER_TOKEN")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("opledger runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} must fail");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(
            output.stdout.is_empty(),
            "stdout is the protocol's: {args:?}"
        );
    }
}

/// The Claude Desktop snippet of the book's MCP page, as a client reads it.
fn desktop_snippet() -> Value {
    let section = include_str!("../../docs/src/agents/mcp.md");
    let block = section
        .split("```json\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("\n```").map(|(block, _)| block))
        .find(|block| block.contains("mcpServers"))
        .expect("the section has a desktop client's JSON snippet");
    serde_json::from_str(block).expect("the snippet is JSON a client can read")
}

#[tokio::test]
async fn the_books_desktop_snippet_runs_the_embedded_default_and_a_tool_call_succeeds() {
    let snippet = desktop_snippet();
    let server = &snippet["mcpServers"]["opledger"];
    // The page's install step (`cargo install --path .`) puts this binary on the PATH under
    // the name the snippet gives.
    assert_eq!(server["command"], "opledger", "{snippet}");
    assert!(
        include_str!("../../docs/src/agents/mcp.md").contains("cargo install --locked --path ."),
        "the MCP page says how `opledger` gets onto the PATH"
    );
    let args: Vec<String> = server["args"]
        .as_array()
        .expect("args is a list")
        .iter()
        .map(|arg| arg.as_str().expect("each arg is a string").to_owned())
        .collect();
    // As a desktop client starts it, in a directory of its own, with nothing of this shell's
    // opledger settings; only the ledger is moved, so the test never writes outside its folder.
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = dir.path().join("demo.db");
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_opledger"));
    command
        .args(&args)
        .env_remove("OPLEDGER_CONFIG")
        .env_remove("OPLEDGER_TOKEN")
        .env("OPLEDGER_DB", &ledger)
        .current_dir(dir.path());
    let stderr_path = dir.path().join("mcp.log");
    let stderr = std::fs::File::create(&stderr_path).expect("log file");
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(stderr)
        .spawn()
        .expect("opledger mcp starts");
    let (progress, _) = handler();
    let client = progress
        .serve(transport)
        .await
        .expect("the MCP session starts on stdio");

    let tools = tools_by_name(&client).await;
    assert!(
        tools.contains_key("crm__create_task"),
        "the demo tenant's tools: {:?}",
        tools.keys()
    );
    let answer = call(
        &client,
        "crm__create_task",
        json!({"title": "Call the client tomorrow", "request_id": "readme-1"}),
    )
    .await;
    assert_eq!(answer.is_error, Some(false), "{}", text(&answer));
    assert_eq!(
        structured(&answer)["state"],
        "succeeded",
        "{}",
        text(&answer)
    );
    assert!(
        structured(&answer)["external_id"].is_string(),
        "the stand's task id: {}",
        text(&answer)
    );
    client.cancel().await.expect("the session ends");

    let log = std::fs::read_to_string(&stderr_path).expect("the server's stderr");
    assert!(
        log.contains("no --config, so the embedded default") && log.contains("demo.db"),
        "the start-up line names the default and its ledger: {log}"
    );
    assert!(ledger.exists(), "the ledger is where OPLEDGER_DB says");
}

#[tokio::test]
async fn opledger_mcp_without_a_configuration_refuses_another_tenant_or_token_and_names_its_own() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = dir.path().join("demo.db");
    for (args, expected) in [
        (
            vec!["mcp", "--tenant", "acme"],
            "whose one tenant is `demo`",
        ),
        (vec!["mcp", "--token", "not-a-demo-token"], "tenant `demo`"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_opledger"))
            .args(&args)
            .env_remove("OPLEDGER_CONFIG")
            .env_remove("OPLEDGER_TOKEN")
            .env("OPLEDGER_DB", &ledger)
            .current_dir(dir.path())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("opledger runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(
            output.stdout.is_empty(),
            "stdout is the protocol's: {args:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_naming_its_data_subject_is_sealed_under_their_key_and_erased_with_them() {
    use super::erasure::{holding, unique_email, KEK, KEK_ENV};
    let harness = Harness::new("").await;
    let mut config = std::fs::read_to_string(&harness.config).expect("the configuration");
    config.push_str(&format!("\n[personal_data]\nkek_env = \"{KEK_ENV}\"\n"));
    std::fs::write(&harness.config, config).expect("configuration written");
    let server = Server::start_with_env(
        &["serve", "--config", &harness.config.display().to_string()],
        harness.dir.path(),
        &[(KEK_ENV, KEK)],
    );
    let (client, _) = http_client(&server.base, TENANT_A_TOKEN).await;
    let email = unique_email();

    let tools = tools_by_name(&client).await;
    let schema = &tools["crm_plain__create_task"].input_schema;
    assert!(
        schema["properties"].get("data_subject").is_some(),
        "the tool takes the data subject: {schema:?}"
    );
    let answered = call(
        &client,
        "crm_plain__create_task",
        json!({"title": format!("Call {email}"), "data_subject": email, "request_id": "subject-1"}),
    )
    .await;
    assert_eq!(answered.is_error, Some(false), "{}", text(&answered));
    let operation_id = structured(&answered)["operation_id"]
        .as_str()
        .expect("an id")
        .to_owned();
    until_succeeded(&client, &operation_id).await;
    // Another person's call through the same tool, to stay readable.
    let other = call(
        &client,
        "crm_plain__create_task",
        json!({"title": "Call Bob", "data_subject": "bob@example.org", "request_id": "subject-2"}),
    )
    .await;
    let other_id = structured(&other)["operation_id"]
        .as_str()
        .expect("an id")
        .to_owned();

    let (_, shown) = server
        .call(
            reqwest::Method::GET,
            &format!("/v1/operations/{operation_id}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(
        shown["args"],
        json!({"title": format!("Call {email}")}),
        "{shown}"
    );
    let (_, subjects) = server
        .call(
            reqwest::Method::GET,
            &format!("/v1/subjects/{email}"),
            Some(OPERATOR_TOKEN),
            None,
        )
        .await;
    assert_eq!(
        subjects["subjects"][0]["operations"],
        json!([operation_id]),
        "{subjects}"
    );
    assert_eq!(
        holding(harness.dir.path(), &email),
        Vec::<std::path::PathBuf>::new()
    );

    let (status, erased) = server
        .post(
            &format!("/v1/subjects/{email}/erase"),
            OPERATOR_TOKEN,
            &json!({"reason": "request #9"}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{erased}");
    let status = call(
        &client,
        "operation_status",
        json!({"operation_id": operation_id}),
    )
    .await;
    assert!(!text(&status).contains(&email), "{}", text(&status));
    let (_, shown) = server
        .call(
            reqwest::Method::GET,
            &format!("/v1/operations/{operation_id}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(shown["args"]["title"], "[erased]", "{shown}");
    let (_, kept) = server
        .call(
            reqwest::Method::GET,
            &format!("/v1/operations/{other_id}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(kept["args"]["title"], "Call Bob", "{kept}");
    client.cancel().await.expect("the session ends");
    let (code, _) = server.terminate();
    assert_eq!(code, Some(0));
    assert_eq!(
        holding(harness.dir.path(), &email),
        Vec::<std::path::PathBuf>::new()
    );
}
