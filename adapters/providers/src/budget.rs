//! Request budgets: how many requests one account may make per second, per kind (sends,
//! lookups), enforced before the request is made, so a lookup storm after an outage is paced
//! instead of ending in a storm of 429s.
//!
//! Each budget is a token bucket kept as GCRA (one instant, the theoretical arrival time): a
//! caller reserves the next free slot and waits for it, so callers are served in the order they
//! asked and the rate holds over any window. A wait longer than the longest a caller may hold its
//! worker is not reserved: the request is not made, and the caller is told how long to wait.
//! It must never let a request start before its slot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Most requests per second a budget may declare.
pub const MAX_REQUESTS_PER_S: u64 = 10_000;
/// Largest burst a budget may declare.
pub const MAX_BURST: u64 = 10_000;

/// A declared budget: a steady rate and the burst allowed on top of an idle period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Requests per second, on average.
    pub requests_per_s: u64,
    /// Requests that may go at once after an idle period (at least 1).
    pub burst: u64,
}

/// Which budget a request is counted in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// Creates and other sends.
    Send,
    /// Lookups (reconciliation).
    Lookup,
}

impl Kind {
    /// The name used in metrics and messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Send => "sends",
            Self::Lookup => "lookups",
        }
    }
}

/// One account's bucket for one kind.
#[derive(Debug)]
pub(crate) struct Bucket {
    budget: Budget,
    /// The theoretical arrival time of the next request.
    tat: Mutex<Option<Instant>>,
}

impl Bucket {
    pub fn new(budget: Budget) -> Self {
        debug_assert!(budget.requests_per_s >= 1 && budget.burst >= 1);
        Self {
            budget,
            tat: Mutex::new(None),
        }
    }

    fn interval(&self) -> Duration {
        Duration::from_nanos(1_000_000_000 / self.budget.requests_per_s.max(1))
    }

    /// Reserves the next slot if it is at most `longest` away: `Ok(wait)` until it; otherwise
    /// `Err(wait)`, nothing reserved.
    pub fn reserve(&self, now: Instant, longest: Duration) -> Result<Duration, Duration> {
        let interval = self.interval();
        let tolerance =
            interval * u32::try_from(self.budget.burst.saturating_sub(1)).unwrap_or(u32::MAX);
        let mut tat = self
            .tat
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let arrival = tat.map_or(now, |tat| tat.max(now));
        let allowed_at = arrival.checked_sub(tolerance).unwrap_or(now).max(now);
        let wait = allowed_at - now;
        if wait > longest {
            return Err(wait);
        }
        *tat = Some(arrival + interval);
        Ok(wait)
    }
}

/// What the budgets made callers wait, for metrics: per kind, the waits and their total.
#[derive(Debug, Default)]
pub struct Waits {
    waits: [AtomicU64; 2],
    waited_ms: [AtomicU64; 2],
    refused: [AtomicU64; 2],
}

impl Waits {
    pub(crate) fn record(&self, kind: Kind, waited: Duration) {
        let index = kind as usize;
        self.waits[index].fetch_add(1, Ordering::Relaxed);
        let ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        self.waited_ms[index].fetch_add(ms, Ordering::Relaxed);
    }

    pub(crate) fn record_refused(&self, kind: Kind) {
        self.refused[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// For `kind`: how many requests waited for their slot, their waits' total in
    /// milliseconds, and how many were not made because the slot was too far away.
    pub fn of(&self, kind: Kind) -> (u64, u64, u64) {
        let index = kind as usize;
        (
            self.waits[index].load(Ordering::Relaxed),
            self.waited_ms[index].load(Ordering::Relaxed),
            self.refused[index].load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_goes_at_once_and_the_rest_keep_the_rate() {
        let bucket = Bucket::new(Budget {
            requests_per_s: 5,
            burst: 3,
        });
        let now = Instant::now();
        let long = Duration::from_secs(60);
        let waits: Vec<u128> = (0..6)
            .map(|_| bucket.reserve(now, long).expect("reserved").as_millis())
            .collect();
        assert_eq!(waits, vec![0, 0, 0, 200, 400, 600]);
        // A slot further away than the caller may wait is not reserved.
        assert_eq!(
            bucket.reserve(now, Duration::from_millis(500)),
            Err(Duration::from_millis(800))
        );
        assert_eq!(bucket.reserve(now, long), Ok(Duration::from_millis(800)));
        // After an idle second the burst is back.
        let later = now + Duration::from_secs(3);
        assert_eq!(bucket.reserve(later, long), Ok(Duration::ZERO));
    }
}
