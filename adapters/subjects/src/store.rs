//! The key table on SQLite: a file of its own beside the ledger (`<ledger>.keys`), never the
//! ledger file: the ledger is append-only and copied whole (backups, exports), and a copy of it
//! must carry no key. The file runs with `secure_delete`, so the bytes of a destroyed key are
//! overwritten with zeros in the database page, and every destruction ends with a WAL
//! checkpoint that truncates the write-ahead log, so no older copy of the page survives there
//! either. Writes are `synchronous=FULL`: a value sealed under a key that a power loss then
//! forgot would be lost.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

use crate::table::{generation_of, KeyTable, Row, Write};
use crate::SubjectsError;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS subjects (
    key_id            TEXT PRIMARY KEY,
    tag               BLOB NOT NULL UNIQUE,
    tenant            TEXT NOT NULL,
    wrapped_key       BLOB,
    sealed_name       BLOB,
    created_at        TEXT NOT NULL,
    last_recorded_at  TEXT NOT NULL,
    erased_at         TEXT,
    erased_by         TEXT,
    CHECK ((erased_at IS NULL) = (wrapped_key IS NOT NULL)),
    CHECK (erased_at IS NULL OR sealed_name IS NULL)
) STRICT;
CREATE TABLE IF NOT EXISTS subject_operations (
    key_id       TEXT NOT NULL REFERENCES subjects(key_id),
    operation_id TEXT NOT NULL,
    PRIMARY KEY (key_id, operation_id)
) STRICT, WITHOUT ROWID;
";

const COLUMNS: &str = "key_id, tag, tenant, wrapped_key, sealed_name, created_at, last_recorded_at, erased_at, erased_by";

/// A connection to the key store's SQLite file (or to a database in memory).
pub(crate) struct SqliteTable {
    conn: Connection,
    path: Option<String>,
    /// `PRAGMA data_version` when the generation was last read: unchanged, nobody committed.
    seen_version: Option<i64>,
    generation: i64,
}

impl SqliteTable {
    /// Opens (or creates) the key store at `path` (`None`: in memory).
    pub fn open(path: Option<&Path>) -> Result<Self, SubjectsError> {
        let conn = match path {
            Some(path) => Connection::open(path),
            None => Connection::open_in_memory(),
        }
        .map_err(|error| SubjectsError::store("open the key store", error))?;
        conn.execute_batch(
            "PRAGMA secure_delete = ON;
             PRAGMA journal_mode = WAL;
             PRAGMA synchronous = FULL;
             PRAGMA foreign_keys = ON;
             PRAGMA busy_timeout = 5000;",
        )
        .map_err(|error| SubjectsError::store("set up the key store", error))?;
        conn.execute_batch(SCHEMA)
            .map_err(|error| SubjectsError::store("create the key store's tables", error))?;
        Ok(Self {
            conn,
            path: path.map(|path| path.display().to_string()),
            seen_version: None,
            generation: 0,
        })
    }

    fn row_where(
        &self,
        condition: &str,
        value: &dyn rusqlite::ToSql,
    ) -> Result<Option<Row>, SubjectsError> {
        self.conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM subjects WHERE {condition}"))
            .and_then(|mut statement| statement.query_row([value], row_of).optional())
            .map_err(|error| SubjectsError::store("read a subject", error))
    }

    fn bump_generation(transaction: &rusqlite::Transaction<'_>) -> Result<i64, SubjectsError> {
        let current: Option<Vec<u8>> = transaction
            .query_row(
                "SELECT value FROM meta WHERE name = 'generation'",
                [],
                |row| row.get(0),
            )
            .optional()
            .map_err(|error| SubjectsError::store("read the key store's generation", error))?;
        let next = generation_of(current.as_deref()) + 1;
        transaction
            .execute(
                "INSERT INTO meta (name, value) VALUES ('generation', ?1) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                [next.to_string().into_bytes()],
            )
            .map_err(|error| SubjectsError::store("move the key store's generation on", error))?;
        Ok(next)
    }
}

