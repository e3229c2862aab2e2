//! How event timestamps are written: RFC 3339 in UTC, e.g. `2026-11-30T09:00:00.123456789Z`.
//!
//! Readable by auditors and by every JSON tool. Reading them back is on the hot path of every
//! replay, so the one shape this module writes is parsed by hand; anything else (another offset,
//! a leap second) falls back to chrono's full RFC 3339 parser, so nothing valid is refused.

use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use serde::{de, Deserialize, Deserializer, Serializer};

/// Serializes a timestamp as RFC 3339 UTC with as many fractional digits as it needs.
pub fn serialize<S: Serializer>(value: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&value.to_rfc3339_opts(SecondsFormat::AutoSi, true))
}

/// Whether an event that happened `at` is in the log as of the moment `moment`: at or before it,
/// compared to the millisecond. One rule for every answer "as of a time" (the API's `as_of`,
/// `ops show --as-of`, `export --from/--to`), at the precision the export writes an event's time
/// in, so a time read off an exported line and given back names that line's event, whatever
/// digits beyond the millisecond the event's own record carries.
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use opledger_domain::timestamp::at_or_before;
/// let event = Utc.timestamp_nanos(1_700_000_000_123_456_789);
/// assert!(at_or_before(event, Utc.timestamp_millis_opt(1_700_000_000_123).unwrap()));
/// assert!(!at_or_before(event, Utc.timestamp_millis_opt(1_700_000_000_122).unwrap()));
/// ```
pub fn at_or_before(at: DateTime<Utc>, moment: DateTime<Utc>) -> bool {
    at.timestamp_millis() <= moment.timestamp_millis()
}

/// Parses an RFC 3339 timestamp.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<DateTime<Utc>, D::Error> {
    // Borrowed where the input allows, owned otherwise (e.g. a string with escapes).
    let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
    parse(&text).ok_or_else(|| de::Error::custom(format!("`{text}` is not an RFC 3339 timestamp")))
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fraction]Z` directly, and any other RFC 3339 form through chrono.
pub fn parse(text: &str) -> Option<DateTime<Utc>> {
    parse_utc(text.as_bytes()).or_else(|| {
        DateTime::parse_from_rfc3339(text)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    })
}

fn parse_utc(bytes: &[u8]) -> Option<DateTime<Utc>> {
    let (&b'Z', body) = bytes.split_last()? else {
        return None;
    };
    if body.len() < 19
        || body[4] != b'-'
        || body[7] != b'-'
        || body[10] != b'T'
        || body[13] != b':'
        || body[16] != b':'
    {
        return None;
    }
    let year = digits(&body[0..4])?;
    let month = digits(&body[5..7])?;
    let day = digits(&body[8..10])?;
    let hour = digits(&body[11..13])?;
    let minute = digits(&body[14..16])?;
    let second = digits(&body[17..19])?;
    let nanos = match &body[19..] {
        [] => 0,
        [b'.', fraction @ ..] if (1..=9).contains(&fraction.len()) => {
            digits(fraction)? * 10_u32.pow(9 - u32::try_from(fraction.len()).ok()?)
        }
        _ => return None,
    };
    // A leap second (60) and out-of-range fields make these `None`, and chrono decides.
    let date = NaiveDate::from_ymd_opt(i32::try_from(year).ok()?, month, day)?;
    let time = date.and_hms_nano_opt(hour, minute, second, nanos)?;
    Some(time.and_utc())
}

fn digits(bytes: &[u8]) -> Option<u32> {
    bytes.iter().try_fold(0_u32, |value, byte| {
        byte.is_ascii_digit()
            .then(|| value * 10 + u32::from(byte - b'0'))
    })
}

/// The same, for optional timestamps.
pub mod option {
    use super::*;

    /// Serializes `None` as null.
    pub fn serialize<S: Serializer>(
        value: &Option<DateTime<Utc>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => super::serialize(value, serializer),
            None => serializer.serialize_none(),
        }
    }

    /// Parses null as `None`.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<DateTime<Utc>>, D::Error> {
        let text = <Option<std::borrow::Cow<'de, str>>>::deserialize(deserializer)?;
        text.map(|text| {
            parse(&text)
                .ok_or_else(|| de::Error::custom(format!("`{text}` is not an RFC 3339 timestamp")))
        })
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    #[test]
    fn the_written_shape_is_parsed_exactly() {
        let at = Utc
            .with_ymd_and_hms(2026, 11, 30, 9, 5, 7)
            .single()
            .expect("valid");
        for nanos in [0, 100_000_000, 123_000_000, 123_456_000, 123_456_789] {
            let value = at + chrono::Duration::nanoseconds(nanos);
            let text = value.to_rfc3339_opts(SecondsFormat::AutoSi, true);
            assert_eq!(parse_utc(text.as_bytes()), Some(value), "{text}");
        }
    }

    #[test]
    fn other_rfc3339_forms_fall_back_to_chrono_and_garbage_is_refused() {
        let expected = Utc
            .with_ymd_and_hms(2026, 11, 30, 7, 0, 0)
            .single()
            .expect("valid");
        assert_eq!(parse("2026-11-30T09:00:00+02:00"), Some(expected));
        assert_eq!(parse("2026-11-30t07:00:00z"), Some(expected));
        for bad in [
            "",
            "Z",
            "2026-13-30T09:00:00Z",
            "2026-11-31T09:00:00Z",
            "2026-11-30T09:00:00.Z",
            "yesterday",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    proptest! {
        #[test]
        fn every_timestamp_survives_a_round_trip(seconds in 0_i64..253_402_300_799, nanos in 0_u32..1_000_000_000) {
            let value = DateTime::from_timestamp(seconds, nanos).expect("in range");
            let text = value.to_rfc3339_opts(SecondsFormat::AutoSi, true);
            prop_assert_eq!(parse(&text), Some(value));
        }
    }
}
