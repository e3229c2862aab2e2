//! The KurrentDB v1 gRPC messages the stand speaks, written by hand from the protocol's `.proto`
//! files (`streams.proto`, `shared.proto`, `serverfeatures.proto`, package
//! `event_store.client.*`). Only the subset the official client sends or expects is here; field
//! numbers are the protocol's, so the client's generated code and these structs interoperate on
//! the wire. Hand-written `prost` derives mean no `protoc` is needed to build or test.
//!
//! Never renumber a field: a wrong tag decodes as a missing field, silently.

#![allow(missing_docs)]
// Names and shapes are the protocol's: `ExpectedRevision`, `ExpectedAny`… and an event message
// far larger than a confirmation, exactly as the client's generated code has them.
#![allow(clippy::enum_variant_names, clippy::large_enum_variant)]

use std::collections::HashMap;

/// `event_store.client.Empty`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Empty {}

/// `event_store.client.UUID`: the client asks for the string form in reads and sends the
/// structured form in appends.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Uuid {
    #[prost(oneof = "uuid_value::Value", tags = "1, 2")]
    pub value: Option<uuid_value::Value>,
}

pub mod uuid_value {
    #[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
    pub struct Structured {
        #[prost(int64, tag = "1")]
        pub most_significant_bits: i64,
        #[prost(int64, tag = "2")]
        pub least_significant_bits: i64,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(message, tag = "1")]
        Structured(Structured),
        #[prost(string, tag = "2")]
        String(String),
    }
}

impl Uuid {
    /// The id as a `uuid::Uuid`, from either form; `None` when it is missing or malformed.
    pub fn to_uuid(&self) -> Option<uuid::Uuid> {
        match self.value.as_ref()? {
            uuid_value::Value::Structured(parts) => {
                // Two's-complement reinterpretation of the halves, exactly as the protocol
                // defines them; `as` is the conversion meant here.
                let high = u128::from(parts.most_significant_bits as u64);
                let low = u128::from(parts.least_significant_bits as u64);
                Some(uuid::Uuid::from_u128(high << 64 | low))
            }
            uuid_value::Value::String(text) => text.parse().ok(),
        }
    }

    /// The string form, which the client asks reads to use.
    pub fn string(id: uuid::Uuid) -> Self {
        Self {
            value: Some(uuid_value::Value::String(id.to_string())),
        }
    }
}

/// `event_store.client.StreamIdentifier`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StreamIdentifier {
    #[prost(bytes = "vec", tag = "3")]
    pub stream_name: Vec<u8>,
}

/// `event_store.client.streams.AppendReq`: one options message, then one proposed message per
/// event, on a client stream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AppendReq {
    #[prost(oneof = "append_req::Content", tags = "1, 2")]
    pub content: Option<append_req::Content>,
}

pub mod append_req {
    use super::*;

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Content {
        #[prost(message, tag = "1")]
        Options(Options),
        #[prost(message, tag = "2")]
        ProposedMessage(ProposedMessage),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Options {
        #[prost(message, optional, tag = "1")]
        pub stream_identifier: Option<StreamIdentifier>,
        #[prost(oneof = "ExpectedStreamRevision", tags = "2, 3, 4, 5")]
        pub expected_stream_revision: Option<ExpectedStreamRevision>,
    }

    #[derive(Clone, Copy, PartialEq, prost::Oneof)]
    pub enum ExpectedStreamRevision {
        #[prost(uint64, tag = "2")]
        Revision(u64),
        #[prost(message, tag = "3")]
        NoStream(Empty),
        #[prost(message, tag = "4")]
        Any(Empty),
        #[prost(message, tag = "5")]
        StreamExists(Empty),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProposedMessage {
        #[prost(message, optional, tag = "1")]
        pub id: Option<Uuid>,
        #[prost(map = "string, string", tag = "2")]
        pub metadata: HashMap<String, String>,
        #[prost(bytes = "vec", tag = "3")]
        pub custom_metadata: Vec<u8>,
        #[prost(bytes = "vec", tag = "4")]
        pub data: Vec<u8>,
    }
}

/// `event_store.client.streams.AppendResp`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AppendResp {
    #[prost(oneof = "append_resp::Result", tags = "1, 2")]
    pub result: Option<append_resp::Result>,
}

pub mod append_resp {
    use super::*;

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Result {
        #[prost(message, tag = "1")]
        Success(Success),
        #[prost(message, tag = "2")]
        WrongExpectedVersion(WrongExpectedVersion),
    }

