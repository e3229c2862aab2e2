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
//! The stand and the HTTP provider adapters (`crate::provider`) share this contract.
//!
//! ```text
//! Everything JSON. Accounts are path segments. Every provider request carries
//! `Authorization: Bearer <token>`; the stand knows each account's token (configured at start;
//! default accounts `acct-1` token `token-acct-1`, `acct-2` token `token-acct-2`). Wrong/missing
//! token → 401 `{"error":{"type":"unauthorized","message":"..."}}`, nothing applied.
//! Errors are always `{"error":{"type": "<snake_case>", "message": "<text>"}}`.
//! A task's fields are whatever JSON object the client sends (the operation's args), plus the
//! shape-specific key/label. Task ids are decimal strings from one counter shared by all accounts
//! and shapes, starting at "731" (a nod to the article). Every provider response carries a
//! `Request-Id: req_<n>` header.
//!
//! ## 1. keyed (Stripe-style Idempotency-Key)
//! - `POST /keyed/{account}/tasks`, header `Idempotency-Key: <key>` (required; missing → 400
//!   `idempotency_key_missing`), body = task fields (JSON object; otherwise 422 `invalid_body`).
//!   - new key → create; 201 `{"id":"731"}`.
//!   - same key, same body, first request completed → replay: the first response again (same
//!     status, same id), plus header `Idempotent-Replayed: true`; nothing created.
//!   - same key, first request still in flight (being processed / its response held) → 409
//!     `{"error":{"type":"idempotency_in_flight",...}}`; nothing created.
//!   - same key, different body → 400 `{"error":{"type":"idempotency_key_reused",...}}`;
//!     nothing created.
//!   - keys are forgotten `key_retention_s` after first use (stand clock); a forgotten key is new
//!     again (so a late retry creates a second task — the danger the ledger must avoid).
//! - `GET /keyed/{account}/requests/{key}` → 200 `{"status":"completed","id":"731"}` |
//!   200 `{"status":"in_progress"}` | 404 `{"error":{"type":"not_found"}}` (unknown or forgotten
//!   key). Consistent.
//!
//! ## 2. labelled (unique external label enforced atomically: Salesforce External ID shape)
//! - `PUT /labelled/{account}/tasks/by-label/{label}`, body = task fields.
//!   - label unused in this account → create; 201 `{"id":"732","created":true}`.
//!   - label used, same body → 200 `{"id":"732","created":false}` (nothing created).
//!   - label used, different body → 409 `{"error":{"type":"label_conflict",...}}` (nothing
//!     created).
//! - `GET /labelled/{account}/tasks/by-label/{label}` → 200 `{"id":"732"}` | 404 not_found.
//!   Consistent.
//!
//! ## 3. plain (lookup-only: HubSpot tasks / Kommo / Bitrix24 shape)
//! - `POST /plain/{account}/tasks`, body = task fields including `"opledger_label": "<label>"`
//!   (a custom field; the stand does not enforce uniqueness). Always creates; 201 `{"id":"733"}`.
//! - `GET /plain/{account}/tasks/search?label=<label>` →
//!   200 `{"results":[{"id":"733","opledger_label":"...","account":"acct-1"}]}`.
//!   The search index lags: a task becomes visible in search only `search_lag_ms` (stand clock)
//!   after it was created. Never 404 for an empty result: `{"results":[]}`.
//!
//! ## Rate limits and faults (driven by the admin API)
//! A fault is queued with a matcher (shape, account, optional method GET/POST/PUT) and a count;
//! each matching provider request consumes one, FIFO. Kinds:
//! - `drop_request`: do not apply; the client observes a transport failure (the connection is
//!   closed or reset without a complete response) — or, if the implementation holds the request
//!   instead, the client's timeout. Either way no object exists.
//! - `drop_response`: apply (commit the task), then the client observes a transport failure
//!   (connection closed/reset without a complete response).
//! - `late_response` `{"delay_ms": N}`: apply, hold the response for N ms (longer than the client
//!   timeout), then send it (if the client is still there). While held, a keyed request with the
//!   same key is "in flight" (409).
//! - `error_after_commit` `{"status": 500|502|503}`: apply, then answer that status with
//!   `{"error":{"type":"internal",...}}`.
//! - `error_before_commit` `{"status": 500|502|503}`: do not apply; answer that status.
//! - `rate_limit` `{"retry_after_s": N}` or `{"retry_after_http_date": true, "retry_after_s": N}`:
//!   answer 429 with `Retry-After: N` (seconds) or an HTTP date N s ahead (stand clock); not
//!   applied.
//!
//! ## Admin API (no auth; loopback test tool)
//! - `POST /admin/faults` `{"shape":"keyed"|"labelled"|"plain"|null, "account":null|"acct-1",
//!   "method":null|"POST", "kind":"drop_response", "times":1, ...kind params}` → 201
//!   `{"queued":N}`.
//! - `DELETE /admin/faults` → clears.
//! - `POST /admin/clock/advance` `{"ms": N}` → 200 `{"now_ms": ...}` (stand clock; retention and
//!   lag use it; it starts at real time and only moves forward).
//! - `PUT /admin/config` `{"key_retention_s": N?, "search_lag_ms": N?}` → 200 current config.
//!   Defaults: key_retention_s 86400, search_lag_ms 2000.
//! - `PUT /admin/accounts/{account}` `{"token":"..."}` → add/replace an account's token.
//! - `GET /admin/objects?account=acct-1&shape=plain` → 200 `{"objects":[{"id","shape",
//!   "account","key"|null,"label"|null,"fields":{...},"created_at_ms"}]}` (all accounts if no
//!   filter).
//! - `GET /admin/requests` → 200 `{"requests":[{"n","method","path","account","key","label",
//!   "outcome":"applied"|"replayed"|"refused"|"fault:<kind>"}]}` — every provider request
//!   received, in order.
//! - `POST /admin/reset` → forget objects, keys, faults, request log (config and tokens stay).
//! - `GET /healthz` → 200.
//! ```

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
/// use opledger_adapters::stand::{Fault, FaultKind, Shape, Stand, StandConfig};
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
