//! `opledger subjects`: the data subjects, their erasure and the key-encryption key.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::DEFAULT_DB;

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
    #[arg(long, conflicts_with = "store")]
    pub key_store: Option<PathBuf>,
    /// A PostgreSQL ledger instead: its `postgres://` URL (the password from the URL or
    /// PGPASSWORD); its keys are in its own database, and `--db` is then not read.
    #[arg(long, value_name = "POSTGRES_URL")]
    pub store: Option<String>,
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
