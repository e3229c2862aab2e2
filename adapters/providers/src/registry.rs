//! The registry: every built connector behind the domain's [`Providers`] port, routed by the
//! request's provider id.
//!
//! A request for a provider that is not registered is answered without touching the network:
//! `NotSent` for a send, `Unavailable` for a lookup. The registry never guesses another provider
//! or account.

use std::collections::BTreeMap;

use opledger_domain::ids::{ActionName, ProviderId};
use opledger_domain::provider::{
    ArgProblem, Binding, BindingQuery, LookupOutcome, LookupRequest, Providers, SendOutcome,
    SendRequest, Unbound,
};
use serde_json::Value;

use crate::connector::Connector;
use crate::error::ConnectorError;

/// Every registered connector, by provider id.
#[derive(Debug, Default)]
pub struct HttpProviders {
    connectors: BTreeMap<ProviderId, Connector>,
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
        if self.connectors.contains_key(connector.id()) {
            return Err(ConnectorError {
                file: connector.document_name().to_owned(),
                line: None,
                field: "id".to_owned(),
                message: format!(
                    "provider `{}` is registered twice; give each connector its own id",
                    connector.id()
                ),
            });
        }
        self.connectors.insert(connector.id().clone(), connector);
        Ok(())
    }

    /// The connector registered under `id`.
    pub fn get(&self, id: &ProviderId) -> Option<&Connector> {
        self.connectors.get(id)
    }

    /// The registered provider ids, in order.
    pub fn ids(&self) -> impl Iterator<Item = &ProviderId> {
        self.connectors.keys()
    }

    /// Every registered connector, by provider id.
    pub fn connectors(&self) -> impl Iterator<Item = &Connector> {
        self.connectors.values()
    }
}

fn not_registered(provider: &ProviderId) -> String {
    format!("provider `{provider}` is not configured")
}

impl Providers for HttpProviders {
    fn bind(&self, query: &BindingQuery<'_>) -> Result<Binding, Unbound> {
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
        match self.get(provider) {
            Some(connector) if connector.action(action).is_some() => {
                connector.check_args(action, args)
            }
            _ => Ok(()),
        }
    }

    fn action_description(&self, provider: &ProviderId, action: &ActionName) -> Option<String> {
        self.get(provider)?
            .action(action)
            .map(|action| action.description.clone())
    }

    async fn execute(&self, request: &SendRequest) -> SendOutcome {
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

    async fn lookup(&self, request: &LookupRequest) -> LookupOutcome {
        match self.get(&request.provider) {
            Some(connector) => connector.lookup(request).await,
            None => LookupOutcome::Unavailable {
                reason: not_registered(&request.provider),
                retry_after_ms: None,
            },
        }
    }

    fn longest_send_ms(&self) -> u64 {
        self.connectors
            .values()
            .map(Connector::longest_send_ms)
            .max()
            .unwrap_or(0)
    }
}
