//! How operation events are written to and read from a store: a type name, JSON data, and JSON
//! metadata carrying the schema version.
//!
//! JSON, because auditors read the ledger years later with tools we do not control, and because
//! KurrentDB shows JSON events as they are. Decoding never guesses: an unknown type or schema
//! version is an error that names the stream and version, not a silently skipped event.

use serde::{Deserialize, Serialize};

use crate::chain::{self, ChainHash};
use crate::event::{
    ApprovalDenied, ApprovalGranted, AttemptNotSent, AttemptRejected, AttemptStarted,
    AttemptSucceeded, DuplicateDetected, IntentRecorded, LateResponseReceived, LeaseExpired,
    LookupClaimed, LookupPostponed, OperationEvent, OutcomeUnknown, ReconciliationRecorded,
    RetryScheduled, ReviewRequired, ReviewResolved, SendPostponed,
};
use crate::ids::{EventId, OperationId, StreamVersion};
use crate::store::{EventData, RecordedEvent};

/// The schema version this build writes, and the newest it reads.
pub const SCHEMA_VERSION: u32 = 1;

/// The metadata this build writes, as bytes.
/// The metadata this build writes starts with these bytes, followed by the chain hash (64 hex
/// digits) and `"}`; recognised without a JSON parse, because replay decodes millions.
const METADATA_PREFIX: &[u8] = br#"{"schema_version":1,"chain":""#;
const METADATA_SUFFIX: &[u8] = br#""}"#;
/// A chain hash's length in hex digits.
const CHAIN_HEX_LEN: usize = 64;

/// The metadata stored beside every event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventMetadata {
    /// The schema version of the event's data.
    pub schema_version: u32,
    /// The event's link in its stream's hash chain (see [`crate::chain`]), as hex.
    #[serde(default)]
    pub chain: Option<String>,
    /// The W3C `traceparent` of the span that wrote the event, when trace export is on (see
    /// [`crate::trace_context`]): a later drive joins the caller's trace through it, and people
    /// see each attempt's trace id. Metadata, not data: it is no part of the fact, the event's
    /// id or its hash chain, and two deliveries of one decision may well carry different ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
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
    SendPostponed,
    LeaseExpired,
    ReconciliationRecorded,
    RetryScheduled,
    ReviewRequired,
    ReviewResolved,
    LateResponseReceived,
    DuplicateDetected,
    LookupClaimed,
    LookupPostponed,
);

/// Encodes the event that will sit at `version` of `operation`'s stream. Its id is derived from
/// the operation, the version and the content, so re-sending the same append is recognised as
/// already written while a different decision at that version conflicts
/// (see [`EventId::for_operation_event`]).
///
/// The metadata carries the event's chain hash, linked to `previous` (the chain hash of the
/// stream's event before it; `None` for the first); the new hash is returned for the next event.
pub fn encode(
    operation: OperationId,
    version: StreamVersion,
    event: &OperationEvent,
    previous: Option<&ChainHash>,
) -> (EventData, ChainHash) {
    let event_type = event.type_name();
    let data = event
        .encode_data()
        .expect("operation events are plain data and always serialize");
    let chain = chain::link(previous, version, event_type, &data);
    let metadata = EventMetadata {
        schema_version: SCHEMA_VERSION,
        chain: Some(chain.to_hex()),
        // One atomic load when trace export is off.
        traceparent: crate::trace_context::current(),
    };
    let encoded = EventData {
        event_id: EventId::for_operation_event(operation, version, event.at(), event_type, &data),
        event_type: event_type.to_owned(),
        data,
        metadata: serde_json::to_vec(&metadata)
            .expect("metadata is plain data and always serializes"),
    };
    (encoded, chain)
}

/// The chain hash a stored event carries, if it carries a well-formed one.
pub fn chain_of(metadata: &[u8]) -> Option<ChainHash> {
    // Only the exact shape is the fast path: metadata with a `traceparent` after the chain also
    // starts with the prefix and ends with the suffix.
    if let Some(hex) = metadata
        .strip_prefix(METADATA_PREFIX)
        .and_then(|rest| rest.strip_suffix(METADATA_SUFFIX))
        .filter(|hex| hex.len() == CHAIN_HEX_LEN)
    {
        return ChainHash::parse_hex(std::str::from_utf8(hex).ok()?);
    }
    let parsed: EventMetadata = serde_json::from_slice(metadata).ok()?;
    ChainHash::parse_hex(parsed.chain.as_deref()?)
}

