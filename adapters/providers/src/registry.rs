//! The registry: every configured HTTP provider behind the domain's [`Providers`] port, routed by
//! the request's provider id.
//!
//! A request for a provider that is not configured is answered without touching the network:
//! `NotSent` for a send, `Unavailable` for a lookup. The registry never guesses another provider
//! or account.

use std::collections::BTreeMap;

use opledger_domain::contract::ProviderCapabilities;
use opledger_domain::ids::{AccountId, ActionName, CredentialFingerprint, ProviderId};
use opledger_domain::provider::{
    ArgProblem, Binding, BindingQuery, LookupOutcome, LookupRequest, Providers, SendOutcome,
    SendRequest, Unbound,
};

use super::config::{HttpProviderConfig, ProviderConfigError};
use super::HttpProvider;

/// Every configured HTTP provider, by id.
#[derive(Debug, Default)]
pub struct HttpProviders {
    providers: BTreeMap<ProviderId, HttpProvider>,
}

impl HttpProviders {
    /// A registry of already built providers; two with the same id are an error.
    pub fn new(
        providers: impl IntoIterator<Item = HttpProvider>,
    ) -> Result<Self, ProviderConfigError> {
        let mut registry = Self::default();
        for provider in providers {
            registry.insert(provider)?;
        }
        Ok(registry)
    }

    /// Builds every provider from its configuration (tokens from the environment) and registers it.
    pub fn from_configs(
        configs: impl IntoIterator<Item = (ProviderId, HttpProviderConfig)>,
    ) -> Result<Self, ProviderConfigError> {
        let mut registry = Self::default();
        for (id, config) in configs {
            registry.insert(HttpProvider::new(id, &config)?)?;
        }
        Ok(registry)
    }

    /// Adds one provider; its id must be new.
    pub fn insert(&mut self, provider: HttpProvider) -> Result<(), ProviderConfigError> {
        if self.providers.contains_key(provider.id()) {
            return Err(ProviderConfigError::DuplicateProvider {
                provider: provider.id().clone(),
            });
        }
        self.providers.insert(provider.id().clone(), provider);
        Ok(())
    }

    /// The provider configured under `id`.
    pub fn get(&self, id: &ProviderId) -> Option<&HttpProvider> {
        self.providers.get(id)
    }

    /// What `provider` promises; `None` when it is not configured.
    pub fn capabilities(&self, provider: &ProviderId) -> Option<ProviderCapabilities> {
        self.get(provider).map(HttpProvider::capabilities)
    }

    /// The fingerprint of `account`'s credentials at `provider`; `None` when not configured.
    pub fn credential_fingerprint(
        &self,
        provider: &ProviderId,
        account: &AccountId,
    ) -> Option<CredentialFingerprint> {
        self.get(provider)?.credential_fingerprint(account)
    }

    /// The configured provider ids, in order.
    pub fn ids(&self) -> impl Iterator<Item = &ProviderId> {
        self.providers.keys()
    }
}

fn not_configured(provider: &ProviderId) -> String {
    format!("provider `{provider}` is not configured")
}

impl Providers for HttpProviders {
    fn longest_send_ms(&self) -> u64 {
        self.providers
            .values()
            .map(HttpProvider::longest_send_ms)
            .max()
            .unwrap_or(0)
    }

    // The shapes have one action and global accounts until the connector engine replaces them:
    // every tenant may use every account here.
    fn bind(&self, query: &BindingQuery<'_>) -> Result<Binding, Unbound> {
        let provider = self.get(query.provider).ok_or_else(|| Unbound::Provider {
            provider: query.provider.clone(),
        })?;
        if query.action.as_str() != crate::CREATE_TASK_ACTION {
            return Err(Unbound::Action {
                provider: query.provider.clone(),
                action: query.action.clone(),
                known: vec![crate::CREATE_TASK_ACTION.to_owned()],
            });
        }
        let credential_fingerprint =
            provider
                .credential_fingerprint(query.account)
                .ok_or_else(|| Unbound::Account {
                    provider: query.provider.clone(),
                    account: query.account.clone(),
                })?;
        Ok(Binding {
            capabilities: provider.capabilities(),
            credential_fingerprint,
        })
    }

    fn check_args(
        &self,
        _provider: &ProviderId,
        _action: &ActionName,
        _args: &serde_json::Value,
    ) -> Result<(), Vec<ArgProblem>> {
        Ok(())
    }

    fn action_description(&self, provider: &ProviderId, action: &ActionName) -> Option<String> {
        (self.get(provider).is_some() && action.as_str() == crate::CREATE_TASK_ACTION)
            .then(|| "create a task".to_owned())
    }

