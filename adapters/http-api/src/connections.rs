//! The server's own accept loop: every connection is bounded in time and in number.
//!
//! `axum::serve` keeps a connection that sends half a request header open for ever and accepts
//! without limit (15,000 idle connections took ~610 MB), so each connection is served
//! here with hyper's HTTP/1 builder, under four limits from `[limits]`:
//!
//! | limit | what happens at it |
//! |---|---|
//! | `header_read_timeout_ms` | a connection whose request headers have not all arrived this long after its accept (or after the first byte of a later request) is closed |
//! | `idle_timeout_ms` | a keep-alive connection that has not completed its next request's headers this long after its last response is closed |
//! | `max_connections` | the next connection is answered `503 too_many_connections` and closed |
//! | `max_connections_per_address` | the next connection from that address is answered `429 too_many_connections_from_address` and closed |
//!
//! A refused connection is answered, not just dropped, so a client (or a person with curl) learns
//! why and when to come back: a fixed 503/429 with `Retry-After: 1`, after the request's headers
//! (or [`REFUSAL_LINGER_MS`] without them), from a task of its own, never from the accept loop.
//! At most [`MAX_REFUSALS_LINGERING`] refusals are in progress at once, each for at most twice
//! [`REFUSAL_LINGER_MS`]; beyond that a refused connection is closed at once, without an answer.
//! A flood from one address is held at its own limit, so everyone else (`/healthz` probes,
//! operators) is still served while it lasts.
//!
//! Hyper measures an idle keep-alive connection's wait and its next request's headers as one span,
//! from its last response to the end of the next headers; that span is `idle_timeout_ms`. The
//! shorter `header_read_timeout_ms` is kept here, by [`Deadlined`], from the accept (a fresh
//! connection gets no idle allowance) and from the first byte of each later request.
//!
//! It must never hold more than `max_connections` connections, nor a connection past its header
//! deadline, nor let refused clients hold the accept loop or more than [`MAX_REFUSALS_LINGERING`]
//! tasks.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::service::{service_fn, Service as _};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use opledger_domain::in_span::InSpanExt as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tracing::{debug, warn};

use crate::config::Limits;

/// How long the loop waits after a failed accept (out of file descriptors, ...), in milliseconds,
/// so a persistent failure does not spin a core.
const ACCEPT_BACKOFF_MS: u64 = 50;
/// The least time between two warnings about refused connections, or about failed accepts, in
/// milliseconds: a flood must not become a flood of log lines.
const WARNING_INTERVAL_MS: u64 = 1_000;
/// Most refused connections being answered at once (see the module docs): each holds a file
/// descriptor and a task for up to twice [`REFUSAL_LINGER_MS`].
pub const MAX_REFUSALS_LINGERING: usize = 64;
/// How long a refusal waits for the request's headers, and then for the client to close after
/// the answer, in milliseconds.
pub const REFUSAL_LINGER_MS: u64 = 500;
/// The most a refusal reads in each phase, in bytes: a request's headers and a small body; a
/// client sending more is not waiting for an answer.
const REFUSAL_DRAIN_BYTES: usize = 64 * 1024;

/// File descriptors kept for everything beside the connections and refusals: the ledger and
/// read-model files, the listening socket, provider connections, logs. Measured use at rest is 23
/// (bench/connections/rss.py); providers hold at most one connection per concurrent send.
pub const DESCRIPTORS_BESIDE_CONNECTIONS: u64 = 1_024;

/// Raises the process's soft open-file limit, up to its hard limit, so that `max_connections`
/// connections, the refusals in progress and [`DESCRIPTORS_BESIDE_CONNECTIONS`] fit. Without it
/// accept fails at the soft limit (1,024 under systemd by default) long before `max_connections`,
/// and so would the store's next file. Returns a warning to print when the hard limit is too low.
pub(crate) fn fit_descriptor_limit(limits: &Limits) -> Option<String> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let needed = limits.max_connections as u64
        + MAX_REFUSALS_LINGERING as u64
        + DESCRIPTORS_BESIDE_CONNECTIONS;
    let now = getrlimit(Resource::Nofile);
    // `None` is "unlimited".
    let soft = now.current.unwrap_or(u64::MAX);
    let hard = now.maximum.unwrap_or(u64::MAX);
    if soft >= needed {
        return None;
    }
    let raised = needed.min(hard);
    let set = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(raised),
            maximum: now.maximum,
        },
    );
    if set.is_ok() && raised >= needed {
        debug!(from = soft, to = raised, "raised the open-file limit");
        return None;
    }
    let have = if set.is_ok() { raised } else { soft };
    Some(format!(
        "opledger: warning: the open-file limit is {have}, below the {needed} needed for max_connections = {}, {} refusals in progress and {DESCRIPTORS_BESIDE_CONNECTIONS} for the rest; beyond it connections wait unaccepted. Raise it (ulimit -n, or LimitNOFILE= in a systemd unit) or lower limits.max_connections",
        limits.max_connections, MAX_REFUSALS_LINGERING
    ))
}