/// The `traceparent` a stored event's metadata carries, if any. Metadata in exactly the shape
/// written without telemetry is recognised without a JSON parse.
pub fn traceparent_of(metadata: &[u8]) -> Option<String> {
    if metadata.starts_with(METADATA_PREFIX) && metadata.ends_with(METADATA_SUFFIX) {
        let hex_len = metadata.len() - METADATA_PREFIX.len() - METADATA_SUFFIX.len();
        if hex_len == CHAIN_HEX_LEN {
            return None;
        }
    }
    let parsed: EventMetadata = serde_json::from_slice(metadata).ok()?;
    parsed.traceparent
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
    let metadata = if recorded.metadata.starts_with(METADATA_PREFIX) {
        EventMetadata {
            schema_version: SCHEMA_VERSION,
            chain: None,
            traceparent: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_written_before_budget_waits_were_recorded_still_decodes_and_writes_the_same_bytes() {
        use crate::event::BudgetWait;
        use crate::ids::{AccountId, AttemptId, WorkerId};
        let older = br#"{"attempt_id":"00000000-0000-0000-0000-000000000007","attempt_number":1,"worker":"w","lease_deadline":"2026-03-01T12:00:30Z","at":"2026-03-01T12:00:00Z"}"#;
        let OperationEvent::AttemptStarted(started) =
            OperationEvent::decode_data("AttemptStarted", older)
                .expect("a known type")
                .expect("decodes")
        else {
            panic!("a claim");
        };
        assert_eq!(started.budget_wait, None);
        assert_eq!(
            started.attempt_id,
            AttemptId::from_uuid(uuid::Uuid::from_u128(7))
        );
        assert_eq!(started.worker, WorkerId::new("w").expect("valid"));
        // Without a wait the data is byte for byte what it was, so its hash chain link is too.
        let again = OperationEvent::AttemptStarted(started.clone());
        assert_eq!(again.encode_data().expect("encodes"), older.to_vec());
        let waited = OperationEvent::AttemptStarted(crate::event::AttemptStarted {
            budget_wait: Some(BudgetWait {
                account: AccountId::new("main").expect("valid"),
                budget: "lookups".into(),
                waited_ms: 1_200,
            }),
            ..started
        });
        let data = String::from_utf8(waited.encode_data().expect("encodes")).expect("utf-8");
        assert!(
            data.contains(
                r#""budget_wait":{"account":"main","budget":"lookups","waited_ms":1200}"#
            ),
            "{data}"
        );
    }

    #[test]
    fn the_recognised_metadata_bytes_are_what_encode_writes() {
        let chain = chain::link(None, StreamVersion::FIRST, "T", b"{}");
        let metadata = serde_json::to_vec(&EventMetadata {
            schema_version: SCHEMA_VERSION,
            chain: Some(chain.to_hex()),
            traceparent: None,
        })
        .expect("serializes");
        assert!(metadata.starts_with(METADATA_PREFIX) && metadata.ends_with(METADATA_SUFFIX));
        assert_eq!(chain_of(&metadata), Some(chain));
        let spaced = format!(r#"{{ "chain": "{chain}", "schema_version": 1 }}"#);
        assert_eq!(
            chain_of(spaced.as_bytes()),
            Some(chain),
            "other spellings parse too"
        );
    }

    #[test]
    fn metadata_with_a_traceparent_still_yields_its_chain_and_its_traceparent() {
        let chain = chain::link(None, StreamVersion::FIRST, "T", b"{}");
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let metadata = serde_json::to_vec(&EventMetadata {
            schema_version: SCHEMA_VERSION,
            chain: Some(chain.to_hex()),
            traceparent: Some(traceparent.into()),
        })
        .expect("serializes");
        assert_eq!(chain_of(&metadata), Some(chain));
        assert_eq!(traceparent_of(&metadata).as_deref(), Some(traceparent));
        let without = serde_json::to_vec(&EventMetadata {
            schema_version: SCHEMA_VERSION,
            chain: Some(chain.to_hex()),
            traceparent: None,
        })
        .expect("serializes");
        assert_eq!(traceparent_of(&without), None);
    }
}
