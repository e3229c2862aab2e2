//! Opening an opledger SQLite file: connection settings, the schema and its version.
//!
//! A file is read before it is changed: one from a newer opledger, one that another program
//! created, or one that is not a database at all is refused and left byte for byte as it was.
//! Only then is it switched to WAL with `synchronous=FULL`, and both settings are read back,
//! because SQLite silently keeps another journal mode when it cannot switch (e.g. in memory).

use std::path::Path;
use std::time::Duration;

use opledger_domain::ids::GlobalPosition;
use opledger_domain::store::StoreError;
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use super::codec;
use super::{sqlite_error, BUSY_TIMEOUT_MS, SCHEMA_VERSION};

/// The schema of version 1.
///
/// `streams` gives each stream a small integer id in creation order and holds its last version.
/// The `(stream_id, version)` uniqueness index is keyed by that id, not by the name: operation
/// ids are random, so a name-keyed index would dirty one random page per append, while ids in
/// creation order keep the streams being written now on a few neighbouring pages. Fewer dirty
/// pages per group commit is fewer WAL frames per fsync — the store's main cost. The name stays
/// in `events` too, so reading the log needs no join.
///
/// `AUTOINCREMENT` makes SQLite never hand out a position twice, even if the newest event were
/// ever removed by hand; positions then start at 1. `STRICT` refuses values of the wrong type
/// instead of converting them.
const CREATE_SCHEMA_V1: &str = "
    CREATE TABLE streams (
        stream_id    INTEGER PRIMARY KEY,
        name         TEXT    NOT NULL UNIQUE,
        last_version INTEGER NOT NULL CHECK (last_version >= 0)
    ) STRICT;
    CREATE TABLE events (
        position   INTEGER PRIMARY KEY AUTOINCREMENT,
        stream_id  INTEGER NOT NULL REFERENCES streams (stream_id),
        version    INTEGER NOT NULL CHECK (version >= 0),
        stream     TEXT    NOT NULL,
        event_id   BLOB    NOT NULL UNIQUE CHECK (length(event_id) = 16),
        event_type TEXT    NOT NULL,
        data       BLOB    NOT NULL,
        metadata   BLOB    NOT NULL,
        UNIQUE (stream_id, version)
    ) STRICT;
";

/// Pages of WAL after which the writer copies the WAL back into the database file. SQLite's
/// default (1000 pages) makes every few group commits pay for a checkpoint that rewrites the
/// same hot index pages again; 10 000 pages (about 40 MiB) rewrites them far less often, at the
/// price of a larger WAL to replay after a crash.
pub(super) const WAL_AUTOCHECKPOINT_PAGES: i64 = 10_000;
/// The writer's page cache, in KiB: enough to keep the hot index pages of a busy ledger in
/// memory, so a conflict check or an index insert rarely reads pages back from the OS. Larger
/// is not better: SQLite scans the cache's hash table at the end of every write transaction,
/// and at 64 MiB that scan cost more than the reads it saved (measured with `bench store`).
pub(super) const WRITER_CACHE_KIB: i64 = 16 * 1024;

/// `PRAGMA synchronous` reads back 2 for FULL.
const SYNCHRONOUS_FULL: i64 = 2;

/// Refuses a path that exists and is no regular file (a device such as `/dev/null`, a pipe, a
/// socket, a directory) before SQLite touches it: SQLite would open it, and create its journal
/// beside it (`/dev/null-journal`) before finding it is no database.
pub(crate) fn refuse_special_file(path: &Path) -> Result<(), StoreError> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => Err(StoreError::Unavailable {
            reason: format!(
                "`{}` is not a regular file (a device, a pipe, a socket or a directory); give the path of a ledger file, or of a new one to create",
                path.display()
            ),
        }),
        _ => Ok(()),
    }
}

/// Opens the one read-write connection, creating or checking the schema.
pub(super) fn open_writer(path: &Path) -> Result<Connection, StoreError> {
    refuse_special_file(path)?;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut connection = Connection::open_with_flags(path, flags)
        .map_err(|error| sqlite_error(format_args!("cannot open `{}`", path.display()), error))?;
    connection
        .busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))
        .map_err(|error| sqlite_error("cannot set the busy timeout", error))?;
    keep_plans(&connection)?;

    // Everything up to the journal-mode switch only reads, so a refused file stays untouched.
    let found = schema_version(&connection, path)?;
    check_version(found)?;
    if found == 0 && has_objects(&connection)? {
        return Err(StoreError::Unavailable {
            reason: format!(
                "`{}` is an SQLite database that opledger did not create (it has tables but no schema \
                 version): it is not an opledger ledger, and it was left as it is",
                path.display()
            ),
        });
    }

    enable_wal(&connection, path)?;
    enable_full_sync(&connection)?;
    connection
        .execute_batch(&format!(
            "PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}; PRAGMA cache_size = -{WRITER_CACHE_KIB};"
        ))
        .map_err(|error| sqlite_error("cannot set the writer's cache and checkpoint sizes", error))?;
    if found == 0 {
        create_schema(&mut connection)?;
    }
    check_schema(&connection, path)?;
    connection
        .execute_batch(super::tree::CREATE_TREE_SCHEMA)
        .map_err(|error| sqlite_error("cannot create the log tree's tables", error))?;
    connection
        .execute_batch(super::tenant_trees::CREATE_TENANT_SCHEMA)
        .map_err(|error| sqlite_error("cannot create the tenant trees' tables", error))?;
    Ok(connection)
}