/// What the loop counted, for `/metrics`: connections open, refused at each limit, and closed at
/// the header read timeout.
#[derive(Debug, Default)]
pub struct ConnectionCounters {
    open: AtomicUsize,
    refused_max_connections: AtomicU64,
    refused_per_address: AtomicU64,
    header_timeouts: AtomicU64,
}

impl ConnectionCounters {
    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections refused at `max_connections` and at `max_connections_per_address`, so far.
    pub fn refused(&self) -> (u64, u64) {
        (
            self.refused_max_connections.load(Ordering::Relaxed),
            self.refused_per_address.load(Ordering::Relaxed),
        )
    }

    /// Connections closed because their request's headers did not arrive in time, so far.
    pub fn header_timeouts(&self) -> u64 {
        self.header_timeouts.load(Ordering::Relaxed)
    }
}

/// The limits a connection is served under, taken from [`Limits`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnectionLimits {
    header_read_timeout: Duration,
    idle_timeout: Duration,
    max_connections: usize,
    max_connections_per_address: usize,
}

impl From<&Limits> for ConnectionLimits {
    fn from(limits: &Limits) -> Self {
        debug_assert!(limits.header_read_timeout_ms <= limits.idle_timeout_ms);
        debug_assert!(limits.max_connections_per_address <= limits.max_connections);
        Self {
            header_read_timeout: Duration::from_millis(limits.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(limits.idle_timeout_ms),
            max_connections: limits.max_connections,
            max_connections_per_address: limits.max_connections_per_address,
        }
    }
}

/// Accepts and serves connections until `until` resolves, then stops accepting, closes idle
/// connections, and waits for the requests in progress to finish. The caller bounds that wait
/// (`shutdown_grace_ms`): dropping this future drops every connection still open.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    counters: Arc<ConnectionCounters>,
    until: impl Future<Output = ()>,
) {
    let (stop, stopping) = watch::channel(false);
    let places = Places::new(limits, Arc::clone(&counters));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS_LINGERING));
    let mut refusal_log = RefusalLog::default();
    let mut accept_warning = Throttle::default();
    let mut connections = JoinSet::new();
    tokio::pin!(until);
    loop {
        tokio::select! {
            () = &mut until => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match places.take(peer.ip()) {
                    Ok(place) => {
                        let span = tracing::debug_span!("connection", %peer);
                        let served = serve_connection(stream, router.clone(), limits, Arc::clone(&counters), stopping.clone(), place);
                        connections.spawn(served.in_span(span));
                    }
                    Err(refusal) => {
                        refusal_log.note(refusal, peer, &counters);
                        refuse(stream, refusal, &refusals);
                    }
                },
                Err(error) if is_the_clients(&error) => {
                    debug!(%error, "a client went away before its connection was accepted");
                }
                Err(error) => {
                    if accept_warning.ready() {
                        warn!(%error, "accept failed; trying again shortly (one warning per second at most)");
                    }
                    tokio::time::sleep(Duration::from_millis(ACCEPT_BACKOFF_MS)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
}

/// Whether a failed accept concerns only the one client (it reset or aborted), so the loop goes
/// straight on; anything else (out of file descriptors, ...) would fail again at once.
fn is_the_clients(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    )
}

/// Says yes at most once per [`WARNING_INTERVAL_MS`].
#[derive(Default)]
struct Throttle {
    last: Option<tokio::time::Instant>,
}

impl Throttle {
    fn ready(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        let interval = Duration::from_millis(WARNING_INTERVAL_MS);
        if self.last.is_some_and(|last| now - last < interval) {
            return false;
        }
        self.last = Some(now);
        true
    }
}

/// Counts refusals for `/metrics` and warns at most once per [`WARNING_INTERVAL_MS`] with how
/// many there were since the last warning.
#[derive(Default)]
struct RefusalLog {
    since_warning: u64,
    throttle: Throttle,
}

impl RefusalLog {
    fn note(&mut self, refusal: Refusal, peer: SocketAddr, counters: &ConnectionCounters) {
        match refusal {
            Refusal::Full => counters
                .refused_max_connections
                .fetch_add(1, Ordering::Relaxed),
            Refusal::AddressFull => counters.refused_per_address.fetch_add(1, Ordering::Relaxed),
        };
        self.since_warning += 1;
        if self.throttle.ready() {
            warn!(
                %peer,
                limit = refusal.limit(),
                refused = self.since_warning,
                open = counters.open(),
                "connections refused at their limit (one warning per second at most; /metrics counts them all)"
            );
            self.since_warning = 0;
        }
    }
}

/// Serves one connection until it ends, a deadline closes it, or the server stops.
async fn serve_connection(
    stream: TcpStream,
    router: Router,
    limits: ConnectionLimits,
    counters: Arc<ConnectionCounters>,
    mut stopping: watch::Receiver<bool>,
    _place: Place,
) {
    let in_progress = Arc::new(AtomicUsize::new(0));
    let draining = Arc::new(AtomicBool::new(false));
    let io = Deadlined {
        stream,
        header_read_timeout: limits.header_read_timeout,
        in_progress: Arc::clone(&in_progress),
        deadline: Some(Box::pin(tokio::time::sleep(limits.header_read_timeout))),
        draining: Arc::clone(&draining),
        counters,
    };
    let app = TowerToHyperService::new(router);
    let service = service_fn(move |request: hyper::Request<Incoming>| {
        // Counted from the moment the headers are in until the response's body is dropped
        // (written, or the connection gone): meanwhile no header deadline runs.
        let request_guard = InProgress::enter(&in_progress);
        let call = app.call(request);
        async move {
            let response = call.await?;
            Ok::<_, std::convert::Infallible>(response.map(|body| {
                Body::new(body.map_frame(move |frame| {
                    let _held_until_the_body_is_dropped = &request_guard;
                    frame
                }))
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    loop {
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(error) = served {
                    debug!(%error, "connection ended with an error");
                }
                return;
            }
            () = stopped(&mut stopping), if !draining.load(Ordering::Acquire) => {
                // Closes the connection if idle, or after the response in progress; a request
                // whose headers are still arriving is cut (see `Deadlined::poll_read`), so a
                // slow client cannot hold the shutdown up to its header deadline.
                draining.store(true, Ordering::Release);
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Resolves once the server is stopping (or its loop is gone).
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    // Only `()` leaves: the guard `wait_for` returns must not live across another await in a
    // `select!` arm, or the task would stop being `Send`.
    let _ = stopping.wait_for(|stop| *stop).await;
}

/// Why a connection was refused at accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// `max_connections` are open.
    Full,
    /// `max_connections_per_address` are open from this address.
    AddressFull,
}

impl Refusal {
    /// The name of the limit reached, as `[limits]` spells it.
    fn limit(self) -> &'static str {
        match self {
            Self::Full => "max_connections",
            Self::AddressFull => "max_connections_per_address",
        }
    }

    /// The whole answer: fixed, since it does not depend on the request.
    fn answer(self) -> &'static [u8] {
        match self {
            Self::Full => concat!(
                "HTTP/1.1 503 Service Unavailable\r\n",
                "content-type: application/json\r\n",
                "retry-after: 1\r\n",
                "connection: close\r\n",
                "content-length: 122\r\n",
                "\r\n",
                r#"{"error":{"code":"too_many_connections","message":"the server holds max_connections connections; try again in a second"}}"#,
                "\n",
            )
            .as_bytes(),
            Self::AddressFull => concat!(
                "HTTP/1.1 429 Too Many Requests\r\n",
                "content-type: application/json\r\n",
                "retry-after: 1\r\n",
                "connection: close\r\n",
                "content-length: 181\r\n",
                "\r\n",
                r#"{"error":{"code":"too_many_connections_from_address","message":"this address holds max_connections_per_address connections; reuse them (keep-alive) or close some, then try again"}}"#,
                "\n",
            )
            .as_bytes(),
        }
    }
}

/// Answers a refused connection and closes it, never waiting on it in the accept loop.
fn refuse(stream: TcpStream, refusal: Refusal, lingering: &Arc<Semaphore>) {
    let Ok(permit) = Arc::clone(lingering).try_acquire_owned() else {
        // Too many refusals in progress already: close at once (the client sees the connection
        // closed without an answer), so a flood of refusals costs no more than this.
        return;
    };
    tokio::spawn(async move {
        let _permit = permit;
        answer_refusal(stream, refusal).await;
    });
}

/// Reads the request's headers (an answer before the request makes HTTP clients such as hyper's
/// fail with "unexpected message"), answers, ends the answer with a FIN, and reads what else the
/// client sent until it closes, so the final close finds nothing unread (which would reset the
/// connection and could discard the answer before the client reads it). Each phase gets at most
/// [`REFUSAL_LINGER_MS`] and reads at most [`REFUSAL_DRAIN_BYTES`].
async fn answer_refusal(mut stream: TcpStream, refusal: Refusal) {
    let linger = Duration::from_millis(REFUSAL_LINGER_MS);
    let mut seen = Vec::with_capacity(1024);
    let _ = tokio::time::timeout(linger, async {
        let mut chunk = [0u8; 1024];
        while seen.len() < REFUSAL_DRAIN_BYTES {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(read) => {
                    // Only the new bytes and the three before them can complete the blank line.
                    let from = seen.len().saturating_sub(3);
                    seen.extend_from_slice(&chunk[..read]);
                    if ends_headers(&seen[from..]) {
                        break;
                    }
                }
            }
        }
    })
    .await;
    let _ = tokio::time::timeout(linger, async {
        stream.write_all(refusal.answer()).await?;
        stream.shutdown().await?;
        let mut chunk = [0u8; 1024];
        let mut drained = 0;
        while drained < REFUSAL_DRAIN_BYTES {
            match stream.read(&mut chunk).await? {
                0 => break,
                read => drained += read,
            }
        }
        Ok::<_, io::Error>(())
    })
    .await;
}

/// Whether `bytes` hold a whole request head (they end the blank line after the headers).
fn ends_headers(bytes: &[u8]) -> bool {
    bytes.windows(4).any(|window| window == b"\r\n\r\n")
}

/// The connection places: how many are open, in all and per client address.
#[derive(Clone)]
struct Places {
    limits: ConnectionLimits,
    open: Arc<Mutex<Open>>,
    counters: Arc<ConnectionCounters>,
}

#[derive(Default)]
struct Open {
    total: usize,
    /// Only addresses with a connection open, so it never holds more than `max_connections`.
    per_address: HashMap<IpAddr, usize>,
}

impl Places {
    fn new(limits: ConnectionLimits, counters: Arc<ConnectionCounters>) -> Self {
        Self {
            limits,
            open: Arc::default(),
            counters,
        }
    }

    /// A place for a connection from `address`, or why there is none.
    fn take(&self, address: IpAddr) -> Result<Place, Refusal> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let from_address = open.per_address.get(&address).copied().unwrap_or(0);
        if from_address >= self.limits.max_connections_per_address {
            return Err(Refusal::AddressFull);
        }
        if open.total >= self.limits.max_connections {
            return Err(Refusal::Full);
        }
        open.total += 1;
        open.per_address.insert(address, from_address + 1);
        self.counters.open.store(open.total, Ordering::Relaxed);
        debug_assert!(open.total <= self.limits.max_connections);
        Ok(Place {
            places: self.clone(),
            address,
        })
    }
}

/// One open connection's place, given back when the connection ends.
struct Place {
    places: Places,
    address: IpAddr,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self
            .places
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        open.total -= 1;
        self.places
            .counters
            .open
            .store(open.total, Ordering::Relaxed);
        if let Some(count) = open.per_address.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                open.per_address.remove(&self.address);
            }
        }
    }
}

/// Counts a request in progress on its connection while alive.
struct InProgress(Arc<AtomicUsize>);

impl InProgress {
    fn enter(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(count))
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection's socket with the header read deadline: armed at accept and at the first byte
/// read while no request is in progress, disarmed once a request is (its headers are in).
/// Reading past the deadline fails with `TimedOut`, which makes hyper close the connection; once
/// the server stops, a read between requests ends the stream.
struct Deadlined {
    stream: TcpStream,
    header_read_timeout: Duration,
    in_progress: Arc<AtomicUsize>,
    deadline: Option<Pin<Box<Sleep>>>,
    /// Set when the server stops: a read with no request in progress then ends the connection.
    draining: Arc<AtomicBool>,
    counters: Arc<ConnectionCounters>,
}

impl AsyncRead for Deadlined {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let idle = this.in_progress.load(Ordering::Acquire) == 0;
        if !idle {
            this.deadline = None;
        } else if this.draining.load(Ordering::Acquire) {
            // The end of the stream, as if the client had closed: hyper closes the connection
            // after writing what it holds. Only between requests, never inside one.
            return Poll::Ready(Ok(()));
        }
        // Polled before the read, so a read that stays pending leaves the timer's waker set.
        if let Some(deadline) = this.deadline.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                this.counters
                    .header_timeouts
                    .fetch_add(1, Ordering::Relaxed);
                debug!("closing a connection whose request headers did not arrive in time");
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the request's headers did not arrive within header_read_timeout_ms",
                )));
            }
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        let got_bytes = matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before;
        if got_bytes && idle && this.deadline.is_none() {
            // A next request has begun: hyper polls again for the rest, which sets the waker.
            this.deadline = Some(Box::pin(tokio::time::sleep(this.header_read_timeout)));
        }
        read
    }
}

