//! Conversions between the read models' values and SQLite's.
//!
//! Times are stored as RFC 3339 text in UTC with exactly nine fractional digits, so they read
//! well in any SQLite shell *and* sort as text in time order — which the queries' `ORDER BY` and
//! range conditions rely on. A stored value that does not convert back is reported as corrupt,
//! never guessed.

use chrono::{DateTime, SecondsFormat, Utc};
use opledger_domain::ids::{GlobalPosition, OperationId, StreamVersion};
use opledger_domain::timestamp;
use rusqlite::types::{ToSql, ToSqlOutput, ValueRef};

use super::ReadModelError;

/// A time as stored.
pub(super) fn time(value: DateTime<Utc>) -> String {
    value.to_rfc3339_opts(SecondsFormat::Nanos, true)
}

/// A time as stored ([`time`]'s text), formatted into a buffer on the stack: binding it to a
/// statement copies no heap string. Writing a row formats up to five times and the ids beside
/// them, and chrono's general formatter with a `String` each was a measurable share of a rebuild.
pub(super) enum TimeText {
    /// Years 0 to 9999, the shape [`time`] writes: `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ`.
    Fixed([u8; TIME_TEXT_BYTES]),
    /// Any other year, which chrono writes with a sign and more digits.
    Other(String),
}

/// The length of a stored time in years 0 to 9999.
const TIME_TEXT_BYTES: usize = 30;

impl TimeText {
    pub(super) fn new(value: DateTime<Utc>) -> Self {
        use chrono::{Datelike, Timelike};
        let year = value.year();
        // A leap second's nanoseconds go past 999,999,999; chrono writes those its own way.
        let nanos = value.nanosecond();
        if !(0..=9999).contains(&year) || nanos > 999_999_999 {
            return Self::Other(time(value));
        }
        let mut text = *b"0000-00-00T00:00:00.000000000Z";
        let mut digits = |at: usize, width: usize, mut number: u32| {
            for index in (at..at + width).rev() {
                text[index] = b'0' + (number % 10) as u8;
                number /= 10;
            }
        };
        // `year` is within 0..=9999 (checked above).
        digits(0, 4, year as u32);
        digits(5, 2, value.month());
        digits(8, 2, value.day());
        digits(11, 2, value.hour());
        digits(14, 2, value.minute());
        digits(17, 2, value.second());
        digits(20, 9, nanos);
        Self::Fixed(text)
    }

    pub(super) fn as_str(&self) -> &str {
        match self {
            Self::Fixed(text) => {
                std::str::from_utf8(text).expect("the digits and separators are ASCII")
            }
            Self::Other(text) => text,
        }
    }
}

impl ToSql for TimeText {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(ValueRef::Text(
            self.as_str().as_bytes(),
        )))
    }
}

/// An id's UUID as stored (hyphenated, lowercase), in a buffer on the stack.
pub(super) struct UuidText([u8; uuid::fmt::Hyphenated::LENGTH]);

impl UuidText {
    pub(super) fn new(value: uuid::Uuid) -> Self {
        let mut text = [0; uuid::fmt::Hyphenated::LENGTH];
        value.hyphenated().encode_lower(&mut text);
        Self(text)
    }
}

impl ToSql for UuidText {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(ValueRef::Text(&self.0)))
    }
}

/// The request of an intent as `operations.request_hash` stores it (schema version 5): the first
/// 8 bytes of the SHA-256 of its five columns, each preceded by its length (so no two requests
/// give the same bytes), as SQLite's signed integer. Stable across builds and machines, because
/// it is stored: not std's or foldhash's hash, whose output may change with their versions. The
/// index on it is a fifth of the size of one on the five texts, and each of its comparisons one
/// integer's; two requests sharing a hash are told apart by their columns (`find_similar`).
pub(super) fn request_hash(request: [&str; 5]) -> i64 {
    request_hash_of_digest(request_digest(request))
}

/// [`request_hash`] from the request's [`request_digest`], for a caller that has the digest
/// already: the digest's low 8 bytes are the same first 8 bytes of the SHA-256.
pub(super) fn request_hash_of_digest(digest: u128) -> i64 {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the low 8 bytes (the SHA-256's first, little-endian) are the hash"
    )]
    let low = digest as u64;
    i64::from_le_bytes(low.to_le_bytes())
}

/// The first 128 bits of the same SHA-256 as [`request_hash`]: what a rebuild's similar-intent
/// window keys a request by instead of its five texts. Two different requests would share it
/// only through a collision of 128 bits of SHA-256 (by chance ~2^-128 per pair; none has ever
/// been found), so the window still answers exactly as the runner's lookup of the texts.
pub(super) fn request_digest(request: [&str; 5]) -> u128 {
    let mut first = [0; 16];
    first.copy_from_slice(&request_sha256(request)[..16]);
    u128::from_le_bytes(first)
}

/// SHA-256 of the request's five texts, each preceded by its length (so that no two different
/// requests are the same byte string).
fn request_sha256(request: [&str; 5]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for column in request {
        hasher.update((column.len() as u64).to_le_bytes());
        hasher.update(column.as_bytes());
    }
    hasher.finalize().into()
}

/// An operation id as stored.
pub(super) fn operation_text(value: OperationId) -> UuidText {
    UuidText::new(value.as_uuid())
}

/// A stored time.
pub(super) fn time_from(text: &str) -> Result<DateTime<Utc>, ReadModelError> {
    timestamp::parse(text).ok_or_else(|| corrupt(format!("`{text}` is not a stored time")))
}

