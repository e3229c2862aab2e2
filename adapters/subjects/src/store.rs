//! The key store: one row per data subject and tenant, holding the subject's data key wrapped
//! by the key-encryption key and the subject's name sealed under the data key itself.
//!
//! A SQLite file of its own beside the ledger (`<ledger>.keys`), never the ledger file: the
//! ledger is append-only and copied whole (backups, exports), and a copy of it must carry no key.
//! The file runs with `secure_delete`, so the bytes of a destroyed key are overwritten with
//! zeros in the database page, and every erasure ends with a WAL checkpoint that truncates the
//! write-ahead log, so no older copy of the page survives there either. Keys are written with
//! `synchronous=FULL`: a value sealed under a key that a power loss then forgot would be lost.
//!
//! What must never happen: a data key or a subject's name stored in clear; a key kept after its
//! subject was erased; a subject re-created under a fresh key after erasure (a new record for
//! an erased person is refused until the erasure is cleared by a person).

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

use crate::cipher::{Key, KEY_BYTES};
use crate::kek::Kek;
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

/// A subject's row, as the store keeps it.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub key_id: String,
    pub tenant: String,
    pub wrapped_key: Option<Vec<u8>>,
    pub sealed_name: Option<Vec<u8>>,
    pub created_at: String,
    pub last_recorded_at: String,
    pub erased_at: Option<String>,
    pub erased_by: Option<String>,
}

/// The key store's connection and the secrets it was opened with.
pub(crate) struct Store {
    pub conn: Connection,
    kek: Kek,
    /// The key of the subject index: subjects are found by a keyed hash of (tenant, name), so
    /// the file never holds a name in clear, and nobody without the key-encryption key can test
    /// a guessed name against it.
    index: Key,
}

impl Store {
    /// Opens (or creates) the key store at `path` (`None`: in memory) with `kek`.
    pub fn open(path: Option<&Path>, kek: Kek) -> Result<Self, SubjectsError> {
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
        let index = open_meta(&conn, &kek, path)?;
        Ok(Self { conn, kek, index })
    }

    /// The index tag of `subject` in `tenant`.
    pub fn tag(&self, tenant: &str, subject: &str) -> Vec<u8> {
        self.index
            .mac(&[
                b"opledger-subject-tag-v1",
                tenant.as_bytes(),
                subject.as_bytes(),
            ])
            .to_vec()
    }

    pub fn row_by_tag(&self, tag: &[u8]) -> Result<Option<Row>, SubjectsError> {
        self.row_where("tag = ?1", &[&tag])
    }

    pub fn row_by_key(&self, key_id: &str) -> Result<Option<Row>, SubjectsError> {
        self.row_where("key_id = ?1", &[&key_id])
    }

    fn row_where(
        &self,
        condition: &str,
        values: &[&dyn rusqlite::ToSql],
    ) -> Result<Option<Row>, SubjectsError> {
        self.conn
            .query_row(
                &format!("SELECT key_id, tenant, wrapped_key, sealed_name, created_at, last_recorded_at, erased_at, erased_by FROM subjects WHERE {condition}"),
                values,
                row_of,
            )
            .optional()
            .map_err(|error| SubjectsError::store("read a subject", error))
    }

    pub fn rows(&self) -> Result<Vec<Row>, SubjectsError> {
        let mut statement = self
            .conn
            .prepare("SELECT key_id, tenant, wrapped_key, sealed_name, created_at, last_recorded_at, erased_at, erased_by FROM subjects ORDER BY created_at, key_id")
            .map_err(|error| SubjectsError::store("list subjects", error))?;
        let rows = statement
            .query_map([], row_of)
            .and_then(Iterator::collect)
            .map_err(|error| SubjectsError::store("list subjects", error))?;
        Ok(rows)
    }

    /// A new subject's row with a fresh data key, durable before it is used.
    pub fn create(
        &self,
        tenant: &str,
        subject: &str,
        tag: &[u8],
        now: &str,
    ) -> Result<(String, Key), SubjectsError> {
        let key = Key::generate().map_err(SubjectsError::random)?;
        let key_id = uuid::Uuid::new_v4().simple().to_string();
        let wrapped = self.wrap(&key_id, &key)?;
        let sealed_name = key
            .derive("subject-name")
            .seal(subject.as_bytes(), name_aad(&key_id).as_bytes())
            .map_err(SubjectsError::random)?;
        self.conn
            .execute(
                "INSERT INTO subjects (key_id, tag, tenant, wrapped_key, sealed_name, created_at, last_recorded_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)",
                params![key_id, tag, tenant, wrapped, sealed_name, now],
            )
            .map_err(|error| SubjectsError::store("store a new data key", error))?;
        Ok((key_id, key))
    }

    pub fn wrap(&self, key_id: &str, key: &Key) -> Result<Vec<u8>, SubjectsError> {
        self.kek
            .key()
            .seal(key.bytes(), wrap_aad(key_id).as_bytes())
            .map_err(SubjectsError::random)
    }

