//! `opledger mcp`: the MCP server on stdin and stdout for one tenant, for desktop agents that
//! start their tools as child processes. It runs the same service as `opledger serve` (the
//! configuration's ledger, connectors and workers) without listening anywhere; the tools, the
//! request ids and the answers are those of `/mcp` (see the `opledger-mcp` crate).
//!
//! Without `--config` it runs `serve`'s embedded default (the CRM stand in-process, tenant
//! `demo`), so `opledger mcp` alone can be pointed at from a desktop client or the MCP Inspector
//! and a tool called at once. Its ledger then defaults to the system's temporary directory, not
//! the working directory: a desktop client starts its tools wherever it likes (often `/`).
//!
//! The tenant is named by `--tenant` or by its token (`--token`, or `OPLEDGER_TOKEN`, so the
//! secret need not be in the client's command line); it must be one of the configuration's
//! `[[tenants]]`. Stdout is the protocol: every line of its own goes to stderr, the embedded
//! default's start-up line included.

use std::path::PathBuf;

use opledger_domain::ids::TenantId;
use opledger_http_api::{Principal, ServeConfig};

use crate::cli::{CliError, McpArgs};
use crate::serve;

/// The embedded default's ledger file name, in the system's temporary directory.
const DEMO_DB_FILE: &str = "opledger-mcp-demo.db";

/// `opledger mcp`.
pub async fn run(args: McpArgs) -> Result<(), CliError> {
    let (config, stand, source) = match &args.config {
        Some(path) => (
            opledger_http_api::config::load(path)
                .map_err(|error| CliError::Config(error.to_string()))?,
            None,
            Source::File(path.display().to_string()),
        ),
        None => {
            let db = args.db.clone().unwrap_or_else(demo_db);
            let (config, stand) = serve::embedded_default(&db).await?;
            let summary = serve::embedded_default_summary(&db, &stand, &config);
            (config, Some(stand), Source::EmbeddedDefault { summary })
        }
    };
    let result = match tenant_of(&config, &args, &source) {
        Ok(tenant) => {
            if let Source::EmbeddedDefault { summary } = &source {
                eprintln!(
                    "opledger mcp: no --config, so {summary}; the tools act for tenant `{tenant}`"
                );
            }
            // The client ends the session by closing stdin; SIGTERM (which clients send a child
            // they stop) or Ctrl-C end it too, with the same clean shutdown as `serve`.
            opledger_http_api::run_mcp_stdio(config, tenant, serve::shutdown_signal())
                .await
                .map_err(CliError::from)
        }
        Err(error) => Err(error),
    };
    if let Some(stand) = stand {
        stand.shutdown().await;
    }
    result
}

/// Where the configuration came from, for messages.
enum Source {
    /// A configuration file, by its path.
    File(String),
    /// The embedded default, with what it runs.
    EmbeddedDefault { summary: String },
}

/// The embedded default's ledger when `--db` does not name one.
fn demo_db() -> PathBuf {
    std::env::temp_dir().join(DEMO_DB_FILE)
}

/// The tenant `args` name, which the configuration must know. Without a configuration file,
/// naming none means the embedded default's one tenant.
fn tenant_of(config: &ServeConfig, args: &McpArgs, source: &Source) -> Result<TenantId, CliError> {
    let configured = || {
        config
            .tokens
            .values()
            .filter_map(|principal| match principal {
                Principal::Tenant(tenant) => Some(tenant),
                _ => None,
            })
    };
    match (&args.tenant, &args.token, source) {
        (None, None, Source::EmbeddedDefault { .. }) => Ok(TenantId::new(serve::DEMO_TENANT)?),
        (Some(tenant), None, _) => {
            let tenant = TenantId::new(tenant.clone())?;
            if configured().any(|known| *known == tenant) {
                return Ok(tenant);
            }
            Err(CliError::Config(match source {
                Source::File(path) => {
                    format!("tenant `{tenant}` is not in {path}; name one of its [[tenants]]")
                }
                Source::EmbeddedDefault { .. } => format!(
                    "tenant `{tenant}` is not in the embedded default, whose one tenant is `{}`; leave --tenant out, or give --config",
                    serve::DEMO_TENANT
                ),
            }))
        }
        (None, Some(token), _) => match config.tokens.get(token) {
            Some(Principal::Tenant(tenant)) => Ok(tenant.clone()),
            Some(_) => Err(CliError::Config(
                "that token is an operator's or an approver's; MCP tools act for a tenant: give a tenant's token".to_owned(),
            )),
            None => Err(CliError::Config(match source {
                Source::File(path) => format!("the token is not one of {path}'s [[tenants]] tokens"),
                Source::EmbeddedDefault { .. } => format!(
                    "the token (--token or OPLEDGER_TOKEN) is not the embedded default's; leave both out to act for its tenant `{}`, or give --config",
                    serve::DEMO_TENANT
                ),
            })),
        },
        _ => Err(CliError::Config(
            "name the tenant with --tenant ID or its token with --token (or OPLEDGER_TOKEN), one of them".to_owned(),
        )),
    }
}
