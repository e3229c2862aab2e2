//! opledger's deterministic simulator: the real engine under faults, one seed at a
//! time, single-threaded, fully determined by one `u64`.
//!
//! # What is real and what is a stand-in
//!
//! Real, unchanged: the [`Engine`](opledger_domain::engine::Engine) and the ledger services
//! (record, drive, sweep, reconcile, review), the decider and `evolve`, the codec and its hash
//! chain, the domain's `verify`, the in-memory event store (`opledger-store`'s `MemoryStore`),
//! and the read-model folds of `opledger-projections` (every read model's changes, the totals and
//! the work queue the workers read).
//!
//! Stand-ins, written here:
//! - the executor ([`executor`]): a seeded choice of which task runs next, instead of tokio;
//! - the workers' loop: [`sim`] asks the real work queue what is due and calls the real
//!   `Engine::drive`, with the same rules as `adapters/runtime/src/workers.rs` (never the same
//!   operation twice at once in a process, a redrive pause for an unchanged operation), but
//!   without tokio (the real workers are tokio-bound);
//! - the clock ([`clock`]) and the id source (seeded, guessable: never for production);
//! - the store's door ([`store`]): a yield before every call, and the store's faults;
//! - the provider ([`provider`]): every deduplication contract and lookup of the connectors, with
//!   ground truth, instead of HTTP;
//! - callers (record and execute, redeliveries) and people (review decisions).
//!
//! # A run
//!
//! A seed draws its faults' rates, the provider's numbers (key retention and margin, search lag)
//! and the operations (account, action, arrival time). The safety phase runs with faults until
//! two minutes after the last arrival; then the liveness phase turns faults off, callers
//! redeliver what was never recorded, and every operation must settle within
//! [`sim::LIVENESS_BOUND_MS`]. The invariants ([`checker`]) are checked after every step and at
//! the end; the first broken one stops the seed.

#![forbid(unsafe_code)]

pub mod checker;
pub mod clock;
pub mod executor;
pub mod faults;
pub mod provider;
pub mod readmodel;
pub mod rng;
pub mod sim;
pub mod store;
pub mod trace;

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::task::{Context, Poll, Waker};

pub use faults::{FaultClass, FaultCounts};

/// The fewest operations a seed runs by default (the issue asks for at least 50).
pub const DEFAULT_OPS: usize = 50;
/// The processes (each with its engine and workers) of a run by default: two, so that two
/// workers meet on one operation.
pub const DEFAULT_PROCESSES: usize = 2;
/// Most operations one seed may run: a seed is single-threaded and checked after every step.
pub const MAX_OPS: usize = 10_000;

/// How seeds are run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Operations per seed.
    pub ops: usize,
    /// Processes per seed.
    pub processes: usize,
    /// Keep every trace line, not only the tail (for reproducing one seed).
    pub keep_full_trace: bool,
    /// Go on after the first broken invariant (to list them all).
    pub continue_after_violation: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            ops: DEFAULT_OPS,
            processes: DEFAULT_PROCESSES,
            keep_full_trace: false,
            continue_after_violation: false,
        }
    }
}

/// What one seed's run came to.
#[derive(Clone, Debug)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Operations run.
    pub ops: usize,
    /// Scheduler steps taken.
    pub steps: u64,
    /// Simulated time the run covered, in milliseconds.
    pub sim_ms: i64,
    /// Process crashes (the fault, and restarts after a rotation).
    pub crashes: u64,
    /// The hash of the whole trace: the same seed must give the same hash.
    pub trace_hash: u64,
    /// How often each fault fired.
    pub faults: FaultCounts,
    /// The broken invariants, empty when the seed passed.
    pub violations: Vec<String>,
    /// The last lines of the trace.
    pub trace_tail: Vec<String>,
    /// Every line of the trace, when [`SimConfig::keep_full_trace`] asked for it.
    pub full_trace: Option<Vec<String>>,
    /// How many operations ended in each status.
    pub outcomes: BTreeMap<&'static str, usize>,
}

impl SeedReport {
    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The command that runs this seed again.
    pub fn reproduce_command(&self) -> String {
        format!(
            "opledger sim --seeds 1 --from {} --ops {}",
            self.seed, self.ops
        )
    }
}

/// Runs one seed: both phases and every check. A panic inside the engine is a failed seed, with
/// the trace up to it.
pub fn run_seed(seed: u64, config: &SimConfig) -> SeedReport {
    let config = SimConfig {
        ops: config.ops.clamp(1, MAX_OPS),
        ..config.clone()
    };
    let mut sim = sim::Sim::new(seed, &config);
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| sim.run())) {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
            .unwrap_or_else(|| "a panic without a message".to_owned());
        sim.panicked(message);
    }
    sim.report()
}

/// Runs a future that never waits for anything outside (the memory store's calls) to its end.
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut context = Context::from_waker(Waker::noop());
    // The memory store answers at once; a bound instead of a spin keeps a broken promise loud.
    for _ in 0..1_000 {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
    }
    panic!("a future that was to be ready at once kept waiting")
}

/// What a run of many seeds came to.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Seeds run.
    pub seeds: u64,
    /// Operations run over all seeds.
    pub ops: u64,
    /// The failed seeds' reports, by seed.
    pub failed: Vec<SeedReport>,
    /// How often each fault fired, over all seeds.
    pub faults: FaultCounts,
    /// In how many seeds each fault fired at least once.
    pub seeds_with: BTreeMap<FaultClass, u64>,
}

impl Summary {
    fn add(&mut self, report: SeedReport) {
        self.seeds += 1;
        self.ops += report.ops as u64;
        self.faults.add(&report.faults);
        for class in FaultClass::ALL {
            if report.faults.get(class) > 0 {
                *self.seeds_with.entry(class).or_default() += 1;
            }
        }
        if !report.passed() {
            self.failed.push(report);
            self.failed.sort_by_key(|report| report.seed);
        }
    }

    /// The classes that fired in fewer than `per_mille` ‰ of the seeds.
    pub fn rare_classes(&self, per_mille: u64) -> Vec<FaultClass> {
        FaultClass::ALL
            .into_iter()
            .filter(|class| {
                let seeds = self.seeds_with.get(class).copied().unwrap_or(0);
                seeds * 1000 < self.seeds * per_mille
            })
            .collect()
    }

    /// The one summary line: `sim: seeds=N ops=M failed=F faults=<class>:<count>,…`.
    pub fn line(&self) -> String {
        format!(
            "sim: seeds={} ops={} failed={} faults={}",
            self.seeds,
            self.ops,
            self.failed.len(),
            self.faults.summary()
        )
    }
}

/// Runs seeds `from..from + count` on `threads` threads (each seed alone on one), calling
/// `progress` with the seeds done so far after each; stops early when `stop` is set.
pub fn run_seeds(
    from: u64,
    count: u64,
    config: &SimConfig,
    threads: usize,
    stop: &std::sync::atomic::AtomicBool,
    progress: &(dyn Fn(u64, &SeedReport) + Sync),
) -> Summary {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    let next = AtomicU64::new(0);
    let summary = Mutex::new(Summary::default());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= count {
                    return;
                }
                let report = run_seed(from.wrapping_add(n), config);
                let mut summary = summary
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                summary.add(report.clone());
                progress(summary.seeds, &report);
            });
        }
    });
    summary
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
