//! `opledger connectors`: check, list, show, test and import connector files.

use std::path::PathBuf;

use clap::{Args, Subcommand};

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
    /// Log a person in to an upstream MCP server whose document has [upstream.login]: prints
    /// the authorization server's URL to open, receives the answer on 127.0.0.1, and keeps the
    /// tokens sealed beside the ledger, where `serve` reads them.
    Login(ConnectorsLoginArgs),
}

#[derive(Debug, Args)]
pub struct ConnectorsLoginArgs {
    /// The upstream's provider id in the configuration.
    pub connector: String,
    /// The serve configuration that names the upstream (and the key-encryption key the login is
    /// sealed under).
    #[arg(long, env = "OPLEDGER_CONFIG")]
    pub config: PathBuf,
    /// How long to wait for the person to finish in the browser, in seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
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
