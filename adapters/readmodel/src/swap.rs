//! Replacing a read-model file that other processes may open at any moment: a lock file beside it.
//!
//! SQLite keeps a WAL-mode file's write-ahead log and shared-memory index beside it *by name*
//! (`<views>-wal`, `<views>-shm`). A file renamed over one that a process has open would be paired
//! with that process's log, and pages of the old file would be applied to the new one; a process
//! that opened the old file just before the rename would go on reading and catching up a file
//! nobody else sees. Checking for a `-wal` file first is not enough: a process can open the read models
//! between the check and the rename.
//!
//! So every [`super::ReadModelStore`] holds a shared `flock` on `<views>.lock` for as long as it
//! is open, and [`replace_read_models`] takes it exclusively: the rename happens only when nobody has
//! the read models open, and nobody can open them until it is done. An opener that arrives during a
//! replacement waits (at most [`BUSY_TIMEOUT_MS`]) and then opens the new file. The lock is
//! advisory: it protects against opledger processes, which all open views through this module.
//!
//! It must never hold the lock exclusively for longer than a rename and its fsyncs, and never
//! delete a lock file: a process holding the deleted one and another locking a new one of the
//! same name would both think they are alone.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};

use super::{ReadModelError, BUSY_TIMEOUT_MS};

/// How long an opener waits between two tries while a replacement holds the lock, in ms.
const SWAP_POLL_MS: u64 = 2;

/// A `flock` on a read-model file's lock file, released when dropped (closing the file releases it).
#[derive(Debug)]
pub(super) struct ViewsLock {
    _file: File,
}

/// `<views>.lock`.
pub fn lock_path(views: &Path) -> PathBuf {
    sibling(views, ".lock")
}

/// Takes the shared lock of the read models at `views`, waiting for a replacement in progress to end.
pub(super) fn shared(views: &Path) -> Result<ViewsLock, ReadModelError> {
    shared_within(views, Duration::from_millis(BUSY_TIMEOUT_MS))
}

fn shared_within(views: &Path, wait: Duration) -> Result<ViewsLock, ReadModelError> {
    lock_within(views, FlockOperation::NonBlockingLockShared, wait)?.ok_or_else(|| {
        ReadModelError::BeingReplaced {
            path: views.to_path_buf(),
        }
    })
}

/// Takes the lock of the read models at `views` exclusively, waiting up to `wait` for the processes that
/// have them open to close them; `None` if they did not.
pub(super) fn exclusive_within(
    views: &Path,
    wait: Duration,
) -> Result<Option<ViewsLock>, ReadModelError> {
    lock_within(views, FlockOperation::NonBlockingLockExclusive, wait)
}

/// Tries the non-blocking `operation` on the read models' lock file until it succeeds or `wait` has
/// passed (`None`).
fn lock_within(
    views: &Path,
    operation: FlockOperation,
    wait: Duration,
) -> Result<Option<ViewsLock>, ReadModelError> {
    let path = lock_path(views);
    let file = open_lock_file(&path)?;
    let deadline = Instant::now() + wait;
    loop {
        match flock(&file, operation) {
            Ok(()) => return Ok(Some(ViewsLock { _file: file })),
            Err(error) if error == rustix::io::Errno::WOULDBLOCK => {
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_millis(SWAP_POLL_MS));
            }
            Err(error) if error == rustix::io::Errno::INTR => {}
            Err(error) => {
                return Err(ReadModelError::Lock {
                    path,
                    source: error.into(),
                })
            }
        }
    }
}

