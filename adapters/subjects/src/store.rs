//! The key table on SQLite: a file of its own beside the ledger (`<ledger>.keys`), never the
//! ledger file: the ledger is append-only and copied whole (backups, exports), and a copy of it
//! must carry no key. The file runs with `secure_delete`, so the bytes of a destroyed key are
//! overwritten with zeros in the database page, and every destruction ends with a WAL
//! checkpoint that truncates the write-ahead log, so no older copy of the page survives there
//! either. Writes are `synchronous=FULL`: a value sealed under a key that a power loss then
//! forgot would be lost.
//!
//! The links of operations to their subjects arrive one per sealed operation, thousands a
//! second. Each commit of the writer keeps its links as one row (`subject_link_runs`: the
//! pairs packed in a blob), appended at the table's end; they are folded into the indexed
//! `subject_operations` (sorted, in one transaction) before anything reads them and whenever
//! [`FOLD_AFTER_LINKS`] are waiting. A row per link written as it came cost a scattered index
//! insert, an update of the subject's row and a foreign-key check per sealed operation.

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
CREATE TABLE IF NOT EXISTS subject_link_runs (
    run   INTEGER PRIMARY KEY,
    at    TEXT NOT NULL,
    links BLOB NOT NULL CHECK (length(links) % 32 = 0)
) STRICT;
";

/// Most links kept in runs before the writer folds them into `subject_operations`: bounds the
/// fold a read waits for (~65,536 sorted inserts) and the runs' size (2 MiB).
pub const FOLD_AFTER_LINKS: usize = 65_536;

/// Bytes of one packed link: the key id's 16 bytes, then the operation id's.
const LINK_BYTES: usize = 32;

const COLUMNS: &str = "key_id, tag, tenant, wrapped_key, sealed_name, created_at, last_recorded_at, erased_at, erased_by";

