//! The article's checklist, written once over [`Api`] and generated for every preset by
//! [`checklist!`]. Each scenario asserts what the emulator stores and what the ledger says.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::apis::{Api, TOKEN_A, TOKEN_B};
use crate::emulators::Fault;
use crate::ledger::{ACCOUNT, TENANT_TOKEN};
use crate::support::{Server, DEADLINE};

/// How long the emulator holds an answer the worker is killed waiting for, in milliseconds:
/// longer than the request timeout, so the answer never arrives.
pub const HELD_MS: u64 = 8_000;
/// The states an operation settles in.
const SETTLED: &[&str] = &["succeeded", "needs_review", "rejected"];

fn call<A: Api>(title: &str, source_id: Option<&str>) -> Value {
    let mut body = json!({
        "provider": A::PROVIDER, "account": ACCOUNT, "action": A::ACTION, "args": A::args(title),
    });
    if let Some(source_id) = source_id {
        body["source_id"] = json!(source_id);
    }
    body
}

/// Records and executes in one call, as an agent's tool call does.
async fn deliver<A: Api>(
    server: &Server,
    title: &str,
    source_id: Option<&str>,
) -> (StatusCode, Value) {
    let body = call::<A>(title, source_id);
    server
        .call(
            Method::POST,
            "/v1/operations?execute=true&wait_ms=5000",
            Some(TENANT_TOKEN),
            Some(&body),
        )
        .await
}

