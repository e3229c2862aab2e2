//! The stand clock: real time at start, running with a monotonic clock, plus every advance made
//! through the admin API. Key retention, search lag, `created_at_ms` and `Retry-After` dates
//! read it.
//!
//! It must never go back: wall-clock steps (NTP, a changed system time) do not reach it, and an
//! advance only adds.

use std::time::Instant;

use chrono::{DateTime, Utc};

/// The largest single advance the admin API accepts: about a hundred years, far past any
/// retention a test needs, and far from overflowing milliseconds in a `u64`.
pub const MAX_CLOCK_ADVANCE_MS: u64 = 100 * 365 * 24 * 3_600 * 1_000;

#[derive(Debug)]
pub(super) struct StandClock {
    wall_at_start_ms: u64,
    started: Instant,
    advanced_ms: u64,
}

impl StandClock {
    pub(super) fn start() -> Self {
        // Before 1970 is impossible on a working machine; 0 keeps the clock usable if it happens.
        let wall_at_start_ms = u64::try_from(Utc::now().timestamp_millis()).unwrap_or(0);
        Self {
            wall_at_start_ms,
            started: Instant::now(),
            advanced_ms: 0,
        }
    }

    /// Milliseconds since the Unix epoch, on the stand clock.
    pub(super) fn now_ms(&self) -> u64 {
        let elapsed_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.wall_at_start_ms
            .saturating_add(elapsed_ms)
            .saturating_add(self.advanced_ms)
    }

    /// Moves the clock forward by `ms` (callers bound it by [`MAX_CLOCK_ADVANCE_MS`]).
    pub(super) fn advance(&mut self, ms: u64) -> u64 {
        self.advanced_ms = self.advanced_ms.saturating_add(ms);
        self.now_ms()
    }
}

/// An RFC 9110 IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) at least `ahead_s` seconds after
/// `now_ms`. The date has whole seconds, so it is rounded up: a client that waits until the date
/// has always waited the full `ahead_s`. `None` if the date is outside chrono's range.
pub(super) fn http_date_after(now_ms: u64, ahead_s: u64) -> Option<String> {
    let at_ms = now_ms.saturating_add(ahead_s.saturating_mul(1_000));
    let at_s = i64::try_from(at_ms.div_ceil(1_000)).ok()?;
    let at = DateTime::<Utc>::from_timestamp(at_s, 0)?;
    Some(at.format("%a, %d %b %Y %H:%M:%S GMT").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_are_imf_fixdates() {
        // 1994-11-06 08:49:37 UTC, the example date of RFC 9110.
        assert_eq!(
            http_date_after(784_111_777_000, 0).as_deref(),
            Some("Sun, 06 Nov 1994 08:49:37 GMT")
        );
    }

    #[test]
    fn http_dates_round_up_so_the_full_wait_is_kept() {
        assert_eq!(
            http_date_after(784_111_776_001, 1).as_deref(),
            Some("Sun, 06 Nov 1994 08:49:38 GMT")
        );
    }

    #[test]
    fn the_clock_only_moves_forward() {
        let mut clock = StandClock::start();
        let before = clock.now_ms();
        let advanced = clock.advance(5_000);
        assert!(advanced >= before + 5_000);
        assert!(clock.now_ms() >= advanced);
    }
}
