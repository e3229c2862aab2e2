//! What only one preset has: Stripe's key retention, its saved 500 and its rate limit;
//! Salesforce's request limit and a 5xx after the commit; HubSpot's lagging search, and its
//! notes and deals through the preset as shipped; Zendesk past its key retention; Pipedrive's
//! unsearchable activities and its rate-limit reset header.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::apis::{accounts, Api, EMULATED_LAG_MS, TOKEN_A};
use crate::emulators::hubspot::{self, HubSpot};
use crate::emulators::salesforce::Salesforce;
use crate::emulators::stripe::{self, Stripe};
use crate::emulators::Fault;
use crate::ledger::{Ledger, ACCOUNT, TENANT_TOKEN};
use crate::scenarios::{assert_a_person_decides, settle, sigkill, HELD_MS};
use crate::support::{Server, DEADLINE};

/// Records `action` with `args` and starts its execution; returns the operation id.
async fn start(server: &Server, provider: &str, action: &str, args: Value) -> String {
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

/// The types of the operation's events, in order.
async fn event_types(server: &Server, id: &str) -> Vec<String> {
    let (status, history) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{id}/events"),
            Some(TENANT_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{history}");
    history["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|event| event["type"].as_str().map(str::to_owned))
        .collect()
}

#[track_caller]
fn assert_succeeded_with(settled: &Value, ids: &[String]) {
    assert_eq!(settled["state"], "succeeded", "{settled}");
    assert_eq!(ids.len(), 1, "exactly one object at the provider: {ids:?}");
    assert_eq!(settled["external_id"], ids[0].as_str(), "{settled}");
}

fn stripe_ids(api: &Stripe, kind: &str) -> Vec<String> {
    api.objects(kind)
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
    let text = opledger_providers::presets::preset("stripe")
        .expect("the preset")
        .1;
    let short = text
        .replace("retention_s = 86400", "retention_s = 2")
        .replace("safety_margin_s = 3600", "safety_margin_s = 1");
    assert_ne!(short, text);
    let entry = format!(
        "[[connectors]]\nid = \"stripe\"\nfile = \"stripe.toml\"\nbase_url = \"{}\"",
        api.running.base_url
    );
    let ledger = Ledger::new(&entry, TOKEN_A, &[("stripe.toml", short)]);
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
    let started = Instant::now();
    while stripe_ids(&api, "customer").is_empty() || stripe_ids(&api, "invoiceitem").is_empty() {
        assert!(
            started.elapsed() < DEADLINE,
            "Stripe never applied both creates"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sigkill(server);
    let server = ledger.serve();
    let customer = settle(&server, &customer).await;
    assert_succeeded_with(&customer, &stripe_ids(&api, "customer"));
    let item = settle(&server, &item).await;
    assert_a_person_decides(&item);
    assert!(
        item["review_reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("retention")),
        "{item}"
    );
    assert_eq!(
        stripe_ids(&api, "invoiceitem").len(),
        1,
        "the forgotten key was never sent again"
    );
}

#[tokio::test]
async fn stripe_replays_a_saved_500_for_the_key_and_the_customer_search_settles_it() {
    let api = <Stripe as Api>::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    api.fault(Fault::ErrorAfterCommit { status: 500 }, 1);
    let id = start(
        &server,
        "stripe",
        "create_customer",
        json!({"name": "Acme"}),
    )
    .await;
    let settled = settle(&server, &id).await;
    assert_succeeded_with(&settled, &stripe_ids(&api, "customer"));
    let types = event_types(&server, &id).await;
    assert!(
        types.iter().any(|kind| kind == "OutcomeUnknown"),
        "{types:?}"
    );
}

#[tokio::test]
async fn stripe_rate_limits_before_the_idempotency_layer_and_the_send_is_repeated_once() {
    let api = <Stripe as Api>::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    api.fault(Fault::RateLimit { retry_after_s: 1 }, 1);
    let id = start(
        &server,
        "stripe",
        "create_customer",
        json!({"name": "Acme"}),
    )
    .await;
    let settled = settle(&server, &id).await;
    assert_succeeded_with(&settled, &stripe_ids(&api, "customer"));
    let types = event_types(&server, &id).await;
    assert!(
        types.iter().any(|kind| kind == "AttemptNotSent"),
        "{types:?}"
    );
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
    let waiting = loop {
        let (_, body) = server
            .call(
                Method::GET,
                &format!("/v1/operations/{id}"),
                Some(TENANT_TOKEN),
                None,
            )
            .await;
        if body["state"] == "pending" && body["attempts"].as_u64() >= Some(1) {
            break body;
        }
        assert!(started.elapsed() < DEADLINE, "never refused: {body}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let types = event_types(&server, &id).await;
    assert!(
        types.iter().any(|kind| kind == "AttemptNotSent"),
        "{types:?} {waiting}"
    );
    assert!(api.records("Case").is_empty(), "nothing was applied");
}

#[tokio::test]
async fn salesforce_5xx_after_the_commit_is_settled_by_the_external_id_lookup() {
    let api = <Salesforce as Api>::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    api.fault(Fault::ErrorAfterCommit { status: 500 }, 1);
    let id = start(
        &server,
        "salesforce",
        "upsert_contact",
        json!({"LastName": "Ivanova"}),
    )
    .await;
    let settled = settle(&server, &id).await;
    let ids: Vec<String> = api
        .records("Contact")
        .into_iter()
        .map(|record| record.id)
        .collect();
    assert_succeeded_with(&settled, &ids);
    let types = event_types(&server, &id).await;
    assert!(
        types.iter().any(|kind| kind == "ReconciliationRecorded"),
        "{types:?}"
    );
}

#[tokio::test]
async fn hubspot_keeps_looking_while_the_search_lags_and_settles_on_the_labelled_task() {
    let api = <HubSpot as Api>::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    api.fault(Fault::DropResponse, 1);
    let args = json!({"subject": "Call", "due": "2026-12-02T09:00:00Z"});
    let id = start(&server, "hubspot", "create_task", args).await;
    let settled = settle(&server, &id).await;
    let tasks = api.objects("tasks");
    let ids: Vec<String> = tasks.iter().map(|task| task.id.clone()).collect();
    assert_succeeded_with(&settled, &ids);
    assert!(tasks[0]
        .properties
        .contains_key(crate::apis::HUBSPOT_LABEL_PROPERTY));
    let lookups = event_types(&server, &id)
        .await
        .into_iter()
        .filter(|kind| kind == "ReconciliationRecorded")
        .count();
    assert!(
        lookups >= 2,
        "the first search came before the index had the task: {lookups}"
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
    let entry = format!(
        "[[connectors]]\nid = \"hubspot\"\npreset = \"hubspot\"\nbase_url = \"{}\"",
        api.running.base_url
    );
    let ledger = Ledger::new(&entry, TOKEN_A, &[]);
    let server = ledger.serve();
    let note_args =
        json!({"body": "Called; call back Monday", "timestamp": "2026-12-01T10:00:00Z"});
    let note = start(&server, "hubspot", "create_note", note_args).await;
    let deal = start(
        &server,
        "hubspot",
        "create_deal",
        json!({"name": "Acme renewal", "amount": "1200"}),
    )
    .await;
    for (id, kind) in [(note, "notes"), (deal, "deals")] {
        let settled = settle(&server, &id).await;
        let objects = api.objects(kind);
        let ids: Vec<String> = objects.iter().map(|object| object.id.clone()).collect();
        assert_succeeded_with(&settled, &ids);
        assert!(objects[0].properties["opledger_label"]
            .as_str()
            .is_some_and(|label| label.starts_with("opl-")));
    }
}

#[tokio::test]
async fn hubspot_5xx_before_the_commit_finds_nothing_and_a_person_decides_with_no_task_made() {
    let api = <HubSpot as Api>::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    api.fault(Fault::ErrorBeforeCommit { status: 502 }, 1);
    let args = json!({"subject": "Call", "due": "2026-12-02T09:00:00Z"});
    let id = start(&server, "hubspot", "create_task", args).await;
    let settled = settle(&server, &id).await;
    assert_a_person_decides(&settled);
    assert!(
        api.objects("tasks").is_empty(),
        "a 502 without a task is never sent again blindly"
    );
}

#[tokio::test]
async fn zendesk_past_the_key_retention_finds_the_ticket_by_external_id_and_never_sends_again() {
    use crate::emulators::zendesk::{self, Zendesk};
    let api = Zendesk::start(zendesk::Config {
        tokens: accounts(),
        key_retention_ms: 2_000,
    })
    .await;
    let text = opledger_providers::presets::preset("zendesk")
        .expect("the preset")
        .1;
    let short = text
        .replace("retention_s = 7200", "retention_s = 2")
        .replace("safety_margin_s = 600", "safety_margin_s = 1");
    assert_ne!(short, text);
    let entry = format!(
        "[[connectors]]\nid = \"zendesk\"\nfile = \"zendesk.toml\"\nbase_url = \"{}\"",
        api.running.base_url
    );
    let ledger = Ledger::new(&entry, TOKEN_A, &[("zendesk.toml", short)]);
    let server = ledger.serve();
    api.fault(Fault::LateResponse { ms: HELD_MS }, 1);
    let args = json!({"subject": "Call back", "comment": "The client asked for a call"});
    let id = start(&server, "zendesk", "create_ticket", args).await;
    let started = Instant::now();
    while api.tickets().is_empty() {
        assert!(
            started.elapsed() < DEADLINE,
            "Zendesk never applied the create"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    use crate::emulators::pipedrive::Pipedrive;
    let api = <Pipedrive as Api>::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    api.fault(Fault::DropResponse, 1);
    let args = json!({"subject": "Call the client", "type": "call", "due_date": "2026-12-02"});
    let id = start(&server, "pipedrive", "create_activity", args).await;
    let settled = settle(&server, &id).await;
    assert_a_person_decides(&settled);
    let activities = api.objects("activity");
    assert_eq!(activities.len(), 1, "never sent twice: {activities:?}");
    let note = activities[0].body["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("opl-"),
        "the person can find it by its label: {note}"
    );
}

#[tokio::test]
async fn pipedrive_a_rate_limit_is_waited_out_by_its_reset_header_and_the_deal_made_once() {
    use crate::emulators::pipedrive::Pipedrive;
    let api = <Pipedrive as Api>::start().await;
    let ledger = api.ledger();
    let server = ledger.serve();
    api.fault(Fault::RateLimit { retry_after_s: 1 }, 1);
    let id = start(
        &server,
        "pipedrive",
        "create_deal",
        json!({"title": "Acme renewal"}),
    )
    .await;
    let settled = settle(&server, &id).await;
    let ids: Vec<String> = api
        .objects("deal")
        .iter()
        .map(|deal| deal.body["id"].to_string())
        .collect();
    assert_succeeded_with(&settled, &ids);
    let types = event_types(&server, &id).await;
    assert!(
        types.iter().any(|kind| kind == "AttemptNotSent"),
        "{types:?}"
    );
}
