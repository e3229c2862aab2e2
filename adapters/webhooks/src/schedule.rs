//! When a failed delivery is tried again, and when an endpoint has failed long enough to be
//! disabled.
//!
//! The pause after the n-th failure in a row is [`RETRY_FIRST_MS`] doubled n−1 times, capped at
//! [`RETRY_MAX_MS`], with equal jitter (half fixed, half random) so endpoints that failed together
//! do not all retry at the same instant: about 1 s, 2 s, 4 s, … 34 min, then every hour. An
//! answer with `Retry-After` sets the pause instead (at most [`MAX_RETRY_AFTER_S`]): the receiver
//! knows when it can take more. The retry window is measured from the event's first failed
//! attempt; a retry that would start after it disables the endpoint instead. The default window
//! is three days ([`DEFAULT_RETRY_WINDOW_S`]), as Svix and Stripe do, so a receiver down over a
//! weekend loses nothing: about 80 attempts for one event.

use std::time::Duration;

use opledger_domain::ports::IdSource;

/// The pause after the first failure, in milliseconds.
pub const RETRY_FIRST_MS: u64 = 1_000;
/// The longest pause between two attempts at one event, in milliseconds.
pub const RETRY_MAX_MS: u64 = 60 * 60 * 1_000;
/// How long one event is retried before its endpoint is disabled, by default, in seconds.
pub const DEFAULT_RETRY_WINDOW_S: u64 = 3 * 24 * 60 * 60;
/// The longest retry window a configuration may set, in seconds.
pub const MAX_RETRY_WINDOW_S: u64 = 7 * 24 * 60 * 60;
/// The longest `Retry-After` honoured, in seconds; a longer one waits this long.
pub const MAX_RETRY_AFTER_S: u64 = 60 * 60;
const _: () = assert!(RETRY_FIRST_MS <= RETRY_MAX_MS);
const _: () = assert!(DEFAULT_RETRY_WINDOW_S <= MAX_RETRY_WINDOW_S);
const _: () = assert!(MAX_RETRY_AFTER_S * 1_000 <= RETRY_MAX_MS);

/// The pause after the `failures`-th failure in a row of one event, honouring a `Retry-After`
/// the receiver sent.
pub fn pause(failures: u32, retry_after: Option<Duration>, random: &impl IdSource) -> Duration {
    if let Some(asked) = retry_after {
        return asked.min(Duration::from_secs(MAX_RETRY_AFTER_S));
    }
    let doublings = failures.saturating_sub(1).min(32);
    let backoff = RETRY_FIRST_MS
        .saturating_mul(1u64 << doublings)
        .min(RETRY_MAX_MS);
    Duration::from_millis(backoff / 2 + random.random_below(backoff / 2 + 1))
}

/// Reads a `Retry-After` value: delay-seconds, or an HTTP date (RFC 9110 §10.2.3) from `now`.
pub fn parse_retry_after(value: &str, now: chrono::DateTime<chrono::Utc>) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = at.with_timezone(&chrono::Utc) - now;
    Some(wait.to_std().unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_domain::ids::{AttemptId, IdempotencyKey, OperationId};
    use opledger_runtime::system::RandomIds;

    /// The "random" number is always the largest allowed; no ids are drawn.
    struct Highest;
    impl IdSource for Highest {
        fn new_operation_id(&self) -> OperationId {
            unreachable!("a pause draws no ids")
        }
        fn new_attempt_id(&self) -> AttemptId {
            unreachable!("a pause draws no ids")
        }
        fn new_idempotency_key(&self) -> IdempotencyKey {
            unreachable!("a pause draws no ids")
        }
        fn random_below(&self, bound: u64) -> u64 {
            bound.saturating_sub(1)
        }
    }

    #[test]
    fn pauses_double_from_a_second_to_an_hour_with_jitter_below_the_backoff() {
        assert_eq!(
            pause(1, None, &Highest),
            Duration::from_millis(RETRY_FIRST_MS)
        );
        assert_eq!(
            pause(2, None, &Highest),
            Duration::from_millis(2 * RETRY_FIRST_MS)
        );
        assert_eq!(
            pause(u32::MAX, None, &Highest),
            Duration::from_millis(RETRY_MAX_MS)
        );
        for failures in 1..60 {
            let paused = pause(failures, None, &RandomIds);
            assert!(paused >= Duration::from_millis(RETRY_FIRST_MS / 2));
            assert!(paused <= Duration::from_millis(RETRY_MAX_MS));
        }
    }

    #[test]
    fn retry_after_sets_the_pause_within_its_bound() {
        let asked = Some(Duration::from_secs(7));
        assert_eq!(pause(9, asked, &RandomIds), Duration::from_secs(7));
        let huge = Some(Duration::from_secs(10 * MAX_RETRY_AFTER_S));
        assert_eq!(
            pause(1, huge, &RandomIds),
            Duration::from_secs(MAX_RETRY_AFTER_S)
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-03T08:00:00Z")
            .expect("a time")
            .with_timezone(&chrono::Utc);
        assert_eq!(parse_retry_after(" 3 ", now), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_retry_after("Thu, 03 Dec 2026 08:00:10 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after("Thu, 03 Dec 2026 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn three_days_of_retries_take_about_eighty_attempts() {
        let mut elapsed = 0u64;
        let mut attempts = 1u32;
        while elapsed <= DEFAULT_RETRY_WINDOW_S * 1_000 {
            elapsed += u64::try_from(pause(attempts, None, &Highest).as_millis()).expect("small");
            attempts += 1;
        }
        assert!((70..=90).contains(&attempts), "{attempts}");
    }
}
