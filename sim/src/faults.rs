//! The faults a run injects, how often each fires in this seed, and how often it did.
//!
//! Every seed draws its own rate for every class (some seeds calm, some stormy): a class is
//! switched off in about a third of the seeds, and otherwise fires with a probability between
//! zero and its class's ceiling, scaled by the seed's overall storminess. The same shared
//! [`Faults`] is asked by the store, the provider and the scheduler, in the order the run asks,
//! so the draws are part of the seed's one deterministic sequence.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use opledger_domain::ids::OperationId;

use crate::rng::SimRng;

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultClass {
    /// The request never reached the provider; the client timed out.
    RequestDropped,
    /// The provider applied the request; the response was lost.
    ResponseDropped,
    /// The answer comes late: the request reaches the provider after the client gave up, or the
    /// response comes back after the attempt's lease ran out.
    ResponseLate,
    /// A 5xx before the provider committed anything.
    ServerErrorBeforeCommit,
    /// A 5xx after the provider committed the object.
    ServerErrorAfterCommit,
    /// A 429 with Retry-After: nothing processed.
    RateLimited,
    /// A lookup that gets no usable answer.
    LookupUnavailable,
    /// A search index lagging longer than the connector says.
    SearchLagExceeded,
    /// A store append that fails before writing.
    AppendFailed,
    /// A store append whose outcome is unknown (written or not).
    AppendUnknown,
    /// A process crashes: its tasks and memory are gone, the store stays; it restarts.
    Crash,
    /// Two or more workers drive one operation at once.
    ConcurrentWorkers,
    /// The clock jumps forward.
    ClockJump,
    /// An account's credentials are rotated at the provider.
    CredentialsRotated,
    /// Time passes beyond an idempotency key's retention.
    KeyAged,
    /// The same source delivery arrives again.
    Redelivery,
    /// A person decides about an operation at a random time.
    ReviewDecision,
    /// A person approves or denies an operation awaiting approval at a random time.
    ApprovalDecision,
}

impl FaultClass {
    /// Every class, in report order.
    pub const ALL: [FaultClass; 18] = [
        Self::RequestDropped,
        Self::ResponseDropped,
        Self::ResponseLate,
        Self::ServerErrorBeforeCommit,
        Self::ServerErrorAfterCommit,
        Self::RateLimited,
        Self::LookupUnavailable,
        Self::SearchLagExceeded,
        Self::AppendFailed,
        Self::AppendUnknown,
        Self::Crash,
        Self::ConcurrentWorkers,
        Self::ClockJump,
        Self::CredentialsRotated,
        Self::KeyAged,
        Self::Redelivery,
        Self::ReviewDecision,
        // Last, so the rates drawn for the classes before it are what they were without it.
        Self::ApprovalDecision,
    ];

    /// The class's name, as the summary line prints it.
    pub fn name(self) -> &'static str {
        match self {
            Self::RequestDropped => "request_dropped",
            Self::ResponseDropped => "response_dropped",
            Self::ResponseLate => "response_late",
            Self::ServerErrorBeforeCommit => "5xx_before_commit",
            Self::ServerErrorAfterCommit => "5xx_after_commit",
            Self::RateLimited => "429",
            Self::LookupUnavailable => "lookup_unavailable",
            Self::SearchLagExceeded => "search_lag",
            Self::AppendFailed => "append_failed",
            Self::AppendUnknown => "append_unknown",
            Self::Crash => "crash",
            Self::ConcurrentWorkers => "concurrent_workers",
            Self::ClockJump => "clock_jump",
            Self::CredentialsRotated => "credentials_rotated",
            Self::KeyAged => "key_aged",
            Self::Redelivery => "redelivery",
            Self::ReviewDecision => "review_decision",
            Self::ApprovalDecision => "approval_decision",
        }
    }

    /// The highest rate this class may get in a seed, in parts per million of its chances
    /// (a send, a lookup, an append, or a scheduler step for the process-level classes).
    fn ceiling_per_million(self) -> u32 {
        match self {
            // Per send or lookup: a stormy seed loses a good part of its traffic.
            Self::RequestDropped
            | Self::ResponseDropped
            | Self::ResponseLate
            | Self::ServerErrorBeforeCommit
            | Self::ServerErrorAfterCommit
            | Self::RateLimited
            | Self::LookupUnavailable
            | Self::SearchLagExceeded => 250_000,
            // Per append: a few per seed at most, since every drive appends several times.
            Self::AppendFailed | Self::AppendUnknown => 40_000,
            // Per scheduler step (a seed takes a few thousand steps).
            Self::Crash | Self::CredentialsRotated | Self::KeyAged => 1_500,
            Self::ClockJump | Self::Redelivery => 4_000,
            Self::ReviewDecision | Self::ApprovalDecision => 6_000,
            // Per worker dispatch.
            Self::ConcurrentWorkers => 300_000,
        }
    }
}

