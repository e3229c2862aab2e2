//! The delivery journal as a port: what an endpoint's task and the operators' actions need from
//! wherever checkpoints, states, attempts and leases are kept.
//!
//! Two implementations: the SQLite file beside the ledger (`journal.rs`, the embedded default,
//! where one process owns the ledger and a lease is trivially its own), and tables in a shared
//! PostgreSQL database (adapters/postgres, wired in the server), where several instances share
//! one journal and each endpoint is delivered by one of them at a time.
//!
//! # Leases
//! An instance delivers an endpoint only while it holds the endpoint's lease: a holder name and a
//! `token` that grows with every acquisition, stored with the endpoint. A free or expired lease is
//! taken by whichever instance asks first; the holder renews it well before it runs out. Every
//! write that moves the checkpoint or disables the endpoint on behalf of a delivery names the
//! lease it was made under and does nothing once another instance has taken the lease (its
//! token changed): an instance that lost its lease — stalled, cut off, believed dead — cannot
//! move the checkpoint the new holder is working from. Attempt rows are written unfenced: they
//! are history, and a loser's last attempt did happen.
//!
//! An implementation must never grant a lease that another holder holds unexpired, and never let
//! a fenced write through under a token that is not the current one.

use std::future::Future;
use std::pin::Pin;

use crate::journal::{AttemptRecord, EndpointRecord, EndpointStatus};
use crate::WebhookError;

/// What every journal call returns: boxed, so the journal can be chosen at start-up
/// (`Arc<dyn DeliveryJournal>`); one allocation per call, nothing beside an fsync or a round trip.
pub type JournalFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, WebhookError>> + Send + 'a>>;

/// A lease held on one endpoint: the fence a delivery's writes carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The endpoint.
    pub endpoint: String,
    /// The instance holding it.
    pub holder: String,
    /// Grows with every acquisition; a write under an older token is refused.
    pub token: u64,
}

/// What asking for a lease gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// The lease is this instance's now.
    Held(Lease),
    /// Another instance holds it unexpired.
    HeldBy(String),
}

/// Where checkpoints, states, attempts and leases are kept.
pub trait DeliveryJournal: Send + Sync + 'static {
    /// Whether several instances may share this journal: leases are then taken, renewed and
    /// polled; otherwise the one process holds every lease for ever.
    fn shared(&self) -> bool;

    /// Every endpoint defined through the API: its id and its definition (JSON text, read by
    /// `managed.rs`), in id order.
    fn definitions(&self) -> JournalFuture<'_, Vec<(String, String)>>;

    /// Writes (`Some`) or deletes (`None`) an endpoint's definition.
    fn define(&self, endpoint: &str, definition: Option<String>) -> JournalFuture<'_, ()>;

    /// The endpoint's record, created with `start` as its checkpoint when it has none.
    fn ensure(&self, endpoint: &str, start: Option<u64>) -> JournalFuture<'_, EndpointRecord>;

    /// The endpoint's record (`None`: it was never configured here).
    fn record(&self, endpoint: &str) -> JournalFuture<'_, Option<EndpointRecord>>;

    /// Moves the checkpoint to `position` if the endpoint is still at `epoch` and `lease` is
    /// still the current one; `false` (nothing written) otherwise.
    fn advance(&self, lease: &Lease, epoch: u64, position: u64) -> JournalFuture<'_, bool>;

    /// Sets the status (and, with `replay_after`, the checkpoint) and bumps the epoch. With
    /// `fence`, only if the endpoint is still at that epoch under that lease (a delivery task
    /// disabling what it was delivering); `false` when nothing was written. Operators' actions
    /// carry no fence: they work from any instance.
    fn set_status(
        &self,
        endpoint: &str,
        status: EndpointStatus,
        reason: Option<String>,
        replay_after: Option<Option<u64>>,
        fence: Option<(u64, &Lease)>,
    ) -> JournalFuture<'_, bool>;

    /// Records one failed attempt (unfenced: it happened).
    fn record_attempt(&self, attempt: AttemptRecord) -> JournalFuture<'_, ()>;

    /// Records a batch of successful attempts of one endpoint (in delivery order) and moves its
    /// checkpoint to `checkpoint` (at or after their last event) in one commit or statement, if
    /// the endpoint is still at `epoch` under `lease`; `false` (the attempts recorded, the
    /// checkpoint not moved) otherwise. A batch is written only after all of its deliveries
    /// succeeded, so a crash before the commit repeats them and never skips one.
    fn record_deliveries(
        &self,
        attempts: Vec<AttemptRecord>,
        lease: &Lease,
        epoch: u64,
        checkpoint: u64,
    ) -> JournalFuture<'_, bool>;

    /// The endpoint's latest attempts, newest first, at most `limit`.
    fn attempts(&self, endpoint: &str, limit: u64) -> JournalFuture<'_, Vec<AttemptRecord>>;

    /// The endpoint's attempts at any of `positions` (the events of one operation), newest
    /// first, at most [`crate::journal::MAX_ATTEMPTS_LISTED`]. This default looks among the
    /// endpoint's latest [`crate::journal::MAX_ATTEMPTS_LISTED`] attempts only; a journal with
    /// an index on the position (the SQLite file's) answers from all it keeps.
    fn attempts_at(
        &self,
        endpoint: &str,
        positions: &[u64],
    ) -> JournalFuture<'_, Vec<AttemptRecord>> {
        let positions: std::collections::BTreeSet<u64> = positions.iter().copied().collect();
        let latest = self.attempts(endpoint, crate::journal::MAX_ATTEMPTS_LISTED);
        Box::pin(async move {
            Ok(latest
                .await?
                .into_iter()
                .filter(|attempt| positions.contains(&attempt.position))
                .collect())
        })
    }

    /// Takes the endpoint's lease for `holder` for `lease_ms` if it is free or expired.
    fn acquire(&self, endpoint: &str, holder: &str, lease_ms: u64) -> JournalFuture<'_, Acquired>;

    /// Extends `lease` by `lease_ms` from now; the endpoint's epoch if it is still held, `None`
    /// when another instance has taken it.
    fn renew(&self, lease: &Lease, lease_ms: u64) -> JournalFuture<'_, Option<u64>>;

    /// Gives `lease` up, so another instance takes the endpoint without waiting for it to run
    /// out; nothing when it is no longer held.
    fn release(&self, lease: &Lease) -> JournalFuture<'_, ()>;
}
