//! opledger's personal data: each data subject's values sealed under a key of their own, so
//! that destroying the key erases the person from a log that is never rewritten (crypto-
//! shredding). The domain's [`opledger_domain::personal`] says what is sealed and when; this
//! crate holds the keys and the cipher.
//!
//! - [`cipher`]: XChaCha20-Poly1305 and HMAC-SHA-256 under 32-byte keys wiped on drop.
//! - [`kek`]: the key-encryption key from a file or an environment variable.
//! - `store`: the key store, a SQLite file beside the ledger (`<ledger>.keys`).
//! - [`Subjects`]: the domain's [`PersonalData`] port over them, and the operator's commands
//!   (erase, list, show, rotate the key-encryption key).
//!
//! What must never happen: a personal value, a subject's name or a data key written anywhere in
//! clear; a token opened for an operation other than its own; a key that survives its
//! subject's erasure in any file this crate wrote.

#![forbid(unsafe_code)]

pub mod cipher;
pub mod kek;
mod store;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use base64::Engine as _;
use opledger_domain::args::{ArgsHash, ArgsSnapshot};
use opledger_domain::ids::{OperationId, TenantId};
use opledger_domain::personal::{token_parts, PersonalData, PersonalDataError, SEALED_PREFIX};
use rusqlite::params;

use cipher::Key;
pub use kek::{Kek, KekError};
use store::{Row, Store};

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

struct Inner {
    store: Store,
    /// Data keys in use, by key id: opening a value must not cost a key unwrap.
    cache: HashMap<String, Key>,
    /// SQLite's `data_version` when the cache was last known good: another process's commit
    /// (an erasure by the command line while the server runs) changes it, and the cache is
    /// dropped before the next use.
    data_version: i64,
    /// Operations already linked to their subject in this process, so a record with several
    /// personal values writes the link once.
    linked: std::collections::HashSet<(String, OperationId)>,
}

/// The key store and cipher for personal data.
pub struct Subjects {
    inner: Mutex<Inner>,
    path: Option<PathBuf>,
}

