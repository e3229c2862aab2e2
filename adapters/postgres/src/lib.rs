//! The event store on PostgreSQL: the shared store for several `opledger serve` instances on
//! one database, for teams that already run PostgreSQL.
//!
//! # Global positions: one transaction at a time, in position order
//!
//! The classic trap of a log in PostgreSQL is a position taken from a sequence: transaction A
//! takes 41, transaction B takes 42, B commits first, and a subscriber that reads "after 40"
//! sees 42, moves its checkpoint to 42 and never sees 41 when A commits a moment later. A
//! subscriber must never be able to see a position while a lower one can still commit.
//!
//! This store makes that impossible by serialising position assignment with commit. Every
//! transaction that writes events first locks the single row of `opledger.log_head`
//! (`SELECT … FOR UPDATE`), takes its positions from it, writes, moves it, and commits; the row
//! lock is released only after the commit is visible to every new snapshot (PostgreSQL removes
//! a transaction from the running set before it releases its locks). So the next writer, on any
//! instance, gets its positions only after every lower position is committed and visible, and
//! "read after my last position" can never skip one.
//!
//! The price is that writers of one database commit one transaction at a time. Group commit
//! pays it back: each store has one writer task with one connection (`writer.rs`) that takes
//! every append queued meanwhile into the same transaction, as the SQLite store does, so
//! concurrency raises the size of a commit, not the number of commits waiting for the lock.
//! The alternative, visibility by snapshot (`xid8` and `pg_snapshot_xmin`, reading only below
//! the oldest running writer), lets writers commit in parallel but makes every subscriber
//! query depend on transaction ids (wraparound, `xid8` only from PostgreSQL 13, a long
//! transaction elsewhere stalling every subscriber); with group commit the serial design was
//! simpler and fast enough, and `tests/postgres.rs` tries hard to break it.
//!
//! # What else it promises
//! - the port's append rules, shared with the SQLite and memory stores (`opledger-store-core`),
//!   so they cannot drift apart;
//! - an append is acknowledged only after its COMMIT returned; one whose COMMIT answer was lost
//!   is resolved by applying it again (same event ids: found stored, or written now), never
//!   written twice, and reported as "outcome unknown" if the database cannot be asked;
//! - the schema is created and migrated by opledger (or on its own by `opledger migrate`),
//!   versioned, and a newer one is refused (`schema.rs`);
//! - the transparency log's Merkle tree grows in the transaction of the events it covers, under
//!   the same lock, so it follows the position order exactly whatever the number of instances
//!   (`tree.rs`), and each tenant's tree beside it (`tenant_trees.rs`);
//! - reads use a pool of at most [`PostgresConfig::pool_size`] connections; every statement has
//!   a `statement_timeout`, so a stuck query cannot hold a request for ever.
//!
//! Subscriptions (the SQLite store's catch-up subscription, from `opledger-store-core`) wake
//! at once for this store's own commits, and for other instances' through `LISTEN`/`NOTIFY`
//! (`listener.rs`); a poll every [`PostgresConfig::subscription_poll_ms`] finds what a lost
//! notification did not announce.

mod codec;
mod config;
mod identity;
mod listener;
mod review_claims;
mod schema;
mod subject_keys;
mod tenant_trees;
mod tls;
mod tree;
mod webhook_journal;
mod writer;

// The SQLite store's rules and catch-up subscription, from the crate both stores depend on.
pub use opledger_store_core::marks::{LogMarks, StreamAhead};
use opledger_store_core::{queue, rules, subscription};

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use opledger_domain::ids::{GlobalPosition, StreamVersion};
use opledger_domain::merkle::{Hash, LogTree, TenantHeads, HASH_SIZE};
use opledger_domain::store::{
    AppendOutcome, EventData, EventStore, ExpectedVersion, LogStart, RecordedEvent, StoreError,
    StreamName, Subscription, MAX_READ_BATCH,
};
use tokio::sync::{mpsc, watch};
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

pub use config::{
    redact, PostgresConfig, StoreLimits, DEFAULT_CONNECT_TIMEOUT_MS,
    DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_MS, DEFAULT_POOL_SIZE, DEFAULT_POOL_WAIT_MS,
    DEFAULT_ROUND_TRIP_TIMEOUT_MS, DEFAULT_STATEMENT_TIMEOUT_MS, DEFAULT_SUBSCRIPTION_POLL_MS,
    MAX_POOL_SIZE, MAX_SUBSCRIPTION_POLL_MS, PASSWORD_VAR, SCHEMES, USER_VAR,
};
pub use listener::LISTEN_RETRY_PAUSE_MS;
pub use review_claims::{ClaimAsk, ClaimRow, ReviewClaims};
pub use schema::{Migration, SCHEMA_VERSION};
pub use subject_keys::{PostgresKeyTable, DESTROY_TIMEOUT_MS, WRITE_ATTEMPTS};
pub use tls::CertificateCheck;
pub use webhook_journal::{
    WebhookAttemptRow, WebhookEndpointRow, WebhookFence, WebhookJournal, WebhookLeaseAsk,
    MAX_WEBHOOK_ATTEMPTS_KEPT,
};
pub use writer::{ROUND_TRIPS_PER_CHECKED_COMMIT, ROUND_TRIPS_PER_COMMIT};

use self::identity::Identity;
use self::subscription::{CatchUp, LogSource};
use self::writer::{AppendRequest, Writer};

