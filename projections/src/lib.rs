//! opledger's read models: pure folds from ledger events to what people and services query.
//!
//! A projection here takes one decoded event at a time and changes its read model; it does no
//! I/O, so the same fold serves a live subscription, a rebuild from position zero and a test.
//! It must never depend on anything but the events it is given, in log order.

pub mod context;
pub mod duplicates;
pub mod id_index;
pub mod metrics;
pub mod operations;
pub mod read_models;
pub mod review_queue;
pub mod totals;
pub mod work_queue;
