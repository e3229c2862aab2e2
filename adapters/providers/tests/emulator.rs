//! Connector features the CRM stand does not have, against a small emulator on 127.0.0.1: API-key
//! header auth, basic auth, form bodies, an id from a `Location` header, an error rule, a
//! rate-limit reset header, a POST search with a JSON body, typed values in a JSON body.
//!
//! The emulator answers whatever the test scripted next and records every request it received,
//! so each test asserts both what went over the wire (method, path, headers, body) and the
//! outcome. The connectors are written as TOML here, exactly as a user would write them.

mod scripted;

use opledger_domain::args::ArgsSnapshot;
use opledger_domain::ids::{AccountId, ActionName, ProviderId, TenantId};
use opledger_domain::ports::IdSource;
use opledger_domain::provider::{
    operation_label, LookupOutcome, LookupRequest, SendOutcome, SendRequest,
};
use opledger_providers::{parse, AccountSpec, Connector, Credentials, Overrides};
use opledger_runtime::system::RandomIds;
use serde_json::{json, Value};

use scripted::{answer, Emulator};

/// A Stripe-like API: an API key in a header, form bodies, ids in `Location`, errors in a list.
const PAYMENTS: &str = r#"
id = "payments"
description = "A Stripe-like payments API"

[auth]
kind = "header"
header = "X-Api-Key"
prefix = "key "

[errors]
code_at = "/errors/0/code"
message_at = "/errors/0/detail"

[[errors.rules]]
status = 403
code = "RATE_LIMITED"
means = "not_sent"
retry_after_ms = 30000

[rate_limit]
reset_header = "x-ratelimit-reset"
reset_unit = "seconds"

[[actions]]
name = "create_customer"
description = "create a customer"

[actions.input]
type = "object"
required = ["email"]
additionalProperties = false
properties.email = { type = "string" }
properties.tax_exempt = { type = "boolean" }
properties.metadata = { type = "object", properties.order = { type = "integer" } }

[actions.request]
method = "POST"
path = "/v1/customers"
body_encoding = "form"
body_base = "args"
body = { metadata = { opledger_label = "{{label}}" } }

[actions.response]
success = [201]
id_header = "location"

[actions.dedup]
kind = "idempotency_key"
retention_s = 86400
safety_margin_s = 3600

[actions.lookup]
kind = "search"
method = "POST"
path = "/v1/customers/search"
body = { query = "metadata['opledger_label']:'{{label}}'", limit = 10 }
results = "/data"
label_at = "/metadata/opledger_label"
lag_ms = 1000
"#;

/// A ticket API with basic auth, a typed JSON body and an idempotent PUT.
const TICKETS: &str = r#"
id = "tickets"
description = "A ticket API with basic auth"

[auth]
kind = "basic"

[settings]
queue = "support"

[[actions]]
name = "put_ticket"
description = "file a ticket under its number"

[actions.input]
type = "object"
required = ["number"]
properties.number = { type = "integer" }
properties.subject = { type = "string" }
properties.urgent = { type = "boolean" }

[actions.request]
method = "PUT"
path = "/queues/{{settings.queue}}/tickets/{{args.number}}"
query = { notify = "{{args.urgent}}" }
body = { number = "{{args.number}}", subject = "{{args.subject}}", urgent = "{{args.urgent}}", ref = "op {{operation_id}}" }

[actions.response]
id = "/data/id"

[actions.dedup]
kind = "naturally_idempotent"

[actions.lookup]
kind = "none"
"#;

fn tenant() -> TenantId {
    TenantId::new("acme").expect("valid")
}

fn account_id() -> AccountId {
    AccountId::new("acct-1").expect("valid")
}

fn build(text: &str, base_url: &str, credentials: Credentials) -> Connector {
    let document = parse("test.toml", text)
        .unwrap_or_else(|errors| panic!("{}", opledger_providers::render_all(&errors)));
    let overrides = Overrides {
        base_url: Some(base_url.to_owned()),
        accounts: vec![AccountSpec {
            id: account_id(),
            tenants: vec![tenant()],
            credentials,
        }],
        request_timeout_ms: Some(2_000),
        connect_timeout_ms: Some(500),
        ..Overrides::default()
    };
    Connector::build(&document, overrides)
        .unwrap_or_else(|errors| panic!("{}", opledger_providers::render_all(&errors)))
}

