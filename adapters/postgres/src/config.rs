//! What the PostgreSQL store connects to and the limits it runs under.
//!
//! The URL is libpq's (`postgres://user@host:5432/database?sslmode=require`). A password may be
//! in it, but need not be: like libpq, the store takes `PGPASSWORD` (and `PGUSER`) from the
//! environment when the URL names none, so a password can stay out of configuration files. The
//! password is never logged or echoed back in an error.

use std::str::FromStr;
use std::time::Duration;

use crate::{CertificateCheck, PostgresError};

/// The environment variable holding the password when the URL carries none (libpq's name).
pub const PASSWORD_VAR: &str = "PGPASSWORD";
/// The environment variable holding the user name when the URL names none (libpq's name).
pub const USER_VAR: &str = "PGUSER";
/// The URL schemes this store answers to.
pub const SCHEMES: [&str; 2] = ["postgres://", "postgresql://"];

/// Connections in the read pool when the configuration names no other number. The writer has
/// its own connection, outside the pool, so reads never wait behind a group commit.
pub const DEFAULT_POOL_SIZE: usize = 8;
/// Most connections one store opens to the server for reads: PostgreSQL's default
/// `max_connections` is 100, and several instances share it.
pub const MAX_POOL_SIZE: usize = 64;
const _: () = assert!(1 <= DEFAULT_POOL_SIZE && DEFAULT_POOL_SIZE <= MAX_POOL_SIZE);

/// Longest a statement may run (the server's `statement_timeout`), in ms, so a stuck query
/// (a lock held by a dead peer, a server under strain) cannot hold a request for ever.
pub const DEFAULT_STATEMENT_TIMEOUT_MS: u64 = 5_000;
/// Longest a session may sit inside a transaction without sending anything, in ms (the server's
/// `idle_in_transaction_session_timeout`): an instance that dies, or whose connection is cut,
/// mid-commit holds the log's position lock, and the server releases it after this long.
pub const DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_MS: u64 = 10_000;
/// Longest a connection attempt may take, in ms.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Longest a read waits for a free pooled connection, in ms.
pub const DEFAULT_POOL_WAIT_MS: u64 = 5_000;
const _: () = assert!(DEFAULT_STATEMENT_TIMEOUT_MS < DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_MS);
/// Longest the client waits for the server's answer to one round trip (a read, the writer's
/// pipelined transaction, its COMMIT), in ms. The server's `statement_timeout` bounds the work
/// it does; this bounds what it cannot: a network path that drops answers without a reset, a
/// host that died, a COMMIT waiting for a synchronous standby that is gone. Above the statement
/// timeout, so a statement the server gives up on is answered as the server's refusal.
pub const DEFAULT_ROUND_TRIP_TIMEOUT_MS: u64 = 10_000;
const _: () = assert!(DEFAULT_STATEMENT_TIMEOUT_MS < DEFAULT_ROUND_TRIP_TIMEOUT_MS);
/// Idle time before the kernel probes a connection with TCP keepalives, in s; with
/// [`TCP_KEEPALIVE_INTERVAL_S`] and [`TCP_KEEPALIVE_RETRIES`], a peer that vanished without a
/// reset is found in about 25 s even on an idle connection (the operating system's default is
/// two hours).
pub const TCP_KEEPALIVE_IDLE_S: u64 = 10;
/// Pause between unanswered keepalive probes, in s.
pub const TCP_KEEPALIVE_INTERVAL_S: u64 = 5;
/// Unanswered keepalive probes before the kernel closes the connection.
pub const TCP_KEEPALIVE_RETRIES: u32 = 3;
/// How often a caught-up subscription reads the log without a notice, in ms. Other instances'
/// commits wake it at once through `LISTEN`/`NOTIFY`; the poll finds those whose notification
/// was lost (the listening connection was down), within this delay. The SQLite store's value.
pub const DEFAULT_SUBSCRIPTION_POLL_MS: u64 = 250;
/// The longest poll a configuration may set, in ms (an hour: tests set it to show that the
/// notification, not the poll, wakes a subscriber).
pub const MAX_SUBSCRIPTION_POLL_MS: u64 = 3_600_000;
const _: () = assert!(
    10 <= DEFAULT_SUBSCRIPTION_POLL_MS && DEFAULT_SUBSCRIPTION_POLL_MS <= MAX_SUBSCRIPTION_POLL_MS
);

