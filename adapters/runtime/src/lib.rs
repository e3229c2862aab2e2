//! opledger's process runtime: what a running opledger process needs beyond the ports' adapters.
//!
//! - [`system`]: the wall clock and the operating system's secure random source, behind the
//!   domain's `Clock` and `IdSource` ports.
//! - [`work_source`]: the port to the durable work queue the workers read.
//! - [`workers`]: the in-process workers that read the durable work queue and drive every
//!   due operation (a send, a sweep of an expired lease, a lookup) through the engine, with
//!   bounded concurrency and a clean shutdown.
//!
//! Nothing here decides what an operation may do (the domain's decider does) or how a provider is
//! spoken to (the providers crate does); the workers only choose *when* to ask the engine.

pub mod system;
pub mod work_source;
pub mod workers;