fn request(provider: &str, action: &str, args: Value) -> SendRequest {
    let ids = RandomIds;
    let operation_id = ids.new_operation_id();
    SendRequest {
        operation_id,
        attempt_id: ids.new_attempt_id(),
        tenant: tenant(),
        provider: ProviderId::new(provider).expect("valid"),
        account: account_id(),
        action: ActionName::new(action).expect("valid"),
        args: ArgsSnapshot::new(args).expect("valid args"),
        idempotency_key: ids.new_idempotency_key(),
        label: operation_label(operation_id),
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

fn customer() -> Value {
    json!({"email": "ada@example.com", "tax_exempt": true, "metadata": {"order": 7}})
}

#[tokio::test]
async fn a_form_create_with_a_header_key_is_confirmed_by_its_location() {
    let emulator = Emulator::start().await;
    let payments = build(
        PAYMENTS,
        &emulator.base_url,
        Credentials::token("sk_test_123"),
    );
    emulator.next(answer(201, Value::Null).header("location", "/v1/customers/cus_123"));
    let request = request("payments", "create_customer", customer());
    let outcome = payments.execute(&request).await;
    assert!(
        matches!(&outcome, SendOutcome::Confirmed { external_id, .. } if external_id.as_str() == "cus_123"),
        "{outcome:?}"
    );
    let seen = emulator.seen();
    assert_eq!(seen.len(), 1);
    let sent = &seen[0];
    assert_eq!(
        (sent.method.as_str(), sent.target.as_str()),
        ("POST", "/v1/customers")
    );
    assert_eq!(sent.header("x-api-key"), Some("key sk_test_123"));
    assert_eq!(sent.header("authorization"), None);
    assert_eq!(
        sent.header("idempotency-key"),
        Some(request.idempotency_key.as_str())
    );
    assert_eq!(
        sent.header("content-type"),
        Some("application/x-www-form-urlencoded")
    );
    let form = sent.form();
    for (name, value) in [
        ("email", "ada@example.com"),
        ("tax_exempt", "true"),
        ("metadata[order]", "7"),
        ("metadata[opledger_label]", request.label.as_str()),
    ] {
        assert!(
            form.contains(&(name.to_owned(), value.to_owned())),
            "{name}={value} missing from {form:?}"
        );
    }
}

#[tokio::test]
async fn a_documented_rate_limit_on_403_is_not_sent_with_its_wait() {
    let emulator = Emulator::start().await;
    let payments = build(
        PAYMENTS,
        &emulator.base_url,
        Credentials::token("sk_test_123"),
    );
    let limited = json!({"errors": [{"code": "RATE_LIMITED", "detail": "slow down"}]});
    emulator.next(answer(403, limited.clone()));
    emulator.next(answer(403, limited).header("x-ratelimit-reset", "12"));
    emulator.next(answer(
        403,
        json!({"errors": [{"code": "FORBIDDEN", "detail": "no"}]}),
    ));
    let call = || request("payments", "create_customer", customer());
    assert_eq!(
        payments.execute(&call()).await,
        SendOutcome::NotSent {
            reason: "403 RATE_LIMITED: the provider says it processed nothing of this request: slow down".to_owned(),
            retry_after_ms: Some(30_000),
        }
    );
    assert!(matches!(
        payments.execute(&call()).await,
        SendOutcome::NotSent {
            retry_after_ms: Some(12_000),
            ..
        }
    ));
    assert!(matches!(
        payments.execute(&call()).await,
        SendOutcome::Rejected { code, message } if code == "403 FORBIDDEN" && message == "no"
    ));
}

#[tokio::test]
async fn a_reset_header_is_read_on_a_server_error_too() {
    let emulator = Emulator::start().await;
    let payments = build(
        PAYMENTS,
        &emulator.base_url,
        Credentials::token("sk_test_123"),
    );
    emulator.next(answer(503, Value::Null).header("x-ratelimit-reset", "4"));
    let outcome = payments
        .execute(&request("payments", "create_customer", customer()))
        .await;
    assert!(
        matches!(
            outcome,
            SendOutcome::Uncertain {
                retry_after_ms: Some(4_000),
                ..
            }
        ),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_post_search_sends_its_json_body_and_counts_only_the_operations_label() {
    let emulator = Emulator::start().await;
    let payments = build(
        PAYMENTS,
        &emulator.base_url,
        Credentials::token("sk_test_123"),
    );
    let request = request("payments", "create_customer", customer());
    emulator.next(answer(
        200,
        json!({"data": [
            {"id": "cus_9", "email": "ada@example.com", "metadata": {"opledger_label": "opl-someone-else"}},
            {"id": "cus_5", "metadata": {"opledger_label": request.label}},
        ]}),
    ));
    let outcome = payments.lookup(&lookup_of(&request)).await;
    assert!(
        matches!(&outcome, LookupOutcome::Found { external_id, duplicates, .. } if external_id.as_str() == "cus_5" && duplicates.is_empty()),
        "{outcome:?}"
    );
    let seen = emulator.seen();
    let asked = &seen[0];
    assert_eq!(
        (asked.method.as_str(), asked.target.as_str()),
        ("POST", "/v1/customers/search")
    );
    assert_eq!(asked.header("content-type"), Some("application/json"));
    assert_eq!(
        asked.json(),
        json!({"query": format!("metadata['opledger_label']:'{}'", request.label), "limit": 10})
    );
}

#[tokio::test]
async fn basic_auth_a_typed_json_body_and_an_integer_id() {
    let emulator = Emulator::start().await;
    let tickets = build(
        TICKETS,
        &emulator.base_url,
        Credentials::basic("ada", "open sesame"),
    );
    emulator.next(answer(200, json!({"data": {"id": 5}})));
    let request = request(
        "tickets",
        "put_ticket",
        json!({"number": 42, "subject": "Printer on fire", "urgent": true}),
    );
    let outcome = tickets.execute(&request).await;
    assert!(
        matches!(&outcome, SendOutcome::Confirmed { external_id, .. } if external_id.as_str() == "5"),
        "{outcome:?}"
    );
    let seen = emulator.seen();
    let sent = &seen[0];
    assert_eq!(sent.method, "PUT");
    assert_eq!(sent.target, "/queues/support/tickets/42?notify=true");
    // base64("ada:open sesame")
    assert_eq!(
        sent.header("authorization"),
        Some("Basic YWRhOm9wZW4gc2VzYW1l")
    );
    assert_eq!(
        sent.json(),
        json!({"number": 42, "subject": "Printer on fire", "urgent": true, "ref": format!("op {}", request.operation_id)})
    );
}

#[tokio::test]
async fn an_optional_argument_left_out_leaves_its_field_and_parameter_out() {
    let emulator = Emulator::start().await;
    let tickets = build(TICKETS, &emulator.base_url, Credentials::basic("ada", "pw"));
    emulator.next(answer(200, json!({"data": {"id": "t-1"}})));
    let outcome = tickets
        .execute(&request("tickets", "put_ticket", json!({"number": 7})))
        .await;
    assert!(
        matches!(outcome, SendOutcome::Confirmed { .. }),
        "{outcome:?}"
    );
    let seen = emulator.seen();
    assert_eq!(seen[0].target, "/queues/support/tickets/7");
    let body = seen[0].json();
    assert_eq!(body["number"], 7);
    assert!(
        body.get("subject").is_none() && body.get("urgent").is_none(),
        "{body}"
    );
}

#[tokio::test]
async fn an_echoed_secret_never_leaves_the_adapter() {
    let emulator = Emulator::start().await;
    let payments = build(
        PAYMENTS,
        &emulator.base_url,
        Credentials::token("sk_test_123"),
    );
    emulator.next(answer(
        401,
        json!({"errors": [{"code": "bad_key", "detail": "key sk_test_123 is not valid"}]}),
    ));
    let outcome = payments
        .execute(&request("payments", "create_customer", customer()))
        .await;
    assert_eq!(
        outcome,
        SendOutcome::Rejected {
            code: "401 bad_key".to_owned(),
            message: "key [redacted] is not valid".to_owned(),
        }
    );
    assert!(!format!("{payments:?}").contains("sk_test_123"));
}

#[tokio::test]
async fn arguments_are_checked_against_the_schema_with_the_pointer_of_each_problem() {
    let payments = build(
        PAYMENTS,
        "http://127.0.0.1:9",
        Credentials::token("sk_test_123"),
    );
    let action = ActionName::new("create_customer").expect("valid");
    assert_eq!(payments.check_args(&action, &customer()), Ok(()));
    let problems = payments
        .check_args(
            &action,
            &json!({"metadata": {"order": "seven"}, "extra": 1}),
        )
        .expect_err("three problems");
    let pointers: Vec<&str> = problems
        .iter()
        .map(|problem| problem.pointer.as_str())
        .collect();
    assert!(pointers.contains(&"/metadata/order"), "{problems:?}");
    assert!(
        problems
            .iter()
            .any(|problem| problem.pointer.is_empty() && problem.message.contains("email")),
        "{problems:?}"
    );
    let unknown = payments
        .check_args(&ActionName::new("refund").expect("valid"), &json!({}))
        .expect_err("no such action");
    assert!(
        unknown[0].message.contains("create_customer"),
        "{unknown:?}"
    );
}

#[tokio::test]
async fn building_names_a_missing_variable_a_missing_base_url_and_an_unknown_setting() {
    let document = parse("tickets.toml", TICKETS).expect("valid");
    let overrides = Overrides {
        settings: [("queu".to_owned(), "x".to_owned())].into(),
        accounts: vec![AccountSpec {
            id: account_id(),
            tenants: vec![tenant()],
            credentials: Credentials::Basic {
                username: opledger_providers::SecretSource::Env("TICKETS_USER".to_owned()),
                password: opledger_providers::SecretSource::Env("TICKETS_PASSWORD".to_owned()),
            },
        }],
        ..Overrides::default()
    };
    let errors = Connector::with_env(&document, overrides, &|name| {
        (name == "TICKETS_USER").then(|| "ada".into())
    })
    .expect_err("three problems");
    let text = opledger_providers::render_all(&errors);
    for expected in [
        "base_url",
        "settings.queu",
        "TICKETS_PASSWORD",
        "declared: queue",
    ] {
        assert!(text.contains(expected), "{expected} missing from:\n{text}");
    }
}

#[tokio::test]
async fn an_action_without_a_lookup_asks_nothing_and_says_so() {
    let emulator = Emulator::start().await;
    let tickets = build(TICKETS, &emulator.base_url, Credentials::basic("ada", "pw"));
    let request = request("tickets", "put_ticket", json!({"number": 7}));
    let outcome = tickets.lookup(&lookup_of(&request)).await;
    assert!(
        matches!(&outcome, LookupOutcome::Unavailable { reason, retry_after_ms: None } if reason.contains("declares no lookup")),
        "{outcome:?}"
    );
    assert!(emulator.seen().is_empty(), "nothing was asked");
}
