//! End-to-end execution: the article's checklist played against real parts — a SQLite ledger
//! file, the fault-injecting CRM stand on a loopback port, the HTTP adapters, the engine, the
//! in-process workers, and one real child process killed with SIGKILL.
//!
//! Every test checks three things: how many objects the CRM holds for the operation (counted at
//! the stand, not believed from the ledger), the state the operation ends in, and the events
//! that got it there.
//!
//! - [`lost_messages`]: a request that never arrived, a response that was lost, a response that
//!   came too late, a search index that lags;
//! - [`crash`]: a worker killed between the CRM's answer and recording it;
//! - [`concurrency`]: two workers on one operation, and the background workers;
//! - [`identity`]: redelivery after a restart, a new request with the same text, changed
//!   arguments under an old source id;
//! - [`contract`]: a switched account, rotated credentials, a key past its retention;
//! - [`sentence`]: what the agent may say, following the state;
//! - [`record_and_execute`]: recording and executing in one call, the intent and the claim in
//!   one append.
//!
//! The one ignored test is the entry point of the SIGKILL child process, run by [`crash`].

mod concurrency;
mod contract;
mod crash;
mod identity;
mod lost_messages;
#[path = "../postgres_server/mod.rs"]
mod postgres_server;
mod record_and_execute;
mod sentence;
mod support;
