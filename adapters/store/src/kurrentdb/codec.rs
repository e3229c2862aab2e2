//! Conversions between the port's events and the client's, and the position mapping.
//!
//! Positions: KurrentDB orders `$all` by (commit, prepare) byte offsets. Every event written
//! through the gRPC API is its own self-committed log record, so its commit and prepare positions
//! are equal, and that one number is the port's [`GlobalPosition`]; a checkpoint of one number
//! therefore names both parts exactly, and `LogStart::After(p)` is the server position (p, p).
//! Only events of legacy explicit transactions (the old TCP API) have commit ≠ prepare; this
//! adapter never writes those, and refuses to read one as corrupt rather than let a checkpoint
//! lose half of its position and skip events on resume.

use bytes::Bytes;
use kurrentdb::{EventData as ClientEvent, Position, ResolvedEvent};
use opledger_domain::ids::{EventId, GlobalPosition, StreamVersion};
use opledger_domain::store::{EventData, RecordedEvent, StoreError, StreamName};

/// The server position a port position stands for.
pub(super) fn server_position(position: GlobalPosition) -> Position {
    Position {
        commit: position.value(),
        prepare: position.value(),
    }
}

/// The port position of an event's server position; refuses a split one (see the module docs).
pub(super) fn port_position(position: Position) -> Result<GlobalPosition, StoreError> {
    if position.commit != position.prepare {
        return Err(StoreError::Corrupt {
            reason: format!(
                "an event at commit {} / prepare {} belongs to an explicit transaction; opledger streams are written one self-committed record per event",
                position.commit, position.prepare
            ),
        });
    }
    Ok(GlobalPosition::new(position.commit))
}

/// `(commit, prepare)` as one comparable value: `$all` order.
pub(super) fn order(position: Position) -> (u64, u64) {
    (position.commit, position.prepare)
}

/// The client's event for one of ours: the deterministic id, the type, the data (marked JSON when
/// it parses as JSON, so the server's UI and projections can read it; the bytes are kept exactly)
/// and our metadata as the event's custom metadata.
pub(super) fn client_event(event: &EventData) -> ClientEvent {
    let id = event.event_id.as_uuid();
    let metadata = Bytes::from(event.metadata.clone());
    let json = std::str::from_utf8(&event.data)
        .ok()
        .and_then(|text| serde_json::value::RawValue::from_string(text.to_owned()).ok())
        .and_then(|raw| ClientEvent::json(&event.event_type, &raw).ok());
    json.unwrap_or_else(|| ClientEvent::binary(&event.event_type, Bytes::from(event.data.clone())))
        .id(id)
        .metadata(metadata)
}

/// Our event for one the server returned; `namespace` is stripped from its stream name. `None`
/// for an event outside the namespace (another ledger's).
pub(super) fn recorded_event(
    resolved: &ResolvedEvent,
    namespace: &str,
) -> Result<Option<RecordedEvent>, StoreError> {
    let Some(event) = resolved.event.as_ref() else {
        return Err(StoreError::Corrupt {
            reason: "the server sent a read result without an event".into(),
        });
    };
    let Some(name) = event.stream_id().strip_prefix(namespace) else {
        return Ok(None);
    };
    Ok(Some(RecordedEvent {
        stream: StreamName::new(name)?,
        version: StreamVersion::new(event.revision),
        position: port_position(event.position)?,
        event_id: EventId::from_uuid(event.id),
        event_type: event.event_type.clone(),
        data: event.data.to_vec(),
        metadata: event.custom_metadata.to_vec(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_position_stands_for_equal_commit_and_prepare_parts() {
        let position = GlobalPosition::new(8_192);
        assert_eq!(port_position(server_position(position)), Ok(position));
        assert!(matches!(
            port_position(Position {
                commit: 9_000,
                prepare: 8_192
            }),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
