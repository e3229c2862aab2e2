//! The key table: where the key store keeps its rows, behind one trait so that the same key
//! store runs on a SQLite file beside a SQLite ledger and on a table beside a PostgreSQL one.
//!
//! A row per data subject and tenant holds the subject's data key wrapped by the
//! key-encryption key and the subject's name sealed under the data key; each operation is
//! linked to its subject (a row per link on PostgreSQL; the SQLite file packs a commit's links
//! in one row and indexes them before they are read). Destroying a key must leave no copy the table's own storage keeps.
//!
//! What must never happen: a data key or a subject's name stored in clear; a destroyed key
//! readable from anything the table wrote; a write reported durable that a crash could lose.

use crate::SubjectsError;

/// A subject's row, as the table keeps it.
#[derive(Clone, Debug)]
pub struct Row {
    /// The random id of the subject's data key.
    pub key_id: String,
    /// The subject's index tag (a keyed hash of tenant and name).
    pub tag: Vec<u8>,
    /// The tenant whose subject it is.
    pub tenant: String,
    /// The data key wrapped by the key-encryption key; `None` once destroyed.
    pub wrapped_key: Option<Vec<u8>>,
    /// The subject's name sealed under the data key; `None` once destroyed.
    pub sealed_name: Option<Vec<u8>>,
    /// When the key was made (RFC 3339).
    pub created_at: String,
    /// When an operation was last linked to it.
    pub last_recorded_at: String,
    /// When it was destroyed.
    pub erased_at: Option<String>,
    /// Who destroyed it.
    pub erased_by: Option<String>,
}

/// One write of a batch (see [`KeyTable::write`]).
#[derive(Clone, Debug)]
pub enum Write {
    /// A new subject's row.
    Key {
        /// The key's id.
        key_id: String,
        /// The subject's index tag (a keyed hash of tenant and name).
        tag: Vec<u8>,
        /// The tenant.
        tenant: String,
        /// The data key wrapped by the key-encryption key.
        wrapped_key: Vec<u8>,
        /// The subject's name sealed under the data key.
        sealed_name: Vec<u8>,
        /// When (RFC 3339).
        at: String,
    },
    /// An operation with values sealed under the key.
    Link {
        /// The key's id.
        key_id: String,
        /// The operation.
        operation_id: String,
        /// When (RFC 3339).
        at: String,
    },
}

/// Where the key store keeps its rows. Every method is one transaction; a write returns when
/// it is durable.
pub trait KeyTable: Send {
    /// A value of the store's header (`index_key`, `kek_id`, `generation`).
    fn meta(&mut self, name: &str) -> Result<Option<Vec<u8>>, SubjectsError>;

    /// Writes the values of the header that are not set yet, in one transaction; a value
    /// another process wrote first is kept (two instances starting on a new table at once).
    fn set_meta(&mut self, values: &[(&str, Vec<u8>)]) -> Result<(), SubjectsError>;

    /// The row whose tag is `tag`.
    fn row_by_tag(&mut self, tag: &[u8]) -> Result<Option<Row>, SubjectsError>;

    /// The row of key `key_id`.
    fn row_by_key(&mut self, key_id: &str) -> Result<Option<Row>, SubjectsError>;

    /// Every row, oldest first.
    fn rows(&mut self) -> Result<Vec<Row>, SubjectsError>;

    /// The operations linked to key `key_id`, in order.
    fn operations_of(&mut self, key_id: &str) -> Result<Vec<String>, SubjectsError>;

    /// New rows and links, in one transaction (a link written twice is kept once; a link
    /// moves its key's `last_recorded_at` on). New rows are durable when it returns; links
    /// alone may wait for the next durable commit (they repeat what the log holds: each token
    /// names its key and its operation). A new row whose tag is stored already (another
    /// process made the subject's key first) is not written, nor are its links: their key ids
    /// are returned.
    fn write(&mut self, writes: &[Write]) -> Result<Vec<String>, SubjectsError>;

    /// Destroys key `key_id`: its wrapped key and sealed name are gone, `erased_at` and
    /// `erased_by` are set and the generation moves on; when it returns, no copy of the key
    /// is left in anything the table's storage keeps for itself (a log, free pages). Returns
    /// the new generation.
    fn destroy(&mut self, key_id: &str, at: &str, by: &str) -> Result<i64, SubjectsError>;

    /// Replaces wrapped keys and header values in one transaction (a key-encryption key's
    /// rotation); the generation moves on. Returns the new generation.
    fn rewrap(
        &mut self,
        keys: &[(String, Vec<u8>)],
        meta: &[(&str, Vec<u8>)],
    ) -> Result<i64, SubjectsError>;

    /// The generation: moved on by every destruction and re-wrap, by any process. Asked often,
    /// so it should be cheap when nothing changed.
    fn generation(&mut self) -> Result<i64, SubjectsError>;

    /// Where the table is, for messages.
    fn describe(&self) -> String;
}

/// The generation as the header stores it: decimal digits.
pub fn generation_of(value: Option<&[u8]>) -> i64 {
    value
        .and_then(|bytes| std::str::from_utf8(bytes).ok())
        .and_then(|text| text.parse().ok())
        .unwrap_or(0)
}