/// The limits a configuration file may set (`[store]` in `opledger serve`'s file); each `None`
/// keeps the default named beside its field in [`PostgresConfig`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreLimits {
    /// Read connections at most (1 to [`MAX_POOL_SIZE`]; default [`DEFAULT_POOL_SIZE`]).
    pub pool_size: Option<usize>,
    /// The wait for a free pooled connection, in ms (default [`DEFAULT_POOL_WAIT_MS`]).
    pub pool_wait_ms: Option<u64>,
    /// The wait for a connection to open, in ms (default [`DEFAULT_CONNECT_TIMEOUT_MS`]).
    pub connect_timeout_ms: Option<u64>,
    /// The server's `statement_timeout`, in ms (default [`DEFAULT_STATEMENT_TIMEOUT_MS`]).
    pub statement_timeout_ms: Option<u64>,
    /// The server's `idle_in_transaction_session_timeout`, in ms (default
    /// [`DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_MS`]).
    pub idle_in_transaction_timeout_ms: Option<u64>,
    /// The client's wait for one round trip's answer, in ms (default
    /// [`DEFAULT_ROUND_TRIP_TIMEOUT_MS`]).
    pub round_trip_timeout_ms: Option<u64>,
    /// How often a caught-up subscription reads the log without a notice, in ms (default
    /// [`DEFAULT_SUBSCRIPTION_POLL_MS`]).
    pub subscription_poll_ms: Option<u64>,
}

impl StoreLimits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        *self != Self::default()
    }
}

/// The connection settings and limits of a [`crate::PostgresStore`].
#[derive(Clone)]
pub struct PostgresConfig {
    /// The parsed URL, with the password from the environment filled in.
    pub(crate) connect: tokio_postgres::Config,
    /// Read connections at most.
    pub pool_size: usize,
    /// `statement_timeout`, in ms.
    pub statement_timeout_ms: u64,
    /// `idle_in_transaction_session_timeout`, in ms.
    pub idle_in_transaction_timeout_ms: u64,
    /// The wait for a connection to open, in ms.
    pub connect_timeout_ms: u64,
    /// The wait for a free pooled connection, in ms.
    pub pool_wait_ms: u64,
    /// The client's wait for the answer to one round trip, in ms.
    pub round_trip_timeout_ms: u64,
    /// How often a caught-up subscription reads the log without a notice, in ms.
    pub subscription_poll_ms: u64,
    /// How the server's TLS certificate is checked (the URL's `sslmode`).
    pub certificate_check: CertificateCheck,
}

impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `tokio_postgres::Config`'s own Debug redacts the password; the target alone is enough.
        f.debug_struct("PostgresConfig")
            .field("target", &self.target())
            .field("pool_size", &self.pool_size)
            .field("statement_timeout_ms", &self.statement_timeout_ms)
            .finish_non_exhaustive()
    }
}

impl PostgresConfig {
    /// Parses a URL, taking the password (and user) from the environment when it names none.
    pub fn from_url(url: &str) -> Result<Self, PostgresError> {
        Self::from_url_and_env(url, |name| std::env::var(name).ok())
    }

