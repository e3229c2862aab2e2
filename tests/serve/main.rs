//! `opledger serve` end to end: a real child process on a real SQLite file, talked to over real
//! HTTP, sending to the CRM stand on loopback.

mod as_of;
mod claims;
mod connections;
mod console;
mod contract;
mod erasure;
mod fuzz;
mod idempotency;
mod inputs;
mod install;
mod instances;
mod isolation;
mod kurrentdb;
mod lifecycle;
mod limits;
mod mcp;
mod npm;
mod numbers;
mod postgres;
#[path = "../postgres_server/mod.rs"]
mod postgres_server;
mod probes;
mod python;
mod redelivery;
mod review_search;
mod security;
mod shutdown;
mod soak;
mod steps;
mod storage_faults;
mod stream;
mod support;
mod telemetry;
mod transparency;
mod typescript;
mod webhooks;
