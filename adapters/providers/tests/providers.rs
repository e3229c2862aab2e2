//! The stand's three connector files against the real CRM stand on 127.0.0.1: every shape, every
//! fault the stand can inject, and every lookup, seen through the domain's `Providers` port. The
//! connectors are the embedded presets, run through the same code as any user's connector file.
//!
//! Each test starts its own stand on an ephemeral port, so the stand clock, task ids and the
//! fault queue are never shared. The admin API is driven over plain HTTP by the small helper
//! below, as the contract in the stand's module docs describes it, so these tests check the
//! adapters against the contract rather than against the stand's Rust API.

use std::net::SocketAddr;

use opledger_crm_stand::{Stand, StandConfig};
use opledger_domain::args::ArgsSnapshot;
use opledger_domain::ids::{AccountId, ActionName, ProviderId, TenantId};
use opledger_domain::ports::IdSource;
use opledger_domain::provider::{
    operation_label, BindingQuery, LookupOutcome, LookupRequest, Providers, SendOutcome,
    SendRequest,
};
use opledger_providers::{AccountSpec, Connector, Credentials, HttpProviders, Overrides, Shape};
use opledger_runtime::system::RandomIds;
use serde_json::{json, Value};

/// Short, so the late-response test waits less than a second.
const REQUEST_TIMEOUT_MS: u64 = 800;
const CONNECT_TIMEOUT_MS: u64 = 300;
/// The stand's default search lag, as the plain connector declares it.
const SEARCH_LAG_MS: u64 = 2_000;

const SHAPES: [Shape; 3] = Shape::ALL;

fn provider_id(shape: Shape) -> ProviderId {
    ProviderId::new(format!("stand-{shape}")).expect("a valid provider id")
}

fn account(name: &str) -> AccountId {
    AccountId::new(name).expect("a valid account id")
}

fn tenant(name: &str) -> TenantId {
    TenantId::new(name).expect("a valid tenant id")
}

fn owned_by_acme(name: &str, token: &str) -> AccountSpec {
    AccountSpec {
        id: account(name),
        tenants: vec![tenant("acme")],
        credentials: Credentials::token(token),
    }
}

fn overrides(shape: Shape, base_url: &str, token_acct_1: &str) -> Overrides {
    Overrides {
        id: Some(provider_id(shape)),
        base_url: Some(base_url.to_owned()),
        accounts: vec![
            owned_by_acme("acct-1", token_acct_1),
            owned_by_acme("acct-2", "token-acct-2"),
            // Configured here, unknown to the stand.
            owned_by_acme("acct-9", "token-acct-9"),
        ],
        request_timeout_ms: Some(REQUEST_TIMEOUT_MS),
        connect_timeout_ms: Some(CONNECT_TIMEOUT_MS),
        ..Overrides::default()
    }
}

fn connector(shape: Shape, base_url: &str, token_acct_1: &str) -> Connector {
    Connector::from_preset(shape.preset(), overrides(shape, base_url, token_acct_1))
        .unwrap_or_else(|errors| panic!("{}", opledger_providers::render_all(&errors)))
}

fn registry(base_url: &str, token_acct_1: &str) -> HttpProviders {
    HttpProviders::new(SHAPES.map(|shape| connector(shape, base_url, token_acct_1)))
        .expect("one connector per provider id")
}

/// The stand's admin API, over plain HTTP.
struct Admin {
    client: reqwest::Client,
    base_url: String,
}

