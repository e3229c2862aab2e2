//! How long deliveries take, per endpoint: a histogram of the seconds from an event's first
//! attempt to the receiver's 2xx (one attempt: the request's round trip; a retried event: its
//! retries and their pauses too), and when the endpoint last answered 2xx. Kept in memory since
//! the service started, for `/metrics`; it must never hold up a delivery (a few additions under
//! the endpoint's own lock).

use std::time::Duration;

use chrono::{DateTime, Utc};

/// Upper bounds of the delivery latency histogram's buckets, in seconds: a receiver's round trip
/// (milliseconds) up to an event retried for minutes (a retry window is minutes to hours).
pub const DELIVERY_LATENCY_BUCKETS_S: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

const _: () = assert!(DELIVERY_LATENCY_BUCKETS_S[0] > 0.0);

/// An endpoint's delivery latencies and last success.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeliveryLatency {
    /// Deliveries per bucket of [`DELIVERY_LATENCY_BUCKETS_S`] (not cumulative), then those
    /// slower than the last bound.
    pub counts: [u64; DELIVERY_LATENCY_BUCKETS_S.len() + 1],
    /// The sum of every delivery's latency, in seconds.
    pub sum_s: f64,
    /// When the receiver last answered 2xx; `None` before its first delivery since the start.
    pub last_delivered_at: Option<DateTime<Utc>>,
}

impl DeliveryLatency {
    /// One delivery, `took` from its first attempt to the 2xx answered `at`.
    pub(crate) fn delivered(&mut self, took: Duration, at: DateTime<Utc>) {
        let seconds = took.as_secs_f64();
        let bucket = DELIVERY_LATENCY_BUCKETS_S
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(DELIVERY_LATENCY_BUCKETS_S.len());
        self.counts[bucket] += 1;
        self.sum_s += seconds;
        self.last_delivered_at = Some(self.last_delivered_at.map_or(at, |last| last.max(at)));
    }

    /// Deliveries counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_falls_in_the_first_bucket_that_holds_it_and_a_slow_one_beyond_the_last() {
        let mut latency = DeliveryLatency::default();
        let at = Utc::now();
        latency.delivered(Duration::from_millis(5), at);
        latency.delivered(Duration::from_millis(7), at);
        latency.delivered(Duration::from_secs(600), at);
        assert_eq!(latency.counts[0], 1, "5 ms is at the first bound");
        assert_eq!(latency.counts[1], 1);
        assert_eq!(latency.counts[DELIVERY_LATENCY_BUCKETS_S.len()], 1);
        assert_eq!(latency.count(), 3);
        assert!((latency.sum_s - 600.012).abs() < 1e-9);
        assert_eq!(latency.last_delivered_at, Some(at));
    }
}
