//! Loopback emulators of the real APIs the presets speak, one module per API, and the plumbing
//! they share: an accept loop whose handlers can close their own connection without a byte of
//! answer, a fault queue driven from the test through an in-process handle, and a reply type.
//!
//! An emulator serves only the calls its preset makes, but serves them as the provider documents
//! them (paths, methods, auth header, body encoding, statuses, error bodies, id fields, rate-limit
//! signals, idempotency or upsert semantics, search lag), so the preset cannot tell it from the
//! real API. Each module's docs name the documentation followed and the facts relied on.
//!
//! Faults hit the creates (the sends), never the lookups, in the order queued, like the CRM
//! stand's: drop the request, apply then drop the response, hold the request before applying,
//! apply then answer late, a 5xx before or after the commit, and a rate limit.

pub mod attio;
pub mod hubspot;
pub mod keys;
pub mod oauth;
pub mod pipedrive;
pub mod salesforce;
pub mod stripe;
pub mod zendesk;

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper::service::{service_fn, Service as _};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde_json::Value;
use tokio::sync::Notify;

/// What a fault does to the next create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Not applied; the connection is closed without an answer.
    DropRequest,
    /// Applied; then the connection is closed without an answer.
    DropResponse,
    /// Held `ms` before it is applied (still being processed), then applied and answered.
    Hold { ms: u64 },
    /// Applied at once; the answer is held `ms` before it is written.
    LateResponse { ms: u64 },
    /// Not applied; `status` (5xx) with the API's error body.
    ErrorBeforeCommit { status: u16 },
    /// Applied; then `status` (5xx) with the API's error body.
    ErrorAfterCommit { status: u16 },
    /// Not applied; the API's rate-limit answer naming a wait of `retry_after_s`.
    RateLimit { retry_after_s: u64 },
}

/// One answer: a status, headers and a body.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Option<String>,
}

impl Reply {
    /// A JSON answer.
    pub fn json(status: u16, body: &Value) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: Some(body.to_string()),
        }
    }

    /// The same with one more header.
    pub fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_owned(), value.into()));
        self
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let mut response = Response::builder()
            .status(StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR));
        for (name, value) in &self.headers {
            response = response.header(name.as_str(), value.as_str());
        }
        response
            .body(self.body.map_or_else(Body::empty, Body::from))
            .expect("an emulator reply is a valid response")
    }
}

/// How an API writes the answers a fault makes.
pub trait Voice: Send + Sync + 'static {
    /// A server error with `status`.
    fn server_error(&self, status: u16) -> Reply;
    /// A rate-limit refusal naming a wait of `retry_after_s`.
    fn rate_limited(&self, retry_after_s: u64) -> Reply;
}

/// Lets a handler close the connection its request came on.
#[derive(Clone, Debug)]
pub struct Connection(Arc<Notify>);

impl Connection {
    fn close(&self) {
        self.0.notify_one();
    }
}

/// The faults queued for an emulator's creates.
#[derive(Debug, Default)]
pub struct Faults(Mutex<VecDeque<Fault>>);

impl Faults {
    /// Queues `times` faults of `kind`.
    pub fn queue(&self, kind: Fault, times: usize) {
        let mut queue = self.0.lock().expect("not poisoned");
        queue.extend(std::iter::repeat_n(kind, times));
    }

    /// The next fault, consumed.
    pub fn take(&self) -> Option<Fault> {
        self.0.lock().expect("not poisoned").pop_front()
    }
}