impl Admin {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self
            .client
            .request(method.clone(), format!("{}{path}", self.base_url));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.expect("the admin API answers");
        let status = response.status();
        let bytes = response.bytes().await.expect("the admin body is read");
        assert!(
            status.is_success(),
            "{method} {path} → {status}: {}",
            String::from_utf8_lossy(&bytes)
        );
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    }

    /// Queues `times` faults of `kind` for the next matching requests of `shape`.
    async fn fault(&self, shape: Shape, method: &str, kind: Value) {
        let mut fault = json!({"shape": shape.as_str(), "method": method, "times": 1});
        let fields = kind.as_object().expect("a fault kind is an object").clone();
        fault.as_object_mut().expect("an object").extend(fields);
        self.call(reqwest::Method::POST, "/admin/faults", Some(fault))
            .await;
    }

    async fn advance_clock(&self, ms: u64) {
        self.call(
            reqwest::Method::POST,
            "/admin/clock/advance",
            Some(json!({ "ms": ms })),
        )
        .await;
    }

    async fn objects(&self, shape: Shape) -> Vec<Value> {
        let answer = self
            .call(
                reqwest::Method::GET,
                &format!("/admin/objects?shape={shape}"),
                None,
            )
            .await;
        answer["objects"]
            .as_array()
            .expect("an objects list")
            .clone()
    }

    async fn request_outcomes(&self) -> Vec<String> {
        let answer = self
            .call(reqwest::Method::GET, "/admin/requests", None)
            .await;
        answer["requests"]
            .as_array()
            .expect("a requests list")
            .iter()
            .map(|request| request["outcome"].as_str().unwrap_or("?").to_owned())
            .collect()
    }
}

struct Harness {
    // Kept so the stand lives as long as the test.
    _stand: Stand,
    admin: Admin,
    providers: HttpProviders,
}

async fn harness() -> Harness {
    harness_with_token("token-acct-1").await
}

async fn harness_with_token(token_acct_1: &str) -> Harness {
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("a loopback address");
    let stand = Stand::start(listen, StandConfig::default())
        .await
        .expect("the stand starts");
    let base_url = stand.base_url();
    Harness {
        admin: Admin {
            client: reqwest::Client::new(),
            base_url: base_url.clone(),
        },
        providers: registry(&base_url, token_acct_1),
        _stand: stand,
    }
}

/// A fresh operation's first attempt, with the ids and key the ledger would draw.
fn new_request(shape: Shape, account_name: &str, args: Value) -> SendRequest {
    let ids = RandomIds;
    let operation_id = ids.new_operation_id();
    SendRequest {
        operation_id,
        attempt_id: ids.new_attempt_id(),
        tenant: tenant("acme"),
        provider: provider_id(shape),
        account: account(account_name),
        action: ActionName::new("create_task").expect("a valid action"),
        args: ArgsSnapshot::new(args).expect("valid args"),
        idempotency_key: ids.new_idempotency_key(),
        label: operation_label(operation_id),
    }
}

fn call_the_client(shape: Shape) -> SendRequest {
    new_request(
        shape,
        "acct-1",
        json!({"title": "Call the client", "due": "tomorrow"}),
    )
}

/// The same operation's next attempt: same key, label and arguments, a new attempt id.
fn retry(request: &SendRequest) -> SendRequest {
    SendRequest {
        attempt_id: RandomIds.new_attempt_id(),
        ..request.clone()
    }
}

fn lookup_of(request: &SendRequest) -> LookupRequest {
    LookupRequest {
        operation_id: request.operation_id,
        tenant: request.tenant.clone(),
        provider: request.provider.clone(),
        account: request.account.clone(),
        action: request.action.clone(),
        idempotency_key: request.idempotency_key.clone(),
        label: request.label.clone(),
    }
}

fn confirmed_id(outcome: &SendOutcome) -> String {
    match outcome {
        SendOutcome::Confirmed { external_id, .. } => external_id.as_str().to_owned(),
        other => panic!("expected Confirmed, got {other:?}"),
    }
}

fn assert_uncertain(outcome: &SendOutcome) {
    assert!(
        matches!(outcome, SendOutcome::Uncertain { .. }),
        "expected Uncertain, got {outcome:?}"
    );
}

fn ids_of(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|object| object["id"].as_str().unwrap_or("?").to_owned())
        .collect()
}

