//! Security: what a reviewer tries against a two-tenant server, kept as tests so it stays held.
//!
//! A provider on loopback echoes every credential it is sent back — in a body, in a header, in an
//! error, and a token endpoint echoes the form with the client secret and the refresh token — and
//! no configured secret is found afterwards in the log at `-vv`, in the events through the API
//! and MCP, in the spans a collector receives, or in the export. A value placed in a request path stays one segment; `/mcp` refuses
//! a foreign `Origin`; every decision names the token that made it; the answers give nothing away
//! about other tenants; files are their owner's only.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use axum::body::Body;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use reqwest::{Method, StatusCode};
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::{json, Value};

use super::support::{
    Harness, Server, ACCOUNT, APPROVER_B_TOKEN, OPERATOR_B_TOKEN, OPERATOR_TOKEN, TENANT_A_TOKEN,
    TENANT_B_TOKEN,
};
use super::telemetry::{attributes, exporting_to, Receiver};

const BEARER_SECRET: &str = "echo-bearer-secret-0123456789";
const API_KEY_SECRET: &str = "echo-api-key-secret-0123456789";
const BASIC_PASSWORD: &str = "echo-basic-password-0123456789";
/// With characters a form body percent-encodes, so its encoded echo must be found too.
const CLIENT_SECRET: &str = "echo+client/secret-0123456789";
const CLIENT_ID: &str = "echo-client-id";
const REFUSED_REFRESH_TOKEN: &str = "refused-refresh-token-0123456789";
const GOOD_REFRESH_TOKEN: &str = "good-refresh-token-0123456789";
const ACCESS_TOKEN: &str = "echo-access-token-0123456789";
const WEBHOOK_SECRET: &str = "whsec_c2VjdXJpdHktdGVzdC13ZWJob29rLXNlY3JldA==";

/// A provider that tells back whatever credential it is sent: a token endpoint that refuses the
/// refresh token `refused-…` with 400 and the form it received as the body (and grants any
/// other), and `/echo/{mode}`, which answers `ok` 201 with the credential in a header and the
/// body, `refuse` 422 and `fail` 500 with it in the error. Returns its base URL.
async fn echo_provider() -> String {
    let listener = tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("a loopback port");
    let base = format!("http://{}", listener.local_addr().expect("an address"));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service_fn(echo))
                    .await;
            });
        }
    });
    base
}

async fn echo(
    request: hyper::Request<Incoming>,
) -> Result<hyper::Response<Body>, std::convert::Infallible> {
    let path = request.uri().path().to_owned();
    let credential = ["authorization", "x-api-key"]
        .iter()
        .filter_map(|name| request.headers().get(*name))
        .filter_map(|value| value.to_str().ok())
        .collect::<Vec<_>>()
        .join(" ");
    let body = axum::body::to_bytes(Body::new(request.into_body()), 1 << 20)
        .await
        .unwrap_or_default();
    let body = String::from_utf8_lossy(&body).into_owned();
    let reply = |status: u16, text: String| {
        hyper::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .header("x-echo", credential.clone())
            .body(Body::from(text))
            .expect("a response")
    };
    let answer = match path.as_str() {
        "/oauth/token" if body.contains("refused-refresh-token") => {
            // The body is the form as received: client_secret=…&refresh_token=…
            hyper::Response::builder()
                .status(400)
                .header("content-type", "text/plain")
                .body(Body::from(format!("cannot use this grant: {body}")))
                .expect("a response")
        }
        "/oauth/token" => reply(
            200,
            json!({"access_token": ACCESS_TOKEN, "token_type": "bearer", "expires_in": 3600})
                .to_string(),
        ),
        "/echo/ok" => reply(
            201,
            json!({"id": "obj-1", "seen": credential}).to_string(),
        ),
        "/echo/refuse" => reply(
            422,
            json!({"error": {"type": "bad_credentials", "message": format!("Authorization: {credential} is not accepted; got {body}")}}).to_string(),
        ),
        "/echo/fail" => reply(500, format!("upstream failed; it was sent {credential}")),
        _ => reply(201, json!({"id": path}).to_string()),
    };
    Ok(answer)
}

