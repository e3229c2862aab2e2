//! `opledger serve` as the soak's child process: started on the soak's configuration, killed
//! with SIGKILL, started again on the same ledger file.
//!
//! The child must never outlive the soak: the guard kills it when dropped (an error, a Ctrl-C
//! that drops the soak half-way), so no server is left holding the ledger.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::BenchError;

/// How long a start may take, to `/healthz` answering ready: a debug build on a loaded
/// 2-core machine, replaying nothing (start-up does no work proportional to the history).
const START_DEADLINE_MS: u64 = 60_000;
/// How often `/healthz` is asked while the server starts, in milliseconds.
const HEALTH_POLL_MS: u64 = 20;

/// A running `opledger serve`, and the address it printed.
pub struct ServerProcess {
    child: Option<Child>,
    /// `http://127.0.0.1:<port>`, a fresh port at every start.
    pub base: String,
}

impl ServerProcess {
    /// Starts `exe serve --config config`, its log appended to `log`, and waits until it
    /// answers `/healthz` ready.
    pub async fn start(
        exe: &Path,
        config: &Path,
        log: &Path,
        client: &reqwest::Client,
    ) -> Result<Self, BenchError> {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|error| {
                BenchError::Other(format!("cannot open {}: {error}", log.display()))
            })?;
        let mut child = Command::new(exe)
            .arg("serve")
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|error| BenchError::Other(format!("cannot start the server: {error}")))?;
        let lines = read_lines(&mut child);
        let mut server = Self {
            child: Some(child),
            base: String::new(),
        };
        let started = Instant::now();
        server.base = server.address(lines, started, log).await?;
        server.wait_ready(client, started, log).await?;
        Ok(server)
    }

    /// SIGKILL (what `Child::kill` sends on Unix): no destructor, flush or close runs in the
    /// server. Waits for the process to be gone, so the next start cannot race it for the file.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The address from the server's `listening on http://…` line.
    async fn address(
        &mut self,
        mut lines: mpsc::UnboundedReceiver<String>,
        started: Instant,
        log: &Path,
    ) -> Result<String, BenchError> {
        loop {
            let left = Duration::from_millis(START_DEADLINE_MS).saturating_sub(started.elapsed());
            let line = match tokio::time::timeout(left, lines.recv()).await {
                Ok(Some(line)) => line,
                Ok(None) | Err(_) => return Err(self.failed("printed no address", log)),
            };
            if let Some(rest) = line.split("listening on ").nth(1) {
                if let Some(address) = rest.split_whitespace().next() {
                    return Ok(address.to_owned());
                }
            }
        }
    }

    async fn wait_ready(
        &mut self,
        client: &reqwest::Client,
        started: Instant,
        log: &Path,
    ) -> Result<(), BenchError> {
        let url = format!("{}/healthz", self.base);
        while started.elapsed() < Duration::from_millis(START_DEADLINE_MS) {
            if let Ok(response) = client.get(&url).send().await {
                if response.status().is_success() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(HEALTH_POLL_MS)).await;
        }
        Err(self.failed("never answered /healthz ready", log))
    }

    /// The error of a start that failed, with the end of the server's log; the child is killed.
    fn failed(&mut self, what: &str, log: &Path) -> BenchError {
        self.kill();
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        BenchError::Other(format!(
            "the server {what} within {START_DEADLINE_MS} ms; the end of its log ({}):\n{}",
            log.display(),
            tail.join("\n")
        ))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The child's stdout, line by line, read on a thread of its own to the end (the child's death),
/// so the child never blocks on a full pipe.
fn read_lines(child: &mut Child) -> mpsc::UnboundedReceiver<String> {
    let (sender, receiver) = mpsc::unbounded_channel();
    if let Some(stdout) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // Nobody listens after the address: the rest is drained and dropped.
                let _ = sender.send(line);
            }
        });
    }
    receiver
}
