//! The command line's shape: subcommands, flags and their help texts, and the one error type the
//! binary reports.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use opledger_domain::app::AppError;
use opledger_domain::error::ValidationError;
use opledger_domain::store::StoreError;

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
    Bench(BenchArgs),
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

#[derive(Debug, Args)]
pub struct SubjectsArgs {
    #[command(subcommand)]
    pub command: SubjectsCommand,
}

#[derive(Debug, Subcommand)]
pub enum SubjectsCommand {
    /// Every data subject: its key's id, tenant, operations, and name unless erased.
    List(SubjectsListArgs),
    /// One data subject, in every tenant that has it.
    Show(SubjectsShowArgs),
    /// Erase a data subject: record SubjectErased (who, when, why; nothing personal), send their
    /// open operations to a person, destroy their key. Their values read `[erased]` from then on,
    /// everywhere; `opledger verify` and every export still verify.
    Erase(SubjectsEraseArgs),
    /// Wrap every data key again under a new key-encryption key; from then on only the new key
    /// opens the key store.
    RotateKek(SubjectsRotateArgs),
}

/// The key store and the key that opens it.
#[derive(Debug, Args)]
pub struct KeyStoreArgs {
    /// The SQLite ledger file; the key store is beside it (`<db>.keys`) unless --key-store names it.
    #[arg(long, env = "OPLEDGER_DB", default_value = DEFAULT_DB)]
    pub db: PathBuf,
    /// The key store's file.
    #[arg(long)]
    pub key_store: Option<PathBuf>,
    /// The file holding the key-encryption key (64 hex digits); without it, $OPLEDGER_KEK.
    #[arg(long, env = "OPLEDGER_KEK_FILE")]
    pub kek_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SubjectsListArgs {
    #[command(flatten)]
    pub keys: KeyStoreArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SubjectsShowArgs {
    #[command(flatten)]
    pub keys: KeyStoreArgs,
    /// The subject, exactly as recorded.
    pub subject: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SubjectsEraseArgs {
    #[command(flatten)]
    pub keys: KeyStoreArgs,
    /// The subject, exactly as recorded.
    pub subject: String,
    /// Why: the request's reference (e.g. "GDPR art. 17 request #4711"), never the person's data.
    #[arg(long)]
    pub reason: String,
    /// Who erases (recorded as the operator's name).
    #[arg(long, default_value = "cli")]
    pub operator: String,
    /// Only this tenant's subject of that name (default: every tenant's).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SubjectsRotateArgs {
    #[command(flatten)]
    pub keys: KeyStoreArgs,
    /// The file holding the new key-encryption key.
    #[arg(long)]
    pub new_kek_file: PathBuf,
}

#[derive(Debug, Args)]
pub struct SimArgs {
    /// How many seeds to run (at least 1).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    pub from: u64,
    /// Operations per seed, from 1 to the simulator's limit (`opledger_sim::MAX_OPS`).
    #[arg(
        long,
        default_value_t = opledger_sim::DEFAULT_OPS,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
            .range(1..=opledger_sim::MAX_OPS as u64)
    )]
    pub ops: usize,
}

#[derive(Debug, Args)]
pub struct ConnectorsArgs {
    #[command(subcommand)]
    pub command: ConnectorsCommand,
}

#[derive(Debug, Subcommand)]
pub enum ConnectorsCommand {
    /// Read connector files as `serve` would and report every problem (exit 2 if any).
    Check(ConnectorsCheckArgs),
    /// List the connectors a configuration loads (with --config), else the presets.
    List(ConnectorsListArgs),
    /// Print a preset's document, to copy into a file and change.
    Show(ConnectorsShowArgs),
    /// Check each account's credentials against the live API with the connector's read-only
    /// [probe] request (nothing is created); exit non-zero when any account fails.
    Test(ConnectorsTestArgs),
    /// List an upstream MCP server's tools and write a connector document to start from, with
    /// every decision a person must make (contract, lookup, result) marked TO DECIDE.
    ImportMcp(ConnectorsImportMcpArgs),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("upstream").required(true).args(["command", "url"])))]
