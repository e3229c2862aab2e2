//! Claims on review items: an operator says "I am working this one" so that two people do not
//! investigate and decide the same case. A claim has a lease and ends by itself when it runs out.
//!
//! A claim is a row beside the ledger, not an event in it. The log holds facts about operations
//! (the decision, with who made it, is one); a claim is a lease on the work of deciding, taken,
//! renewed and let go many times, and an event for it would bump the operation's version and so
//! make the holder's own decision stale. So claims live where every instance on the ledger sees
//! them and a restart keeps them: in the shared PostgreSQL database (`opledger.review_claims`), or
//! in a SQLite file beside the SQLite ledger (`ledger.db.claims`, shared by the processes on that
//! file). On KurrentDB, whose instances share nothing but the log, the file is beside the
//! instance's read models, so a claim is that instance's alone there; the version check on every
//! decision still refuses the second of two decisions on every store.
//!
//! What a claim must never do is stop a decision by the person holding it, be granted while
//! another holder's runs, or outlive its lease.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Duration, TimeZone as _, Utc};
use opledger_domain::ids::OperationId;
use opledger_domain::store::StoreError;
use opledger_store::postgres::{ClaimAsk, ClaimRow, ReviewClaims};
use rusqlite::{params, Connection, OptionalExtension as _};

/// The lease of a claim when the claimant names none: long enough to investigate one case.
pub const DEFAULT_CLAIM_LEASE_S: u64 = 15 * 60;
/// The longest lease a claim may ask for; renew (claim again) to keep it longer.
pub const MAX_CLAIM_LEASE_S: u64 = 60 * 60;
/// The most claims running at once; past it a new claim is refused until leases run out (the
/// ended ones are swept first). An incident of 10,000 items claimed one by one stays within it.
pub const MAX_CLAIMS: usize = 100_000;
const _: () = assert!(DEFAULT_CLAIM_LEASE_S <= MAX_CLAIM_LEASE_S);
const _: () = assert!(MAX_CLAIM_LEASE_S <= u32::MAX as u64);

/// Who holds an item and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The operator's name (as configured under `[[operators]]`).
    pub holder: String,
    /// When the claim ends by itself.
    pub expires_at: DateTime<Utc>,
}

/// Why a claim was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum ClaimRefused {
    /// Someone else holds it.
    Held(Claim),
    /// [`MAX_CLAIMS`] are held.
    Full,
    /// Where claims are kept could not be reached.
    Store(StoreError),
}

impl From<StoreError> for ClaimRefused {
    fn from(error: StoreError) -> Self {
        Self::Store(error)
    }
}

/// Where this server keeps claims.
#[derive(Clone)]
pub enum Claims {
    /// In this process only (an in-memory ledger, tests).
    Memory(Arc<Mutex<HashMap<OperationId, Claim>>>),
    /// A SQLite file every process opening it shares.
    File(Arc<Mutex<Connection>>),
    /// The shared PostgreSQL database's table.
    Postgres(ReviewClaims),
}

impl Default for Claims {
    fn default() -> Self {
        Self::Memory(Arc::default())
    }
}

impl std::fmt::Debug for Claims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Memory(_) => "Claims::Memory",
            Self::File(_) => "Claims::File",
            Self::Postgres(_) => "Claims::Postgres",
        })
    }
}

/// The claims file: beside the SQLite ledger (`ledger.db.claims`), shared by every process on
/// it; with KurrentDB beside the instance's read models (`opledger.views` → `opledger.claims`).
pub fn claims_path(store: &crate::config::StoreUrl, read_models: &Path) -> PathBuf {
    match store {
        crate::config::StoreUrl::Sqlite(path) => {
            let mut file = path.clone().into_os_string();
            file.push(".claims");
            PathBuf::from(file)
        }
        _ => read_models.with_extension("claims"),
    }
}

fn file_error(context: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |error| StoreError::Unavailable {
        reason: format!("{context} (the review claims file): {error}"),
    }
}

fn millis(at: DateTime<Utc>) -> i64 {
    at.timestamp_millis()
}

