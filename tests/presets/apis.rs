//! Each preset as the scenarios see it: its emulator, the configuration that selects it, how to
//! break its next create, and what it stored.

use serde_json::{json, Value};

use crate::emulators::attio::{self, Attio};
use crate::emulators::hubspot::{self, HubSpot};
use crate::emulators::pipedrive::{self, Pipedrive};
use crate::emulators::salesforce::{self, Salesforce};
use crate::emulators::stripe::{self, Stripe};
use crate::emulators::zendesk::{self, Zendesk};
use crate::emulators::Emulator;
use crate::ledger::Ledger;

/// The token of the provider account the ledger's [`crate::ledger::ACCOUNT`] is configured with.
pub const TOKEN_A: &str = "token-a-0123456789";
/// The token of another account at the same provider.
pub const TOKEN_B: &str = "token-b-0123456789";
/// The emulators' short search lag, in milliseconds (the real ones are far longer).
pub const EMULATED_LAG_MS: u64 = 500;

pub fn accounts() -> Vec<(String, String)> {
    vec![
        (TOKEN_A.to_owned(), "a".to_owned()),
        (TOKEN_B.to_owned(), "b".to_owned()),
    ]
}

/// A `[[connectors]]` entry for preset `id` at `base_url`; `source` says where its document comes
/// from (`preset = "…"` or `file = "…"`) and may add lines (settings).
pub fn preset_entry(id: &str, source: &str, base_url: &str) -> String {
    format!("[[connectors]]\nid = \"{id}\"\n{source}\nbase_url = \"{base_url}\"")
}

/// The text of preset `name` with each `(from, to)` replaced (a shorter lag or retention for a
/// test); every `from` must be in it.
pub fn shortened(name: &str, replacements: &[(&str, &str)]) -> String {
    let mut text = opledger_providers::presets::preset(name)
        .expect("the preset")
        .1
        .to_owned();
    for (from, to) in replacements {
        assert!(text.contains(from), "preset {name} states `{from}`");
        text = text.replace(from, to);
    }
    text
}

/// One preset and its emulator.
#[allow(async_fn_in_trait)] // used only here, never as `dyn` or across threads
pub trait Api: Emulator + Sized {
    /// The provider id the configuration registers it under.
    const PROVIDER: &'static str;
    /// The action the scenarios call.
    const ACTION: &'static str;
    /// Whether a lost request may be sent again safely (a key or a unique label); otherwise only
    /// a lagging search can tell, and a person decides when it finds nothing.
    const SAFE_RETRY: bool;
    /// Starts the emulator with accounts `a` ([`TOKEN_A`]) and `b` ([`TOKEN_B`]).
    async fn start() -> Self;
    /// A ledger whose connector is this preset, pointed at the emulator.
    fn ledger(&self) -> Ledger;
    /// The ids of the objects the action created in provider account `account`.
    fn created(&self, account: &str) -> Vec<String>;
    /// The action's arguments for a request titled `title`.
    fn args(title: &str) -> Value;
}

impl Api for Stripe {
    const PROVIDER: &'static str = "stripe";
    const ACTION: &'static str = "create_customer";
    const SAFE_RETRY: bool = true;

    async fn start() -> Self {
        Stripe::start(stripe::Config {
            keys: accounts(),
            key_retention_ms: stripe::DEFAULT_KEY_RETENTION_MS,
            search_lag_ms: EMULATED_LAG_MS,
        })
        .await
    }

    fn ledger(&self) -> Ledger {
        let entry = preset_entry("stripe", "preset = \"stripe\"", &self.running.base_url);
        Ledger::new(&entry, TOKEN_A, &[])
    }

    fn created(&self, account: &str) -> Vec<String> {
        ids(self
            .objects("customer")
            .into_iter()
            .filter(|o| o.account == account)
            .map(|o| o.body["id"].clone()))
    }

    fn args(title: &str) -> Value {
        json!({"name": title, "email": "client@example.com"})
    }
}

impl Api for Salesforce {
    const PROVIDER: &'static str = "salesforce";
    const ACTION: &'static str = "upsert_case";
    const SAFE_RETRY: bool = true;

    async fn start() -> Self {
        Salesforce::start(salesforce::Config {
            tokens: accounts(),
            label_field: "Opledger_Label__c".to_owned(),
        })
        .await
    }

    fn ledger(&self) -> Ledger {
        let entry = preset_entry(
            "salesforce",
            "preset = \"salesforce\"",
            &self.running.base_url,
        );
        Ledger::new(&entry, TOKEN_A, &[])
    }

    fn created(&self, account: &str) -> Vec<String> {
        ids(self
            .records("Case")
            .into_iter()
            .filter(|r| r.org == account)
            .map(|r| json!(r.id)))
    }

    fn args(title: &str) -> Value {
        json!({"Subject": title, "Priority": "High"})
    }
}

/// The label property the HubSpot tests name (not the preset's default, so the setting is
/// proven to reach the create, the search filter and the search's label pointer).
pub const HUBSPOT_LABEL_PROPERTY: &str = "agent_operation_label";
/// The search lag the ledgers of the search presets are told, in milliseconds: longer than the
/// emulators'.
pub const LEDGER_SEARCH_LAG_MS: u64 = 1_500;

impl Api for HubSpot {
    const PROVIDER: &'static str = "hubspot";
    const ACTION: &'static str = "create_task";
    const SAFE_RETRY: bool = false;

    async fn start() -> Self {
        HubSpot::start(hubspot::Config {
            tokens: accounts(),
            label_property: HUBSPOT_LABEL_PROPERTY.to_owned(),
            search_lag_ms: EMULATED_LAG_MS,
        })
        .await
    }

