//! Conversions between the port's types and SQLite's values.
//!
//! SQLite integers are signed 64-bit, the port's versions and positions unsigned; a stored value
//! that does not convert back is reported as corrupt, never wrapped or truncated.

use opledger_domain::ids::{EventId, GlobalPosition, StreamVersion};
use opledger_domain::store::{EventView, RecordedEvent, StoreError, StreamName};
use uuid::Uuid;

/// The columns of a full event row, in the order [`EventRow::from_row`] reads them.
pub(super) const EVENT_COLUMNS: &str =
    "position, stream, version, event_id, event_type, data, metadata";

/// A stream version as SQLite stores it; `None` for a version beyond what SQLite can hold, which
/// therefore cannot be stored.
pub(super) fn version_to_sql(version: StreamVersion) -> Option<i64> {
    i64::try_from(version.value()).ok()
}

/// A global position as SQLite stores it; `None` for a position beyond what SQLite can hold.
pub(super) fn position_to_sql(position: GlobalPosition) -> Option<i64> {
    i64::try_from(position.value()).ok()
}

pub(super) fn version_from_sql(value: i64) -> Result<StreamVersion, StoreError> {
    u64::try_from(value)
        .map(StreamVersion::new)
        .map_err(|_| StoreError::Corrupt {
            reason: format!("a stored stream version is negative ({value})"),
        })
}

pub(super) fn position_from_sql(value: i64) -> Result<GlobalPosition, StoreError> {
    match u64::try_from(value) {
        Ok(position) if position >= 1 => Ok(GlobalPosition::new(position)),
        _ => Err(StoreError::Corrupt {
            reason: format!("a stored position is below 1 ({value})"),
        }),
    }
}

pub(super) fn event_id_from_sql(bytes: &[u8]) -> Result<EventId, StoreError> {
    Uuid::from_slice(bytes)
        .map(EventId::from_uuid)
        .map_err(|_| StoreError::Corrupt {
            reason: format!("a stored event id is {} bytes, not 16", bytes.len()),
        })
}

/// A row selected with [`EVENT_COLUMNS`], borrowed where SQLite holds it and checked as
/// [`EventRow::decode`] checks it; the outer error is SQLite's (a column of another type).
pub(super) fn view_row<'row>(
    row: &'row rusqlite::Row<'_>,
) -> rusqlite::Result<Result<EventView<'row>, StoreError>> {
    let position: i64 = row.get(0)?;
    let stream = borrowed(row, 1, rusqlite::types::ValueRef::as_str)?;
    let version: i64 = row.get(2)?;
    let event_id = borrowed(row, 3, rusqlite::types::ValueRef::as_blob)?;
    let event_type = borrowed(row, 4, rusqlite::types::ValueRef::as_str)?;
    let data = borrowed(row, 5, rusqlite::types::ValueRef::as_blob)?;
    let metadata = borrowed(row, 6, rusqlite::types::ValueRef::as_blob)?;
    let checked = || {
        StreamName::check(stream).map_err(|error| StoreError::Corrupt {
            reason: format!("the event at position {position} has an invalid stream name: {error}"),
        })?;
        Ok(EventView {
            stream,
            version: version_from_sql(version)?,
            position: position_from_sql(position)?,
            event_id: event_id_from_sql(event_id)?,
            event_type,
            data,
            metadata,
        })
    };
    Ok(checked())
}

/// Column `index` of `row` as `read` borrows it (text or bytes), refused as `row.get` refuses a
/// column of another type.
fn borrowed<'row, T: ?Sized>(
    row: &'row rusqlite::Row<'_>,
    index: usize,
    read: impl FnOnce(&rusqlite::types::ValueRef<'row>) -> rusqlite::types::FromSqlResult<&'row T>,
) -> rusqlite::Result<&'row T> {
    let value = row.get_ref(index)?;
    read(&value).map_err(|error| {
        rusqlite::Error::FromSqlConversionFailure(index, value.data_type(), Box::new(error))
    })
}

/// One event row as SQLite returned it, before its values are checked.
pub(super) struct EventRow {
    position: i64,
    stream: String,
    version: i64,
    event_id: Vec<u8>,
    event_type: String,
    data: Vec<u8>,
    metadata: Vec<u8>,
}

impl EventRow {
    /// Reads a row selected with [`EVENT_COLUMNS`].
    pub(super) fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            position: row.get(0)?,
            stream: row.get(1)?,
            version: row.get(2)?,
            event_id: row.get(3)?,
            event_type: row.get(4)?,
            data: row.get(5)?,
            metadata: row.get(6)?,
        })
    }

    /// The row as the port's event, refusing values the port cannot hold.
    pub(super) fn decode(self) -> Result<RecordedEvent, StoreError> {
        let stream = StreamName::new(self.stream).map_err(|error| StoreError::Corrupt {
            reason: format!(
                "the event at position {} has an invalid stream name: {error}",
                self.position
            ),
        })?;
        Ok(RecordedEvent {
            stream,
            version: version_from_sql(self.version)?,
            position: position_from_sql(self.position)?,
            event_id: event_id_from_sql(&self.event_id)?,
            event_type: self.event_type,
            data: self.data,
            metadata: self.metadata,
        })
    }
}