/// Opens a read-write connection for a rare write beside the writer thread's (a kept
/// checkpoint): it waits for the writer's lock like any other opener of the file.
pub(super) fn open_side_writer(path: &Path) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let connection = Connection::open_with_flags(path, flags)
        .map_err(|error| sqlite_error(format_args!("cannot open `{}`", path.display()), error))?;
    connection
        .busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))
        .map_err(|error| sqlite_error("cannot set the busy timeout", error))?;
    connection
        .pragma_update(None, "synchronous", "FULL")
        .map_err(|error| sqlite_error("cannot set synchronous=FULL", error))?;
    Ok(connection)
}

/// Opens a read-only connection for the reader pool.
pub(super) fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    refuse_special_file(path)?;
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let connection = Connection::open_with_flags(path, flags).map_err(|error| {
        sqlite_error(
            format_args!("cannot open `{}` for reading", path.display()),
            error,
        )
    })?;
    connection
        .busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))
        .map_err(|error| sqlite_error("cannot set the busy timeout", error))?;
    keep_plans(&connection)?;
    Ok(connection)
}

/// Keeps each prepared statement's plan whatever values are bound. Without this SQLite compiles
/// a statement again every time a new value is bound to a parameter that its planner looked at,
/// and it looks at every `LIMIT ?`: the log reads were parsed and planned anew on each call
/// (about 3 % of the CPU of `bench http`). Our statements have one good plan each.
fn keep_plans(connection: &Connection) -> Result<(), StoreError> {
    connection
        .set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map(drop)
        .map_err(|error| sqlite_error("cannot keep the query plans stable", error))
}

/// The position of the newest stored event (`None`: the log is empty). `MAX` of the rowid is one
/// seek to the end of the table; the writer asks it inside every write transaction, so the
/// statement is cached.
pub(super) fn head_position(connection: &Connection) -> Result<Option<GlobalPosition>, StoreError> {
    let newest: Option<i64> = connection
        .prepare_cached("SELECT MAX(position) FROM events")
        .and_then(|mut statement| statement.query_row([], |row| row.get(0)))
        .map_err(|error| sqlite_error("cannot read the log's head position", error))?;
    newest.map(codec::position_from_sql).transpose()
}

fn schema_version(connection: &Connection, path: &Path) -> Result<i64, StoreError> {
    // This is the first statement that reads the file, so a file that is not a database fails
    // here (SQLITE_NOTADB, reported as corrupt by `sqlite_error`).
    connection
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|error| {
            sqlite_error(
                format_args!("cannot read the schema version of `{}`", path.display()),
                error,
            )
        })
}

fn check_version(found: i64) -> Result<(), StoreError> {
    if (0..=SCHEMA_VERSION).contains(&found) {
        Ok(())
    } else {
        Err(StoreError::IncompatibleSchema {
            found,
            supported: SCHEMA_VERSION,
        })
    }
}

fn has_objects(connection: &Connection) -> Result<bool, StoreError> {
    let objects: i64 = connection
        .query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0))
        .map_err(|error| sqlite_error("cannot list the database's tables", error))?;
    Ok(objects > 0)
}

fn enable_wal(connection: &Connection, path: &Path) -> Result<(), StoreError> {
    let mode: String = connection
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(|error| sqlite_error("cannot switch to WAL", error))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Unavailable {
            reason: format!(
                "`{}` cannot be put in WAL mode (its journal mode stays `{mode}`); the store needs WAL so \
                 readers never block the writer",
                path.display()
            ),
        });
    }
    Ok(())
}

fn enable_full_sync(connection: &Connection) -> Result<(), StoreError> {
    connection
        .pragma_update(None, "synchronous", "FULL")
        .map_err(|error| sqlite_error("cannot set synchronous=FULL", error))?;
    let level: i64 = connection
        .pragma_query_value(None, "synchronous", |row| row.get(0))
        .map_err(|error| sqlite_error("cannot read back the synchronous level", error))?;
    if level != SYNCHRONOUS_FULL {
        return Err(StoreError::Unavailable {
            reason: format!("synchronous is {level} after setting FULL ({SYNCHRONOUS_FULL}); appends would not be durable"),
        });
    }
    Ok(())
}

fn create_schema(connection: &mut Connection) -> Result<(), StoreError> {
    let transaction = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|error| sqlite_error("cannot start the schema transaction", error))?;
    // Another process may have created the schema between our first look and this lock.
    let found: i64 = transaction
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|error| sqlite_error("cannot read the schema version", error))?;
    check_version(found)?;
    if found == 0 {
        transaction
            .execute_batch(CREATE_SCHEMA_V1)
            .map_err(|error| sqlite_error("cannot create the schema", error))?;
        transaction
            .pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(|error| sqlite_error("cannot record the schema version", error))?;
    }
    transaction
        .commit()
        .map_err(|error| sqlite_error("cannot commit the schema", error))
}

fn check_schema(connection: &Connection, path: &Path) -> Result<(), StoreError> {
    let tables: i64 = connection
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name IN ('events', 'streams')",
            [],
            |row| row.get(0),
        )
        .map_err(|error| sqlite_error("cannot look for the events table", error))?;
    if tables != 2 {
        return Err(StoreError::Corrupt {
            reason: format!(
                "`{}` has schema version {SCHEMA_VERSION} but lacks its events or streams table",
                path.display()
            ),
        });
    }
    Ok(())
}
