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

/// The OAuth2 forms of presets whose API issues OAuth2 tokens to apps: the name, the preset it
/// is the OAuth2 form of, and the `[auth]` table written instead of the static token's. The rest
/// of the document is the static preset's, so the two forms never drift apart.
const OAUTH2_FORMS: &[(&str, &str, &str)] = &[
    (
        "hubspot-oauth2",
        "hubspot",
        r#"[auth]
# A public app's OAuth2 tokens (developers.hubspot.com, "OAuth tokens"): POST /oauth/v1/token
# with grant_type=refresh_token, client_id, client_secret and the account's refresh token, as a
# form. The access token lives `expires_in` seconds (1800); the refresh token stays the same. A
# bad refresh token answers 400 {"status":"BAD_REFRESH_TOKEN","message":…}.
kind = "oauth2"
grant = "refresh_token"
token_url = "/oauth/v1/token"        # on https://api.hubapi.com
"#,
    ),
    (
        "salesforce-oauth2",
        "salesforce",
        r#"[auth]
# A connected app's OAuth2 tokens (Salesforce Help, "OAuth 2.0 Refresh Token Flow for Renewed
# Sessions"): POST /services/oauth2/token on the org's My Domain with grant_type=refresh_token,
# client_id (the consumer key), client_secret and the refresh token, as a form. The answer names
# no lifetime: the org's session timeout ends the access token, and the next request answers 401
# INVALID_SESSION_ID, after which the token is renewed and the request sent once more. With
# refresh token rotation enabled on the app each renewal issues a new refresh token, which is
# kept in the token file beside the ledger. A revoked refresh token answers 400
# {"error":"invalid_grant","error_description":"expired access/refresh token"}.
kind = "oauth2"
grant = "refresh_token"
token_url = "/services/oauth2/token" # on the org's My Domain (the base URL's host)
"#,
    ),
    (
        "zendesk-oauth2",
        "zendesk",
        r#"[auth]
# An OAuth client's tokens (developer.zendesk.com, "Working with OAuth refresh tokens"): POST
# /oauth/tokens on the account's subdomain with grant_type=refresh_token, client_id,
# client_secret and the refresh token. Access tokens live `expires_in` seconds (30 minutes by
# default); every renewal issues a new refresh token and deletes the old one (rotation), so the
# new one is kept in the token file beside the ledger before it is used. A used or revoked
# refresh token answers 400 {"error":"invalid_grant","error_description":…}.
kind = "oauth2"
grant = "refresh_token"
token_url = "/oauth/tokens"          # on https://<subdomain>.zendesk.com
scopes = ["tickets:write", "read"]
"#,
    ),
];

/// Every preset, the OAuth2 forms written out: name, file name and text.
fn all() -> &'static [(&'static str, String, std::borrow::Cow<'static, str>)] {
    static ALL: std::sync::LazyLock<Vec<(&str, String, std::borrow::Cow<'static, str>)>> =
        std::sync::LazyLock::new(|| {
            let mut all: Vec<_> = PRESETS
                .iter()
                .map(|(name, file, text)| {
                    (*name, (*file).to_owned(), std::borrow::Cow::Borrowed(*text))
                })
                .collect();
            for (name, base, auth) in OAUTH2_FORMS {
                let (_, _, text) = PRESETS
                    .iter()
                    .find(|(preset, _, _)| preset == base)
                    .expect("an OAuth2 form names a preset");
                all.push((
                    *name,
                    format!("{name}.toml"),
                    std::borrow::Cow::Owned(with_auth(text, auth)),
                ));
            }
            all.sort_by_key(|(name, _, _)| *name);
            all
        });
    &ALL
}

/// `text` with its `[auth]` table (up to the next blank line) replaced by `auth`.
fn with_auth(text: &str, auth: &str) -> String {
    let start = text
        .find("\n[auth]\n")
        .map(|at| at + 1)
        .expect("a preset has an [auth] table");
    let end = text[start..]
        .find("\n\n")
        .map_or(text.len(), |at| start + at + 1);
    format!("{}{auth}{}", &text[..start], &text[end..])
}

/// The preset called `name`: its file name and its text.
pub fn preset(name: &str) -> Option<(&'static str, &'static str)> {
    all()
        .iter()
        .find(|(preset, _, _)| *preset == name)
        .map(|(_, file, text)| (file.as_str(), text.as_ref()))
}

/// The names of every preset, in a fixed order.
pub fn preset_names() -> impl Iterator<Item = &'static str> {
    all().iter().map(|(name, _, _)| *name)
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
            // An OAuth2 form registers as the API it is a form of.
            assert_eq!(document.id.as_str(), name.trim_end_matches("-oauth2"));
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
    fn a_crm_stand_task_without_a_title_is_refused_before_anything_is_recorded() {
        // The embedded default serves the stand's keyed and plain shapes: `{}` made an empty
        // task there.
        let action = opledger_domain::ids::ActionName::new("create_task").expect("valid");
        for name in ["crm-stand-keyed", "crm-stand-labelled", "crm-stand-plain"] {
            let overrides = crate::Overrides {
                base_url: Some("http://127.0.0.1:1".into()),
                accounts: vec![crate::AccountSpec {
                    id: opledger_domain::ids::AccountId::new("acct-1").expect("valid"),
                    tenants: vec![opledger_domain::ids::TenantId::new("acme").expect("valid")],
                    credentials: crate::Credentials::token("t"),
                }],
                ..crate::Overrides::default()
            };
            let connector = crate::Connector::from_preset(name, overrides).expect("loads");
            let problems = connector
                .check_args(&action, &serde_json::json!({}))
                .expect_err("a task needs a title");
            assert!(
                problems.iter().any(|p| p.message.contains("title")),
                "{name}: {problems:?}"
            );
            let blank = serde_json::json!({"title": ""});
            assert!(connector.check_args(&action, &blank).is_err(), "{name}");
            let titled = serde_json::json!({"title": "Call the client"});
            assert!(connector.check_args(&action, &titled).is_ok(), "{name}");
        }
    }

    #[test]
    fn the_oauth2_forms_differ_from_their_presets_in_auth_alone() {
        for (name, base) in [
            ("salesforce-oauth2", "salesforce"),
            ("hubspot-oauth2", "hubspot"),
            ("zendesk-oauth2", "zendesk"),
        ] {
            let load = |name: &str| {
                let (file, text) = preset(name).expect("a preset");
                parse(file, text).expect("valid")
            };
            let (oauth, plain) = (load(name), load(base));
            assert!(
                matches!(&oauth.auth, crate::Auth::OAuth2(spec) if spec.grant == crate::oauth::Grant::RefreshToken),
                "{name}"
            );
            assert_eq!(plain.auth, crate::Auth::Bearer);
            assert_eq!(
                (oauth.actions, oauth.errors, oauth.settings),
                (plain.actions, plain.errors, plain.settings)
            );
        }
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