/// Most appends waiting for the writer; callers beyond it wait for room (back-pressure).
pub const APPEND_QUEUE_CAPACITY: usize = 1024;
/// Most appends one group commit carries.
pub const MAX_APPENDS_PER_COMMIT: usize = 256;
/// How many times a commit whose answer was lost is asked about again before the appends are
/// answered "outcome unknown".
pub const RESOLVE_ATTEMPTS: u32 = 3;
/// The pause before the n-th renewed ask, n times this, in ms.
pub const RESOLVE_PAUSE_MS: u64 = 200;
const _: () = assert!(MAX_APPENDS_PER_COMMIT <= APPEND_QUEUE_CAPACITY);

/// How well group commit is working: transactions that wrote events, and the appends they
/// wrote; `appends / commits` is how many callers shared one commit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Transactions committed that wrote at least one event.
    pub commits: u64,
    /// Appends written by those transactions.
    pub appends: u64,
}

/// The counters behind [`CommitStats`], moved by the writer.
#[derive(Debug, Default)]
pub(crate) struct CommitCounters {
    pub(crate) commits: std::sync::atomic::AtomicU64,
    pub(crate) appends: std::sync::atomic::AtomicU64,
}

/// Failures to set the store up, each saying what to do; once it runs, failures are the port's
/// [`StoreError`]s.
#[derive(Debug, thiserror::Error)]
pub enum PostgresError {
    /// The URL or a limit is not usable.
    #[error("the PostgreSQL store URL is not usable: {reason}")]
    InvalidUrl {
        /// What is wrong, without the password.
        reason: String,
    },
    /// No server answered.
    #[error("cannot reach PostgreSQL at {target} ({reason}); check that the server runs and listens on that host and port")]
    Unreachable {
        /// `user@host:port/database`.
        target: String,
        /// The client's reason.
        reason: String,
    },
    /// The server refused the credentials.
    #[error("PostgreSQL at {target} refused the credentials of user `{user}` ({reason}); put the right password in {PASSWORD_VAR} or the URL")]
    Authentication {
        /// `user@host:port/database`.
        target: String,
        /// The user.
        user: String,
        /// The server's reason.
        reason: String,
    },
    /// `sslmode=verify-ca` or `verify-full`, and the server's certificate is not trusted.
    #[error("PostgreSQL at {target} presented a TLS certificate this machine does not trust ({reason}); with sslmode={mode} it must chain to a root in the system's store (add the server's CA there), or use sslmode=require to encrypt without verifying it, as libpq does")]
    UntrustedCertificate {
        /// `user@host:port/database`.
        target: String,
        /// `verify-ca` or `verify-full`.
        mode: &'static str,
        /// The TLS library's reason.
        reason: String,
    },
    /// The database does not exist.
    #[error("PostgreSQL at {target} has no database `{database}`; create it (createdb {database}) or name another in the URL")]
    NoDatabase {
        /// `user@host:port/database`.
        target: String,
        /// The database named.
        database: String,
    },
    /// The database holds a ledger of a newer opledger.
    #[error("database `{database}` holds an opledger ledger of schema version {found}; this opledger reads up to version {supported}. Upgrade opledger; the database was left as it is")]
    NewerSchema {
        /// The database.
        database: String,
        /// The version found.
        found: i32,
        /// The newest version this build knows.
        supported: i32,
    },
    /// The schema is older than this build's, and the role connected may not change it.
    #[error("database `{database}` holds opledger's schema version {found}, this opledger needs version {needed}, and the role it connects as may not change the schema ({reason}). Run `opledger migrate --config FILE` once with a role that owns the schema (the database owner, say), then start opledger again")]
    SchemaNotOwned {
        /// The database.
        database: String,
        /// The version found.
        found: i32,
        /// The version this build needs.
        needed: i32,
        /// The server's reason.
        reason: String,
    },
    /// Anything else that kept the store from starting.
    #[error("the PostgreSQL store cannot start: {reason}")]
    Setup {
        /// What went wrong.
        reason: String,
    },
}

/// Opens connections with the store's session settings and TLS, each bounded in time, each
/// checked to reach this ledger's current copy (`identity.rs`) before it is handed out.
pub(crate) struct Connector {
    /// The URL's settings, every host in it: the first connection's, for the start's refusals.
    config: tokio_postgres::Config,
    /// One configuration per host, in the URL's order, each named `user@host:port/database`.
    hosts: Vec<(String, tokio_postgres::Config)>,
    tls: MakeRustlsConnect,
    /// The longest a connection may take to open, startup and authentication included (the
    /// client's own `connect_timeout` covers only the TCP connect).
    connect_timeout: Duration,
    /// The longest the client waits for the answer to one round trip.
    pub(crate) round_trip: Duration,
    /// The ledger identity every connection is checked against.
    pub(crate) identity: Identity,
    /// Why the last connection that failed did, for a reader the pool can only say "failed" to.
    last_failure: Mutex<Option<String>>,
}

impl Connector {
    fn new(
        config: &PostgresConfig,
        seen: Arc<watch::Sender<Option<GlobalPosition>>>,
    ) -> Result<Self, PostgresError> {
        Ok(Self {
            config: config.session(),
            hosts: config.session_per_host(),
            tls: tls::connector(config.certificate_check)?,
            connect_timeout: Duration::from_millis(config.connect_timeout_ms),
            round_trip: Duration::from_millis(config.round_trip_timeout_ms),
            identity: Identity::new(seen),
            last_failure: Mutex::new(None),
        })
    }

    /// The first connection, to whichever host of the URL the client takes (its refusals are
    /// the start's), not yet checked: the caller prepares the schema, then learns the identity.
    async fn connect_first(&self) -> Result<(Client, RawConnection), ConnectFailure> {
        self.open(&self.config).await
    }

