//! Outcome webhooks: the ledger's events delivered to configured URLs, signed per Standard
//! Webhooks, retried, from a durable per-endpoint checkpoint.
//!
//! Every endpoint has its own task following the global log from its own checkpoint (kept in the
//! delivery journal, `journal.rs`), so a crash or a restart repeats a delivery (at least once)
//! and never skips one, and a slow or dead endpoint falls behind on its own checkpoint without
//! holding back the ledger or the other endpoints. An endpoint receives its events one at a time
//! in log order: a receiver sees an operation's `unknown` before its `succeeded`, and a
//! checkpoint (the last position delivered) means "everything before it arrived". The price is
//! that one failing event holds back that endpoint's later ones until it is delivered or the
//! endpoint is disabled — which is what a receiver relying on order needs.
//!
//! What an event says (its type, tenant and payload) is not decided here: the service passes a
//! [`Render`] that reads it, so the agent's sentence is rendered where the API renders it.
//!
//! Memory per endpoint is bounded: [`MAX_QUEUE_EVENTS`] events read ahead of the one being
//! delivered, then the reading waits. Nothing here may hold the ledger's writer or read models.
//!
//! Files: `signing.rs` the signatures; `endpoint.rs` an endpoint and the SSRF rules;
//! `client.rs` one attempt over HTTP; `schedule.rs` the retry pauses; `port.rs` the journal's
//! port and its leases (one instance delivers an endpoint at a time); `journal.rs` the embedded
//! journal (checkpoints, states and attempt log in a SQLite file); `delivery.rs` an endpoint's
//! task; `service.rs` the handle the server holds (start, leases, overview, pause, resume,
//! replay, attempts).

#![forbid(unsafe_code)]

mod client;
mod delivery;
pub mod endpoint;
pub mod journal;
pub mod latency;
pub mod managed;
pub mod port;
pub mod schedule;
mod service;
pub mod signing;

use std::collections::BTreeSet;
use std::future::Future;

use chrono::{DateTime, Utc};
use opledger_domain::store::{RecordedEvent, StoreError};

pub use client::{
    CONNECT_TIMEOUT_MS, DEFAULT_REQUEST_TIMEOUT_MS, MAX_REQUEST_TIMEOUT_MS,
    MAX_RESPONSE_BODY_BYTES, MIN_REQUEST_TIMEOUT_MS,
};
pub use endpoint::Endpoint;
pub use journal::{AttemptRecord, EndpointRecord, EndpointStatus, Journal};
pub use latency::{DeliveryLatency, DELIVERY_LATENCY_BUCKETS_S};
pub use port::{Acquired, DeliveryJournal, JournalFuture, Lease};
pub use service::{DeliveryState, EndpointOverview, LeaseSettings, Webhooks};

/// Most events an endpoint's task reads ahead of the one it is delivering: the bound on its
/// memory however far behind it falls (a 64 KiB payload at most each, so 16 MiB at worst).
pub const MAX_QUEUE_EVENTS: usize = 256;
/// The largest payload sent, in bytes; a larger rendering is a fault of the renderer.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// Most endpoints one server delivers to.
pub const MAX_ENDPOINTS: usize = 64;
/// How many skipped events (filtered out) may pass before the checkpoint is written anyway, so a
/// restart after a long stretch of other tenants' events does not read it all again.
pub const CHECKPOINT_EVERY_SKIPPED: u64 = 1_000;
/// How long the log must be quiet before the checkpoint past skipped events is written, in
/// milliseconds: the endpoint's lag then reads 0 once it has gone through everything.
pub const CHECKPOINT_IDLE_MS: u64 = 200;
/// Most successful deliveries whose attempts and checkpoint wait to be written in one journal
/// commit: a burst costs one commit per this many deliveries instead of one each, and a crash
/// (SIGKILL, power loss) repeats at most this many deliveries, under their same `webhook-id`:
/// at least once, never skipped, since a batch is written only after all of it succeeded.
pub const CHECKPOINT_EVERY_DELIVERIES: usize = 100;
/// Longest a successful delivery waits for its attempt and checkpoint to be written, in
/// milliseconds: when the log is slower than a batch, the checkpoint (and the lag metric) trails
/// the deliveries by at most this.
pub const CHECKPOINT_DELIVERED_MS: u64 = 100;
// A batch never waits longer than skip progress does.
const _: () = assert!(CHECKPOINT_DELIVERED_MS <= CHECKPOINT_IDLE_MS);
// A batch is bounded in memory like the events read ahead (an attempt record each).
const _: () = assert!(CHECKPOINT_EVERY_DELIVERIES <= MAX_QUEUE_EVENTS);
/// The first pause after the journal or the log failed, in milliseconds.
pub const FAULT_RETRY_FIRST_MS: u64 = 100;
/// The longest pause after the journal or the log failed, in milliseconds.
pub const FAULT_RETRY_MAX_MS: u64 = 5_000;
const _: () = assert!(FAULT_RETRY_FIRST_MS <= FAULT_RETRY_MAX_MS);
/// How long an endpoint's lease lasts unrenewed when `webhook_lease_ms` is not set, in
/// milliseconds: how long a killed instance's endpoints wait before another instance takes them
/// over (plus one renewal period). Fifteen seconds: a few missed renewals on a loaded database do
/// not move an endpoint between instances, and a crash holds deliveries back for less than a
/// receiver's own retry would.
pub const DEFAULT_WEBHOOK_LEASE_MS: u64 = 15_000;
/// The shortest `webhook_lease_ms`: a renewal round trip to the journal must fit well within a
/// renewal period.
pub const MIN_WEBHOOK_LEASE_MS: u64 = 1_000;
/// The longest `webhook_lease_ms`: ten minutes of deliveries held back after a crash.
pub const MAX_WEBHOOK_LEASE_MS: u64 = 600_000;
const _: () = assert!(MIN_WEBHOOK_LEASE_MS <= DEFAULT_WEBHOOK_LEASE_MS);
const _: () = assert!(DEFAULT_WEBHOOK_LEASE_MS <= MAX_WEBHOOK_LEASE_MS);
/// Renewals per lease: a holder renews every `webhook_lease_ms / 3`, so two renewals in a row
/// may fail (a slow database) before it stops delivering.
pub const LEASE_RENEWALS_PER_LEASE: u64 = 3;
/// How much of the lease, in percent, the holder counts as valid from the moment it asked: it
/// stops delivering a fifth of the lease before the journal lets another instance take over.
pub const LEASE_VALID_PERCENT: u64 = 80;
// A renewal comes before the holder's own validity runs out.
const _: () = assert!(100 / LEASE_RENEWALS_PER_LEASE < LEASE_VALID_PERCENT);
const _: () = assert!(LEASE_VALID_PERCENT < 100);

