//! The key store's writer: new keys and the links of operations to their subjects, written in
//! batches by one thread, one durable commit for everything that arrived while the last one
//! was being written (group commit, as the ledger's own appends).
//!
//! A seal never waits for a disk: it takes its key from memory, and what it made (a new key, a
//! link) is queued here. Whoever needs it durable waits for its batch: the ledger before it
//! appends a value sealed under a new key. A new key is written at once; links alone wait up
//! to [`LINK_LINGER_MS`] (or until [`LINK_BATCH`] are queued), so that one commit carries the
//! links of hundreds of operations: nobody waits for them, and an erasure writes what is queued
//! before it reads.
//!
//! What must never happen: a batch reported durable before its commit returned; a write
//! reported durable whose commit failed.

use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use opledger_domain::personal::PersonalDataError;

use crate::table::{KeyTable, Write};

/// Longest a link waits in the queue for others to share its commit, in milliseconds: the
/// window in which a crash of the process loses links (never keys, never values).
pub const LINK_LINGER_MS: u64 = 50;

/// Links queued that are written at once, without waiting out [`LINK_LINGER_MS`].
pub const LINK_BATCH: usize = 4_096;

/// The table, shared by the writer thread and the operator's commands.
pub(crate) type Table = Arc<Mutex<Box<dyn KeyTable>>>;

pub(crate) fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The writes of one commit, and its outcome once known.
#[derive(Debug)]
pub(crate) struct Batch {
    done: tokio::sync::watch::Sender<Option<Outcome>>,
}

/// A commit's outcome: the ids of the new keys it did not store because another process had
/// stored a key for the same subject first, or why it failed.
pub(crate) type Outcome = Result<Arc<Vec<String>>, String>;

impl Batch {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            done: tokio::sync::watch::Sender::new(None),
        })
    }

    fn finish(&self, outcome: Outcome) {
        self.done.send_replace(Some(outcome));
    }

    /// Whether key `key_id` (or, with `None`, every write) of this batch is durable: `None`
    /// while the commit runs.
    pub fn stored(&self, key_id: Option<&str>) -> Option<Result<(), PersonalDataError>> {
        self.done
            .borrow()
            .as_ref()
            .map(|outcome| judge(outcome, key_id))
    }

    /// Waits for the commit; then as [`Batch::stored`].
    pub async fn wait(&self, key_id: Option<&str>) -> Result<(), PersonalDataError> {
        let mut done = self.done.subscribe();
        let outcome = done
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|outcome| outcome.clone());
        match outcome {
            Some(outcome) => judge(&outcome, key_id),
            None => Err(PersonalDataError::KeyStore(
                "the key store's writer stopped".to_owned(),
            )),
        }
    }
}

fn judge(outcome: &Outcome, key_id: Option<&str>) -> Result<(), PersonalDataError> {
    match (outcome, key_id) {
        (Err(error), _) => Err(PersonalDataError::KeyStore(error.clone())),
        (Ok(lost), Some(key_id)) if lost.iter().any(|lost| lost == key_id) => {
            Err(PersonalDataError::KeyReplaced)
        }
        (Ok(_), _) => Ok(()),
    }
}

struct Queue {
    writes: Vec<Write>,
    /// The batch the queued writes will be committed in.
    open: Arc<Batch>,
    /// The last batch taken to be written (for a wait when nothing is queued).
    taken: Arc<Batch>,
    /// The links queued in the open batch: a record with several personal values asks once per
    /// value.
    linked: HashSet<(String, String)>,
    /// Whether a new key is queued (written at once: a record waits for it).
    keys_queued: bool,
    /// When the oldest queued link was queued.
    links_since: Option<Instant>,
    stop: bool,
}

impl Queue {
    /// Whether what is queued is written now; otherwise how long the thread may wait first.
    fn due(&self) -> Result<(), Duration> {
        let linger = Duration::from_millis(LINK_LINGER_MS);
        match self.links_since {
            _ if self.keys_queued || self.stop || self.writes.len() >= LINK_BATCH => Ok(()),
            Some(since) => linger.checked_sub(since.elapsed()).map_or(Ok(()), Err),
            None => Ok(()),
        }
    }
}

