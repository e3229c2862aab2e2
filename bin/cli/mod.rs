//! The command line's shape: subcommands, flags and their help texts, and the one error type the
//! binary reports.
//!
//! This file holds the top level (`Cli`, every subcommand with its one-line help); each group's
//! flags live in the file named for it: `ledger.rs` (record, decide, read back), `review.rs`,
//! `subjects.rs`, `connectors.rs`, `audit.rs` (verify, keys, checkpoints, proofs, witness,
//! export), `serve.rs` (serve, mcp, migrate), `demo.rs` (demo, sim, stand), `store.rs` (the
//! `--db` flags they share) and `error.rs`. `opledger bench`'s flags are the `opledger-bench`
//! crate's.

use clap::{Parser, Subcommand};

mod audit;
mod connectors;
mod demo;
mod error;
mod ledger;
mod review;
mod serve;
mod store;
mod subjects;

pub use self::audit::{
    CheckpointArgs, ExportArgs, ExportFormat, KeysArgs, KeysCommand, KeysGenerateArgs, LogBound,
    ProveArgs, SigningKeyArgs, VerifyArgs, WitnessArgs,
};
pub use self::connectors::{
    ConnectorsArgs, ConnectorsCheckArgs, ConnectorsCommand, ConnectorsImportMcpArgs,
    ConnectorsListArgs, ConnectorsLoginArgs, ConnectorsShowArgs, ConnectorsTestArgs,
};
pub use self::demo::{DemoArgs, SimArgs, StandArgs};
pub use self::error::{error_json, CliError};
pub use self::ledger::{
    DecisionArgs, DenyArgs, OpsArgs, OpsCommand, OpsListArgs, RecordArgs, ReplayArgs, StatusArgs,
    TailArgs, TraceArgs,
};
pub use self::review::{ReviewArgs, ReviewCommand, ReviewListArgs, ReviewResolveArgs};
pub use self::serve::{McpArgs, MigrateArgs, ServeArgs};
pub use self::store::ReadModelArgs;
pub use self::subjects::{
    KeyStoreArgs, SubjectsArgs, SubjectsCommand, SubjectsEraseArgs, SubjectsListArgs,
    SubjectsRotateArgs, SubjectsShowArgs,
};

