//! The harnesses' own files: fresh ones in the temporary directory, removed with their side
//! files when a run ends.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// A path for a fresh ledger file in the system's temporary directory.
pub fn fresh_path(purpose: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "opledger-{purpose}-{}.db",
        uuid::Uuid::new_v4().simple()
    ))
}

/// `path` with `suffix` appended to its file name.
pub fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name: OsString = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Removes an SQLite file and its side files, if present. Only for a file whose name is this
/// process's own (its lock file is then no one else's), e.g. a benchmark's fresh file.
pub fn remove_database(path: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal", ".lock"] {
        let _ = std::fs::remove_file(sibling(path, suffix));
    }
}