impl std::fmt::Debug for Subjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subjects")
            .field("path", &self.path)
            .finish_non_exhaustive()
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
        let store = Store::open(path, kek)?;
        let data_version = data_version(&store.conn)?;
        Ok(Self {
            inner: Mutex::new(Inner {
                store,
                cache: HashMap::new(),
                data_version,
                linked: Default::default(),
            }),
            path: path.map(Path::to_path_buf),
        })
    }

    /// The key store's file, if it has one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Another process may have erased a subject: its keys must not be used from the cache.
        match data_version(&inner.store.conn) {
            Ok(version) if version == inner.data_version => {}
            Ok(version) => {
                inner.cache.clear();
                inner.data_version = version;
            }
            Err(_) => inner.cache.clear(),
        }
        inner
    }

    /// The live key of `subject` in `tenant`, made on first use.
    fn key_for(&self, tenant: &str, subject: &str) -> Result<(String, Key), PersonalDataError> {
        let mut inner = self.inner();
        let tag = inner.store.tag(tenant, subject);
        let row = inner.store.row_by_tag(&tag).map_err(key_store)?;
        let (key_id, key) = match row {
            Some(row) if row.erased_at.is_some() => return Err(PersonalDataError::Erased),
            Some(row) => {
                let key = match inner.cache.get(&row.key_id) {
                    Some(key) => key.clone(),
                    None => inner.store.unwrap_key(&row).ok_or_else(|| {
                        key_store(SubjectsError::Corrupt {
                            what: format!(
                                "the data key {} does not open with the key-encryption key",
                                row.key_id
                            ),
                        })
                    })?,
                };
                (row.key_id, key)
            }
            None => inner
                .store
                .create(tenant, subject, &tag, &now())
                .map_err(key_store)?,
        };
        inner.cache.insert(key_id.clone(), key.clone());
        Ok((key_id, key))
    }

    /// The live key with this id, if it is not destroyed.
    fn key_by_id(&self, key_id: &str) -> Option<Key> {
        let mut inner = self.inner();
        if let Some(key) = inner.cache.get(key_id) {
            return Some(key.clone());
        }
        let row = inner.store.row_by_key(key_id).ok()??;
        let key = inner.store.unwrap_key(&row)?;
        inner.cache.insert(key_id.to_owned(), key.clone());
        Some(key)
    }

    fn link(&self, key_id: &str, operation: OperationId) -> Result<(), PersonalDataError> {
        let mut inner = self.inner();
        if !inner.linked.insert((key_id.to_owned(), operation)) {
            return Ok(());
        }
        // The link only routes the subject's open operations to a person at erasure: losing
        // the newest links in a power cut loses no data (the key alone seals it), so they are
        // written without a sync of their own.
        inner
            .store
            .conn
            .execute_batch("PRAGMA synchronous = NORMAL")
            .and_then(|()| {
                inner.store.conn.execute(
                    "INSERT OR IGNORE INTO subject_operations (key_id, operation_id) VALUES (?1, ?2)",
                    params![key_id, operation.to_string()],
                )
            })
            .and_then(|_| {
                inner.store.conn.execute(
                    "UPDATE subjects SET last_recorded_at = ?2 WHERE key_id = ?1",
                    params![key_id, now()],
                )
            })
            .and_then(|_| inner.store.conn.execute_batch("PRAGMA synchronous = FULL"))
            .map_err(|error| key_store(SubjectsError::store("link an operation to its subject", error)))?;
        // The process's own commit changed data_version too: the cache stays good.
        inner.data_version = data_version(&inner.store.conn).map_err(key_store)?;
        Ok(())
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
        let tenants: Vec<String> = {
            let inner = self.inner();
            match tenant {
                Some(tenant) => vec![tenant.to_owned()],
                None => inner
                    .store
                    .rows()?
                    .into_iter()
                    .map(|row| row.tenant)
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect(),
            }
        };
        let mut erased = Vec::new();
        for tenant in &tenants {
            let row = {
                let inner = self.inner();
                let tag = inner.store.tag(tenant, subject);
                inner.store.row_by_tag(&tag)?
            };
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
        let row = self
            .inner()
            .store
            .row_by_key(key_id)?
            .ok_or(SubjectsError::Unknown { tenant: None })?;
        self.erase_row(row, by)
    }

    fn erase_row(&self, row: Row, by: &str) -> Result<Erasure, SubjectsError> {
        let mut inner = self.inner();
        let operations = operations_of(&inner.store, &row.key_id)?;
        if let Some(at) = row.erased_at {
            return Ok(Erasure {
                key_id: row.key_id,
                tenant: row.tenant,
                operations,
                already_erased_at: Some(at),
            });
        }
        inner
            .store
            .conn
            .execute(
                "UPDATE subjects SET wrapped_key = NULL, sealed_name = NULL, erased_at = ?2, erased_by = ?3 WHERE key_id = ?1",
                params![row.key_id, now(), by],
            )
            .map_err(|error| SubjectsError::store("destroy a data key", error))?;
        inner.cache.remove(&row.key_id);
        store::truncate_wal(&inner.store.conn)?;
        inner.data_version = data_version(&inner.store.conn)?;
        tracing::info!(key_id = %row.key_id, tenant = %row.tenant, operations = operations.len(), "data subject erased: its key is destroyed");
        Ok(Erasure {
            key_id: row.key_id,
            tenant: row.tenant,
            operations,
            already_erased_at: None,
        })
    }

    /// Every subject, oldest first: names only of those not erased.
    pub fn list(&self) -> Result<Vec<SubjectSummary>, SubjectsError> {
        let inner = self.inner();
        inner
            .store
            .rows()?
            .into_iter()
            .map(|row| summary(&inner.store, row))
            .collect()
    }

    /// The subject of this name (in every tenant that has it).
    pub fn show(&self, subject: &str) -> Result<Vec<SubjectSummary>, SubjectsError> {
        let inner = self.inner();
        let tenants: std::collections::BTreeSet<String> = inner
            .store
            .rows()?
            .into_iter()
            .map(|row| row.tenant)
            .collect();
        let mut found = Vec::new();
        for tenant in tenants {
            if let Some(row) = inner.store.row_by_tag(&inner.store.tag(&tenant, subject))? {
                found.push(summary(&inner.store, row)?);
            }
        }
        if found.is_empty() {
            return Err(SubjectsError::Unknown { tenant: None });
        }
        Ok(found)
    }

    /// Wraps every live data key again under `new`; from then on only `new` opens the store.
    pub fn rotate_kek(&self, new: Kek) -> Result<usize, SubjectsError> {
        let mut inner = self.inner();
        let count = inner.store.rotate(new)?;
        inner.data_version = data_version(&inner.store.conn)?;
        Ok(count)
    }
}

