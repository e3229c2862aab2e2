//! A directory with a ledger and a configuration naming one preset connector, from which real
//! `opledger serve` processes start (the serve suite's [`Server`] talks to them).

use std::path::PathBuf;

use tempfile::TempDir;

use crate::support::Server;

/// Tenant A's bearer token at the ledger.
pub const TENANT_TOKEN: &str = "tenant-a-token-0123456789";
/// The ledger's id for the one provider account the tests act in.
pub const ACCOUNT: &str = "main";
/// How long one request to the emulator may take before it counts as lost, in milliseconds:
/// short, so a held answer becomes `unknown` quickly.
pub const REQUEST_TIMEOUT_MS: u64 = 1_000;
/// The workers' claim on an operation, in milliseconds: just above the longest send (twice the
/// request timeout), so a killed worker's claim runs out soon after a restart.
pub const LEASE_MS: u64 = 2 * REQUEST_TIMEOUT_MS + 500;

/// A ledger directory and its configuration file.
pub struct Ledger {
    pub dir: TempDir,
    pub config: PathBuf,
}

impl Ledger {
    /// A configuration whose one connector is `connector` (a `[[connectors]]` entry without its
    /// accounts), bound to [`ACCOUNT`] with `token`; `files` are written beside it.
    pub fn new(connector: &str, token: &str, files: &[(&str, String)]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("serve.toml");
        let store = dir.path().join("ledger.db");
        let views = dir.path().join("ledger.views");
        let text = format!(
            r#"
listen = "127.0.0.1:0"
store = "sqlite://{store}"
views = "{views}"

[engine]
lease_ms = {LEASE_MS}
workers = 4
backoff_base_ms = 50
backoff_max_ms = 200
max_attempts = 3
max_total_ms = 60000
max_reconciliations = 30

[[tenants]]
id = "tenant-a"
token = "{TENANT_TOKEN}"

{connector}
request_timeout_ms = {REQUEST_TIMEOUT_MS}
connect_timeout_ms = 500

[[connectors.accounts]]
id = "{ACCOUNT}"
tenants = ["tenant-a"]
token = "{token}"
"#,
            store = store.display(),
            views = views.display(),
        );
        std::fs::write(&config, text).expect("config written");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("connector file written");
        }
        Self { dir, config }
    }

    /// Starts `opledger serve` on this configuration.
    pub fn serve(&self) -> Server {
        Server::start_with(
            &["serve", "--config", &self.config.display().to_string()],
            self.dir.path(),
        )
    }

    /// Replaces `from` with `to` in the configuration (the server reads it when it starts).
    pub fn rewrite(&self, from: &str, to: &str) {
        let text = std::fs::read_to_string(&self.config).expect("the configuration reads");
        assert!(text.contains(from), "`{from}` is in the configuration");
        std::fs::write(&self.config, text.replace(from, to)).expect("the configuration is written");
    }
}
