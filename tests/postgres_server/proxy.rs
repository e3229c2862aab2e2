//! A TCP proxy between a store (or `opledger serve`) and the test cluster that cuts connections
//! at chosen moments: right after forwarding a COMMIT (the commit happens, its answer is lost),
//! instead of forwarding it (the server rolls back), or all at once with new ones refused (the
//! server "goes away" until it is set back to passing). It can also go silent without closing
//! anything, as a network partition or a host that died without a reset does: a COMMIT
//! forwarded whose answer never comes, or every connection, new ones included, held open with
//! nothing passing either way. It also counts round trips: how often a client spoke again after
//! the server had answered.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forwards everything.
    Pass,
    /// Forwards the next COMMIT to the server, then cuts that connection before the answer.
    CutAfterCommit,
    /// Cuts the connection carrying the next COMMIT without forwarding it.
    CutBeforeCommit,
    /// Cuts every open connection and refuses new ones: the server is gone.
    Gone,
    /// Forwards the next COMMIT to the server, then never passes that connection's answers on,
    /// and never closes it.
    SwallowAfterCommit,
    /// Passes nothing on any connection, open or new, and closes none: a silent network path.
    /// A connection silenced stays silent after the proxy passes again.
    Silent,
}

/// A TCP proxy between the store and the server that cuts connections at chosen moments.
pub struct Proxy {
    pub port: u16,
    mode: Arc<Mutex<Mode>>,
    /// Connections cut at a COMMIT so far.
    pub cuts: Arc<AtomicUsize>,
    /// Round trips so far, over every connection: messages from a client that follow an answer
    /// of the server (pipelined messages sent before the answer count once).
    pub round_trips: Arc<AtomicUsize>,
    generation: watch::Sender<u64>,
}

impl Proxy {
    pub async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let mode = Arc::new(Mutex::new(Mode::Pass));
        let cuts = Arc::new(AtomicUsize::new(0));
        let round_trips = Arc::new(AtomicUsize::new(0));
        let (generation, _) = watch::channel(0_u64);
        let (accept_mode, accept_cuts, accept_round_trips, accept_generation) = (
            Arc::clone(&mode),
            Arc::clone(&cuts),
            Arc::clone(&round_trips),
            generation.clone(),
        );
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *accept_mode.lock().expect("mode") == Mode::Gone {
                    continue;
                }
                let Ok(server) = TcpStream::connect((Ipv4Addr::LOCALHOST, upstream)).await else {
                    continue;
                };
                tokio::spawn(relay(
                    client,
                    server,
                    Arc::clone(&accept_mode),
                    Arc::clone(&accept_cuts),
                    Arc::clone(&accept_round_trips),
                    accept_generation.subscribe(),
                ));
            }
        });
        Self {
            port,
            mode,
            cuts,
            round_trips,
            generation,
        }
    }

    pub fn set(&self, mode: Mode) {
        *self.mode.lock().expect("mode") = mode;
        if mode == Mode::Gone {
            self.generation.send_modify(|generation| *generation += 1);
        }
    }

    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{}:{}@127.0.0.1:{}/{database}",
            super::USER,
            super::PASSWORD,
            self.port
        )
    }
}

/// Relays one connection both ways until either side closes, the proxy cuts it at a COMMIT,
/// or the server "goes away".
async fn relay(
    client: TcpStream,
    server: TcpStream,
    mode: Arc<Mutex<Mode>>,
    cuts: Arc<AtomicUsize>,
    round_trips: Arc<AtomicUsize>,
    mut generation: watch::Receiver<u64>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Set before a COMMIT is forwarded, so not one byte of its answer reaches the client.
    let cut = Arc::new(AtomicBool::new(false));
    let upstream_cut = Arc::clone(&cut);
    // Set once the connection went silent: from then on nothing passes, and nothing is closed.
    let silenced = Arc::new(AtomicBool::new(*mode.lock().expect("mode") == Mode::Silent));
    let (upstream_silenced, downstream_silenced) = (Arc::clone(&silenced), Arc::clone(&silenced));
    let downstream_mode = Arc::clone(&mode);
    // Set when the server's bytes were forwarded; the client's next bytes start a round trip.
    let answered = Arc::new(AtomicBool::new(true));
    let downstream_answered = Arc::clone(&answered);
    let upstream = async move {
        let mut buffer = vec![0_u8; 64 * 1024];
        loop {
            let read = client_read.read(&mut buffer).await.unwrap_or(0);
            if read == 0 {
                return;
            }
            // Checked per chunk, not only by the `select!` below: a chunk that arrived before
            // this task saw the generation change would otherwise go on to the server (and a
            // COMMIT in it commit) after the server "went away".
            match *mode.lock().expect("mode") {
                Mode::Gone => return,
                Mode::Silent => upstream_silenced.store(true, Ordering::SeqCst),
                _ => {}
            }
            if upstream_silenced.load(Ordering::SeqCst) {
                continue;
            }
            let chunk = &buffer[..read];
            if answered.swap(false, Ordering::SeqCst) {
                round_trips.fetch_add(1, Ordering::SeqCst);
            }
            // A simple-query message: 'Q', its length, "COMMIT", NUL.
            if chunk.windows(7).any(|window| window == b"COMMIT\0") {
                let armed = {
                    let mut mode = mode.lock().expect("mode");
                    let armed = *mode;
                    if matches!(
                        armed,
                        Mode::CutAfterCommit | Mode::CutBeforeCommit | Mode::SwallowAfterCommit
                    ) {
                        *mode = Mode::Pass;
                    }
                    armed
                };
                match armed {
                    Mode::CutAfterCommit => {
                        upstream_cut.store(true, Ordering::SeqCst);
                        let _ = server_write.write_all(chunk).await;
                        let _ = server_write.flush().await;
                        cuts.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    Mode::CutBeforeCommit => {
                        upstream_cut.store(true, Ordering::SeqCst);
                        cuts.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    Mode::SwallowAfterCommit => {
                        upstream_silenced.store(true, Ordering::SeqCst);
                        let _ = server_write.write_all(chunk).await;
                        let _ = server_write.flush().await;
                        cuts.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    Mode::Pass | Mode::Gone | Mode::Silent => {}
                }
            }
            if server_write.write_all(chunk).await.is_err() {
                return;
            }
        }
    };
    let downstream = async move {
        let mut buffer = vec![0_u8; 64 * 1024];
        loop {
            let read = server_read.read(&mut buffer).await.unwrap_or(0);
            if read == 0 || cut.load(Ordering::SeqCst) {
                return;
            }
            if *downstream_mode.lock().expect("mode") == Mode::Silent {
                downstream_silenced.store(true, Ordering::SeqCst);
            }
            if downstream_silenced.load(Ordering::SeqCst) {
                continue;
            }
            // Before the bytes go on: a client that answers them at once must find it set.
            downstream_answered.store(true, Ordering::SeqCst);
            if client_write.write_all(&buffer[..read]).await.is_err() {
                return;
            }
        }
    };
    // Whichever side ends first ends the connection, so a cut closes both halves at once.
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
        _ = generation.changed() => {}
    }
}