fn summary(store: &Store, row: Row) -> Result<SubjectSummary, SubjectsError> {
    let subject = store
        .unwrap_key(&row)
        .and_then(|key| store.name_of(&row, &key));
    let operations = operations_of(store, &row.key_id)?;
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

fn operations_of(store: &Store, key_id: &str) -> Result<Vec<OperationId>, SubjectsError> {
    let mut statement = store
        .conn
        .prepare_cached(
            "SELECT operation_id FROM subject_operations WHERE key_id = ?1 ORDER BY operation_id",
        )
        .map_err(|error| SubjectsError::store("list a subject's operations", error))?;
    let ids: Vec<String> = statement
        .query_map([key_id], |row| row.get(0))
        .and_then(Iterator::collect)
        .map_err(|error| SubjectsError::store("list a subject's operations", error))?;
    Ok(ids
        .iter()
        .filter_map(|id| id.parse::<uuid::Uuid>().ok().map(OperationId::from_uuid))
        .collect())
}

fn data_version(conn: &rusqlite::Connection) -> Result<i64, SubjectsError> {
    conn.query_row("PRAGMA data_version", [], |row| row.get(0))
        .map_err(|error| SubjectsError::store("read the key store's version", error))
}

fn key_store(error: SubjectsError) -> PersonalDataError {
    PersonalDataError::KeyStore(error.to_string())
}

fn value_aad(key_id: &str, operation: OperationId) -> String {
    format!("{SEALED_PREFIX}{key_id}:{operation}")
}

fn token(
    key_id: &str,
    operation: OperationId,
    key: &Key,
    value_json: &str,
) -> Result<String, PersonalDataError> {
    let aad = value_aad(key_id, operation);
    let sealed = key
        .derive("value")
        .seal(value_json.as_bytes(), aad.as_bytes())
        .map_err(|error| key_store(SubjectsError::random(error)))?;
    Ok(format!(
        "{aad}:{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sealed)
    ))
}

fn keyed_hash(key: &Key, args: &ArgsSnapshot) -> ArgsHash {
    ArgsHash::keyed(
        &key.derive("args-hash")
            .mac(&[args.canonical_json().as_bytes()]),
    )
}

impl PersonalData for Subjects {
    fn seal(
        &self,
        tenant: &TenantId,
        subject: &str,
        operation: OperationId,
        value_json: &str,
    ) -> Result<String, PersonalDataError> {
        let (key_id, key) = self.key_for(tenant.as_str(), subject)?;
        self.link(&key_id, operation)?;
        token(&key_id, operation, &key, value_json)
    }

    fn keyed_hash(
        &self,
        tenant: &TenantId,
        subject: &str,
        args: &ArgsSnapshot,
    ) -> Result<ArgsHash, PersonalDataError> {
        let (_, key) = self.key_for(tenant.as_str(), subject)?;
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
            .derive("value")
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
        token(key_id, operation, &key, value_json).ok()
    }

    fn keyed_hash_like(&self, token_in: &str, args: &ArgsSnapshot) -> Option<ArgsHash> {
        let (key_id, _, _) = token_parts(token_in)?;
        Some(keyed_hash(&self.key_by_id(key_id)?, args))
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
