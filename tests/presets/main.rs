//! The connector presets for real APIs, end to end: for each preset, a real `opledger serve`
//! child process sends to a loopback emulator of that API (`emulators/`), and the article's
//! failures are played against it — each test asserts what the emulator stores (exactly one
//! object, or none and a person) and what the ledger says.
//!
//! The scenarios are written once (`scenarios.rs`) over the [`apis::Api`] trait and generated
//! for every preset by a macro, as the store conformance suite is.

mod apis;
mod budgets;
#[allow(dead_code)] // the serve suite's OpenAPI checks; `support` calls what these tests need
#[path = "../serve/contract.rs"]
mod contract;
mod emulators;
mod ledger;
mod oauth;
mod scenarios;
mod specific;
#[allow(dead_code)] // the serve suite's harness; these tests use its server and HTTP helpers
#[path = "../serve/support.rs"]
mod support;
