//! Simulated time: a clock the scheduler moves, and the two ways a task waits on it.
//!
//! Nothing here reads the machine's clock. Time moves only when the scheduler says so (a small
//! step, a jump fault, or straight to the next moment anything is due when every task waits), so
//! a run takes as long as its computation, not as long as its simulated hours.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use chrono::{DateTime, TimeZone, Utc};
use opledger_domain::ports::Clock;

/// Where every simulated run starts: 2026-12-01 00:00:00 UTC, in Unix milliseconds.
pub const SIM_EPOCH_MS: i64 = 1_796_083_200_000;

/// The shared simulated clock. Clones read and move one time.
#[derive(Clone, Debug)]
pub struct SimClock {
    shared: Arc<ClockShared>,
}

#[derive(Debug)]
struct ClockShared {
    now_ms: AtomicI64,
    /// The deadline of the last sleep that returned `Pending`: the executor reads it after each
    /// poll to know the task is waiting for time, not for another task.
    last_sleep_ms: Mutex<Option<i64>>,
}

impl SimClock {
    /// A clock at [`SIM_EPOCH_MS`].
    pub fn new() -> Self {
        Self {
            shared: Arc::new(ClockShared {
                now_ms: AtomicI64::new(SIM_EPOCH_MS),
                last_sleep_ms: Mutex::new(None),
            }),
        }
    }

    /// Milliseconds since the Unix epoch, now.
    pub fn now_ms(&self) -> i64 {
        self.shared.now_ms.load(Ordering::Relaxed)
    }

    /// Milliseconds since the run started.
    pub fn elapsed_ms(&self) -> i64 {
        self.now_ms() - SIM_EPOCH_MS
    }

    /// Moves the clock forward by `by_ms` (never backwards).
    pub fn advance(&self, by_ms: u64) {
        let by = i64::try_from(by_ms).unwrap_or(i64::MAX / 4);
        self.shared.now_ms.fetch_add(by, Ordering::Relaxed);
    }

    /// Moves the clock to `at_ms` if that is later.
    pub fn advance_to(&self, at_ms: i64) {
        self.shared.now_ms.fetch_max(at_ms, Ordering::Relaxed);
    }

    /// A future that is ready once the clock reaches `until_ms`.
    pub fn sleep_until(&self, until_ms: i64) -> SleepUntil {
        SleepUntil {
            clock: self.clone(),
            until_ms,
        }
    }

    /// Takes the deadline a sleep left during the last poll (see [`SleepUntil`]).
    pub(crate) fn take_last_sleep(&self) -> Option<i64> {
        self.lock_sleep().take()
    }

    fn lock_sleep(&self) -> std::sync::MutexGuard<'_, Option<i64>> {
        self.shared
            .last_sleep_ms
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for SimClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SimClock {
    fn now(&self) -> DateTime<Utc> {
        to_time(self.now_ms())
    }
}

/// A time in Unix milliseconds as a `DateTime`.
pub fn to_time(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .expect("simulated times stay within chrono's range")
}

/// Waits for simulated time (a slow answer, a client's timeout).
#[derive(Debug)]
pub struct SleepUntil {
    clock: SimClock,
    until_ms: i64,
}

impl Future for SleepUntil {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _context: &mut Context<'_>) -> Poll<()> {
        if self.clock.now_ms() >= self.until_ms {
            return Poll::Ready(());
        }
        *self.clock.lock_sleep() = Some(self.until_ms);
        Poll::Pending
    }
}

/// Returns `Pending` once, asking to be polled again: a point where the scheduler may run
/// another task (or crash the process) before this one goes on.
pub fn yield_now() -> YieldNow {
    YieldNow { yielded: false }
}

/// The future of [`yield_now`].
#[derive(Debug)]
pub struct YieldNow {
    yielded: bool,
}

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        context.waker().wake_by_ref();
        Poll::Pending
    }
}
