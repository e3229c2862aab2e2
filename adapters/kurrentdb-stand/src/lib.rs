//! A KurrentDB protocol stand: a loopback gRPC server that speaks the part of the KurrentDB v1 API
//! the official `kurrentdb` client uses, so the KurrentDB event store can be tested on a machine
//! where no KurrentDB server can run.
//!
//! What it serves (see `service.rs`): `Streams.Append`, `Streams.Read` (stream reads, `$all`
//! reads forwards and backwards, `$all` subscriptions with prefix filters, checkpoints and a
//! caught-up marker) and `ServerFeatures.GetSupportedMethods`. What it keeps to (see `log.rs`):
//! KurrentDB's expected-revision checks, idempotent retries of the same event ids, stream-not-found
//! answers and byte-offset positions. What it does not do: gossip (connect with a single-node
//! `esdb://host:port?tls=false`), TLS, authentication, deletes, persistent subscriptions.
//!
//! Faults it injects on demand: an append committed and then its connection dropped before the
//! answer; an append committed and answered only after a delay; an append refused as unavailable
//! before anything is written; and a restart (every connection dropped, the port closed and
//! reopened) with the log kept. It must never pretend an append failed that it committed, except
//! by dropping the connection, which is exactly the ambiguity the adapter has to resolve.
//!
//! Built only with the `kurrentdb-stand` feature: tests use it, the release binary does not.

mod log;
mod service;
mod wire;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::{JoinHandle, JoinSet};
use tracing::debug;

pub use self::log::FIRST_RECORD_POSITION;
pub use self::service::STAND_SERVER_VERSION;

/// Most faults waiting to be injected at once.
pub const MAX_QUEUED_FAULTS: usize = 64;
/// Most connections served at once; more wait in the accept backlog.
pub const MAX_CONNECTIONS: usize = 256;

/// A fault the stand injects into the next append it receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendFault {
    /// Commit the append, then drop the connection before answering.
    DropConnectionAfterCommit,
    /// Commit the append, then answer only after `delay_ms` (longer than the client's deadline,
    /// the client gives up first).
    DelayAfterCommit {
        /// How long the answer is held, in milliseconds.
        delay_ms: u64,
    },
    /// Answer `UNAVAILABLE` without writing anything.
    UnavailableBeforeCommit,
}

/// Errors of the stand itself (not of the requests it serves).
#[derive(Debug, thiserror::Error)]
pub enum KurrentDbStandError {
    /// The port could not be bound.
    #[error("the KurrentDB stand cannot listen on {address}: {source}")]
    Bind {
        /// The address asked for.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Too many faults are queued.
    #[error("the KurrentDB stand already has {MAX_QUEUED_FAULTS} faults queued")]
    TooManyFaults,
}

/// State that survives a restart: the log, the fault queue and counters.
#[derive(Debug, Default)]
struct Shared {
    log: Mutex<log::Log>,
    faults: Mutex<VecDeque<AppendFault>>,
    /// Connections dropped by a fault.
    dropped_by_fault: AtomicU64,
    /// Appends refused because the stream was not at the expected revision.
    version_conflicts: AtomicU64,
}

impl Shared {
    fn log(&self) -> MutexGuard<'_, log::Log> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take_append_fault(&self) -> Option<AppendFault> {
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
    }
}

/// One client connection: a handler can ask for it to be dropped.
#[derive(Debug, Default)]
struct Connection {
    drop_requested: Notify,
    dropped: watch::Sender<bool>,
}

impl Connection {
    fn drop_now(&self) {
        self.dropped.send_replace(true);
        self.drop_requested.notify_one();
    }

    /// Resolves once the connection is dropped (by a fault or by the stand stopping).
    async fn dropped(&self) {
        let mut dropped = self.dropped.subscribe();
        // An error means the sender is gone, which is a drop too.
        let _ = dropped.wait_for(|dropped| *dropped).await;
    }
}