    /// As [`Self::from_url`], with the environment given (tests).
    pub fn from_url_and_env(
        url: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, PostgresError> {
        if !SCHEMES.iter().any(|scheme| url.starts_with(scheme)) {
            return Err(PostgresError::InvalidUrl {
                reason: format!(
                    "`{}` does not start with postgres:// or postgresql://",
                    redact(url)
                ),
            });
        }
        // The client knows `disable`, `prefer` and `require`; the verifying modes are
        // `require` to it, and the certificate is checked by `tls.rs`.
        let (url, certificate_check) = split_sslmode(url);
        let url = url.as_str();
        let mut connect =
            tokio_postgres::Config::from_str(url).map_err(|error| PostgresError::InvalidUrl {
                reason: format!("`{}`: {error}", redact(url)),
            })?;
        if connect.get_hosts().is_empty() {
            return Err(PostgresError::InvalidUrl {
                reason: format!("`{}` names no host", redact(url)),
            });
        }
        if connect.get_user().is_none() {
            let user = env(USER_VAR)
                .filter(|user| !user.is_empty())
                .ok_or_else(|| PostgresError::InvalidUrl {
                    reason: format!(
                        "`{}` names no user; write postgres://USER@host/database or set {USER_VAR}",
                        redact(url)
                    ),
                })?;
            connect.user(&user);
        }
        if connect.get_password().is_none() {
            if let Some(password) = env(PASSWORD_VAR).filter(|password| !password.is_empty()) {
                connect.password(password);
            }
        }
        if connect.get_dbname().is_none() {
            return Err(PostgresError::InvalidUrl {
                reason: format!(
                    "`{}` names no database; write postgres://user@host:5432/DATABASE",
                    redact(url)
                ),
            });
        }
        connect.application_name("opledger");
        Ok(Self {
            connect,
            pool_size: DEFAULT_POOL_SIZE,
            statement_timeout_ms: DEFAULT_STATEMENT_TIMEOUT_MS,
            idle_in_transaction_timeout_ms: DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_MS,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            pool_wait_ms: DEFAULT_POOL_WAIT_MS,
            round_trip_timeout_ms: DEFAULT_ROUND_TRIP_TIMEOUT_MS,
            subscription_poll_ms: DEFAULT_SUBSCRIPTION_POLL_MS,
            certificate_check,
        })
    }

    /// Sets the limits a configuration gives, and checks them all together (a round trip's
    /// wait above the statement timeout, say); the error names the first that does not hold.
    pub fn apply(&mut self, limits: &StoreLimits) -> Result<(), PostgresError> {
        let StoreLimits {
            pool_size,
            pool_wait_ms,
            connect_timeout_ms,
            statement_timeout_ms,
            idle_in_transaction_timeout_ms,
            round_trip_timeout_ms,
            subscription_poll_ms,
        } = limits.clone();
        self.pool_size = pool_size.unwrap_or(self.pool_size);
        self.pool_wait_ms = pool_wait_ms.unwrap_or(self.pool_wait_ms);
        self.connect_timeout_ms = connect_timeout_ms.unwrap_or(self.connect_timeout_ms);
        self.statement_timeout_ms = statement_timeout_ms.unwrap_or(self.statement_timeout_ms);
        self.idle_in_transaction_timeout_ms =
            idle_in_transaction_timeout_ms.unwrap_or(self.idle_in_transaction_timeout_ms);
        self.round_trip_timeout_ms = round_trip_timeout_ms.unwrap_or(self.round_trip_timeout_ms);
        self.subscription_poll_ms = subscription_poll_ms.unwrap_or(self.subscription_poll_ms);
        self.check()
    }

    /// Names this instance to the server (`application_name`, seen in `pg_stat_activity`), so
    /// an operator can tell which instance holds a lock or runs a query.
    pub fn set_application_name(&mut self, name: &str) {
        self.connect.application_name(name);
    }

    /// Checks the limits; called by `connect_with` so a hand-built config is held to them too.
    pub(crate) fn check(&self) -> Result<(), PostgresError> {
        let invalid = |reason: String| Err(PostgresError::InvalidUrl { reason });
        if !(1..=MAX_POOL_SIZE).contains(&self.pool_size) {
            return invalid(format!(
                "pool_size is {}; it must be 1 to {MAX_POOL_SIZE}",
                self.pool_size
            ));
        }
        if self.statement_timeout_ms == 0 || self.idle_in_transaction_timeout_ms == 0 {
            return invalid(
                "statement_timeout_ms and idle_in_transaction_timeout_ms must be above 0 (0 turns the server's timeout off)"
                    .into(),
            );
        }
        if self.round_trip_timeout_ms <= self.statement_timeout_ms {
            return invalid(format!(
                "round_trip_timeout_ms is {} and statement_timeout_ms {}; the client's wait must be longer than the server's, or a slow statement would be cut by the client instead of refused by the server",
                self.round_trip_timeout_ms, self.statement_timeout_ms
            ));
        }
        if self.connect_timeout_ms == 0 || self.pool_wait_ms == 0 {
            return invalid("connect_timeout_ms and pool_wait_ms must be above 0".into());
        }
        if !(1..=MAX_SUBSCRIPTION_POLL_MS).contains(&self.subscription_poll_ms) {
            return invalid(format!(
                "subscription_poll_ms is {}; it must be 1 to {MAX_SUBSCRIPTION_POLL_MS}",
                self.subscription_poll_ms
            ));
        }
        Ok(())
    }

    /// The settings every connection opens with: the timeouts, the durability the store
    /// promises (`synchronous_commit = on`, whatever the server's default), and TCP keepalives
    /// and `tcp_user_timeout` so the kernel gives up on a peer that vanished without a reset.
    pub(crate) fn session(&self) -> tokio_postgres::Config {
        let mut connect = self.connect.clone();
        connect.options(format!(
            "-c statement_timeout={} -c idle_in_transaction_session_timeout={} -c synchronous_commit=on",
            self.statement_timeout_ms, self.idle_in_transaction_timeout_ms
        ));
        connect.connect_timeout(Duration::from_millis(self.connect_timeout_ms));
        connect.keepalives(true);
        connect.keepalives_idle(Duration::from_secs(TCP_KEEPALIVE_IDLE_S));
        connect.keepalives_interval(Duration::from_secs(TCP_KEEPALIVE_INTERVAL_S));
        connect.keepalives_retries(TCP_KEEPALIVE_RETRIES);
        // Linux only (the client ignores it elsewhere): data sent and not acknowledged by the
        // peer's kernel for this long closes the connection.
        connect.tcp_user_timeout(Duration::from_millis(self.round_trip_timeout_ms));
        connect
    }

    /// [`Self::session`] once per host of the URL, each naming that host alone, in the URL's
    /// order: the store tries them one by one so that it can check each server's ledger
    /// identity and move on to the next host when one holds an older copy.
    pub(crate) fn session_per_host(&self) -> Vec<(String, tokio_postgres::Config)> {
        let session = self.session();
        let hosts = session.get_hosts();
        let ports = session.get_ports();
        let addrs = session.get_hostaddrs();
        if hosts.len() <= 1 {
            return vec![(self.target(), session)];
        }
        (0..hosts.len())
            .map(|index| {
                let mut one = session.clone_without_hosts();
                let port = ports.get(index).or(ports.first()).copied().unwrap_or(5432);
                let name = match &hosts[index] {
                    tokio_postgres::config::Host::Tcp(host) => {
                        one.host(host);
                        host.clone()
                    }
                    #[cfg(unix)]
                    tokio_postgres::config::Host::Unix(path) => {
                        one.host_path(path);
                        path.display().to_string()
                    }
                };
                if let Some(addr) = addrs.get(index) {
                    one.hostaddr(*addr);
                }
                one.port(port);
                (
                    format!("{}@{name}:{port}/{}", self.user(), self.database()),
                    one,
                )
            })
            .collect()
    }

    /// `user@host:port/database`, without the password, for messages and logs.
    pub fn target(&self) -> String {
        let host = match self.connect.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            #[cfg(unix)]
            Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
            None => "?".into(),
        };
        let port = self.connect.get_ports().first().copied().unwrap_or(5432);
        format!(
            "{}@{host}:{port}/{}",
            self.connect.get_user().unwrap_or("?"),
            self.connect.get_dbname().unwrap_or("?")
        )
    }

