//! What the file named by `--db` is, checked before the store opens it, so that a wrong path is
//! answered with what the file is not and what to do next, in the user's terms, instead of
//! SQLite's ("unable to open database file", "file is not a database").
//!
//! Nothing here writes: a read or a decision never creates a file, and a refused file is left as
//! it was. Whether an SQLite file is an opledger ledger is the store's to say (it reads the
//! schema); this module only looks at what the file system and the file's first bytes tell.

use std::io::Read;
use std::path::Path;

use opledger_domain::store::StoreError;

/// The first 16 bytes of every SQLite 3 database file (the file format's "magic header string").
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// What a command does with the ledger file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `record`: starts a ledger when the file does not exist.
    Create,
    /// Approve, deny, resolve a review: writes into a ledger that must exist.
    Decide,
    /// Every read command: the ledger must exist and nothing is created.
    Read,
}

/// Why the file at `--db` cannot be used as a ledger, found before the store opened it.
#[derive(Debug, thiserror::Error)]
pub enum LedgerFileError {
    /// The file does not exist, for a command that needs one.
    #[error(
        "no ledger at {path}; pass --db (or set OPLEDGER_DB) to the file `opledger record` wrote"
    )]
    Missing {
        /// The path given.
        path: String,
    },
    /// The directory the file should be in does not exist.
    #[error("{}", no_directory_message(path, directory, *access))]
    NoDirectory {
        /// The path given.
        path: String,
        /// Its directory, which does not exist.
        directory: String,
        /// What the command wanted to do.
        access: Access,
    },
    /// The path names a directory.
    #[error("{path} is a directory, not a ledger file; pass --db the ledger file itself (e.g. {path}/opledger.db)")]
    IsADirectory {
        /// The path given.
        path: String,
    },
    /// The path names a device, a pipe or a socket: SQLite would open it and make its journal
    /// beside it (`/dev/null-journal`) before finding it is no database.
    #[error("{path} is not a regular file (a device, a pipe or a socket), so it cannot be a ledger; nothing was written beside it. Pass --db (or set OPLEDGER_DB) to a ledger file, or to a new path to start one")]
    NotAFile {
        /// The path given.
        path: String,
    },
    /// The file is not an SQLite database at all.
    #[error("{}", not_a_ledger_message(path, *access))]
    NotALedger {
        /// The path given.
        path: String,
        /// What the command wanted to do.
        access: Access,
    },
}

impl LedgerFileError {
    /// A short, stable name for scripts (`--json` errors).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Missing { .. } => "no_ledger",
            Self::NoDirectory { .. } => "no_directory",
            Self::IsADirectory { .. } | Self::NotAFile { .. } | Self::NotALedger { .. } => {
                "not_a_ledger"
            }
        }
    }
}

fn no_directory_message(path: &str, directory: &str, access: Access) -> String {
    match access {
        Access::Create => format!(
            "cannot create the ledger {path}: the directory {directory} does not exist; create it \
             first (mkdir -p {directory}) or pass --db a path in an existing directory"
        ),
        Access::Decide | Access::Read => format!(
            "no ledger at {path}: the directory {directory} does not exist; pass --db (or set \
             OPLEDGER_DB) to the file `opledger record` wrote"
        ),
    }
}

fn not_a_ledger_message(path: &str, access: Access) -> String {
    let instead = match access {
        Access::Create => {
            "; pass --db the ledger file `opledger record` wrote, or a path that does not exist \
             yet to start a new ledger"
        }
        Access::Decide | Access::Read => {
            "; pass --db (or set OPLEDGER_DB) to the ledger file `opledger record` wrote"
        }
    };
    format!(
        "{path} is not an SQLite database, so it is not an opledger ledger (it was left as it \
         is){instead}. If it was a ledger, its first bytes were overwritten: restore it from a backup"
    )
}

/// Checks `path` for `access` before the store opens it.
pub fn check(path: &Path, access: Access) -> Result<(), LedgerFileError> {
    let shown = path.display().to_string();
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.is_dir() => Err(LedgerFileError::IsADirectory { path: shown }),
        Ok(metadata) if !metadata.is_file() => Err(LedgerFileError::NotAFile { path: shown }),
        Ok(_) if !starts_like_sqlite(path) => Err(LedgerFileError::NotALedger {
            path: shown,
            access,
        }),
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let directory = path
                .parent()
                .filter(|parent| !parent.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if !directory.is_dir() {
                return Err(LedgerFileError::NoDirectory {
                    path: shown,
                    directory: directory.display().to_string(),
                    access,
                });
            }
            match access {
                Access::Create => Ok(()),
                Access::Decide | Access::Read => Err(LedgerFileError::Missing { path: shown }),
            }
        }
        // Anything else (no permission) is the store's to report, with the operating system's words.
        Err(_) => Ok(()),
    }
}

/// Whether the file could be an SQLite database: empty (SQLite starts a database in an empty
/// file) or starting with SQLite's header. An unreadable file passes: the store reports why.
fn starts_like_sqlite(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return true;
    };
    let mut head = Vec::with_capacity(SQLITE_MAGIC.len());
    match file.take(SQLITE_MAGIC.len() as u64).read_to_end(&mut head) {
        Ok(0) => true,
        Ok(_) => head.as_slice() == SQLITE_MAGIC,
        Err(_) => true,
    }
}

/// The next step to add to a store's refusal to open the file (another program's database, a
/// file it cannot open); `None` when the store's own message says what to do.
pub fn next_step(error: &StoreError, access: Access) -> Option<&'static str> {
    match (error, access) {
        (StoreError::Unavailable { .. }, Access::Create) => Some(
            "pass --db the ledger file `opledger record` wrote, or a path that does not exist yet \
             to start a new ledger",
        ),
        (StoreError::Unavailable { .. }, Access::Decide | Access::Read) => {
            Some("pass --db (or set OPLEDGER_DB) to the ledger file `opledger record` wrote")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_sqlite_is_named_not_a_ledger_and_an_empty_one_may_start_one() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "hello").expect("written");
        let error = check(&text, Access::Read).expect_err("not a database");
        assert_eq!(error.code(), "not_a_ledger");
        let empty = dir.path().join("empty.db");
        std::fs::write(&empty, "").expect("written");
        assert!(check(&empty, Access::Create).is_ok());
        assert!(check(&dir.path().join("new.db"), Access::Create).is_ok());
        let missing = check(&dir.path().join("new.db"), Access::Read).expect_err("missing");
        assert_eq!(missing.code(), "no_ledger");
        let no_dir = check(&dir.path().join("nope/new.db"), Access::Create).expect_err("no dir");
        assert_eq!(no_dir.code(), "no_directory");
    }
}
