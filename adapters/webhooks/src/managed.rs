//! An endpoint defined through the API rather than the configuration file: its definition as the
//! journal keeps it (one JSON text per endpoint, so every instance sharing the journal reads the
//! same), and the [`Endpoint`] it makes at a moment (the secrets whose rotation window has ended
//! left out).
//!
//! A definition is checked by the server before it is written (the event types and tenants are
//! the server's to know); reading one back checks again what this crate owns (the URL's address
//! rules, the secrets), so a definition edited behind the server's back cannot bypass them.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::endpoint::check_url;
use crate::signing::{Secret, MAX_SECRETS_PER_ENDPOINT};
use crate::Endpoint;

/// Longest a rotated-out secret may keep signing, in seconds (a week: time for every receiver
/// to take the new one).
pub const MAX_ROTATION_OVERLAP_S: u64 = 7 * 24 * 60 * 60;
/// How long a rotated-out secret keeps signing when the operator names no time, in seconds.
pub const DEFAULT_ROTATION_OVERLAP_S: u64 = 24 * 60 * 60;
const _: () = assert!(DEFAULT_ROTATION_OVERLAP_S <= MAX_ROTATION_OVERLAP_S);

/// One secret of a definition: the current one has no end; a rotated-out one signs until its end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSecret {
    /// `whsec_…`.
    pub secret: String,
    /// When it stops signing (`None`: the current secret).
    pub expires_at: Option<DateTime<Utc>>,
}

/// An endpoint as the API defines it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Definition {
    /// Where deliveries go.
    pub url: String,
    /// The friendly event types it receives.
    pub events: Vec<String>,
    /// The tenants whose operations it receives (`None`: every tenant).
    pub tenants: Option<Vec<String>>,
    /// Whether private and link-local addresses are allowed.
    #[serde(default)]
    pub allow_private_network: bool,
    /// How long one event is retried before the endpoint is disabled, in seconds.
    pub retry_window_s: u64,
    /// The longest one attempt may take, in milliseconds.
    pub request_timeout_ms: u64,
    /// The current secret last; rotated-out ones before it, each with its end.
    pub secrets: Vec<StoredSecret>,
    /// The tenant whose own token defined it (`None`: an operator did). Such an endpoint receives
    /// that tenant's events only, and no other tenant's token sees or changes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_by: Option<String>,
}

impl Definition {
    /// Reads a definition the journal holds.
    pub fn parse(text: &str) -> Result<Self, String> {
        serde_json::from_str(text)
            .map_err(|error| format!("the stored definition is unreadable: {error}"))
    }

    /// The text the journal keeps.
    pub fn text(&self) -> String {
        serde_json::to_string(self).expect("a definition is plain data")
    }

    /// The endpoint `id` this definition makes at `now`: signed with every secret still within
    /// its window.
    pub fn endpoint(&self, id: &str, now: DateTime<Utc>) -> Result<Endpoint, String> {
        let url = check_url(&self.url, self.allow_private_network)?;
        // A tenant's own endpoint receives that tenant's events and nothing else, however its
        // definition was written.
        if let Some(tenant) = &self.managed_by {
            if self.tenants.as_deref() != Some(std::slice::from_ref(tenant)) {
                return Err(format!(
                    "is managed by tenant `{tenant}`, so it receives that tenant's events only: its tenants must be [\"{tenant}\"]"
                ));
            }
            if self.allow_private_network {
                return Err(format!(
                    "is managed by tenant `{tenant}`, whose endpoints may not reach private addresses (allow_private_network is an operator's to set)"
                ));
            }
        }
        let secrets = self
            .secrets
            .iter()
            .filter(|stored| stored.expires_at.is_none_or(|end| end > now))
            .map(|stored| Secret::parse(&stored.secret))
            .collect::<Result<Vec<_>, _>>()?;
        if secrets.is_empty() || secrets.len() > MAX_SECRETS_PER_ENDPOINT {
            return Err(format!(
                "holds {} secrets in use; an endpoint signs with 1 to {MAX_SECRETS_PER_ENDPOINT}",
                secrets.len()
            ));
        }
        Ok(Endpoint {
            id: id.to_owned(),
            url,
            secrets,
            events: self.events.iter().cloned().collect::<BTreeSet<_>>(),
            tenants: self
                .tenants
                .as_ref()
                .map(|tenants| tenants.iter().cloned().collect()),
            allow_private_network: self.allow_private_network,
            retry_window_s: self.retry_window_s,
            request_timeout_ms: self.request_timeout_ms,
        })
    }