    async fn execute(&self, request: &SendRequest) -> SendOutcome {
        match self.get(&request.provider) {
            Some(provider) => provider.execute(request).await,
            None => {
                tracing::warn!(
                    operation_id = %request.operation_id,
                    attempt_id = %request.attempt_id,
                    provider = %request.provider,
                    "send for a provider that is not configured"
                );
                SendOutcome::NotSent {
                    reason: not_configured(&request.provider),
                    retry_after_ms: None,
                }
            }
        }
    }

    async fn lookup(&self, request: &LookupRequest) -> LookupOutcome {
        match self.get(&request.provider) {
            Some(provider) => provider.lookup(request).await,
            None => LookupOutcome::Unavailable {
                reason: not_configured(&request.provider),
                retry_after_ms: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AccountConfig, Shape};
    use crate::test_support::{lookup_request, send_request};
    use opledger_domain::contract::{Deduplication, LookupSupport};

    fn id(name: &str) -> ProviderId {
        ProviderId::new(name).expect("valid")
    }

    fn registry() -> HttpProviders {
        let account = AccountId::new("acct-1").expect("valid");
        let configs = [
            ("crm-keyed", Shape::Keyed),
            ("crm-labelled", Shape::Labelled),
            ("crm-plain", Shape::Plain),
        ]
        .map(|(name, shape)| {
            (
                id(name),
                HttpProviderConfig::new(
                    shape,
                    "http://127.0.0.1:9",
                    vec![AccountConfig::with_token(account.clone(), "token-acct-1")],
                ),
            )
        });
        HttpProviders::from_configs(configs).expect("valid configs")
    }

    #[test]
    fn the_longest_send_is_twice_the_longest_request_timeout_and_zero_when_empty() {
        // Default request timeout: 10 s — a slot wait plus the request itself.
        assert_eq!(registry().longest_send_ms(), 20_000);
        assert_eq!(HttpProviders::default().longest_send_ms(), 0);
    }

    #[test]
    fn capabilities_are_routed_by_provider() {
        let registry = registry();
        assert!(matches!(
            registry.capabilities(&id("crm-keyed")),
            Some(ProviderCapabilities {
                deduplication: Deduplication::IdempotencyKey { .. },
                lookup: LookupSupport::Consistent
            })
        ));
        assert!(matches!(
            registry.capabilities(&id("crm-labelled")),
            Some(ProviderCapabilities {
                deduplication: Deduplication::UniqueLabel,
                ..
            })
        ));
        assert!(matches!(
            registry.capabilities(&id("crm-plain")),
            Some(ProviderCapabilities {
                deduplication: Deduplication::None,
                lookup: LookupSupport::EventuallyConsistent { .. }
            })
        ));
        assert_eq!(registry.capabilities(&id("crm-other")), None);
        assert_eq!(registry.ids().count(), 3);
    }

    #[test]
    fn fingerprints_exist_only_for_configured_accounts() {
        let registry = registry();
        let acct_1 = AccountId::new("acct-1").expect("valid");
        assert!(registry
            .credential_fingerprint(&id("crm-plain"), &acct_1)
            .is_some());
        assert_eq!(
            registry.credential_fingerprint(
                &id("crm-plain"),
                &AccountId::new("acct-2").expect("valid")
            ),
            None
        );
        assert_eq!(
            registry.credential_fingerprint(&id("crm-other"), &acct_1),
            None
        );
    }

    #[test]
    fn a_provider_id_may_be_registered_once() {
        let registry = registry();
        let mut providers: Vec<HttpProvider> = registry.providers.into_values().collect();
        let again = HttpProvider::new(
            id("crm-plain"),
            &HttpProviderConfig::new(
                Shape::Plain,
                "http://127.0.0.1:9",
                vec![AccountConfig::with_token(
                    AccountId::new("acct-1").expect("valid"),
                    "t",
                )],
            ),
        )
        .expect("valid");
        providers.push(again);
        assert_eq!(
            HttpProviders::new(providers).expect_err("duplicate"),
            ProviderConfigError::DuplicateProvider {
                provider: id("crm-plain")
            }
        );
    }

    #[tokio::test]
    async fn an_unknown_provider_is_not_sent_and_not_looked_up() {
        let registry = registry();
        // The test requests name provider `crm`, which this registry does not hold.
        assert_eq!(
            registry.execute(&send_request("acct-1")).await,
            SendOutcome::NotSent {
                reason: "provider `crm` is not configured".to_owned(),
                retry_after_ms: None
            }
        );
        assert_eq!(
            registry.lookup(&lookup_request("acct-1")).await,
            LookupOutcome::Unavailable {
                reason: "provider `crm` is not configured".to_owned(),
                retry_after_ms: None
            }
        );
    }
}
