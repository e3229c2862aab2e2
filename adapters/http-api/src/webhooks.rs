//! The server's side of outcome webhooks: what an event says to a subscriber (rendered here, where
//! the API renders the agent's sentence, so the two cannot drift apart), and where the delivery
//! journal lives: a SQLite file beside the ledger, or the shared PostgreSQL database's tables
//! (adapted to the webhooks' port below), so instances sharing a database share the journal and
//! its leases.
//!
//! The payload is the event stream's ([`crate::render::event_payload`]): the event, the operation
//! it belongs to, where it stands after it and the agent's sentence. It never carries the
//! operation's arguments (they may hold personal data or secrets a subscriber has no need for),
//! its key or any credential.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use opledger_domain::ports::IdSource as _;
use opledger_runtime::system::RandomIds;
use opledger_store::postgres::{WebhookAttemptRow, WebhookFence, WebhookJournal, WebhookLeaseAsk};
use opledger_webhooks::journal::EndpointRecord;
use opledger_webhooks::{
    Acquired, AttemptRecord, DeliveryJournal, EndpointStatus, Journal, JournalFuture, Lease,
    LeaseSettings, WebhookError,
};

use opledger_domain::ids::StreamVersion;
use opledger_domain::provider::Providers as _;
use opledger_domain::state::{evolve, OperationState};
use opledger_domain::store::{RecordedEvent, StreamName};
use opledger_webhooks::{Message, Render};

use crate::config::StoreUrl;
use crate::render::{event_payload, outcome_after, state_through, Outcome};
use crate::{ServeEngine, ServeError, ServeStore};

/// Most operations whose state [`OutcomeRender`] keeps between events; past it the cache is
/// emptied (a state is about a kilobyte, so a few megabytes at most).
pub const MAX_RENDER_STATES_CACHED: usize = 4_096;

/// One cached operation: the version last rendered and the state after it. Boxed in the map, so
/// the map's table holds a pointer per operation, not the state itself: with states inline, every
/// growth and every rehash of the table (which removing and re-inserting an entry per event
/// brings about) moved megabytes and faulted in fresh pages — measured, 10 % of a delivery's CPU
/// in `bench http --webhook` (`clear_page_erms` and `memcpy` under `reserve_rehash`).
type Cached = Box<(StreamVersion, OperationState)>;

/// Renders events of the log as webhook messages.
pub struct OutcomeRender {
    pub store: ServeStore,
    pub engine: Arc<ServeEngine>,
    /// Per operation stream, its state after the version last rendered: a delivery task reads
    /// every event of the log in order, so the state after an event is the cached one evolved by
    /// it, without reading the stream back from the store (a read and a decode of every event
    /// of the stream, once per delivery). Used only when the versions follow on exactly; any
    /// other case (a task catching up behind another, an evicted stream) reads the stream.
    pub states: std::sync::Mutex<HashMap<StreamName, Cached>>,
}

impl OutcomeRender {
    /// The state just before `event`, taken out of the cache when it holds exactly that (the
    /// initial state for a stream's first event); `None` when the stream must be read.
    fn take_before(&self, event: &RecordedEvent) -> Option<OperationState> {
        let mut states = self
            .states
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match states.remove(&event.stream).map(|cached| *cached) {
            Some((version, state)) if version.next() == event.version => Some(state),
            _ if event.version == StreamVersion::FIRST => Some(OperationState::initial()),
            _ => None,
        }
    }

    /// Caches `state`, the operation's state after `event`.
    fn remember(&self, event: &RecordedEvent, state: OperationState) {
        let cached = Box::new((event.version, state));
        let mut states = self
            .states
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if states.len() >= MAX_RENDER_STATES_CACHED {
            states.clear();
        }
        states.insert(event.stream.clone(), cached);
    }

