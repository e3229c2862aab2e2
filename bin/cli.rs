//! The command line's shape: subcommands, flags and their help texts, and the one error type the
//! binary reports.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use opledger_domain::app::AppError;
use opledger_domain::error::ValidationError;
use opledger_domain::store::StoreError;

/// The file the embedded store uses when none is named.
pub const DEFAULT_DB: &str = "opledger.db";

/// opledger — an event-sourced ledger that makes an AI agent's side effects happen once.
///
/// Every intent, attempt, response and decision is an immutable event in a per-operation stream,
/// stored by default in one SQLite file (WAL, synchronous=FULL).
#[derive(Debug, Parser)]
#[command(name = "opledger", version, propagate_version = true)]
pub struct Cli {
    /// More log output on stderr (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Walk through the ledger's rules on a fresh embedded store and print what it recorded.
    Demo(DemoArgs),
    /// Measure the embedded store (see `opledger bench store --help`).
    Bench(BenchArgs),
    /// Record an intent: freeze the arguments, assign an operation id and an idempotency key.
    Record(RecordArgs),
    /// Approve exactly the recorded arguments (by their hash) so the operation may be sent.
    Approve(DecisionArgs),
    /// Deny an operation that awaits approval; it will never be sent.
    Deny(DenyArgs),
    /// Show an operation's current state and its full event history.
    Status(StatusArgs),
    /// Walk the whole log and report every event edited, removed or moved behind the ledger's
    /// back, by stream and version (exit status 4 when anything is found).
    Verify(VerifyArgs),
    /// Run the fault-injecting CRM stand: keyed (Idempotency-Key), labelled (unique external
    /// label) and plain (lookup-only, lagging search) task APIs on loopback, with an admin API
    /// to queue faults (drop the request, drop the response, late response, 5xx before or after
    /// commit, 429 with Retry-After), move its clock, and list what it stored.
    Stand(StandArgs),
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The ledger file to verify (read only).
    #[arg(long, env = "OPLEDGER_DB", default_value = DEFAULT_DB)]
    pub db: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StandArgs {
    /// The loopback address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8787")]
    pub listen: String,
    /// How long a keyed Idempotency-Key is remembered, in seconds of the stand's clock.
    #[arg(long, default_value_t = 86_400)]
    pub key_retention_s: u64,
    /// How long a plain task stays invisible to search, in milliseconds of the stand's clock.
    #[arg(long, default_value_t = 2_000)]
    pub search_lag_ms: u64,
}

/// Where the ledger lives.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The SQLite ledger file; created if missing.
    #[arg(long, env = "OPLEDGER_DB", default_value = DEFAULT_DB)]
    pub db: PathBuf,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Where to write the demo ledger (default: a fresh file in a temporary directory).
    #[arg(long)]
    pub db: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub target: BenchTarget,
}

#[derive(Debug, Subcommand)]
pub enum BenchTarget {
    /// Minimal lifecycles (intent, attempt started, succeeded) on a fresh SQLite file at several
    /// concurrencies, then a replay of the whole log; prints one `bench=…` line per measurement.
    Store(BenchStoreArgs),
    /// Replay an existing ledger file: read the whole log, decode every event and fold it into
    /// the totals read model; prints `bench=replay …`.
    Replay(BenchReplayArgs),
}

#[derive(Debug, Args)]
pub struct BenchReplayArgs {
    /// The ledger file to replay (left as it is).
    #[arg(long)]
    pub db: PathBuf,
}

#[derive(Debug, Args)]
pub struct BenchStoreArgs {
    /// Lifecycles per concurrency level.
    #[arg(long, default_value_t = 20_000)]
    pub operations: u32,
    /// Concurrency levels to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    pub concurrency: Vec<u32>,
    /// Where to put the benchmark's ledger (default: a fresh file in a temporary directory).
    #[arg(long)]
    pub db: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The tenant the operation belongs to.
    #[arg(long)]
    pub tenant: String,
    /// The external system, e.g. `hubspot`.
    #[arg(long)]
    pub provider: String,
    /// The account at that provider.
    #[arg(long)]
    pub account: String,
    /// A fingerprint of the account's credentials (rotating them invalidates pending retries).
    #[arg(long)]
    pub credential_fingerprint: String,
    /// What to do there, e.g. `create_task`.
    #[arg(long)]
    pub action: String,
    /// The arguments, as a JSON object, e.g. '{"title": "Call the client"}'.
    #[arg(long)]
    pub args: String,
    /// The id of the delivery asking (tool-call id, message id); a redelivery finds the same operation.
    #[arg(long)]
    pub source_id: Option<String>,
    /// Who asks.
    #[arg(long)]
    pub owner: Option<String>,
    /// Require a person's approval before the operation may be sent.
    #[arg(long)]
    pub requires_approval: bool,
}

#[derive(Debug, Args)]
pub struct DecisionArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The operation id printed by `opledger record`.
    pub operation_id: String,
    /// Who decides.
    #[arg(long)]
    pub approver: String,
    /// The hash of the arguments the approver saw (`sha256:…`, printed by `record` and `status`).
    #[arg(long)]
    pub args_hash: String,
}

#[derive(Debug, Args)]
pub struct DenyArgs {
    #[command(flatten)]
    pub decision: DecisionArgs,
    /// Why the operation is denied.
    #[arg(long)]
    pub reason: String,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The operation id.
    pub operation_id: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Everything a subcommand can fail with, each with the exit code scripts can branch on.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The input is wrong; nothing was written.
    #[error("{0}")]
    Invalid(#[from] ValidationError),
    /// The ledger refused or failed.
    #[error("{0}")]
    App(#[from] AppError),
    /// The store could not be opened or failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// Anything else at the edge (files, terminals).
    #[error("{0}")]
    Other(String),
    /// `verify` found tampering.
    #[error("the ledger shows {findings} sign(s) of tampering")]
    Tampered {
        /// How many findings.
        findings: usize,
    },
    /// The user interrupted.
    #[error("interrupted; everything acknowledged so far is in the ledger")]
    Interrupted,
}

impl CliError {
    /// 2 for bad input (nothing written), 3 for a refusal by the ledger's rules, 1 otherwise.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Self::Invalid(_) | Self::App(AppError::Invalid(_)) => ExitCode::from(2),
            Self::App(
                AppError::Rejected { .. }
                | AppError::NotFound { .. }
                | AppError::SourceReused { .. },
            ) => ExitCode::from(3),
            Self::Interrupted => ExitCode::from(130),
            Self::Tampered { .. } => ExitCode::from(4),
            _ => ExitCode::FAILURE,
        }
    }
}