    async fn open(
        &self,
        config: &tokio_postgres::Config,
    ) -> Result<(Client, RawConnection), ConnectFailure> {
        match tokio::time::timeout(self.connect_timeout, config.connect(self.tls.clone())).await {
            Ok(connected) => connected.map_err(ConnectFailure::Refused),
            Err(_) => Err(ConnectFailure::NoAnswer(self.connect_timeout)),
        }
    }

    /// A connection to the first host of the URL that answers and holds this ledger's current
    /// copy, its I/O on its own task (ended when the connection is dropped). Each host's
    /// failure is in the answer when none passes; the identity check's refusal is recorded.
    pub(crate) async fn connect(&self) -> Result<Connection, StoreError> {
        let mut failures = Vec::with_capacity(self.hosts.len());
        for (host, config) in &self.hosts {
            let (client, connection) = match self.open(config).await {
                Ok(opened) => opened,
                Err(failure) => {
                    failures.push(format!("{host}: cannot connect: {failure}"));
                    continue;
                }
            };
            let connection = Connection::spawn(client, connection);
            match self.check(host, connection.client()).await {
                Ok(()) => {
                    *lock(&self.last_failure) = None;
                    return Ok(connection);
                }
                Err(reason) => failures.push(reason),
            }
        }
        let reason = failures.join("; ");
        *lock(&self.last_failure) = Some(reason.clone());
        Err(StoreError::Unavailable { reason })
    }

    /// Reads what `host` says of its ledger and checks it (bounded like any round trip).
    async fn check(&self, host: &str, client: &Client) -> Result<(), String> {
        let seen = self.identity.seen();
        let mut rereads = 0;
        loop {
            let found = self.read_identity(host, client).await?;
            if rereads < identity::HEAD_REREADS && self.identity.only_behind(&found, seen) {
                rereads += 1;
                tokio::time::sleep(Duration::from_millis(identity::HEAD_REREAD_PAUSE_MS)).await;
                continue;
            }
            return self.identity.check(host, &found, seen);
        }
    }

    async fn read_identity(&self, host: &str, client: &Client) -> Result<identity::Found, String> {
        match tokio::time::timeout(self.round_trip, identity::Found::read(client)).await {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(error)) => Err(format!(
                "{host}: cannot read the ledger's identity: {}",
                describe(&error)
            )),
            Err(_) => Err(format!(
                "{host}: no answer within {} ms to the ledger identity check",
                self.round_trip.as_millis()
            )),
        }
    }

    /// Why connections fail now: the identity refusal in force, else the last failure.
    pub(crate) fn failing(&self) -> Option<String> {
        self.identity
            .refusal()
            .or_else(|| lock(&self.last_failure).clone())
    }
}

/// Why a connection did not open.
#[derive(Debug)]
pub(crate) enum ConnectFailure {
    /// The client or the server refused (unreachable, credentials, TLS, …).
    Refused(tokio_postgres::Error),
    /// Nothing came back within the connect timeout (a silent network path or host).
    NoAnswer(Duration),
}

impl std::fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused(error) => f.write_str(&describe(error)),
            Self::NoAnswer(after) => write!(
                f,
                "no answer within {} ms (a network path or host that drops packets without a reset)",
                after.as_millis()
            ),
        }
    }
}

/// A connection to the server through the store's TLS set-up (plain TCP when `sslmode` says so).
pub(crate) type RawConnection =
    tokio_postgres::Connection<Socket, <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream>;

/// A client with the task driving its connection. Dropping it ends the task, which closes the
/// socket at once: a dropped client alone leaves the task waiting for answers it still expects,
/// for ever when the peer went silent.
pub(crate) struct Connection {
    pub(crate) client: Client,
    pub(crate) task: EndsOnDrop,
    /// The payloads of the notifications the connection receives (only the listener's
    /// `LISTEN`s); closed when the connection ends.
    pub(crate) notifications: mpsc::UnboundedReceiver<String>,
}

/// Drives a connection until it ends, passing its notifications on.
async fn drive(mut connection: RawConnection, notified: mpsc::UnboundedSender<String>) {
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(tokio_postgres::AsyncMessage::Notification(note))) => {
                // Nobody listening (the writer's and the pool's connections): nothing to pass on.
                let _ = notified.send(note.payload().to_owned());
            }
            Some(Ok(_)) => {}
            Some(Err(error)) => {
                tracing::debug!(error = %describe(&error), "a PostgreSQL connection closed");
                return;
            }
            None => return,
        }
    }
}

/// The task driving a connection, ended when this is dropped.
pub(crate) struct EndsOnDrop(Option<tokio::task::JoinHandle<()>>);

impl EndsOnDrop {
    /// The task, to be ended by whoever takes it (the pool ends it when it drops a client).
    fn into_handle(mut self) -> tokio::task::JoinHandle<()> {
        self.0
            .take()
            .expect("the handle is taken only here, which consumes self")
    }
}

impl Drop for EndsOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

impl Connection {
    fn spawn(client: Client, connection: RawConnection) -> Self {
        let (notified, notifications) = mpsc::unbounded_channel();
        let task = tokio::spawn(drive(connection, notified));
        Self {
            client,
            task: EndsOnDrop(Some(task)),
            notifications,
        }
    }

    /// The client.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }
}

/// Runs one round trip, answering "no answer within …" when the server's answer does not come
/// within `limit`; the caller then drops the connection, which may be in any state.
pub(crate) async fn bounded<T>(
    limit: Duration,
    what: &str,
    round_trip: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, round_trip).await {
        Ok(answer) => answer.map_err(|error| unavailable(what, &error)),
        Err(_) => Err(no_answer(what, limit)),
    }
}