#[tokio::test]
async fn every_shape_confirms_a_create_with_the_stands_id_and_request_id() {
    let h = harness().await;
    for shape in SHAPES {
        let request = call_the_client(shape);
        let outcome = h.providers.execute(&request).await;
        let SendOutcome::Confirmed {
            external_id,
            provider_request_id,
        } = &outcome
        else {
            panic!("{shape}: expected Confirmed, got {outcome:?}");
        };
        let request_id = provider_request_id
            .as_ref()
            .expect("the stand names requests");
        assert!(request_id.as_str().starts_with("req_"), "{request_id}");

        let objects = h.admin.objects(shape).await;
        assert_eq!(ids_of(&objects), vec![external_id.as_str().to_owned()]);
        let object = &objects[0];
        assert_eq!(object["account"], "acct-1");
        assert_eq!(object["fields"]["title"], "Call the client");
        match shape {
            Shape::Keyed => assert_eq!(object["key"], request.idempotency_key.as_str()),
            Shape::Labelled | Shape::Plain => assert_eq!(object["label"], request.label.as_str()),
        }
    }
}

#[tokio::test]
async fn a_keyed_retry_after_a_dropped_response_names_the_same_task() {
    let h = harness().await;
    h.admin
        .fault(Shape::Keyed, "POST", json!({"kind": "drop_response"}))
        .await;
    let request = call_the_client(Shape::Keyed);
    assert_uncertain(&h.providers.execute(&request).await);

    let again = h.providers.execute(&retry(&request)).await;
    let id = confirmed_id(&again);
    assert_eq!(ids_of(&h.admin.objects(Shape::Keyed).await), vec![id]);
    assert_eq!(
        h.admin.request_outcomes().await,
        vec!["fault:drop_response", "replayed"]
    );
}

#[tokio::test]
async fn a_labelled_retry_after_a_dropped_response_names_the_same_task() {
    let h = harness().await;
    h.admin
        .fault(Shape::Labelled, "PUT", json!({"kind": "drop_response"}))
        .await;
    let request = call_the_client(Shape::Labelled);
    assert_uncertain(&h.providers.execute(&request).await);

    let id = confirmed_id(&h.providers.execute(&retry(&request)).await);
    assert_eq!(ids_of(&h.admin.objects(Shape::Labelled).await), vec![id]);
}

#[tokio::test]
async fn dropped_requests_and_responses_are_uncertain_for_every_shape() {
    let h = harness().await;
    for shape in SHAPES {
        let method = if shape == Shape::Labelled {
            "PUT"
        } else {
            "POST"
        };
        h.admin
            .fault(shape, method, json!({"kind": "drop_request"}))
            .await;
        assert_uncertain(&h.providers.execute(&call_the_client(shape)).await);
        assert!(h.admin.objects(shape).await.is_empty(), "{shape}");

        h.admin
            .fault(shape, method, json!({"kind": "drop_response"}))
            .await;
        assert_uncertain(&h.providers.execute(&call_the_client(shape)).await);
        assert_eq!(h.admin.objects(shape).await.len(), 1, "{shape}");
    }
}

#[tokio::test]
async fn a_keyed_retry_while_the_first_request_is_still_held_is_not_sent() {
    let h = harness().await;
    h.admin
        .fault(
            Shape::Keyed,
            "POST",
            json!({"kind": "late_response", "delay_ms": 10_000}),
        )
        .await;
    let request = call_the_client(Shape::Keyed);
    // The stand holds the answer past our timeout: the request may well have been applied.
    assert_uncertain(&h.providers.execute(&request).await);

    let again = h.providers.execute(&retry(&request)).await;
    assert!(
        matches!(
            &again,
            SendOutcome::NotSent { reason, retry_after_ms: Some(_) } if reason.contains("idempotency_in_flight")
        ),
        "{again:?}"
    );
    let lookup = h.providers.lookup(&lookup_of(&request)).await;
    assert!(
        matches!(
            &lookup,
            LookupOutcome::InProgress { evidence, retry_after_ms: Some(_) } if evidence.contains("in_progress")
        ),
        "{lookup:?}"
    );
    assert_eq!(h.admin.objects(Shape::Keyed).await.len(), 1);
}