fn from_millis(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

fn from_row(row: ClaimRow) -> Claim {
    Claim {
        holder: row.holder,
        expires_at: from_millis(row.expires_at_ms),
    }
}

fn lease(lease_s: u64) -> Duration {
    Duration::seconds(i64::try_from(lease_s.min(MAX_CLAIM_LEASE_S)).unwrap_or(0))
}

impl Claims {
    /// Claims kept in a SQLite file at `path` (created if missing), shared by every process
    /// that opens it.
    pub fn open_file(path: &Path) -> Result<Self, StoreError> {
        let open = file_error("cannot open");
        let connection = Connection::open(path).map_err(&open)?;
        // WAL, and FULL sync: a claim acknowledged to an operator must hold after a power loss,
        // or a second operator could be granted the same case.
        connection
            .pragma_update(None, "journal_mode", "WAL")
            .map_err(&open)?;
        connection
            .pragma_update(None, "synchronous", "FULL")
            .map_err(&open)?;
        connection
            .busy_timeout(std::time::Duration::from_secs(5))
            .map_err(&open)?;
        connection
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS review_claims (
                     operation_id  TEXT PRIMARY KEY,
                     holder        TEXT NOT NULL,
                     expires_at_ms INTEGER NOT NULL
                 );
                 CREATE INDEX IF NOT EXISTS review_claims_by_expiry
                     ON review_claims (expires_at_ms);",
            )
            .map_err(&open)?;
        Ok(Self::File(Arc::new(Mutex::new(connection))))
    }

    /// Claims `operation_id` for `holder` for `lease_s` seconds from `now`, or renews the
    /// holder's own claim; refused while someone else's claim runs.
    pub async fn claim(
        &self,
        operation_id: OperationId,
        holder: &str,
        lease_s: u64,
        now: DateTime<Utc>,
    ) -> Result<Claim, ClaimRefused> {
        match self {
            Self::Memory(held) => memory_claim(held, operation_id, holder, lease_s, now),
            Self::File(connection) => {
                let (connection, holder) = (Arc::clone(connection), holder.to_owned());
                blocking(move || file_claim(&connection, operation_id, &holder, lease_s, now))
                    .await?
            }
            Self::Postgres(table) => {
                let lease_s = u32::try_from(lease_s.min(MAX_CLAIM_LEASE_S)).unwrap_or(0);
                let max = i64::try_from(MAX_CLAIMS).unwrap_or(i64::MAX);
                match table
                    .claim(operation_id.as_uuid(), holder, lease_s, max)
                    .await?
                {
                    ClaimAsk::Granted(row) => Ok(from_row(row)),
                    ClaimAsk::HeldBy(row) => Err(ClaimRefused::Held(from_row(row))),
                    ClaimAsk::Full => Err(ClaimRefused::Full),
                }
            }
        }
    }

    /// Ends `holder`'s claim on `operation_id`; someone else's running claim is refused
    /// (returned in `Ok(Err(…))`).
    pub async fn release(
        &self,
        operation_id: OperationId,
        holder: &str,
        now: DateTime<Utc>,
    ) -> Result<Result<(), Claim>, StoreError> {
        let other = match self {
            Self::Memory(held) => {
                let mut held = held.lock().unwrap_or_else(PoisonError::into_inner);
                match held.get(&operation_id) {
                    Some(current) if current.expires_at > now && current.holder != holder => {
                        Some(current.clone())
                    }
                    _ => {
                        held.remove(&operation_id);
                        None
                    }
                }
            }
            Self::File(connection) => {
                let (connection, holder) = (Arc::clone(connection), holder.to_owned());
                blocking(move || {
                    let connection = connection.lock().unwrap_or_else(PoisonError::into_inner);
                    connection
                        .execute(
                            "DELETE FROM review_claims WHERE operation_id = ?1
                             AND (holder = ?2 OR expires_at_ms <= ?3)",
                            params![operation_id.to_string(), holder, millis(now)],
                        )
                        .map_err(file_error("cannot end a claim"))?;
                    file_running(&connection, operation_id, now)
                })
                .await?
            }
            Self::Postgres(table) => table
                .release(operation_id.as_uuid(), holder)
                .await?
                .map(from_row),
        };
        Ok(other.map_or(Ok(()), Err))
    }

    /// The running claim on `operation_id`, if any.
    pub async fn of(
        &self,
        operation_id: OperationId,
        now: DateTime<Utc>,
    ) -> Result<Option<Claim>, StoreError> {
        Ok(self
            .running(&[operation_id], now)
            .await?
            .remove(&operation_id))
    }

    /// The running claims on `operations` (those without one are not in the map).
    pub async fn running(
        &self,
        operations: &[OperationId],
        now: DateTime<Utc>,
    ) -> Result<HashMap<OperationId, Claim>, StoreError> {
        match self {
            Self::Memory(held) => {
                let held = held.lock().unwrap_or_else(PoisonError::into_inner);
                Ok(operations
                    .iter()
                    .filter_map(|id| {
                        held.get(id)
                            .filter(|claim| claim.expires_at > now)
                            .map(|claim| (*id, claim.clone()))
                    })
                    .collect())
            }
            Self::File(connection) => {
                let (connection, operations) = (Arc::clone(connection), operations.to_vec());
                blocking(move || {
                    let connection = connection.lock().unwrap_or_else(PoisonError::into_inner);
                    let mut found = HashMap::new();
                    for id in operations {
                        if let Some(claim) = file_running(&connection, id, now)? {
                            found.insert(id, claim);
                        }
                    }
                    Ok(found)
                })
                .await
            }
            Self::Postgres(table) => {
                let ids: Vec<_> = operations.iter().map(OperationId::as_uuid).collect();
                Ok(table
                    .running(&ids)
                    .await?
                    .into_iter()
                    .map(|(id, row)| (OperationId::from_uuid(id), from_row(row)))
                    .collect())
            }
        }
    }

    /// The running claim on `operation_id` held by someone other than `who`: what stops `who`
    /// from deciding it.
    pub async fn held_by_other(
        &self,
        operation_id: OperationId,
        who: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Claim>, StoreError> {
        Ok(self
            .of(operation_id, now)
            .await?
            .filter(|claim| claim.holder != who))
    }
}

/// Runs a claims file's statement off the async threads (it may wait for another process's
/// write lock).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| StoreError::Unavailable {
            reason: format!("the review claims file's task failed: {error}"),
        })?
}