impl KeyTable for SqliteTable {
    fn meta(&mut self, name: &str) -> Result<Option<Vec<u8>>, SubjectsError> {
        self.conn
            .query_row("SELECT value FROM meta WHERE name = ?1", [name], |row| {
                row.get(0)
            })
            .optional()
            .map_err(|error| SubjectsError::store("read the key store's header", error))
    }

    fn set_meta(&mut self, values: &[(&str, Vec<u8>)]) -> Result<(), SubjectsError> {
        let transaction = self
            .conn
            .transaction()
            .map_err(|error| SubjectsError::store("write the key store's header", error))?;
        for (name, value) in values {
            transaction
                .execute(
                    "INSERT INTO meta (name, value) VALUES (?1, ?2) ON CONFLICT (name) DO NOTHING",
                    params![name, value],
                )
                .map_err(|error| SubjectsError::store("write the key store's header", error))?;
        }
        transaction
            .commit()
            .map_err(|error| SubjectsError::store("write the key store's header", error))
    }

    fn row_by_tag(&mut self, tag: &[u8]) -> Result<Option<Row>, SubjectsError> {
        self.row_where("tag = ?1", &tag)
    }

    fn row_by_key(&mut self, key_id: &str) -> Result<Option<Row>, SubjectsError> {
        self.row_where("key_id = ?1", &key_id)
    }

    fn rows(&mut self) -> Result<Vec<Row>, SubjectsError> {
        let mut statement = self
            .conn
            .prepare(&format!(
                "SELECT {COLUMNS} FROM subjects ORDER BY created_at, key_id"
            ))
            .map_err(|error| SubjectsError::store("list subjects", error))?;
        let rows = statement
            .query_map([], row_of)
            .and_then(Iterator::collect)
            .map_err(|error| SubjectsError::store("list subjects", error))?;
        Ok(rows)
    }

