//! `opledger stand`: the fault-injecting CRM stand as a process of its own, for trying adapters,
//! scripting faults with curl, or pointing a local `opledger` at it.

use std::net::SocketAddr;

use opledger_crm_stand::{Stand, StandConfig};

use crate::cli::{CliError, StandArgs};

pub async fn run(args: StandArgs) -> Result<(), CliError> {
    let listen: SocketAddr = args.listen.parse().map_err(|_| {
        CliError::Other(format!(
            "--listen `{}` is not an address such as 127.0.0.1:8787",
            args.listen
        ))
    })?;
    let config = StandConfig {
        key_retention_s: args.key_retention_s,
        search_lag_ms: args.search_lag_ms,
        ..StandConfig::default()
    };
    let accounts: Vec<String> = config
        .accounts
        .iter()
        .map(|(account, token)| format!("{account} (token {token})"))
        .collect();
    let stand = Stand::start(listen, config)
        .await
        .map_err(|error| CliError::Other(error.to_string()))?;
    println!("CRM stand listening on {}", stand.base_url());
    println!("accounts: {}", accounts.join(", "));
    println!(
        "shapes: /keyed, /labelled, /plain; admin API under /admin (see `opledger stand --help`)"
    );
    println!("press Ctrl-C to stop");
    let _ = tokio::signal::ctrl_c().await;
    stand.shutdown().await;
    Ok(())
}
