//! How the KurrentDB store is configured: a `kurrentdb://…` / `esdb://…` connection string (single
//! node, `+discover` DNS discovery or a comma-separated seed list; `tls`, `tlsVerifyCert`,
//! `tlsCaFile`, `nodePreference`, …, as the official client reads them), credentials from
//! environment variables, and opledger's own limits.
//!
//! Secrets never appear in `Debug` output or errors.

use std::fmt;

use kurrentdb::{ClientSettings, Credentials};
use opledger_domain::store::OPERATION_STREAM_PREFIX;

use super::KurrentDbError;

/// The environment variable holding the KurrentDB user name.
pub const USERNAME_VAR: &str = "OPLEDGER_KURRENTDB_USERNAME";
/// The environment variable holding the KurrentDB password.
pub const PASSWORD_VAR: &str = "OPLEDGER_KURRENTDB_PASSWORD";

/// How long an append may take before its outcome is unknown, in milliseconds. Shorter than the
/// engine's lease, so an unclear append is resolved while the claim still holds.
pub const DEFAULT_APPEND_DEADLINE_MS: u64 = 5_000;
/// How long a read may take, in milliseconds.
pub const DEFAULT_READ_DEADLINE_MS: u64 = 10_000;
/// How many times in a row a subscription reconnects before it reports the store unavailable.
pub const DEFAULT_RESUBSCRIBE_ATTEMPTS: u32 = 12;
/// The first pause before a subscription reconnects, in milliseconds; it doubles per attempt.
pub const RESUBSCRIBE_FIRST_PAUSE_MS: u64 = 50;
/// The longest pause before a subscription reconnects, in milliseconds.
pub const RESUBSCRIBE_MAX_PAUSE_MS: u64 = 2_000;
/// The schemes the store accepts; the client also knows a few aliases, which are refused so a
/// configuration reads the same everywhere.
pub const SCHEMES: [&str; 4] = ["kurrentdb", "kurrentdb+discover", "esdb", "esdb+discover"];

/// Everything the KurrentDB store needs to know.
#[derive(Clone)]
pub struct KurrentDbConfig {
    /// The client's parsed settings.
    pub(super) settings: ClientSettings,
    /// Credentials for every call; from the environment, else from the connection string.
    pub(super) credentials: Option<Credentials>,
    /// Deadline of every append, in milliseconds.
    pub append_deadline_ms: u64,
    /// Deadline of every read, in milliseconds.
    pub read_deadline_ms: u64,
    /// Reconnections in a row a subscription tries before it gives up.
    pub resubscribe_attempts: u32,
    /// Prepended to every stream name on the server: several ledgers (or test runs) can share a
    /// cluster without seeing each other. Empty in a normal deployment.
    pub namespace: String,
    /// The global log of the port is made of the streams whose name starts with this prefix
    /// (after the namespace): [`OPERATION_STREAM_PREFIX`] unless a test needs every stream.
    pub log_prefix: String,
}

impl fmt::Debug for KurrentDbConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KurrentDbConfig")
            .field("hosts", &self.settings.hosts())
            .field("tls", &self.settings.is_secure_mode_enabled())
            .field("node_preference", &self.settings.node_preference())
            .field("credentials", &self.credentials.as_ref().map(|_| "<set>"))
            .field("append_deadline_ms", &self.append_deadline_ms)
            .field("read_deadline_ms", &self.read_deadline_ms)
            .field("resubscribe_attempts", &self.resubscribe_attempts)
            .field("namespace", &self.namespace)
            .field("log_prefix", &self.log_prefix)
            .finish()
    }
}

impl KurrentDbConfig {
    /// Parses `connection_string` and reads the credential variables from the environment.
    pub fn from_connection_string(connection_string: &str) -> Result<Self, KurrentDbError> {
        Self::parse(connection_string, |name| std::env::var(name).ok())
    }

