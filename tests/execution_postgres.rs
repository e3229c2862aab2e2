//! The end-to-end execution scenarios (`tests/execution`) once more, with the ledger in the
//! PostgreSQL store on a private cluster this binary starts (`tests/postgres_server`), a
//! database per scenario: the whole suite is this one module, so a scenario added there runs
//! here too; `support::backend()` picks PostgreSQL by this binary's name.

#[path = "execution/main.rs"]
mod execution;
