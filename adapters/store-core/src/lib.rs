//! What the event stores share, in a crate of its own so that both `opledger-store` (memory,
//! SQLite, KurrentDB) and `opledger-postgres` depend on it; the store crate depends on the
//! PostgreSQL crate (its `AnyStore` holds either), so the shared parts cannot live in either.
//!
//! - [`rules`]: the append rules every store applies (what an append may carry, what to do with
//!   it given the stream's last version, how refusals are worded);
//! - [`subscription`]: the catch-up subscription, gap-free and repeat-free, over a store's log
//!   and its published head;
//! - [`marks`]: what a store remembers of its log beside the events (for `opledger verify`);
//! - [`queue`]: the way a store's callers hand appends to its single writer and wait for the
//!   answer.
//!
//! It holds decisions and plumbing, never storage: nothing here may read or write a database.

#![forbid(unsafe_code)]

pub mod marks;
pub mod queue;
pub mod rules;
pub mod subscription;
