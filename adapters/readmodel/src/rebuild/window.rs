//! The similar-intent window: the intents recorded lately, by request, and a fixed-size filter
//! of the requests it let go of, so every lookup is answered as the runner's would be, from
//! memory or, when it reaches what was let go of, from the file.

use chrono::{DateTime, Duration, Utc};
use opledger_domain::event::IntentRecorded;
use opledger_projections::duplicates::{SimilarIntent, POSSIBLE_DUPLICATE_WINDOW_S};

use crate::apply::QueryBounds;
use crate::{apply, sql};

use super::FastMap;

/// Bits of the filter remembering the requests of the intents the window let go of: 16 MiB. At
/// [`RequestFilter::PROBES`] probes it answers "maybe" for a request it never saw about once in
/// 7 trillion lookups after a million distinct requests, once in 13 million after 3.3 million
/// (a 10M-event log), once in 550 after ten million. The first "maybe" is expensive: the file
/// is asked, so every open row is written and the indexes are built then and kept row by row
/// after (`Rebuilder::find_similar`). A 2 MiB filter said "maybe" six times on a log of 400,000
/// intents and cost that rebuild a quarter of its time.
pub(super) const REQUEST_FILTER_BITS: usize = 1 << 27;

/// The intents folded so far that were recorded at or after `floor`, by request: exactly the
/// rows the runner's lookup could find in that time range. The intents let go of (below `floor`)
/// are remembered only in a fixed-size filter of their requests, which never misses one: a lookup
/// whose window reaches below `floor` for a request the filter may have seen is answered from the
/// file instead. So the answers are always the runner's, and the memory is fixed.
pub(super) struct IntentWindow {
    pub(super) by_request: FastMap<RequestDigest, Vec<SimilarIntent>>,
    pub(super) entries: usize,
    /// Most entries held; at least 2.
    pub(super) max_entries: usize,
    pub(super) floor: DateTime<Utc>,
    pub(super) newest: DateTime<Utc>,
    pub(super) let_go: RequestFilter,
}

/// What [`IntentWindow::find`] knows.
pub(super) enum WindowAnswer {
    /// The runner's answer.
    Found(Vec<SimilarIntent>),
    /// The query reaches intents the window let go of: ask the file.
    AskTheFile,
}

impl IntentWindow {
    pub(super) fn new(max_entries: usize) -> Self {
        Self {
            by_request: FastMap::default(),
            entries: 0,
            max_entries,
            floor: DateTime::<Utc>::MIN_UTC,
            newest: DateTime::<Utc>::MIN_UTC,
            let_go: RequestFilter::new(),
        }
    }

    /// The earlier intents the runner's query would return, newest first (`key`: the query's
    /// request).
    pub(super) fn find(&self, key: RequestDigest, query: QueryBounds) -> WindowAnswer {
        if query.from < self.floor && self.let_go.may_contain(key) {
            return WindowAnswer::AskTheFile;
        }
        let Some(candidates) = self.by_request.get(&key) else {
            return WindowAnswer::Found(Vec::new());
        };
        let mut found = Vec::new();
        apply::add_similar(&mut found, candidates, query);
        WindowAnswer::Found(found)
    }

    pub(super) fn insert(&mut self, key: RequestDigest, intent: SimilarIntent) {
        self.newest = self.newest.max(intent.recorded_at);
        if intent.recorded_at < self.floor {
            self.let_go.insert(key);
            return;
        }
        self.by_request.entry(key).or_default().push(intent);
        self.entries += 1;
        if self.entries > self.max_entries {
            self.narrow();
        }
    }

    /// Lets go of the intents too old to matter to the newest ones, and of the older half if
    /// that is not enough (a burst of intents within one window). Intents recorded at the same
    /// time as the middle one go too: with many at one time (an injected clock, a hand-written
    /// log) keeping them would keep the window over its limit.
    pub(super) fn narrow(&mut self) {
        let span = Duration::seconds(2 * POSSIBLE_DUPLICATE_WINDOW_S);
        let by_age = self.newest.checked_sub_signed(span).unwrap_or(self.newest);
        self.raise_floor(by_age);
        if self.entries > self.max_entries / 2 {
            let mut times: Vec<DateTime<Utc>> = self
                .by_request
                .values()
                .flatten()
                .map(|intent| intent.recorded_at)
                .collect();
            let middle = times.len() / 2;
            let (_, median, _) = times.select_nth_unstable(middle);
            let above_median = median
                .checked_add_signed(Duration::nanoseconds(1))
                .unwrap_or(*median);
            self.raise_floor(above_median);
        }
        assert!(
            self.entries <= self.max_entries,
            "narrowing keeps the intent window within its limit"
        );
    }

