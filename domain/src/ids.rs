//! Identifiers of the ledger, each its own type so one can never be passed where another belongs.
//!
//! Text ids are validated once, at construction: after that a value of the type is known to be
//! non-empty, bounded in length and free of control characters. Nothing here generates randomness;
//! random ids come in from the [`crate::ports::IdSource`] port.

use serde::{Deserialize, Serialize};
use std::fmt;
use uuid::Uuid;

use crate::error::ValidationError;

/// Longest text id the ledger accepts, in bytes.
pub const MAX_TEXT_ID_BYTES: usize = 256;

/// Namespace of every UUIDv5 opledger derives; fixed forever, because derived ids are stored.
const OPLEDGER_NAMESPACE: Uuid = Uuid::from_u128(0x6f70_6c65_6467_4572_8000_0000_0000_0001);

fn check_text(field: &'static str, value: &str) -> Result<(), ValidationError> {
    if value.trim().is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if value.len() > MAX_TEXT_ID_BYTES {
        return Err(ValidationError::new(
            field,
            format!(
                "is {} bytes long; the limit is {MAX_TEXT_ID_BYTES} bytes",
                value.len()
            ),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(ValidationError::new(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

macro_rules! text_id {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates and wraps the text; the error names the field and what is wrong.
            pub fn new(value: impl Into<String>) -> Result<Self, ValidationError> {
                let value = value.into();
                check_text($field, &value)?;
                Ok(Self(value))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = ValidationError;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

text_id!(
    /// The customer of opledger an operation belongs to; tenants never see each other's operations.
    TenantId,
    "tenant"
);
text_id!(
    /// The concrete account inside a provider (one CRM instance, one portal) an operation is bound to.
    AccountId,
    "account"
);
text_id!(
    /// The external system an operation changes, e.g. `hubspot` or `stand-keyed`.
    ProviderId,
    "provider"
);
text_id!(
    /// A fingerprint of the credentials used for an account, so a send with other credentials is caught.
    CredentialFingerprint,
    "credential_fingerprint"
);
text_id!(
    /// What the operation does at the provider, e.g. `create_task`.
    ActionName,
    "action"
);
text_id!(
    /// The id of the delivery that asked for the operation (a tool-call id, a queue message id).
    SourceId,
    "source_id"
);
text_id!(
    /// Who asked for the operation (a user or agent id); for audit, never part of identity.
    OwnerId,
    "owner"
);
text_id!(
    /// The worker that made an attempt; for incident reviews.
    WorkerId,
    "worker"
);
text_id!(
    /// A person who approved, denied or reviewed an operation.
    ActorId,
    "actor"
);
text_id!(
    /// The id the external system gave the object it created (e.g. task `731`).
    ExternalObjectId,
    "external_id"
);
text_id!(
    /// The provider's own id of one request, when it returns one; evidence for reconciliation.
    ProviderRequestId,
    "provider_request_id"
);
text_id!(
    /// The idempotency key sent with every attempt of one operation. Random; carries no personal data.
    IdempotencyKey,
    "idempotency_key"
);

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// Wraps a UUID that came from an [`crate::ports::IdSource`] or from storage.
            pub const fn from_uuid(value: Uuid) -> Self {
                Self(value)
            }

            /// The UUID inside.
            pub const fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = ValidationError;
            fn from_str(value: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(value).map(Self).map_err(|_| {
                    ValidationError::new($field, format!("`{value}` is not a UUID such as 6f1c2a3e-0b1d-4c5e-9f00-112233445566"))
                })
            }
        }
    };
}

uuid_id!(
    /// The stable identity of one requested side effect, for its whole life.
    OperationId,
    "operation_id"
);
uuid_id!(
    /// One try to carry an operation out over the network.
    AttemptId,
    "attempt_id"
);
uuid_id!(
    /// The id of one stored event: deterministic, so a retried append writes nothing twice.
    EventId,
    "event_id"
);

impl OperationId {
    /// The operation id of a delivery: the same (tenant, source id) always maps to the same id, so
    /// a redelivered tool call or queue message finds the operation it already created.
    ///
    /// ```
    /// use opledger_domain::ids::{OperationId, SourceId, TenantId};
    /// let tenant = TenantId::new("acme").unwrap();
    /// let call = SourceId::new("toolcall-17").unwrap();
    /// assert_eq!(OperationId::for_source(&tenant, &call), OperationId::for_source(&tenant, &call));
    /// let other = TenantId::new("globex").unwrap();
    /// assert_ne!(OperationId::for_source(&tenant, &call), OperationId::for_source(&other, &call));
    /// ```
    pub fn for_source(tenant: &TenantId, source: &SourceId) -> Self {
        // The separator is a control character, which ids may not contain, so
        // ("a", "b\u{1f}c") and ("a\u{1f}b", "c") can never collide.
        let name = format!("source\u{1f}{}\u{1f}{}", tenant.as_str(), source.as_str());
        Self(Uuid::new_v5(&OPLEDGER_NAMESPACE, name.as_bytes()))
    }
}

impl EventId {
    /// The id of the event that `operation`'s stream would hold at `version` with this type and
    /// data, written at `at` (the event's own time, part of its data).
    ///
    /// A UUIDv8: the first 48 bits are `at` in Unix milliseconds, the other 74 free bits are a
    /// SHA-256 over those milliseconds, the operation, the version and the content.
    ///
    /// The content is part of the id on purpose. Ids from (operation, version) alone would give
    /// every decision made at one version the same id, and a store that treats a re-append of
    /// known ids as "already written" would then acknowledge a *losing* writer's different events
    /// as if they were its own — two workers would both believe they claimed the send. With the
    /// content in the id, re-sending the same append is idempotent, and a different decision at
    /// the same version is the version conflict it must be.
    ///
    /// The time comes first so that ids made close in time sort close together: a store's index
    /// of event ids then grows at its end, where a hash-only id dirtied a random page of it per
    /// event (about 12 % of `bench http`'s throughput). It is still a function of the event alone,
    /// so a re-sent append carries the same ids.
    ///
    /// ```
    /// use chrono::{TimeZone, Utc};
    /// use opledger_domain::ids::{EventId, OperationId, StreamVersion};
    /// let operation = OperationId::from_uuid(uuid::Uuid::from_u128(1));
    /// let v1 = StreamVersion::new(1);
    /// let at = Utc.timestamp_millis_opt(1_700_000_000_000).unwrap();
    /// let a = EventId::for_operation_event(operation, v1, at, "AttemptStarted", br#"{"worker":"a"}"#);
    /// assert_eq!(a, EventId::for_operation_event(operation, v1, at, "AttemptStarted", br#"{"worker":"a"}"#));
    /// assert_ne!(a, EventId::for_operation_event(operation, v1, at, "AttemptStarted", br#"{"worker":"b"}"#));
    /// assert!(a.matches(operation, v1, "AttemptStarted", br#"{"worker":"a"}"#));
    /// ```
    pub fn for_operation_event(
        operation: OperationId,
        version: StreamVersion,
        at: chrono::DateTime<chrono::Utc>,
        event_type: &str,
        data: &[u8],
    ) -> Self {
        // Before 1970 or after the year 10889 cannot happen on a working clock; clamping keeps
        // the id well-formed anyway, and `matches` reads the milliseconds back from the id.
        let millis = u64::try_from(at.timestamp_millis())
            .unwrap_or(0)
            .min(MAX_ID_MILLIS);
        Self::timed(millis, operation, version, event_type, data)
    }

    /// Whether this id is the one derived for an event of `operation` at `version` with this
    /// type and data: what `opledger verify` checks to find edited or moved events. Ids of both
    /// schemes are recognised, the time-ordered one and the UUIDv5 one that ledgers written
    /// before it hold.
    pub fn matches(
        self,
        operation: OperationId,
        version: StreamVersion,
        event_type: &str,
        data: &[u8],
    ) -> bool {
        match self.0.get_version_num() {
            TIMED_VERSION => {
                let mut millis = [0_u8; 8];
                millis[2..].copy_from_slice(&self.0.as_bytes()[..6]);
                let millis = u64::from_be_bytes(millis);
                self == Self::timed(millis, operation, version, event_type, data)
            }
            5 => self == Self::hashed_v5(operation, version, event_type, data),
            _ => false,
        }
    }

    fn timed(
        millis: u64,
        operation: OperationId,
        version: StreamVersion,
        event_type: &str,
        data: &[u8],
    ) -> Self {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        hash.update(b"opledger event id v8\0");
        hash.update(millis.to_be_bytes());
        hash.update(operation.0.as_bytes());
        hash.update(version.0.to_be_bytes());
        hash.update(content_hash(event_type, data));
        let hash = hash.finalize();
        let mut bytes = [0_u8; 16];
        bytes[..6].copy_from_slice(&millis.to_be_bytes()[2..]);
        bytes[6..].copy_from_slice(&hash[..10]);
        // RFC 9562: version 8 in the high nibble of byte 6, variant 0b10 in the top of byte 8.
        bytes[6] = (bytes[6] & 0x0f) | (TIMED_VERSION as u8) << 4;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        Self(Uuid::from_bytes(bytes))
    }

    /// The scheme before time-ordered ids: UUIDv5 over the operation, the version and the
    /// content hash. Kept so ledgers written with it still verify.
    fn hashed_v5(
        operation: OperationId,
        version: StreamVersion,
        event_type: &str,
        data: &[u8],
    ) -> Self {
        let mut name = [0_u8; 56];
        name[..16].copy_from_slice(operation.0.as_bytes());
        name[16..24].copy_from_slice(&version.0.to_be_bytes());
        name[24..].copy_from_slice(&content_hash(event_type, data));
        Self(Uuid::new_v5(&OPLEDGER_NAMESPACE, &name))
    }
}

/// The UUID version of time-ordered event ids (RFC 9562's custom version).
const TIMED_VERSION: usize = 8;
/// The largest millisecond count 48 bits hold.
const MAX_ID_MILLIS: u64 = (1 << 48) - 1;

/// SHA-256 over an event's type and data, separated so no two pairs hash alike.
fn content_hash(event_type: &str, data: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut content = Sha256::new();
    content.update(event_type.as_bytes());
    content.update([0]);
    content.update(data);
    content.finalize().into()
}

/// The version of the last event in a stream; the first event of a stream has version 0
/// (KurrentDB's stream revision).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StreamVersion(u64);

impl StreamVersion {
    /// The version of a stream's first event.
    pub const FIRST: Self = Self(0);

    /// Wraps a raw stream version.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw version number.
    pub const fn value(self) -> u64 {
        self.0
    }

    /// The version that follows this one.
    pub const fn next(self) -> Self {
        Self(self.0 + 1)
    }
}

impl fmt::Display for StreamVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The position of an event in the store's global log; strictly increasing in commit order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GlobalPosition(u64);

impl GlobalPosition {
    /// Wraps a raw position.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw position number.
    pub const fn value(self) -> u64 {
        self.0
    }
}

impl fmt::Display for GlobalPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_ids_refuse_empty_oversized_and_control_text() {
        assert!(TenantId::new("").is_err());
        assert!(TenantId::new("   ").is_err());
        assert!(TenantId::new("a".repeat(MAX_TEXT_ID_BYTES + 1)).is_err());
        assert!(TenantId::new("a\nb").is_err());
        let error = AccountId::new("").unwrap_err();
        assert_eq!(error.field, "account");
        assert!(TenantId::new("acme").is_ok());
    }

    #[test]
    fn text_ids_refuse_invalid_values_when_deserialized() {
        let parsed: Result<TenantId, _> = serde_json::from_str("\"\"");
        assert!(parsed.is_err());
    }

    /// The id `the_time_ordered_event_id_of_an_event_is_pinned` derives, as first computed.
    const PINNED_V8_ID: &str = "018bcfe5-6800-8767-a2fa-3f4d7d48d543";

    fn at(millis: i64) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp_millis(millis).expect("a valid time")
    }

    #[test]
    fn event_ids_differ_by_operation_version_time_and_content_and_are_stable() {
        let a = OperationId::from_uuid(Uuid::from_u128(1));
        let b = OperationId::from_uuid(Uuid::from_u128(2));
        let v0 = StreamVersion::FIRST;
        let t = at(1_700_000_000_000);
        let id = |operation, version, time, kind: &str, data: &[u8]| {
            EventId::for_operation_event(operation, version, time, kind, data)
        };
        assert_eq!(id(a, v0, t, "T", b"{}"), id(a, v0, t, "T", b"{}"));
        assert_ne!(id(a, v0, t, "T", b"{}"), id(a, v0.next(), t, "T", b"{}"));
        assert_ne!(id(a, v0, t, "T", b"{}"), id(b, v0, t, "T", b"{}"));
        assert_ne!(id(a, v0, t, "T", b"{}"), id(a, v0, t, "U", b"{}"));
        assert_ne!(id(a, v0, t, "T", b"{}"), id(a, v0, t, "T", b"{ }"));
        let later = at(1_700_000_000_001);
        assert_ne!(id(a, v0, t, "T", b"{}"), id(a, v0, later, "T", b"{}"));
    }

    #[test]
    fn event_ids_sort_by_time_whatever_the_operation() {
        let newer_operation = OperationId::from_uuid(Uuid::from_u128(1));
        let older_operation = OperationId::from_uuid(Uuid::from_u128(u128::MAX));
        let first = EventId::for_operation_event(
            older_operation,
            StreamVersion::new(7),
            at(1_700_000_000_000),
            "T",
            b"{}",
        );
        let second = EventId::for_operation_event(
            newer_operation,
            StreamVersion::FIRST,
            at(1_700_000_000_001),
            "T",
            b"{}",
        );
        assert!(first.as_uuid() < second.as_uuid());
        assert_eq!(first.as_uuid().get_version_num(), 8);
        assert_eq!(first.as_uuid().get_variant(), uuid::Variant::RFC4122);
    }

    #[test]
    fn an_event_id_matches_only_its_own_operation_version_and_content() {
        let operation = OperationId::from_uuid(Uuid::from_u128(1));
        let v3 = StreamVersion::new(3);
        let id = EventId::for_operation_event(operation, v3, at(1_700_000_000_000), "T", b"{}");
        assert!(id.matches(operation, v3, "T", b"{}"));
        assert!(!id.matches(operation, v3, "T", b"{ }"));
        assert!(!id.matches(operation, v3.next(), "T", b"{}"));
        assert!(!id.matches(OperationId::from_uuid(Uuid::from_u128(2)), v3, "T", b"{}"));
        // Editing the time in the id is an edit too: the hash covers it.
        let mut edited = *id.as_uuid().as_bytes();
        edited[5] ^= 1;
        assert!(!EventId::from_uuid(Uuid::from_bytes(edited)).matches(operation, v3, "T", b"{}"));
    }

    #[test]
    fn an_event_id_written_by_the_earlier_uuid_v5_scheme_still_matches_its_event() {
        // Copied from a ledger the previous build wrote (`bench store`, 2026-11-30).
        let operation: OperationId = "d010d5d0-733b-4fd4-a5b1-a59a7aebe023"
            .parse()
            .expect("an operation id");
        let data = br#"{"attempt_id":"ca367eab-8f8a-40d9-a653-d444d85ded57","attempt_number":1,"worker":"bench-0","lease_deadline":"2026-11-30T01:40:06.351213371Z","at":"2026-11-30T01:39:36.351213371Z"}"#;
        let stored = EventId::from_uuid(
            "ec54049c-a996-5e5a-a22b-ee541ce827b6"
                .parse()
                .expect("a uuid"),
        );
        assert!(stored.matches(operation, StreamVersion::new(1), "AttemptStarted", data));
        assert!(!stored.matches(operation, StreamVersion::new(2), "AttemptStarted", data));
    }

    #[test]
    fn the_time_ordered_event_id_of_an_event_is_pinned() {
        // A change to the derivation would make every stored id look edited to `verify`.
        let operation = OperationId::from_uuid(Uuid::from_u128(1));
        let id = EventId::for_operation_event(
            operation,
            StreamVersion::new(1),
            at(1_700_000_000_000),
            "AttemptStarted",
            br#"{"worker":"a"}"#,
        );
        assert_eq!(id.as_uuid().to_string(), PINNED_V8_ID);
    }

    #[test]
    fn event_ids_of_the_earlier_uuid_v5_scheme_still_match_their_events() {
        let operation = OperationId::from_uuid(Uuid::from_u128(1));
        let v3 = StreamVersion::new(3);
        let legacy = EventId::hashed_v5(operation, v3, "T", b"{}");
        assert_eq!(legacy.as_uuid().get_version_num(), 5);
        assert!(legacy.matches(operation, v3, "T", b"{}"));
        assert!(!legacy.matches(operation, v3, "T", b"{ }"));
        // Neither another UUID version nor a random id passes.
        assert!(!EventId::from_uuid(Uuid::from_u128(42)).matches(operation, v3, "T", b"{}"));
    }
}
