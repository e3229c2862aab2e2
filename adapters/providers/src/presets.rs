//! Connectors that ship with opledger, embedded in the binary.
//!
//! The three shapes of the CRM stand (the wire contract is in [`crate::contract`]) and real APIs
//! written from their public documentation (Attio, HubSpot, Pipedrive, Salesforce, Stripe, Zendesk; each file says which
//! facts it relies on). Each is an ordinary connector document and runs through exactly the code
//! path a user's file does. A preset leaves out what belongs to an installation (accounts, and
//! the base URL where each customer has its own), which the user gives as [`crate::Overrides`].

/// Every preset: its name, its file name and its text.
const PRESETS: &[(&str, &str, &str)] = &[
    (
        "attio",
        "attio.toml",
        include_str!("../connectors/attio.toml"),
    ),
    (
        "crm-stand-keyed",
        "crm-stand-keyed.toml",
        include_str!("../connectors/crm-stand-keyed.toml"),
    ),
    (
        "crm-stand-labelled",
        "crm-stand-labelled.toml",
        include_str!("../connectors/crm-stand-labelled.toml"),
    ),
    (
        "crm-stand-plain",
        "crm-stand-plain.toml",
        include_str!("../connectors/crm-stand-plain.toml"),
    ),
    (
        "hubspot",
        "hubspot.toml",
        include_str!("../connectors/hubspot.toml"),
    ),
    (
        "pipedrive",
        "pipedrive.toml",
        include_str!("../connectors/pipedrive.toml"),
    ),
    (
        "salesforce",
        "salesforce.toml",
        include_str!("../connectors/salesforce.toml"),
    ),
    (
        "stripe",
        "stripe.toml",
        include_str!("../connectors/stripe.toml"),
    ),
    (
        "zendesk",
        "zendesk.toml",
        include_str!("../connectors/zendesk.toml"),
    ),
];

/// The preset called `name`: its file name and its text.
pub fn preset(name: &str) -> Option<(&'static str, &'static str)> {
    PRESETS
        .iter()
        .find(|(preset, _, _)| *preset == name)
        .map(|(_, file, text)| (*file, *text))
}

/// The names of every preset, in a fixed order.
pub fn preset_names() -> impl Iterator<Item = &'static str> {
    PRESETS.iter().map(|(name, _, _)| *name)
}

/// The settings the CRM stand was started with that its client must know, because the
/// stand's documents state the stand's defaults: how long it keeps a key and how far its
/// search index lags. `None` keeps the document's value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StandSettings {
    /// The stand's key retention and the safety margin kept before it, in seconds (keyed).
    pub key_retention_s: Option<(u64, u64)>,
    /// The stand's search lag, in milliseconds (plain).
    pub search_lag_ms: Option<u64>,
}