    /// The user the store connects as.
    pub(crate) fn user(&self) -> &str {
        self.connect.get_user().unwrap_or("?")
    }

    /// The database the store uses.
    pub(crate) fn database(&self) -> &str {
        self.connect.get_dbname().unwrap_or("?")
    }

    /// Whether a password will be sent.
    pub(crate) fn has_password(&self) -> bool {
        self.connect.get_password().is_some()
    }
}

/// A copy of a client configuration without its hosts, ports and host addresses (the client
/// has no way to remove them from a configuration).
trait WithoutHosts {
    fn clone_without_hosts(&self) -> tokio_postgres::Config;
}

impl WithoutHosts for tokio_postgres::Config {
    fn clone_without_hosts(&self) -> tokio_postgres::Config {
        let mut one = tokio_postgres::Config::new();
        if let Some(user) = self.get_user() {
            one.user(user);
        }
        if let Some(password) = self.get_password() {
            one.password(password);
        }
        if let Some(dbname) = self.get_dbname() {
            one.dbname(dbname);
        }
        if let Some(options) = self.get_options() {
            one.options(options);
        }
        if let Some(name) = self.get_application_name() {
            one.application_name(name);
        }
        if let Some(timeout) = self.get_connect_timeout() {
            one.connect_timeout(*timeout);
        }
        if let Some(timeout) = self.get_tcp_user_timeout() {
            one.tcp_user_timeout(*timeout);
        }
        one.ssl_mode(self.get_ssl_mode())
            .ssl_negotiation(self.get_ssl_negotiation())
            .keepalives(self.get_keepalives())
            .keepalives_idle(self.get_keepalives_idle())
            .target_session_attrs(self.get_target_session_attrs())
            .channel_binding(self.get_channel_binding());
        if let Some(interval) = self.get_keepalives_interval() {
            one.keepalives_interval(interval);
        }
        if let Some(retries) = self.get_keepalives_retries() {
            one.keepalives_retries(retries);
        }
        one
    }
}