/// The failure of a round trip whose answer did not come within `limit`.
pub(crate) fn no_answer(what: &str, limit: Duration) -> StoreError {
    StoreError::Unavailable {
        reason: format!(
            "{what}: no answer from PostgreSQL within {} ms (round_trip_timeout_ms); the connection was closed and is replaced",
            limit.as_millis()
        ),
    }
}

/// The pool's way to open a connection: the connector's, so a pooled connection has the same
/// bounded start as the writer's, and its task ends when the pool drops it.
struct PoolConnect(Arc<Connector>);

impl deadpool_postgres::Connect for PoolConnect {
    fn connect(
        &self,
        _: &tokio_postgres::Config,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
                > + Send
                + '_,
        >,
    > {
        Box::pin(async move {
            match self.0.connect().await {
                Ok(Connection { client, task, .. }) => Ok((client, task.into_handle())),
                // The pool's error must be the client's type, which only the client makes; the
                // reader is told the real reason from the connector (`Connector::failing`).
                Err(_) => Err(unusable_connection().await),
            }
        })
    }
}

/// A client error for a connection the store would not use; its text is never shown.
async fn unusable_connection() -> tokio_postgres::Error {
    match tokio_postgres::Config::new()
        .connect(tokio_postgres::NoTls)
        .await
    {
        Err(error) => error,
        // A configuration without a host never connects.
        Ok(_) => unreachable!("a connection without a host"),
    }
}

/// Moves a store's head to `newest` if that is newer; the head only grows. Both the writer (its
/// own commits) and the listener (every instance's) move it, in either order.
pub(crate) fn advance(head: &watch::Sender<Option<GlobalPosition>>, newest: GlobalPosition) {
    head.send_if_modified(|head| {
        let grows = *head < Some(newest);
        if grows {
            *head = Some(newest);
        }
        grows
    });
}

/// A database error's own words (tokio-postgres shows only "db error"), or the client's.
pub(crate) fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{}: {} ({})", db.severity(), db.message(), db.code().code()),
        None => {
            let mut text = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                text.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            text
        }
    }
}

/// A failure that left nothing written.
pub(crate) fn unavailable(context: &str, error: &tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable {
        reason: format!("{context}: {}", describe(error)),
    }
}

/// Refuses a connection on which the per-session settings the store opens every connection with
/// did not take: a pooler that drops the startup `options` (PgBouncer with
/// `ignore_startup_parameters = options`) would leave the store without its statement timeout,
/// its idle-transaction timeout and `synchronous_commit = on`, silently.
async fn check_session_settings(
    config: &PostgresConfig,
    client: &Client,
) -> Result<(), PostgresError> {
    let rows = client
        .query(
            "SELECT name, setting FROM pg_settings WHERE name IN \
             ('statement_timeout', 'idle_in_transaction_session_timeout', 'synchronous_commit')",
            &[],
        )
        .await
        .map_err(|error| PostgresError::Setup {
            reason: format!("cannot read the session's settings: {}", describe(&error)),
        })?;
    let expected = [
        ("statement_timeout", config.statement_timeout_ms.to_string()),
        (
            "idle_in_transaction_session_timeout",
            config.idle_in_transaction_timeout_ms.to_string(),
        ),
        ("synchronous_commit", "on".to_owned()),
    ];
    for (name, wanted) in expected {
        let found = rows
            .iter()
            .find(|row| row.get::<_, &str>(0) == name)
            .map(|row| row.get::<_, String>(1));
        if found.as_deref() != Some(wanted.as_str()) {
            return Err(PostgresError::Setup {
                reason: format!(
                    "the connection to {} runs with {name} = {} instead of the {wanted} opledger asked for in the startup options: a pooler between opledger and PostgreSQL drops them (PgBouncer with ignore_startup_parameters). Connect opledger to PostgreSQL directly, or through a session-mode pool that passes the options on; transaction-mode pooling is not supported",
                    config.target(),
                    found.as_deref().unwrap_or("nothing")
                ),
            });
        }
    }
    Ok(())
}

/// Sorts a failed first connection into the refusal that says what to do.
fn classify(config: &PostgresConfig, failure: ConnectFailure) -> PostgresError {
    let target = config.target();
    let error = match failure {
        ConnectFailure::Refused(error) => error,
        ConnectFailure::NoAnswer(_) => {
            return PostgresError::Unreachable {
                target,
                reason: failure.to_string(),
            }
        }
    };
    let error = &error;
    let reason = describe(error);
    let code = error.as_db_error().map(|db| db.code().clone());
    match code {
        Some(code)
            if code == SqlState::INVALID_PASSWORD
                || code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
        {
            PostgresError::Authentication {
                target,
                user: config.user().to_owned(),
                reason,
            }
        }
        Some(code) if code == SqlState::INVALID_CATALOG_NAME => PostgresError::NoDatabase {
            target,
            database: config.database().to_owned(),
        },
        // PgBouncer's refusal of the startup `options` that carry the session's settings.
        Some(_) if reason.contains("unsupported startup parameter") => PostgresError::Setup {
            reason: format!(
                "{reason}: a pooler (PgBouncer) between opledger and {target} refuses the startup options that carry opledger's per-session settings (timeouts, synchronous_commit). Connect opledger to PostgreSQL directly; transaction-mode pooling is not supported, and ignore_startup_parameters would drop the settings"
            ),
        },
        Some(_) => PostgresError::Setup { reason },
        None if tls::is_untrusted_certificate(error) => PostgresError::UntrustedCertificate {
            target,
            mode: match config.certificate_check {
                CertificateCheck::Chain => "verify-ca",
                _ => "verify-full",
            },
            reason,
        },
        // The client refuses on its own when the server asks for a password it was not given.
        None if !config.has_password() && reason.contains("password missing") => {
            PostgresError::Authentication {
                target,
                user: config.user().to_owned(),
                reason: format!(
                    "the server asks for a password and none was given: set {PASSWORD_VAR}"
                ),
            }
        }
        None => PostgresError::Unreachable { target, reason },
    }
}

