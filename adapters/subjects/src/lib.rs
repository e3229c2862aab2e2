//! opledger's personal data: each data subject's values sealed under a key of their own, so
//! that destroying the key erases the person from a log that is never rewritten (crypto-
//! shredding). The domain's [`opledger_domain::personal`] says what is sealed and when; this
//! crate holds the keys and the cipher.
//!
//! - [`cipher`]: XChaCha20-Poly1305 and HMAC-SHA-256 under 32-byte keys wiped on drop.
//! - [`kek`]: the key-encryption key from a file or an environment variable.
//! - [`table`]: where the rows are kept; `store` keeps them in a SQLite file beside the ledger
//!   (`<ledger>.keys`), the PostgreSQL store in a table beside its events.
//! - `writer`: new keys and links written in batches, one durable commit for many seals.
//! - [`Subjects`]: the domain's [`PersonalData`] port over them, and the operator's commands
//!   (erase, list, show, rotate the key-encryption key).
//!
//! A seal takes its subject's key from memory: the keys in use are kept unwrapped (at most
//! [`MAX_CACHED_KEYS`], wiped when dropped), and what a seal makes is queued for the writer.
//! Only a subject seen for the first time reads the table.
//!
//! What must never happen: a personal value, a subject's name or a data key written anywhere in
//! clear; a token opened for an operation other than its own; a key that survives its
//! subject's erasure in any file this crate wrote.

#![forbid(unsafe_code)]

pub mod cipher;
pub mod kek;
mod store;
pub mod table;
mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use opledger_domain::args::{ArgsHash, ArgsSnapshot};
use opledger_domain::ids::{OperationId, TenantId};
use opledger_domain::personal::{
    durable_now, token_parts, Durable, PersonalData, PersonalDataError, SEALED_PREFIX,
};

use cipher::{Key, KEY_BYTES};
pub use kek::{Kek, KekError};
use table::{KeyTable, Row, Write};
use writer::{lock, Batch, Table, Writer};

/// Why the key store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum SubjectsError {
    /// SQLite failed.
    #[error("the key store could not {action}: {reason}")]
    Store {
        /// What it was doing.
        action: &'static str,
        /// What SQLite said.
        reason: String,
    },
    /// The operating system gave no random bytes.
    #[error("no random bytes from the operating system: {0}")]
    Random(String),
    /// The key store was made with another key-encryption key.
    #[error("the key-encryption key given (id {given}) does not open the key store {path}, which was made with the key of id {stored}; start with that key (the same file or environment variable as before), or, to change keys, run `opledger subjects rotate-kek` with both")]
    WrongKek {
        /// The key store.
        path: String,
        /// The id of the key given.
        given: String,
        /// The id of the key the store was made with.
        stored: String,
    },
    /// Something in the store does not hold together.
    #[error("{what}")]
    Corrupt {
        /// What.
        what: String,
    },
    /// No subject of that name is known (in that tenant).
    #[error("no data subject of that name is known{}; nothing was erased (subjects are named exactly as they were recorded)", tenant.as_ref().map(|t| format!(" in tenant `{t}`")).unwrap_or_default())]
    Unknown {
        /// The tenant it was looked for in, if one was named.
        tenant: Option<String>,
    },
}

impl SubjectsError {
    fn store(action: &'static str, error: rusqlite::Error) -> Self {
        Self::Store {
            action,
            reason: error.to_string(),
        }
    }

    /// A key table's failure, from any backend.
    pub fn table(action: &'static str, reason: impl std::fmt::Display) -> Self {
        Self::Store {
            action,
            reason: reason.to_string(),
        }
    }

    fn random(error: getrandom::Error) -> Self {
        Self::Random(error.to_string())
    }
}

/// One subject as listed: never its data key, and its name only while it is not erased.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SubjectSummary {
    /// The random id of the subject's data key (not personal).
    pub key_id: String,
    /// The tenant whose data it is.
    pub tenant: String,
    /// The subject's name; `None` once erased.
    pub subject: Option<String>,
    /// When the key was made (RFC 3339).
    pub created_at: String,
    /// When an operation was last recorded under it.
    pub last_recorded_at: String,
    /// When it was erased.
    pub erased_at: Option<String>,
    /// Who erased it (the operator's name, or `retention`).
    pub erased_by: Option<String>,
    /// The operations recorded under it.
    pub operations: Vec<OperationId>,
}

