//! How operation events are written to and read from a store: a type name, JSON data, and JSON
//! metadata carrying the schema version.
//!
//! JSON, because auditors read the ledger years later with tools we do not control, and because
//! KurrentDB shows JSON events as they are. Decoding never guesses: an unknown type or schema
//! version is an error that names the stream and version, not a silently skipped event.

use serde::{Deserialize, Serialize};

use crate::event::{
    ApprovalDenied, ApprovalGranted, AttemptNotSent, AttemptRejected, AttemptStarted,
    AttemptSucceeded, DuplicateDetected, IntentRecorded, LateResponseReceived, LeaseExpired,
    OperationEvent, OutcomeUnknown, ReconciliationRecorded, RetryScheduled, ReviewRequired,
    ReviewResolved,
};
use crate::ids::{EventId, OperationId, StreamVersion};
use crate::store::{EventData, RecordedEvent};

/// The schema version this build writes, and the newest it reads.
pub const SCHEMA_VERSION: u32 = 1;

/// The metadata this build writes, as bytes.
const CURRENT_METADATA: &[u8] = br#"{"schema_version":1}"#;

/// The metadata stored beside every event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventMetadata {
    /// The schema version of the event's data.
    pub schema_version: u32,
}

/// An event that could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The type name is not one this build knows.
    #[error("event {version} of `{stream}` has unknown type `{event_type}`; is this ledger from a newer opledger?")]
    UnknownType {
        /// The stream.
        stream: String,
        /// The event's version in it.
        version: StreamVersion,
        /// The unknown type name.
        event_type: String,
    },
    /// The schema version is newer than this build reads.
    #[error("event {version} of `{stream}` has schema version {found}; this opledger reads up to {SCHEMA_VERSION}")]
    UnsupportedSchema {
        /// The stream.
        stream: String,
        /// The event's version in it.
        version: StreamVersion,
        /// The schema version found.
        found: u32,
    },
    /// The data or metadata is not valid JSON of the expected shape.
    #[error("event {version} of `{stream}` ({event_type}) cannot be decoded: {reason}")]
    Malformed {
        /// The stream.
        stream: String,
        /// The event's version in it.
        version: StreamVersion,
        /// The event's type name.
        event_type: String,
        /// What serde said.
        reason: String,
    },
}

macro_rules! event_codec {
    ($($variant:ident),* $(,)?) => {
        impl OperationEvent {
            /// The type name stored with the event.
            pub fn type_name(&self) -> &'static str {
                match self {
                    $(Self::$variant(_) => stringify!($variant),)*
                }
            }

            fn encode_data(&self) -> Result<Vec<u8>, serde_json::Error> {
                match self {
                    $(Self::$variant(inner) => serde_json::to_vec(inner),)*
                }
            }

            fn decode_data(event_type: &str, data: &[u8]) -> Option<Result<Self, serde_json::Error>> {
                match event_type {
                    $(stringify!($variant) => Some(serde_json::from_slice::<$variant>(data).map(Self::$variant)),)*
                    _ => None,
                }
            }
        }
    };
}

event_codec!(
    IntentRecorded,
    ApprovalGranted,
    ApprovalDenied,
    AttemptStarted,
    AttemptSucceeded,
    AttemptRejected,
    OutcomeUnknown,
    AttemptNotSent,
    LeaseExpired,
    ReconciliationRecorded,
    RetryScheduled,
    ReviewRequired,
    ReviewResolved,
    LateResponseReceived,
    DuplicateDetected,
);

/// Encodes the event that will sit at `version` of `operation`'s stream. Its id is derived from
/// the operation, the version and the content, so re-sending the same append is recognised as
/// already written while a different decision at that version conflicts
/// (see [`EventId::for_operation_event`]).
pub fn encode(operation: OperationId, version: StreamVersion, event: &OperationEvent) -> EventData {
    let metadata = EventMetadata {
        schema_version: SCHEMA_VERSION,
    };
    let event_type = event.type_name();
    let data = event
        .encode_data()
        .expect("operation events are plain data and always serialize");
    EventData {
        event_id: EventId::for_operation_event(operation, version, event_type, &data),
        event_type: event_type.to_owned(),
        data,
        metadata: serde_json::to_vec(&metadata)
            .expect("metadata is plain data and always serializes"),
    }
}

/// Decodes a stored event.
pub fn decode(recorded: &RecordedEvent) -> Result<OperationEvent, DecodeError> {
    let malformed = |reason: String| DecodeError::Malformed {
        stream: recorded.stream.to_string(),
        version: recorded.version,
        event_type: recorded.event_type.clone(),
        reason,
    };
    // Nearly every event carries exactly the metadata this build writes; recognise it without
    // parsing, because a replay decodes millions of them.
    let metadata = if recorded.metadata == CURRENT_METADATA {
        EventMetadata {
            schema_version: SCHEMA_VERSION,
        }
    } else {
        serde_json::from_slice(&recorded.metadata)
            .map_err(|error| malformed(format!("metadata: {error}")))?
    };
    if metadata.schema_version > SCHEMA_VERSION {
        return Err(DecodeError::UnsupportedSchema {
            stream: recorded.stream.to_string(),
            version: recorded.version,
            found: metadata.schema_version,
        });
    }
    match OperationEvent::decode_data(&recorded.event_type, &recorded.data) {
        Some(decoded) => decoded.map_err(|error| malformed(error.to_string())),
        None => Err(DecodeError::UnknownType {
            stream: recorded.stream.to_string(),
            version: recorded.version,
            event_type: recorded.event_type.clone(),
        }),
    }
}