/// The PostgreSQL event store. Cloning gives another handle to the same store; it stops when
/// [`PostgresStore::close`] is called or the last handle is dropped.
#[derive(Clone)]
pub struct PostgresStore {
    shared: Arc<Shared>,
}

struct Shared {
    target: String,
    /// The writer's queue; `None` once the store is closed.
    appends: Mutex<Option<mpsc::Sender<AppendRequest>>>,
    writer: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The task listening for every instance's commits; `None` once the store is closed.
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
    pool: Pool,
    /// How often a caught-up subscription looks at the log without a notice.
    subscription_poll: Duration,
    /// The newest position this store committed, for its own subscriptions.
    head: watch::Receiver<Option<GlobalPosition>>,
    counters: Arc<CommitCounters>,
    /// What the writer is doing, for readiness.
    writer_watch: Arc<WriterWatch>,
    /// How connections are opened and checked.
    connector: Arc<Connector>,
    /// The client's wait for one round trip.
    round_trip: Duration,
    /// How long the writer may be in one round before readiness calls it stuck.
    stuck_after: Duration,
}

/// What the writer is doing, as readiness needs to know it: since when it has been in its
/// current round (taking a connection, a transaction, its COMMIT), and whether it is resolving
/// a commit whose answer was lost.
#[derive(Debug, Default)]
pub(crate) struct WriterWatch {
    busy_since: Mutex<Option<std::time::Instant>>,
    resolving: std::sync::atomic::AtomicBool,
}

impl WriterWatch {
    pub(crate) fn busy(&self, busy: bool) {
        *lock(&self.busy_since) = busy.then(std::time::Instant::now);
    }

    pub(crate) fn resolving(&self, resolving: bool) {
        self.resolving
            .store(resolving, std::sync::atomic::Ordering::Relaxed);
    }