/// What one erasure did to one tenant's subject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Erasure {
    /// The destroyed key's id.
    pub key_id: String,
    /// The tenant.
    pub tenant: String,
    /// The operations whose personal values are now unreadable.
    pub operations: Vec<OperationId>,
    /// When it had been erased already (this call changed nothing), if so.
    pub already_erased_at: Option<String>,
}

/// Most data keys kept unwrapped in memory. A key is a few hundred bytes with its entry, so the
/// cache stays within ~16 MB; when it is full, every key already stored is dropped (wiped) and
/// read again on its next use. Keys still being written are never dropped: the table does not
/// hold them yet.
pub const MAX_CACHED_KEYS: usize = 65_536;

/// How often, at most, a seal or an opening asks the key store whether another process (the
/// command line, another server on the same PostgreSQL) destroyed or re-wrapped keys, in
/// milliseconds. Asking costs a query; within this time a key erased elsewhere may still be
/// used here, which no caller can tell from a use that began just before the erasure.
pub const OTHERS_CHECK_EVERY_MS: u64 = 1;

/// A subject's data key, with the subkeys derived from it once.
struct SubjectKey {
    key_id: String,
    /// Seals and opens values.
    value: Key,
    /// Keys the argument hash.
    args_hash: Key,
}

impl SubjectKey {
    fn new(key_id: String, data_key: &Key) -> Arc<Self> {
        Arc::new(Self {
            key_id,
            value: data_key.derive("value"),
            args_hash: data_key.derive("args-hash"),
        })
    }
}

enum Cached {
    /// The key; with the batch it is being written in, when it is new.
    Live {
        key: Arc<SubjectKey>,
        batch: Option<Arc<Batch>>,
    },
    Erased,
}

impl Cached {
    /// Whether the table may not hold the key yet (or never will: its write failed). Such an
    /// entry is never dropped from the cache: a second key for the same subject would be made.
    fn unsettled(&self) -> bool {
        match self {
            Cached::Live {
                key,
                batch: Some(batch),
            } => !matches!(batch.stored(Some(&key.key_id)), Some(Ok(()))),
            _ => false,
        }
    }

    /// Whether its key was never stored: a seal makes a new one.
    fn lost(&self) -> bool {
        match self {
            Cached::Live {
                key,
                batch: Some(batch),
            } => matches!(batch.stored(Some(&key.key_id)), Some(Err(_))),
            _ => false,
        }
    }
}

#[derive(Default)]
struct Cache {
    by_tag: HashMap<Vec<u8>, Cached>,
    by_id: HashMap<String, Arc<SubjectKey>>,
    /// Moved on by every erasure and every drop of the cache: a key read from the table under
    /// an older epoch is not put in.
    epoch: u64,
    /// The table's generation the cache is good for.
    generation: i64,
}

impl Cache {
    fn insert(&mut self, tag: Vec<u8>, entry: Cached) {
        if self.by_tag.len() >= MAX_CACHED_KEYS || self.by_id.len() >= MAX_CACHED_KEYS {
            self.drop_settled();
        }
        if let Cached::Live { key, .. } = &entry {
            self.by_id.insert(key.key_id.clone(), Arc::clone(key));
        }
        self.by_tag.insert(tag, entry);
    }

    /// Drops every key the table holds (they are wiped when the last user lets go).
    fn drop_settled(&mut self) {
        self.by_tag.retain(|_, entry| entry.unsettled());
        let keep: std::collections::HashSet<String> = self
            .by_tag
            .values()
            .filter_map(|entry| match entry {
                Cached::Live { key, .. } => Some(key.key_id.clone()),
                Cached::Erased => None,
            })
            .collect();
        self.by_id.retain(|key_id, _| keep.contains(key_id));
        self.epoch += 1;
    }
}

/// The key store and cipher for personal data.
pub struct Subjects {
    cache: Mutex<Cache>,
    /// Each subject's index tag by tenant and name (at most [`MAX_CACHED_KEYS`] names).
    tags: Mutex<HashMap<String, HashMap<String, Vec<u8>>>>,
    /// Reads keys not in the cache (a connection of its own where the table allows, so a read
    /// never waits for the writer's commit).
    reader: Table,
    writer: Arc<Writer>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    kek: Mutex<Kek>,
    /// The key of the subject index: subjects are found by a keyed hash of (tenant, name), so
    /// the table never holds a name in clear, and nobody without the key-encryption key can test
    /// a guessed name against it.
    index: Key,
    path: Option<PathBuf>,
    /// Whether another process may change the table (a file, a database server).
    shared: bool,
    started: Instant,
    /// When others' changes were last asked for, in ms since `started`.
    others_checked_ms: AtomicU64,
    others_every: Duration,
}