/// The file the embedded store uses when none is named.
pub const DEFAULT_DB: &str = opledger_store::DEFAULT_SQLITE_PATH;

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
    /// How log lines on stderr read: `text`, or `json` (one object a line, with trace_id and
    /// span_id, for log shippers). Overrides the configuration's `[telemetry] log_format`.
    #[arg(long, global = true, value_parser = ["text", "json"])]
    pub log_format: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Play the article's story on a fresh SQLite ledger against an in-process CRM stand: a lost
    /// response settled by a lagging search, a lost request on a lookup-only CRM handed to a
    /// person, and a safe retry with the same key; ends with `demo: scenarios=… passed=…
    /// duplicates=…` computed from the stand's objects and the ledger's states.
    Demo(DemoArgs),
    /// Measure the embedded store (see `opledger bench store --help`).
    Bench(opledger_bench::BenchArgs),
    /// Record an intent: freeze the arguments, assign an operation id and an idempotency key.
    Record(RecordArgs),
    /// Approve exactly the recorded arguments (by their hash) so the operation may be sent.
    Approve(DecisionArgs),
    /// Deny an operation that awaits approval; it will never be sent.
    Deny(DenyArgs),
    /// Show an operation's current state and its full event history (the same as `ops show`).
    Status(StatusArgs),
    /// List operations from the read models, or show one operation.
    Ops(OpsArgs),
    /// Find the operation behind any id (operation, attempt, external object or source id) and
    /// print its whole chain: intent, attempts, responses, reconciliations, decisions.
    Trace(TraceArgs),
    /// The operations waiting for a person: list them, show one, record a decision.
    Review(ReviewArgs),
    /// Follow the global log live and print outcome events, one line each, starting with the
    /// event's global position (resume with `--from <last position>`).
    ///
    /// Friendly types (--type) and the events they stand for:
    ///   succeeded     AttemptSucceeded, ReconciliationRecorded (found, settling),
    ///                 ReviewResolved (confirm), LateResponseReceived (a success that settles)
    ///   unknown       OutcomeUnknown, LeaseExpired
    ///   rejected      AttemptRejected
    ///   needs_review  ReviewRequired
    ///   duplicate     DuplicateDetected
    ///   denied        ApprovalDenied
    ///   abandoned     ReviewResolved (abandon)
    ///   recorded      IntentRecorded
    ///   approved      ApprovalGranted
    ///   started       AttemptStarted
    ///   not_sent      AttemptNotSent, SendPostponed (its account's credentials or budget were
    ///                 not there yet; no attempt started)
    ///   lookup_claimed  LookupClaimed (a worker looks the operation up; others leave it)
    ///   lookup        ReconciliationRecorded (not found, inconclusive, or found on an
    ///                 operation already succeeded: its duplicate follows as `duplicate`),
    ///                 LookupPostponed (its account's credentials or budget were not there
    ///                 yet; nothing asked, no lookup counted)
    ///   retry         RetryScheduled, ReviewResolved (retry)
    ///   late          LateResponseReceived (a refusal, or a success that settles nothing)
    ///
    /// The ledger file is polled (every 200 ms when idle), so writes by other processes show up.
    #[command(verbatim_doc_comment)]
    Tail(TailArgs),
    /// Rebuild the read models from position 0 into a fresh file next to the read-model file; with
    /// --verify compare it with the live read models table by table (exit 1 on any difference),
    /// otherwise replace the live read models with it atomically.
    Replay(ReplayArgs),
    /// Walk the whole log and report every event edited, removed or moved behind the ledger's
    /// back, by stream and version (exit status 4 when anything is found).
    Verify(VerifyArgs),
    /// The transparency log's signing keys: `keys generate` makes one.
    Keys(KeysArgs),
    /// Sign the log's tree head now (a C2SP checkpoint), keep it in the ledger, and print it;
    /// keep the printed checkpoint outside opledger to hold the ledger to it later
    /// (`opledger verify --against`).
    Checkpoint(CheckpointArgs),
    /// Print the inclusion proofs of an operation's events (or of the event at a position)
    /// against the newest kept checkpoint, as JSON any RFC 6962 verifier can check.
    Prove(ProveArgs),
    /// Follow a served log as a witness: fetch its checkpoint, check it is signed and extends the
    /// one kept in --state (a consistency proof), then keep the new one; exit 4 on any
    /// inconsistency. Run it from cron.
    Witness(WitnessArgs),
    /// Write the log's events (all, a slice by position or time, or one tenant's) to a file, one
    /// JSON object per line with each event's link in its stream's hash chain, for auditors and
    /// the tools they trust (the export is checked without opledger by
    /// clients/verify-export/verify_export.py; the book's page "Export and offline verification"
    /// (docs/src/auditors/export.md) gives the chain's construction).
    ///
    /// Examples:
    ///   opledger export --out ledger.ndjson
    ///   opledger export --tenant acme --from 2026-12-01T00:00:00Z --out acme-december.ndjson
    #[command(verbatim_doc_comment)]
    Export(ExportArgs),
    /// Bring a PostgreSQL ledger's schema to this version of opledger, and say what was done
    /// (nothing, when it is already there). Run it with a role that owns the schema before
    /// starting `serve` with a role that may only read and write rows.
    Migrate(MigrateArgs),
    /// Run the HTTP API agents and services use: record, approve, execute, list, trace, review,
    /// a Server-Sent Events feed of outcomes, Prometheus metrics. With no --config, runs the
    /// embedded default (the SQLite ledger at --db, the CRM stand in-process as provider `crm`,
    /// demo tokens printed at start). Stops cleanly on SIGTERM or Ctrl-C.
    Serve(ServeArgs),
    /// Serve MCP on stdin/stdout for one tenant (for desktop agents): one tool per configured
    /// action the tenant may use, plus operation_status and list_operations. Runs the same
    /// service as `serve` on the configuration's ledger (without --config, `serve`'s embedded
    /// default for its tenant `demo`), without listening; `serve` offers the same tools over
    /// Streamable HTTP at /mcp.
    Mcp(McpArgs),
    /// Run the fault-injecting CRM stand: keyed (Idempotency-Key), labelled (unique external
    /// label) and plain (lookup-only, lagging search) task APIs on loopback, with an admin API
    /// to queue faults (drop the request, drop the response, late response, 5xx before or after
    /// commit, 429 with Retry-After), move its clock, and list what it stored.
    Stand(StandArgs),
    /// Run the deterministic simulator: the real engine over the memory store, a simulated
    /// clock and provider, with faults, one seed per run; ends with `sim: seeds=N ops=M
    /// failed=F faults=<class>:<count>,…` and exits 0 only when no seed failed. A failing seed
    /// prints the command that reproduces it and the trace before the broken invariant.
    Sim(SimArgs),
    /// Check connector files (every problem with its file, line and field) and list what is
    /// loaded: a configuration's connectors, or the presets shipped in the binary.
    Connectors(ConnectorsArgs),
    /// Data subjects (the people whose personal data operations carry): list them, show one,
    /// erase one (their key is destroyed; every proof still verifies), rotate the
    /// key-encryption key. Needs the key-encryption key: --kek-file or $OPLEDGER_KEK.
    Subjects(SubjectsArgs),
}

