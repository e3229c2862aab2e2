//! What the API and the CLI both show, rendered in one place so the two cannot drift apart: an
//! operation (a listed row, or a view read once from its stream), the readable timeline, events as
//! outcomes, review items, and read-model catch-up progress.
//!
//! Nothing here decides or writes anything: every function reads the ledger or the read models
//! and returns what to show.

mod operation;
mod outcome;
mod progress;
mod review;
pub mod timeline;

use opledger_domain::app::AppError;
use opledger_domain::ids::{OperationId, StreamVersion};
use opledger_domain::store::StoreError;
use opledger_readmodel::ReadModelError;

pub use operation::{
    operation_body, operation_json, resolve_as_of, view_as_of, view_of, AsOf, OperationBody,
    OperationView,
};
pub use outcome::{
    event_payload, outcome_after, outcome_json, outcome_of, state_through, wanted_types, Outcome,
    DEFAULT_TYPES, TYPES,
};
pub use progress::catch_up_showing_progress;
pub use review::{review_detail_json, review_item_json};

/// Why something could not be read to be shown.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The ledger refused or failed (an unknown operation, an event that does not decode).
    #[error("{0}")]
    App(#[from] AppError),
    /// The store failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The read models failed.
    #[error("{0}")]
    ReadModel(#[from] ReadModelError),
    /// The caller asked for something the log cannot answer (a moment past its head).
    #[error("{0}")]
    Invalid(#[from] opledger_domain::error::ValidationError),
    /// A stored event's data is not JSON (the ledger file was damaged or edited).
    #[error("event {version} of {operation_id} is not JSON: {reason}")]
    NotJson {
        /// The operation whose stream holds it.
        operation_id: OperationId,
        /// Its version in that stream.
        version: StreamVersion,
        /// What the JSON parser said.
        reason: String,
    },
}