    /// The data key of a live row.
    pub fn unwrap_key(&self, row: &Row) -> Option<Key> {
        let opened = self.kek.key().open(
            row.wrapped_key.as_deref()?,
            wrap_aad(&row.key_id).as_bytes(),
        )?;
        let bytes: [u8; KEY_BYTES] = opened.as_slice().try_into().ok()?;
        Some(Key::from_bytes(bytes))
    }

    /// The subject's name of a live row.
    pub fn name_of(&self, row: &Row, key: &Key) -> Option<String> {
        let opened = key.derive("subject-name").open(
            row.sealed_name.as_deref()?,
            name_aad(&row.key_id).as_bytes(),
        )?;
        String::from_utf8(opened.to_vec()).ok()
    }

    /// Every live data key and the index key wrapped again under `new`, in one transaction;
    /// the store is opened with `new` from then on.
    pub fn rotate(&mut self, new: Kek) -> Result<usize, SubjectsError> {
        let live: Vec<Row> = self
            .rows()?
            .into_iter()
            .filter(|row| row.wrapped_key.is_some())
            .collect();
        let mut rewrapped = Vec::with_capacity(live.len());
        for row in &live {
            let key = self.unwrap_key(row).ok_or_else(|| SubjectsError::Corrupt {
                what: format!(
                    "the data key {} does not open with the key-encryption key",
                    row.key_id
                ),
            })?;
            let wrapped = new
                .key()
                .seal(key.bytes(), wrap_aad(&row.key_id).as_bytes())
                .map_err(SubjectsError::random)?;
            rewrapped.push((row.key_id.clone(), wrapped));
        }
        let transaction = self
            .conn
            .transaction()
            .map_err(|error| SubjectsError::store("begin the rotation", error))?;
        for (key_id, wrapped) in &rewrapped {
            transaction
                .execute(
                    "UPDATE subjects SET wrapped_key = ?2 WHERE key_id = ?1",
                    params![key_id, wrapped],
                )
                .map_err(|error| SubjectsError::store("re-wrap a data key", error))?;
        }
        write_meta(&transaction, &new, &self.index)?;
        transaction
            .commit()
            .map_err(|error| SubjectsError::store("commit the rotation", error))?;
        self.kek = new;
        truncate_wal(&self.conn)?;
        Ok(rewrapped.len())
    }
}

fn row_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        key_id: row.get(0)?,
        tenant: row.get(1)?,
        wrapped_key: row.get(2)?,
        sealed_name: row.get(3)?,
        created_at: row.get(4)?,
        last_recorded_at: row.get(5)?,
        erased_at: row.get(6)?,
        erased_by: row.get(7)?,
    })
}

fn wrap_aad(key_id: &str) -> String {
    format!("opledger-data-key:v1:{key_id}")
}

fn name_aad(key_id: &str) -> String {
    format!("opledger-subject-name:v1:{key_id}")
}

/// Checkpoints the write-ahead log into the database and truncates it to nothing, so the pages
/// a destroyed key was in are gone from the log too.
pub(crate) fn truncate_wal(conn: &Connection) -> Result<(), SubjectsError> {
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

/// Reads the key store's check and index key with `kek`, writing them on first use; a key
/// store made with another key-encryption key is refused, naming both ids.
fn open_meta(conn: &Connection, kek: &Kek, path: Option<&Path>) -> Result<Key, SubjectsError> {
    let read = |name: &str| -> Result<Option<Vec<u8>>, SubjectsError> {
        conn.query_row("SELECT value FROM meta WHERE name = ?1", [name], |row| {
            row.get(0)
        })
        .optional()
        .map_err(|error| SubjectsError::store("read the key store's header", error))
    };
    let Some(wrapped_index) = read("index_key")? else {
        let index = Key::generate().map_err(SubjectsError::random)?;
        write_meta(conn, kek, &index)?;
        return Ok(index);
    };
    let stored_id = read("kek_id")?
        .and_then(|id| String::from_utf8(id).ok())
        .unwrap_or_default();
    let opened = kek
        .key()
        .open(&wrapped_index, b"opledger-index-key:v1")
        .and_then(|bytes| <[u8; KEY_BYTES]>::try_from(bytes.as_slice()).ok());
    match opened {
        Some(bytes) => Ok(Key::from_bytes(bytes)),
        None => Err(SubjectsError::WrongKek {
            path: path.map_or_else(|| "(memory)".to_owned(), |p| p.display().to_string()),
            given: kek.id(),
            stored: stored_id,
        }),
    }
}

fn write_meta(conn: &Connection, kek: &Kek, index: &Key) -> Result<(), SubjectsError> {
    let wrapped = kek
        .key()
        .seal(index.bytes(), b"opledger-index-key:v1")
        .map_err(SubjectsError::random)?;
    for (name, value) in [("index_key", wrapped), ("kek_id", kek.id().into_bytes())] {
        conn.execute(
            "INSERT INTO meta (name, value) VALUES (?1, ?2) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            params![name, value],
        )
        .map_err(|error| SubjectsError::store("write the key store's header", error))?;
    }
    Ok(())
}