    /// The preset as a file with a short lag (the shipped 30 s would make every lookup test
    /// wait that long), and the user's own label property as a setting.
    fn ledger(&self) -> Ledger {
        let lag = format!("lag_ms = {LEDGER_SEARCH_LAG_MS}");
        let text = shortened("hubspot", &[("lag_ms = 30000", lag.as_str())]);
        let source = format!("file = \"hubspot.toml\"\nsettings = {{ label_property = \"{HUBSPOT_LABEL_PROPERTY}\" }}");
        let entry = preset_entry("hubspot", &source, &self.running.base_url);
        Ledger::new(&entry, TOKEN_A, &[("hubspot.toml", text)])
    }

    fn created(&self, account: &str) -> Vec<String> {
        ids(self
            .objects("tasks")
            .into_iter()
            .filter(|o| o.portal == account)
            .map(|o| json!(o.id)))
    }

    fn args(title: &str) -> Value {
        json!({"subject": title, "due": "2026-12-02T09:00:00Z", "priority": "HIGH"})
    }
}

impl Api for Zendesk {
    const PROVIDER: &'static str = "zendesk";
    const ACTION: &'static str = "create_ticket";
    const SAFE_RETRY: bool = true;

    async fn start() -> Self {
        Zendesk::start(zendesk::Config {
            tokens: accounts(),
            key_retention_ms: zendesk::DEFAULT_KEY_RETENTION_MS,
        })
        .await
    }

    fn ledger(&self) -> Ledger {
        let entry = preset_entry("zendesk", "preset = \"zendesk\"", &self.running.base_url);
        Ledger::new(&entry, TOKEN_A, &[])
    }

    fn created(&self, account: &str) -> Vec<String> {
        ids(self
            .tickets()
            .into_iter()
            .filter(|ticket| ticket.account == account)
            .map(|ticket| json!(ticket.body["id"].to_string())))
    }

    fn args(title: &str) -> Value {
        json!({"subject": title, "comment": "The client asked for a call back", "priority": "high"})
    }
}

impl Api for Attio {
    const PROVIDER: &'static str = "attio";
    const ACTION: &'static str = "assert_company";
    const SAFE_RETRY: bool = true;

    async fn start() -> Self {
        Attio::start(attio::Config {
            tokens: accounts(),
            label_attribute: "opledger_label".to_owned(),
            query_lag_ms: EMULATED_LAG_MS,
        })
        .await
    }

    fn ledger(&self) -> Ledger {
        let entry = preset_entry("attio", "preset = \"attio\"", &self.running.base_url);
        Ledger::new(&entry, TOKEN_A, &[])
    }

    fn created(&self, account: &str) -> Vec<String> {
        ids(self
            .records()
            .into_iter()
            .filter(|record| record.workspace == account)
            .map(|record| json!(record.id)))
    }

    fn args(title: &str) -> Value {
        json!({"name": title, "domains": ["acme.example"]})
    }
}

/// The key of the deal custom field the Pipedrive tests created (40 hexadecimal characters).
pub const PIPEDRIVE_LABEL_KEY: &str = "dcf558aac1ae4e8c4f849ba5e668430d8df9be12";
/// Two other text custom fields every emulated deal carries (a region, a lead source).
pub const PIPEDRIVE_REGION_KEY: &str = "5f2a7c0e9b1d43e8a6c4f0d2b8e1a3c5d7f9b0e2";
pub const PIPEDRIVE_SOURCE_KEY: &str = "a13c5e7f9b2d4f6a8c0e1b3d5f7a9c2e4b6d8f0a";

impl Api for Pipedrive {
    const PROVIDER: &'static str = "pipedrive";
    const ACTION: &'static str = "create_deal";
    const SAFE_RETRY: bool = false;

    async fn start() -> Self {
        Pipedrive::start(pipedrive::Config {
            tokens: accounts(),
            label_field_key: PIPEDRIVE_LABEL_KEY.to_owned(),
            // Listed before the label in every search hit: a preset that looked for the label
            // in the first element only would find none of these deals.
            other_custom_fields: vec![
                (PIPEDRIVE_REGION_KEY.to_owned(), "north-east".to_owned()),
                (PIPEDRIVE_SOURCE_KEY.to_owned(), "web form".to_owned()),
            ],
            search_lag_ms: EMULATED_LAG_MS,
        })
        .await
    }

    /// The preset as a file with a short lag (as for HubSpot), and the field key as a setting.
    fn ledger(&self) -> Ledger {
        let lag = format!("lag_ms = {LEDGER_SEARCH_LAG_MS}");
        let text = shortened("pipedrive", &[("lag_ms = 30000", lag.as_str())]);
        let source = format!("file = \"pipedrive.toml\"\nsettings = {{ label_field_key = \"{PIPEDRIVE_LABEL_KEY}\" }}");
        let entry = preset_entry("pipedrive", &source, &self.running.base_url);
        Ledger::new(&entry, TOKEN_A, &[("pipedrive.toml", text)])
    }

    fn created(&self, account: &str) -> Vec<String> {
        ids(self
            .objects("deal")
            .into_iter()
            .filter(|deal| deal.company == account)
            .map(|deal| json!(deal.body["id"].to_string())))
    }

    fn args(title: &str) -> Value {
        json!({"title": title, "value": 1200, "currency": "EUR"})
    }
}

fn ids(values: impl Iterator<Item = Value>) -> Vec<String> {
    values
        .map(|value| value.as_str().expect("a string id").to_owned())
        .collect()
}
