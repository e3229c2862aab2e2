//! An event store in process memory, for unit tests and simulation.
//!
//! It keeps the whole log in one vector behind one mutex, so every append is trivially
//! serialised and positions are the log index plus one. It implements the port exactly as the
//! durable stores do (same rules, same subscription), which is what makes it a fair stand-in in
//! tests. It must never be used where the ledger has to survive a restart: nothing is written to
//! disk, and "durable" here means "in this process's memory".

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use opledger_domain::ids::{EventId, GlobalPosition, StreamVersion};
use opledger_domain::merkle::tenants::{tenant_of_first_event, TenantTrees};
use opledger_domain::merkle::{self, Hash, HashReader, LogTree, MemoryTree, TenantHeads};
use opledger_domain::store::{
    AppendOutcome, EventData, EventStore, ExpectedVersion, LogStart, RecordedEvent, StoreError,
    StreamName, Subscription, MAX_READ_BATCH,
};
use tokio::sync::watch;

use super::rules::{self, AppendPlan};
use super::subscription::{CatchUp, LogSource};

/// Most events one memory store holds; a simulation that runs away hits this instead of
/// exhausting the machine's memory.
pub const MAX_MEMORY_EVENTS: usize = 1_000_000;

/// An in-memory event store. Cloning gives another handle to the same store.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    log: Mutex<Log>,
    /// The newest position, published while the log lock is held so subscribers see heads in
    /// commit order.
    head: watch::Sender<Option<GlobalPosition>>,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            log: Mutex::default(),
            head: watch::Sender::new(None),
        }
    }
}

#[derive(Debug, Default)]
struct Log {
    /// Every event; the event at index `i` has position `i + 1`.
    events: Vec<RecordedEvent>,
    /// For each stream, the log index of each of its events; the index in this vector is the
    /// event's stream version.
    streams: HashMap<StreamName, Vec<usize>>,
    /// The log index of every event id, so a reused id is refused.
    by_event_id: HashMap<EventId, usize>,
    /// The transparency log's tree over `events`, grown in the same append (leaf `i` is the
    /// event at index `i`).
    tree: MemoryTree,
    /// The tenants' trees, grown with `tree`, and each operation stream's tenant.
    tenants: TenantTrees,
    stream_tenants: HashMap<StreamName, Option<String>>,
    /// Checkpoints kept, by tree size.
    checkpoints: BTreeMap<u64, String>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        self.shared.lock()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Log> {
        // A panic while the lock was held happened between checks and pushes of one append;
        // every push leaves the log consistent on its own, so the data is still usable.
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn read_events(&self, start: LogStart, max_count: usize) -> Vec<RecordedEvent> {
        let log = self.lock();
        let from = match start {
            LogStart::Beginning => 0,
            // Position p is at index p - 1, so the first event after p is at index p.
            LogStart::After(position) => usize::try_from(position.value()).unwrap_or(usize::MAX),
        };
        let from = from.min(log.events.len());
        let to = from
            .saturating_add(max_count.min(MAX_READ_BATCH))
            .min(log.events.len());
        log.events[from..to].to_vec()
    }
}

impl Log {
    fn last_version(&self, stream: &StreamName) -> Option<StreamVersion> {
        let count = self.streams.get(stream).map_or(0, Vec::len);
        count
            .checked_sub(1)
            .map(|last| StreamVersion::new(last as u64))
    }

    /// The log indices of `stream`'s events from version `from` on, at most `max_count`.
    fn stream_indices(
        &self,
        stream: &StreamName,
        from: StreamVersion,
        max_count: usize,
    ) -> &[usize] {
        let Some(indices) = self.streams.get(stream) else {
            return &[];
        };
        let from = usize::try_from(from.value())
            .unwrap_or(usize::MAX)
            .min(indices.len());
        let to = from.saturating_add(max_count).min(indices.len());
        &indices[from..to]
    }

