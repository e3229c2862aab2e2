//! The end-to-end execution scenarios (`tests/execution`) once more, with the ledger in the
//! KurrentDB store on the protocol stand instead of a SQLite file: the same modules, compiled into
//! this second test binary, where `support::backend()` picks KurrentDB. The list mirrors
//! `tests/execution/main.rs`; a scenario module added there belongs here too.

#[path = "execution/concurrency.rs"]
mod concurrency;
#[path = "execution/contract.rs"]
mod contract;
#[path = "execution/crash.rs"]
mod crash;
#[path = "execution/identity.rs"]
mod identity;
#[path = "execution/lost_messages.rs"]
mod lost_messages;
#[path = "execution/record_and_execute.rs"]
mod record_and_execute;
#[path = "execution/sentence.rs"]
mod sentence;
#[path = "execution/support.rs"]
mod support;