    /// The message `event` carries for an operation in `state` (after the event).
    fn message(
        &self,
        event: &RecordedEvent,
        outcome: &Outcome,
        state: &OperationState,
    ) -> Option<Message> {
        // Every operation stream starts with its intent; a stream without one is not an
        // operation a subscriber could be told about.
        let intent = state.intent.as_ref()?;
        let description = self
            .engine
            .providers()
            .action_description(&intent.provider, &intent.action);
        // The event stream's payload, to the member: one shape for every subscriber. Sealed
        // text (a provider's refusal quoting a personal value) is opened for the subscriber, or
        // reads `[erased]`; the journal keeps no payload, and the receiver's answers to it are
        // sealed like it (`kept_answer`).
        let mut data = event_payload(event, outcome, state, description.as_deref());
        let answer_seal = opledger_domain::personal::first_token_anywhere(&data);
        opledger_domain::personal::open_anywhere(self.engine.ledger().personal_data(), &mut data);
        Some(Message {
            kind: outcome.kind,
            tenant: intent.tenant.to_string(),
            at: outcome.event.at(),
            data,
            answer_seal,
        })
    }
}

impl Render for OutcomeRender {
    /// An answer to a message that carried personal values is sealed under their key (it may
    /// echo them), cut so that the sealed text fits the journal's bound on an attempt's error (a
    /// token cut by the journal would never open again); when that key is gone already, only
    /// `[erased]` is kept.
    fn kept_answer(&self, message: &Message, answer: String) -> String {
        use opledger_domain::personal::{token_operation, ERASED};
        use opledger_webhooks::journal::MAX_ATTEMPT_ERROR_BYTES;
        let Some(token) = &message.answer_seal else {
            return answer;
        };
        let (Some(port), Some(operation)) =
            (self.engine.ledger().personal_data(), token_operation(token))
        else {
            return ERASED.to_owned();
        };
        let mut kept = answer;
        loop {
            let json = serde_json::to_string(&kept).expect("a string always serializes");
            let Some(sealed) = port.seal_like(token, operation, &json) else {
                return ERASED.to_owned();
            };
            if sealed.len() <= MAX_ATTEMPT_ERROR_BYTES || kept.is_empty() {
                return sealed;
            }
            // Base64 writes 4 characters for 3 bytes: cut what is over, a little more for the
            // JSON escapes, at a character's boundary.
            let over = (sealed.len() - MAX_ATTEMPT_ERROR_BYTES) * 3 / 4 + 8;
            let mut end = kept.len().saturating_sub(over);
            while !kept.is_char_boundary(end) {
                end -= 1;
            }
            kept.truncate(end);
        }
    }

