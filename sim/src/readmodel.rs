//! The read models as a running process keeps them: folded incrementally from the log after
//! their checkpoint, with the real pure folds of `opledger-projections` (every read model's
//! changes, the totals, and the work queue the workers read). A rebuild folds the same log from
//! position zero; the checker compares the two.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use opledger_domain::codec;
use opledger_domain::event::OperationEvent;
use opledger_domain::ids::{GlobalPosition, OperationId, StreamVersion};
use opledger_domain::state::{OperationState, Work};
use opledger_domain::store::{EventStore, LogStart, RecordedEvent, MAX_READ_BATCH};
use opledger_projections::read_models::{fold_in_place, EventChanges};
use opledger_projections::totals::Totals;
use opledger_projections::work_queue::WorkQueue;
use opledger_store::MemoryStore;

/// An event of the log, decoded.
#[derive(Clone, Debug)]
pub struct LogEvent {
    /// Its operation.
    pub operation_id: OperationId,
    /// Its version in the operation's stream.
    pub version: StreamVersion,
    /// Its position in the log.
    pub position: GlobalPosition,
    /// The event.
    pub event: OperationEvent,
}

/// Every read model of the run, folded up to `checkpoint`.
#[derive(Debug, Default)]
pub struct ReadModels {
    checkpoint: Option<GlobalPosition>,
    states: BTreeMap<OperationId, (OperationState, StreamVersion)>,
    totals: Totals,
    changes: Vec<(GlobalPosition, EventChanges)>,
    queue: WorkQueue,
    /// A fold that failed (an event out of order, a stream without its intent).
    errors: Vec<String>,
}

/// What two folds are compared on.
#[derive(Debug, PartialEq, Eq)]
struct Comparable<'a> {
    checkpoint: Option<GlobalPosition>,
    states: &'a BTreeMap<OperationId, (OperationState, StreamVersion)>,
    totals: &'a Totals,
    changes: &'a [(GlobalPosition, EventChanges)],
    due: Vec<(OperationId, Work)>,
    next_due_at: Option<DateTime<Utc>>,
    open: usize,
}

impl ReadModels {
    /// Folds everything in `store` (a rebuild).
    pub fn rebuild(store: &MemoryStore) -> (Self, Vec<LogEvent>) {
        let mut models = Self::default();
        let events = models.catch_up(store);
        (models, events)
    }

    /// Folds the events after the checkpoint; returns them, decoded.
    pub fn catch_up(&mut self, store: &MemoryStore) -> Vec<LogEvent> {
        let mut folded = Vec::new();
        loop {
            let start = self.checkpoint.map_or(LogStart::Beginning, LogStart::After);
            let batch = crate::block_on(store.read_all(start, MAX_READ_BATCH))
                .expect("the memory store reads");
            let full = batch.len() == MAX_READ_BATCH;
            for recorded in &batch {
                if let Some(event) = self.fold(recorded) {
                    folded.push(event);
                }
                self.checkpoint = Some(recorded.position);
            }
            if !full {
                return folded;
            }
        }
    }

    fn fold(&mut self, recorded: &RecordedEvent) -> Option<LogEvent> {
        let operation_id = recorded.stream.operation_id()?;
        let event = match codec::decode(recorded) {
            Ok(event) => event,
            Err(error) => {
                self.errors
                    .push(format!("{operation_id} v{}: {error}", recorded.version));
                return None;
            }
        };
        let (mut state, last) = self
            .states
            .remove(&operation_id)
            .map_or((OperationState::initial(), None), |(state, version)| {
                (state, Some(version))
            });
        match fold_in_place(
            operation_id,
            &mut state,
            last,
            recorded.version,
            recorded.position,
            &[],
            &event,
        ) {
            Ok(changes) => self.changes.push((recorded.position, changes)),
            Err(error) => self.errors.push(error.to_string()),
        }
        self.states.insert(operation_id, (state, recorded.version));
        self.totals.apply(&event);
        self.queue.apply(operation_id, &event);
        Some(LogEvent {
            operation_id,
            version: recorded.version,
            position: recorded.position,
            event,
        })
    }

    fn comparable(&self) -> Comparable<'_> {
        let far = crate::clock::to_time(crate::clock::SIM_EPOCH_MS + 365 * 24 * 3600 * 1000);
        Comparable {
            checkpoint: self.checkpoint,
            states: &self.states,
            totals: &self.totals,
            changes: &self.changes,
            due: self.queue.due(far, usize::MAX),
            next_due_at: self.queue.next_due_at(),
            open: self.queue.open_operations(),
        }
    }

    /// Whether these read models equal `other` in everything they hold.
    pub fn same_as(&self, other: &Self) -> bool {
        self.comparable() == other.comparable()
    }

    /// The folds that failed.
    pub fn errors(&self) -> &[String] {
        &self.errors
    }

    /// The work queue.
    pub fn queue(&self) -> &WorkQueue {
        &self.queue
    }

    /// An operation's folded state and version.
    pub fn state(&self, operation_id: OperationId) -> Option<&(OperationState, StreamVersion)> {
        self.states.get(&operation_id)
    }

    /// Every operation's folded state.
    pub fn states(&self) -> &BTreeMap<OperationId, (OperationState, StreamVersion)> {
        &self.states
    }
}
