//! The rebuilt file's way into place: written under a temporary name, fsynced, then linked to
//! the target path (which it never replaces) and the directory fsynced.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::ReadModelError;

/// Makes the finished temporary file durable and gives it its name, without replacing a file
/// that appeared there meanwhile.
pub(super) fn publish(temporary: &Path, path: &Path) -> Result<(), ReadModelError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReadModelError::Create { path, source }
    };
    File::open(temporary)
        .and_then(|file| file.sync_all())
        .map_err(io(temporary))?;
    std::fs::hard_link(temporary, path).map_err(|source| match source.kind() {
        std::io::ErrorKind::AlreadyExists => ReadModelError::AlreadyExists {
            path: path.to_path_buf(),
        },
        _ => ReadModelError::Create {
            path: path.to_path_buf(),
            source,
        },
    })?;
    std::fs::remove_file(temporary).map_err(io(temporary))?;
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(directory)
        .and_then(|file| file.sync_all())
        .map_err(io(directory))
}

/// A name beside `path` for the file being built, unique to this process and call.
pub(super) fn temporary_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(
        ".rebuild-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    PathBuf::from(name)
}

pub(super) fn remove_file_and_journal(path: &Path) {
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        // Absent is the expected case; anything else leaves a stray temporary file, nothing more.
        let _ = std::fs::remove_file(PathBuf::from(name));
    }
}
