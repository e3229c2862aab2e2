//! `opledger mcp`: the MCP server on stdin and stdout for one tenant, for desktop agents that
//! start their tools as child processes. It runs the same service as `opledger serve` (the
//! configuration's ledger, connectors and workers) without listening anywhere; the tools, the
//! request ids and the answers are those of `/mcp` (see the `opledger-mcp` crate).
//!
//! The tenant is named by `--tenant` or by its token (`--token`, or `OPLEDGER_TOKEN`, so the
//! secret need not be in the client's command line); it must be one of the configuration's
//! `[[tenants]]`. Stdout is the protocol: every line of its own goes to stderr.

use opledger_domain::ids::TenantId;
use opledger_http_api::{Principal, ServeConfig};

use crate::cli::{CliError, McpArgs};

/// `opledger mcp`.
pub async fn run(args: McpArgs) -> Result<(), CliError> {
    let config = opledger_http_api::config::load(&args.config)
        .map_err(|error| CliError::Config(error.to_string()))?;
    let tenant = tenant_of(&config, &args)?;
    // The client ends the session by closing stdin; SIGTERM (which clients send a child they
    // stop) or Ctrl-C end it too, with the same clean shutdown as `serve`.
    Ok(opledger_http_api::run_mcp_stdio(config, tenant, crate::serve::shutdown_signal()).await?)
}

/// The tenant `args` name, which the configuration must know.
fn tenant_of(config: &ServeConfig, args: &McpArgs) -> Result<TenantId, CliError> {
    let configured = || {
        config
            .tokens
            .values()
            .filter_map(|principal| match principal {
                Principal::Tenant(tenant) => Some(tenant),
                _ => None,
            })
    };
    match (&args.tenant, &args.token) {
        (Some(tenant), None) => {
            let tenant = TenantId::new(tenant.clone())?;
            if configured().any(|known| *known == tenant) {
                Ok(tenant)
            } else {
                Err(CliError::Config(format!(
                    "tenant `{tenant}` is not in {}; name one of its [[tenants]]",
                    args.config.display()
                )))
            }
        }
        (None, Some(token)) => match config.tokens.get(token) {
            Some(Principal::Tenant(tenant)) => Ok(tenant.clone()),
            Some(_) => Err(CliError::Config(
                "that token is an operator's or an approver's; MCP tools act for a tenant: give a tenant's token".to_owned(),
            )),
            None => Err(CliError::Config(format!(
                "the token is not one of {}'s [[tenants]] tokens",
                args.config.display()
            ))),
        },
        _ => Err(CliError::Config(
            "name the tenant with --tenant ID or its token with --token (or OPLEDGER_TOKEN), one of them".to_owned(),
        )),
    }
}