    async fn render(
        &self,
        event: &RecordedEvent,
        kinds: &BTreeSet<String>,
    ) -> Result<Option<Message>, String> {
        // The state before the event classifies it (a success on an operation already confirmed
        // is a late answer) and, evolved by it, is what the message says: from the cache when it
        // follows on, so neither reads the stream back from the store.
        let before = self.take_before(event);
        let Some(outcome) = outcome_after(&self.store, event, before.as_ref())
            .await
            .map_err(|error| error.to_string())?
        else {
            return Ok(None);
        };
        let wanted = kinds.contains(outcome.kind);
        let state = match before {
            Some(before) => evolve(before, &outcome.event),
            // The stream is read only for the kinds the endpoint wants (one `succeeded` among
            // an operation's three or more events), not for every event.
            None if wanted => state_through(&self.store, event)
                .await
                .map_err(|error| error.to_string())?,
            None => return Ok(None),
        };
        // The message is read from the state before it goes into the cache: no copy of it.
        let message = if wanted {
            self.message(event, &outcome, &state)
        } else {
            None
        };
        self.remember(event, state);
        Ok(message)
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

/// The journal webhooks deliver from: the shared database's tables on PostgreSQL, the file at
/// [`journal_path`] beside a SQLite ledger, opened with or without configured endpoints (more
/// may be defined through the API); `None` on KurrentDB, whose instances share no journal
/// (webhooks are refused there).
pub async fn journal_for(
    store: &ServeStore,
    url: &StoreUrl,
    read_models: &Path,
) -> Result<Option<Arc<dyn DeliveryJournal>>, ServeError> {
    if matches!(url, StoreUrl::KurrentDb(_)) {
        return Ok(None);
    }
    Ok(Some(match store {
        ServeStore::Postgres(postgres) => Arc::new(PostgresJournal(postgres.webhook_journal())),
        _ => Arc::new(Journal::open(journal_path(url, read_models)).await?),
    }))
}

/// This instance's lease settings: a holder name unique among the instances on one database
/// (the process id for the operator reading it, a random suffix because two hosts can share a
/// process id).
pub fn lease_settings(lease_ms: u64) -> LeaseSettings {
    LeaseSettings {
        holder: format!(
            "serve-{}-{:08x}",
            std::process::id(),
            RandomIds.random_below(1 << 32)
        ),
        lease_ms,
    }
}

/// The PostgreSQL store's webhook tables behind the webhooks' port.
struct PostgresJournal(WebhookJournal);

fn fence(lease: &Lease) -> WebhookFence<'_> {
    WebhookFence {
        endpoint: &lease.endpoint,
        holder: &lease.holder,
        token: lease.token,
    }
}

fn journal_error(error: opledger_domain::store::StoreError) -> WebhookError {
    WebhookError::Journal {
        reason: error.to_string(),
    }
}

fn record_of(
    row: opledger_store::postgres::WebhookEndpointRow,
) -> Result<EndpointRecord, WebhookError> {
    Ok(EndpointRecord {
        checkpoint: row.checkpoint,
        status: EndpointStatus::parse(&row.status)?,
        reason: row.reason,
        epoch: row.epoch,
    })
}

fn row_of(attempt: &AttemptRecord) -> WebhookAttemptRow {
    WebhookAttemptRow {
        endpoint: attempt.endpoint.clone(),
        position: attempt.position,
        webhook_id: attempt.webhook_id.clone(),
        attempt: attempt.attempt,
        at: attempt.at.to_rfc3339(),
        status: attempt.status,
        duration_ms: attempt.duration_ms,
        error: attempt.error.as_deref().map(|error| {
            let mut error = error.to_owned();
            truncate(
                &mut error,
                opledger_webhooks::journal::MAX_ATTEMPT_ERROR_BYTES,
            );
            error
        }),
    }
}

fn truncate(text: &mut String, max_bytes: usize) {
    if text.len() > max_bytes {
        let mut end = max_bytes;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

fn attempt_of(row: WebhookAttemptRow) -> Result<AttemptRecord, WebhookError> {
    let at = chrono::DateTime::parse_from_rfc3339(&row.at)
        .map_err(|error| WebhookError::Journal {
            reason: format!("an attempt's time `{}` is not RFC 3339: {error}", row.at),
        })?
        .with_timezone(&chrono::Utc);
    Ok(AttemptRecord {
        endpoint: row.endpoint,
        position: row.position,
        webhook_id: row.webhook_id,
        attempt: row.attempt,
        at,
        status: row.status,
        duration_ms: row.duration_ms,
        error: row.error,
    })
}

impl DeliveryJournal for PostgresJournal {
    fn shared(&self) -> bool {
        true
    }

    fn definitions(&self) -> JournalFuture<'_, Vec<(String, String)>> {
        Box::pin(async move { self.0.definitions().await.map_err(journal_error) })
    }

    fn define(&self, endpoint: &str, definition: Option<String>) -> JournalFuture<'_, ()> {
        let endpoint = endpoint.to_owned();
        Box::pin(async move {
            self.0
                .define(&endpoint, definition.as_deref())
                .await
                .map_err(journal_error)
        })
    }

    fn ensure(&self, endpoint: &str, start: Option<u64>) -> JournalFuture<'_, EndpointRecord> {
        let endpoint = endpoint.to_owned();
        Box::pin(async move {
            record_of(
                self.0
                    .ensure(&endpoint, start)
                    .await
                    .map_err(journal_error)?,
            )
        })
    }

