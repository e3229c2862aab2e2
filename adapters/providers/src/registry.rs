//! The registry: every built connector behind the domain's [`Providers`] port, routed by the
//! request's provider id.
//!
//! A request for a provider that is not registered is answered without touching the network:
//! `NotSent` for a send, `Unavailable` for a lookup. The registry never guesses another provider
//! or account.

use std::collections::BTreeMap;

use opledger_domain::ids::{ActionName, ProviderId};
use opledger_domain::provider::{
    ArgProblem, Binding, BindingQuery, LookupOutcome, LookupRequest, Providers, Readiness,
    RequestKind, SendOutcome, SendRequest, Unbound,
};
use serde_json::Value;

use crate::connector::Connector;
use crate::error::ConnectorError;
use crate::mcp::McpConnector;

/// Every registered connector, by provider id: REST connectors and upstream MCP servers
/// ([`McpConnector`]) side by side, one provider id each, answered through the same port.
#[derive(Debug, Default)]
pub struct HttpProviders {
    connectors: BTreeMap<ProviderId, Connector>,
    upstreams: BTreeMap<ProviderId, McpConnector>,
}

impl HttpProviders {
    /// A registry of built connectors; two with the same provider id are an error.
    pub fn new(connectors: impl IntoIterator<Item = Connector>) -> Result<Self, ConnectorError> {
        let mut registry = Self::default();
        for connector in connectors {
            registry.insert(connector)?;
        }
        Ok(registry)
    }

    /// Adds one connector; its provider id must be new.
    pub fn insert(&mut self, connector: Connector) -> Result<(), ConnectorError> {
        self.check_new(connector.id(), connector.document_name())?;
        self.connectors.insert(connector.id().clone(), connector);
        Ok(())
    }

    /// Adds one upstream MCP server; its provider id must be new.
    pub fn insert_mcp(&mut self, connector: McpConnector) -> Result<(), ConnectorError> {
        self.check_new(connector.id(), connector.document_name())?;
        self.upstreams.insert(connector.id().clone(), connector);
        Ok(())
    }

    fn check_new(&self, id: &ProviderId, document: &str) -> Result<(), ConnectorError> {
        if self.connectors.contains_key(id) || self.upstreams.contains_key(id) {
            return Err(ConnectorError {
                file: document.to_owned(),
                line: None,
                field: "id".to_owned(),
                message: format!(
                    "provider `{id}` is registered twice; give each connector its own id"
                ),
            });
        }
        Ok(())
    }

    /// The upstream MCP server registered under `id`.
    pub fn mcp(&self, id: &ProviderId) -> Option<&McpConnector> {
        self.upstreams.get(id)
    }

    /// Every registered upstream MCP server, by provider id.
    pub fn mcp_connectors(&self) -> impl Iterator<Item = &McpConnector> {
        self.upstreams.values()
    }

    /// The connector registered under `id`.
    pub fn get(&self, id: &ProviderId) -> Option<&Connector> {
        self.connectors.get(id)
    }

    /// The registered provider ids (REST connectors, then upstream MCP servers), each in order.
    pub fn ids(&self) -> impl Iterator<Item = &ProviderId> {
        self.connectors.keys().chain(self.upstreams.keys())
    }

    /// The declared data subject pointer and personal fields of `provider`'s `action` (see
    /// [`crate::document::Action::subject`]); `None` when either is not a REST connector's.
    pub fn personal_fields(
        &self,
        provider: &ProviderId,
        action: &opledger_domain::ids::ActionName,
    ) -> Option<(Option<String>, Vec<String>)> {
        let action = self.connectors.get(provider)?.action(action)?;
        Some((action.subject.clone(), action.personal.clone()))
    }

    /// Every registered REST connector, by provider id.
    pub fn connectors(&self) -> impl Iterator<Item = &Connector> {
        self.connectors.values()
    }
}

fn not_registered(provider: &ProviderId) -> String {
    format!("provider `{provider}` is not configured")
}

impl Providers for HttpProviders {
    fn bind(&self, query: &BindingQuery<'_>) -> Result<Binding, Unbound> {
        if let Some(upstream) = self.mcp(query.provider) {
            return upstream.bind(query.tenant, query.account, query.action);
        }
        let connector = self.get(query.provider).ok_or_else(|| Unbound::Provider {
            provider: query.provider.clone(),
        })?;
        connector.bind(query.tenant, query.account, query.action)
    }