pub struct ConnectorsImportMcpArgs {
    /// The program that starts the upstream on stdio; its arguments follow `--`.
    #[arg(long)]
    pub command: Option<String>,
    /// The upstream's Streamable HTTP endpoint.
    #[arg(long)]
    pub url: Option<String>,
    /// A PEM file of CA certificates to trust for an https:// `--url` beside the system's (an
    /// upstream behind a private CA); written into the document as `ca_file`.
    #[arg(long, requires = "url")]
    pub ca_file: Option<String>,
    /// The provider id the document names.
    #[arg(long, default_value = "upstream")]
    pub id: String,
    /// Write the document here instead of printing it.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// How long starting the upstream and listing its tools may take, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub timeout_ms: u64,
    /// The upstream program's arguments.
    #[arg(last = true)]
    pub args: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ConnectorsShowArgs {
    /// The preset's name (`opledger connectors list` lists them).
    pub preset: String,
}

#[derive(Debug, Args)]
pub struct ConnectorsTestArgs {
    /// The serve configuration whose connectors to test (credentials from the environment, as
    /// at start).
    #[arg(long, env = "OPLEDGER_CONFIG")]
    pub config: PathBuf,
    /// Only this connector (its provider id).
    #[arg(long)]
    pub connector: Option<String>,
    /// Only this account.
    #[arg(long)]
    pub account: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ConnectorsCheckArgs {
    /// The connector files (TOML).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Also build each connector with the credentials from the environment, as `serve` does
    /// (the file must then name its base_url and accounts).
    #[arg(long)]
    pub env: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ConnectorsListArgs {
    /// The serve configuration whose connectors to list (credentials are read from the
    /// environment, as at start; only fingerprints are shown). Without it: the presets.
    #[arg(long, env = "OPLEDGER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

impl Command {
    /// Whether the command was asked for JSON (`--json`), so that its errors are JSON too.
    /// The configuration file a command reads, whose `[telemetry]` section sets up tracing.
    pub fn config_path(&self) -> Option<&std::path::Path> {
        match self {
            Self::Serve(args) => args.config.as_deref(),
            Self::Mcp(args) => args.config.as_deref(),
            _ => None,
        }
    }

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
                command: ConnectorsCommand::Show(_) | ConnectorsCommand::ImportMcp(_),
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

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The ledger file to verify (read only).
    #[arg(long, env = "OPLEDGER_DB", default_value = DEFAULT_DB)]
    pub db: PathBuf,
    /// Verify a PostgreSQL ledger instead: its `postgres://` URL (the password from the URL or
    /// PGPASSWORD); `--db` is then not read. Its schema is brought up to date first, as `serve`
    /// does.
    #[arg(long, value_name = "POSTGRES_URL")]
    pub store: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also hold the ledger to this kept checkpoint: the log must still hold every event it
    /// covers, unchanged and in order; the first divergence is named (a removed tail, a
    /// rewritten event, a reordering).
    #[arg(long, value_name = "CHECKPOINT_FILE", requires = "verifier_key")]
    pub against: Option<PathBuf>,
    /// The log's verifier key, which must have signed the checkpoint.
    #[arg(long, env = "OPLEDGER_LOG_VERIFIER_KEY")]
    pub verifier_key: Option<String>,
}

#[derive(Debug, Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    pub command: KeysCommand,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Make an Ed25519 signing key for the log's checkpoints: writes the private key to --out
    /// (created, never overwritten, readable by its owner only) and prints the verifier key to
    /// give auditors and witnesses.
    Generate(KeysGenerateArgs),
}

#[derive(Debug, Args)]
pub struct KeysGenerateArgs {
    /// The log's name: the first line of every checkpoint, and the key's name (no spaces or
    /// `+`), e.g. `ledger.example.com/acme`.
    #[arg(long)]
    pub name: String,
    /// Where to write the private key (a new file).
    #[arg(long)]
    pub out: PathBuf,
}

/// Where the log's signing key comes from: a file, or the environment. Never the ledger.
#[derive(Debug, Args)]
pub struct SigningKeyArgs {
    /// A file holding the signing key (as `opledger keys generate` wrote it).
    #[arg(long, env = "OPLEDGER_LOG_KEY_FILE")]
    pub key_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CheckpointArgs {
    #[command(flatten)]
    pub store: ReadStoreArgs,
    #[command(flatten)]
    pub key: SigningKeyArgs,
    /// Also write the checkpoint to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ProveArgs {
    #[command(flatten)]
    pub store: ReadStoreArgs,
    /// An operation id (its every event is proved) or a global position.
    pub what: String,
    /// Prove against the kept checkpoint of this tree size (default: the newest kept).
    #[arg(long)]
    pub size: Option<u64>,
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The service's configuration file: its `store` is migrated.
    #[arg(long, env = "OPLEDGER_CONFIG")]
    pub config: Option<PathBuf>,
    /// The ledger's `postgres://` URL instead of a configuration (the password from the URL or
    /// PGPASSWORD).
    #[arg(long, value_name = "POSTGRES_URL")]
    pub store: Option<String>,
}

#[derive(Debug, Args)]
pub struct WitnessArgs {
    /// The served log's base URL (e.g. `http://127.0.0.1:8080`).
    #[arg(long)]
    pub url: String,
    /// The file the witness keeps the last checkpoint it accepted in (created on the first run).
    #[arg(long)]
    pub state: PathBuf,
    /// The log's verifier key (as `opledger keys generate` printed it).
    #[arg(long, env = "OPLEDGER_LOG_VERIFIER_KEY")]
    pub verifier_key: String,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub store: ReadStoreArgs,
    /// The first event to export: a global position (`1200`) or an RFC 3339 time
    /// (`2026-12-01T14:02:00Z`; from the first event recorded at or after it). Default: the log's
    /// first event.
    #[arg(long, value_parser = parse_log_bound)]
    pub from: Option<LogBound>,
    /// The last event to export: a global position or an RFC 3339 time (up to the last event
    /// recorded at or before it). Default: the log's head when the export starts.
    #[arg(long, value_parser = parse_log_bound)]
    pub to: Option<LogBound>,
    /// Export only this tenant's operations.
    #[arg(long)]
    pub tenant: Option<String>,
    /// The file's format: `ndjson` (one JSON object per line) or `parquet`.
    #[arg(long, value_enum, default_value_t = ExportFormat::Ndjson)]
    pub format: ExportFormat,
    /// The file to write; written beside it under a temporary name and renamed when complete, so
    /// an interrupted export leaves no partial file.
    #[arg(long)]
    pub out: PathBuf,
}

/// The formats `opledger export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// One JSON object per line: a header, the events, a closing count.
    Ndjson,
    /// Apache Parquet (one row an event, Snappy-compressed; the header and the closing count in
    /// the footer's key-value metadata), read directly by DuckDB, pandas, Spark.
    Parquet,
}

/// One end of a slice of the log: a global position or a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogBound {
    /// A global position (1 is the first event).
    Position(u64),
    /// A moment, compared with each event's time.
    Time(chrono::DateTime<chrono::Utc>),
}

/// Reads `--from` / `--to` as `--as-of` reads a moment: digits are a position, anything else
/// must be an RFC 3339 time.
fn parse_log_bound(text: &str) -> Result<LogBound, String> {
    use opledger_http_api::render::AsOf;
    Ok(match AsOf::parse(text)? {
        AsOf::Position(position) => LogBound::Position(position.value()),
        AsOf::Time(time) => LogBound::Time(time),
    })
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The configuration file (TOML; see opledger.example.toml). Without it: the embedded
    /// default with a demo provider.
    #[arg(long, env = "OPLEDGER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Listen here instead of the configuration's `listen` (port 0 picks a free one).
    #[arg(long)]
    pub listen: Option<String>,
    /// The SQLite ledger file of the embedded default (ignored with --config, whose `store` names it).
    #[arg(long, env = "OPLEDGER_DB", default_value = DEFAULT_DB)]
    pub db: PathBuf,
}

#[derive(Debug, Args)]
pub struct McpArgs {
    /// The configuration file (TOML; see opledger.example.toml). Without it: the embedded
    /// default of `serve` (the CRM stand in-process as provider `crm`), acting for its tenant
    /// `demo`.
    #[arg(long, env = "OPLEDGER_CONFIG")]
    pub config: Option<PathBuf>,
    /// The tenant the tools act for (one of the configuration's [[tenants]]).
    #[arg(long, conflicts_with = "token")]
    pub tenant: Option<String>,
    /// The tenant's token instead of its id (from the environment, so it stays off the command
    /// line the MCP client shows).
    #[arg(long, env = "OPLEDGER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The SQLite ledger file of the embedded default (ignored with --config, whose `store`
    /// names it). Default: opledger-mcp-demo.db in the system's temporary directory, because a
    /// desktop client starts its tools in a directory of its own choosing (often `/`).
    #[arg(long, env = "OPLEDGER_DB")]
    pub db: Option<PathBuf>,
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

/// Where the ledger lives, for `record`: the one command that starts a ledger.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The SQLite ledger file; created if missing (its directory must exist).
    #[arg(long, env = "OPLEDGER_DB", default_value = DEFAULT_DB)]
    pub db: PathBuf,
}

/// Where the ledger lives, for a command that records a decision in an existing ledger.
#[derive(Debug, Args)]
pub struct DecideStoreArgs {
    /// The SQLite ledger file the operation was recorded in; it must exist (nothing is created).
    #[arg(long, env = "OPLEDGER_DB", default_value = DEFAULT_DB)]
    pub db: PathBuf,
}

/// Where the ledger lives, for a command that only reads it.
#[derive(Debug, Args)]
pub struct ReadStoreArgs {
    /// The SQLite ledger file to read; it must exist (a read creates no ledger).
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
    /// Rebuild the SQLite read models from position 0 of an existing ledger file into a fresh
    /// temporary file (removed afterwards); prints `bench=projection-rebuild …`. With `--floor`,
    /// then writes the rebuilt rows again from memory into a file set up as a rebuild's is (SQLite
    /// alone: no log read, decode or fold) and prints `bench=projection-floor …` per sorter
    /// setting, with each table's and index's time per event.
    Projections(BenchProjectionsArgs),
    /// `opledger serve --db FILE` from process start: to `/healthz` ready, to the first due
    /// operation driven, and its peak RSS; prints `bench=startup events=… ready_ms=…
    /// first_drive_ms=… max_rss_mb=…`. The read models beside the file are caught up first
    /// (untimed): the measurement is a restart, not a first start.
    Startup(BenchStartupArgs),
    /// Erasure of one data subject: records --operations intents under one subject on a fresh
    /// SQLite ledger (untimed beyond its own line), then erases the subject (the event, every
    /// open operation to review, the key destroyed); prints `bench=erase operations=…
    /// record_s=… erase_ms=…`.
    Erase(BenchEraseArgs),
    /// The HTTP service end to end: record + execute against the CRM stand on loopback, at each
    /// concurrency; prints `bench=http concurrency=… operations=… ops_per_s=… p50_ms=… p99_ms=…`.
    /// Without --url it starts the stand and `opledger serve` itself on a fresh ledger file.
    Http(BenchHttpArgs),
    /// A crash soak with real processes: the CRM stand here, `opledger serve` as a child on a
    /// fresh SQLite ledger, a burst of record-and-execute calls from several clients, SIGKILL at
    /// a seeded random moment, a restart on the same file — repeated. After each cycle every
    /// acknowledged operation must be there under its id, a redelivery must map to it, and once
    /// settled no request may have two objects at the stand; prints `bench=soak cycles=…
    /// acknowledged=… lost=… duplicates=… redeliveries_mismatched=… unsettled=… wall_s=…` and
    /// exits 1 naming the operations when a check fails.
    Soak(BenchSoakArgs),
    /// The floor under `serve`, for the peers' harness: serves `POST /v1/operations` doing only
    /// the two durable appends of the SQLite store (intent with claim, then outcome) around the
    /// send to --provider-url, with the service's own HTTP stacks and no read models, engine or
    /// hash chain. Prints `opledger bench floor: listening on http://…`; runs until Ctrl-C or SIGTERM. A
    /// bound to measure `serve` against, not a ledger: a re-sent source_id is refused.
    Floor(BenchFloorArgs),
}

#[derive(Debug, Args)]
pub struct BenchFloorArgs {
    /// Where each operation is sent: the provider's full URL, e.g. the peers' stub CRM at
    /// http://127.0.0.1:PORT/keyed/bench/tasks. The answer's `id` is the new object's id.
    #[arg(long)]
    pub provider_url: String,
    /// The address to serve on.
    #[arg(long, default_value_t = crate::bench_floor::DEFAULT_LISTEN)]
    pub listen: std::net::SocketAddr,
    /// The ledger file to create (it must not exist; default: a fresh file in the temporary
    /// directory, removed at exit).
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Write no ledger at all: only receive, send to the provider and answer (the two HTTP
    /// hops alone). A re-sent source_id is then sent again.
    #[arg(long)]
    pub without_ledger: bool,
}

#[derive(Debug, Args)]
pub struct BenchEraseArgs {
    /// Operations recorded under the subject.
    #[arg(long, default_value_t = 10_000)]
    pub operations: u32,
}

#[derive(Debug, Args)]
pub struct BenchHttpArgs {
    /// Operations (record + execute) per concurrency level.
    #[arg(long, default_value_t = 5_000)]
    pub operations: u32,
    /// Concurrency levels to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    pub concurrency: Vec<u32>,
    /// A running server to drive (default: start one here).
    #[arg(long)]
    pub url: Option<String>,
    /// A tenant token of that server.
    #[arg(long, env = "OPLEDGER_TOKEN")]
    pub token: Option<String>,
    /// The provider to send to (with --url).
    #[arg(long, default_value = "crm")]
    pub provider: String,
    /// The account at that provider (with --url).
    #[arg(long, default_value = "demo")]
    pub account: String,
    /// Record and execute in one call (`POST /v1/operations?execute=true`) instead of two.
    #[arg(long)]
    pub one_call: bool,
    /// Subscribe one outcome webhook (a receiver started here that answers 200 at once) to
    /// `succeeded`, and print after each level its deliveries per second and how long after
    /// the level's last operation it had delivered everything (not with --url).
    #[arg(long)]
    pub webhook: bool,
    /// Record every operation with a data subject (one of 1,000) and personal data on, every
    /// argument sealed (not with --url): compare with a run without it.
    #[arg(long)]
    pub personal: bool,
}

#[derive(Debug, Args)]
pub struct BenchSoakArgs {
    /// Kill-and-restart cycles.
    #[arg(long, default_value_t = 200)]
    pub cycles: u32,
    /// Concurrent clients in each burst.
    #[arg(long, default_value_t = 8)]
    pub clients: u32,
    /// The seed of the kill moments, the faults and the requests' mix (default: from the clock;
    /// printed, so a run can be repeated — its timing, and so what a kill hits, cannot).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where the ledger goes: a file that does not exist yet, or a directory to make a fresh one
    /// in (default: a fresh directory in the temporary directory, removed after a clean run).
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// The earliest moment of the kill after a burst starts, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub kill_after_ms_min: u64,
    /// The latest moment of the kill after a burst starts, in milliseconds. A burst is killed
    /// earlier when its seeded request budget is spent (the run's total stays within what the
    /// stand holds), so that every client is busy up to the kill.
    #[arg(long, default_value_t = 1_500)]
    pub kill_after_ms_max: u64,
    /// Every how many cycles the stand injects faults during the burst (lost responses, 5xx
    /// after its commit), so some outcomes are unknown before the kill too; 0: never.
    #[arg(long, default_value_t = 3)]
    pub fault_every: u32,
    /// How long a cycle may take to settle (every operation terminal or waiting for a person)
    /// after the restart, in milliseconds; what is still open then is counted `unsettled`.
    #[arg(long, default_value_t = 30_000)]
    pub settle_ms_max: u64,
}

#[derive(Debug, Args)]
pub struct BenchReplayArgs {
    /// The ledger file to replay (left as it is).
    #[arg(long)]
    pub db: PathBuf,
}

#[derive(Debug, Args)]
pub struct BenchProjectionsArgs {
    /// The ledger file to rebuild the read models of (left as it is).
    #[arg(long)]
    pub db: PathBuf,
    /// After the rebuild, measure SQLite's floor for the same rows: write them again from memory
    /// (no log read, decode or fold), the indexes built with 0 and then 2 sorter threads.
    #[arg(long)]
    pub floor: bool,
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
    /// A PostgreSQL database to put the ledger in instead of a file
    /// (`postgres://user@host:5432/database`, the password from the URL or `PGPASSWORD`); it
    /// must hold no ledger yet.
    #[arg(long, conflicts_with = "db")]
    pub store: Option<String>,
    /// Operations per thousand left open instead of succeeding, in turn: a due send, an attempt
    /// in flight (its lease runs out 30 s later), an unknown outcome due for a lookup, one
    /// awaiting approval, one in review — for `bench startup`. They name the embedded default's
    /// provider `crm` and account `demo`, so `opledger serve --db FILE` can drive them.
    #[arg(long, default_value_t = 0)]
    pub open_per_mille: u32,
}

#[derive(Debug, Args)]
pub struct BenchStartupArgs {
    /// The ledger to start on (written by `bench store`). The benchmark's drives append to it.
    #[arg(long)]
    pub db: PathBuf,
    /// How long to keep the server running after its first drive before reading its peak
    /// memory, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    pub settle_ms: u64,
    /// Start another opledger build's `serve` instead of this one's (to measure before a
    /// change). Its read models are left as they are: start it once first to catch them up.
    #[arg(long)]
    pub server_exe: Option<PathBuf>,
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
    /// Taken from the configured connector with --config.
    #[arg(long, required_unless_present = "config")]
    pub credential_fingerprint: Option<String>,
    /// A serve configuration: the intent is checked against its connectors as the API checks
    /// it (the tenant owns the account, the action exists, the arguments fit its input schema)
    /// and bound to the account's credential fingerprint. Credentials are read from the
    /// environment, as at `serve`'s start.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
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
    /// The data subject (the person the arguments are about): every argument value is sealed
    /// under their key. Needs the key-encryption key (--kek-file or $OPLEDGER_KEK).
    #[arg(long)]
    pub subject: Option<String>,
    /// The file holding the key-encryption key, with --subject.
    #[arg(long, env = "OPLEDGER_KEK_FILE")]
    pub kek_file: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DecisionArgs {
    #[command(flatten)]
    pub store: DecideStoreArgs,
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
    pub store: ReadStoreArgs,
    /// The operation id.
    pub operation_id: String,
    /// Show the operation as it stood at this moment: a global position (`1200`: once the event
    /// there was committed) or an RFC 3339 time (`2026-12-01T14:02:00Z`: the events recorded at
    /// or before it); folded from its events up to then.
    #[arg(long, value_parser = parse_as_of, value_name = "POSITION|TIME")]
    pub as_of: Option<opledger_http_api::render::AsOf>,
    /// The serve configuration whose connectors word the agent's sentence, as the API words it
    /// (credentials are read from the environment, as at `serve`'s start). Without it: the
    /// embedded default's, as `serve` without one.
    #[arg(long, env = "OPLEDGER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print JSON instead of text: the API's operation object (`GET /v1/operations/{id}`).
    #[arg(long)]
    pub json: bool,
}

fn parse_as_of(text: &str) -> Result<opledger_http_api::render::AsOf, String> {
    opledger_http_api::render::AsOf::parse(text)
}

/// Where the read models live.
#[derive(Debug, Args)]
pub struct ReadModelArgs {
    #[command(flatten)]
    pub store: ReadStoreArgs,
    /// The read-model file (default: `<db>.views`); created and caught up on first use.
    #[arg(long = "read-models", visible_alias = "views", value_name = "FILE")]
    pub read_models: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct OpsArgs {
    #[command(subcommand)]
    pub command: OpsCommand,
}

#[derive(Debug, Subcommand)]
pub enum OpsCommand {
    /// One row per operation, oldest first: id, tenant, account, action, state, attempts,
    /// external id, created and updated times, age.
    List(OpsListArgs),
    /// An operation's state, the sentence the agent may say, and its timeline.
    Show(StatusArgs),
}

#[derive(Debug, Args)]
pub struct OpsListArgs {
    #[command(flatten)]
    pub read_models: ReadModelArgs,
    /// Only operations in this state: unknown, needs_review, pending, in_flight, succeeded,
    /// rejected, denied, abandoned, awaiting_approval.
    #[arg(long)]
    pub state: Option<String>,
    /// Only this tenant's operations.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only operations sent to this provider (as the configuration names it, e.g. `crm`).
    #[arg(long)]
    pub provider: Option<String>,
    /// Only operations bound to this account.
    #[arg(long)]
    pub account: Option<String>,
    /// Only operations recorded longer ago than this: a number and a unit s, m, h or d
    /// (e.g. 10m, 2h, 3d).
    // Hyphen values are taken so that `-3d` gets this command's own message, not clap's.
    #[arg(long, allow_hyphen_values = true)]
    pub older_than: Option<String>,
    /// Most rows to print (1 to 1000).
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// Start after this operation (the last one of the previous page, as printed after the
    /// table or as `next` in JSON).
    #[arg(long)]
    pub after: Option<String>,
    /// The listing as it was at this moment: a global position (`1200`) or an RFC 3339 time
    /// (`2026-12-01T14:02:00Z`), folded from the log's start up to it (ages and --older-than
    /// measured from it).
    #[arg(long, value_parser = parse_as_of, value_name = "POSITION|TIME")]
    pub as_of: Option<opledger_http_api::render::AsOf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub read_models: ReadModelArgs,
    /// An operation id, an attempt id, an external object id or a source (delivery) id.
    pub id: String,
    /// Only this tenant's operations: a short external id such as `731` or a source id can name
    /// operations of many tenants.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ReviewArgs {
    #[command(subcommand)]
    pub command: ReviewCommand,
}

#[derive(Debug, Subcommand)]
pub enum ReviewCommand {
    /// Operations unknown or waiting for a person, the longest-waiting first.
    List(ReviewListArgs),
    /// One operation's evidence and timeline.
    Show(StatusArgs),
    /// Record a person's decision about an operation in review.
    Resolve(ReviewResolveArgs),
}

#[derive(Debug, Args)]
pub struct ReviewListArgs {
    #[command(flatten)]
    pub read_models: ReadModelArgs,
    /// Most rows to print (1 to 1000).
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("decision").required(true).args(["retry", "confirm", "abandon"])))]
pub struct ReviewResolveArgs {
    #[command(flatten)]
    pub store: DecideStoreArgs,
    /// The operation id.
    pub operation_id: String,
    /// Who decides.
    #[arg(long)]
    pub reviewer: String,
    /// Send it again with the same key (the workers or `serve` send it; this command does not).
    #[arg(long)]
    pub retry: bool,
    /// With --retry: accept that the provider may not tell the retry from a second request.
    /// This command has no provider configuration, so it cannot see the action's contract and
    /// asks for it on every retry of an operation that may have been applied; `serve`'s review
    /// API asks only when the contract cannot make the retry safe.
    #[arg(long, requires = "retry")]
    pub accept_duplicate_risk: bool,
    /// The object exists at the provider with this id: the operation succeeded.
    #[arg(long, value_name = "EXTERNAL_ID")]
    pub confirm: Option<String>,
    /// Give up: it will never be sent again.
    #[arg(long)]
    pub abandon: bool,
    /// Why, in a sentence (kept in the ledger).
    #[arg(long)]
    pub note: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TailArgs {
    #[command(flatten)]
    pub store: ReadStoreArgs,
    /// Start after this global position (default: from the beginning).
    #[arg(long)]
    pub from: Option<u64>,
    /// Friendly types to print, comma-separated (default: succeeded, unknown, rejected,
    /// needs_review, duplicate, denied, abandoned); `all` prints every event.
    #[arg(long = "type", value_delimiter = ',')]
    pub types: Vec<String>,
    /// Stop after printing this many events (default: follow until Ctrl-C).
    #[arg(long)]
    pub limit: Option<u64>,
    /// Print one JSON object per line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub read_models: ReadModelArgs,
    /// Compare the rebuild with the live read models instead of replacing them (exit 1 on any
    /// difference).
    #[arg(long)]
    pub verify: bool,
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
    /// The read models failed.
    #[error("{0}")]
    ReadModel(#[from] opledger_readmodel::ReadModelError),
    /// The server's configuration is wrong; nothing was opened.
    #[error("{0}")]
    Config(String),
    /// Nothing matches the id asked for.
    #[error("{0}")]
    NotFound(String),
    /// `replay --verify` found the live read models differ from a rebuild.
    #[error("the live read models differ from a rebuild in {tables} table(s); run `opledger replay` to replace them")]
    Differs {
        /// How many tables differ.
        tables: usize,
    },
    /// `verify` found tampering.
    #[error("the ledger shows {findings} sign(s) of tampering")]
    Tampered {
        /// How many findings.
        findings: usize,
    },
    /// The user interrupted.
    #[error("interrupted; everything acknowledged so far is in the ledger")]
    Interrupted,
    /// `sim` found seeds that broke an invariant.
    #[error("{failed} seed(s) broke an invariant; each one's reproduce line is above")]
    SimFailed {
        /// How many.
        failed: usize,
    },
    /// The file at `--db` cannot be a ledger for this command (missing, in a missing directory,
    /// not a database); nothing was opened or created.
    #[error("{0}")]
    LedgerFile(#[from] crate::ledger_file::LedgerFileError),
    /// The store refused to open an existing file as a ledger; `next` says what to do.
    #[error("{error}; {next}")]
    Unopenable {
        /// The store's refusal.
        error: StoreError,
        /// The next step, in a phrase.
        next: &'static str,
    },
}

impl CliError {
    /// 2 for bad input (nothing written), 3 for a refusal by the ledger's rules, 1 otherwise.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            // The decider checks some inputs itself (note lengths); those are bad input too.
            Self::Invalid(_)
            | Self::App(
                AppError::Invalid(_)
                | AppError::Rejected {
                    rejection: opledger_domain::decider::Rejection::Invalid(_),
                    ..
                },
            ) => ExitCode::from(2),
            Self::App(
                AppError::Rejected { .. }
                | AppError::NotFound { .. }
                | AppError::SourceReused { .. },
            ) => ExitCode::from(3),
            Self::NotFound(_) => ExitCode::from(3),
            Self::Config(_) => ExitCode::from(2),
            Self::ReadModel(opledger_readmodel::ReadModelError::InvalidQuery { .. }) => {
                ExitCode::from(2)
            }
            Self::Interrupted => ExitCode::from(130),
            Self::Tampered { .. } => ExitCode::from(4),
            _ => ExitCode::FAILURE,
        }
    }

    /// A short, stable name of what went wrong, for scripts reading `--json` errors; the same
    /// names as the HTTP API's where the meaning is the same.
    pub fn code(&self) -> &'static str {
        use opledger_domain::decider::Rejection;
        match self {
            Self::Invalid(_)
            | Self::App(
                AppError::Invalid(_)
                | AppError::Rejected {
                    rejection: Rejection::Invalid(_),
                    ..
                },
            )
            | Self::ReadModel(opledger_readmodel::ReadModelError::InvalidQuery { .. }) => {
                "invalid_input"
            }
            Self::App(AppError::Rejected { .. }) => "refused",
            Self::App(AppError::NotFound { .. }) | Self::NotFound(_) => "not_found",
            Self::App(AppError::SourceReused { .. }) => "source_id_reused",
            Self::App(AppError::Moved { .. }) => "stale",
            Self::App(AppError::Contended { .. }) => "contended",
            Self::App(AppError::Store(_)) | Self::Store(_) => "store_unavailable",
            Self::App(AppError::Decode(_)) => "undecodable_event",
            Self::App(AppError::PersonalData(
                opledger_domain::personal::PersonalDataError::Erased,
            )) => "subject_erased",
            Self::App(AppError::PersonalData(_)) => "personal_data_failed",
            Self::ReadModel(_) => "read_models_unavailable",
            Self::Config(_) => "invalid_config",
            Self::Differs { .. } => "read_models_differ",
            Self::Tampered { .. } => "tampered",
            Self::Interrupted => "interrupted",
            Self::SimFailed { .. } => "sim_failed",
            Self::LedgerFile(error) => error.code(),
            Self::Unopenable { .. } => "store_unavailable",
            Self::Other(_) => "failed",
        }
    }
}

impl CliError {
    /// Whether the command already printed its report of this failure on stdout (`replay
    /// --verify`'s differences, `verify`'s findings), so nothing more is printed there.
    pub fn reported_on_stdout(&self) -> bool {
        matches!(self, Self::Differs { .. } | Self::Tampered { .. })
    }
}

/// `error` as `--json` prints it: `{"error": {"code": …, "message": …}}`, the HTTP API's shape.
pub fn error_json(error: &CliError) -> serde_json::Value {
    serde_json::json!({"error": {"code": error.code(), "message": error.to_string()}})
}

impl From<opledger_http_api::render::RenderError> for CliError {
    fn from(error: opledger_http_api::render::RenderError) -> Self {
        use opledger_http_api::render::RenderError;
        match error {
            RenderError::App(error) => Self::App(error),
            RenderError::Store(error) => Self::Store(error),
            RenderError::ReadModel(error) => Self::ReadModel(error),
            RenderError::Invalid(error) => Self::Invalid(error),
            other => Self::Other(other.to_string()),
        }
    }
}

impl From<opledger_http_api::ServeError> for CliError {
    fn from(error: opledger_http_api::ServeError) -> Self {
        use opledger_http_api::ServeError;
        match error {
            ServeError::Config(message) => Self::Config(message),
            ServeError::Invalid(error) => Self::Invalid(error),
            ServeError::App(error) => Self::App(error),
            ServeError::Store(error) => Self::Store(error),
            ServeError::ReadModel(error) => Self::ReadModel(error),
            ServeError::Io(message) => Self::Other(message),
            ServeError::Webhooks(error) => Self::Other(error.to_string()),
        }
    }
}