/// Carries out a create under `fault`: `commit` applies it and returns the answer (it gets the
/// answer to send instead when the fault replaces it, so an API that saves answers saves that
/// one); `abandon` runs when the create is not applied. Never returns for a dropped connection.
pub async fn carry_out(
    fault: Option<Fault>,
    connection: &Connection,
    voice: &dyn Voice,
    commit: impl FnOnce(Option<Reply>) -> Reply,
    abandon: impl FnOnce(),
) -> Reply {
    match fault {
        None => commit(None),
        Some(Fault::DropRequest) => {
            abandon();
            closed(connection).await
        }
        Some(Fault::DropResponse) => {
            commit(None);
            closed(connection).await
        }
        Some(Fault::Hold { ms }) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            commit(None)
        }
        Some(Fault::LateResponse { ms }) => {
            let reply = commit(None);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            reply
        }
        Some(Fault::ErrorBeforeCommit { status }) => {
            abandon();
            voice.server_error(status)
        }
        Some(Fault::ErrorAfterCommit { status }) => commit(Some(voice.server_error(status))),
        Some(Fault::RateLimit { retry_after_s }) => {
            abandon();
            voice.rate_limited(retry_after_s)
        }
    }
}

/// Closes the connection and waits for the connection's task to drop this handler with it.
async fn closed(connection: &Connection) -> Reply {
    connection.close();
    std::future::pending().await
}

/// The bearer token of a request, if it has one.
pub fn bearer(headers: &HeaderMap) -> Option<String> {
    headers
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::to_owned)
}

/// What every emulator keeps besides its objects: its accounts by token, the start of its clock
/// and its fault queue.
#[derive(Debug)]
pub struct Core {
    tokens: Vec<(String, String)>,
    /// The OAuth2 token endpoint and the access tokens it issued (unused until set up).
    pub oauth: Arc<oauth::OAuth>,
    start: Instant,
    faults: Faults,
}

impl Core {
    /// A core knowing `tokens` (token → account), its clock starting now.
    pub fn new(tokens: &[(String, String)]) -> Self {
        Self {
            tokens: tokens.to_vec(),
            oauth: Arc::default(),
            start: Instant::now(),
            faults: Faults::default(),
        }
    }

    /// The account `token` belongs to, if any.
    pub fn account(&self, token: Option<&str>) -> Option<String> {
        let token = token?;
        self.tokens
            .iter()
            .find(|(known, _)| known == token)
            .map(|(_, account)| account.clone())
            .or_else(|| self.oauth.account(token))
    }

    /// Milliseconds since the emulator started: its clock for retention and search lag. Real
    /// time, because the emulators run beside a real `opledger serve`, whose clock cannot be
    /// paused from here.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The fault for the create being served, consumed.
    pub fn take_fault(&self) -> Option<Fault> {
        self.faults.take()
    }
}

/// The handle every emulator gives the tests.
pub trait Emulator {
    /// Its core.
    fn core(&self) -> &Core;

    /// Queues `times` faults of `kind` for the next creates.
    fn fault(&self, kind: Fault, times: usize) {
        self.core().faults.queue(kind, times);
    }
}

/// A running emulator: its address; the server stops when this is dropped.
pub struct Running {
    pub base_url: String,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Shares `state` with `routes` and serves them on a loopback port; returns the server and the
/// state, for the emulator's handle.
pub async fn launch<S: Send + Sync + 'static>(
    state: S,
    routes: Router<Arc<S>>,
) -> (Running, Arc<S>) {
    let state = Arc::new(state);
    let running = serve(routes.with_state(Arc::clone(&state))).await;
    (running, state)
}

/// Serves `router` on an ephemeral loopback port. Each request carries its [`Connection`] as an
/// extension, so a drop fault can close it without writing an answer.
pub async fn serve(router: Router) -> Running {
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("a loopback port");
    let address = listener.local_addr().expect("an address");
    let server = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve_connection(stream, router.clone()));
        }
    });
    Running {
        base_url: format!("http://{address}"),
        server,
    }
}

fn serve_connection(
    stream: tokio::net::TcpStream,
    router: Router,
) -> impl Future<Output = ()> + Send {
    let close = Arc::new(Notify::new());
    let handle = Connection(Arc::clone(&close));
    let app = TowerToHyperService::new(router);
    let service = service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(handle.clone());
        app.call(request)
    });
    async move {
        let connection = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service);
        tokio::select! {
            _ = connection => {}
            // Returning drops the connection: the socket closes with nothing written.
            () = close.notified() => {}
        }
    }
}