    /// Parses `connection_string`, looking credential variables up with `env` (tests pass a map).
    pub fn parse(
        connection_string: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, KurrentDbError> {
        let scheme = connection_string
            .split_once("://")
            .map(|(scheme, _)| scheme.to_ascii_lowercase())
            .unwrap_or_default();
        if !SCHEMES.contains(&scheme.as_str()) {
            return Err(KurrentDbError::InvalidConnectionString {
                reason: format!(
                    "it must start with one of {}",
                    SCHEMES.map(|scheme| format!("{scheme}://")).join(", ")
                ),
            });
        }
        let settings: ClientSettings =
            connection_string
                .parse()
                .map_err(|error: kurrentdb::ClientSettingsParseError| {
                    // The client's message may quote the whole string, password included.
                    KurrentDbError::InvalidConnectionString {
                        reason: redact(&error.to_string(), connection_string),
                    }
                })?;
        let credentials = match (env(USERNAME_VAR), env(PASSWORD_VAR)) {
            (Some(user), Some(password)) => Some(Credentials::new(user, password)),
            (None, None) => settings.default_authenticated_user().clone(),
            _ => {
                return Err(KurrentDbError::Credentials {
                    reason: format!("set both {USERNAME_VAR} and {PASSWORD_VAR}, or neither"),
                })
            }
        };
        Ok(Self {
            settings,
            credentials,
            append_deadline_ms: DEFAULT_APPEND_DEADLINE_MS,
            read_deadline_ms: DEFAULT_READ_DEADLINE_MS,
            resubscribe_attempts: DEFAULT_RESUBSCRIBE_ATTEMPTS,
            namespace: String::new(),
            log_prefix: OPERATION_STREAM_PREFIX.to_owned(),
        })
    }

    /// Whether calls carry credentials.
    pub fn has_credentials(&self) -> bool {
        self.credentials.is_some()
    }

    /// Whether the connection uses TLS.
    pub fn uses_tls(&self) -> bool {
        self.settings.is_secure_mode_enabled()
    }

    /// The server-side prefix of the streams that make up the global log.
    pub(super) fn log_stream_prefix(&self) -> String {
        format!("{}{}", self.namespace, self.log_prefix)
    }

    /// Checks the parts a caller may have changed.
    pub(super) fn validate(&self) -> Result<(), KurrentDbError> {
        let prefix = self.log_stream_prefix();
        if prefix.is_empty() || prefix.starts_with('$') {
            return Err(KurrentDbError::InvalidConnectionString {
                reason: format!(
                    "the log's stream prefix `{prefix}` must be non-empty and not a system stream prefix ($)"
                ),
            });
        }
        if self.append_deadline_ms == 0 || self.read_deadline_ms == 0 {
            return Err(KurrentDbError::InvalidConnectionString {
                reason: "deadlines must be positive".into(),
            });
        }
        Ok(())
    }
}

/// Replaces the password of `connection_string`, if it has one, in `text`.
fn redact(text: &str, connection_string: &str) -> String {
    let password = connection_string
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(user_info, _)| user_info.split_once(':'))
        .map(|(_, password)| password)
        .filter(|password| !password.is_empty());
    match password {
        Some(password) => text.replace(password, "<redacted>"),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn single_node_cluster_and_discovery_strings_are_accepted_with_their_tls_settings() {
        let single = KurrentDbConfig::parse("esdb://localhost:2113?tls=false", env(&[])).unwrap();
        assert_eq!(single.settings.hosts().len(), 1);
        assert!(!single.uses_tls());
        let cluster = KurrentDbConfig::parse(
            "kurrentdb://node1:2113,node2:2113,node3:2113?tls=true&tlsVerifyCert=true&nodePreference=leader",
            env(&[]),
        )
        .unwrap();
        assert_eq!(cluster.settings.hosts().len(), 3);
        assert!(cluster.uses_tls());
        assert_eq!(
            cluster.settings.node_preference(),
            kurrentdb::NodePreference::Leader
        );
        let discover =
            KurrentDbConfig::parse("kurrentdb+discover://cluster.example:2113", env(&[])).unwrap();
        assert!(discover.settings.is_dns_discovery_enabled());
        assert_eq!(discover.log_prefix, OPERATION_STREAM_PREFIX);
    }

    #[test]
    fn other_schemes_and_malformed_strings_are_refused_without_echoing_the_password() {
        assert!(matches!(
            KurrentDbConfig::parse("http://localhost:2113", env(&[])),
            Err(KurrentDbError::InvalidConnectionString { .. })
        ));
        let refused =
            KurrentDbConfig::parse("esdb://admin:hunter2@localhost:2113?tls=maybe", env(&[]))
                .unwrap_err();
        assert!(!refused.to_string().contains("hunter2"), "{refused}");
    }

    #[test]
    fn credentials_come_from_both_variables_or_the_string_and_never_show_in_debug() {
        let from_env = KurrentDbConfig::parse(
            "esdb://localhost:2113",
            env(&[(USERNAME_VAR, "ops"), (PASSWORD_VAR, "s3cret")]),
        )
        .unwrap();
        assert!(from_env.has_credentials());
        assert!(!format!("{from_env:?}").contains("s3cret"));
        let from_string =
            KurrentDbConfig::parse("esdb://admin:changeit@localhost:2113", env(&[])).unwrap();
        assert!(from_string.has_credentials());
        assert!(!format!("{from_string:?}").contains("changeit"));
        let half = KurrentDbConfig::parse("esdb://localhost:2113", env(&[(USERNAME_VAR, "ops")]));
        assert!(matches!(half, Err(KurrentDbError::Credentials { .. })));
    }

    #[test]
    fn a_log_prefix_that_would_cover_system_streams_is_refused() {
        let mut config = KurrentDbConfig::parse("esdb://localhost:2113", env(&[])).unwrap();
        assert!(config.validate().is_ok());
        config.log_prefix = String::new();
        assert!(config.validate().is_err());
        config.log_prefix = "$all".into();
        assert!(config.validate().is_err());
    }
}