    fn append(
        &mut self,
        stream: &StreamName,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> Result<AppendOutcome, StoreError> {
        let last = self.last_version(stream);
        let first = match rules::plan_append(expected, last) {
            AppendPlan::Write { first } => first,
            AppendPlan::CheckStored { first } => {
                let stored = self.stream_indices(stream, first, events.len());
                let ids: Vec<EventId> = stored
                    .iter()
                    .map(|index| self.events[*index].event_id)
                    .collect();
                return match stored.last() {
                    Some(index) if rules::is_same_append(&ids, &events) => {
                        Ok(self.outcome_of(*index))
                    }
                    _ => Err(rules::version_conflict(stream, expected, last)),
                };
            }
            AppendPlan::Conflict => return Err(rules::version_conflict(stream, expected, last)),
        };
        // Check everything before pushing anything, so a refused append leaves no trace.
        for event in &events {
            if let Some(index) = self.by_event_id.get(&event.event_id) {
                let stored = &self.events[*index];
                return Err(rules::event_id_reused(
                    stream,
                    event.event_id,
                    &stored.stream,
                    stored.version,
                ));
            }
        }
        if self.events.len() + events.len() > MAX_MEMORY_EVENTS {
            return Err(StoreError::Unavailable {
                reason: format!("the memory store holds its limit of {MAX_MEMORY_EVENTS} events"),
            });
        }
        let indices = self.streams.entry(stream.clone()).or_default();
        debug_assert_eq!(
            indices.len() as u64,
            first.value(),
            "a stream's versions are contiguous from 0"
        );
        let mut version = first;
        for event in events {
            let index = self.events.len();
            self.events.push(RecordedEvent {
                stream: stream.clone(),
                version,
                position: GlobalPosition::new(index as u64 + 1),
                event_id: event.event_id,
                event_type: event.event_type,
                data: event.data,
                metadata: event.metadata,
            });
            let leaf = merkle::leaf_hash(&self.events[index].view());
            self.tree.push(leaf);
            let added = &self.events[index];
            let tenant = self
                .stream_tenants
                .entry(stream.clone())
                .or_insert_with(|| tenant_of_first_event(&added.event_type, &added.data));
            if let Some(tenant) = tenant {
                self.tenants.push(tenant, index as u64 + 1, leaf);
            }
            self.by_event_id.insert(event.event_id, index);
            indices.push(index);
            version = version.next();
        }
        Ok(self.outcome_of(self.events.len() - 1))
    }

    fn outcome_of(&self, index: usize) -> AppendOutcome {
        let event = &self.events[index];
        AppendOutcome {
            next_expected: event.version,
            position: event.position,
        }
    }
}

impl LogTree for MemoryStore {
    async fn tree_size(&self) -> Result<u64, StoreError> {
        Ok(self.lock().tree.size())
    }

    async fn stored_hashes(&self, indexes: Vec<u64>) -> Result<Vec<Hash>, StoreError> {
        self.lock()
            .tree
            .read_hashes(&indexes)
            .map_err(|error| StoreError::Corrupt {
                reason: format!("the memory tree lacks a stored hash: {error}"),
            })
    }

    async fn keep_checkpoint(&self, size: u64, note: String) -> Result<(), StoreError> {
        self.lock().checkpoints.entry(size).or_insert(note);
        Ok(())
    }

    async fn kept_checkpoint(
        &self,
        size: Option<u64>,
    ) -> Result<Option<(u64, String)>, StoreError> {
        let log = self.lock();
        let found = match size {
            Some(size) => log.checkpoints.get_key_value(&size),
            None => log.checkpoints.last_key_value(),
        };
        Ok(found.map(|(size, note)| (*size, note.clone())))
    }

    async fn tenant_heads(&self) -> Result<Option<TenantHeads>, StoreError> {
        let log = self.lock();
        Ok(Some(TenantHeads {
            log_size: log.tree.size(),
            map: log.tenants.map(),
        }))
    }
}

impl EventStore for MemoryStore {
    type Subscription = MemorySubscription;

    async fn append(
        &self,
        stream: &StreamName,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> Result<AppendOutcome, StoreError> {
        rules::check_append(stream, &events)?;
        let mut log = self.lock();
        let outcome = log.append(stream, expected, events)?;
        // Publish under the lock, so heads are published in the order positions were assigned.
        self.shared.head.send_if_modified(|head| {
            let newer = *head < Some(outcome.position);
            if newer {
                *head = Some(outcome.position);
            }
            newer
        });
        Ok(outcome)
    }

    async fn read_stream(
        &self,
        stream: &StreamName,
        from: StreamVersion,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let log = self.lock();
        let indices = log.stream_indices(stream, from, max_count.min(MAX_READ_BATCH));
        Ok(indices
            .iter()
            .map(|index| log.events[*index].clone())
            .collect())
    }

    async fn read_all(
        &self,
        start: LogStart,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        Ok(self.shared.read_events(start, max_count))
    }

    async fn head_position(&self) -> Result<Option<GlobalPosition>, StoreError> {
        Ok(*self.shared.head.borrow())
    }

    async fn subscribe_all(&self, start: LogStart) -> Result<MemorySubscription, StoreError> {
        let head = self.shared.head.subscribe();
        Ok(MemorySubscription {
            inner: CatchUp::new(SharedLog(Arc::clone(&self.shared)), start, head),
        })
    }
}

/// A catch-up subscription to a [`MemoryStore`]'s log. It keeps the store alive while it lives.
pub struct MemorySubscription {
    inner: CatchUp<SharedLog>,
}

impl std::fmt::Debug for MemorySubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemorySubscription").finish_non_exhaustive()
    }
}

impl Subscription for MemorySubscription {
    async fn next(&mut self) -> Result<RecordedEvent, StoreError> {
        self.inner.next().await
    }
}

/// The store's log as a subscription reads it (a type of this crate, for the shared trait).
struct SharedLog(Arc<Shared>);

impl LogSource for SharedLog {
    async fn read_log(
        &self,
        start: LogStart,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        Ok(self.0.read_events(start, max_count))
    }
}