/// A connector document whose actions reach the echo provider with `auth`.
fn echo_document(id: &str, auth: &str) -> String {
    let text = r#"
id = "ID"
description = "a provider that echoes what it is sent"

[auth]
AUTH

[[actions]]
name = "create_note"
description = "create a note"

[actions.input]
type = "object"
required = ["mode"]
properties.mode = { type = "string" }

[actions.request]
method = "POST"
path = "/echo/{{args.mode}}"
body_base = "args"

[actions.response]
success = [201]
id = "/id"

[actions.dedup]
kind = "none"

[actions.lookup]
kind = "none"

[[actions]]
name = "add_deal_note"
description = "add a note to a deal"

[actions.input]
type = "object"
required = ["deal"]
properties.deal = { type = "string" }
properties.note = { type = "string" }

[actions.request]
method = "POST"
path = "/deals/{{args.deal}}/notes"
body_base = "args"

[actions.response]
success = [201]
id = "/id"

[actions.dedup]
kind = "none"

[actions.lookup]
kind = "none"
"#;
    text.replace("ID", id).replace("AUTH", auth)
}

/// The harness's configuration with four echo connectors (bearer, header, basic, OAuth2 with a
/// refused and a granted account), all tenant A's, and a webhook with a secret.
fn with_echo_connectors(harness: &Harness, base: &str) {
    let connector = |id: &str, auth: &str, accounts: &str| {
        format!(
            "\n[[connectors]]\nid = \"{id}\"\nbase_url = \"{base}\"\nrequest_timeout_ms = 2000\ninline = '''{}'''\n{accounts}",
            echo_document(id, auth)
        )
    };
    let account = |id: &str, credentials: &str| {
        format!(
            "\n[[connectors.accounts]]\nid = \"{id}\"\ntenants = [\"tenant-a\"]\n{credentials}\n"
        )
    };
    let mut text = std::fs::read_to_string(&harness.config).expect("the configuration");
    text.push_str(&connector(
        "echo-bearer",
        "kind = \"bearer\"",
        &account("main", &format!("token = \"{BEARER_SECRET}\"")),
    ));
    text.push_str(&connector(
        "echo-key",
        "kind = \"header\"\nheader = \"X-Api-Key\"",
        &account("main", &format!("token = \"{API_KEY_SECRET}\"")),
    ));
    text.push_str(&connector(
        "echo-basic",
        "kind = \"basic\"",
        &account(
            "main",
            "username_env = \"ECHO_USERNAME\"\npassword_env = \"ECHO_PASSWORD\"",
        ),
    ));
    let oauth_accounts = account(
        "refused",
        "client_id_env = \"ECHO_CLIENT_ID\"\nclient_secret_env = \"ECHO_CLIENT_SECRET\"\nrefresh_token_env = \"ECHO_REFUSED_REFRESH\"",
    ) + &account(
        "granted",
        "client_id_env = \"ECHO_CLIENT_ID\"\nclient_secret_env = \"ECHO_CLIENT_SECRET\"\nrefresh_token_env = \"ECHO_GOOD_REFRESH\"",
    );
    text.push_str(&connector(
        "echo-oauth",
        "kind = \"oauth2\"\ngrant = \"refresh_token\"\ntoken_url = \"/oauth/token\"",
        &oauth_accounts,
    ));
    text.push_str(&format!(
        "\n[[webhooks]]\nid = \"audit\"\nurl = \"{base}/hooks\"\nsecret_env = \"ECHO_WEBHOOK_SECRET\"\nevents = [\"all\"]\n"
    ));
    std::fs::write(&harness.config, text).expect("configuration written");
}

/// Every configured secret, and the forms an echo may carry it in.
fn secrets() -> Vec<String> {
    let basic_pair = base64_of(format!("echo-user:{BASIC_PASSWORD}").as_bytes());
    let mut all: Vec<String> = [
        BEARER_SECRET,
        API_KEY_SECRET,
        BASIC_PASSWORD,
        CLIENT_SECRET,
        REFUSED_REFRESH_TOKEN,
        GOOD_REFRESH_TOKEN,
        ACCESS_TOKEN,
        WEBHOOK_SECRET,
        TENANT_A_TOKEN,
        TENANT_B_TOKEN,
        OPERATOR_TOKEN,
    ]
    .iter()
    .map(|secret| (*secret).to_owned())
    .collect();
    all.push(basic_pair);
    all.push(CLIENT_SECRET.replace('+', "%2B").replace('/', "%2F"));
    all
}

