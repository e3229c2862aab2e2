//! Conversions between the read models' values and SQLite's.
//!
//! Times are stored as RFC 3339 text in UTC with exactly nine fractional digits, so they read
//! well in any SQLite shell *and* sort as text in time order — which the queries' `ORDER BY` and
//! range conditions rely on. A stored value that does not convert back is reported as corrupt,
//! never guessed.

use chrono::{DateTime, SecondsFormat, Utc};
use opledger_domain::ids::{GlobalPosition, OperationId, StreamVersion};
use opledger_domain::timestamp;

use super::ReadModelError;

/// A time as stored.
pub(super) fn time(value: DateTime<Utc>) -> String {
    value.to_rfc3339_opts(SecondsFormat::Nanos, true)
}

/// An optional time as stored.
pub(super) fn opt_time(value: Option<DateTime<Utc>>) -> Option<String> {
    value.map(time)
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
