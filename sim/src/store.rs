//! The sim's event store: the real in-memory store behind a door that yields at every call and
//! injects the store's faults.
//!
//! - Every call first yields once, so the scheduler may run another task (or crash this one's
//!   process) before the call takes effect.
//! - An append may fail before writing ([`FaultClass::AppendFailed`]), or end with an unknown
//!   outcome ([`FaultClass::AppendUnknown`]): written or not, decided by the seed, and the
//!   caller is told only that it cannot know.
//! - An append cut off by a crash while waiting at its yield is in the same position as an
//!   unknown one: [`SimStore::crash_process`] decides with the seed whether it landed.
//! - Every append acknowledged to a caller is remembered, so the checker can prove each one
//!   survived every crash.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use opledger_domain::ids::{EventId, GlobalPosition};
use opledger_domain::store::{
    AppendOutcome, EventData, EventStore, ExpectedVersion, LogStart, RecordedEvent, StoreError,
    StreamName,
};
use opledger_store::{MemoryStore, MemorySubscription};

use crate::clock::yield_now;
use crate::faults::{FaultClass, Faults};

/// One process's handle on the shared store.
#[derive(Clone, Debug)]
pub struct SimStore {
    inner: MemoryStore,
    shared: Arc<Mutex<StoreShared>>,
    faults: Faults,
    process: usize,
}

#[derive(Debug, Default)]
struct StoreShared {
    /// Appends waiting at their yield, by ticket: what a crash may or may not have let through.
    in_flight: BTreeMap<u64, InFlightAppend>,
    next_ticket: u64,
    /// Every event id of every append acknowledged to a caller.
    acknowledged: HashSet<EventId>,
    /// How many events were acknowledged (the set's size, kept for the report).
    acknowledged_count: u64,
}

#[derive(Debug)]
struct InFlightAppend {
    process: usize,
    stream: StreamName,
    expected: ExpectedVersion,
    events: Vec<EventData>,
}

impl SimStore {
    /// A fresh, empty store shared by every process of a run.
    pub fn new(faults: Faults) -> Self {
        Self {
            inner: MemoryStore::new(),
            shared: Arc::new(Mutex::new(StoreShared::default())),
            faults,
            process: 0,
        }
    }

    /// The handle process `process` uses.
    pub fn for_process(&self, process: usize) -> Self {
        Self {
            process,
            ..self.clone()
        }
    }

    /// The store itself, without faults or yields: for the checker and the read models.
    pub fn inner(&self) -> &MemoryStore {
        &self.inner
    }

    fn lock(&self) -> MutexGuard<'_, StoreShared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Process `process` crashed: each of its appends cut off at its yield lands or not, as the
    /// seed decides (a crash is an unknown outcome for whatever was being written).
    pub fn crash_process(&self, process: usize) -> usize {
        let cut_off: Vec<InFlightAppend> = {
            let mut shared = self.lock();
            let tickets: Vec<u64> = shared
                .in_flight
                .iter()
                .filter(|(_, append)| append.process == process)
                .map(|(ticket, _)| *ticket)
                .collect();
            tickets
                .into_iter()
                .filter_map(|ticket| shared.in_flight.remove(&ticket))
                .collect()
        };
        let mut landed = 0;
        for append in cut_off {
            if self.faults.between(0, 1) == 1 {
                let written = crate::block_on(self.inner.append(
                    &append.stream,
                    append.expected,
                    append.events,
                ));
                if written.is_ok() {
                    landed += 1;
                }
            }
        }
        landed
    }

    /// Every acknowledged event id that the store does not hold (empty when all survived).
    pub fn lost_acknowledged(&self, stored: &[RecordedEvent]) -> Vec<EventId> {
        let held: HashSet<EventId> = stored.iter().map(|event| event.event_id).collect();
        let shared = self.lock();
        let mut lost: Vec<EventId> = shared
            .acknowledged
            .iter()
            .filter(|id| !held.contains(id))
            .copied()
            .collect();
        lost.sort();
        lost
    }

    /// How many events were acknowledged so far.
    pub fn acknowledged_count(&self) -> u64 {
        self.lock().acknowledged_count
    }

    async fn append_with_faults(
        &self,
        stream: StreamName,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> Result<AppendOutcome, StoreError> {
        let ticket = {
            let mut shared = self.lock();
            let ticket = shared.next_ticket;
            shared.next_ticket += 1;
            shared.in_flight.insert(
                ticket,
                InFlightAppend {
                    process: self.process,
                    stream: stream.clone(),
                    expected,
                    events: events.clone(),
                },
            );
            ticket
        };
        yield_now().await;
        self.lock().in_flight.remove(&ticket);
        let op = stream
            .operation_id()
            .map_or_else(|| stream.to_string(), |id| self.faults.op_name(id));
        if self.faults.fire(FaultClass::AppendFailed) {
            self.faults
                .note(format!("fault: append to {op} failed before writing"));
            return Err(StoreError::Unavailable {
                reason: "simulated: the store failed before writing".into(),
            });
        }
        if self.faults.fire(FaultClass::AppendUnknown) {
            let written = self.faults.between(0, 1) == 1;
            if written {
                let _ = self.inner.append(&stream, expected, events).await;
            }
            self.faults.note(format!(
                "fault: append to {op} outcome unknown (written: {written})"
            ));
            return Err(StoreError::AppendOutcomeUnknown {
                stream,
                reason: "simulated: the connection dropped after the append was sent".into(),
            });
        }
        let ids: Vec<EventId> = events.iter().map(|event| event.event_id).collect();
        let outcome = self.inner.append(&stream, expected, events).await;
        if outcome.is_ok() {
            let mut shared = self.lock();
            for id in ids {
                if shared.acknowledged.insert(id) {
                    shared.acknowledged_count += 1;
                }
            }
        }
        outcome
    }
}

impl EventStore for SimStore {
    type Subscription = MemorySubscription;

    async fn append(
        &self,
        stream: &StreamName,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> Result<AppendOutcome, StoreError> {
        self.append_with_faults(stream.clone(), expected, events)
            .await
    }

    async fn read_stream(
        &self,
        stream: &StreamName,
        from: opledger_domain::ids::StreamVersion,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        yield_now().await;
        self.inner.read_stream(stream, from, max_count).await
    }

    async fn read_all(
        &self,
        start: LogStart,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        yield_now().await;
        self.inner.read_all(start, max_count).await
    }

    async fn head_position(&self) -> Result<Option<GlobalPosition>, StoreError> {
        self.inner.head_position().await
    }

    async fn subscribe_all(&self, start: LogStart) -> Result<MemorySubscription, StoreError> {
        self.inner.subscribe_all(start).await
    }
}