/// How long a stop waits for a delivery attempt under way, in milliseconds: its answer is then
/// recorded and a planned restart does not repeat it; past this the attempt is dropped and
/// repeats after the restart. Well within serve's default shutdown grace (35 s).
pub const STOP_ATTEMPT_GRACE_MS: u64 = 5_000;

/// What an event of the log says to a subscriber: what [`Render`] returns.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// The friendly event type (`succeeded`, `needs_review`, …), which endpoints filter on; the
    /// payload's `type` is `operation.<kind>`.
    pub kind: &'static str,
    /// The tenant whose operation it is.
    pub tenant: String,
    /// When the event happened.
    pub at: DateTime<Utc>,
    /// The payload's `data`: never credentials or arguments' secrets.
    pub data: serde_json::Value,
    /// When `data` carries personal values (opened for the subscriber): an opaque token of the
    /// renderer's that [`Render::kept_answer`] seals the receiver's answers like. `None`: the
    /// answers are kept as they are.
    pub answer_seal: Option<String>,
}

/// Reads an event of the log as a [`Message`]; `None` for events no endpoint receives (outside
/// operation streams).
pub trait Render: Send + Sync + 'static {
    /// The message `event` carries when its kind is one of `kinds` (an endpoint's `events`);
    /// `None` for any other kind. An endpoint follows every event of the log (three or more per
    /// operation) and wants few of them: what is costly to render (the operation's state, folded
    /// from its stream) must be paid only for the kinds wanted.
    fn render(
        &self,
        event: &RecordedEvent,
        kinds: &BTreeSet<String>,
    ) -> impl Future<Output = Result<Option<Message>, String>> + Send;

    /// A receiver's answer to a failed delivery of `message`, as the journal keeps it (and the
    /// endpoint's health and a disabling reason quote it). A receiver may echo what it was sent,
    /// personal values included: a renderer that opened such values seals the answer under the
    /// same key (see [`Message::answer_seal`]), so an erasure of the person leaves it unreadable
    /// too. By default the answer is kept as it is.
    fn kept_answer(&self, message: &Message, answer: String) -> String {
        let _ = message;
        answer
    }
}

/// Why webhooks could not start or a delivery task had to pause.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The delivery journal failed.
    #[error("the webhook journal failed: {reason}")]
    Journal {
        /// What failed.
        reason: String,
    },
    /// The log could not be read.
    #[error("the log could not be read for webhooks: {0}")]
    Store(#[from] StoreError),
    /// An event could not be rendered as a message.
    #[error("event at position {position} could not be rendered for webhooks: {reason}")]
    Render {
        /// Its position.
        position: u64,
        /// Why.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("the webhook HTTP client could not be built: {reason}")]
    Client {
        /// Why.
        reason: String,
    },
    /// An operator asked to replay after a position the log has not reached.
    #[error("the log's newest position is {head}; a replay after {after} would skip every event until the log reached it, so give a position from 0 to {head}")]
    ReplayBeyondHead {
        /// The position asked for.
        after: u64,
        /// The log's newest position.
        head: u64,
    },
    /// The endpoint's checkpoint is beyond the log's newest position (the ledger was replaced by
    /// an older copy, or the journal was edited): nothing would be delivered until the log
    /// passed it, so the task stops and says so instead.
    #[error("the endpoint's checkpoint {checkpoint} is beyond the log's newest position {head}; events written until the log passes it would be skipped, so nothing is delivered: replay the endpoint from a position at or before {head}")]
    CheckpointBeyondHead {
        /// The checkpoint.
        checkpoint: u64,
        /// The log's newest position.
        head: u64,
    },
    /// An endpoint's definition cannot be used.
    #[error("{reason}")]
    Definition {
        /// What is wrong and what to do.
        reason: String,
    },
    /// This ledger keeps no delivery journal (KurrentDB), so no endpoint can be defined.
    #[error("webhooks need a journal every instance shares, and this ledger (KurrentDB) has none; keep the ledger in SQLite or PostgreSQL to deliver webhooks")]
    NoJournal,
    /// An operator named an endpoint that is not configured.
    #[error("no webhook endpoint `{id}` is configured")]
    NoSuchEndpoint {
        /// The name given.
        id: String,
    },
}