    #[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
    pub struct Position {
        #[prost(uint64, tag = "1")]
        pub commit_position: u64,
        #[prost(uint64, tag = "2")]
        pub prepare_position: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Success {
        #[prost(oneof = "success::CurrentRevisionOption", tags = "1, 2")]
        pub current_revision_option: Option<success::CurrentRevisionOption>,
        #[prost(oneof = "success::PositionOption", tags = "3, 4")]
        pub position_option: Option<success::PositionOption>,
    }

    pub mod success {
        use super::*;

        #[derive(Clone, Copy, PartialEq, prost::Oneof)]
        pub enum CurrentRevisionOption {
            #[prost(uint64, tag = "1")]
            CurrentRevision(u64),
            #[prost(message, tag = "2")]
            NoStream(Empty),
        }

        #[derive(Clone, Copy, PartialEq, prost::Oneof)]
        pub enum PositionOption {
            #[prost(message, tag = "3")]
            Position(Position),
            #[prost(message, tag = "4")]
            NoPosition(Empty),
        }
    }

    /// Only the current fields (6 to 11); the 20.6.0-era fields 1 to 5 are left unset, as newer
    /// servers do.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WrongExpectedVersion {
        #[prost(oneof = "wrong::CurrentRevisionOption", tags = "6, 7")]
        pub current_revision_option: Option<wrong::CurrentRevisionOption>,
        #[prost(oneof = "wrong::ExpectedRevisionOption", tags = "8, 9, 10, 11")]
        pub expected_revision_option: Option<wrong::ExpectedRevisionOption>,
    }

    pub mod wrong {
        use super::*;

        #[derive(Clone, Copy, PartialEq, prost::Oneof)]
        pub enum CurrentRevisionOption {
            #[prost(uint64, tag = "6")]
            CurrentRevision(u64),
            #[prost(message, tag = "7")]
            CurrentNoStream(Empty),
        }

        #[derive(Clone, Copy, PartialEq, prost::Oneof)]
        pub enum ExpectedRevisionOption {
            #[prost(uint64, tag = "8")]
            ExpectedRevision(u64),
            #[prost(message, tag = "9")]
            ExpectedAny(Empty),
            #[prost(message, tag = "10")]
            ExpectedStreamExists(Empty),
            #[prost(message, tag = "11")]
            ExpectedNoStream(Empty),
        }
    }
}

/// `event_store.client.streams.ReadReq`: reads of a stream or of `$all`, and subscriptions.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ReadReq {
    #[prost(message, optional, tag = "1")]
    pub options: Option<read_req::Options>,
}

pub mod read_req {
    use super::*;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Options {
        #[prost(oneof = "StreamOption", tags = "1, 2")]
        pub stream_option: Option<StreamOption>,
        /// 0 forwards, 1 backwards.
        #[prost(int32, tag = "3")]
        pub read_direction: i32,
        #[prost(bool, tag = "4")]
        pub resolve_links: bool,
        #[prost(oneof = "CountOption", tags = "5, 6")]
        pub count_option: Option<CountOption>,
        #[prost(oneof = "FilterOption", tags = "7, 8")]
        pub filter_option: Option<FilterOption>,
        #[prost(message, optional, tag = "9")]
        pub uuid_option: Option<UuidOption>,
        #[prost(message, optional, tag = "10")]
        pub control_option: Option<ControlOption>,
    }