#[tokio::test]
async fn rate_limits_are_not_sent_and_carry_the_wait_in_both_forms() {
    let h = harness().await;
    for shape in SHAPES {
        let method = if shape == Shape::Labelled {
            "PUT"
        } else {
            "POST"
        };
        h.admin
            .fault(
                shape,
                method,
                json!({"kind": "rate_limit", "retry_after_s": 7}),
            )
            .await;
        let outcome = h.providers.execute(&call_the_client(shape)).await;
        assert!(
            matches!(
                outcome,
                SendOutcome::NotSent {
                    retry_after_ms: Some(7_000),
                    ..
                }
            ),
            "{shape}: {outcome:?}"
        );

        h.admin
            .fault(
                shape,
                method,
                json!({"kind": "rate_limit", "retry_after_s": 30, "retry_after_http_date": true}),
            )
            .await;
        let outcome = h.providers.execute(&call_the_client(shape)).await;
        // An HTTP date has whole seconds, and the stand's Date header and Retry-After date are
        // each cut to the second: the wait is 30 s give or take one.
        let SendOutcome::NotSent {
            retry_after_ms: Some(wait_ms),
            ..
        } = outcome
        else {
            panic!("{shape}: expected NotSent with a wait, got {outcome:?}");
        };
        assert!((29_000..=31_000).contains(&wait_ms), "{shape}: {wait_ms}");
        assert!(h.admin.objects(shape).await.is_empty(), "{shape}");
    }
}

#[tokio::test]
async fn server_errors_are_uncertain_whether_or_not_the_stand_committed() {
    let h = harness().await;
    for shape in SHAPES {
        let method = if shape == Shape::Labelled {
            "PUT"
        } else {
            "POST"
        };
        h.admin
            .fault(
                shape,
                method,
                json!({"kind": "error_after_commit", "status": 500}),
            )
            .await;
        assert_uncertain(&h.providers.execute(&call_the_client(shape)).await);
        assert_eq!(h.admin.objects(shape).await.len(), 1, "{shape}");

        // From the client's side a 503 before the commit looks exactly the same.
        h.admin
            .fault(
                shape,
                method,
                json!({"kind": "error_before_commit", "status": 503}),
            )
            .await;
        assert_uncertain(&h.providers.execute(&call_the_client(shape)).await);
        assert_eq!(h.admin.objects(shape).await.len(), 1, "{shape}");
    }
}

#[tokio::test]
async fn a_keyed_retry_after_an_error_after_commit_names_the_committed_task() {
    let h = harness().await;
    h.admin
        .fault(
            Shape::Keyed,
            "POST",
            json!({"kind": "error_after_commit", "status": 502}),
        )
        .await;
    let request = call_the_client(Shape::Keyed);
    assert_uncertain(&h.providers.execute(&request).await);
    let id = confirmed_id(&h.providers.execute(&retry(&request)).await);
    assert_eq!(ids_of(&h.admin.objects(Shape::Keyed).await), vec![id]);
}

#[tokio::test]
async fn a_closed_port_is_not_sent_and_cannot_be_looked_up() {
    // Bind an ephemeral port and let it go: nothing listens there now.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("an address")
    };
    let providers = registry(&format!("http://{closed}"), "token-acct-1");
    for shape in SHAPES {
        let request = call_the_client(shape);
        let outcome = providers.execute(&request).await;
        assert!(
            matches!(
                &outcome,
                SendOutcome::NotSent {
                    retry_after_ms: None,
                    ..
                }
            ),
            "{shape}: {outcome:?}"
        );
        assert!(matches!(
            providers.lookup(&lookup_of(&request)).await,
            LookupOutcome::Unavailable { .. }
        ));
    }
}