    /// Why the writer counts as stuck, if it does.
    fn stuck(&self, after: Duration) -> Option<String> {
        if self.resolving.load(std::sync::atomic::Ordering::Relaxed) {
            return Some(
                "the writer is resolving a commit whose answer was lost (its appends wait)".into(),
            );
        }
        let since = (*lock(&self.busy_since))?;
        let busy = since.elapsed();
        (busy > after).then(|| {
            format!(
                "the writer has waited {} ms for PostgreSQL in one commit",
                busy.as_millis()
            )
        })
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.shared.target)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to the database a `postgres://` URL names (the password from the URL or
    /// `PGPASSWORD`), creating or migrating opledger's tables.
    pub async fn connect(url: &str) -> Result<Self, PostgresError> {
        Self::connect_with(PostgresConfig::from_url(url)?).await
    }

    /// Brings the database's schema to this build's version on one connection, and says what it
    /// did (`opledger migrate`): idempotent, a newer schema refused and left as it is. Needs a
    /// role that may create and alter opledger's tables.
    pub async fn migrate(config: PostgresConfig) -> Result<Migration, PostgresError> {
        config.check()?;
        let (head_sender, _) = watch::channel(None);
        let connector = Connector::new(&config, Arc::new(head_sender))?;
        let (client, connection) = connector
            .connect_first()
            .await
            .map_err(|failure| classify(&config, failure))?;
        let mut connection = Connection::spawn(client, connection);
        check_session_settings(&config, connection.client()).await?;
        schema::prepare(&mut connection.client, config.database()).await
    }

    /// As [`Self::connect`], with the settings given.
    pub async fn connect_with(config: PostgresConfig) -> Result<Self, PostgresError> {
        config.check()?;
        let (head_sender, head_receiver) = watch::channel(None);
        let head_sender = Arc::new(head_sender);
        let connector = Arc::new(Connector::new(&config, Arc::clone(&head_sender))?);
        let (client, connection) = connector
            .connect_first()
            .await
            .map_err(|failure| classify(&config, failure))?;
        let mut connection = Connection::spawn(client, connection);
        check_session_settings(&config, connection.client()).await?;
        schema::prepare(&mut connection.client, config.database()).await?;
        // The first check learns the ledger's identity; it refuses only a standby.
        connector
            .check(&config.target(), connection.client())
            .await
            .map_err(|reason| PostgresError::Setup { reason })?;
        let head = read_head(connection.client(), connector.round_trip)
            .await
            .map_err(|error| PostgresError::Setup {
                reason: error.to_string(),
            })?;
        if let Some(head) = head {
            advance(&head_sender, head);
        }
        drop(connection);

        let manager = Manager::from_connect(
            config.session(),
            PoolConnect(Arc::clone(&connector)),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .wait_timeout(Some(Duration::from_millis(config.pool_wait_ms)))
            // No create timeout of the pool's own: the connector bounds each host's attempt
            // (connect_timeout_ms, then one round trip for the identity check).
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|error| PostgresError::Setup {
                reason: format!("cannot build the connection pool: {error}"),
            })?;
        let listener = listener::start(Arc::clone(&connector), Arc::clone(&head_sender)).await;
        let (append_sender, append_receiver) = mpsc::channel(APPEND_QUEUE_CAPACITY);
        let span = tracing::debug_span!("postgres_writer", target = %config.target());
        let counters = Arc::new(CommitCounters::default());
        let writer_watch = Arc::new(WriterWatch::default());
        let round_trip = connector.round_trip;
        let writer = tokio::spawn(tracing::Instrument::instrument(
            Writer::new(
                Arc::clone(&connector),
                head_sender,
                Arc::clone(&counters),
                Arc::clone(&writer_watch),
            )
            .run(append_receiver),
            span,
        ));
        tracing::debug!(target = %config.target(), ?head, "postgres event store opened");
        Ok(Self {
            shared: Arc::new(Shared {
                target: config.target(),
                appends: Mutex::new(Some(append_sender)),
                writer: Mutex::new(Some(writer)),
                listener: Mutex::new(Some(listener)),
                pool,
                subscription_poll: Duration::from_millis(config.subscription_poll_ms),
                head: head_receiver,
                counters,
                writer_watch,
                connector,
                round_trip,
                stuck_after: Duration::from_millis(config.statement_timeout_ms),
            }),
        })
    }

    /// Closes the store for every handle: queued appends are committed and answered, later
    /// calls fail with [`StoreError::Closed`]. Waits for the writer to finish.
    pub async fn close(self) -> Result<(), StoreError> {
        drop(lock(&self.shared.appends).take());
        self.shared.pool.close();
        let listener = lock(&self.shared.listener).take();
        if let Some(listener) = listener {
            listener.abort();
            // Cancelled, or it had stopped: either way it holds the head no more.
            let _ = listener.await;
        }
        let Some(writer) = lock(&self.shared.writer).take() else {
            return Ok(());
        };
        writer.await.map_err(|error| StoreError::Unavailable {
            reason: format!("the PostgreSQL writer task failed: {error}"),
        })
    }

    /// Counts of commits and of the appends they carried since the store was opened.
    pub fn commit_stats(&self) -> CommitStats {
        use std::sync::atomic::Ordering::Relaxed;
        // Two relaxed loads may straddle a commit; the pair is a statistic, not an invariant.
        CommitStats {
            commits: self.shared.counters.commits.load(Relaxed),
            appends: self.shared.counters.appends.load(Relaxed),
        }
    }

    /// `user@host:port/database`, for messages.
    pub fn target(&self) -> &str {
        &self.shared.target
    }

    /// Whether this store can serve now, or why not: the writer is not stuck in a commit, and a
    /// pooled connection answers within the round-trip timeout. For readiness probes; it
    /// never waits longer than the pool's wait plus one round trip.
    pub async fn readiness(&self) -> Result<(), String> {
        if let Some(refusal) = self.shared.connector.identity.refusal() {
            return Err(refusal);
        }
        if let Some(stuck) = self.shared.writer_watch.stuck(self.shared.stuck_after) {
            return Err(stuck);
        }
        let client = InFlight::new(self.reader().await.map_err(|error| error.to_string())?);
        let limit = self.shared.round_trip;
        let what = "PostgreSQL does not answer";
        let ping = async {
            bounded(limit, what, client.simple_query("SELECT 1"))
                .await
                .map(drop)
        };
        let answer = tokio::time::timeout(limit, ping).await;
        settle(client, answer, what, limit).map_err(|error| error.to_string())
    }

    async fn reader(&self) -> Result<deadpool_postgres::Object, StoreError> {
        if lock(&self.shared.appends).is_none() {
            return Err(StoreError::Closed);
        }
        pooled_from(&self.shared.connector, &self.shared.pool).await
    }
}

/// A pooled connection; when none can be opened, the reason the connector recorded (the
/// identity refusal in force, or each host's failure) rather than the pool's bare "failed".
async fn pooled_from(
    connector: &Connector,
    pool: &Pool,
) -> Result<deadpool_postgres::Object, StoreError> {
    pooled(pool)
        .await
        .map_err(|error| match (&error, connector.failing()) {
            (StoreError::Unavailable { .. }, Some(reason)) => StoreError::Unavailable {
                reason: format!("no PostgreSQL connection: {reason}"),
            },
            _ => error,
        })
}

async fn pooled(pool: &Pool) -> Result<deadpool_postgres::Object, StoreError> {
    if pool.is_closed() {
        return Err(StoreError::Closed);
    }
    pool.get().await.map_err(|error| StoreError::Unavailable {
        reason: format!("no PostgreSQL connection: {error}"),
    })
}

/// A pooled connection while a read is on it. Dropped before [`InFlight::done`] (the read was
/// cancelled, or its answer did not come) it is taken out of the pool and closed, never handed
/// to the next reader with an answer still owed.
struct InFlight(Option<deadpool_postgres::Object>);

impl InFlight {
    fn new(client: deadpool_postgres::Object) -> Self {
        Self(Some(client))
    }

    /// The read is answered: the connection goes back to the pool.
    fn done(mut self) {
        drop(self.0.take());
    }
}

impl std::ops::Deref for InFlight {
    type Target = deadpool_postgres::Object;

