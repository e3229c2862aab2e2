//! Operators' claims on review items in the shared database (`opledger.review_claims`, migration
//! 4), so every `opledger serve` instance on the database sees the same claims and a claim
//! outlives the instance that took it.
//!
//! A claim is one row: the operation, its holder and an expiry in the database's clock
//! (`clock_timestamp()`, so instances' clocks never compare with each other). What a claim means
//! is the server's (adapters/http-api/src/claims.rs); this module only keeps the rows.
//!
//! It must never grant a claim another holder holds unexpired: taking one is a single
//! `INSERT … ON CONFLICT DO UPDATE … WHERE`, which PostgreSQL's row lock makes atomic across
//! instances.

use deadpool_postgres::{GenericClient, Pool};
use opledger_domain::store::StoreError;
use uuid::Uuid;

use crate::{pooled, unavailable, PostgresStore};

/// The claims table on the store's database, sharing its read pool.
#[derive(Clone)]
pub struct ReviewClaims {
    pool: Pool,
}

impl std::fmt::Debug for ReviewClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReviewClaims").finish_non_exhaustive()
    }
}

/// One running claim: who holds it and when it ends (milliseconds since the Unix epoch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRow {
    /// The operator holding it.
    pub holder: String,
    /// When it ends by itself, in ms since the Unix epoch (the database's clock).
    pub expires_at_ms: i64,
}

/// What asking for a claim gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimAsk {
    /// Taken (or renewed) by the asker.
    Granted(ClaimRow),
    /// Held unexpired by someone else.
    HeldBy(ClaimRow),
    /// `max_rows` claims run already.
    Full,
}

impl PostgresStore {
    /// The review claims in this store's database.
    pub fn review_claims(&self) -> ReviewClaims {
        ReviewClaims {
            pool: self.shared.pool.clone(),
        }
    }
}

const EXPIRES_MS: &str = "(extract(epoch FROM expires_at) * 1000)::bigint";

fn row_of(row: &tokio_postgres::Row) -> ClaimRow {
    ClaimRow {
        holder: row.get(0),
        expires_at_ms: row.get(1),
    }
}

impl ReviewClaims {
    /// Claims `operation` for `holder` for `lease_s` seconds, or renews the holder's own claim;
    /// refused while someone else's runs, or when `max_rows` others run.
    pub async fn claim(
        &self,
        operation: Uuid,
        holder: &str,
        lease_s: u32,
        max_rows: i64,
    ) -> Result<ClaimAsk, StoreError> {
        let client = pooled(&self.pool).await?;
        let failed =
            |error: tokio_postgres::Error| unavailable("cannot take a review claim", &error);
        // Ended claims go first, so they neither count against the bound nor stop a claimer.
        client
            .execute(
                "DELETE FROM opledger.review_claims WHERE expires_at <= clock_timestamp()",
                &[],
            )
            .await
            .map_err(failed)?;
        let running: i64 = client
            .query_one(
                "SELECT count(*) FROM opledger.review_claims WHERE operation_id <> $1",
                &[&operation],
            )
            .await
            .map_err(failed)?
            .get(0);
        if running >= max_rows {
            return Ok(ClaimAsk::Full);
        }
        let granted = client
            .query_opt(
                &format!(
                    "INSERT INTO opledger.review_claims (operation_id, holder, expires_at)
                     VALUES ($1, $2, clock_timestamp() + make_interval(secs => $3))
                     ON CONFLICT (operation_id) DO UPDATE
                        SET holder = excluded.holder, expires_at = excluded.expires_at
                        WHERE review_claims.holder = excluded.holder
                           OR review_claims.expires_at <= clock_timestamp()
                     RETURNING holder, {EXPIRES_MS}"
                ),
                &[&operation, &holder, &f64::from(lease_s)],
            )
            .await
            .map_err(failed)?;
        if let Some(row) = granted {
            return Ok(ClaimAsk::Granted(row_of(&row)));
        }
        match self.running_on(&client, operation).await? {
            Some(row) => Ok(ClaimAsk::HeldBy(row)),
            // It ended between the two statements: nobody holds it now; the caller may ask again.
            None => Err(StoreError::Unavailable {
                reason: "a review claim ended while it was being taken; claim again".into(),
            }),
        }
    }

    /// Ends `holder`'s claim on `operation`; someone else's running claim is returned instead.
    pub async fn release(
        &self,
        operation: Uuid,
        holder: &str,
    ) -> Result<Option<ClaimRow>, StoreError> {
        let client = pooled(&self.pool).await?;
        client
            .execute(
                "DELETE FROM opledger.review_claims WHERE operation_id = $1
                 AND (holder = $2 OR expires_at <= clock_timestamp())",
                &[&operation, &holder],
            )
            .await
            .map_err(|error| unavailable("cannot end a review claim", &error))?;
        self.running_on(&client, operation).await
    }

    /// The running claims on `operations` (those without one are left out).
    pub async fn running(&self, operations: &[Uuid]) -> Result<Vec<(Uuid, ClaimRow)>, StoreError> {
        if operations.is_empty() {
            return Ok(Vec::new());
        }
        let client = pooled(&self.pool).await?;
        let rows = client
            .query(
                &format!(
                    "SELECT holder, {EXPIRES_MS}, operation_id FROM opledger.review_claims
                     WHERE operation_id = ANY($1) AND expires_at > clock_timestamp()"
                ),
                &[&operations],
            )
            .await
            .map_err(|error| unavailable("cannot read review claims", &error))?;
        Ok(rows.iter().map(|row| (row.get(2), row_of(row))).collect())
    }

    async fn running_on(
        &self,
        client: &impl GenericClient,
        operation: Uuid,
    ) -> Result<Option<ClaimRow>, StoreError> {
        let row = client
            .query_opt(
                &format!(
                    "SELECT holder, {EXPIRES_MS} FROM opledger.review_claims
                     WHERE operation_id = $1 AND expires_at > clock_timestamp()"
                ),
                &[&operation],
            )
            .await
            .map_err(|error| unavailable("cannot read a review claim", &error))?;
        Ok(row.as_ref().map(row_of))
    }
}
