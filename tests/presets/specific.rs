//! What only one preset has: Stripe's key retention, its saved 500 and its rate limit;
//! Salesforce's request limit and a 5xx after the commit; HubSpot's lagging search, and its
//! notes and deals through the preset as shipped; Zendesk past its key retention; Pipedrive's
//! unsearchable activities and its rate-limit reset header.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::apis::{accounts, preset_entry, shortened, Api, EMULATED_LAG_MS, TOKEN_A};
use crate::emulators::hubspot::{self, HubSpot};
use crate::emulators::pipedrive::Pipedrive;
use crate::emulators::salesforce::Salesforce;
use crate::emulators::stripe::{self, Stripe};
use crate::emulators::zendesk::{self, Zendesk};
use crate::emulators::{Emulator, Fault};
use crate::ledger::{Ledger, ACCOUNT, TENANT_TOKEN};
use crate::scenarios::{assert_a_person_decides, settle, sigkill, HELD_MS};
use crate::support::{Server, DEADLINE};

/// Records `action` with `args` and starts its execution; returns the operation id.
pub(crate) async fn start(server: &Server, provider: &str, action: &str, args: Value) -> String {
    let body = json!({"provider": provider, "account": ACCOUNT, "action": action, "args": args});
    let (status, recorded) = server
        .call(
            Method::POST,
            "/v1/operations",
            Some(TENANT_TOKEN),
            Some(&body),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    let id = recorded["operation_id"].as_str().expect("an id").to_owned();
    let (status, started) = server.execute(TENANT_TOKEN, &id, 0).await;
    assert!(status.is_success(), "{started}");
    id
}

/// A preset's emulator with `fault` queued for its first create, a server on it, and the
/// operation `action(args)` settled.
struct Settled<A> {
    api: A,
    server: Server,
    id: String,
    body: Value,
    /// Kept so the ledger's directory outlives the server.
    _ledger: Ledger,
}

async fn settled_after<A: Api>(fault: Fault, action: &str, args: Value) -> Settled<A> {
    let api = A::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    api.fault(fault, 1);
    let id = start(&server, A::PROVIDER, action, args).await;
    let body = settle(&server, &id).await;
    Settled {
        api,
        server,
        id,
        body,
        _ledger: ledger,
    }
}

/// How many of the operation's events are of type `kind`.
async fn events_of(server: &Server, id: &str, kind: &str) -> usize {
    let (status, history) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{id}/events"),
            Some(TENANT_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{history}");
    let events = history["events"].as_array().expect("events");
    events.iter().filter(|event| event["type"] == kind).count()
}

/// Waits until `done` holds, or fails after the deadline.
async fn until(what: &str, done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < DEADLINE, "{what} never happened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[track_caller]
fn assert_succeeded_with(settled: &Value, ids: &[String]) {
    assert_eq!(settled["state"], "succeeded", "{settled}");
    assert_eq!(ids.len(), 1, "exactly one object at the provider: {ids:?}");
    assert_eq!(settled["external_id"], ids[0].as_str(), "{settled}");
}

fn stripe_ids(api: &Stripe, kind: &str) -> Vec<String> {
    let objects = api.objects(kind);
    objects
        .iter()
        .map(|object| object.body["id"].as_str().expect("an id").to_owned())
        .collect()
}

#[tokio::test]
async fn stripe_never_reuses_a_key_past_its_retention_a_customer_is_found_by_search_and_an_invoice_item_goes_to_a_person(
) {
    // Keys live 2 s at this Stripe, and the ledger is told so (1 s of it kept as margin); the
    // claim of a killed worker runs out only after that, so the key is gone when it resumes.
    let api = Stripe::start(stripe::Config {
        keys: accounts(),
        key_retention_ms: 2_000,
        search_lag_ms: EMULATED_LAG_MS,
    })
    .await;
    let text = shortened(
        "stripe",
        &[
            ("retention_s = 86400", "retention_s = 2"),
            ("safety_margin_s = 3600", "safety_margin_s = 1"),
        ],
    );
    let ledger = Ledger::new(
        &preset_entry("stripe", "file = \"stripe.toml\"", &api.running.base_url),
        TOKEN_A,
        &[("stripe.toml", text)],
    );
    let server = ledger.serve();
    api.fault(Fault::LateResponse { ms: HELD_MS }, 2);
    let customer = start(
        &server,
        "stripe",
        "create_customer",
        json!({"name": "Acme"}),
    )
    .await;
    let item_args = json!({"customer": "cus_1", "amount": 500, "currency": "eur"});
    let item = start(&server, "stripe", "create_invoice_item", item_args).await;
    until("Stripe applying both creates", || {
        !stripe_ids(&api, "customer").is_empty() && !stripe_ids(&api, "invoiceitem").is_empty()
    })
    .await;
    sigkill(server);
    let server = ledger.serve();
    let customer = settle(&server, &customer).await;
    assert_succeeded_with(&customer, &stripe_ids(&api, "customer"));
    let item = settle(&server, &item).await;
    assert_a_person_decides(&item);
    let reason = item["review_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("retention"), "{item}");
    assert_eq!(
        stripe_ids(&api, "invoiceitem").len(),
        1,
        "the forgotten key was never sent again"
    );
}

#[tokio::test]
async fn stripe_replays_a_saved_500_for_the_key_and_the_customer_search_settles_it() {
    let run = settled_after::<Stripe>(
        Fault::ErrorAfterCommit { status: 500 },
        "create_customer",
        json!({"name": "Acme"}),
    )
    .await;
    assert_succeeded_with(&run.body, &stripe_ids(&run.api, "customer"));
    assert!(events_of(&run.server, &run.id, "OutcomeUnknown").await >= 1);
}

#[tokio::test]
async fn stripe_rate_limits_before_the_idempotency_layer_and_the_send_is_repeated_once() {
    let run = settled_after::<Stripe>(
        Fault::RateLimit { retry_after_s: 1 },
        "create_customer",
        json!({"name": "Acme"}),
    )
    .await;
    assert_succeeded_with(&run.body, &stripe_ids(&run.api, "customer"));
    assert_eq!(events_of(&run.server, &run.id, "AttemptNotSent").await, 1);
}

#[tokio::test]
async fn salesforce_request_limit_is_not_sent_and_waits_without_creating_anything() {
    let api = <Salesforce as Api>::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    api.fault(Fault::RateLimit { retry_after_s: 60 }, 1);
    let id = start(
        &server,
        "salesforce",
        "upsert_case",
        json!({"Subject": "Call"}),
    )
    .await;
    let started = Instant::now();
    // The rule says wait 60 s: the operation stays pending with one attempt not sent.
    loop {
        let (_, body) = server
            .call(
                Method::GET,
                &format!("/v1/operations/{id}"),
                Some(TENANT_TOKEN),
                None,
            )
            .await;
        if body["state"] == "pending" && body["attempts"].as_u64() >= Some(1) {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "never refused: {body}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(events_of(&server, &id, "AttemptNotSent").await, 1);
    assert!(api.records("Case").is_empty(), "nothing was applied");
}

#[tokio::test]
async fn salesforce_5xx_after_the_commit_is_settled_by_the_external_id_lookup() {
    let run = settled_after::<Salesforce>(
        Fault::ErrorAfterCommit { status: 500 },
        "upsert_contact",
        json!({"LastName": "Ivanova"}),
    )
    .await;
    let ids: Vec<String> = run
        .api
        .records("Contact")
        .into_iter()
        .map(|record| record.id)
        .collect();
    assert_succeeded_with(&run.body, &ids);
    assert!(events_of(&run.server, &run.id, "ReconciliationRecorded").await >= 1);
}

#[tokio::test]
async fn hubspot_keeps_looking_while_the_search_lags_and_settles_on_the_labelled_task() {
    let args = json!({"subject": "Call", "due": "2026-12-02T09:00:00Z"});
    let run = settled_after::<HubSpot>(Fault::DropResponse, "create_task", args).await;
    let tasks = run.api.objects("tasks");
    let ids: Vec<String> = tasks.iter().map(|task| task.id.clone()).collect();
    assert_succeeded_with(&run.body, &ids);
    assert!(tasks[0]
        .properties
        .contains_key(crate::apis::HUBSPOT_LABEL_PROPERTY));
    let lookups = events_of(&run.server, &run.id, "ReconciliationRecorded").await;
    assert!(
        lookups >= 2,
        "the first search came before the index had the task: {lookups}"
    );
}

#[tokio::test]
async fn hubspot_5xx_before_the_commit_finds_nothing_and_a_person_decides_with_no_task_made() {
    let args = json!({"subject": "Call", "due": "2026-12-02T09:00:00Z"});
    let run = settled_after::<HubSpot>(
        Fault::ErrorBeforeCommit { status: 502 },
        "create_task",
        args,
    )
    .await;
    assert_a_person_decides(&run.body);
    assert!(
        run.api.objects("tasks").is_empty(),
        "a 502 without a task is never sent again blindly"
    );
}

#[tokio::test]
async fn hubspot_notes_and_deals_work_through_the_shipped_preset_and_its_default_property() {
    let api = HubSpot::start(hubspot::Config {
        tokens: accounts(),
        label_property: "opledger_label".to_owned(),
        search_lag_ms: EMULATED_LAG_MS,
    })
    .await;
    let ledger = Ledger::new(
        &preset_entry("hubspot", "preset = \"hubspot\"", &api.running.base_url),
        TOKEN_A,
        &[],
    );
    let server = ledger.serve();
    let note_args =
        json!({"body": "Called; call back Monday", "timestamp": "2026-12-01T10:00:00Z"});
    let note = start(&server, "hubspot", "create_note", note_args).await;
    let deal_args = json!({"name": "Acme renewal", "amount": "1200"});
    let deal = start(&server, "hubspot", "create_deal", deal_args).await;
    for (id, kind) in [(note, "notes"), (deal, "deals")] {
        let settled = settle(&server, &id).await;
        let objects = api.objects(kind);
        let ids: Vec<String> = objects.iter().map(|object| object.id.clone()).collect();
        assert_succeeded_with(&settled, &ids);
        let label = objects[0].properties["opledger_label"]
            .as_str()
            .unwrap_or_default();
        assert!(label.starts_with("opl-"), "{label}");
    }
}

#[tokio::test]
async fn zendesk_past_the_key_retention_finds_the_ticket_by_external_id_and_never_sends_again() {
    let api = Zendesk::start(zendesk::Config {
        tokens: accounts(),
        key_retention_ms: 2_000,
    })
    .await;
    let text = shortened(
        "zendesk",
        &[
            ("retention_s = 7200", "retention_s = 2"),
            ("safety_margin_s = 600", "safety_margin_s = 1"),
        ],
    );
    let ledger = Ledger::new(
        &preset_entry("zendesk", "file = \"zendesk.toml\"", &api.running.base_url),
        TOKEN_A,
        &[("zendesk.toml", text)],
    );
    let server = ledger.serve();
    api.fault(Fault::LateResponse { ms: HELD_MS }, 1);
    let args = json!({"subject": "Call back", "comment": "The client asked for a call"});
    let id = start(&server, "zendesk", "create_ticket", args).await;
    until("Zendesk applying the create", || !api.tickets().is_empty()).await;
    sigkill(server);
    let server = ledger.serve();
    let settled = settle(&server, &id).await;
    let ids: Vec<String> = api
        .tickets()
        .iter()
        .map(|ticket| ticket.body["id"].to_string())
        .collect();
    assert_succeeded_with(&settled, &ids);
}

#[tokio::test]
async fn pipedrive_an_activity_whose_answer_was_lost_goes_to_a_person_with_its_one_activity() {
    let args = json!({"subject": "Call the client", "type": "call", "due_date": "2026-12-02"});
    let run = settled_after::<Pipedrive>(Fault::DropResponse, "create_activity", args).await;
    assert_a_person_decides(&run.body);
    let activities = run.api.objects("activity");
    assert_eq!(activities.len(), 1, "never sent twice: {activities:?}");
    let note = activities[0].body["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("opl-"),
        "the person can find it by its label: {note}"
    );
}

#[tokio::test]
async fn pipedrive_a_rate_limit_is_waited_out_by_its_reset_header_and_the_deal_made_once() {
    let run = settled_after::<Pipedrive>(
        Fault::RateLimit { retry_after_s: 1 },
        "create_deal",
        json!({"title": "Acme renewal"}),
    )
    .await;
    let deals = run.api.objects("deal");
    let ids: Vec<String> = deals
        .iter()
        .map(|deal| deal.body["id"].to_string())
        .collect();
    assert_succeeded_with(&run.body, &ids);
    assert_eq!(events_of(&run.server, &run.id, "AttemptNotSent").await, 1);
}

#[tokio::test]
async fn stripe_an_invoice_item_whose_answer_was_lost_is_retried_under_its_key_without_a_lookup() {
    // Invoice items cannot be looked up at Stripe; the key makes the retry safe, so the ledger
    // retries at once instead of spending its lookup budget on lookups that cannot be made.
    let args = json!({"customer": "cus_1", "amount": 500, "currency": "eur"});
    let run = settled_after::<Stripe>(Fault::DropResponse, "create_invoice_item", args).await;
    assert_succeeded_with(&run.body, &stripe_ids(&run.api, "invoiceitem"));
    assert_eq!(events_of(&run.server, &run.id, "OutcomeUnknown").await, 1);
    assert_eq!(events_of(&run.server, &run.id, "LookupClaimed").await, 0);
    assert_eq!(
        events_of(&run.server, &run.id, "ReconciliationRecorded").await,
        0
    );
    assert_eq!(events_of(&run.server, &run.id, "RetryScheduled").await, 1);
}

#[tokio::test]
async fn pipedrive_an_activity_whose_answer_was_lost_goes_to_a_person_without_a_lookup() {
    // No lookup and no deduplication: nothing automation can learn or do, so a person at once.
    let args = json!({"subject": "Call the client", "type": "call", "due_date": "2026-12-02"});
    let run = settled_after::<Pipedrive>(Fault::DropResponse, "create_activity", args).await;
    assert_a_person_decides(&run.body);
    assert_eq!(events_of(&run.server, &run.id, "LookupClaimed").await, 0);
    assert_eq!(
        events_of(&run.server, &run.id, "ReconciliationRecorded").await,
        0
    );
    let reason = run.body["review_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("cannot be looked up"), "{}", run.body);
}

#[tokio::test]
async fn pipedrive_an_activity_with_a_person_sends_them_as_its_primary_participant() {
    // v2 refuses an activity's `person_id`; the person travels as its primary participant.
    let api = <Pipedrive as Api>::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    let args = json!({"subject": "Call the client", "type": "call",
        "participants": [{"person_id": 7, "primary": true}]});
    let id = start(&server, "pipedrive", "create_activity", args).await;
    let settled = settle(&server, &id).await;
    let activities = api.objects("activity");
    let ids: Vec<String> = activities
        .iter()
        .map(|activity| activity.body["id"].to_string())
        .collect();
    assert_succeeded_with(&settled, &ids);
    assert_eq!(activities[0].body["person_id"], 7, "{activities:?}");
}

#[tokio::test]
async fn a_pipedrive_refusal_reaches_the_operator_in_pipedrives_own_words_and_code() {
    // A label field key that is not one of the account's custom fields (a setting typed wrong):
    // v2 refuses the deal, naming the field in `error`.
    let api = <Pipedrive as Api>::start().await;
    let wrong_key = "f".repeat(40);
    let source =
        format!("file = \"pipedrive.toml\"\nsettings = {{ label_field_key = \"{wrong_key}\" }}");
    let entry = preset_entry("pipedrive", &source, &api.running.base_url);
    let ledger = Ledger::new(
        &entry,
        TOKEN_A,
        &[("pipedrive.toml", shortened("pipedrive", &[]))],
    );
    let server = ledger.serve();
    let id = start(
        &server,
        "pipedrive",
        "create_deal",
        json!({"title": "Renewal"}),
    )
    .await;
    let settled = settle(&server, &id).await;
    assert_eq!(settled["state"], "rejected", "{settled}");
    // The status and Pipedrive's code, then its message: not the hint, not the raw body.
    assert_eq!(
        settled["last_error"],
        format!("400 ERR_BAD_REQUEST: Custom field `{wrong_key}` does not exist or is not text"),
        "{settled}"
    );
    assert!(api.objects("deal").is_empty());
}

#[tokio::test]
async fn pipedrive_refuses_an_activitys_person_id_and_the_preset_never_sends_one() {
    let api = <Pipedrive as Api>::start().await;
    // The emulator answers as v2 does, word for word.
    let refused = reqwest::Client::new()
        .post(format!("{}/api/v2/activities", api.running.base_url))
        .header("x-api-token", TOKEN_A)
        .json(&json!({"subject": "Call", "person_id": 7}))
        .send()
        .await
        .expect("the emulator answers");
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let body: Value = refused.json().await.expect("JSON");
    assert_eq!(
        body["error"],
        crate::emulators::pipedrive::PERSON_ID_READ_ONLY
    );
    // The preset's schema has no `person_id`: the call is refused before anything is recorded.
    let ledger = api.ledger();
    let server = ledger.serve();
    let body = json!({"provider": "pipedrive", "account": ACCOUNT, "action": "create_activity",
        "args": {"subject": "Call", "person_id": 7}});
    let (status, answer) = server
        .call(
            Method::POST,
            "/v1/operations",
            Some(TENANT_TOKEN),
            Some(&body),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid_input", "{answer}");
    assert!(api.objects("activity").is_empty());
}