fn base64_of(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn assert_no_secret(surface: &str, text: &str) {
    for secret in secrets() {
        assert!(
            !text.contains(&secret),
            "{surface} holds the secret `{secret}`:\n{text}"
        );
    }
}

fn start_verbose(harness: &Harness) -> Server {
    start_verbose_with(harness, &[])
}

/// `start_verbose` with more of the environment (e.g. where to export traces).
fn start_verbose_with(harness: &Harness, more: &[(&str, &str)]) -> Server {
    let mut env = vec![
        // Empty: `-vv` decides the level.
        ("RUST_LOG", ""),
        ("ECHO_USERNAME", "echo-user"),
        ("ECHO_PASSWORD", BASIC_PASSWORD),
        ("ECHO_CLIENT_ID", CLIENT_ID),
        ("ECHO_CLIENT_SECRET", CLIENT_SECRET),
        ("ECHO_REFUSED_REFRESH", REFUSED_REFRESH_TOKEN),
        ("ECHO_GOOD_REFRESH", GOOD_REFRESH_TOKEN),
        ("ECHO_WEBHOOK_SECRET", WEBHOOK_SECRET),
    ];
    env.extend_from_slice(more);
    Server::start_with_env(
        &[
            "-vv",
            "serve",
            "--config",
            &harness.config.display().to_string(),
        ],
        harness.dir.path(),
        &env,
    )
}

/// Records `action` with `args` for tenant A at `provider`/`account` and executes it.
async fn record_and_execute(
    server: &Server,
    provider: &str,
    account: &str,
    action: &str,
    args: Value,
) -> String {
    let body = json!({"provider": provider, "account": account, "action": action, "args": args});
    let (status, recorded) = server.post("/v1/operations", TENANT_A_TOKEN, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    let id = recorded["operation_id"].as_str().expect("an id").to_owned();
    server.execute(TENANT_A_TOKEN, &id, 3000).await;
    id
}

async fn history(server: &Server, id: &str) -> Value {
    let (status, events) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{id}/events"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{events}");
    events
}

/// Waits until operation `id`'s history holds an event of `kind`; returns the history.
async fn until_event(server: &Server, id: &str, kind: &str) -> Value {
    let started = std::time::Instant::now();
    loop {
        let events = history(server, id).await;
        if events.to_string().contains(&format!("\"{kind}\"")) {
            return events;
        }
        assert!(
            started.elapsed() < super::support::DEADLINE,
            "no {kind} in {events}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn mcp_client(
    base: &str,
    token: &str,
    origin: Option<&str>,
) -> Result<rmcp::service::RunningService<rmcp::RoleClient, ()>, String> {
    let mut config =
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            format!("{base}/mcp"),
        )
        .auth_header(token);
    if let Some(origin) = origin {
        let mut headers = HashMap::new();
        headers.insert(
            reqwest::header::ORIGIN,
            reqwest::header::HeaderValue::from_str(origin).expect("a header value"),
        );
        config = config.custom_headers(headers);
    }
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .map_err(|error| error.to_string())
}

fn server_logs(dir: &Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(dir).expect("the directory") {
        let path = entry.expect("an entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("serve-") && name.ends_with(".log") {
            all.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
    all
}

#[tokio::test]
async fn no_secret_a_provider_echoes_back_is_found_in_logs_events_traces_mcp_or_the_export() {
    let harness = Harness::new("").await;
    let base = echo_provider().await;
    with_echo_connectors(&harness, &base);
    let receiver = Receiver::start().await;
    let server = start_verbose_with(&harness, &exporting_to(&receiver.url));

    let mut operations = Vec::new();
    for provider in ["echo-bearer", "echo-key", "echo-basic"] {
        for mode in ["ok", "refuse", "fail"] {
            operations.push(
                record_and_execute(
                    &server,
                    provider,
                    "main",
                    "create_note",
                    json!({"mode": mode}),
                )
                .await,
            );
        }
    }
    // The granted OAuth2 account: the access token is echoed in a header, a body and errors.
    for mode in ["ok", "refuse", "fail"] {
        operations.push(
            record_and_execute(
                &server,
                "echo-oauth",
                "granted",
                "create_note",
                json!({"mode": mode}),
            )
            .await,
        );
    }
    // The refused one: the token endpoint answers 400 with the form (client secret, refresh
    // token) as its body, which becomes the send's postponement reason.
    let refused = record_and_execute(
        &server,
        "echo-oauth",
        "refused",
        "create_note",
        json!({"mode": "ok"}),
    )
    .await;
    let postponed = until_event(&server, &refused, "SendPostponed").await;
    assert!(
        postponed.to_string().contains("client_secret=[redacted]"),
        "the reason keeps the provider's words, the secret taken out: {postponed}"
    );
    operations.push(refused);
    for id in &operations[..operations.len() - 1] {
        server
            .wait_for_state(
                TENANT_A_TOKEN,
                id,
                &["succeeded", "rejected", "needs_review", "unknown"],
            )
            .await;
    }

    for id in &operations {
        assert_no_secret(
            "the events through the API",
            &history(&server, id).await.to_string(),
        );
        let (_, view) = server
            .call(
                Method::GET,
                &format!("/v1/operations/{id}"),
                Some(TENANT_A_TOKEN),
                None,
            )
            .await;
        assert_no_secret("the operation's view", &view.to_string());
    }
    let (_, review) = server
        .call(Method::GET, "/v1/review", Some(OPERATOR_TOKEN), None)
        .await;
    assert_no_secret("the review queue", &review.to_string());

    let client = mcp_client(&server.base, TENANT_A_TOKEN, None)
        .await
        .expect("the MCP session starts");
    for id in &operations {
        let status = client
            .call_tool(
                CallToolRequestParams::new("operation_status").with_arguments(
                    json!({"operation_id": id})
                        .as_object()
                        .expect("an object")
                        .clone(),
                ),
            )
            .await
            .expect("the status tool answers");
        assert_no_secret(
            "the MCP status",
            &serde_json::to_string(&status).expect("json"),
        );
    }
    let _ = client.cancel().await;

    let export = harness.dir.path().join("export.ndjson");
    let exported = std::process::Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["export", "--db"])
        .arg(harness.dir.path().join("ledger.db"))
        .arg("--out")
        .arg(&export)
        .output()
        .expect("opledger export runs");
    assert!(exported.status.success(), "{exported:?}");
    assert_no_secret(
        "the export",
        &std::fs::read_to_string(&export).expect("the export"),
    );

    // Every operation's spans reach the collector, the refused token grant's among them, whose
    // error carried the echoed form; not one span holds a secret.
    let spans = receiver
        .until("a span of every operation", |spans| {
            operations.iter().all(|id| {
                spans
                    .iter()
                    .any(|span| attributes(span).values().any(|value| value == id))
            })
        })
        .await;
    let exported = format!("{spans:?}");
    assert!(
        exported.contains("[redacted]"),
        "a provider's words reached a span, the secret taken out"
    );
    assert_no_secret("the exported spans", &exported);

    drop(server);
    let logs = server_logs(harness.dir.path());
    assert!(
        logs.contains("DEBUG"),
        "the log is at -vv (debug lines present)"
    );
    assert_no_secret("the log at -vv", &logs);
}

/// The harness with the echo connectors, started with their secrets in the environment.
async fn echo_server(harness: &Harness) -> Server {
    let base = echo_provider().await;
    with_echo_connectors(harness, &base);
    start_verbose(harness)
}

fn note(deal: &str) -> Value {
    json!({"provider": "echo-bearer", "account": "main", "action": "add_deal_note",
           "args": {"deal": deal, "note": "call back"}})
}

#[tokio::test]
async fn a_path_value_that_is_a_dot_segment_is_refused_naming_the_field_and_each_attempt_records_its_request(
) {
    let harness = Harness::new("").await;
    let base = echo_provider().await;
    with_echo_connectors(&harness, &base);
    let server = start_verbose(&harness);
    for deal in [".", "..", "%2e", "%2E%2e", ".%2E", "%252e%252e"] {
        let (status, refused) = server
            .post("/v1/operations", TENANT_A_TOKEN, &note(deal))
            .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{deal}: {refused}"
        );
        assert_eq!(
            refused["error"]["fields"][0]["pointer"], "/args/deal",
            "{deal}: {refused}"
        );
        assert!(
            refused["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains("dot segment")),
            "{refused}"
        );
    }
    // Dots inside a value are a value like any other, and the attempt records what it sent.
    let (status, recorded) = server
        .post("/v1/operations", TENANT_A_TOKEN, &note("a..b"))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    let id = recorded["operation_id"].as_str().expect("an id");
    server.execute(TENANT_A_TOKEN, id, 3000).await;
    server
        .wait_for_state(TENANT_A_TOKEN, id, &["succeeded"])
        .await;
    let events = history(&server, id).await;
    let started = events["events"]
        .as_array()
        .expect("a list")
        .iter()
        .find(|event| event["type"] == "AttemptStarted")
        .expect("an attempt");
    assert_eq!(
        started["data"]["request"],
        format!("POST {base}/deals/a..b/notes"),
        "{started}"
    );
}

#[tokio::test]
async fn mcp_refuses_a_foreign_origin_and_answers_loopback_listed_and_originless_clients() {
    let harness = Harness::new("").await;
    let mut text = std::fs::read_to_string(&harness.config).expect("the configuration");
    text.push_str("\n[mcp]\nallowed_origins = [\"https://agent.example.com\"]\n");
    std::fs::write(&harness.config, text).expect("written");
    let server = harness.serve();
    let refused = mcp_client(&server.base, TENANT_A_TOKEN, Some("http://evil.example")).await;
    assert!(refused.is_err(), "a forged Origin is refused");
    let raw = reqwest::Client::new()
        .post(format!("{}/mcp", server.base))
        .bearer_auth(TENANT_A_TOKEN)
        .header("origin", "http://127.0.0.1.evil.example")
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .send()
        .await
        .expect("answered");
    assert_eq!(raw.status(), StatusCode::FORBIDDEN);
    let said = raw.text().await.expect("a body");
    assert!(said.contains("allowed_origins"), "{said}");
    for origin in [
        None,
        Some("http://localhost:5173"),
        Some("https://agent.example.com"),
    ] {
        let client = mcp_client(&server.base, TENANT_A_TOKEN, origin)
            .await
            .unwrap_or_else(|error| panic!("{origin:?} is answered: {error}"));
        let tools = client.list_all_tools().await.expect("the tools");
        assert!(!tools.is_empty(), "{origin:?}");
        let _ = client.cancel().await;
    }
}

/// The decision events of operation `id` (through the API).
async fn decisions(server: &Server, token: &str, id: &str) -> Vec<Value> {
    let (status, events) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{id}/events"),
            Some(token),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{events}");
    events["events"]
        .as_array()
        .expect("a list")
        .iter()
        .filter(|event| {
            ["ApprovalGranted", "ApprovalDenied", "ReviewResolved"]
                .contains(&event["type"].as_str().unwrap_or_default())
        })
        .cloned()
        .collect()
}

#[tokio::test]
async fn every_decision_names_the_token_that_made_it_beside_the_name_written() {
    let harness = Harness::new("").await;
    let server = echo_server(&harness).await;
    // Tenant A has no approver: its own token approves, under any name it writes.
    let recorded = server
        .record_for_approval(TENANT_A_TOKEN, "approve me")
        .await;
    let id = recorded["operation_id"].as_str().expect("an id");
    let body = json!({"approver": "Jane Doe (CFO)", "args_hash": recorded["args_hash"]});
    let (status, approved) = server
        .post(
            &format!("/v1/operations/{id}/approve"),
            TENANT_A_TOKEN,
            &body,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    let granted = &decisions(&server, TENANT_A_TOKEN, id).await[0];
    assert_eq!(granted["data"]["approver"], "Jane Doe (CFO)", "{granted}");
    assert_eq!(
        granted["data"]["principal"],
        json!({"kind": "tenant_token", "name": "tenant-a"})
    );
    // Tenant B's approver denies under its configured name.
    let recorded = server.record_for_approval(TENANT_B_TOKEN, "deny me").await;
    let id = recorded["operation_id"].as_str().expect("an id");
    let body = json!({"args_hash": recorded["args_hash"], "reason": "not this client"});
    let (status, denied) = server
        .post(
            &format!("/v1/operations/{id}/deny"),
            APPROVER_B_TOKEN,
            &body,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{denied}");
    let denial = &decisions(&server, TENANT_B_TOKEN, id).await[0];
    assert_eq!(
        denial["data"]["principal"],
        json!({"kind": "approver", "name": "b-approver"}),
        "{denial}"
    );
    // An operator's review decision.
    let failed = record_and_execute(
        &server,
        "echo-bearer",
        "main",
        "create_note",
        json!({"mode": "fail"}),
    )
    .await;
    server
        .wait_for_state(TENANT_A_TOKEN, &failed, &["needs_review"])
        .await;
    let body = json!({"decision": "abandon", "note": "checked by hand: nothing there"});
    let (status, decided) = server
        .post(
            &format!("/v1/operations/{failed}/review"),
            OPERATOR_TOKEN,
            &body,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    let resolved = &decisions(&server, TENANT_A_TOKEN, &failed).await[0];
    assert_eq!(
        resolved["data"]["principal"],
        json!({"kind": "operator", "name": "oncall"}),
        "{resolved}"
    );
    // The export carries them too.
    let export = harness.dir.path().join("decisions.ndjson");
    let exported = std::process::Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["export", "--db"])
        .arg(harness.dir.path().join("ledger.db"))
        .arg("--out")
        .arg(&export)
        .output()
        .expect("opledger export runs");
    assert!(exported.status.success(), "{exported:?}");
    // Each event's data is there as the exact text stored, a JSON string in the line.
    let text = std::fs::read_to_string(&export)
        .expect("the export")
        .replace("\\\"", "\"");
    for principal in [
        r#""principal":{"kind":"tenant_token","name":"tenant-a"}"#,
        r#""principal":{"kind":"approver","name":"b-approver"}"#,
        r#""principal":{"kind":"operator","name":"oncall"}"#,
    ] {
        assert!(text.contains(principal), "{principal} in the export");
    }
}

#[tokio::test]
async fn what_a_tenant_is_told_gives_nothing_away_about_other_tenants_or_routes() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let record = |account: &str| json!({"provider": "crm", "account": account, "action": "create_task", "args": {"title": "x"}});
    // Another tenant's account and an account that does not exist are refused in the same words.
    let (status, not_owned) = server
        .post(
            "/v1/operations",
            TENANT_B_TOKEN,
            &record(super::support::A_ONLY_ACCOUNT),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{not_owned}");
    let (status, unknown) = server
        .post("/v1/operations", TENANT_B_TOKEN, &record("acct-9"))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{unknown}");
    assert_eq!(
        not_owned["error"]["message"]
            .as_str()
            .map(|m| m.replace(super::support::A_ONLY_ACCOUNT, "ACCOUNT")),
        unknown["error"]["message"]
            .as_str()
            .map(|m| m.replace("acct-9", "ACCOUNT")),
    );
    // Another tenant's operation is as missing as one that never was, on every route.
    let mine = server.marker(TENANT_A_TOKEN).await;
    let never = "00000000-0000-4000-8000-000000000000";
    for (token, path) in [
        (TENANT_B_TOKEN, format!("/v1/operations/{mine}")),
        (TENANT_B_TOKEN, format!("/v1/operations/{mine}/events")),
        (TENANT_B_TOKEN, format!("/v1/operations/{never}")),
    ] {
        let (status, answer) = server.call(Method::GET, &path, Some(token), None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {answer}");
    }
    let body = json!({"args_hash": "sha256:00", "approver": "x"});
    let (status, _) = server
        .post(
            &format!("/v1/operations/{mine}/approve"),
            APPROVER_B_TOKEN,
            &body,
        )
        .await;
    assert!(
        status == StatusCode::NOT_FOUND || status == StatusCode::UNPROCESSABLE_ENTITY,
        "tenant B's approver cannot reach tenant A's operation: {status}"
    );
    let body = json!({"decision": "abandon", "note": "x"});
    let (status, _) = server
        .post(
            &format!("/v1/operations/{mine}/review"),
            OPERATOR_B_TOKEN,
            &body,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a scoped operator sees its tenants only"
    );
    // Scopes: a tenant token is no operator's, and the refusal names the route asked for (a
    // tenant lists and manages its own webhook endpoints, but pausing one is an operator's).
    let (status, refused) = server
        .call(
            Method::POST,
            "/v1/webhooks/billing/pause",
            Some(TENANT_A_TOKEN),
            Some(&json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("POST /v1/webhooks/{id}/pause needs an operator token")),
        "{refused}"
    );
    let (status, _) = server
        .call(Method::GET, "/v1/review", Some(TENANT_A_TOKEN), None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn authorization_takes_any_case_names_its_scheme_on_401_and_refuses_two_headers() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let client = reqwest::Client::new();
    let review = format!("{}/v1/review", server.base);
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let answer = client
            .get(&review)
            .header("authorization", format!("{scheme} {OPERATOR_TOKEN}"))
            .send()
            .await
            .expect("answered");
        assert_eq!(answer.status(), StatusCode::OK, "{scheme}");
    }
    let answer = client.get(&review).send().await.expect("answered");
    assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        answer
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer realm=\"opledger\"")
    );
    let answer = client
        .get(&review)
        .header("authorization", format!("Bearer {OPERATOR_TOKEN}"))
        .header("authorization", format!("Bearer {TENANT_A_TOKEN}"))
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), StatusCode::BAD_REQUEST);
    let said: Value = answer.json().await.expect("json");
    assert_eq!(said["error"]["code"], "duplicate_authorization", "{said}");
}

/// Posts one JSON-RPC message to `/mcp` as tenant A; the answer's JSON (or SSE data line).
async fn mcp_post(server: &Server, message: &str) -> Value {
    let answer = reqwest::Client::new()
        .post(format!("{}/mcp", server.base))
        .bearer_auth(TENANT_A_TOKEN)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(message.to_owned())
        .send()
        .await
        .expect("answered");
    let text = answer.text().await.expect("a body");
    let json = text
        .lines()
        .find_map(|line| line.strip_prefix("data:"))
        .unwrap_or(&text);
    serde_json::from_str(json.trim()).unwrap_or_else(|_| panic!("JSON: {text}"))
}

#[tokio::test]
async fn a_key_given_twice_or_arguments_that_are_no_object_are_refused_over_the_api_and_mcp() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let body = format!(
        r#"{{"provider":"crm","account":"{ACCOUNT}","action":"create_task","args":{{"title":"d1","title":"d2"}}}}"#
    );
    let (status, refused) = server
        .call_raw("/v1/operations", TENANT_A_TOKEN, body.into_bytes())
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("args.title") && m.contains("twice")),
        "{refused}"
    );
    let twice = mcp_post(
        &server,
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"crm__create_task","arguments":{"title":"d1","title":"d2"}}}"#,
    )
    .await;
    assert_eq!(twice["error"]["code"], -32602, "{twice}");
    assert_eq!(twice["id"], 7);
    let not_object = mcp_post(
        &server,
        r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"crm__create_task","arguments":"notanobject"}}"#,
    )
    .await;
    assert_eq!(not_object["error"]["code"], -32602, "{not_object}");
    assert!(harness.objects().await.is_empty(), "nothing was sent");
}

