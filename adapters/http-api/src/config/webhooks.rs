//! `[[webhooks]]`: the endpoints outcome events are delivered to, checked at start.
//!
//! ```toml
//! [[webhooks]]
//! id = "billing"
//! url = "https://billing.internal.example/hooks/opledger"
//! secret_env = "BILLING_WEBHOOK_SECRET"      # a whsec_… secret (several, space-separated, while rotating)
//! events = ["succeeded", "needs_review"]      # or ["all"]
//! tenants = ["acme"]                          # optional: every tenant when left out
//! ```
//!
//! Every refusal names the file, the line and the field and says what to write.

use std::collections::BTreeSet;

use opledger_webhooks::endpoint::{check_url, MAX_ENDPOINT_ID_BYTES};
use opledger_webhooks::schedule::{DEFAULT_RETRY_WINDOW_S, MAX_RETRY_WINDOW_S};
use opledger_webhooks::signing::{Secret, MAX_SECRETS_PER_ENDPOINT};
use opledger_webhooks::{
    Endpoint, DEFAULT_REQUEST_TIMEOUT_MS, DEFAULT_WEBHOOK_LEASE_MS, MAX_ENDPOINTS,
    MAX_REQUEST_TIMEOUT_MS, MAX_WEBHOOK_LEASE_MS, MIN_REQUEST_TIMEOUT_MS, MIN_WEBHOOK_LEASE_MS,
};
use serde::Deserialize;
use toml::Spanned;

use super::{span, spanned_or, Checker, ConfigError, StoreUrl};
use crate::render::wanted_types;

/// One `[[webhooks]]` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WebhookEntry {
    id: Spanned<String>,
    url: Spanned<String>,
    secret_env: Option<Spanned<String>>,
    events: Option<Spanned<Vec<String>>>,
    tenants: Option<Spanned<Vec<String>>>,
    /// Private and link-local addresses are refused unless the entry allows them by name.
    #[serde(default)]
    allow_private_network: bool,
    retry_window_s: Option<Spanned<u64>>,
    request_timeout_ms: Option<Spanned<u64>>,
}

