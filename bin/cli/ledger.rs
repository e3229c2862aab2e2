//! The ledger's own commands: `record`, `approve`, `deny`, and the ones that read it back
//! (`status`, `ops`, `trace`, `tail`, `replay`).

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::store::{DecideStoreArgs, ReadModelArgs, ReadStoreArgs, StoreArgs};

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