#[cfg(unix)]
#[tokio::test]
async fn the_ledger_read_models_and_webhook_journal_are_their_owners_only() {
    use std::os::unix::fs::PermissionsExt as _;
    let harness = Harness::new("").await;
    let server = echo_server(&harness).await;
    server.marker(TENANT_A_TOKEN).await;
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(harness.dir.path()).expect("the directory") {
        let path = entry.expect("an entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_owned();
        // The test's own files (configuration, logs) are not the server's.
        if name.ends_with(".toml") || name.ends_with(".log") {
            continue;
        }
        let mode = std::fs::metadata(&path)
            .expect("metadata")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{name} is {mode:o}");
        checked.push(name);
    }
    assert!(
        checked.iter().any(|n| n == "ledger.db")
            && checked.iter().any(|n| n.starts_with("ledger.views")),
        "{checked:?}"
    );
}

#[test]
fn a_device_given_as_the_ledger_is_refused_before_sqlite_touches_it() {
    let dir = tempfile::tempdir().expect("a directory");
    let journal = Path::new("/dev/null-journal");
    let existed = journal.exists();
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["ops", "list", "--db", "/dev/null"])
        .current_dir(dir.path())
        .output()
        .expect("opledger runs");
    assert!(!refused.status.success(), "{refused:?}");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("not a regular file"), "{said}");
    assert!(
        existed || !journal.exists(),
        "no journal was made beside the device"
    );
}

