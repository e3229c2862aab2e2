//! Each API preset's request bodies against the provider's own published description of the
//! request: the body an action renders from every argument it takes, checked with a JSON Schema
//! validator against the provider's schema of that request. The schemas are kept beside this
//! file (`provider_schemas/<provider>.json`), each naming the file, commit and version it was
//! taken from, so a provider's new version is a diff to read, not a surprise in production.
//!
//! Zendesk keeps its OpenAPI description in no versioned repository (it serves it from its
//! developer site), so its schema is pinned as a copy committed elsewhere, named with the file's
//! SHA-256. Salesforce is not here: it publishes no description of sObject rows (an org generates
//! its own from its fields); its emulator follows the reference pages it names
//! (docs/src/agents/presets.md says what was looked for).

use std::collections::BTreeMap;
use std::path::PathBuf;

use opledger_providers::template::Context;
use serde_json::{json, Map, Value};

/// Every action of the presets that have a published description, with arguments that use
/// every field the action takes.
fn calls() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        (
            "stripe",
            "create_customer",
            json!({"name": "Acme GmbH", "email": "billing@acme.example", "description": "Key account", "phone": "+49 30 1234567"}),
        ),
        (
            "stripe",
            "create_invoice_item",
            json!({"customer": "cus_NffrFeUfNV2Hib", "amount": 1200, "currency": "eur", "description": "Onboarding"}),
        ),
        (
            "hubspot",
            "create_task",
            json!({"subject": "Call the client", "body": "About invoice 4471", "due": "2026-12-02T09:00:00Z", "status": "NOT_STARTED", "priority": "HIGH", "owner_id": "512"}),
        ),
        (
            "hubspot",
            "create_note",
            json!({"body": "Met the client", "timestamp": "2026-12-02T09:00:00Z", "owner_id": "512"}),
        ),
        (
            "hubspot",
            "create_deal",
            json!({"name": "Renewal 2027", "amount": "1200", "stage": "appointmentscheduled", "pipeline": "default", "close_date": "2026-12-31", "owner_id": "512"}),
        ),
        (
            "pipedrive",
            "create_deal",
            json!({"title": "Renewal 2027", "value": 1200, "currency": "EUR", "person_id": 7, "org_id": 3, "expected_close_date": "2026-12-31"}),
        ),
        (
            "pipedrive",
            "create_activity",
            json!({"subject": "Call the client", "type": "call", "due_date": "2026-12-02", "due_time": "09:00", "deal_id": 11, "participants": [{"person_id": 7, "primary": true}]}),
        ),
        (
            "zendesk",
            "create_ticket",
            json!({"subject": "Printer on fire", "comment": "The third floor printer is smoking", "priority": "urgent", "type": "incident", "tags": ["printer", "facilities"]}),
        ),
        (
            "attio",
            "assert_company",
            json!({"name": "Acme", "description": "Key account", "domains": ["acme.example"]}),
        ),
    ]
}

fn schemas_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/provider_schemas")
}

/// The provider's schema of `action`'s request, from its checked-in description.
fn schema_of(preset: &str, action: &str) -> Value {
    let path = schemas_dir().join(format!("{preset}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let file: Value = serde_json::from_str(&text).expect("the schema file is JSON");
    assert!(
        file["source"]
            .as_str()
            .is_some_and(|source| !source.is_empty()),
        "{} names its source",
        path.display()
    );
    file["requests"][action]["schema"].clone()
}

/// The body `action` of `preset` sends for `args`, with the preset's default settings.
fn rendered(preset: &str, action: &str, args: &Value) -> Value {
    let (file, text) = opledger_providers::presets::preset(preset).expect("a preset");
    let document = opledger_providers::parse(file, text).expect("the preset loads");
    let action = document.action(action).expect("the action");
    let Value::Object(arguments) = args else {
        panic!("arguments are an object")
    };
    let properties = action.input["properties"]
        .as_object()
        .expect("the input schema lists its properties");
    let missing: Vec<&String> = properties
        .keys()
        .filter(|name| !arguments.contains_key(*name))
        .collect();
    assert!(
        missing.is_empty(),
        "{preset} {}: the call must use every argument the action takes, so each is checked; missing {missing:?}",
        action.name
    );
    let settings: BTreeMap<String, String> = document.settings.clone();
    let context = Context {
        args: Some(arguments),
        key: "opk_7f3c9a1e2b",
        label: "opledger-op-018f6b2a-7c1d-7e3f-9a5b-1c2d3e4f5a6b",
        account: "acct-1",
        operation_id: "018f6b2a-7c1d-7e3f-9a5b-1c2d3e4f5a6b",
        settings: &settings,
    };
    action
        .request
        .body_value(&context)
        .unwrap_or_else(|| Value::Object(Map::new()))
}

#[test]
fn every_api_presets_request_body_is_valid_against_the_providers_published_schema() {
    let mut failures = Vec::new();
    for (preset, action, args) in calls() {
        let schema = schema_of(preset, action);
        assert!(schema.is_object(), "{preset}.json describes {action}");
        let validator = jsonschema::validator_for(&schema)
            .unwrap_or_else(|error| panic!("{preset} {action}: the schema compiles: {error}"));
        let body = rendered(preset, action, &args);
        for error in validator.iter_errors(&body) {
            failures.push(format!(
                "{preset} {action}: {error} at {} in {body}",
                error.instance_path()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_action_of_a_described_preset_is_checked() {
    let checked: Vec<(&str, &str)> = calls()
        .iter()
        .map(|(preset, action, _)| (*preset, *action))
        .collect();
    for preset in ["stripe", "hubspot", "pipedrive", "attio", "zendesk"] {
        let (file, text) = opledger_providers::presets::preset(preset).expect("a preset");
        let document = opledger_providers::parse(file, text).expect("the preset loads");
        for action in &document.actions {
            assert!(
                checked.contains(&(preset, action.name.as_str())),
                "{preset} {} has no check against its provider's schema",
                action.name
            );
        }
    }
}
