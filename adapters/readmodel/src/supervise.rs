//! Keeping the read models fed through faults: the runner started again after any error it can
//! survive, with jittered exponential backoff, and its health for `/healthz` and `/metrics`.
//!
//! A full disk, a read-model file that cannot be written for a while, a store that answers an
//! error: each ends one [`ReadModelRunner::run`], which leaves the read models at their last
//! committed batch. [`ReadModelRunner::run_supervised`] runs it again from that checkpoint after a
//! pause, so once the cause is gone the read models catch up without a restart. Errors that no
//! retry can cure (a file of another ledger, a newer schema) stop it for good and say so.
//!
//! It must never report healthy while it is retrying, stopped, or not advancing while behind: the
//! listings, the review queue and the workers' queue all read the read models, so a stalled
//! runner is a stalled service.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opledger_domain::ports::IdSource;
use opledger_domain::store::EventStore;
use opledger_runtime::system::RandomIds;
use tracing::{info, warn};

use super::runner::{ReadModelRunner, ReadModels, RunReport};
use super::ReadModelError;

/// The first pause after a failed run, in milliseconds.
pub const RUNNER_RETRY_FIRST_MS: u64 = 100;
/// The longest pause between runs, in milliseconds: once the cause is gone (space freed, the file
/// writable again) the read models resume within this much.
pub const RUNNER_RETRY_MAX_MS: u64 = 5_000;
/// How long the read models may stay behind the log without a single commit before the runner
/// counts as stalled, in milliseconds. A batch commits within about a second (its linger is at
/// most [`super::MAX_LINGER_MS`], a full batch applies in well under a second), so this many
/// seconds without one while events wait means it is not advancing.
pub const RUNNER_STALL_MS: u64 = 30_000;
const _: () = assert!(RUNNER_RETRY_FIRST_MS <= RUNNER_RETRY_MAX_MS);
const _: () = assert!(super::runner::MAX_LINGER_MS < RUNNER_STALL_MS);
// A runner that is retrying is reported as such at once; the stall bound is for the silent kind.
const _: () = assert!(RUNNER_RETRY_MAX_MS < RUNNER_STALL_MS);

/// What the runner is doing now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunnerState {
    /// Following the log.
    Running,
    /// A run failed; the next starts after a pause.
    Retrying {
        /// Failed runs in a row.
        consecutive_failures: u32,
        /// What the last one said.
        last_error: String,
        /// The pause before the next run, in milliseconds.
        retry_in_ms: u64,
    },
    /// It stopped on an error that no retry can cure; a person must act.
    Stopped {
        /// What it said.
        error: String,
    },
    /// It ended because the service is stopping.
    Finished,
}

/// The runner's health as `/healthz` and `/metrics` show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerHealthReport {
    /// What it is doing.
    pub state: RunnerState,
    /// Failed runs since the service started.
    pub failures_total: u64,
    /// Milliseconds since the last batch was committed, or since the runner started when none
    /// has been: how long the read models have not advanced.
    pub since_progress_ms: u64,
}

/// The runner's health, shared between the runner and whoever reports it. Cloning gives another
/// handle to the same record.
#[derive(Clone, Debug)]
pub struct RunnerHealth {
    inner: Arc<Mutex<HealthRecord>>,
}

#[derive(Debug)]
struct HealthRecord {
    state: RunnerState,
    failures_total: u64,
    last_progress: Instant,
}

impl Default for RunnerHealth {
    fn default() -> Self {
        Self::new()
    }
}

