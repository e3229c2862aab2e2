//! The end-to-end execution scenarios (`tests/execution`) once more, with the ledger in the
//! KurrentDB store on the protocol stand instead of a SQLite file: the whole suite is this one
//! module, so a scenario added there runs here too; `support::backend()` picks KurrentDB by this
//! binary's name.

#[path = "execution/main.rs"]
mod execution;