impl Checker<'_> {
    /// Refuses webhooks on a KurrentDB ledger: its instances share no journal, so each would
    /// keep its own checkpoints and deliver every event once per instance, with no lease to make
    /// one of them the sender (docs/src/subscribers/webhooks.md, "Several instances").
    pub(super) fn webhooks_fit_the_store(
        &self,
        entries: &[WebhookEntry],
        store: &StoreUrl,
    ) -> Result<(), ConfigError> {
        match (entries.first(), store) {
            (Some(first), StoreUrl::KurrentDb(_)) => Err(self.error(
                Some(first.id.span()),
                "webhooks[0]",
                "webhooks need a journal every instance shares, and a KurrentDB ledger has none \
                 here: each instance would deliver every event. Keep the ledger in PostgreSQL \
                 (store = \"postgres://…\") or SQLite to deliver webhooks, or remove the \
                 [[webhooks]] entries"
                    .to_owned(),
            )),
            _ => Ok(()),
        }
    }

    /// `webhook_lease_ms`, checked against its range.
    pub(super) fn webhook_lease_ms(
        &self,
        value: &Option<Spanned<u64>>,
    ) -> Result<u64, ConfigError> {
        let lease_ms = spanned_or(value, DEFAULT_WEBHOOK_LEASE_MS);
        if !(MIN_WEBHOOK_LEASE_MS..=MAX_WEBHOOK_LEASE_MS).contains(&lease_ms) {
            return Err(self.error(
                span(value),
                "webhook_lease_ms",
                format!(
                    "is {lease_ms}; use {MIN_WEBHOOK_LEASE_MS} to {MAX_WEBHOOK_LEASE_MS} ms (how long a killed instance's endpoints wait before another instance takes them over)"
                ),
            ));
        }
        Ok(lease_ms)
    }

    /// Every `[[webhooks]]` entry, checked; `tenants` are the configured tenants.
    pub(super) fn webhooks(
        &self,
        entries: &[WebhookEntry],
        tenants: &BTreeSet<String>,
    ) -> Result<Vec<Endpoint>, ConfigError> {
        if entries.len() > MAX_ENDPOINTS {
            return Err(self.error(
                None,
                "webhooks",
                format!(
                    "lists {} endpoints; at most {MAX_ENDPOINTS} are allowed",
                    entries.len()
                ),
            ));
        }
        let mut seen = BTreeSet::new();
        let mut endpoints = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let field = format!("webhooks[{index}]");
            let endpoint = self.webhook(&field, entry, tenants)?;
            if !seen.insert(endpoint.id.clone()) {
                return Err(self.error(
                    Some(entry.id.span()),
                    &format!("{field}.id"),
                    format!(
                        "`{}` names two endpoints; give each a distinct id",
                        endpoint.id
                    ),
                ));
            }
            endpoints.push(endpoint);
        }
        Ok(endpoints)
    }

    fn webhook(
        &self,
        field: &str,
        entry: &WebhookEntry,
        tenants: &BTreeSet<String>,
    ) -> Result<Endpoint, ConfigError> {
        let id = entry.id.get_ref().trim();
        let id_ok = !id.is_empty()
            && id.len() <= MAX_ENDPOINT_ID_BYTES
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !id_ok {
            return Err(self.error(
                Some(entry.id.span()),
                &format!("{field}.id"),
                format!("`{id}` is not an endpoint id; use 1 to {MAX_ENDPOINT_ID_BYTES} letters, digits, `-` or `_`, e.g. \"billing\""),
            ));
        }
        let url = check_url(entry.url.get_ref().trim(), entry.allow_private_network).map_err(
            |message| self.error(Some(entry.url.span()), &format!("{field}.url"), message),
        )?;
        let secrets = self.webhook_secrets(field, entry)?;
        let events = match &entry.events {
            Some(events) => wanted_types(&format!("{field}.events"), events.get_ref())
                .map_err(|error| {
                    self.error(Some(events.span()), &error.field, error.message.clone())
                })?
                .into_iter()
                .map(str::to_owned)
                .collect(),
            None => {
                return Err(self.error(
                    Some(entry.id.span()),
                    &format!("{field}.events"),
                    "is missing; list the event types it receives, e.g. events = [\"succeeded\", \"needs_review\"], or events = [\"all\"]".into(),
                ))
            }
        };
        let tenants = match &entry.tenants {
            None => None,
            Some(named) => {
                for tenant in named.get_ref() {
                    if !tenants.contains(tenant) {
                        return Err(self.error(
                            Some(named.span()),
                            &format!("{field}.tenants"),
                            format!("`{tenant}` is not a configured tenant; name tenants from [[tenants]], or leave tenants out for all"),
                        ));
                    }
                }
                Some(named.get_ref().iter().cloned().collect())
            }
        };
        let retry_window_s = entry
            .retry_window_s
            .as_ref()
            .map_or(DEFAULT_RETRY_WINDOW_S, |window| *window.get_ref());
        if !(1..=MAX_RETRY_WINDOW_S).contains(&retry_window_s) {
            return Err(self.error(
                span(&entry.retry_window_s),
                &format!("{field}.retry_window_s"),
                format!("is {retry_window_s}; use 1 to {MAX_RETRY_WINDOW_S} seconds (the default, {DEFAULT_RETRY_WINDOW_S}, is three days)"),
            ));
        }
        let request_timeout_ms = entry
            .request_timeout_ms
            .as_ref()
            .map_or(DEFAULT_REQUEST_TIMEOUT_MS, |timeout| *timeout.get_ref());
        if !(MIN_REQUEST_TIMEOUT_MS..=MAX_REQUEST_TIMEOUT_MS).contains(&request_timeout_ms) {
            return Err(self.error(
                span(&entry.request_timeout_ms),
                &format!("{field}.request_timeout_ms"),
                format!("is {request_timeout_ms}; use {MIN_REQUEST_TIMEOUT_MS} to {MAX_REQUEST_TIMEOUT_MS} ms (the default is {DEFAULT_REQUEST_TIMEOUT_MS})"),
            ));
        }
        Ok(Endpoint {
            id: id.to_owned(),
            url,
            secrets,
            events,
            tenants,
            allow_private_network: entry.allow_private_network,
            retry_window_s,
            request_timeout_ms,
        })
    }

    /// The secrets in the variable `secret_env` names: one `whsec_…`, or several separated by
    /// spaces while a secret is rotated (each delivery is signed with all of them).
    fn webhook_secrets(
        &self,
        field: &str,
        entry: &WebhookEntry,
    ) -> Result<Vec<Secret>, ConfigError> {
        let Some(variable) = &entry.secret_env else {
            return Err(self.error(
                Some(entry.id.span()),
                &format!("{field}.secret_env"),
                "is missing; add secret_env = \"VARIABLE\" naming an environment variable that holds a whsec_… secret (make one with `echo whsec_$(openssl rand -base64 32)`)".into(),
            ));
        };
        let at = |message: String| {
            self.error(
                Some(variable.span()),
                &format!("{field}.secret_env"),
                message,
            )
        };
        let value = (self.env)(variable.get_ref()).ok_or_else(|| {
            at(format!(
                "environment variable `{}` is not set; export it with a whsec_… secret before starting the server",
                variable.get_ref()
            ))
        })?;
        let secrets = value
            .split_whitespace()
            .map(|text| {
                // Kept out of every log line and answer (`opledger_domain::redact`).
                opledger_domain::redact::register(text);
                Secret::parse(text)
                    .map_err(|message| at(format!("`{}`: {message}", variable.get_ref())))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if secrets.is_empty() || secrets.len() > MAX_SECRETS_PER_ENDPOINT {
            return Err(at(format!(
                "`{}` holds {} secrets; give 1 to {MAX_SECRETS_PER_ENDPOINT}, separated by spaces while rotating",
                variable.get_ref(),
                secrets.len()
            )));
        }
        Ok(secrets)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{parse, ConfigError, ServeConfig};

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn env(name: &str) -> Option<String> {
        match name {
            "ACME_TOKEN" => Some("0123456789abcdef0123".into()),
            "HOOK_SECRET" => Some(SECRET.into()),
            "ROTATING" => Some(format!("{SECRET} whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")),
            "NOT_WHSEC" => Some("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()),
            _ => None,
        }
    }

    /// The tenant is on lines 2-4; the entry's keys on lines 7-11.
    const GOOD: &str = r#"
[[tenants]]
id = "acme"
token_env = "ACME_TOKEN"

[[webhooks]]
id = "billing"
url = "https://billing.internal.example/hooks/opledger"
secret_env = "HOOK_SECRET"
events = ["succeeded", "needs_review"]
tenants = ["acme"]
"#;

    fn check(text: &str) -> Result<ServeConfig, ConfigError> {
        parse("serve.toml", text, &env)
    }

    #[test]
    fn four_lines_subscribe_a_service() {
        let config = check(GOOD).expect("valid");
        let endpoint = &config.webhooks[0];
        assert_eq!(endpoint.id, "billing");
        assert_eq!(
            endpoint
                .events
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            ["needs_review", "succeeded"]
        );
        assert_eq!(endpoint.tenants, Some(["acme".to_owned()].into()));
        let all =
            check(&GOOD.replace(r#"["succeeded", "needs_review"]"#, r#"["all"]"#)).expect("valid");
        assert_eq!(all.webhooks[0].events.len(), crate::render::TYPES.len());
        let rotating = check(&GOOD.replace("HOOK_SECRET", "ROTATING")).expect("valid");
        assert_eq!(rotating.webhooks[0].secrets.len(), 2);
    }

    #[test]
    fn every_bad_entry_is_refused_with_its_line_field_and_what_to_write() {
        let cases = [
            (
                r#"["succeeded", "needs_review"]"#,
                r#"["succeded"]"#,
                "webhooks[0].events",
                10,
                "use `all` or some of",
            ),
            (
                "HOOK_SECRET",
                "MISSING_SECRET",
                "webhooks[0].secret_env",
                9,
                "is not set",
            ),
            (
                "HOOK_SECRET",
                "NOT_WHSEC",
                "webhooks[0].secret_env",
                9,
                "does not start with `whsec_`",
            ),
            (
                "https://billing.internal.example",
                "http://billing.internal.example",
                "webhooks[0].url",
                8,
                "use https://",
            ),
            (
                "https://billing.internal.example",
                "https://169.254.169.254",
                "webhooks[0].url",
                8,
                "allow_private_network",
            ),
            (
                r#"tenants = ["acme"]"#,
                r#"tenants = ["globex"]"#,
                "webhooks[0].tenants",
                11,
                "not a configured tenant",
            ),
            (
                r#"id = "billing""#,
                r#"id = "bill ing""#,
                "webhooks[0].id",
                7,
                "letters, digits",
            ),
            (
                "tenants = [\"acme\"]",
                "tenants = [\"acme\"]\nrequest_timeout_ms = 5",
                "webhooks[0].request_timeout_ms",
                12,
                "use 100 to 60000 ms",
            ),
            (
                "tenants = [\"acme\"]",
                "tenants = [\"acme\"]\nretry_window_s = 0",
                "webhooks[0].retry_window_s",
                12,
                "use 1 to 604800 seconds",
            ),
            (
                "events = [\"succeeded\", \"needs_review\"]\n",
                "",
                "webhooks[0].events",
                7,
                "events = [\"all\"]",
            ),
        ];
        for (from, to, field, line, says) in cases {
            let text = GOOD.replace(from, to);
            let error = check(&text).expect_err(to);
            assert_eq!(error.field, field, "{to}: {error}");
            assert_eq!(error.line, Some(line), "{to}: {error}");
            assert!(error.message.contains(says), "{to}: {error}");
            assert!(
                !error.to_string().contains("MfKQ9r8G"),
                "a secret leaked: {error}"
            );
        }
    }

    #[test]
    fn the_webhook_lease_is_checked_against_its_range_with_its_line() {
        assert_eq!(
            check(GOOD).expect("valid").webhook_lease_ms,
            opledger_webhooks::DEFAULT_WEBHOOK_LEASE_MS
        );
        let set = format!("webhook_lease_ms = 2000\n{GOOD}");
        assert_eq!(check(&set).expect("valid").webhook_lease_ms, 2_000);
        for bad in [999, 600_001] {
            let text = format!("\nwebhook_lease_ms = {bad}{GOOD}");
            let error = check(&text).expect_err("out of range");
            assert_eq!(error.field, "webhook_lease_ms", "{error}");
            assert_eq!(error.line, Some(2), "{error}");
            assert!(error.message.contains("use 1000 to 600000 ms"), "{error}");
        }
    }

    #[test]
    fn webhooks_on_a_kurrentdb_ledger_are_refused_saying_which_ledgers_deliver_them() {
        let text = format!("store = \"kurrentdb://127.0.0.1:2113?tls=false\"\n{GOOD}");
        let error = check(&text).expect_err("refused");
        assert_eq!(error.field, "webhooks[0]", "{error}");
        assert_eq!(error.line, Some(8), "{error}");
        assert!(
            error
                .message
                .contains("each instance would deliver every event")
                && error.message.contains("postgres://"),
            "{error}"
        );
        let without = text.split("[[webhooks]]").next().expect("the text before");
        assert!(
            check(without).is_ok(),
            "a KurrentDB ledger without webhooks starts"
        );
    }

    #[test]
    fn plain_http_is_allowed_for_loopback_and_private_addresses_only_by_name() {
        let loopback = GOOD.replace("https://billing.internal.example", "http://127.0.0.1:9000");
        assert!(check(&loopback).is_ok());
        let private = GOOD.replace("https://billing.internal.example", "https://10.1.2.3");
        assert!(check(&private).is_err());
        let allowed = private.replace(
            "tenants = [\"acme\"]",
            "tenants = [\"acme\"]\nallow_private_network = true",
        );
        assert!(check(&allowed).is_ok());
    }

    #[test]
    fn two_endpoints_with_one_id_are_refused() {
        let text = format!(
            "{GOOD}{}",
            &GOOD[GOOD.find("[[webhooks]]").expect("entry")..]
        );
        let error = check(&text).expect_err("a duplicate");
        assert_eq!(error.field, "webhooks[1].id", "{error}");
    }
}