    pub(super) fn raise_floor(&mut self, floor: DateTime<Utc>) {
        if floor <= self.floor {
            return;
        }
        self.floor = floor;
        let let_go = &mut self.let_go;
        self.by_request.retain(|key, intents| {
            let before = intents.len();
            intents.retain(|intent| intent.recorded_at >= floor);
            if intents.len() < before {
                let_go.insert(*key);
            }
            !intents.is_empty()
        });
        self.entries = self.by_request.values().map(Vec::len).sum();
    }
}

/// A request as the similar-intent window keys it: [`sql::request_digest`] of its five names,
/// 16 bytes instead of five strings. The window held ~65,000 keys of five heap strings each
/// (~20 MiB, all copied from the intent), and hashing, comparing and dropping them was a few
/// per cent of the fold; a lookup in the file (rare) is asked with the whole query.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct RequestDigest(pub(super) u128);

impl RequestDigest {
    #[cfg(test)]
    pub(super) fn of(query: &opledger_projections::duplicates::SimilarIntentQuery) -> Self {
        Self(sql::request_digest([
            query.tenant.as_str(),
            query.provider.as_str(),
            query.account.as_str(),
            query.action.as_str(),
            query.args_hash.as_str(),
        ]))
    }

    /// The digest of the request `intent` makes: the same as of its query
    /// ([`duplicates::similar_intent_query`]), from the intent's own names, uncopied.
    pub(super) fn of_intent(intent: &IntentRecorded) -> Self {
        Self(sql::request_digest([
            intent.tenant.as_str(),
            intent.provider.as_str(),
            intent.account.as_str(),
            intent.action.as_str(),
            intent.args_hash.as_str(),
        ]))
    }

    /// The row's `request_hash` of the same request.
    pub(super) fn row_hash(self) -> i64 {
        sql::request_hash_of_digest(self.0)
    }

    /// 32 bits of the digest, from bit `shift` up.
    pub(super) fn low_bits(self, shift: u32) -> u64 {
        u64::try_from((self.0 >> shift) & 0xffff_ffff).expect("32 bits fit")
    }
}

/// A Bloom filter of requests: fixed size, no false negatives, and false positives that only
/// cost a lookup in the file.
pub(super) struct RequestFilter {
    pub(super) bits: Vec<u64>,
}

impl RequestFilter {
    /// Probes per request. Twelve, not the six of before: with six, a 10M-event log (3.3
    /// million requests, ~40 bits of the filter each) drew three false "maybe"s, each rebuild's
    /// first one building every index mid-way; twelve is nearer the optimum for that load
    /// (ln 2 × bits per request) and no worse at ten million requests. A request never seen
    /// stops at its first clear bit, so only inserts pay the extra probes.
    pub(super) const PROBES: u64 = 12;

    pub(super) fn new() -> Self {
        Self {
            bits: vec![0; REQUEST_FILTER_BITS / 64],
        }
    }

    /// The bits of `key`, by double hashing two 32-bit parts of its digest (SHA-256 bits, so
    /// independent; and fixed, so a rebuild's "maybe"s, and so its time, are the same on every
    /// run over one log).
    pub(super) fn probes(key: RequestDigest) -> impl Iterator<Item = usize> {
        let (first, step) = (key.low_bits(0), key.low_bits(32) | 1);
        (0..Self::PROBES).map(move |probe| {
            // The modulus is a power of two below 2^32, so the value fits any usize.
            (first.wrapping_add(probe.wrapping_mul(step)) % REQUEST_FILTER_BITS as u64) as usize
        })
    }

    pub(super) fn insert(&mut self, key: RequestDigest) {
        for bit in Self::probes(key) {
            self.bits[bit / 64] |= 1 << (bit % 64);
        }
    }

    pub(super) fn may_contain(&self, key: RequestDigest) -> bool {
        Self::probes(key).all(|bit| self.bits[bit / 64] & (1 << (bit % 64)) != 0)
    }
}