impl std::fmt::Debug for Subjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subjects")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Drop for Subjects {
    fn drop(&mut self) {
        // What is queued is written before the thread ends; the table closes with it.
        self.writer.stop();
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

/// The key store's file beside a ledger file.
pub fn key_store_path(ledger: &Path) -> PathBuf {
    let mut name = ledger.as_os_str().to_owned();
    name.push(".keys");
    PathBuf::from(name)
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl Subjects {
    /// Opens the key store at `path` (`None`: in memory, for a memory ledger) with `kek`;
    /// refused with what to do when the store was made with another key.
    pub fn open(path: Option<&Path>, kek: Kek) -> Result<Self, SubjectsError> {
        let writer: Box<dyn KeyTable> = Box::new(store::SqliteTable::open(path)?);
        let reader: Option<Box<dyn KeyTable>> = match path {
            Some(path) => Some(Box::new(store::SqliteTable::open(Some(path))?)),
            // One database in memory is one connection's: the reader is the writer.
            None => None,
        };
        let mut subjects = Self::with_tables(writer, reader, kek)?;
        subjects.path = path.map(Path::to_path_buf);
        subjects.shared = path.is_some();
        Ok(subjects)
    }

    /// The key store over `writer` (and `reader` for the reads of keys not in memory, or the
    /// writer), with `kek`; refused with what to do when the table was made with another key.
    /// Another process may share the table: its erasures are seen within
    /// [`OTHERS_CHECK_EVERY_MS`].
    pub fn with_tables(
        mut writer: Box<dyn KeyTable>,
        reader: Option<Box<dyn KeyTable>>,
        kek: Kek,
    ) -> Result<Self, SubjectsError> {
        let index = open_meta(&mut *writer, &kek)?;
        let generation = writer.generation()?;
        let writer: Table = Arc::new(Mutex::new(writer));
        let reader = match reader {
            Some(reader) => Arc::new(Mutex::new(reader)),
            None => Arc::clone(&writer),
        };
        let (writer, thread) = Writer::start(writer).map_err(|error| SubjectsError::Store {
            action: "start its writer",
            reason: error.to_string(),
        })?;
        Ok(Self {
            cache: Mutex::new(Cache {
                generation,
                ..Cache::default()
            }),
            tags: Mutex::default(),
            reader,
            writer,
            thread: Mutex::new(Some(thread)),
            kek: Mutex::new(kek),
            index,
            path: None,
            shared: true,
            started: Instant::now(),
            others_checked_ms: AtomicU64::new(0),
            others_every: Duration::from_millis(OTHERS_CHECK_EVERY_MS),
        })
    }

    /// The key store's file, if it has one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Writes what the seals queued, now (the ledger waits for it through
    /// [`PersonalData::all_durable`] instead).
    pub fn flush(&self) -> Result<(), SubjectsError> {
        let mut table = lock(self.writer.table());
        self.writer.flush_locked(&mut **table);
        drop(table);
        match self.writer.last().stored(None) {
            Some(Err(error)) => Err(SubjectsError::Store {
                action: "write new data keys and links",
                reason: error.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// The index tag of `subject` in `tenant`: computed once per subject in use (a record asks
    /// for it once per sealed value and again for the key's durability, and an HMAC is four
    /// SHA-256 blocks on a machine without SHA instructions).
    fn tag(&self, tenant: &str, subject: &str) -> Vec<u8> {
        let mut tags = lock(&self.tags);
        if let Some(tag) = tags
            .get(tenant)
            .and_then(|of_tenant| of_tenant.get(subject))
        {
            return tag.clone();
        }
        let tag = self
            .index
            .mac(&[
                b"opledger-subject-tag-v1",
                tenant.as_bytes(),
                subject.as_bytes(),
            ])
            .to_vec();
        if tags.values().map(HashMap::len).sum::<usize>() >= MAX_CACHED_KEYS {
            tags.clear();
        }
        tags.entry(tenant.to_owned())
            .or_default()
            .insert(subject.to_owned(), tag.clone());
        tag
    }

    /// Forgets every subject's name held for its tag (an erasure leaves none in memory).
    fn forget_names(&self) {
        lock(&self.tags).clear();
    }

    /// Drops the cache when another process destroyed or re-wrapped keys since the last look
    /// (at most every [`OTHERS_CHECK_EVERY_MS`]).
    fn check_others(&self) {
        if !self.shared {
            return;
        }
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.others_checked_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < self.others_every.as_millis() as u64
            && last != 0
            && !self.others_every.is_zero()
        {
            return;
        }
        if self
            .others_checked_ms
            .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let generation = lock(&self.reader).generation();
        let mut cache = lock(&self.cache);
        match generation {
            Ok(generation) if generation == cache.generation => {}
            Ok(generation) => {
                cache.drop_settled();
                cache.generation = generation;
            }
            // Unsure: drop the keys, each is read again (and found erased or not).
            Err(_) => cache.drop_settled(),
        }
    }

    /// The live key of `subject` in `tenant` (made on first use, and queued to be written),
    /// with the batch it is written in while it is new.
    fn key_for(
        &self,
        tenant: &str,
        subject: &str,
    ) -> Result<(Arc<SubjectKey>, Option<Arc<Batch>>), PersonalDataError> {
        let tag = self.tag(tenant, subject);
        self.check_others();
        loop {
            let epoch = {
                let cache = lock(&self.cache);
                match cache.by_tag.get(&tag) {
                    Some(entry) if entry.lost() => cache.epoch,
                    Some(Cached::Live { key, batch }) => {
                        return Ok((Arc::clone(key), batch.clone()))
                    }
                    Some(Cached::Erased) => return Err(PersonalDataError::Erased),
                    None => cache.epoch,
                }
            };
            let row = lock(&self.reader).row_by_tag(&tag).map_err(key_store)?;
            let mut cache = lock(&self.cache);
            if cache.epoch != epoch {
                continue;
            }
            match cache.by_tag.get(&tag) {
                Some(entry) if entry.lost() => {}
                Some(Cached::Live { key, batch }) => return Ok((Arc::clone(key), batch.clone())),
                Some(Cached::Erased) => return Err(PersonalDataError::Erased),
                None => {}
            }
            return match row {
                Some(row) if row.erased_at.is_some() => {
                    cache.insert(tag, Cached::Erased);
                    Err(PersonalDataError::Erased)
                }
                Some(row) => {
                    let data_key = unwrap_key(&lock(&self.kek), &row).ok_or_else(|| {
                        key_store(SubjectsError::Corrupt {
                            what: format!(
                                "the data key {} does not open with the key-encryption key",
                                row.key_id
                            ),
                        })
                    })?;
                    let key = SubjectKey::new(row.key_id, &data_key);
                    cache.insert(
                        tag,
                        Cached::Live {
                            key: Arc::clone(&key),
                            batch: None,
                        },
                    );
                    Ok((key, None))
                }
                None => {
                    // Made and queued under the cache's lock: a second seal for the same new
                    // subject finds this key, never makes another.
                    let (write, key) = self.new_key(tenant, subject, &tag).map_err(key_store)?;
                    let batch = self.writer.push(write);
                    cache.insert(
                        tag,
                        Cached::Live {
                            key: Arc::clone(&key),
                            batch: batch.clone(),
                        },
                    );
                    Ok((key, batch))
                }
            };
        }
    }

    /// A fresh data key for `subject`, wrapped, with the subject's name sealed under it.
    fn new_key(
        &self,
        tenant: &str,
        subject: &str,
        tag: &[u8],
    ) -> Result<(Write, Arc<SubjectKey>), SubjectsError> {
        let data_key = Key::generate().map_err(SubjectsError::random)?;
        let key_id = uuid::Uuid::new_v4().simple().to_string();
        let wrapped_key = wrap_key(&lock(&self.kek), &key_id, &data_key)?;
        let sealed_name = data_key
            .derive("subject-name")
            .seal(subject.as_bytes(), name_aad(&key_id).as_bytes())
            .map_err(SubjectsError::random)?;
        let key = SubjectKey::new(key_id.clone(), &data_key);
        let write = Write::Key {
            key_id,
            tag: tag.to_vec(),
            tenant: tenant.to_owned(),
            wrapped_key,
            sealed_name,
            at: now(),
        };
        Ok((write, key))
    }

    /// The live key with this id, if it is not destroyed.
    fn key_by_id(&self, key_id: &str) -> Option<Arc<SubjectKey>> {
        self.check_others();
        loop {
            let epoch = {
                let cache = lock(&self.cache);
                if let Some(key) = cache.by_id.get(key_id) {
                    return Some(Arc::clone(key));
                }
                cache.epoch
            };
            let row = lock(&self.reader).row_by_key(key_id).ok()??;
            let data_key = unwrap_key(&lock(&self.kek), &row)?;
            let mut cache = lock(&self.cache);
            if cache.epoch != epoch {
                continue;
            }
            let key = SubjectKey::new(row.key_id, &data_key);
            cache.insert(
                row.tag,
                Cached::Live {
                    key: Arc::clone(&key),
                    batch: None,
                },
            );
            return Some(key);
        }
    }

    /// Destroys the data key of `subject` (in `tenant`, or in every tenant that has one), so
    /// nothing sealed under it can be read again, and truncates the key store's write-ahead log.
    /// A subject erased before is answered with when; an unknown one is refused.
    pub fn erase(
        &self,
        subject: &str,
        tenant: Option<&str>,
        by: &str,
    ) -> Result<Vec<Erasure>, SubjectsError> {
        let rows = self.rows()?;
        let tenants: std::collections::BTreeSet<String> = match tenant {
            Some(tenant) => [tenant.to_owned()].into(),
            None => rows.into_iter().map(|row| row.tenant).collect(),
        };
        let mut erased = Vec::new();
        for tenant in &tenants {
            let tag = self.tag(tenant, subject);
            let row = lock(self.writer.table()).row_by_tag(&tag)?;
            if let Some(row) = row {
                erased.push(self.erase_row(row, by)?);
            }
        }
        if erased.is_empty() {
            return Err(SubjectsError::Unknown {
                tenant: tenant.map(str::to_owned),
            });
        }
        Ok(erased)
    }

    /// Destroys the data key with this id (the retention worker's erasure).
    pub fn erase_key(&self, key_id: &str, by: &str) -> Result<Erasure, SubjectsError> {
        self.flush()?;
        let row = lock(self.writer.table())
            .row_by_key(key_id)?
            .ok_or(SubjectsError::Unknown { tenant: None })?;
        self.erase_row(row, by)
    }

    fn erase_row(&self, row: Row, by: &str) -> Result<Erasure, SubjectsError> {
        self.forget_names();
        // The cache forgets the key first: from here on no seal and no opening in this process
        // uses it, and a read of the table that began before is not put back (the epoch).
        {
            let mut cache = lock(&self.cache);
            cache.by_id.remove(&row.key_id);
            cache.by_tag.insert(row.tag.clone(), Cached::Erased);
            cache.epoch += 1;
        }
        let mut table = lock(self.writer.table());
        // Links queued for the subject's operations are written before they are read.
        self.writer.flush_locked(&mut **table);
        let operations = parse_operations(table.operations_of(&row.key_id)?);
        if let Some(at) = row.erased_at {
            return Ok(Erasure {
                key_id: row.key_id,
                tenant: row.tenant,
                operations,
                already_erased_at: Some(at),
            });
        }
        let generation = table.destroy(&row.key_id, &now(), by)?;
        drop(table);
        let mut cache = lock(&self.cache);
        // Forgotten again: a read that began after the first forgetting and before the
        // destruction found the key live and put it back, and this process's generation check
        // would never drop it (the generation is its own).
        cache.by_id.remove(&row.key_id);
        cache.by_tag.insert(row.tag.clone(), Cached::Erased);
        cache.epoch += 1;
        cache.generation = cache.generation.max(generation);
        drop(cache);
        tracing::info!(key_id = %row.key_id, tenant = %row.tenant, operations = operations.len(), "data subject erased: its key is destroyed");
        Ok(Erasure {
            key_id: row.key_id,
            tenant: row.tenant,
            operations,
            already_erased_at: None,
        })
    }

    /// Every row, once what is queued is written.
    fn rows(&self) -> Result<Vec<Row>, SubjectsError> {
        self.flush()?;
        lock(self.writer.table()).rows()
    }

    /// Every subject, oldest first: names only of those not erased.
    pub fn list(&self) -> Result<Vec<SubjectSummary>, SubjectsError> {
        let rows = self.rows()?;
        rows.into_iter().map(|row| self.summary(row)).collect()
    }

    /// The subject of this name (in every tenant that has it).
    pub fn show(&self, subject: &str) -> Result<Vec<SubjectSummary>, SubjectsError> {
        let tenants: std::collections::BTreeSet<String> =
            self.rows()?.into_iter().map(|row| row.tenant).collect();
        let mut found = Vec::new();
        for tenant in tenants {
            let row = lock(self.writer.table()).row_by_tag(&self.tag(&tenant, subject))?;
            if let Some(row) = row {
                found.push(self.summary(row)?);
            }
        }
        if found.is_empty() {
            return Err(SubjectsError::Unknown { tenant: None });
        }
        Ok(found)
    }

    fn summary(&self, row: Row) -> Result<SubjectSummary, SubjectsError> {
        let subject = unwrap_key(&lock(&self.kek), &row).and_then(|key| name_of(&row, &key));
        let operations = parse_operations(lock(self.writer.table()).operations_of(&row.key_id)?);
        Ok(SubjectSummary {
            key_id: row.key_id,
            tenant: row.tenant,
            subject,
            created_at: row.created_at,
            last_recorded_at: row.last_recorded_at,
            erased_at: row.erased_at,
            erased_by: row.erased_by,
            operations,
        })
    }

    /// Wraps every live data key again under `new`; from then on only `new` opens the store.
    pub fn rotate_kek(&self, new: Kek) -> Result<usize, SubjectsError> {
        let live: Vec<Row> = self
            .rows()?
            .into_iter()
            .filter(|row| row.wrapped_key.is_some())
            .collect();
        let mut kek = lock(&self.kek);
        let mut rewrapped = Vec::with_capacity(live.len());
        for row in &live {
            let key = unwrap_key(&kek, row).ok_or_else(|| SubjectsError::Corrupt {
                what: format!(
                    "the data key {} does not open with the key-encryption key",
                    row.key_id
                ),
            })?;
            rewrapped.push((row.key_id.clone(), wrap_key(&new, &row.key_id, &key)?));
        }
        let meta = meta_of(&new, &self.index)?;
        let meta: Vec<(&str, Vec<u8>)> = meta.iter().map(|(n, v)| (*n, v.clone())).collect();
        let generation = lock(self.writer.table()).rewrap(&rewrapped, &meta)?;
        *kek = new;
        drop(kek);
        let mut cache = lock(&self.cache);
        cache.generation = cache.generation.max(generation);
        Ok(rewrapped.len())
    }
}

fn parse_operations(ids: Vec<String>) -> Vec<OperationId> {
    ids.iter()
        .filter_map(|id| id.parse::<uuid::Uuid>().ok().map(OperationId::from_uuid))
        .collect()
}

fn wrap_aad(key_id: &str) -> String {
    format!("opledger-data-key:v1:{key_id}")
}

fn name_aad(key_id: &str) -> String {
    format!("opledger-subject-name:v1:{key_id}")
}

fn wrap_key(kek: &Kek, key_id: &str, key: &Key) -> Result<Vec<u8>, SubjectsError> {
    kek.key()
        .seal(key.bytes(), wrap_aad(key_id).as_bytes())
        .map_err(SubjectsError::random)
}

/// The data key of a live row.
fn unwrap_key(kek: &Kek, row: &Row) -> Option<Key> {
    let opened = kek.key().open(
        row.wrapped_key.as_deref()?,
        wrap_aad(&row.key_id).as_bytes(),
    )?;
    let bytes: [u8; KEY_BYTES] = opened.as_slice().try_into().ok()?;
    Some(Key::from_bytes(bytes))
}

/// The subject's name of a live row.
fn name_of(row: &Row, key: &Key) -> Option<String> {
    let opened = key.derive("subject-name").open(
        row.sealed_name.as_deref()?,
        name_aad(&row.key_id).as_bytes(),
    )?;
    String::from_utf8(opened.to_vec()).ok()
}

/// The header values: the index key wrapped by `kek`, and `kek`'s id.
fn meta_of(kek: &Kek, index: &Key) -> Result<[(&'static str, Vec<u8>); 2], SubjectsError> {
    let wrapped = kek
        .key()
        .seal(index.bytes(), b"opledger-index-key:v1")
        .map_err(SubjectsError::random)?;
    Ok([("index_key", wrapped), ("kek_id", kek.id().into_bytes())])
}

/// Reads the key store's index key with `kek`, writing it on first use; a key store made with
/// another key-encryption key is refused, naming both ids.
fn open_meta(table: &mut dyn KeyTable, kek: &Kek) -> Result<Key, SubjectsError> {
    if table.meta("index_key")?.is_none() {
        let index = Key::generate().map_err(SubjectsError::random)?;
        let meta = meta_of(kek, &index)?;
        let meta: Vec<(&str, Vec<u8>)> = meta.iter().map(|(n, v)| (*n, v.clone())).collect();
        table.set_meta(&meta)?;
    }
    // Read back, not the key just made: another instance starting on the same table at the
    // same moment may have written its index key first, and every instance must tag a subject
    // alike (else one subject would get two keys).
    let wrapped_index = table
        .meta("index_key")?
        .ok_or_else(|| SubjectsError::Corrupt {
            what: format!("{} has no index key after it was written", table.describe()),
        })?;
    let stored_id = table
        .meta("kek_id")?
        .and_then(|id| String::from_utf8(id).ok())
        .unwrap_or_default();
    let opened = kek
        .key()
        .open(&wrapped_index, b"opledger-index-key:v1")
        .and_then(|bytes| <[u8; KEY_BYTES]>::try_from(bytes.as_slice()).ok());
    match opened {
        Some(bytes) => Ok(Key::from_bytes(bytes)),
        None => Err(SubjectsError::WrongKek {
            path: table.describe(),
            given: kek.id(),
            stored: stored_id,
        }),
    }
}

fn key_store(error: SubjectsError) -> PersonalDataError {
    PersonalDataError::KeyStore(error.to_string())
}

fn value_aad(key_id: &str, operation: OperationId) -> String {
    format!("{SEALED_PREFIX}{key_id}:{operation}")
}

fn token(
    key: &Arc<SubjectKey>,
    operation: OperationId,
    value_json: &str,
) -> Result<String, PersonalDataError> {
    let aad = value_aad(&key.key_id, operation);
    let sealed = key
        .value
        .seal(value_json.as_bytes(), aad.as_bytes())
        .map_err(|error| key_store(SubjectsError::random(error)))?;
    Ok(format!(
        "{aad}:{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sealed)
    ))
}

fn keyed_hash(key: &Arc<SubjectKey>, args: &ArgsSnapshot) -> ArgsHash {
    ArgsHash::keyed(&key.args_hash.mac(&[args.canonical_json().as_bytes()]))
}

impl PersonalData for Subjects {
    fn seal(
        &self,
        tenant: &TenantId,
        subject: &str,
        operation: OperationId,
        value_json: &str,
    ) -> Result<String, PersonalDataError> {
        let (key, _) = self.key_for(tenant.as_str(), subject)?;
        self.writer.push(Write::Link {
            key_id: key.key_id.clone(),
            operation_id: operation.to_string(),
            at: now(),
        });
        token(&key, operation, value_json)
    }

    fn keyed_hash(
        &self,
        tenant: &TenantId,
        subject: &str,
        args: &ArgsSnapshot,
    ) -> Result<ArgsHash, PersonalDataError> {
        let (key, _) = self.key_for(tenant.as_str(), subject)?;
        Ok(keyed_hash(&key, args))
    }

    fn open(&self, operation: OperationId, token: &str) -> Option<String> {
        let (key_id, for_operation, sealed) = token_parts(token)?;
        if for_operation != operation.to_string() {
            return None;
        }
        let key = self.key_by_id(key_id)?;
        let sealed = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(sealed)
            .ok()?;
        let opened = key
            .value
            .open(&sealed, value_aad(key_id, operation).as_bytes())?;
        String::from_utf8(opened.to_vec()).ok()
    }

    fn seal_like(
        &self,
        token_in: &str,
        operation: OperationId,
        value_json: &str,
    ) -> Option<String> {
        let (key_id, _, _) = token_parts(token_in)?;
        let key = self.key_by_id(key_id)?;
        token(&key, operation, value_json).ok()
    }

    fn keyed_hash_like(&self, token_in: &str, args: &ArgsSnapshot) -> Option<ArgsHash> {
        let (key_id, _, _) = token_parts(token_in)?;
        Some(keyed_hash(&self.key_by_id(key_id)?, args))
    }

    fn key_durable(&self, tenant: &TenantId, subject: &str, sealed: Option<&str>) -> Durable<'_> {
        let tag = self.tag(tenant.as_str(), subject);
        let (key_id, batch) = match lock(&self.cache).by_tag.get(&tag) {
            Some(Cached::Live { key, batch }) => (key.key_id.clone(), batch.clone()),
            // Erased since: what was sealed is unreadable, never in clear.
            _ => return durable_now(),
        };
        if let Some((sealed_by, _, _)) = sealed.and_then(token_parts) {
            if sealed_by != key_id {
                // Its key was not stored (another server's won, or its write failed) and the
                // subject has another now: the values are sealed again under that one.
                return Box::pin(std::future::ready(Err(PersonalDataError::KeyReplaced)));
            }
        }
        match batch {
            None => durable_now(),
            Some(batch) => Box::pin(async move { batch.wait(Some(&key_id)).await }),
        }
    }

    fn all_durable(&self) -> Durable<'_> {
        let batch = self.writer.last();
        match batch.stored(None) {
            Some(Ok(())) => durable_now(),
            _ => Box::pin(async move { batch.wait(None).await }),
        }
    }
}

#[cfg(test)]
mod tests;

/// What erasing one key did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ErasureReport {
    /// The destroyed key's id.
    pub key_id: String,
    /// The tenant whose subject it was.
    pub tenant: String,
    /// How many operations had values sealed under it.
    pub operations: usize,
    /// The open operations sent to a person.
    pub sent_to_review: Vec<OperationId>,
    /// When it had been erased already (this run only completed what was left), if so.
    pub already_erased_at: Option<String>,
    /// Whether this run appended the `SubjectErased` event (`false`: it was there).
    pub recorded: bool,
}

/// Why an erasure stopped.
#[derive(Debug, thiserror::Error)]
pub enum EraseError {
    /// The key store failed.
    #[error(transparent)]
    Subjects(#[from] SubjectsError),
    /// The ledger failed.
    #[error("the ledger failed while recording the erasure: {0}")]
    Store(#[from] opledger_domain::store::StoreError),
}

/// Erases one subject's key, in the order that leaves nothing half-done for good: the
/// `SubjectErased` event is appended first (the log says so even if the process dies next), the
/// subject's open operations are sent to a person (their review reason is stored in clear: it
/// holds nothing personal), then the key is destroyed. Run again after a crash, it completes
/// what was left and records nothing twice.
pub async fn erase_key<S, C, I>(
    ledger: &opledger_domain::app::Ledger<S, C, I>,
    subjects: &Subjects,
    key_id: &str,
    by: opledger_domain::event::Principal,
    reason: &str,
) -> Result<ErasureReport, EraseError>
where
    S: opledger_domain::store::EventStore,
    C: opledger_domain::ports::Clock,
    I: opledger_domain::ports::IdSource,
{
    use opledger_domain::personal::{SubjectErased, ERASED_REASON};
    use opledger_domain::store::{ExpectedVersion, StoreError};
    let summary = subjects
        .list()?
        .into_iter()
        .find(|summary| summary.key_id == key_id)
        .ok_or(SubjectsError::Unknown { tenant: None })?;
    let tenant = TenantId::new(summary.tenant.clone()).map_err(|error| SubjectsError::Corrupt {
        what: format!("the key store names tenant `{}`: {error}", summary.tenant),
    })?;
    let event = SubjectErased {
        key_id: key_id.to_owned(),
        tenant,
        erased_by: by.clone(),
        reason: reason.to_owned(),
        operations: summary.operations.len() as u64,
        at: ledger.clock().now(),
    };
    let stream = SubjectErased::stream(key_id)?;
    // Erased already: the event is in the log. A run that stopped between the event and the
    // key appends the same event again, which the store recognises by its id.
    let recorded = summary.erased_at.is_none()
        && match ledger
            .store()
            .append(&stream, ExpectedVersion::NoStream, vec![event.encode()])
            .await
        {
            Ok(_) => true,
            Err(StoreError::VersionConflict { .. }) => false,
            Err(error) => return Err(error.into()),
        };
    let mut sent_to_review = Vec::new();
    if summary.erased_at.is_none() {
        let command = opledger_domain::command::Command::RequireReview {
            reason: ERASED_REASON.to_owned(),
            evidence: String::new(),
        };
        for operation in &summary.operations {
            // Settled operations refuse it, and one in flight meets the engine's guard at its
            // next step: neither is an error of the erasure.
            match ledger.execute(*operation, &command).await {
                Ok(_) => sent_to_review.push(*operation),
                Err(error) => tracing::debug!(%operation, %error, "not sent to review at erasure"),
            }
        }
    }
    let erasure = subjects.erase_key(key_id, &format!("{}:{}", by.kind.as_str(), by.name))?;
    Ok(ErasureReport {
        key_id: erasure.key_id,
        tenant: erasure.tenant,
        operations: erasure.operations.len(),
        sent_to_review,
        already_erased_at: erasure.already_erased_at,
        recorded,
    })
}