/// The URL with any password replaced, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            let user = credentials.split(':').next().unwrap_or("");
            format!("{}://{user}@{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// The URL with `sslmode=verify-ca` or `verify-full` written as `require`, and how the
/// certificate is to be checked: libpq's meanings, where every other mode verifies nothing.
fn split_sslmode(url: &str) -> (String, CertificateCheck) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), CertificateCheck::None);
    };
    let mut check = CertificateCheck::None;
    let params: Vec<&str> = query
        .split('&')
        .map(|param| match param {
            "sslmode=verify-full" => {
                check = CertificateCheck::Full;
                "sslmode=require"
            }
            "sslmode=verify-ca" => {
                check = CertificateCheck::Chain;
                "sslmode=require"
            }
            other => other,
        })
        .collect();
    (format!("{base}?{}", params.join("&")), check)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_verify_modes_check_the_certificate_and_the_client_sees_them_as_require() {
        let check = |url: &str| {
            PostgresConfig::from_url_and_env(url, |_| None)
                .expect("a usable URL")
                .certificate_check
        };
        let base = "postgres://u@db.internal:5432/ledger";
        assert_eq!(check(base), CertificateCheck::None);
        for mode in ["disable", "prefer", "require"] {
            assert_eq!(
                check(&format!("{base}?sslmode={mode}")),
                CertificateCheck::None
            );
        }
        assert_eq!(
            check(&format!("{base}?connect_timeout=3&sslmode=verify-ca")),
            CertificateCheck::Chain
        );
        let full = PostgresConfig::from_url_and_env(
            &format!("{base}?sslmode=verify-full&application_name=x"),
            |_| None,
        )
        .expect("a usable URL");
        assert_eq!(full.certificate_check, CertificateCheck::Full);
        assert_eq!(
            full.connect.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
    }

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        }
    }

    #[test]
    fn the_password_comes_from_pgpassword_when_the_url_has_none() {
        let config = PostgresConfig::from_url_and_env(
            "postgres://ledger@db.internal:5433/opledger",
            env(&[(PASSWORD_VAR, "s3cret")]),
        )
        .expect("a valid URL");
        assert_eq!(config.connect.get_password(), Some(&b"s3cret"[..]));
        assert_eq!(config.target(), "ledger@db.internal:5433/opledger");
    }

    #[test]
    fn a_password_in_the_url_wins_and_is_never_shown() {
        let url = "postgres://ledger:inurl@db:5432/opledger";
        let config = PostgresConfig::from_url_and_env(url, env(&[(PASSWORD_VAR, "env")]))
            .expect("a valid URL");
        assert_eq!(config.connect.get_password(), Some(&b"inurl"[..]));
        assert!(!format!("{config:?}").contains("inurl"));
        assert_eq!(redact(url), "postgres://ledger@db:5432/opledger");
    }

    #[test]
    fn urls_without_a_user_database_or_host_are_refused_with_what_to_write() {
        let refused = |url: &str| {
            PostgresConfig::from_url_and_env(url, env(&[]))
                .expect_err("refused")
                .to_string()
        };
        assert!(refused("postgres://db:5432/x").contains("names no user"));
        assert!(refused("postgres://u@db:5432").contains("names no database"));
        assert!(refused("mysql://u@db/x").contains("postgres://"));
        assert!(refused("postgres://u:pw@db:notaport/x").contains("not usable"));
        assert!(!refused("postgres://u:pw@db:notaport/x").contains("pw"));
    }
}