    fn operations_of(&mut self, key_id: &str) -> Result<Vec<String>, SubjectsError> {
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT operation_id FROM subject_operations WHERE key_id = ?1 ORDER BY operation_id",
            )
            .map_err(|error| SubjectsError::store("list a subject's operations", error))?;
        let ids = statement
            .query_map([key_id], |row| row.get(0))
            .and_then(Iterator::collect)
            .map_err(|error| SubjectsError::store("list a subject's operations", error))?;
        Ok(ids)
    }

    fn write(&mut self, writes: &[Write]) -> Result<Vec<String>, SubjectsError> {
        let failed = |error| SubjectsError::store("write new data keys and links", error);
        // A new key is synced before anything sealed under it is appended. Links alone are
        // not: a sync per batch of them competed with the ledger's own syncs for the disk (one
        // every ~3 operations at concurrency 64, costing a third of the throughput), and what
        // they say is in the log already (each token names its key and operation). The next
        // key's sync, or a checkpoint, makes them durable too.
        let synchronous = if writes
            .iter()
            .any(|write| matches!(write, Write::Key { .. }))
        {
            "PRAGMA synchronous = FULL"
        } else {
            "PRAGMA synchronous = NORMAL"
        };
        self.conn.execute_batch(synchronous).map_err(failed)?;
        let transaction = self.conn.transaction().map_err(failed)?;
        let mut lost = Vec::new();
        {
            let mut key = transaction
                .prepare_cached("INSERT INTO subjects (key_id, tag, tenant, wrapped_key, sealed_name, created_at, last_recorded_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) ON CONFLICT (tag) DO NOTHING")
                .map_err(failed)?;
            let mut link = transaction
                .prepare_cached("INSERT OR IGNORE INTO subject_operations (key_id, operation_id) SELECT ?1, ?2 WHERE EXISTS (SELECT 1 FROM subjects WHERE key_id = ?1)")
                .map_err(failed)?;
            let mut recorded = transaction
                .prepare_cached("UPDATE subjects SET last_recorded_at = ?2 WHERE key_id = ?1 AND last_recorded_at < ?2")
                .map_err(failed)?;
            for write in writes {
                match write {
                    Write::Key {
                        key_id,
                        tag,
                        tenant,
                        wrapped_key,
                        sealed_name,
                        at,
                    } => key
                        .execute(params![key_id, tag, tenant, wrapped_key, sealed_name, at])
                        .map(|stored| {
                            if stored == 0 {
                                lost.push(key_id.clone());
                            }
                        }),
                    Write::Link {
                        key_id,
                        operation_id,
                        at,
                    } => link
                        .execute(params![key_id, operation_id])
                        .and_then(|_| recorded.execute(params![key_id, at]))
                        .map(drop),
                }
                .map_err(failed)?;
            }
        }
        let committed = transaction.commit().map_err(failed);
        // Every other write of the key store is synced.
        self.conn
            .execute_batch("PRAGMA synchronous = FULL")
            .map_err(failed)?;
        committed?;
        Ok(lost)
    }

    fn destroy(&mut self, key_id: &str, at: &str, by: &str) -> Result<i64, SubjectsError> {
        let failed = |error| SubjectsError::store("destroy a data key", error);
        let transaction = self.conn.transaction().map_err(failed)?;
        transaction
            .execute(
                "UPDATE subjects SET wrapped_key = NULL, sealed_name = NULL, erased_at = ?2, erased_by = ?3 WHERE key_id = ?1 AND erased_at IS NULL",
                params![key_id, at, by],
            )
            .map_err(failed)?;
        let generation = Self::bump_generation(&transaction)?;
        transaction.commit().map_err(failed)?;
        truncate_wal(&self.conn)?;
        Ok(generation)
    }

    fn rewrap(
        &mut self,
        keys: &[(String, Vec<u8>)],
        meta: &[(&str, Vec<u8>)],
    ) -> Result<i64, SubjectsError> {
        let transaction = self
            .conn
            .transaction()
            .map_err(|error| SubjectsError::store("begin the rotation", error))?;
        for (key_id, wrapped) in keys {
            transaction
                .execute(
                    "UPDATE subjects SET wrapped_key = ?2 WHERE key_id = ?1 AND erased_at IS NULL",
                    params![key_id, wrapped],
                )
                .map_err(|error| SubjectsError::store("re-wrap a data key", error))?;
        }
        write_meta(&transaction, meta)?;
        let generation = Self::bump_generation(&transaction)?;
        transaction
            .commit()
            .map_err(|error| SubjectsError::store("commit the rotation", error))?;
        truncate_wal(&self.conn)?;
        Ok(generation)
    }

    fn generation(&mut self) -> Result<i64, SubjectsError> {
        let version: i64 = self
            .conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut statement| statement.query_row([], |row| row.get(0)))
            .map_err(|error| SubjectsError::store("read the key store's version", error))?;
        if self.seen_version != Some(version) {
            self.generation = generation_of(self.meta("generation")?.as_deref());
            self.seen_version = Some(version);
        }
        Ok(self.generation)
    }

    fn describe(&self) -> String {
        self.path.clone().unwrap_or_else(|| "(memory)".to_owned())
    }
}

fn write_meta(conn: &Connection, values: &[(&str, Vec<u8>)]) -> Result<(), SubjectsError> {
    for (name, value) in values {
        conn.execute(
            "INSERT INTO meta (name, value) VALUES (?1, ?2) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            params![name, value],
        )
        .map_err(|error| SubjectsError::store("write the key store's header", error))?;
    }
    Ok(())
}

fn row_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        key_id: row.get(0)?,
        tag: row.get(1)?,
        tenant: row.get(2)?,
        wrapped_key: row.get(3)?,
        sealed_name: row.get(4)?,
        created_at: row.get(5)?,
        last_recorded_at: row.get(6)?,
        erased_at: row.get(7)?,
        erased_by: row.get(8)?,
    })
}

/// Checkpoints the write-ahead log into the database and truncates it to nothing, so the pages
/// a destroyed key was in are gone from the log too.
fn truncate_wal(conn: &Connection) -> Result<(), SubjectsError> {
    let (busy, _, _): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .map_err(|error| SubjectsError::store("checkpoint the key store's log", error))?;
    if busy != 0 {
        return Err(SubjectsError::Corrupt {
            what: "another process holds the key store open, so its write-ahead log could not be truncated; the key is destroyed in the database, run the erasure again once the other process has stopped".into(),
        });
    }
    Ok(())
}