/// The queue and the thread that empties it.
pub(crate) struct Writer {
    table: Table,
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl Writer {
    /// A writer over `table`, with its thread started.
    pub fn start(table: Table) -> Result<(Arc<Self>, std::thread::JoinHandle<()>), std::io::Error> {
        let done = Batch::new();
        done.finish(Ok(Arc::default()));
        let writer = Arc::new(Self {
            table,
            queue: Mutex::new(Queue {
                writes: Vec::new(),
                open: Batch::new(),
                taken: done,
                linked: HashSet::new(),
                keys_queued: false,
                links_since: None,
                stop: false,
            }),
            wake: Condvar::new(),
        });
        let thread = {
            let writer = Arc::clone(&writer);
            std::thread::Builder::new()
                .name("opledger-keys".into())
                .spawn(move || writer.run())?
        };
        Ok((writer, thread))
    }

    fn run(&self) {
        loop {
            {
                let mut queue = lock(&self.queue);
                loop {
                    if queue.writes.is_empty() {
                        if queue.stop {
                            return;
                        }
                        queue = self
                            .wake
                            .wait(queue)
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        continue;
                    }
                    match queue.due() {
                        Ok(()) => break,
                        Err(wait) => {
                            queue = self
                                .wake
                                .wait_timeout(queue, wait)
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .0;
                        }
                    }
                }
            }
            let mut table = lock(&self.table);
            self.flush_locked(&mut **table);
        }
    }

    /// Queues `write`; returns the batch it will be committed in (`None` for a link already
    /// queued).
    pub fn push(&self, write: Write) -> Option<Arc<Batch>> {
        let mut queue = lock(&self.queue);
        // The thread is woken when it must write now or start its wait: not for every link.
        let wake = match &write {
            Write::Link {
                key_id,
                operation_id,
                ..
            } => {
                if !queue.linked.insert((key_id.clone(), operation_id.clone())) {
                    return None;
                }
                let first = queue.links_since.is_none();
                queue.links_since.get_or_insert_with(Instant::now);
                first || queue.writes.len() + 1 >= LINK_BATCH
            }
            Write::Key { .. } => {
                queue.keys_queued = true;
                true
            }
        };
        queue.writes.push(write);
        let batch = Arc::clone(&queue.open);
        drop(queue);
        if wake {
            self.wake.notify_one();
        }
        Some(batch)
    }

    /// The batch holding the last write queued so far.
    pub fn last(&self) -> Arc<Batch> {
        let queue = lock(&self.queue);
        if queue.writes.is_empty() {
            Arc::clone(&queue.taken)
        } else {
            Arc::clone(&queue.open)
        }
    }

    /// Writes what is queued now, on the caller's thread, with the table held (an erasure
    /// does so before it reads which operations a subject has).
    pub fn flush_locked(&self, table: &mut dyn KeyTable) {
        let (writes, batch) = {
            let mut queue = lock(&self.queue);
            if queue.writes.is_empty() {
                return;
            }
            queue.linked.clear();
            queue.keys_queued = false;
            queue.links_since = None;
            let batch = std::mem::replace(&mut queue.open, Batch::new());
            queue.taken = Arc::clone(&batch);
            (std::mem::take(&mut queue.writes), batch)
        };
        let outcome = table
            .write(&writes)
            .map(Arc::new)
            .map_err(|error| error.to_string());
        if let Err(error) = &outcome {
            tracing::error!(%error, writes = writes.len(), "the key store could not write new keys and links");
        }
        batch.finish(outcome);
    }

    /// The table.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// Asks the thread to write what is queued and stop.
    pub fn stop(&self) {
        lock(&self.queue).stop = true;
        self.wake.notify_one();
    }
}