/// A connection to the key store's SQLite file (or to a database in memory).
pub(crate) struct SqliteTable {
    conn: Connection,
    path: Option<String>,
    /// `PRAGMA data_version` when the generation was last read: unchanged, nobody committed.
    seen_version: Option<i64>,
    generation: i64,
    /// Whether the connection runs `synchronous = FULL` now (`NORMAL` while it writes links
    /// alone).
    synchronous_full: bool,
    /// Links written in runs and not folded yet (counted since the file was opened, which
    /// folds what an earlier process left).
    unfolded_links: usize,
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
        let mut table = Self {
            conn,
            path: path.map(|path| path.display().to_string()),
            seen_version: None,
            generation: 0,
            synchronous_full: true,
            unfolded_links: 0,
        };
        table.fold()?;
        Ok(table)
    }

    /// Sets `synchronous` to FULL or NORMAL, if it is not already.
    fn set_synchronous(&mut self, full: bool) -> Result<(), SubjectsError> {
        if self.synchronous_full != full {
            let pragma = if full {
                "PRAGMA synchronous = FULL"
            } else {
                "PRAGMA synchronous = NORMAL"
            };
            self.conn
                .execute_batch(pragma)
                .map_err(|error| SubjectsError::store("set how the key store syncs", error))?;
            self.synchronous_full = full;
        }
        Ok(())
    }

    /// Folds every run of links into `subject_operations` (sorted, duplicates once, links of
    /// keys the table does not hold dropped: another process made that subject's key first)
    /// and moves each subject's `last_recorded_at` on, in one transaction.
    fn fold(&mut self) -> Result<(), SubjectsError> {
        let failed =
            |error| SubjectsError::store("fold the links of operations to subjects", error);
        // Asked first with a read: a listing folds once per subject, nearly always with nothing
        // to fold, and should not take the write lock each time.
        let waiting: bool = self
            .conn
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM subject_link_runs)")
            .and_then(|mut statement| statement.query_row([], |row| row.get(0)))
            .map_err(failed)?;
        if !waiting {
            self.unfolded_links = 0;
            return Ok(());
        }
        self.set_synchronous(true)?;
        // Immediate: the write lock is taken before the runs are read, so a run another
        // process (a server beside this command) appends meanwhile waits for the fold, and is
        // never deleted unread.
        let transaction = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(failed)?;
        let mut links: Vec<([u8; 16], [u8; 16])> = Vec::new();
        let mut latest: std::collections::HashMap<[u8; 16], String> =
            std::collections::HashMap::new();
        {
            let mut runs = transaction
                .prepare_cached("SELECT at, links FROM subject_link_runs ORDER BY run")
                .map_err(failed)?;
            let mut rows = runs.query([]).map_err(failed)?;
            while let Some(row) = rows.next().map_err(failed)? {
                let at: String = row.get(0).map_err(failed)?;
                let packed: Vec<u8> = row.get(1).map_err(failed)?;
                for link in packed.chunks_exact(LINK_BYTES) {
                    let (key, operation) = link.split_at(16);
                    let key: [u8; 16] = key.try_into().expect("a link's key is 16 bytes");
                    let operation: [u8; 16] = operation
                        .try_into()
                        .expect("a link's operation is 16 bytes");
                    links.push((key, operation));
                    let newest = latest.entry(key).or_default();
                    if *newest < at {
                        newest.clone_from(&at);
                    }
                }
            }
        }
        if links.is_empty() {
            self.unfolded_links = 0;
            return Ok(());
        }
        links.sort_unstable();
        links.dedup();
        {
            let mut link = transaction
                .prepare_cached("INSERT OR IGNORE INTO subject_operations (key_id, operation_id) SELECT ?1, ?2 WHERE EXISTS (SELECT 1 FROM subjects WHERE key_id = ?1)")
                .map_err(failed)?;
            for (key, operation) in &links {
                let key_id = uuid::Uuid::from_bytes(*key).simple().to_string();
                let operation_id = uuid::Uuid::from_bytes(*operation).to_string();
                link.execute(params![key_id, operation_id])
                    .map_err(failed)?;
            }
            let mut recorded = transaction
                .prepare_cached("UPDATE subjects SET last_recorded_at = ?2 WHERE key_id = ?1 AND last_recorded_at < ?2")
                .map_err(failed)?;
            for (key, at) in &latest {
                let key_id = uuid::Uuid::from_bytes(*key).simple().to_string();
                recorded.execute(params![key_id, at]).map_err(failed)?;
            }
        }
        transaction
            .execute("DELETE FROM subject_link_runs", [])
            .map_err(failed)?;
        transaction.commit().map_err(failed)?;
        self.unfolded_links = 0;
        Ok(())
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
        self.set_synchronous(true)?;
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
        // Each row's `last_recorded_at` counts every link written.
        self.fold()?;
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
        self.fold()?;
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
        let has_key = writes
            .iter()
            .any(|write| matches!(write, Write::Key { .. }));
        self.set_synchronous(has_key)?;
        let mut packed = Vec::new();
        let mut latest = "";
        for write in writes {
            if let Write::Link {
                key_id,
                operation_id,
                at,
            } = write
            {
                packed.extend_from_slice(uuid_bytes(key_id, "a data key's id")?.as_slice());
                packed.extend_from_slice(uuid_bytes(operation_id, "an operation id")?.as_slice());
                latest = latest.max(at.as_str());
            }
        }
        let transaction = self.conn.transaction().map_err(failed)?;
        let mut lost = Vec::new();
        {
            let mut key = transaction
                .prepare_cached("INSERT INTO subjects (key_id, tag, tenant, wrapped_key, sealed_name, created_at, last_recorded_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) ON CONFLICT (tag) DO NOTHING")
                .map_err(failed)?;
            for write in writes {
                if let Write::Key {
                    key_id,
                    tag,
                    tenant,
                    wrapped_key,
                    sealed_name,
                    at,
                } = write
                {
                    let stored = key
                        .execute(params![key_id, tag, tenant, wrapped_key, sealed_name, at])
                        .map_err(failed)?;
                    if stored == 0 {
                        lost.push(key_id.clone());
                    }
                }
            }
            if !packed.is_empty() {
                transaction
                    .prepare_cached("INSERT INTO subject_link_runs (at, links) VALUES (?1, ?2)")
                    .and_then(|mut run| run.execute(params![latest, packed]))
                    .map_err(failed)?;
            }
        }
        transaction.commit().map_err(failed)?;
        self.unfolded_links += packed.len() / LINK_BYTES;
        if self.unfolded_links >= FOLD_AFTER_LINKS {
            // Folded here, on the writer's thread, so no read waits for many runs.
            self.fold()?;
        }
        Ok(lost)
    }

    fn destroy(&mut self, key_id: &str, at: &str, by: &str) -> Result<i64, SubjectsError> {
        let failed = |error| SubjectsError::store("destroy a data key", error);
        self.set_synchronous(true)?;
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
        self.set_synchronous(true)?;
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

/// The 16 bytes of a UUID written as text (an operation id, or a key id without hyphens).
fn uuid_bytes(text: &str, what: &str) -> Result<[u8; 16], SubjectsError> {
    uuid::Uuid::parse_str(text)
        .map(|id| id.into_bytes())
        .map_err(|error| SubjectsError::Corrupt {
            what: format!("{what} to link is not a UUID ({text}): {error}"),
        })
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