/// Per class: the rate this seed drew, and how often the class fired.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    counts: BTreeMap<FaultClass, u64>,
}

impl FaultCounts {
    /// How often `class` fired.
    pub fn get(&self, class: FaultClass) -> u64 {
        self.counts.get(&class).copied().unwrap_or(0)
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &FaultCounts) {
        for (class, count) in &other.counts {
            *self.counts.entry(*class).or_default() += count;
        }
    }

    fn bump(&mut self, class: FaultClass) {
        *self.counts.entry(class).or_default() += 1;
    }

    /// `class:count,…` over every class, as the summary line prints it.
    pub fn summary(&self) -> String {
        FaultClass::ALL
            .iter()
            .map(|class| format!("{}:{}", class.name(), self.get(*class)))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The faults of one run, shared by everything that can inject one.
#[derive(Clone, Debug)]
pub struct Faults {
    shared: Arc<Mutex<FaultState>>,
}

#[derive(Debug)]
struct FaultState {
    rng: SimRng,
    rates: BTreeMap<FaultClass, u32>,
    counts: FaultCounts,
    /// Off in the liveness phase.
    enabled: bool,
    /// What fired since the scheduler last looked, for the trace.
    notes: Vec<String>,
    /// Operation ids by their index in the run, for readable notes.
    names: BTreeMap<OperationId, usize>,
}

impl Faults {
    /// The faults of seed `seed`: each class's rate drawn from it.
    pub fn for_seed(seed: u64) -> Self {
        let mut rng = SimRng::derived(seed, 1);
        // How stormy the seed is, 0..=100 %: calm seeds exist on purpose.
        let storminess = rng.between(0, 100) as u32;
        let rates = FaultClass::ALL
            .iter()
            .map(|class| {
                let on = rng.below(3) != 0;
                let ceiling = class.ceiling_per_million() / 100 * storminess;
                let rate = if on {
                    rng.below(u64::from(ceiling) + 1) as u32
                } else {
                    0
                };
                (*class, rate)
            })
            .collect();
        Self {
            shared: Arc::new(Mutex::new(FaultState {
                rng: SimRng::derived(seed, 2),
                rates,
                counts: FaultCounts::default(),
                enabled: true,
                notes: Vec::new(),
                names: BTreeMap::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, FaultState> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `class` fires now (never in the liveness phase); counts it when it does.
    pub fn fire(&self, class: FaultClass) -> bool {
        let mut state = self.lock();
        let rate = state.rates.get(&class).copied().unwrap_or(0);
        if !state.enabled || !state.rng.chance(rate) {
            return false;
        }
        state.counts.bump(class);
        true
    }

    /// Counts `class` as fired without drawing (a fault decided elsewhere took effect).
    pub fn count(&self, class: FaultClass) {
        self.lock().counts.bump(class);
    }

    /// A draw from the faults' own generator (a fault's size: how late, how far).
    pub fn between(&self, low: u64, high: u64) -> u64 {
        self.lock().rng.between(low, high)
    }

    /// Switches every fault off (the liveness phase).
    pub fn disable(&self) {
        self.lock().enabled = false;
    }

    /// Whether faults are on.
    pub fn enabled(&self) -> bool {
        self.lock().enabled
    }

    /// How often each class fired so far.
    pub fn counts(&self) -> FaultCounts {
        self.lock().counts.clone()
    }

    /// Adds a line for the trace.
    pub fn note(&self, line: String) {
        self.lock().notes.push(line);
    }

    /// Takes the lines added since the last call.
    pub fn take_notes(&self) -> Vec<String> {
        std::mem::take(&mut self.lock().notes)
    }

    /// Names operation `id` as number `index` of the run.
    pub fn name(&self, id: OperationId, index: usize) {
        self.lock().names.insert(id, index);
    }

    /// The operation's readable name, `op<index>`.
    pub fn op_name(&self, id: OperationId) -> String {
        self.lock()
            .names
            .get(&id)
            .map_or_else(|| format!("op?{id}"), |index| format!("op{index}"))
    }

    /// The index of operation `id`, if it is one of the run's.
    pub fn op_index(&self, id: OperationId) -> Option<usize> {
        self.lock().names.get(&id).copied()
    }
}

impl Faults {
    /// Draws `class` without counting it: for a fault that takes effect only if the moment
    /// allows (a second worker that finds the operation busy), counted with [`Faults::count`].
    pub fn fire_uncounted(&self, class: FaultClass) -> bool {
        let mut state = self.lock();
        let rate = state.rates.get(&class).copied().unwrap_or(0);
        state.enabled && state.rng.chance(rate)
    }
}