impl RunnerHealth {
    /// A runner that has just started.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Mutex::new(HealthRecord {
                state: RunnerState::Running,
                failures_total: 0,
                last_progress: Instant::now(),
            })),
        }
    }

    /// The health now.
    pub fn report(&self) -> RunnerHealthReport {
        let record = self.lock();
        RunnerHealthReport {
            state: record.state.clone(),
            failures_total: record.failures_total,
            since_progress_ms: millis(record.last_progress.elapsed()),
        }
    }

    /// A batch was committed: the runner advances.
    fn progressed(&self) {
        let mut record = self.lock();
        record.last_progress = Instant::now();
        record.state = RunnerState::Running;
    }

    fn set(&self, state: RunnerState) {
        self.lock().state = state;
    }

    fn failed(&self, consecutive_failures: u32, error: &ReadModelError, retry_in_ms: u64) {
        let mut record = self.lock();
        record.failures_total += 1;
        record.state = RunnerState::Retrying {
            consecutive_failures,
            last_error: error.to_string(),
            retry_in_ms,
        };
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthRecord> {
        // The record is a few plain fields, each write complete on its own: a panic elsewhere
        // cannot leave it half-updated.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl RunnerHealthReport {
    /// Why the read models cannot be trusted to be current, if they cannot: the runner is
    /// retrying, has stopped, or has not committed for [`RUNNER_STALL_MS`] while `lag_positions`
    /// events wait. `None` when it is following the log.
    pub fn problem(&self, lag_positions: u64) -> Option<String> {
        match &self.state {
            RunnerState::Retrying {
                consecutive_failures,
                last_error,
                retry_in_ms,
            } => Some(format!(
                "the read-model runner failed {consecutive_failures} time(s) in a row ({last_error}); it tries again in {retry_in_ms} ms and resumes from its checkpoint once the cause is gone"
            )),
            RunnerState::Stopped { error } => Some(format!(
                "the read-model runner stopped and will not resume on its own: {error}"
            )),
            RunnerState::Finished => Some("the read-model runner has stopped (the service is shutting down)".into()),
            RunnerState::Running
                if lag_positions > 0 && self.since_progress_ms >= RUNNER_STALL_MS =>
            {
                Some(format!(
                    "the read models have not advanced for {} s while {lag_positions} position(s) of the log wait",
                    self.since_progress_ms / 1000
                ))
            }
            RunnerState::Running => None,
        }
    }

    /// Whether a restart is the remedy: only for a runner that stopped for good (a retrying one
    /// resumes by itself once its cause is gone, and a restart would not remove the cause).
    pub fn needs_restart(&self) -> bool {
        matches!(self.state, RunnerState::Stopped { .. })
    }
}

impl ReadModelRunner {
    /// Runs [`ReadModelRunner::run`] until `stop` completes, starting it again from the
    /// checkpoint after every error it can survive, each time after a jittered exponential pause
    /// ([`RUNNER_RETRY_FIRST_MS`] doubling up to [`RUNNER_RETRY_MAX_MS`]). Each failure is logged
    /// once, with the pause that follows it, and counted in `health`. An error that a retry cannot
    /// cure ends it: `health` says stopped, and the error is returned.
    pub async fn run_supervised<S: EventStore>(
        &self,
        store: &S,
        read_models: &ReadModels,
        health: &RunnerHealth,
        stop: impl Future<Output = ()>,
    ) -> Result<RunReport, ReadModelError> {
        tokio::pin!(stop);
        let mut total = RunReport::default();
        let mut consecutive_failures: u32 = 0;
        let mut committed = read_models.committed.subscribe();
        loop {
            let result = {
                let run = self.run(store, read_models, stop.as_mut());
                tokio::pin!(run);
                // Every committed batch is progress, whichever run made it.
                loop {
                    tokio::select! {
                        biased;
                        result = &mut run => break result,
                        changed = committed.changed() => {
                            if changed.is_ok() {
                                consecutive_failures = 0;
                                health.progressed();
                            }
                        }
                    }
                }
            };
            let error = match result {
                Ok(report) => {
                    total.batches += report.batches;
                    total.applied += report.applied;
                    total.checkpoint = report.checkpoint;
                    health.set(RunnerState::Finished);
                    return Ok(total);
                }
                Err(error) => error,
            };
            if !survivable(&error) {
                warn!(%error, "the read-model runner stopped: no retry can cure this; fix the cause and restart");
                health.set(RunnerState::Stopped {
                    error: error.to_string(),
                });
                return Err(error);
            }
            consecutive_failures = consecutive_failures.saturating_add(1);
            let pause_ms = pause_ms(consecutive_failures, &RandomIds);
            health.failed(consecutive_failures, &error, pause_ms);
            warn!(
                %error,
                consecutive_failures,
                retry_in_ms = pause_ms,
                "the read-model runner failed; it resumes from its checkpoint after the pause"
            );
            tokio::select! {
                biased;
                () = &mut stop => {
                    health.set(RunnerState::Finished);
                    return Ok(total);
                }
                () = tokio::time::sleep(Duration::from_millis(pause_ms)) => {}
            }
            info!(consecutive_failures, "the read-model runner starts again");
        }
    }
}

/// Whether running again may cure `error`. Storage faults (a full disk, an unwritable or locked
/// file, a store that is down) pass; a file that belongs to another ledger or a newer build, or
/// a foreign database, stays what it is however often it is read.
fn survivable(error: &ReadModelError) -> bool {
    !matches!(
        error,
        ReadModelError::IncompatibleSchema { .. }
            | ReadModelError::ForeignDatabase { .. }
            | ReadModelError::AheadOfLedger { .. }
            | ReadModelError::AnotherLedger { .. }
    )
}

/// The pause after the `failures`th failure in a row: equal jitter over an exponential backoff,
/// half fixed and half random, so several instances that failed together do not retry together.
fn pause_ms(failures: u32, random: &impl IdSource) -> u64 {
    let doublings = failures.saturating_sub(1).min(16);
    let backoff = RUNNER_RETRY_FIRST_MS
        .saturating_mul(1 << doublings)
        .min(RUNNER_RETRY_MAX_MS);
    backoff / 2 + random.random_below(backoff / 2 + 1)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_domain::ids::{AttemptId, IdempotencyKey, OperationId};

    /// Ids are never asked for here; the "random" number is always the largest allowed.
    struct Highest;
    impl IdSource for Highest {
        fn new_operation_id(&self) -> OperationId {
            unreachable!("the pause draws no ids")
        }
        fn new_attempt_id(&self) -> AttemptId {
            unreachable!("the pause draws no ids")
        }
        fn new_idempotency_key(&self) -> IdempotencyKey {
            unreachable!("the pause draws no ids")
        }
        fn random_below(&self, bound: u64) -> u64 {
            bound.saturating_sub(1)
        }
    }

    #[test]
    fn pauses_double_from_the_first_and_never_exceed_the_longest() {
        assert_eq!(pause_ms(1, &Highest), RUNNER_RETRY_FIRST_MS);
        assert_eq!(pause_ms(2, &Highest), 2 * RUNNER_RETRY_FIRST_MS);
        assert_eq!(pause_ms(u32::MAX, &Highest), RUNNER_RETRY_MAX_MS);
        for failures in 1..40 {
            let pause = pause_ms(failures, &RandomIds);
            assert!((RUNNER_RETRY_FIRST_MS / 2..=RUNNER_RETRY_MAX_MS).contains(&pause));
        }
    }

    #[test]
    fn a_retrying_or_stopped_runner_is_a_problem_and_only_a_stopped_one_needs_a_restart() {
        let report = |state| RunnerHealthReport {
            state,
            failures_total: 1,
            since_progress_ms: 0,
        };
        let retrying = report(RunnerState::Retrying {
            consecutive_failures: 3,
            last_error: "database or disk is full".into(),
            retry_in_ms: 400,
        });
        let problem = retrying.problem(0).expect("retrying is a problem");
        assert!(
            problem.contains("3 time(s)") && problem.contains("disk is full"),
            "{problem}"
        );
        assert!(!retrying.needs_restart());
        let stopped = report(RunnerState::Stopped {
            error: "another ledger".into(),
        });
        assert!(stopped.problem(0).is_some() && stopped.needs_restart());
        assert_eq!(report(RunnerState::Running).problem(5), None);
    }

    #[test]
    fn a_running_runner_is_stalled_only_when_behind_and_silent_past_the_bound() {
        let silent = RunnerHealthReport {
            state: RunnerState::Running,
            failures_total: 0,
            since_progress_ms: RUNNER_STALL_MS,
        };
        assert_eq!(silent.problem(0), None, "caught up: nothing to commit");
        let stalled = silent.problem(12).expect("behind and silent is stalled");
        assert!(stalled.contains("12 position(s)"), "{stalled}");
        let recent = RunnerHealthReport {
            since_progress_ms: RUNNER_STALL_MS - 1,
            ..silent
        };
        assert_eq!(recent.problem(12), None);
    }

    #[test]
    fn only_errors_about_whose_file_it_is_are_beyond_a_retry() {
        assert!(survivable(&ReadModelError::Corrupt { reason: "x".into() }));
        assert!(!survivable(&ReadModelError::AheadOfLedger {
            checkpoint: 9,
            head: 3
        }));
    }
}
