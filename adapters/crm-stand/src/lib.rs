//! The CRM stand: a fault-injecting, in-memory CRM served over real HTTP on loopback.
//!
//! It is for testing and demonstrating the ledger's provider adapters against the three shapes
//! of CRM API that exist in the wild (keyed, labelled, plain), with faults that a real network
//! and a real provider produce — a lost request, a lost response, a late response, a 5xx before
//! or after the commit, a rate limit — injected on demand through an admin API.
//!
//! It must never listen beyond loopback (its admin API has no authentication), never panic on
//! anything a client sends, and never grow without bound: bodies, tasks, accounts, queued faults
//! and the request log all have named limits. It is a test tool: it keeps nothing on disk.
//!
//! Files: `state.rs` holds the in-memory model and the stand's limits; `keyed.rs`,
//! `labelled.rs` and `plain.rs` hold one API shape each (its rules and its HTTP handlers);
//! `exchange.rs` is the path every provider request takes (authentication, the fault queue, the
//! request log, the `Request-Id`); `faults.rs` the fault queue; `clock.rs` the stand clock;
//! `admin.rs` the admin API; `server.rs` the accept loop (which is what lets a handler drop its
//! connection); `wire.rs` the types shared with [`StandAdmin`], the typed admin client in
//! `client.rs`.
//!
//! # How the faults look to a client
//!
//! - `drop_request` and `drop_response`: the stand closes the TCP connection without writing a
//!   single byte of a response, right after it has read the request (and, for `drop_response`,
//!   applied it). A client sees "connection closed before message completed" at once, never a
//!   status line. The stand runs its own hyper accept loop so that a handler can order its own
//!   connection closed; holding the request until the client's timeout would also satisfy the
//!   contract for `drop_request`, but would make every such test as slow as that timeout.
//! - `late_response`: the request is applied at once (the object is visible in
//!   `/admin/objects`), the answer is held for `delay_ms` of real time, then sent if the client
//!   is still connected. The key of a keyed request stays `in_progress` until then, and becomes
//!   `completed` when the delay ends, whether or not the client waited for it.
//! - `error_after_commit`: applied, then the given 5xx with `{"error":{"type":"internal"}}`. For
//!   a keyed request the key is completed with the real 201, so a retry with the same key is a
//!   replay of the created task (what Stripe does when an error happens after its commit).
//! - `error_before_commit`: the given 5xx, nothing applied, no key recorded.
//! - `rate_limit`: 429 `rate_limited` with `Retry-After`, nothing applied, no key recorded.
//!
//! # Choices where the contract leaves room
//!
//! - Order of checks for a provider request: the account must exist (404 `account_not_found`),
//!   then the token must match (401 `unauthorized`), then the request must be well formed (422
//!   `invalid_body`, 400 `idempotency_key_missing`, ...). Only a request that passes all three
//!   consumes a queued fault; a fault then wraps whatever the shape's rules answer (a replay, a
//!   409, ...), not only creations.
//! - "Same body" means equal JSON values (key order and whitespace do not matter). A keyed
//!   request whose key is in flight *and* whose body differs is answered
//!   `idempotency_key_reused`: a changed body is a client bug whatever the timing.
//! - The stand clock starts at real time and runs with real time, plus every advance. Tests that
//!   need a deterministic "before" set a long `search_lag_ms` and advance past it.
//! - The request-log `outcome` of a served read (a status lookup, a label lookup, a search) is
//!   `applied`, including a lookup that answers 404 `not_found`: the stand did what was asked.
//!   Labelled "label used, same body" is `replayed`. Every 4xx from the rules is `refused`.
//! - `POST /admin/faults` answers `{"queued": times, "pending": <uses left in the queue>}`.
//! - `POST /admin/reset` also restarts task ids at 731 and request numbers at 1; the clock,
//!   config and tokens stay.
//! - Extra, beyond the contract: `GET /admin/config`; `GET /admin/requests` also says how many
//!   old entries the bounded log has `evicted`; a missing `label` in a plain search is 400
//!   `invalid_query`; a full stand answers 507 `stand_full` / `fault_queue_full`; a body over
//!   [`MAX_BODY_BYTES`] is 413 `body_too_large` with `Connection: close` (refused on its
//!   `Content-Length` before it is read); unknown routes are 404 `not_found` in the error format
//!   (they are not provider requests: no `Request-Id`, not logged).
//! - A plain task without `opledger_label` is created but never found by search; a non-string
//!   `opledger_label` is 422 `invalid_body`.
//!
//! # The contract
//!
//! The stand implements the provider wire contract that the providers crate owns and documents
//! (`opledger_providers::contract`): paths, bodies, errors, the fault kinds and the admin API.

mod admin;
mod client;
mod clock;
mod exchange;
mod faults;
mod keyed;
mod labelled;
mod plain;
mod server;
mod state;
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use client::{StandAdmin, StandAdminError, ADMIN_TIMEOUT_MS};
pub use clock::MAX_CLOCK_ADVANCE_MS;
pub use faults::{MAX_FAULT_TIMES, MAX_LATE_DELAY_MS, MAX_QUEUED_FAULTS, MAX_RETRY_AFTER_S};
pub use server::{HEADER_READ_TIMEOUT_MS, MAX_CONNECTIONS};
pub use state::{
    FIRST_TASK_ID, MAX_ACCOUNTS, MAX_ACCOUNT_NAME_BYTES, MAX_BODY_BYTES, MAX_KEY_BYTES,
    MAX_LABEL_BYTES, MAX_LOGGED_REQUESTS, MAX_TASKS, MAX_TOKEN_BYTES,
};
pub use wire::{Fault, FaultKind, FaultMethod, LoggedRequest, Shape, StandObject, StandSettings};