    fn deref(&self) -> &Self::Target {
        self.0
            .as_ref()
            .expect("set until done or drop, which consume or end it")
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

/// The answer of a read on a pooled connection given `limit` (`tokio::time::timeout` of it). A
/// connection whose answer did not come is closed, and so is every idle one: they went the same
/// way to the server, and a path that went silent would cost each of them a whole timeout to
/// find out.
fn settle<T>(
    client: InFlight,
    answer: Result<Result<T, StoreError>, tokio::time::error::Elapsed>,
    what: &str,
    limit: Duration,
) -> Result<T, StoreError> {
    match answer {
        Ok(answer) => {
            client.done();
            answer
        }
        Err(_) => {
            let pool = deadpool_postgres::Object::pool(&client);
            drop(client);
            if let Some(pool) = pool {
                pool.retain(|_, _| false);
            }
            Err(no_answer(what, limit))
        }
    }
}

async fn read_head(client: &Client, limit: Duration) -> Result<Option<GlobalPosition>, StoreError> {
    let row = bounded(
        limit,
        "cannot read the log's head position",
        client.query_one("SELECT last_position FROM opledger.log_head", &[]),
    )
    .await?;
    match row.get::<_, i64>(0) {
        0 => Ok(None),
        last => codec::position(last).map(Some),
    }
}

async fn read_log(
    client: deadpool_postgres::Object,
    limit: Duration,
    start: LogStart,
    max_count: usize,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let after = match start {
        LogStart::Beginning => 0,
        LogStart::After(position) => match codec::position_to_sql(position) {
            Some(position) => position,
            None => return Ok(Vec::new()),
        },
    };
    let limit_rows = max_count.min(MAX_READ_BATCH) as i64;
    let client = InFlight::new(client);
    let read = async {
        let statement = client
            .prepare_cached(&format!(
                "SELECT {} FROM opledger.events WHERE position > $1 ORDER BY position LIMIT $2",
                codec::EVENT_COLUMNS
            ))
            .await
            .map_err(|error| unavailable("cannot prepare the log read", &error))?;
        let rows = client
            .query(&statement, &[&after, &limit_rows])
            .await
            .map_err(|error| unavailable("cannot read the log", &error))?;
        rows.iter().map(codec::event).collect()
    };
    let answer = tokio::time::timeout(limit, read).await;
    settle(client, answer, "cannot read the log", limit)
}

impl EventStore for PostgresStore {
    type Subscription = PostgresSubscription;

    async fn append(
        &self,
        stream: &StreamName,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> Result<AppendOutcome, StoreError> {
        let gone = queue::WriterGone {
            stopped: "the PostgreSQL writer task has stopped; restart opledger",
            unanswered: "the PostgreSQL writer task stopped before answering",
        };
        queue::append(&self.shared.appends, &gone, stream, expected, events).await
    }

    async fn read_stream(
        &self,
        stream: &StreamName,
        from: StreamVersion,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let Some(from) = codec::version_to_sql(from) else {
            return Ok(Vec::new());
        };
        let client = InFlight::new(self.reader().await?);
        let limit = max_count.min(MAX_READ_BATCH) as i64;
        let what = format!("cannot read `{stream}`");
        let read = async {
            let statement = client
                .prepare_cached(&format!(
                    "SELECT {} FROM opledger.events \
                     WHERE stream_id = (SELECT stream_id FROM opledger.streams WHERE name = $1) \
                     AND version >= $2 ORDER BY version LIMIT $3",
                    codec::EVENT_COLUMNS
                ))
                .await
                .map_err(|error| unavailable("cannot prepare the stream read", &error))?;
            let rows = client
                .query(&statement, &[&stream.as_str(), &from, &limit])
                .await
                .map_err(|error| unavailable(&what, &error))?;
            rows.iter().map(codec::event).collect()
        };
        let limit = self.shared.round_trip;
        let answer = tokio::time::timeout(limit, read).await;
        settle(client, answer, &what, limit)
    }

    async fn read_all(
        &self,
        start: LogStart,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let client = self.reader().await?;
        read_log(client, self.shared.round_trip, start, max_count).await
    }

    /// Read from the database, not from this store's own commits: other instances write too.
    async fn head_position(&self) -> Result<Option<GlobalPosition>, StoreError> {
        let client = InFlight::new(self.reader().await?);
        let limit = self.shared.round_trip;
        let answer = tokio::time::timeout(limit, read_head(&client, limit)).await;
        settle(client, answer, "cannot read the log's head position", limit)
    }

    async fn subscribe_all(&self, start: LogStart) -> Result<PostgresSubscription, StoreError> {
        if lock(&self.shared.appends).is_none() {
            return Err(StoreError::Closed);
        }
        let feed = LogFeed {
            connector: Arc::clone(&self.shared.connector),
            pool: self.shared.pool.clone(),
            poll: self.shared.subscription_poll,
            round_trip: self.shared.round_trip,
        };
        Ok(PostgresSubscription {
            inner: CatchUp::new(feed, start, self.shared.head.clone()),
        })
    }
}

/// A catch-up subscription to a [`PostgresStore`]'s log.
pub struct PostgresSubscription {
    inner: CatchUp<LogFeed>,
}

impl std::fmt::Debug for PostgresSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSubscription")
            .finish_non_exhaustive()
    }
}

impl Subscription for PostgresSubscription {
    async fn next(&mut self) -> Result<RecordedEvent, StoreError> {
        self.inner.next().await
    }
}

/// What a subscription reads the log through: the store's pool.
struct LogFeed {
    connector: Arc<Connector>,
    pool: Pool,
    poll: Duration,
    round_trip: Duration,
}

impl LogSource for LogFeed {
    async fn read_log(
        &self,
        start: LogStart,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let client = pooled_from(&self.connector, &self.pool).await?;
        read_log(client, self.round_trip, start, max_count).await
    }

    fn unannounced_poll(&self) -> Duration {
        self.poll
    }
}

/// The transparency log's tree, read through the pool (`tree.rs` says how it is kept).
impl LogTree for PostgresStore {
    async fn tree_size(&self) -> Result<u64, StoreError> {
        let row = self
            .read_one("cannot read the log tree's size", |client| {
                Box::pin(async move {
                    client
                        .query_one("SELECT tree_size FROM opledger.log_head", &[])
                        .await
                })
            })
            .await?;
        u64::try_from(row.get::<_, i64>(0)).map_err(|_| StoreError::Corrupt {
            reason: "the log tree's size is negative".into(),
        })
    }