/// The accept loop while the stand listens.
#[derive(Debug)]
struct Listening {
    stop: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

/// A running (or stopped) KurrentDB stand on 127.0.0.1.
#[derive(Debug)]
pub struct KurrentDbStand {
    shared: Arc<Shared>,
    address: SocketAddr,
    listening: Option<Listening>,
}

impl KurrentDbStand {
    /// Starts a stand on an ephemeral loopback port, with an empty log.
    pub async fn start() -> Result<Self, KurrentDbStandError> {
        let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
        let listener =
            TcpListener::bind(any_port)
                .await
                .map_err(|source| KurrentDbStandError::Bind {
                    address: any_port,
                    source,
                })?;
        let address = listener
            .local_addr()
            .map_err(|source| KurrentDbStandError::Bind {
                address: any_port,
                source,
            })?;
        let shared = Arc::new(Shared::default());
        let listening = Some(listen(listener, Arc::clone(&shared)));
        Ok(Self {
            shared,
            address,
            listening,
        })
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The connection string a client uses: one node, no TLS, quick rediscovery so a test that
    /// restarts the stand does not wait long.
    pub fn connection_string(&self) -> String {
        format!(
            "esdb://{}?tls=false&discoveryInterval=50&maxDiscoverAttempts=20&gossipTimeout=2000",
            self.address
        )
    }

    /// Queues a fault for the next append that has none yet.
    pub fn inject(&self, fault: AppendFault) -> Result<(), KurrentDbStandError> {
        let mut faults = self
            .shared
            .faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if faults.len() >= MAX_QUEUED_FAULTS {
            return Err(KurrentDbStandError::TooManyFaults);
        }
        faults.push_back(fault);
        Ok(())
    }

    /// Faults queued and not yet injected.
    pub fn pending_faults(&self) -> usize {
        self.shared
            .faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Connections the stand has dropped because a fault said so.
    pub fn connections_dropped_by_faults(&self) -> u64 {
        self.shared.dropped_by_fault.load(Ordering::Relaxed)
    }

    /// Appends refused because their stream was not at the revision they expected: how often
    /// writers raced for one stream (several instances claiming one operation) and lost.
    pub fn version_conflicts(&self) -> u64 {
        self.shared.version_conflicts.load(Ordering::Relaxed)
    }

    /// How many records the log holds, system or not.
    pub fn record_count(&self) -> usize {
        self.shared.log().len()
    }

    /// Appends `count` events to the system stream `$stand-noise` directly (as a server's own
    /// statistics and settings events would appear in `$all`), so filters have something to skip.
    pub fn write_system_events(&self, count: usize) {
        let mut log = self.shared.log();
        for _ in 0..count {
            let expected = log
                .last_revision("$stand-noise")
                .map_or(log::Expected::NoStream, log::Expected::Revision);
            log.append(
                "$stand-noise",
                expected,
                vec![log::Proposed {
                    id: uuid::Uuid::new_v4(),
                    event_type: "$statsCollected".into(),
                    content_type: "application/json".into(),
                    data: b"{}".to_vec(),
                    custom_metadata: Vec::new(),
                }],
            );
        }
    }

    /// Stops listening and drops every connection; the log is kept.
    pub async fn stop(&mut self) {
        if let Some(listening) = self.listening.take() {
            listening.stop.send_replace(true);
            // The accept task only ends by that signal; a join error means it panicked, which
            // the tests would rather see than hide.
            if let Err(error) = listening.accept.await {
                assert!(
                    error.is_cancelled(),
                    "the stand's accept loop panicked: {error}"
                );
            }
        }
    }

    /// Listens again on the same port with the same log, after [`Self::stop`].
    pub async fn resume(&mut self) -> Result<(), KurrentDbStandError> {
        if self.listening.is_some() {
            return Ok(());
        }
        let listener =
            TcpListener::bind(self.address)
                .await
                .map_err(|source| KurrentDbStandError::Bind {
                    address: self.address,
                    source,
                })?;
        self.listening = Some(listen(listener, Arc::clone(&self.shared)));
        Ok(())
    }

    /// Stops and resumes: a node restart that keeps its data.
    pub async fn restart(&mut self) -> Result<(), KurrentDbStandError> {
        self.stop().await;
        self.resume().await
    }
}

impl Drop for KurrentDbStand {
    fn drop(&mut self) {
        if let Some(listening) = self.listening.take() {
            listening.stop.send_replace(true);
            listening.accept.abort();
        }
    }
}

fn listen(listener: TcpListener, shared: Arc<Shared>) -> Listening {
    let (stop, mut stopped) = watch::channel(false);
    let accept = tokio::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            let for_connection = stopped.clone();
            tokio::select! {
                _ = stopped.wait_for(|stop| *stop) => break,
                accepted = listener.accept(), if connections.len() < MAX_CONNECTIONS => {
                    match accepted {
                        Ok((socket, peer)) => {
                            debug!(%peer, "KurrentDB stand accepted a connection");
                            connections.spawn(serve(socket, Arc::clone(&shared), for_connection));
                        }
                        Err(error) => debug!(%error, "KurrentDB stand accept failed"),
                    }
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        // Dropping the listener closes the port; shutting the set down drops every connection.
        drop(listener);
        connections.shutdown().await;
    });
    Listening { stop, accept }
}

async fn serve(
    socket: tokio::net::TcpStream,
    shared: Arc<Shared>,
    mut stopped: watch::Receiver<bool>,
) {
    let connection = Arc::new(Connection::default());
    let shared_for_count = Arc::clone(&shared);
    let handler = {
        let connection = Arc::clone(&connection);
        hyper::service::service_fn(move |request| {
            service::route(Arc::clone(&shared), Arc::clone(&connection), request)
        })
    };
    let served = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(socket), handler);
    tokio::select! {
        result = served => {
            if let Err(error) = result {
                debug!(%error, "KurrentDB stand connection ended");
            }
        }
        () = connection.drop_requested.notified() => {
            shared_for_count.dropped_by_fault.fetch_add(1, Ordering::Relaxed);
            debug!("KurrentDB stand dropped a connection (fault)");
        }
        _ = stopped.wait_for(|stop| *stop) => {}
    }
    // Whatever ended it, streams still being served on it must end too.
    connection.drop_now();
}