impl AsyncWrite for Deadlined {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_connections: usize, per_address: usize) -> ConnectionLimits {
        ConnectionLimits {
            header_read_timeout: Duration::from_millis(100),
            idle_timeout: Duration::from_millis(100),
            max_connections,
            max_connections_per_address: per_address,
        }
    }

    #[test]
    fn the_open_file_limit_is_raised_to_fit_max_connections_or_a_warning_says_what_to_do() {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let before = getrlimit(Resource::Nofile);
        let mut limits = Limits {
            max_connections: 100,
            ..Limits::default()
        };
        let needed = 100 + MAX_REFUSALS_LINGERING as u64 + DESCRIPTORS_BESIDE_CONNECTIONS;
        assert!(
            before.maximum.is_none_or(|hard| hard >= needed),
            "this test needs a hard open-file limit of at least {needed}"
        );
        let lowered = Rlimit {
            current: Some(needed - 1),
            maximum: before.maximum,
        };
        setrlimit(Resource::Nofile, lowered).expect("the soft limit lowered");
        assert_eq!(fit_descriptor_limit(&limits), None);
        assert_eq!(getrlimit(Resource::Nofile).current, Some(needed));
        if let Some(hard) = before.maximum {
            limits.max_connections = usize::try_from(hard).unwrap_or(usize::MAX);
            let warning = fit_descriptor_limit(&limits).expect("a warning");
            assert!(
                warning.contains(&format!("the open-file limit is {hard}"))
                    && warning.contains("ulimit -n")
                    && warning.contains("lower limits.max_connections"),
                "{warning}"
            );
        }
        setrlimit(Resource::Nofile, before).expect("the limit restored");
    }

    #[test]
    fn each_refusal_states_its_exact_length() {
        for refusal in [Refusal::Full, Refusal::AddressFull] {
            let answer = std::str::from_utf8(refusal.answer()).expect("ASCII");
            let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length: "))
                .expect("a length")
                .parse()
                .expect("a number");
            assert_eq!(length, body.len(), "{answer}");
            let json: serde_json::Value = serde_json::from_str(body).expect("JSON");
            assert!(json["error"]["code"].is_string(), "{answer}");
        }
    }

    #[test]
    fn places_are_refused_per_address_first_and_given_back_when_dropped() {
        let places = Places::new(limits(3, 2), Arc::default());
        let a: IpAddr = [127, 0, 0, 2].into();
        let b: IpAddr = [127, 0, 0, 3].into();
        let first = places.take(a).expect("a place");
        let _second = places.take(a).expect("a place");
        assert_eq!(places.take(a).err(), Some(Refusal::AddressFull));
        let _third = places.take(b).expect("a place");
        assert_eq!(places.take(b).err(), Some(Refusal::Full));
        drop(first);
        let _again = places.take(b).expect("the place given back");
        assert_eq!(places.counters.open(), 3);
        let open = places.open.lock().expect("not poisoned");
        assert_eq!(open.total, 3);
        assert_eq!(open.per_address.len(), 2);
    }
}
