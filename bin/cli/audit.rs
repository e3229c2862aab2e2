//! The log for auditors: `verify`, `keys`, `checkpoint`, `prove`, `witness` and `export`.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::store::ReadStoreArgs;
use super::DEFAULT_DB;

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
    /// A witness's key (C2SP tlog-cosignature/v1, `<name>+<id>+<base64>`) whose cosignature the
    /// kept checkpoint must carry; repeat for several witnesses.
    #[arg(long, requires = "against")]
    pub witness_key: Vec<String>,
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
    /// Export a PostgreSQL ledger instead: its `postgres://` URL (the password from the URL or
    /// PGPASSWORD); `--db` is then not read. Its schema is brought up to date first, as `serve`
    /// does.
    #[arg(long = "store", value_name = "POSTGRES_URL")]
    pub store_url: Option<String>,
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
    /// Sign a checkpoint of the log as it is now with this key (kept in the ledger too) and cut
    /// the export at it. Without a key the export is cut at the newest checkpoint kept in the
    /// ledger; a ledger that keeps none gives an export without proofs.
    #[command(flatten)]
    pub key: SigningKeyArgs,
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
