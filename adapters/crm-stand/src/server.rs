//! The stand's routes and its own accept loop.
//!
//! The loop serves each connection with hyper directly (rather than `axum::serve`) for one
//! reason: a `drop_request` / `drop_response` fault must close the connection without writing a
//! byte of a response, and only the task that owns a connection can do that. Each request
//! carries a [`ConnectionHandle`] to its own connection; closing it drops the connection, so the
//! client sees "connection closed before message completed" at once.
//!
//! The loop must never serve more than [`MAX_CONNECTIONS`] connections at once, nor keep a
//! connection whose headers do not arrive within [`HEADER_READ_TIMEOUT_MS`], nor outlive a
//! shutdown by more than [`SHUTDOWN_GRACE_MS`](super::SHUTDOWN_GRACE_MS).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::Router;
use hyper::body::Incoming;
use hyper::service::{service_fn, Service as _};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

use super::state::{Reply, Shared, MAX_BODY_BYTES};
use super::{admin, keyed, labelled, plain, SHUTDOWN_GRACE_MS};

/// The most connections served at once; further ones are closed on accept.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a connection may take to send a request's headers. Hyper also counts an idle
/// keep-alive connection's wait for its next request against this, so it is longer than
/// reqwest's 90 s pool idle timeout: a client drops an idle connection before the stand does,
/// and never sends a request on a connection the stand is closing at that very moment.
pub const HEADER_READ_TIMEOUT_MS: u64 = 120_000;
/// How long the loop waits after a failed accept (out of file descriptors, ...).
const ACCEPT_BACKOFF_MS: u64 = 50;

/// Lets a handler close the connection its request came on, without a response.
#[derive(Clone, Debug)]
pub(super) struct ConnectionHandle(Arc<Notify>);

impl ConnectionHandle {
    /// Orders the connection closed. The handler must not answer afterwards: the connection's
    /// task drops the connection, and the handler with it, as soon as it is next polled.
    pub(super) fn close(&self) {
        self.0.notify_one();
    }
}

/// Every route of the contract, plus JSON 404/405 answers for everything else.
pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(admin::healthz))
        .route(
            "/admin/faults",
            post(admin::queue_fault).delete(admin::clear_faults),
        )
        .route("/admin/clock/advance", post(admin::advance_clock))
        .route(
            "/admin/config",
            put(admin::set_config).get(admin::get_config),
        )
        .route("/admin/accounts/{account}", put(admin::put_account))
        .route("/admin/objects", get(admin::objects))
        .route("/admin/requests", get(admin::requests))
        .route("/admin/reset", post(admin::reset))
        .route("/keyed/{account}/tasks", post(keyed::create))
        .route("/keyed/{account}/requests/{key}", get(keyed::status))
        .route(
            "/labelled/{account}/tasks/by-label/{label}",
            put(labelled::put).get(labelled::get),
        )
        .route("/plain/{account}/tasks", post(plain::create))
        .route("/plain/{account}/tasks/search", get(plain::search))
        .fallback(|| async { Reply::error(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .method_not_allowed_fallback(|| async {
            Reply::error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take this method",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(shared)
}

/// Accepts and serves connections until `shutdown` turns true (or its sender is gone), then
/// drains open connections for at most [`SHUTDOWN_GRACE_MS`] and cuts the rest.
pub(super) async fn serve(
    listener: TcpListener,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = stopped(&mut shutdown) => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if connections.len() >= MAX_CONNECTIONS {
                        tracing::warn!(%peer, max = MAX_CONNECTIONS, "too many connections; closing");
                        drop(stream);
                        continue;
                    }
                    connections.spawn(serve_connection(stream, router.clone(), shutdown.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_BACKOFF_MS)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(Duration::from_millis(SHUTDOWN_GRACE_MS), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            "connections still open after the grace period; cutting them"
        );
        connections.shutdown().await;
    }
}

/// Serves one connection until it ends, a handler closes it, or the stand shuts down.
async fn serve_connection(stream: TcpStream, router: Router, mut shutdown: watch::Receiver<bool>) {
    let close = Arc::new(Notify::new());
    let handle = ConnectionHandle(Arc::clone(&close));
    let app = TowerToHyperService::new(router);
    let service = service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(handle.clone());
        app.call(request)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(HEADER_READ_TIMEOUT_MS));
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let mut stopping = false;
    loop {
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = close.notified() => {
                // Returning drops the connection: the socket closes with nothing written.
                tracing::debug!("connection closed by a drop fault");
                return;
            }
            () = stopped(&mut shutdown), if !stopping => {
                connection.as_mut().graceful_shutdown();
                stopping = true;
            }
        }
    }
}

/// Resolves once the stand is shutting down. A dropped sender counts as shutting down: the
/// [`Stand`](super::Stand) is gone.
pub(super) async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // Only `()` leaves this function: the guard `wait_for` returns must not be held across
    // another await in a `select!` arm, or the task would stop being `Send`.
    let _ = shutdown.wait_for(|stopping| *stopping).await;
}
