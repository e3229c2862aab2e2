//! Where the ledger and its read models live: the `--db` flags the commands share.

use std::path::PathBuf;

use clap::Args;

use super::DEFAULT_DB;

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

/// Where the read models live.
#[derive(Debug, Args)]
pub struct ReadModelArgs {
    #[command(flatten)]
    pub store: ReadStoreArgs,
    /// The read-model file (default: `<db>.views`); created and caught up on first use.
    #[arg(long = "read-models", visible_alias = "views", value_name = "FILE")]
    pub read_models: Option<PathBuf>,
}