    /// An unknown provider or action passes here, as the port says: [`Providers::bind`] names it
    /// with what to do.
    fn check_args(
        &self,
        provider: &ProviderId,
        action: &ActionName,
        args: &Value,
    ) -> Result<(), Vec<ArgProblem>> {
        if let Some(upstream) = self.mcp(provider) {
            return match upstream.action(action) {
                Some(_) => upstream.check_args(action, args),
                None => Ok(()),
            };
        }
        match self.get(provider) {
            Some(connector) if connector.action(action).is_some() => {
                connector.check_args(action, args)
            }
            _ => Ok(()),
        }
    }

    fn action_description(&self, provider: &ProviderId, action: &ActionName) -> Option<String> {
        if let Some(upstream) = self.mcp(provider) {
            return upstream
                .action(action)
                .map(|action| action.description.clone());
        }
        self.get(provider)?
            .action(action)
            .map(|action| action.description.clone())
    }

    fn describe_send(&self, intent: &opledger_domain::event::IntentRecorded) -> Option<String> {
        if let Some(upstream) = self.mcp(&intent.provider) {
            // The MCP request: the tool it calls (its arguments are the frozen intent's).
            return upstream
                .action(&intent.action)
                .map(|action| format!("tools/call {}", action.tool));
        }
        self.get(&intent.provider)?.describe_send(intent)
    }

    async fn execute(&self, request: &SendRequest) -> SendOutcome {
        if let Some(upstream) = self.mcp(&request.provider) {
            return upstream.execute(request).await;
        }
        match self.get(&request.provider) {
            Some(connector) => connector.execute(request).await,
            None => {
                tracing::warn!(
                    operation_id = %request.operation_id,
                    attempt_id = %request.attempt_id,
                    provider = %request.provider,
                    "send for a provider that is not configured"
                );
                SendOutcome::NotSent {
                    reason: not_registered(&request.provider),
                    retry_after_ms: None,
                }
            }
        }
    }

    async fn prepare(
        &self,
        query: &BindingQuery<'_>,
        kind: RequestKind,
        may_wait: bool,
    ) -> Readiness {
        match self.get(query.provider) {
            Some(connector) => {
                connector
                    .prepare(query.tenant, query.account, kind, may_wait)
                    .await
            }
            // Nothing to prepare: the claim's binding check names the missing provider.
            None => Readiness::Ready { budget_wait: None },
        }
    }

    async fn lookup(&self, request: &LookupRequest) -> LookupOutcome {
        if let Some(upstream) = self.mcp(&request.provider) {
            return upstream.lookup(request).await;
        }
        match self.get(&request.provider) {
            Some(connector) => connector.lookup(request).await,
            None => LookupOutcome::Unavailable {
                reason: not_registered(&request.provider),
                retry_after_ms: None,
            },
        }
    }

