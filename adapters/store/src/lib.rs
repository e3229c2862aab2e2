//! Event stores: implementations of the domain's [`EventStore`] port.
//!
//! - [`memory::MemoryStore`] keeps everything in process memory, for unit tests and simulation.
//! - [`sqlite::SqliteStore`] keeps one SQLite file with group commit, the embedded default.
//! - [`kurrentdb::KurrentDbStore`] keeps the ledger in a KurrentDB (EventStoreDB) cluster, for
//!   several `opledger serve` instances sharing one ledger; the server applies its own rules.
//! - `opledger_postgres::PostgresStore` (its own crate) keeps the ledger in a PostgreSQL
//!   database, for the same.
//!
//! The memory, SQLite and PostgreSQL stores apply the same append rules and share one catch-up
//! subscription (both in `opledger-store-core`), so they cannot drift apart in what they accept or deliver. A store must
//! never acknowledge an append that is not durable for its kind, and never skip or repeat an event
//! in a subscription.
//!
//! [`EventStore`]: opledger_domain::store::EventStore

/// The ledger file when none is named (`--db`, `OPLEDGER_DB`, a server's `store`), in the working
/// directory.
pub const DEFAULT_SQLITE_PATH: &str = "opledger.db";

pub mod either;
pub mod kurrentdb;
pub mod memory;
pub mod sqlite;

use opledger_store_core::{rules, subscription};

pub use either::{AnyStore, AnySubscription};
pub use kurrentdb::{KurrentDbError, KurrentDbStore, KurrentDbSubscription};
pub use memory::{MemoryStore, MemorySubscription};
/// The PostgreSQL store's crate: its settings, limits and start-up refusals.
pub use opledger_postgres as postgres;
pub use opledger_postgres::{PostgresStore, PostgresSubscription};
pub use sqlite::{CommitStats, SqliteOptions, SqliteStore, SqliteSubscription};