/// A stored optional time.
pub(super) fn opt_time_from(text: Option<String>) -> Result<Option<DateTime<Utc>>, ReadModelError> {
    text.as_deref().map(time_from).transpose()
}

/// A position as stored; positions beyond SQLite's integers cannot be stored.
pub(super) fn position(value: GlobalPosition) -> Result<i64, ReadModelError> {
    i64::try_from(value.value()).map_err(|_| ReadModelError::Corrupt {
        reason: format!("position {value} is beyond what SQLite can store"),
    })
}

/// A stored position.
pub(super) fn position_from(value: i64) -> Result<GlobalPosition, ReadModelError> {
    u64::try_from(value)
        .map(GlobalPosition::new)
        .map_err(|_| corrupt(format!("a stored position is negative ({value})")))
}

/// A stream version as stored.
pub(super) fn version(value: StreamVersion) -> Result<i64, ReadModelError> {
    i64::try_from(value.value()).map_err(|_| ReadModelError::Corrupt {
        reason: format!("stream version {value} is beyond what SQLite can store"),
    })
}

/// A stored stream version.
pub(super) fn version_from(value: i64) -> Result<StreamVersion, ReadModelError> {
    u64::try_from(value)
        .map(StreamVersion::new)
        .map_err(|_| corrupt(format!("a stored stream version is negative ({value})")))
}

/// A stored operation id.
pub(super) fn operation_from(text: &str) -> Result<OperationId, ReadModelError> {
    text.parse()
        .map_err(|error| corrupt(format!("stored operation id: {error}")))
}

/// A stored count.
pub(super) fn count_from(value: i64) -> Result<u64, ReadModelError> {
    u64::try_from(value).map_err(|_| corrupt(format!("a stored count is negative ({value})")))
}

/// A stored small count (attempts, lookups).
pub(super) fn small_count_from(value: i64) -> Result<u32, ReadModelError> {
    u32::try_from(value).map_err(|_| corrupt(format!("a stored count is out of range ({value})")))
}

/// A stored text id of type `T`, validated as the domain validates it.
pub(super) fn id_from<T, E: std::fmt::Display>(
    text: String,
    make: impl FnOnce(String) -> Result<T, E>,
) -> Result<T, ReadModelError> {
    make(text).map_err(|error| corrupt(format!("stored id: {error}")))
}

pub(super) fn corrupt(reason: String) -> ReadModelError {
    ReadModelError::Corrupt { reason }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn the_request_hash_stays_the_stored_one_when_cut_from_the_digest() {
        use sha2::{Digest, Sha256};
        // Written independently of `request_sha256`: version 5's files hold these values, so
        // making the hash from the digest must not change one.
        let request = ["tenant", "crm", "acct", "create_task", "sha256:ab"];
        let mut hasher = Sha256::new();
        for column in request {
            hasher.update((column.len() as u64).to_le_bytes());
            hasher.update(column.as_bytes());
        }
        let sha: [u8; 32] = hasher.finalize().into();
        let mut first = [0; 8];
        first.copy_from_slice(&sha[..8]);
        assert_eq!(request_hash(request), i64::from_le_bytes(first));
        assert_eq!(
            request_hash_of_digest(request_digest(request)),
            request_hash(request)
        );
    }

    #[test]
    fn times_and_ids_formatted_on_the_stack_are_the_stored_text_exactly() {
        let times = [
            Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0)
                .single()
                .expect("valid"),
            Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0)
                .single()
                .expect("valid"),
            Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59)
                .single()
                .expect("valid")
                + chrono::Duration::nanoseconds(999_999_999),
            Utc.with_ymd_and_hms(2026, 2, 3, 4, 5, 6)
                .single()
                .expect("valid")
                + chrono::Duration::nanoseconds(7),
            DateTime::<Utc>::MIN_UTC,
            DateTime::<Utc>::MAX_UTC,
            DateTime::<Utc>::UNIX_EPOCH,
        ];
        for value in times {
            assert_eq!(TimeText::new(value).as_str(), time(value), "{value:?}");
        }
        let leap = chrono::NaiveDate::from_ymd_opt(2016, 12, 31)
            .and_then(|day| day.and_hms_nano_opt(23, 59, 59, 1_500_000_000))
            .expect("a leap second")
            .and_utc();
        assert_eq!(TimeText::new(leap).as_str(), time(leap));
        let id = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        let stored = UuidText::new(id);
        let ToSqlOutput::Borrowed(ValueRef::Text(text)) = stored.to_sql().expect("binds") else {
            panic!("an id binds as text");
        };
        assert_eq!(text, id.to_string().as_bytes());
    }

    #[test]
    fn stored_times_sort_as_text_in_time_order_and_round_trip() {
        let base = Utc
            .with_ymd_and_hms(2026, 11, 30, 9, 0, 0)
            .single()
            .expect("valid");
        let times = [
            base,
            base + chrono::Duration::nanoseconds(1),
            base + chrono::Duration::milliseconds(100),
            base + chrono::Duration::seconds(1),
        ];
        let stored: Vec<String> = times.iter().copied().map(time).collect();
        let mut sorted = stored.clone();
        sorted.sort();
        assert_eq!(stored, sorted);
        for (value, text) in times.iter().zip(&stored) {
            assert_eq!(time_from(text).expect("parses"), *value);
        }
    }
}
