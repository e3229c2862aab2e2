//! opledger's domain: what an operation is, the rules it lives by, and the ports it needs.
//!
//! Nothing in this crate does I/O, reads a clock or draws random numbers: time, ids and keys
//! come in as arguments or through the ports in [`ports`] and [`store`], so every rule can be
//! tested as given-events / when-command / then-events with a simulated clock.

pub mod app;
pub mod args;
pub mod chain;
pub mod checkpoint;
pub mod codec;
pub mod command;
pub mod contract;
pub mod decider;
pub mod engine;
pub mod error;
pub mod event;
pub mod ids;
pub mod in_span;
pub mod merkle;
pub mod personal;
pub mod ports;
pub mod provider;
pub mod redact;
pub mod sentence;
pub mod state;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod timestamp;
pub mod trace_context;
pub mod verify;
