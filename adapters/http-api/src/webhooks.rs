//! The server's side of outcome webhooks: what an event says to a subscriber (rendered here, where
//! the API renders the agent's sentence, so the two cannot drift apart), and where the delivery
//! journal lives.
//!
//! The payload names the operation, its tenant, provider, account and action, its state and
//! external id after the event, the event's global position, stream version and types, and the
//! agent's sentence. It never carries the operation's arguments (they may hold personal data or
//! secrets a subscriber has no need for) or any credential.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use opledger_domain::provider::Providers as _;
use opledger_domain::sentence::described_sentence;
use opledger_domain::store::RecordedEvent;
use opledger_webhooks::{Message, Render};
use serde_json::json;

use crate::config::StoreUrl;
use crate::render::{outcome_of, state_through};
use crate::{ServeEngine, ServeStore};

/// Renders events of the log as webhook messages.
pub struct OutcomeRender {
    pub store: ServeStore,
    pub engine: Arc<ServeEngine>,
}

impl Render for OutcomeRender {
    async fn render(&self, event: &RecordedEvent) -> Result<Option<Message>, String> {
        let Some(outcome) = outcome_of(&self.store, event)
            .await
            .map_err(|error| error.to_string())?
        else {
            return Ok(None);
        };
        let state = state_through(&self.store, event)
            .await
            .map_err(|error| error.to_string())?;
        // Every operation stream starts with its intent; a stream without one is not an
        // operation a subscriber could be told about.
        let Some(intent) = state.intent.as_ref() else {
            return Ok(None);
        };
        let description = self
            .engine
            .providers()
            .action_description(&intent.provider, &intent.action);
        Ok(Some(Message {
            kind: outcome.kind,
            tenant: intent.tenant.to_string(),
            at: outcome.event.at(),
            data: json!({
                "operation_id": outcome.operation_id,
                "tenant": intent.tenant,
                "provider": intent.provider,
                "account": intent.account,
                "action": intent.action,
                "state": state.status.name(),
                "external_id": state.external_id(),
                "position": event.position,
                "version": event.version,
                "type": outcome.kind,
                "event_type": event.event_type,
                "sentence": described_sentence(&state, description.as_deref()),
            }),
        }))
    }
}

/// The delivery journal's file: beside the SQLite ledger (`ledger.db.webhooks`), or with
/// KurrentDB or PostgreSQL beside the instance's own read models (`opledger.views` → `opledger.webhooks`):
/// each instance keeps its own, like its read models.
pub fn journal_path(store: &StoreUrl, read_models: &Path) -> PathBuf {
    match store {
        StoreUrl::Sqlite(path) => {
            let mut journal = path.clone().into_os_string();
            journal.push(".webhooks");
            PathBuf::from(journal)
        }
        StoreUrl::KurrentDb(_) | StoreUrl::Postgres(_) => read_models.with_extension("webhooks"),
    }
}