/// How long [`Stand::shutdown`] lets open connections finish before it cuts them.
pub const SHUTDOWN_GRACE_MS: u64 = 2_000;

/// What a stand starts with. Everything but the accounts can be changed later through
/// `PUT /admin/config`; accounts can be added through `PUT /admin/accounts/{account}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StandConfig {
    /// How long a keyed `Idempotency-Key` is remembered after its first use, on the stand clock.
    pub key_retention_s: u64,
    /// How long a plain task stays invisible to search after its creation, on the stand clock.
    pub search_lag_ms: u64,
    /// `(account, token)` pairs: the accounts that exist and the bearer token each one accepts.
    pub accounts: Vec<(String, String)>,
}

impl Default for StandConfig {
    fn default() -> Self {
        Self {
            key_retention_s: 86_400,
            search_lag_ms: 2_000,
            accounts: vec![
                ("acct-1".to_owned(), "token-acct-1".to_owned()),
                ("acct-2".to_owned(), "token-acct-2".to_owned()),
            ],
        }
    }
}

/// Why a stand could not start.
#[derive(Debug, thiserror::Error)]
pub enum StandError {
    /// The admin API has no authentication, so the stand refuses to be reachable from elsewhere.
    #[error("the stand only listens on loopback, and {addr} is not a loopback address")]
    NotLoopback { addr: SocketAddr },
    /// An account name or token in [`StandConfig::accounts`] cannot be used.
    #[error("account {account:?} cannot be used: {reason}")]
    InvalidAccount {
        account: String,
        reason: &'static str,
    },
    /// More accounts than [`MAX_ACCOUNTS`].
    #[error("{count} accounts configured, at most {max} allowed")]
    TooManyAccounts { count: usize, max: usize },
    /// The listening socket could not be bound (port taken, permission, ...).
    #[error("could not listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The bound socket could not say which port it got.
    #[error("could not read the stand's bound address: {source}")]
    LocalAddr {
        #[source]
        source: std::io::Error,
    },
}

/// A running stand. Dropping it stops the server abruptly; [`Stand::shutdown`] stops it
/// gracefully, within [`SHUTDOWN_GRACE_MS`].
///
/// ```
/// use opledger_crm_stand::{Fault, FaultKind, Shape, Stand, StandConfig};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
/// # runtime.block_on(async {
/// let stand = Stand::start("127.0.0.1:0".parse()?, StandConfig::default()).await?;
/// assert!(stand.base_url().starts_with("http://127.0.0.1:"));
/// let admin = stand.admin()?;
/// // The next keyed request is applied, and its client sees the connection close.
/// admin
///     .queue_fault(&Fault::new(FaultKind::DropResponse).shape(Shape::Keyed))
///     .await?;
/// assert!(admin.objects(None).await?.is_empty());
/// stand.shutdown().await;
/// # Ok(())
/// # })
/// # }
/// ```
#[derive(Debug)]
pub struct Stand {
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    server: Option<JoinHandle<()>>,
}

impl Stand {
    /// Binds `listen` (a loopback address; port 0 picks a free port) and starts serving.
    pub async fn start(listen: SocketAddr, config: StandConfig) -> Result<Stand, StandError> {
        if !listen.ip().is_loopback() {
            return Err(StandError::NotLoopback { addr: listen });
        }
        let state = state::StandState::new(&config)?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| StandError::Bind {
                addr: listen,
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| StandError::LocalAddr { source })?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let shared = Arc::new(state::Shared::new(state, shutdown_rx.clone()));
        let router = server::router(shared);
        let server = tokio::spawn(server::serve(listener, router, shutdown_rx));
        tracing::info!(%addr, "CRM stand listening");
        Ok(Stand {
            addr,
            shutdown,
            server: Some(server),
        })
    }

    /// The address the stand listens on, with the real port when it was started with port 0.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (or `http://[::1]:PORT`), without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A typed client for this stand's admin API.
    pub fn admin(&self) -> Result<StandAdmin, StandAdminError> {
        StandAdmin::new(self.base_url())
    }

    /// Stops accepting, lets open connections finish (held late responses are released at once),
    /// and cuts whatever is still open after [`SHUTDOWN_GRACE_MS`].
    pub async fn shutdown(mut self) {
        // A send error means the server is already gone, which is what was asked for.
        let _ = self.shutdown.send(true);
        if let Some(mut server) = self.server.take() {
            // The server bounds its own drain; this outer bound only guards against a bug there.
            let bound = Duration::from_millis(SHUTDOWN_GRACE_MS.saturating_mul(2));
            if tokio::time::timeout(bound, &mut server).await.is_err() {
                tracing::warn!(addr = %self.addr, "CRM stand did not stop in time; aborting it");
                server.abort();
            }
        }
        tracing::info!(addr = %self.addr, "CRM stand stopped");
    }
}

impl Drop for Stand {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}
