//! Early writeback of a file that is being built: its dirty pages go to the disk while it is
//! still being written, instead of all at once in the final fsync.
//!
//! Why: a rebuild writes its file without fsyncs and syncs it once, before it is published. The
//! kernel starts writing dirty pages back on its own only past `dirty_background_ratio` (10 % of
//! memory by default, gigabytes on most machines), so a read-model file of a few hundred
//! megabytes was written to the disk entirely inside that last fsync: serial time at the end
//! of the rebuild with both cores idle (measured with `bench projections`). Syncing
//! every [`WRITEBACK_EVERY_MS`] from a thread of its own overlaps that I/O with the fold and the
//! writer; a page written back and then changed again is simply written again by the next sync.
//!
//! A failed sync is kept and reported when the writeback stops: the kernel reports a writeback
//! error to each open file once, so if this thread's sync consumed it, the final fsync on another
//! handle might not see it, and a file that did not reach the disk would be published.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use super::ReadModelError;

/// How often the file is synced while it is written, in milliseconds. A third of a second is
/// ~100 MB of rebuild output on this machine: enough for each sync to write large runs, often
/// enough that the final fsync is left with little.
pub(super) const WRITEBACK_EVERY_MS: u64 = 300;

/// The thread syncing a file every [`WRITEBACK_EVERY_MS`] until [`EarlyWriteback::stop`] (or
/// until it is dropped, which stops it without waiting).
#[derive(Debug)]
pub(super) struct EarlyWriteback {
    path: PathBuf,
    stop: Sender<()>,
    thread: JoinHandle<std::io::Result<u64>>,
}

impl EarlyWriteback {
    /// Starts syncing the file at `path` (which must exist) every `every`.
    pub(super) fn start(path: &Path, every: Duration) -> Result<Self, ReadModelError> {
        let io = |source| ReadModelError::Create {
            path: path.to_path_buf(),
            source,
        };
        // fdatasync needs no write access: a handle of our own, so the writer's stays SQLite's.
        let file = File::open(path).map_err(io)?;
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("rebuild-writeback".to_owned())
            .spawn(move || {
                let mut syncs = 0_u64;
                loop {
                    match stopped.recv_timeout(every) {
                        Err(RecvTimeoutError::Timeout) => {
                            file.sync_data()?;
                            syncs += 1;
                        }
                        // Stopped, or the owner is gone.
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return Ok(syncs),
                    }
                }
            })
            .map_err(io)?;
        Ok(Self {
            path: path.to_path_buf(),
            stop,
            thread,
        })
    }

    /// Stops the syncing (waiting for a sync under way) and says how many syncs it did, or the
    /// first that failed.
    pub(super) fn stop(self) -> Result<u64, ReadModelError> {
        // The thread may have ended on an error already; then the send has nobody to reach.
        let _ = self.stop.send(());
        let result = self.thread.join().map_err(|_| ReadModelError::Worker {
            reason: "the rebuild's writeback thread panicked".to_owned(),
        })?;
        result.map_err(|source| ReadModelError::Create {
            path: self.path,
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_file_written_while_its_writeback_runs_is_synced_along_the_way_and_stops_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("growing");
        let mut file = File::create(&path).unwrap();
        let writeback = EarlyWriteback::start(&path, Duration::from_millis(1)).unwrap();
        for _ in 0..50 {
            file.write_all(&[7; 4096]).unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        let syncs = writeback.stop().unwrap();
        assert!(
            syncs > 0,
            "50 ms of writes at a sync every 1 ms made no sync"
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 50 * 4096);
    }

    #[test]
    fn a_writeback_of_a_file_that_does_not_exist_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent");
        let error = EarlyWriteback::start(&path, Duration::from_millis(1)).unwrap_err();
        assert!(error.to_string().contains("absent"), "{error}");
    }
}
