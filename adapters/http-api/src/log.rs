//! The transparency log as the server keeps it: its settings (the signing key, how often a
//! checkpoint is published, whether the tree grows with the log) and the publisher, which signs
//! the tree head at most every `checkpoint_every_s` seconds or `checkpoint_every_events` events
//! and keeps each checkpoint in the ledger, so a proof against any earlier one still works.
//!
//! The key comes from a file or the environment, never from the ledger. The publisher never
//! signs a head it has not read from the stored tree, and never stops the service: a failed
//! signature or store is logged and tried again at the next tick.

use std::sync::Arc;
use std::time::{Duration, Instant};

use opledger_domain::checkpoint::LogSigner;
use opledger_domain::merkle::{self, LogTree};
use tokio::sync::watch;

use crate::ServeStore;

/// The environment variable holding the signing key itself, when no key file is configured.
pub const SIGNING_KEY_ENV: &str = "OPLEDGER_LOG_KEY";
/// The environment variable naming the signing key's file, when the configuration does not.
pub const SIGNING_KEY_FILE_ENV: &str = "OPLEDGER_LOG_KEY_FILE";
/// Default: a checkpoint at most every this many seconds while events arrive.
pub const DEFAULT_CHECKPOINT_EVERY_S: u64 = 60;
/// Default: a checkpoint as soon as this many events arrived since the last one.
pub const DEFAULT_CHECKPOINT_EVERY_EVENTS: u64 = 10_000;
/// Longest configurable pause between checkpoints, in seconds (a day).
pub const MAX_CHECKPOINT_EVERY_S: u64 = 86_400;
/// How often the publisher looks at the tree's size, in milliseconds.
const PUBLISHER_TICK_MS: u64 = 250;
const _: () = assert!(PUBLISHER_TICK_MS < 1_000 * DEFAULT_CHECKPOINT_EVERY_S);

/// The transparency log's settings.
#[derive(Clone, Debug)]
pub struct LogSettings {
    /// The signing key's text (`None`: no checkpoints are published; tiles and proofs are still
    /// served).
    pub signing_key: Option<String>,
    /// Publish at most every this many seconds (1 to [`MAX_CHECKPOINT_EVERY_S`]).
    pub checkpoint_every_s: u64,
    /// Publish once this many events arrived since the last checkpoint (at least 1).
    pub checkpoint_every_events: u64,
    /// Whether the SQLite ledger's tree grows with the log (off only to measure its cost).
    pub tree: bool,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            signing_key: None,
            checkpoint_every_s: DEFAULT_CHECKPOINT_EVERY_S,
            checkpoint_every_events: DEFAULT_CHECKPOINT_EVERY_EVENTS,
            tree: true,
        }
    }
}

impl LogSettings {
    /// The defaults with the signing key from the environment: `OPLEDGER_LOG_KEY_FILE` names a
    /// file, else `OPLEDGER_LOG_KEY` holds the key.
    pub fn from_environment() -> Result<Self, String> {
        Ok(Self {
            signing_key: key_from_environment()?,
            ..Self::default()
        })
    }
}

/// The signing key from the environment, if any.
pub fn key_from_environment() -> Result<Option<String>, String> {
    if let Ok(path) = std::env::var(SIGNING_KEY_FILE_ENV) {
        return std::fs::read_to_string(&path)
            .map(Some)
            .map_err(|error| format!("{SIGNING_KEY_FILE_ENV}: cannot read {path}: {error}"));
    }
    Ok(std::env::var(SIGNING_KEY_ENV).ok())
}

/// Parses the configured key, naming where it came from when it is not one.
pub fn signer_of(settings: &LogSettings) -> Result<Option<Arc<LogSigner>>, String> {
    settings
        .signing_key
        .as_deref()
        .map(|text| LogSigner::parse(text).map(Arc::new))
        .transpose()
        .map_err(|error| error.to_string())
}

/// Signs the stored tree's head and keeps the checkpoint; returns it.
pub async fn publish(store: &ServeStore, signer: &LogSigner) -> Result<(u64, String), String> {
    let (head, tenants) = merkle::heads_to_sign(store)
        .await
        .map_err(|error| error.to_string())?;
    let note = signer
        .sign(head, tenants)
        .map_err(|error| error.to_string())?;
    store
        .keep_checkpoint(head.size, note.clone())
        .await
        .map_err(|error| error.to_string())?;
    Ok((head.size, note))
}

/// Publishes checkpoints until `stopping` turns true.
pub fn spawn_publisher(
    store: ServeStore,
    signer: Arc<LogSigner>,
    settings: &LogSettings,
    mut stopping: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let every = Duration::from_secs(settings.checkpoint_every_s);
    let every_events = settings.checkpoint_every_events;
    tokio::spawn(async move {
        let mut last_size = match store.kept_checkpoint(None).await {
            Ok(kept) => kept.map(|(size, _)| size),
            Err(error) => {
                tracing::warn!(%error, "the checkpoint publisher cannot read the kept checkpoints; it stops");
                return;
            }
        };
        let mut last_at = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(PUBLISHER_TICK_MS));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopping.changed() => {}
            }
            if *stopping.borrow() {
                return;
            }
            let Ok(size) = store.tree_size().await else {
                continue;
            };
            let grown = size.saturating_sub(last_size.unwrap_or(0));
            let due = last_size.is_none()
                || (grown > 0 && (grown >= every_events || last_at.elapsed() >= every));
            if !due {
                continue;
            }
            match publish(&store, &signer).await {
                Ok((size, _)) => {
                    tracing::debug!(size, "checkpoint published");
                    last_size = Some(size);
                    last_at = Instant::now();
                }
                Err(error) => {
                    tracing::warn!(%error, "the checkpoint could not be published; trying again")
                }
            }
        }
    })
}