/// The document of one of the CRM stand's shapes, adjusted to a stand started with `settings`
/// (the demo and the tests start stands with short retentions and lags).
pub fn stand_document(shape: crate::Shape, settings: StandSettings) -> crate::Document {
    let (file, text) = preset(shape.preset()).expect("every stand shape has a preset");
    let mut document =
        crate::document::parse(file, text).expect("the stand presets are valid documents");
    for action in &mut document.actions {
        if let (
            Some((retention, margin)),
            crate::document::Dedup::IdempotencyKey {
                retention_s,
                safety_margin_s,
                ..
            },
        ) = (settings.key_retention_s, &mut action.dedup)
        {
            *retention_s = retention;
            *safety_margin_s = margin;
        }
        if let (Some(lag), crate::document::Lookup::Search(search)) =
            (settings.search_lag_ms, &mut action.lookup)
        {
            search.lag_ms = lag;
        }
    }
    document
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::{parse, Dedup, Lookup, ResetHeader, ResetUnit};

    #[test]
    fn every_preset_loads_and_is_named_by_its_file() {
        for name in preset_names() {
            let (file, text) = preset(name).expect("listed");
            assert_eq!(file, format!("{name}.toml"));
            let document = parse(file, text).unwrap_or_else(|errors| {
                panic!("{}", crate::error::render_all(&errors));
            });
            assert_eq!(document.id.as_str(), name);
            assert!(document.accounts.is_empty(), "accounts belong to the user");
            if name.starts_with("crm-stand-") {
                assert!(
                    document.base_url.is_none(),
                    "the stand's address belongs to the installation"
                );
                assert!(document.action("create_task").is_some());
            }
        }
        assert_eq!(preset("zoho"), None);
    }

    #[test]
    fn the_api_presets_carry_the_contracts_their_documentation_gives() {
        let load = |name: &str| {
            let (file, text) = preset(name).expect("a preset");
            parse(file, text).expect("valid")
        };
        let stripe = load("stripe");
        for action in &stripe.actions {
            assert!(matches!(
                action.dedup,
                Dedup::IdempotencyKey {
                    retention_s: 86_400,
                    ..
                }
            ));
        }
        let customer = stripe.action("create_customer").expect("customers");
        assert!(matches!(&customer.lookup, Lookup::Search(search) if search.lag_ms == 60_000));
        let salesforce = load("salesforce");
        assert!(
            salesforce.base_url.is_none(),
            "every org has its own domain"
        );
        for action in &salesforce.actions {
            assert!(matches!(
                action.dedup,
                Dedup::UniqueLabel { conflict: Some(_) }
            ));
            assert!(matches!(action.lookup, Lookup::Consistent(_)));
        }
        let attio = load("attio");
        assert!(matches!(attio.actions[0].dedup, Dedup::UniqueLabel { .. }));
        let pipedrive = load("pipedrive");
        let deal = pipedrive.action("create_deal").expect("deals");
        assert!(matches!(&deal.lookup, Lookup::Search(search) if search.lag_ms == 30_000));
        let activity = pipedrive.action("create_activity").expect("activities");
        assert!(
            matches!(activity.lookup, Lookup::None),
            "activities are not searchable"
        );
        let zendesk = load("zendesk");
        assert!(matches!(
            zendesk.actions[0].dedup,
            Dedup::IdempotencyKey {
                retention_s: 7_200,
                ..
            }
        ));
        assert!(matches!(zendesk.actions[0].lookup, Lookup::Consistent(_)));
        let hubspot = load("hubspot");
        for action in &hubspot.actions {
            assert!(matches!(action.dedup, Dedup::None));
            assert!(matches!(&action.lookup, Lookup::Search(search) if search.lag_ms == 30_000));
        }
        assert!(
            matches!(&deal.lookup, Lookup::Search(search) if search.label_at == "/item/custom_fields/*")
        );
    }

    #[test]
    fn each_api_preset_waits_out_a_429_as_its_documentation_gives() {
        let load = |name: &str| {
            let (file, text) = preset(name).expect("a preset");
            parse(file, text).expect("valid")
        };
        // Per-second windows, or a Retry-After on every 429: a second at least.
        for name in ["stripe", "salesforce", "zendesk", "attio", "hubspot"] {
            let limit = load(name).rate_limit;
            assert_eq!((name, limit.min_wait_ms, limit.reset), (name, 1_000, None));
        }
        // Pipedrive: its reset header, else its whole 2-second window.
        let pipedrive = load("pipedrive").rate_limit;
        assert_eq!(pipedrive.min_wait_ms, 2_000);
        assert!(matches!(
            pipedrive.reset,
            Some(ResetHeader { header, unit: ResetUnit::Seconds }) if header == "x-ratelimit-reset"
        ));
        // HubSpot names the exhausted policy instead of a wait: its window, by the body.
        let hubspot = load("hubspot");
        let rules: Vec<_> = hubspot
            .errors
            .rules
            .iter()
            .map(|rule| {
                (
                    rule.status,
                    rule.at.as_deref(),
                    rule.code.as_deref(),
                    rule.retry_after_ms,
                )
            })
            .collect();
        assert_eq!(
            rules,
            vec![
                (
                    429,
                    Some("/policyName"),
                    Some("TEN_SECONDLY_ROLLING"),
                    Some(10_000)
                ),
                (429, Some("/policyName"), Some("DAILY"), Some(600_000)),
            ]
        );
    }

    #[test]
    fn the_stand_presets_carry_the_stands_contracts() {
        let load = |name: &str| {
            let (file, text) = preset(name).expect("a preset");
            parse(file, text).expect("valid")
        };
        let keyed = load("crm-stand-keyed");
        assert!(matches!(
            keyed.actions[0].dedup,
            Dedup::IdempotencyKey {
                retention_s: 86_400,
                safety_margin_s: 3_600,
                ..
            }
        ));
        assert!(matches!(keyed.actions[0].lookup, Lookup::Consistent(_)));
        let labelled = load("crm-stand-labelled");
        assert!(matches!(
            labelled.actions[0].dedup,
            Dedup::UniqueLabel { conflict: Some(_) }
        ));
        let plain = load("crm-stand-plain");
        assert!(matches!(plain.actions[0].dedup, Dedup::None));
        assert!(
            matches!(&plain.actions[0].lookup, Lookup::Search(search) if search.lag_ms == 2_000)
        );
    }
}