/// Moves the finished read models at `temporary` to `live`, replacing what is there, when no
/// process has `live` open; fails with [`ReadModelError::InUse`] (and changes nothing) when one
/// has. `temporary` must be closed (no write-ahead log beside it) and on the same file system.
/// The rename is made durable (the directory is fsynced); the old file's write-ahead log and
/// index, left by a process that did not close it cleanly, are removed with it, since they
/// belong to the old file. Blocking: call it from a blocking thread.
pub fn replace_read_models(temporary: &Path, live: &Path) -> Result<(), ReadModelError> {
    let path = lock_path(live);
    let file = open_lock_file(&path)?;
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(error) if error == rustix::io::Errno::WOULDBLOCK => {
            return Err(ReadModelError::InUse {
                path: live.to_path_buf(),
            })
        }
        Err(error) => {
            return Err(ReadModelError::Lock {
                path,
                source: error.into(),
            })
        }
    }
    for suffix in ["-wal", "-shm", "-journal"] {
        let leftover = sibling(temporary, suffix);
        if leftover.exists() {
            return Err(ReadModelError::Corrupt {
                reason: format!(
                    "the replacement `{}` was not closed cleanly (`{}` exists); nothing was replaced",
                    temporary.display(),
                    leftover.display()
                ),
            });
        }
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReadModelError::Create { path, source }
    };
    std::fs::rename(temporary, live).map_err(io(live))?;
    for suffix in ["-wal", "-shm"] {
        match std::fs::remove_file(sibling(live, suffix)) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(io(live)(error));
            }
            _ => {}
        }
    }
    let directory = match live.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(directory)
        .and_then(|directory| directory.sync_all())
        .map_err(io(directory))?;
    // The temporary name's lock file was only ever taken by this process (the name is its own).
    let _ = std::fs::remove_file(lock_path(temporary));
    drop(file);
    Ok(())
}

fn open_lock_file(path: &Path) -> Result<File, ReadModelError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|source| ReadModelError::Lock {
            path: path.to_path_buf(),
            source,
        })
}

/// `path` with `suffix` appended to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name: OsString = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{apply, ReadModelStore};
    use opledger_domain::ids::GlobalPosition;

    /// A closed read-model file at `path` whose checkpoint is `position` (`None`: nothing applied).
    fn views_at(path: &Path, position: Option<u64>) {
        let store = ReadModelStore::open(path).expect("a fresh read-model file");
        if let Some(position) = position {
            apply::write_checkpoint(&store.connection, GlobalPosition::new(position))
                .expect("a checkpoint");
        }
    }

    fn checkpoint_of(path: &Path) -> Option<GlobalPosition> {
        ReadModelStore::open(path)
            .expect("the read models open")
            .checkpoint()
            .expect("a checkpoint")
    }

    #[test]
    fn views_open_in_a_store_are_not_replaced_and_are_once_it_closes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (live, replacement) = (dir.path().join("v.db"), dir.path().join("v.db.new"));
        views_at(&live, Some(3));
        views_at(&replacement, Some(7));
        let open = ReadModelStore::open(&live).expect("a reader has the read models open");

        let refused = replace_read_models(&replacement, &live).expect_err("in use");
        assert!(matches!(refused, ReadModelError::InUse { .. }), "{refused}");
        assert!(replacement.exists(), "nothing moved");
        assert_eq!(
            open.checkpoint().expect("read"),
            Some(GlobalPosition::new(3))
        );

        drop(open);
        replace_read_models(&replacement, &live).expect("nobody has them open");
        assert!(!replacement.exists());
        assert!(!lock_path(&replacement).exists(), "no stray lock file");
        assert_eq!(checkpoint_of(&live), Some(GlobalPosition::new(7)));
        assert!(!sibling(&live, "-wal").exists(), "no log of the old file");
    }

    #[test]
    fn a_store_opened_during_a_replacement_waits_for_it_and_opens_the_new_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (live, replacement) = (dir.path().join("v.db"), dir.path().join("v.db.new"));
        views_at(&live, Some(3));
        views_at(&replacement, Some(7));
        // What `replace_read_models` holds while it renames, taken before the opener starts: the
        // opener cannot see the old file, whatever the threads' timing.
        let held = open_lock_file(&lock_path(&live)).expect("the lock file");
        flock(&held, FlockOperation::NonBlockingLockExclusive).expect("nobody has it");
        let opener = {
            let live = live.clone();
            std::thread::spawn(move || {
                ReadModelStore::open(&live).and_then(|store| store.checkpoint())
            })
        };
        std::fs::rename(&replacement, &live).expect("the rename");
        drop(held);
        let seen = opener
            .join()
            .expect("the opener thread")
            .expect("it opened");
        assert_eq!(seen, Some(GlobalPosition::new(7)), "it opened the new file");
    }

    #[test]
    fn a_replacement_that_never_ends_makes_an_opener_give_up_naming_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let live = dir.path().join("v.db");
        views_at(&live, None);
        let held = open_lock_file(&lock_path(&live)).expect("the lock file");
        flock(&held, FlockOperation::NonBlockingLockExclusive).expect("nobody has it");
        let error = shared_within(&live, Duration::from_millis(20)).expect_err("it gives up");
        assert!(
            matches!(error, ReadModelError::BeingReplaced { .. }),
            "{error}"
        );
    }
}