    fn longest_send_ms(&self) -> u64 {
        let rest = self.connectors.values().map(Connector::longest_send_ms);
        let upstreams = self.upstreams.values().map(McpConnector::longest_send_ms);
        rest.chain(upstreams).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connector::Overrides;
    use crate::credentials::Credentials;
    use crate::document::AccountSpec;
    use crate::test_support::{lookup_request, send_request};
    use opledger_domain::contract::{Deduplication, LookupSupport};
    use opledger_domain::ids::{AccountId, TenantId};
    use serde_json::json;

    fn id(name: &str) -> ProviderId {
        ProviderId::new(name).expect("valid")
    }

    fn stand(preset: &str, provider: &str) -> Connector {
        Connector::from_preset(
            preset,
            Overrides {
                id: Some(id(provider)),
                base_url: Some("http://127.0.0.1:9".to_owned()),
                accounts: vec![AccountSpec {
                    id: AccountId::new("acct-1").expect("valid"),
                    tenants: vec![TenantId::new("acme").expect("valid")],
                    credentials: Credentials::token("token-acct-1"),
                }],
                ..Overrides::default()
            },
        )
        .expect("a valid preset")
    }

    fn registry() -> HttpProviders {
        HttpProviders::new([
            stand("crm-stand-keyed", "crm-keyed"),
            stand("crm-stand-labelled", "crm-labelled"),
            stand("crm-stand-plain", "crm-plain"),
        ])
        .expect("distinct ids")
    }

    fn bind(
        registry: &HttpProviders,
        tenant: &str,
        provider: &str,
        account: &str,
    ) -> Result<Binding, Unbound> {
        registry.bind(&BindingQuery {
            tenant: &TenantId::new(tenant).expect("valid"),
            provider: &id(provider),
            account: &AccountId::new(account).expect("valid"),
            action: &ActionName::new("create_task").expect("valid"),
        })
    }

    #[test]
    fn bindings_are_routed_by_provider_and_carry_the_actions_contract() {
        let registry = registry();
        let keyed = bind(&registry, "acme", "crm-keyed", "acct-1").expect("bound");
        assert!(matches!(
            keyed.capabilities.deduplication,
            Deduplication::IdempotencyKey { .. }
        ));
        let plain = bind(&registry, "acme", "crm-plain", "acct-1").expect("bound");
        assert!(matches!(
            plain.capabilities.lookup,
            LookupSupport::EventuallyConsistent { .. }
        ));
        assert_eq!(
            keyed.credential_fingerprint, plain.credential_fingerprint,
            "the same token"
        );
        assert!(matches!(
            bind(&registry, "acme", "crm-other", "acct-1"),
            Err(Unbound::Provider { .. })
        ));
        assert!(matches!(
            bind(&registry, "acme", "crm-plain", "acct-2"),
            Err(Unbound::Account { .. })
        ));
        assert!(matches!(
            bind(&registry, "globex", "crm-plain", "acct-1"),
            Err(Unbound::NotOwned { .. })
        ));
        assert_eq!(registry.ids().count(), 3);
    }

    #[test]
    fn arguments_and_descriptions_come_from_the_action_and_unknown_ones_pass_to_bind() {
        let registry = registry();
        let action = ActionName::new("create_task").expect("valid");
        assert_eq!(
            registry
                .action_description(&id("crm-keyed"), &action)
                .as_deref(),
            Some("create a task")
        );
        assert_eq!(registry.action_description(&id("crm-other"), &action), None);
        assert_eq!(
            registry.check_args(&id("crm-keyed"), &action, &json!({"title": "Call"})),
            Ok(())
        );
        let problems = registry
            .check_args(&id("crm-keyed"), &action, &json!({"title": 5}))
            .expect_err("a number is no title");
        assert_eq!(problems[0].pointer, "/title");
        let other = ActionName::new("delete_task").expect("valid");
        assert_eq!(
            registry.check_args(&id("crm-keyed"), &other, &json!({})),
            Ok(())
        );
        assert_eq!(
            registry.check_args(&id("crm-other"), &action, &json!({})),
            Ok(())
        );
    }

    #[test]
    fn the_longest_send_is_twice_the_longest_request_timeout_and_zero_when_empty() {
        assert_eq!(registry().longest_send_ms(), 20_000);
        assert_eq!(HttpProviders::default().longest_send_ms(), 0);
    }

    #[test]
    fn a_provider_id_may_be_registered_once() {
        let error = HttpProviders::new([
            stand("crm-stand-plain", "crm-plain"),
            stand("crm-stand-keyed", "crm-plain"),
        ])
        .expect_err("a duplicate");
        assert_eq!(error.field, "id");
        assert!(error.message.contains("crm-plain"), "{error}");
    }

    #[tokio::test]
    async fn an_unknown_provider_is_not_sent_and_not_looked_up() {
        let registry = registry();
        assert_eq!(
            registry.execute(&send_request("crm", "acct-1")).await,
            SendOutcome::NotSent {
                reason: "provider `crm` is not configured".to_owned(),
                retry_after_ms: None
            }
        );
        assert_eq!(
            registry.lookup(&lookup_request("crm", "acct-1")).await,
            LookupOutcome::Unavailable {
                reason: "provider `crm` is not configured".to_owned(),
                retry_after_ms: None
            }
        );
    }
}
