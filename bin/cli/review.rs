//! `opledger review`: the operations waiting for a person, and their decisions.

use clap::{Args, Subcommand};

use super::ledger::StatusArgs;
use super::store::{DecideStoreArgs, ReadModelArgs};

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