impl Command {
    /// The configuration file a command reads, whose `[telemetry]` section sets up tracing.
    pub fn config_path(&self) -> Option<&std::path::Path> {
        match self {
            Self::Serve(args) => args.config.as_deref(),
            Self::Mcp(args) => args.config.as_deref(),
            _ => None,
        }
    }

    /// Whether the command was asked for JSON (`--json`), so that its errors are JSON too.
    pub fn json(&self) -> bool {
        match self {
            Self::Record(args) => args.json,
            Self::Status(args) => args.json,
            Self::Ops(OpsArgs {
                command: OpsCommand::List(args),
            }) => args.json,
            Self::Ops(OpsArgs {
                command: OpsCommand::Show(args),
            }) => args.json,
            Self::Trace(args) => args.json,
            Self::Connectors(ConnectorsArgs {
                command: ConnectorsCommand::Check(args),
            }) => args.json,
            Self::Connectors(ConnectorsArgs {
                command: ConnectorsCommand::List(args),
            }) => args.json,
            Self::Connectors(ConnectorsArgs {
                command: ConnectorsCommand::Test(args),
            }) => args.json,
            Self::Review(ReviewArgs { command }) => match command {
                ReviewCommand::List(args) => args.json,
                ReviewCommand::Show(args) => args.json,
                ReviewCommand::Resolve(args) => args.json,
            },
            Self::Tail(args) => args.json,
            Self::Replay(args) => args.json,
            Self::Verify(args) => args.json,
            Self::Subjects(SubjectsArgs { command }) => match command {
                SubjectsCommand::List(args) => args.json,
                SubjectsCommand::Show(args) => args.json,
                SubjectsCommand::Erase(args) => args.json,
                SubjectsCommand::RotateKek(_) => false,
            },
            Self::Demo(_)
            | Self::Keys(_)
            | Self::Checkpoint(_)
            | Self::Prove(_)
            | Self::Witness(_)
            | Self::Migrate(_)
            | Self::Connectors(ConnectorsArgs {
                command:
                    ConnectorsCommand::Show(_)
                    | ConnectorsCommand::ImportMcp(_)
                    | ConnectorsCommand::Login(_),
            })
            | Self::Export(_)
            | Self::Bench(_)
            | Self::Approve(_)
            | Self::Deny(_)
            | Self::Serve(_)
            | Self::Mcp(_)
            | Self::Stand(_)
            | Self::Sim(_) => false,
        }
    }
}