    /// When the endpoint next changes by itself (a rotated-out secret stops signing), if ever.
    pub fn next_change(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.secrets
            .iter()
            .filter_map(|stored| stored.expires_at)
            .filter(|end| *end > now)
            .min()
    }

    /// Makes `secret` the current one; the one it replaces signs until `overlap_ends`, and
    /// secrets whose window has ended are dropped. Refused when more than
    /// [`MAX_SECRETS_PER_ENDPOINT`] would sign at once.
    pub fn rotate(
        &mut self,
        secret: String,
        overlap_ends: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), String> {
        Secret::parse(&secret)?;
        let mut kept: Vec<StoredSecret> = self
            .secrets
            .drain(..)
            .filter(|stored| stored.expires_at.is_none_or(|end| end > now))
            .map(|mut stored| {
                if stored.expires_at.is_none() {
                    stored.expires_at = Some(overlap_ends);
                }
                stored
            })
            .filter(|stored| stored.expires_at.is_some_and(|end| end > now))
            .collect();
        if kept.len() + 1 > MAX_SECRETS_PER_ENDPOINT {
            self.secrets = kept;
            return Err(format!(
                "{} secrets would sign at once; at most {MAX_SECRETS_PER_ENDPOINT}: wait for an older rotation's window to end, or rotate with overlap_s = 0",
                self.secrets.len() + 1
            ));
        }
        kept.push(StoredSecret {
            secret,
            expires_at: None,
        });
        self.secrets = kept;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const NEW: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

    fn definition() -> Definition {
        Definition {
            url: "https://billing.example.com/hooks".into(),
            events: vec!["succeeded".into()],
            tenants: None,
            allow_private_network: false,
            retry_window_s: 60,
            request_timeout_ms: 5_000,
            secrets: vec![StoredSecret {
                secret: OLD.into(),
                expires_at: None,
            }],
            managed_by: None,
        }
    }

    #[test]
    fn a_rotated_out_secret_signs_until_its_window_ends_and_then_drops_out() {
        let now = Utc::now();
        let ends = now + chrono::Duration::hours(1);
        let mut rotated = definition();
        rotated.rotate(NEW.into(), ends, now).expect("rotates");
        assert_eq!(
            rotated
                .endpoint("billing", now)
                .expect("valid")
                .secrets
                .len(),
            2
        );
        assert_eq!(rotated.next_change(now), Some(ends));
        let after = ends + chrono::Duration::seconds(1);
        assert_eq!(
            rotated
                .endpoint("billing", after)
                .expect("valid")
                .secrets
                .len(),
            1
        );
        assert_eq!(rotated.next_change(after), None);
        // Rotating again with no overlap drops the secret it replaces at once; the first
        // rotation's old secret keeps its own window.
        let third = "whsec_dGhpcmQgc2VjcmV0IG9mIHR3ZW50eS1mb3VyIGJ5dGVz";
        rotated.rotate(third.into(), now, now).expect("rotates");
        let kept: Vec<_> = rotated
            .secrets
            .iter()
            .map(|stored| stored.secret.as_str())
            .collect();
        assert_eq!(kept, [OLD, third]);
    }

    #[test]
    fn a_tenants_endpoint_receives_only_its_tenant_whatever_its_stored_text_says() {
        let mut own = definition();
        own.managed_by = Some("acme".into());
        own.tenants = Some(vec!["acme".into()]);
        assert!(own.endpoint("billing", Utc::now()).is_ok());
        for tenants in [None, Some(vec!["acme".into(), "globex".into()])] {
            let mut widened = own.clone();
            widened.tenants = tenants;
            let refused = Definition::parse(&widened.text())
                .expect("readable")
                .endpoint("billing", Utc::now())
                .expect_err("refused");
            assert!(refused.contains("managed by tenant `acme`"), "{refused}");
        }
        let mut private = own.clone();
        private.allow_private_network = true;
        assert!(private.endpoint("billing", Utc::now()).is_err());
        // An operator's definition reads back as before, without the field.
        assert!(!definition().text().contains("managed_by"));
    }

    #[test]
    fn a_stored_definition_is_held_to_the_address_rules_again_when_read() {
        let mut private = definition();
        private.url = "https://169.254.169.254/latest".into();
        let refused = Definition::parse(&private.text())
            .expect("readable")
            .endpoint("billing", Utc::now())
            .expect_err("refused");
        assert!(refused.contains("allow_private_network"), "{refused}");
    }
}