#[tokio::test]
async fn metrics_of_several_tenants_need_the_scrapers_token_and_the_start_says_so() {
    let harness = Harness::new("").await;
    let text = std::fs::read_to_string(&harness.config).expect("the configuration");
    let closed = text.replace("[metrics]\nopen = true\nendpoint_labels = true\n", "");
    assert_ne!(closed, text, "the harness declared /metrics open");
    std::fs::write(&harness.config, &closed).expect("written");
    let server = harness.serve();
    for token in [None, Some(TENANT_A_TOKEN), Some(OPERATOR_TOKEN)] {
        let (status, refused) = server.call(Method::GET, "/metrics", token, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{token:?}: {refused}");
    }
    drop(server);
    assert!(
        server_logs(harness.dir.path()).contains("/metrics is closed"),
        "the start says so"
    );
    let scraper = "scraper-token-0123456789";
    let with_token = closed.replacen(
        "[[tenants]]",
        &format!("[metrics]\ntoken = \"{scraper}\"\n\n[[tenants]]"),
        1,
    );
    std::fs::write(&harness.config, with_token).expect("written");
    let server = harness.serve();
    let answer = reqwest::Client::new()
        .get(format!("{}/metrics", server.base))
        .bearer_auth(scraper)
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), StatusCode::OK);
    drop(server);

    // An endpoint's counts are one tenant's activity: summed over endpoints, without the
    // endpoint's id, unless the configuration asks for labels.
    let scrape = |server: &Server| {
        let url = format!("{}/metrics", server.base);
        async move {
            reqwest::Client::new()
                .get(url)
                .bearer_auth(scraper)
                .send()
                .await
                .expect("answered")
                .text()
                .await
                .expect("a body")
        }
    };
    let base = echo_provider().await;
    with_echo_connectors(&harness, &base);
    let server = start_verbose(&harness);
    record_and_execute(
        &server,
        "echo-bearer",
        "main",
        "create_note",
        json!({"mode": "ok"}),
    )
    .await;
    let summed = scrape(&server).await;
    assert!(
        !summed.contains("endpoint=\"audit\""),
        "no endpoint's id by default:\n{summed}"
    );
    assert!(
        summed.contains("\nopledger_webhook_active 1\n")
            && summed.contains("\nopledger_webhook_delivered_total "),
        "the webhook metrics summed over endpoints:\n{summed}"
    );
    drop(server);
    let configured = std::fs::read_to_string(&harness.config).expect("the configuration");
    std::fs::write(
        &harness.config,
        configured.replacen("[metrics]\n", "[metrics]\nendpoint_labels = true\n", 1),
    )
    .expect("written");
    let server = start_verbose(&harness);
    let labelled = scrape(&server).await;
    assert!(
        labelled.contains("opledger_webhook_active{endpoint=\"audit\"} 1"),
        "labelled when asked for:\n{labelled}"
    );
}