#[tokio::test]
async fn a_wrong_token_is_rejected_with_401_and_never_echoed() {
    let h = harness_with_token("not-the-token").await;
    for shape in SHAPES {
        let outcome = h.providers.execute(&call_the_client(shape)).await;
        let SendOutcome::Rejected { code, message } = &outcome else {
            panic!("{shape}: expected Rejected, got {outcome:?}");
        };
        assert_eq!(code, "401 unauthorized");
        assert!(!message.contains("not-the-token"), "{message}");
        assert!(h.admin.objects(shape).await.is_empty());
    }
    let right = connector(Shape::Keyed, "http://127.0.0.1:9", "token-acct-1");
    let fingerprint = |providers: &HttpProviders| {
        let query = BindingQuery {
            tenant: &tenant("acme"),
            provider: &provider_id(Shape::Keyed),
            account: &account("acct-1"),
            action: &ActionName::new("create_task").expect("valid"),
        };
        providers
            .bind(&query)
            .expect("bound")
            .credential_fingerprint
    };
    assert_ne!(
        fingerprint(&h.providers),
        fingerprint(&HttpProviders::new([right]).expect("one connector")),
        "a changed token changes the fingerprint"
    );
}

#[tokio::test]
async fn an_account_the_stand_does_not_know_is_rejected_with_404() {
    let h = harness().await;
    let request = new_request(Shape::Plain, "acct-9", json!({"title": "Call"}));
    let outcome = h.providers.execute(&request).await;
    assert!(
        matches!(&outcome, SendOutcome::Rejected { code, .. } if code.starts_with("404 ")),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_changed_body_under_a_used_key_or_label_is_rejected() {
    let h = harness().await;
    for shape in [Shape::Keyed, Shape::Labelled] {
        let request = call_the_client(shape);
        let first = confirmed_id(&h.providers.execute(&request).await);
        let mut changed = retry(&request);
        changed.args = ArgsSnapshot::new(json!({"title": "Call the client", "due": "next week"}))
            .expect("valid args");
        let outcome = h.providers.execute(&changed).await;
        let expected = match shape {
            Shape::Keyed => "400 idempotency_key_reused",
            _ => "409 label_conflict",
        };
        assert!(
            matches!(&outcome, SendOutcome::Rejected { code, .. } if code == expected),
            "{shape}: {outcome:?}"
        );
        assert_eq!(ids_of(&h.admin.objects(shape).await), vec![first]);
    }
}

#[tokio::test]
async fn keyed_and_labelled_lookups_are_consistent() {
    let h = harness().await;
    for shape in [Shape::Keyed, Shape::Labelled] {
        let never_sent = call_the_client(shape);
        let outcome = h.providers.lookup(&lookup_of(&never_sent)).await;
        assert!(
            matches!(
                &outcome,
                LookupOutcome::NotFound {
                    authoritative: true,
                    ..
                }
            ),
            "{shape}: {outcome:?}"
        );

        h.admin
            .fault(
                shape,
                if shape == Shape::Keyed { "POST" } else { "PUT" },
                json!({"kind": "drop_response"}),
            )
            .await;
        let request = call_the_client(shape);
        assert_uncertain(&h.providers.execute(&request).await);
        let outcome = h.providers.lookup(&lookup_of(&request)).await;
        let LookupOutcome::Found {
            external_id,
            account: found_in,
            evidence,
            ..
        } = &outcome
        else {
            panic!("{shape}: expected Found, got {outcome:?}");
        };
        assert_eq!(found_in, &request.account);
        assert_eq!(
            ids_of(&h.admin.objects(shape).await),
            vec![external_id.as_str().to_owned()]
        );
        assert!(evidence.starts_with("GET /"), "{evidence}");

        // The same key or label in another account is not this operation's object.
        let mut elsewhere = lookup_of(&request);
        elsewhere.account = account("acct-2");
        assert!(matches!(
            h.providers.lookup(&elsewhere).await,
            LookupOutcome::NotFound { .. }
        ));
    }
}

#[tokio::test]
async fn a_plain_lookup_waits_for_the_index_and_never_takes_a_title_for_evidence() {
    let h = harness().await;
    h.admin
        .fault(Shape::Plain, "POST", json!({"kind": "drop_response"}))
        .await;
    let request = call_the_client(Shape::Plain);
    assert_uncertain(&h.providers.execute(&request).await);
    // Somebody else's task with the very same title, in the same account.
    let other = call_the_client(Shape::Plain);
    let other_id = confirmed_id(&h.providers.execute(&other).await);

    let before = h.providers.lookup(&lookup_of(&request)).await;
    assert!(
        matches!(
            &before,
            LookupOutcome::NotFound {
                authoritative: false,
                ..
            }
        ),
        "an empty search before the lag passes proves nothing: {before:?}"
    );

    h.admin.advance_clock(SEARCH_LAG_MS + 1).await;
    let after = h.providers.lookup(&lookup_of(&request)).await;
    let LookupOutcome::Found {
        external_id,
        account: found_in,
        evidence,
        duplicates,
    } = &after
    else {
        panic!("expected Found after the lag, got {after:?}");
    };
    assert_ne!(
        external_id.as_str(),
        other_id,
        "a title match is not evidence"
    );
    assert!(duplicates.is_empty(), "{duplicates:?}");
    assert_eq!(found_in, &request.account);
    assert!(
        evidence.contains("/plain/acct-1/tasks/search?label=opl-")
            && evidence.contains(&format!("1 result: {external_id}")),
        "{evidence}"
    );

    // An operation never sent finds nothing, even though tasks with its title exist.
    let never_sent = call_the_client(Shape::Plain);
    assert!(matches!(
        h.providers.lookup(&lookup_of(&never_sent)).await,
        LookupOutcome::NotFound {
            authoritative: false,
            ..
        }
    ));
    // The same label searched in another account is not evidence either.
    let mut elsewhere = lookup_of(&request);
    elsewhere.account = account("acct-2");
    assert!(matches!(
        h.providers.lookup(&elsewhere).await,
        LookupOutcome::NotFound { .. }
    ));
}

#[tokio::test]
async fn a_plain_lookup_names_duplicates_and_takes_the_earliest() {
    let h = harness().await;
    let request = call_the_client(Shape::Plain);
    // A plain provider cannot tell a retry from a new request: two tasks carry one label.
    let first = confirmed_id(&h.providers.execute(&request).await);
    let second = confirmed_id(&h.providers.execute(&retry(&request)).await);
    assert_ne!(first, second);
    h.admin.advance_clock(SEARCH_LAG_MS + 1).await;

    let outcome = h.providers.lookup(&lookup_of(&request)).await;
    let LookupOutcome::Found {
        external_id,
        evidence,
        duplicates,
        ..
    } = &outcome
    else {
        panic!("expected Found, got {outcome:?}");
    };
    assert_eq!(external_id.as_str(), first);
    assert_eq!(
        duplicates.iter().map(|id| id.as_str()).collect::<Vec<_>>(),
        vec![second.as_str()]
    );
    assert!(
        evidence.contains(&format!("{first}, {second}")) && evidence.contains("DUPLICATES"),
        "{evidence}"
    );
}

#[tokio::test]
async fn lookups_that_meet_a_fault_are_unavailable() {
    let h = harness().await;
    for shape in SHAPES {
        let request = call_the_client(shape);
        confirmed_id(&h.providers.execute(&request).await);
        h.admin
            .fault(
                shape,
                "GET",
                json!({"kind": "rate_limit", "retry_after_s": 3}),
            )
            .await;
        assert!(matches!(
            h.providers.lookup(&lookup_of(&request)).await,
            LookupOutcome::Unavailable {
                retry_after_ms: Some(3_000),
                ..
            }
        ));
        h.admin
            .fault(
                shape,
                "GET",
                json!({"kind": "error_before_commit", "status": 503}),
            )
            .await;
        assert!(matches!(
            h.providers.lookup(&lookup_of(&request)).await,
            LookupOutcome::Unavailable { .. }
        ));
        h.admin
            .fault(shape, "GET", json!({"kind": "drop_response"}))
            .await;
        assert!(matches!(
            h.providers.lookup(&lookup_of(&request)).await,
            LookupOutcome::Unavailable { .. }
        ));
    }
}

#[tokio::test]
async fn a_tls_handshake_that_fails_is_not_sent() {
    // The stand speaks plain HTTP, so a TLS handshake with it fails before any request is written.
    let h = harness().await;
    let https = h.admin.base_url.replacen("http://", "https://", 1);
    let providers = registry(&https, "token-acct-1");
    let outcome = providers.execute(&call_the_client(Shape::Keyed)).await;
    // The TLS stack is compiled in: the failure comes from the handshake, not from a client
    // that cannot speak https at all ("builder error").
    assert!(
        matches!(&outcome, SendOutcome::NotSent { reason, .. } if !reason.contains("builder")),
        "{outcome:?}"
    );
    assert!(h.admin.objects(Shape::Keyed).await.is_empty());
}

#[tokio::test]
async fn a_tenant_that_does_not_own_the_account_sends_nothing_and_looks_nothing_up() {
    let h = harness().await;
    for shape in SHAPES {
        let mut request = call_the_client(shape);
        request.tenant = tenant("globex");
        let outcome = h.providers.execute(&request).await;
        assert!(
            matches!(&outcome, SendOutcome::NotSent { reason, retry_after_ms: None } if reason.contains("is not an account of provider") && reason.contains("that this tenant may use")),
            "{shape}: {outcome:?}"
        );
        assert!(matches!(
            h.providers.lookup(&lookup_of(&request)).await,
            LookupOutcome::Unavailable { .. }
        ));
    }
    assert!(
        h.admin.request_outcomes().await.is_empty(),
        "nothing reached the stand"
    );
}

#[tokio::test]
async fn the_stand_connectors_bind_each_action_to_its_own_contract() {
    let h = harness().await;
    let query = |shape: Shape, tenant_name: &str, account_name: &str, action: &str| {
        let tenant = tenant(tenant_name);
        let provider = provider_id(shape);
        let account = account(account_name);
        let action = ActionName::new(action).expect("valid");
        h.providers
            .bind(&BindingQuery {
                tenant: &tenant,
                provider: &provider,
                account: &account,
                action: &action,
            })
            .map(|binding| binding.capabilities)
            .map_err(|unbound| unbound.to_string())
    };
    use opledger_domain::contract::{Deduplication, LookupSupport};
    assert!(matches!(
        query(Shape::Keyed, "acme", "acct-1", "create_task"),
        Ok(capabilities) if matches!(capabilities.deduplication, Deduplication::IdempotencyKey { retention_s: 86_400, safety_margin_s: 3_600 })
            && capabilities.lookup == LookupSupport::Consistent
    ));
    assert!(matches!(
        query(Shape::Plain, "acme", "acct-1", "create_task"),
        Ok(capabilities) if capabilities.deduplication == Deduplication::None
            && capabilities.lookup == LookupSupport::EventuallyConsistent { lag_ms: SEARCH_LAG_MS }
    ));
    let unknown_action =
        query(Shape::Labelled, "acme", "acct-1", "delete_task").expect_err("unknown");
    assert!(unknown_action.contains("create_task"), "{unknown_action}");
    assert!(query(Shape::Labelled, "globex", "acct-1", "create_task").is_err());
    assert!(query(Shape::Labelled, "acme", "acct-7", "create_task").is_err());
}
