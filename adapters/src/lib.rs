//! opledger's adapters: the technology behind the domain's ports, one technology per module.
//!
//! The event stores live in [`store`]: [`MemoryStore`] for unit tests and simulation, and
//! [`SqliteStore`], the embedded default. The real clock and randomness live in [`system`].
//! Nothing here decides what an operation may do; that is the domain's job. Adapters only keep
//! the ports' promises.

#[cfg(feature = "kurrentdb-stand")]
pub mod kurrentdb_stand;
pub mod provider;
pub mod readmodel;
pub mod stand;
pub mod store;
pub mod system;
pub mod workers;

pub use store::{kurrentdb::KurrentDbStore, memory::MemoryStore, sqlite::SqliteStore};
