//! Conversions between the port's types and PostgreSQL's values.
//!
//! PostgreSQL's `bigint` is signed, the port's versions and positions unsigned; a stored value
//! that does not convert back is reported as corrupt, never wrapped or truncated.

use opledger_domain::ids::{EventId, GlobalPosition, StreamVersion};
use opledger_domain::store::{RecordedEvent, StoreError, StreamName};
use tokio_postgres::Row;

/// The columns of a full event row, in the order [`event`] reads them.
pub(crate) const EVENT_COLUMNS: &str =
    "position, stream, version, event_id, event_type, data, metadata";

/// A stream version as stored; `None` beyond what a `bigint` holds.
pub(crate) fn version_to_sql(version: StreamVersion) -> Option<i64> {
    i64::try_from(version.value()).ok()
}

/// A global position as stored; `None` beyond what a `bigint` holds.
pub(crate) fn position_to_sql(position: GlobalPosition) -> Option<i64> {
    i64::try_from(position.value()).ok()
}

/// The version of the last event of an append of `count` events starting at `first`, as
/// stored; `None` past what a `bigint` holds.
pub(crate) fn last_version_after(first: StreamVersion, count: usize) -> Option<i64> {
    let count = i64::try_from(count).ok()?;
    version_to_sql(first)?.checked_add(count - 1)
}

pub(crate) fn version(value: i64) -> Result<StreamVersion, StoreError> {
    u64::try_from(value)
        .map(StreamVersion::new)
        .map_err(|_| StoreError::Corrupt {
            reason: format!("a stored stream version is negative ({value})"),
        })
}

pub(crate) fn position(value: i64) -> Result<GlobalPosition, StoreError> {
    match u64::try_from(value) {
        Ok(position) if position >= 1 => Ok(GlobalPosition::new(position)),
        _ => Err(StoreError::Corrupt {
            reason: format!("a stored position is below 1 ({value})"),
        }),
    }
}

/// One event row, selected with [`EVENT_COLUMNS`].
pub(crate) fn event(row: &Row) -> Result<RecordedEvent, StoreError> {
    let stream: String = row.get(1);
    Ok(RecordedEvent {
        position: position(row.get(0))?,
        stream: StreamName::new(stream).map_err(|_| StoreError::Corrupt {
            reason: "a stored stream name is not valid".into(),
        })?,
        version: version(row.get(2))?,
        event_id: EventId::from_uuid(row.get(3)),
        event_type: row.get(4),
        data: row.get(5),
        metadata: row.get(6),
    })
}