    fn record(&self, endpoint: &str) -> JournalFuture<'_, Option<EndpointRecord>> {
        let endpoint = endpoint.to_owned();
        Box::pin(async move {
            self.0
                .record(&endpoint)
                .await
                .map_err(journal_error)?
                .map(record_of)
                .transpose()
        })
    }

    fn advance(&self, lease: &Lease, epoch: u64, position: u64) -> JournalFuture<'_, bool> {
        let lease = lease.clone();
        Box::pin(async move {
            self.0
                .advance(fence(&lease), epoch, position)
                .await
                .map_err(journal_error)
        })
    }

    fn set_status(
        &self,
        endpoint: &str,
        status: EndpointStatus,
        reason: Option<String>,
        replay_after: Option<Option<u64>>,
        only: Option<(u64, &Lease)>,
    ) -> JournalFuture<'_, bool> {
        let endpoint = endpoint.to_owned();
        let only = only.map(|(epoch, lease)| (epoch, lease.clone()));
        Box::pin(async move {
            self.0
                .set_status(
                    &endpoint,
                    status.name(),
                    reason.as_deref(),
                    replay_after,
                    only.as_ref().map(|(epoch, lease)| (*epoch, fence(lease))),
                )
                .await
                .map_err(journal_error)
        })
    }

    fn record_attempt(&self, attempt: AttemptRecord) -> JournalFuture<'_, ()> {
        Box::pin(async move {
            self.0
                .record_attempt(&row_of(&attempt), None)
                .await
                .map_err(journal_error)
                .map(|_| ())
        })
    }

    fn record_deliveries(
        &self,
        attempts: Vec<AttemptRecord>,
        lease: &Lease,
        epoch: u64,
        checkpoint: u64,
    ) -> JournalFuture<'_, bool> {
        let lease = lease.clone();
        let rows: Vec<WebhookAttemptRow> = attempts.iter().map(row_of).collect();
        Box::pin(async move {
            self.0
                .record_deliveries(&rows, fence(&lease), epoch, checkpoint)
                .await
                .map_err(journal_error)
        })
    }

    fn attempts(&self, endpoint: &str, limit: u64) -> JournalFuture<'_, Vec<AttemptRecord>> {
        let endpoint = endpoint.to_owned();
        let limit = limit.min(opledger_webhooks::journal::MAX_ATTEMPTS_LISTED);
        Box::pin(async move {
            self.0
                .attempts(&endpoint, limit)
                .await
                .map_err(journal_error)?
                .into_iter()
                .map(attempt_of)
                .collect()
        })
    }

    fn acquire(&self, endpoint: &str, holder: &str, lease_ms: u64) -> JournalFuture<'_, Acquired> {
        let endpoint = endpoint.to_owned();
        let holder = holder.to_owned();
        Box::pin(async move {
            Ok(
                match self
                    .0
                    .acquire(&endpoint, &holder, lease_ms)
                    .await
                    .map_err(journal_error)?
                {
                    WebhookLeaseAsk::Granted(token) => Acquired::Held(Lease {
                        endpoint,
                        holder,
                        token,
                    }),
                    WebhookLeaseAsk::HeldBy(other) => Acquired::HeldBy(other),
                },
            )
        })
    }

    fn renew(&self, lease: &Lease, lease_ms: u64) -> JournalFuture<'_, Option<u64>> {
        let lease = lease.clone();
        Box::pin(async move {
            self.0
                .renew(fence(&lease), lease_ms)
                .await
                .map_err(journal_error)
        })
    }

    fn release(&self, lease: &Lease) -> JournalFuture<'_, ()> {
        let lease = lease.clone();
        Box::pin(async move { self.0.release(fence(&lease)).await.map_err(journal_error) })
    }
}