#[tokio::test]
async fn keyed_fingerprints_keep_operations_recorded_under_unkeyed_ones_sendable() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let recorded = server
        .record_for_approval(TENANT_A_TOKEN, "recorded before the key")
        .await;
    let id = recorded["operation_id"].as_str().expect("an id").to_owned();
    let events = history(&server, &id).await;
    assert!(
        events
            .to_string()
            .contains("\"credential_fingerprint\":\"sha256:"),
        "{events}"
    );
    drop(server);
    // The server is given a fingerprint key.
    let text = std::fs::read_to_string(&harness.config).expect("the configuration");
    let keyed = text.replacen(
        "listen = ",
        "credential_fingerprint_key_env = \"FINGERPRINT_KEY\"\nlisten = ",
        1,
    );
    std::fs::write(&harness.config, keyed).expect("written");
    let key = "fingerprint-key-0123456789abcdef0123456789abcdef";
    let server = Server::start_with_env(
        &["serve", "--config", &harness.config.display().to_string()],
        harness.dir.path(),
        &[("FINGERPRINT_KEY", key)],
    );
    // The operation recorded under the unkeyed fingerprint is approved and sent as recorded.
    let body = json!({"approver": "a-lead", "args_hash": recorded["args_hash"]});
    let (status, approved) = server
        .post(
            &format!("/v1/operations/{id}/approve"),
            TENANT_A_TOKEN,
            &body,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    server.execute(TENANT_A_TOKEN, &id, 3000).await;
    let done = server
        .wait_for_state(TENANT_A_TOKEN, &id, &["succeeded", "needs_review"])
        .await;
    assert_eq!(done["state"], "succeeded", "{done}");
    // A new one is bound under the keyed fingerprint.
    let fresh = server
        .record_for_approval(TENANT_A_TOKEN, "recorded with the key")
        .await;
    let fresh_id = fresh["operation_id"].as_str().expect("an id");
    let events = history(&server, fresh_id).await.to_string();
    assert!(
        events.contains("\"credential_fingerprint\":\"hmac-sha256:"),
        "{events}"
    );
}