/// Records, starts the execution without waiting for it, and returns the operation id.
async fn start_execution<A: Api>(server: &Server, title: &str) -> String {
    let (status, recorded) = server
        .call(
            Method::POST,
            "/v1/operations",
            Some(TENANT_TOKEN),
            Some(&call::<A>(title, None)),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    let id = recorded["operation_id"].as_str().expect("an id").to_owned();
    let (status, started) = server.execute(TENANT_TOKEN, &id, 0).await;
    assert!(status.is_success(), "{started}");
    id
}

/// The longest declared search lag of the presets (Stripe's minute) and time to spare.
const SEARCH_LAG_MARGIN: std::time::Duration = std::time::Duration::from_secs(100);

pub async fn settle(server: &Server, id: &str) -> Value {
    server.wait_for_state(TENANT_TOKEN, id, SETTLED).await
}

fn operation_id(answer: &Value) -> String {
    answer["operation_id"]
        .as_str()
        .expect("an operation id")
        .to_owned()
}

/// Asserts the operation succeeded naming the one object the emulator holds in account `a`, and
/// that the agent's sentence says done with that id.
#[track_caller]
fn assert_one_object_and_done<A: Api>(api: &A, settled: &Value) -> String {
    assert_eq!(settled["state"], "succeeded", "{settled}");
    let created = api.created("a");
    assert_eq!(
        created.len(),
        1,
        "exactly one object at the provider: {created:?}"
    );
    assert_eq!(settled["external_id"], created[0].as_str(), "{settled}");
    let message = settled["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("Done") && message.contains(&created[0]),
        "{settled}"
    );
    created[0].clone()
}

/// Asserts the operation waits for a person and the agent says so.
#[track_caller]
pub fn assert_a_person_decides(settled: &Value) {
    assert_eq!(settled["state"], "needs_review", "{settled}");
    let message = settled["message"].as_str().unwrap_or_default();
    assert!(message.contains("a person is checking"), "{settled}");
}

/// Waits until the emulator holds `count` objects in account `a`.
pub async fn until_created<A: Api>(api: &A, count: usize) {
    let started = Instant::now();
    while api.created("a").len() < count {
        assert!(
            started.elapsed() < DEADLINE,
            "the provider never applied the create"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Kills the server with SIGKILL (its `Drop`): no shutdown runs.
pub fn sigkill(server: Server) {
    drop(server);
}

pub async fn a_lost_request_is_sent_again_under_the_contract_or_goes_to_a_person<A: Api>() {
    let api = A::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    api.fault(Fault::DropRequest, 1);
    let (status, answer) = deliver::<A>(&server, "Call the client", None).await;
    assert!(status.is_success(), "{answer}");
    let settled = settle(&server, &operation_id(&answer)).await;
    if A::SAFE_RETRY {
        assert_one_object_and_done(&api, &settled);
    } else {
        assert_a_person_decides(&settled);
        assert!(api.created("a").is_empty(), "nothing was created");
    }
}

pub async fn an_applied_create_whose_answer_was_lost_settles_with_its_one_object<A: Api>() {
    let api = A::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    api.fault(Fault::DropResponse, 1);
    let (_, answer) = deliver::<A>(&server, "Call the client", None).await;
    let settled = settle(&server, &operation_id(&answer)).await;
    assert_one_object_and_done(&api, &settled);
}

pub async fn a_worker_killed_after_the_provider_applied_resumes_to_the_same_object<A: Api>() {
    let api = A::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    api.fault(Fault::LateResponse { ms: HELD_MS }, 1);
    let id = start_execution::<A>(&server, "Call the client").await;
    until_created(&api, 1).await;
    sigkill(server);
    let server = ledger.serve();
    let (_, resumed) = server.execute(TENANT_TOKEN, &id, 0).await;
    assert_ne!(
        resumed["state"], "pending",
        "the claim is recorded: {resumed}"
    );
    let settled = settle(&server, &id).await;
    assert_one_object_and_done(&api, &settled);
}

pub async fn two_callers_at_once_make_one_operation_and_one_object<A: Api>() {
    let api = A::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    api.fault(Fault::Hold { ms: 300 }, 1);
    let (first, second) = tokio::join!(
        deliver::<A>(&server, "Call the client", Some("toolcall-twice")),
        deliver::<A>(&server, "Call the client", Some("toolcall-twice")),
    );
    assert_eq!(
        operation_id(&first.1),
        operation_id(&second.1),
        "{first:?} {second:?}"
    );
    let id = operation_id(&first.1);
    let (again, other) = tokio::join!(
        server.execute(TENANT_TOKEN, &id, 2_000),
        server.execute(TENANT_TOKEN, &id, 2_000),
    );
    assert!(
        again.0.is_success() && other.0.is_success(),
        "{again:?} {other:?}"
    );
    let settled = settle(&server, &id).await;
    assert_one_object_and_done(&api, &settled);
}

pub async fn a_tool_call_redelivered_after_a_restart_finds_its_operation_and_sends_nothing<
    A: Api,
>() {
    let api = A::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    let (status, first) = deliver::<A>(&server, "Call the client", Some("toolcall-1")).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let settled = settle(&server, &operation_id(&first)).await;
    let object = assert_one_object_and_done(&api, &settled);
    let (code, printed) = server.terminate();
    assert_eq!(code, Some(0), "{printed:?}");
    let server = ledger.serve();
    let (status, again) = deliver::<A>(&server, "Call the client", Some("toolcall-1")).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["created"], false, "{again}");
    assert_eq!(again["operation_id"], first["operation_id"]);
    assert_eq!(again["external_id"], object.as_str(), "{again}");
    assert_eq!(api.created("a").len(), 1, "nothing more was sent");
}

pub async fn a_new_request_with_the_same_text_is_a_second_object<A: Api>() {
    let api = A::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    let (_, first) = deliver::<A>(&server, "Call the client", Some("toolcall-1")).await;
    let (_, second) = deliver::<A>(&server, "Call the client", Some("toolcall-2")).await;
    assert_ne!(first["operation_id"], second["operation_id"]);
    let first = settle(&server, &operation_id(&first)).await;
    let second = settle(&server, &operation_id(&second)).await;
    assert_eq!(
        (&first["state"], &second["state"]),
        (&json!("succeeded"), &json!("succeeded"))
    );
    assert_ne!(
        first["external_id"], second["external_id"],
        "two requests, two objects"
    );
    assert_eq!(api.created("a").len(), 2);
}

pub async fn changed_arguments_under_an_old_source_id_are_refused_and_not_sent<A: Api>() {
    let api = A::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    let (_, first) = deliver::<A>(&server, "Call the client", Some("toolcall-7")).await;
    let settled = settle(&server, &operation_id(&first)).await;
    assert_one_object_and_done(&api, &settled);
    let (status, refused) = deliver::<A>(&server, "Email the client", Some("toolcall-7")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"]["code"], "source_id_reused", "{refused}");
    assert_eq!(
        api.created("a").len(),
        1,
        "the changed request was never sent"
    );
}

pub async fn an_unknown_outcome_is_never_retried_in_an_account_switched_meanwhile<A: Api>() {
    let api = A::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    api.fault(Fault::LateResponse { ms: HELD_MS }, 1);
    let id = start_execution::<A>(&server, "Call the client").await;
    until_created(&api, 1).await;
    sigkill(server);
    // The same account id at the ledger now holds another provider account's credentials.
    ledger.rewrite(
        &format!("token = \"{TOKEN_A}\""),
        &format!("token = \"{TOKEN_B}\""),
    );
    let server = ledger.serve();
    // The other account's search never shows the object, and the last lookup before a person is
    // asked waits out the provider's declared search lag (Stripe's is a minute).
    let settled = server
        .wait_for_state_within(TENANT_TOKEN, &id, SETTLED, SEARCH_LAG_MARGIN)
        .await;
    assert_a_person_decides(&settled);
    assert_eq!(
        api.created("a").len(),
        1,
        "the first attempt's object is all there is"
    );
    assert!(
        api.created("b").is_empty(),
        "nothing was sent to the other account"
    );
}

/// Generates the checklist for one preset.
macro_rules! checklist {
    ($module:ident, $api:ty) => {
        mod $module {
            use crate::scenarios;

            #[tokio::test]
            async fn a_lost_request_is_sent_again_under_the_contract_or_goes_to_a_person() {
                scenarios::a_lost_request_is_sent_again_under_the_contract_or_goes_to_a_person::<$api>().await;
            }

            #[tokio::test]
            async fn an_applied_create_whose_answer_was_lost_settles_with_its_one_object() {
                scenarios::an_applied_create_whose_answer_was_lost_settles_with_its_one_object::<$api>().await;
            }

            #[tokio::test]
            async fn a_worker_killed_after_the_provider_applied_resumes_to_the_same_object() {
                scenarios::a_worker_killed_after_the_provider_applied_resumes_to_the_same_object::<$api>().await;
            }

            #[tokio::test]
            async fn two_callers_at_once_make_one_operation_and_one_object() {
                scenarios::two_callers_at_once_make_one_operation_and_one_object::<$api>().await;
            }

            #[tokio::test]
            async fn a_tool_call_redelivered_after_a_restart_finds_its_operation_and_sends_nothing() {
                scenarios::a_tool_call_redelivered_after_a_restart_finds_its_operation_and_sends_nothing::<$api>().await;
            }

            #[tokio::test]
            async fn a_new_request_with_the_same_text_is_a_second_object() {
                scenarios::a_new_request_with_the_same_text_is_a_second_object::<$api>().await;
            }

            #[tokio::test]
            async fn changed_arguments_under_an_old_source_id_are_refused_and_not_sent() {
                scenarios::changed_arguments_under_an_old_source_id_are_refused_and_not_sent::<$api>().await;
            }

            #[tokio::test]
            async fn an_unknown_outcome_is_never_retried_in_an_account_switched_meanwhile() {
                scenarios::an_unknown_outcome_is_never_retried_in_an_account_switched_meanwhile::<$api>().await;
            }
        }
    };
}

checklist!(stripe, crate::emulators::stripe::Stripe);
checklist!(salesforce, crate::emulators::salesforce::Salesforce);
checklist!(hubspot, crate::emulators::hubspot::HubSpot);
checklist!(zendesk, crate::emulators::zendesk::Zendesk);
checklist!(attio, crate::emulators::attio::Attio);
checklist!(pipedrive, crate::emulators::pipedrive::Pipedrive);