fn memory_claim(
    held: &Mutex<HashMap<OperationId, Claim>>,
    operation_id: OperationId,
    holder: &str,
    lease_s: u64,
    now: DateTime<Utc>,
) -> Result<Claim, ClaimRefused> {
    let mut held = held.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(current) = held.get(&operation_id) {
        if current.expires_at > now && current.holder != holder {
            return Err(ClaimRefused::Held(current.clone()));
        }
    }
    if held.len() >= MAX_CLAIMS && !held.contains_key(&operation_id) {
        held.retain(|_, claim| claim.expires_at > now);
        if held.len() >= MAX_CLAIMS {
            return Err(ClaimRefused::Full);
        }
    }
    let claim = Claim {
        holder: holder.to_owned(),
        // To the millisecond, as the file and the database keep it.
        expires_at: from_millis(millis(now + lease(lease_s))),
    };
    held.insert(operation_id, claim.clone());
    Ok(claim)
}

/// Takes a claim in the file: the ended claims are swept, and the row is written only where
/// nobody else's runs, in one statement (the database's write lock makes it atomic across
/// processes).
fn file_claim(
    connection: &Mutex<Connection>,
    operation_id: OperationId,
    holder: &str,
    lease_s: u64,
    now: DateTime<Utc>,
) -> Result<Result<Claim, ClaimRefused>, StoreError> {
    let mut connection = connection.lock().unwrap_or_else(PoisonError::into_inner);
    let failed = file_error("cannot take a claim");
    let transaction = connection
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(&failed)?;
    let id = operation_id.to_string();
    transaction
        .execute(
            "DELETE FROM review_claims WHERE expires_at_ms <= ?1",
            params![millis(now)],
        )
        .map_err(&failed)?;
    let others: i64 = transaction
        .query_row(
            "SELECT count(*) FROM review_claims WHERE operation_id <> ?1",
            params![id],
            |row| row.get(0),
        )
        .map_err(&failed)?;
    if usize::try_from(others).unwrap_or(usize::MAX) >= MAX_CLAIMS {
        return Ok(Err(ClaimRefused::Full));
    }
    let expires_at = now + lease(lease_s);
    let written = transaction
        .execute(
            "INSERT INTO review_claims (operation_id, holder, expires_at_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT (operation_id) DO UPDATE
                SET holder = excluded.holder, expires_at_ms = excluded.expires_at_ms
                WHERE review_claims.holder = excluded.holder",
            params![id, holder, millis(expires_at)],
        )
        .map_err(&failed)?;
    let outcome = if written == 1 {
        Ok(Claim {
            holder: holder.to_owned(),
            // As stored: to the millisecond.
            expires_at: from_millis(millis(expires_at)),
        })
    } else {
        match file_running(&transaction, operation_id, now)? {
            Some(claim) => Err(ClaimRefused::Held(claim)),
            None => Err(ClaimRefused::Store(StoreError::Unavailable {
                reason: "a review claim ended while it was being taken; claim again".into(),
            })),
        }
    };
    transaction.commit().map_err(&failed)?;
    Ok(outcome)
}

