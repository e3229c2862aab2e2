//! Running the service: `serve`, `mcp`, and `migrate` for a PostgreSQL ledger's schema.

use std::path::PathBuf;

use clap::Args;

use super::DEFAULT_DB;

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
pub struct MigrateArgs {
    /// The service's configuration file: its `store` is migrated.
    #[arg(long, env = "OPLEDGER_CONFIG")]
    pub config: Option<PathBuf>,
    /// The ledger's `postgres://` URL instead of a configuration (the password from the URL or
    /// PGPASSWORD).
    #[arg(long, value_name = "POSTGRES_URL")]
    pub store: Option<String>,
}