    pub const BACKWARDS: i32 = 1;

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum StreamOption {
        #[prost(message, tag = "1")]
        Stream(StreamOptions),
        #[prost(message, tag = "2")]
        All(AllOptions),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StreamOptions {
        #[prost(message, optional, tag = "1")]
        pub stream_identifier: Option<StreamIdentifier>,
        #[prost(oneof = "RevisionOption", tags = "2, 3, 4")]
        pub revision_option: Option<RevisionOption>,
    }

    #[derive(Clone, Copy, PartialEq, prost::Oneof)]
    pub enum RevisionOption {
        #[prost(uint64, tag = "2")]
        Revision(u64),
        #[prost(message, tag = "3")]
        Start(Empty),
        #[prost(message, tag = "4")]
        End(Empty),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AllOptions {
        #[prost(oneof = "AllOption", tags = "1, 2, 3")]
        pub all_option: Option<AllOption>,
    }

    #[derive(Clone, Copy, PartialEq, prost::Oneof)]
    pub enum AllOption {
        #[prost(message, tag = "1")]
        Position(Position),
        #[prost(message, tag = "2")]
        Start(Empty),
        #[prost(message, tag = "3")]
        End(Empty),
    }

    #[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
    pub struct Position {
        #[prost(uint64, tag = "1")]
        pub commit_position: u64,
        #[prost(uint64, tag = "2")]
        pub prepare_position: u64,
    }

    #[derive(Clone, Copy, PartialEq, prost::Oneof)]
    pub enum CountOption {
        #[prost(uint64, tag = "5")]
        Count(u64),
        #[prost(message, tag = "6")]
        Subscription(Empty),
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum FilterOption {
        #[prost(message, tag = "7")]
        Filter(FilterOptions),
        #[prost(message, tag = "8")]
        NoFilter(Empty),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FilterOptions {
        #[prost(oneof = "Filter", tags = "1, 2")]
        pub filter: Option<Filter>,
        #[prost(oneof = "Window", tags = "3, 4")]
        pub window: Option<Window>,
        #[prost(uint32, tag = "5")]
        pub checkpoint_interval_multiplier: u32,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Filter {
        #[prost(message, tag = "1")]
        StreamIdentifier(Expression),
        #[prost(message, tag = "2")]
        EventType(Expression),
    }

    #[derive(Clone, Copy, PartialEq, prost::Oneof)]
    pub enum Window {
        #[prost(uint32, tag = "3")]
        Max(u32),
        #[prost(message, tag = "4")]
        Count(Empty),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Expression {
        #[prost(string, tag = "1")]
        pub regex: String,
        #[prost(string, repeated, tag = "2")]
        pub prefix: Vec<String>,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct UuidOption {
        #[prost(oneof = "UuidContent", tags = "1, 2")]
        pub content: Option<UuidContent>,
    }

    #[derive(Clone, Copy, PartialEq, prost::Oneof)]
    pub enum UuidContent {
        #[prost(message, tag = "1")]
        Structured(Empty),
        #[prost(message, tag = "2")]
        String(Empty),
    }

    #[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
    pub struct ControlOption {
        #[prost(uint32, tag = "1")]
        pub compatibility: u32,
    }
}

/// `event_store.client.streams.ReadResp`: one message of a read or subscription stream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ReadResp {
    #[prost(oneof = "read_resp::Content", tags = "1, 2, 3, 4, 8")]
    pub content: Option<read_resp::Content>,
}

pub mod read_resp {
    use super::*;

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Content {
        #[prost(message, tag = "1")]
        Event(ReadEvent),
        #[prost(message, tag = "2")]
        Confirmation(SubscriptionConfirmation),
        #[prost(message, tag = "3")]
        Checkpoint(Checkpoint),
        #[prost(message, tag = "4")]
        StreamNotFound(StreamNotFound),
        #[prost(message, tag = "8")]
        CaughtUp(CaughtUp),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ReadEvent {
        #[prost(message, optional, tag = "1")]
        pub event: Option<RecordedEvent>,
        #[prost(message, optional, tag = "2")]
        pub link: Option<RecordedEvent>,
        #[prost(oneof = "EventPosition", tags = "3, 4")]
        pub position: Option<EventPosition>,
    }

    #[derive(Clone, Copy, PartialEq, prost::Oneof)]
    pub enum EventPosition {
        #[prost(uint64, tag = "3")]
        CommitPosition(u64),
        #[prost(message, tag = "4")]
        NoPosition(Empty),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RecordedEvent {
        #[prost(message, optional, tag = "1")]
        pub id: Option<Uuid>,
        #[prost(message, optional, tag = "2")]
        pub stream_identifier: Option<StreamIdentifier>,
        #[prost(uint64, tag = "3")]
        pub stream_revision: u64,
        #[prost(uint64, tag = "4")]
        pub prepare_position: u64,
        #[prost(uint64, tag = "5")]
        pub commit_position: u64,
        #[prost(map = "string, string", tag = "6")]
        pub metadata: HashMap<String, String>,
        #[prost(bytes = "vec", tag = "7")]
        pub custom_metadata: Vec<u8>,
        #[prost(bytes = "vec", tag = "8")]
        pub data: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SubscriptionConfirmation {
        #[prost(string, tag = "1")]
        pub subscription_id: String,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Checkpoint {
        #[prost(uint64, tag = "1")]
        pub commit_position: u64,
        #[prost(uint64, tag = "2")]
        pub prepare_position: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StreamNotFound {
        #[prost(message, optional, tag = "1")]
        pub stream_identifier: Option<StreamIdentifier>,
    }

    /// Sent once a subscription has delivered what was stored and goes live. The client maps a
    /// missing timestamp to "no details", which is what the stand sends.
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct CaughtUp {}
}

/// `event_store.client.server_features.SupportedMethods`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SupportedMethods {
    #[prost(message, repeated, tag = "1")]
    pub methods: Vec<SupportedMethod>,
    #[prost(string, tag = "2")]
    pub event_store_server_version: String,
}

/// `event_store.client.server_features.SupportedMethod`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SupportedMethod {
    #[prost(string, tag = "1")]
    pub method_name: String,
    #[prost(string, tag = "2")]
    pub service_name: String,
    #[prost(string, repeated, tag = "3")]
    pub features: Vec<String>,
}