fn file_running(
    connection: &Connection,
    operation_id: OperationId,
    now: DateTime<Utc>,
) -> Result<Option<Claim>, StoreError> {
    connection
        .query_row(
            "SELECT holder, expires_at_ms FROM review_claims
             WHERE operation_id = ?1 AND expires_at_ms > ?2",
            params![operation_id.to_string(), millis(now)],
            |row| {
                Ok(Claim {
                    holder: row.get(0)?,
                    expires_at: from_millis(row.get(1)?),
                })
            },
        )
        .optional()
        .map_err(file_error("cannot read a claim"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> OperationId {
        "0193a9a0-0000-7000-8000-000000000001"
            .parse()
            .expect("an operation id")
    }

    async fn a_second_operator_is_refused_while_the_claim_runs_and_may_claim_once_it_expired_on(
        first_place: Claims,
        second_place: Claims,
    ) {
        // The second place may be another process's view of the same claims.
        let now = Utc::now();
        let first = first_place
            .claim(id(), "anna", 60, now)
            .await
            .expect("free");
        assert_eq!(
            second_place
                .claim(id(), "boris", 60, now + Duration::seconds(59))
                .await,
            Err(ClaimRefused::Held(first.clone()))
        );
        assert_eq!(
            second_place.held_by_other(id(), "boris", now).await,
            Ok(Some(first.clone()))
        );
        assert_eq!(
            second_place.held_by_other(id(), "anna", now).await,
            Ok(None)
        );
        let later = now + Duration::seconds(60);
        assert_eq!(
            second_place.of(id(), later).await,
            Ok(None),
            "expired by itself"
        );
        assert!(second_place.claim(id(), "boris", 60, later).await.is_ok());
        assert_eq!(
            first_place.claim(id(), "anna", 60, later).await,
            Err(ClaimRefused::Held(
                second_place.of(id(), later).await.unwrap().unwrap()
            ))
        );
    }

    #[tokio::test]
    async fn a_second_operator_is_refused_while_the_claim_runs_and_may_claim_once_it_expired() {
        let claims = Claims::default();
        a_second_operator_is_refused_while_the_claim_runs_and_may_claim_once_it_expired_on(
            claims.clone(),
            claims,
        )
        .await;
    }

    #[tokio::test]
    async fn two_servers_opening_one_claims_file_refuse_each_others_claimants() {
        let folder = tempfile::tempdir().expect("a folder");
        let path = folder.path().join("ledger.db.claims");
        a_second_operator_is_refused_while_the_claim_runs_and_may_claim_once_it_expired_on(
            Claims::open_file(&path).expect("opens"),
            Claims::open_file(&path).expect("opens again"),
        )
        .await;
        // And a server started again later finds the claim still there.
        let now = Utc::now();
        let other: OperationId = "0193a9a0-0000-7000-8000-000000000002"
            .parse()
            .expect("an operation id");
        let before = Claims::open_file(&path).expect("opens");
        before.claim(other, "anna", 600, now).await.expect("free");
        drop(before);
        let restarted = Claims::open_file(&path).expect("opens after a restart");
        assert_eq!(
            restarted
                .of(other, now)
                .await
                .expect("readable")
                .map(|claim| claim.holder),
            Some("anna".to_owned())
        );
    }

    #[tokio::test]
    async fn the_holder_renews_and_releases_and_nobody_else_releases() {
        let folder = tempfile::tempdir().expect("a folder");
        for claims in [
            Claims::default(),
            Claims::open_file(&folder.path().join("ledger.db.claims")).expect("opens"),
        ] {
            let now = Utc::now();
            claims.claim(id(), "anna", 60, now).await.expect("free");
            let renewed = claims
                .claim(id(), "anna", MAX_CLAIM_LEASE_S * 10, now)
                .await
                .expect("renewed");
            assert_eq!(
                renewed.expires_at,
                from_millis(millis(now + Duration::seconds(MAX_CLAIM_LEASE_S as i64))),
                "a lease is capped"
            );
            assert!(claims
                .release(id(), "boris", now)
                .await
                .expect("store")
                .is_err());
            assert!(claims
                .release(id(), "anna", now)
                .await
                .expect("store")
                .is_ok());
            assert_eq!(claims.of(id(), now).await, Ok(None));
        }
    }
}