    async fn stored_hashes(&self, indexes: Vec<u64>) -> Result<Vec<Hash>, StoreError> {
        let wanted: Vec<i64> = indexes
            .iter()
            .map(|&index| i64::try_from(index).unwrap_or(i64::MAX))
            .collect();
        let rows = self
            .read_one("cannot read the log tree", |client| Box::pin(async move {
                let statement = client
                    .prepare_cached(
                        "SELECT stored_index, hash FROM opledger.log_tree WHERE stored_index = ANY($1)",
                    )
                    .await?;
                client.query(&statement, &[&wanted]).await
            }))
            .await?;
        let found: std::collections::HashMap<i64, Vec<u8>> =
            rows.iter().map(|row| (row.get(0), row.get(1))).collect();
        indexes
            .iter()
            .map(|&index| {
                let bytes = i64::try_from(index)
                    .ok()
                    .and_then(|index| found.get(&index))
                    .ok_or_else(|| StoreError::Corrupt {
                        reason: format!("the log tree lacks stored hash {index}"),
                    })?;
                <[u8; HASH_SIZE]>::try_from(bytes.as_slice())
                    .map(Hash)
                    .map_err(|_| StoreError::Corrupt {
                        reason: format!("stored hash {index} is not {HASH_SIZE} bytes"),
                    })
            })
            .collect()
    }

    async fn keep_checkpoint(&self, size: u64, note: String) -> Result<(), StoreError> {
        let size = i64::try_from(size).map_err(|_| StoreError::InvalidAppend {
            reason: format!("a tree of {size} leaves cannot be stored"),
        })?;
        self.read_one("cannot keep the checkpoint", |client| {
            Box::pin(async move {
                client
                    .execute(
                        "INSERT INTO opledger.log_checkpoints (tree_size, note) VALUES ($1, $2) \
                     ON CONFLICT (tree_size) DO NOTHING",
                        &[&size, &note],
                    )
                    .await
            })
        })
        .await
        .map(drop)
    }

    async fn kept_checkpoint(
        &self,
        size: Option<u64>,
    ) -> Result<Option<(u64, String)>, StoreError> {
        let size = size.map(|size| i64::try_from(size).unwrap_or(i64::MAX));
        let row = self
            .read_one("cannot read the kept checkpoints", |client| {
                Box::pin(async move {
                    client
                        .query_opt(
                            "SELECT tree_size, note FROM opledger.log_checkpoints \
                         WHERE $1::bigint IS NULL OR tree_size = $1 \
                         ORDER BY tree_size DESC LIMIT 1",
                            &[&size],
                        )
                        .await
                })
            })
            .await?;
        row.map(|row| {
            u64::try_from(row.get::<_, i64>(0))
                .map(|size| (size, row.get(1)))
                .map_err(|_| StoreError::Corrupt {
                    reason: "a kept checkpoint's size is negative".into(),
                })
        })
        .transpose()
    }

    async fn tenant_heads(&self) -> Result<Option<TenantHeads>, StoreError> {
        self.read_one("cannot read the tenants' trees", |client| {
            Box::pin(async move { tenant_trees::read_heads(&**client).await })
        })
        .await
    }
}

/// One round trip's work on a borrowed connection, as [`PostgresStore::read_one`] runs it.
type Work<'c, T> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<T, tokio_postgres::Error>> + Send + 'c>,
>;

/// Most streams [`PostgresStore::log_marks`] lists whose recorded last version is ahead of
/// their events.
const MAX_STREAMS_AHEAD: i64 = 1_000;

impl PostgresStore {
    /// What the database remembers of its log beside the events: the highest position handed
    /// out (the log's head row) and the streams whose last version has no event. Removing events
    /// with plain SQL leaves both behind (`opledger verify`).
    pub async fn log_marks(&self) -> Result<LogMarks, StoreError> {
        let (head, rows) = self
            .read_one("cannot read the log's marks", |client| {
                Box::pin(async move {
                    let head = client
                        .query_one("SELECT last_position FROM opledger.log_head", &[])
                        .await?;
                    let rows = client
                        .query(
                            "SELECT s.name, s.last_version, \
                                    (SELECT MAX(e.version) FROM opledger.events e \
                                     WHERE e.stream_id = s.stream_id) AS stored \
                             FROM opledger.streams s \
                             WHERE s.last_version > COALESCE((SELECT MAX(e.version) \
                                 FROM opledger.events e WHERE e.stream_id = s.stream_id), -1) \
                             ORDER BY s.name LIMIT $1",
                            &[&MAX_STREAMS_AHEAD],
                        )
                        .await?;
                    Ok((head.get::<_, i64>(0), rows))
                })
            })
            .await?;
        Ok(LogMarks {
            highest_position: u64::try_from(head).ok().filter(|head| *head > 0),
            streams_ahead: rows
                .iter()
                .map(|row| StreamAhead {
                    stream: row.get(0),
                    last_version: u64::try_from(row.get::<_, i64>(1)).unwrap_or(0),
                    newest_stored: row
                        .get::<_, Option<i64>>(2)
                        .and_then(|stored| u64::try_from(stored).ok()),
                })
                .collect(),
        })
    }

    /// Runs one bounded round of work on a pooled connection (see [`settle`]).
    async fn read_one<T>(
        &self,
        what: &str,
        work: impl for<'c> FnOnce(&'c deadpool_postgres::ClientWrapper) -> Work<'c, T>,
    ) -> Result<T, StoreError> {
        let client = InFlight::new(self.reader().await?);
        let limit = self.shared.round_trip;
        let answer = tokio::time::timeout(limit, async {
            work(&client)
                .await
                .map_err(|error| unavailable(what, &error))
        })
        .await;
        settle(client, answer, what, limit)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded values (an optional sender, an optional join handle) are replaced whole.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
