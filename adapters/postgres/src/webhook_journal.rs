//! The webhooks' delivery journal in the shared database: each endpoint's checkpoint, status,
//! epoch and lease in `opledger.webhook_endpoints`, its attempts in `opledger.webhook_attempts`
//! (migration 2, `schema.rs`), so every `opledger serve` instance on the database sees one
//! journal and each endpoint is delivered by one instance at a time.
//!
//! A lease is a holder name, a token that grows with every acquisition, and an expiry in the
//! database's clock (`clock_timestamp()`, so instances' clocks never compare with each other).
//! Every fenced write names the token in its `WHERE`: an instance whose lease was taken over
//! changes nothing. What the rows mean is the webhooks crate's (adapters/webhooks/src/port.rs);
//! the server adapts these calls to its port, so this crate does not depend on that one.
//!
//! It must never grant a lease another holder holds unexpired: acquisition is one conditional
//! `UPDATE`, which PostgreSQL's row lock makes atomic across instances.

use deadpool_postgres::GenericClient;
use deadpool_postgres::Pool;
use opledger_domain::store::StoreError;

use crate::{pooled, unavailable, PostgresStore};

/// Most attempts kept per endpoint; older ones are deleted as new ones are written (the same
/// bound as the embedded journal's).
pub const MAX_WEBHOOK_ATTEMPTS_KEPT: i64 = 10_000;

/// The webhook journal on the store's database, sharing its read pool.
#[derive(Clone)]
pub struct WebhookJournal {
    pool: Pool,
}

impl std::fmt::Debug for WebhookJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookJournal").finish_non_exhaustive()
    }
}

/// One endpoint's row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookEndpointRow {
    /// The last position delivered or skipped.
    pub checkpoint: Option<u64>,
    /// `active`, `paused` or `disabled`.
    pub status: String,
    /// Why it is paused or disabled.
    pub reason: Option<String>,
    /// Bumped by every status change.
    pub epoch: u64,
}

/// One attempt's row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookAttemptRow {
    /// The endpoint.
    pub endpoint: String,
    /// The event's position.
    pub position: u64,
    /// The `webhook-id` sent.
    pub webhook_id: String,
    /// The attempt's number at this event.
    pub attempt: u32,
    /// When it started, RFC 3339.
    pub at: String,
    /// The HTTP status answered.
    pub status: Option<u16>,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
    /// What went wrong.
    pub error: Option<String>,
}

/// A lease as the fence of a write: its endpoint, holder and token.
#[derive(Clone, Copy, Debug)]
pub struct WebhookFence<'a> {
    /// The endpoint.
    pub endpoint: &'a str,
    /// The holder.
    pub holder: &'a str,
    /// The token it was granted with.
    pub token: u64,
}

/// What asking for a lease gave: the token granted, or the holder that has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WebhookLeaseAsk {
    /// Granted with this token.
    Granted(u64),
    /// Held unexpired by this holder.
    HeldBy(String),
}

impl PostgresStore {
    /// The webhook journal in this store's database.
    pub fn webhook_journal(&self) -> WebhookJournal {
        WebhookJournal {
            pool: self.shared.pool.clone(),
        }
    }
}

const ENDPOINT_COLUMNS: &str = "checkpoint, status, reason, epoch";

impl WebhookJournal {
    /// Every endpoint defined through the API: id and definition, in id order.
    pub async fn definitions(&self) -> Result<Vec<(String, String)>, StoreError> {
        let client = pooled(&self.pool).await?;
        let rows = client
            .query(
                "SELECT id, definition FROM opledger.webhook_definitions ORDER BY id",
                &[],
            )
            .await
            .map_err(|error| unavailable("cannot read webhook endpoint definitions", &error))?;
        Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
    }

    /// Writes (`Some`) or deletes (`None`) an endpoint's definition.
    pub async fn define(&self, endpoint: &str, definition: Option<&str>) -> Result<(), StoreError> {
        let client = pooled(&self.pool).await?;
        match definition {
            Some(text) => {
                client
                    .execute(
                        "INSERT INTO opledger.webhook_definitions (id, definition) VALUES ($1, $2)
                         ON CONFLICT (id) DO UPDATE SET definition = excluded.definition",
                        &[&endpoint, &text],
                    )
                    .await
            }
            None => {
                client
                    .execute(
                        "DELETE FROM opledger.webhook_definitions WHERE id = $1",
                        &[&endpoint],
                    )
                    .await
            }
        }
        .map(drop)
        .map_err(|error| unavailable("cannot write a webhook endpoint definition", &error))
    }

    /// The endpoint's row, created with `start` as its checkpoint when it has none.
    pub async fn ensure(
        &self,
        endpoint: &str,
        start: Option<u64>,
    ) -> Result<WebhookEndpointRow, StoreError> {
        let client = pooled(&self.pool).await?;
        client
            .execute(
                "INSERT INTO opledger.webhook_endpoints (id, checkpoint, status, epoch)
                 VALUES ($1, $2, 'active', 0) ON CONFLICT (id) DO NOTHING",
                &[&endpoint, &start.map(to_sql)],
            )
            .await
            .map_err(|error| unavailable("cannot create a webhook endpoint's row", &error))?;
        read_endpoint(&client, endpoint)
            .await?
            .ok_or_else(|| StoreError::Unavailable {
                reason: format!(
                    "webhook endpoint `{endpoint}` has no row right after it was written"
                ),
            })
    }

    /// The endpoint's row.
    pub async fn record(&self, endpoint: &str) -> Result<Option<WebhookEndpointRow>, StoreError> {
        let client = pooled(&self.pool).await?;
        read_endpoint(&client, endpoint).await
    }

    /// Moves the checkpoint if the endpoint is at `epoch` under the fence's lease.
    pub async fn advance(
        &self,
        fence: WebhookFence<'_>,
        epoch: u64,
        position: u64,
    ) -> Result<bool, StoreError> {
        let client = pooled(&self.pool).await?;
        advance(&client, fence, epoch, position).await
    }

    /// Sets the status (and, with `replay_after`, the checkpoint) and bumps the epoch; with
    /// `fence`, only at that epoch under that lease.
    pub async fn set_status(
        &self,
        endpoint: &str,
        status: &str,
        reason: Option<&str>,
        replay_after: Option<Option<u64>>,
        fence: Option<(u64, WebhookFence<'_>)>,
    ) -> Result<bool, StoreError> {
        let client = pooled(&self.pool).await?;
        let (replay, checkpoint) = match replay_after {
            Some(after) => (true, after.map(to_sql)),
            None => (false, None),
        };
        let (fenced, epoch, holder, token) = match fence {
            Some((epoch, fence)) => (true, to_sql(epoch), fence.holder, to_sql(fence.token)),
            None => (false, 0, "", 0),
        };
        let changed = client
            .execute(
                "UPDATE opledger.webhook_endpoints
                 SET status = $2, reason = $3, epoch = epoch + 1,
                     checkpoint = CASE WHEN $4 THEN $5 ELSE checkpoint END
                 WHERE id = $1 AND (NOT $6 OR (epoch = $7 AND lease_holder = $8 AND lease_token = $9))",
                &[&endpoint, &status, &reason, &replay, &checkpoint, &fenced, &epoch, &holder, &token],
            )
            .await
            .map_err(|error| unavailable("cannot change a webhook endpoint's status", &error))?;
        Ok(changed == 1)
    }

    /// Records an attempt and, with `advance`, moves the checkpoint to its event under the
    /// fence, in one transaction; whether the checkpoint moved.
    pub async fn record_attempt(
        &self,
        attempt: &WebhookAttemptRow,
        advance_under: Option<(u64, WebhookFence<'_>)>,
    ) -> Result<bool, StoreError> {
        let mut client = pooled(&self.pool).await?;
        let failed = |error| unavailable("cannot record a webhook attempt", &error);
        let transaction = client.transaction().await.map_err(failed)?;
        transaction
            .execute(
                "INSERT INTO opledger.webhook_attempts
                     (endpoint, position, webhook_id, attempt, at, status, duration_ms, error)
                 VALUES ($1, $2, $3, $4, $5::text::timestamptz, $6, $7, $8)",
                &[
                    &attempt.endpoint,
                    &to_sql(attempt.position),
                    &attempt.webhook_id,
                    &i64::from(attempt.attempt),
                    &attempt.at,
                    &attempt.status.map(i32::from),
                    &to_sql(attempt.duration_ms),
                    &attempt.error,
                ],
            )
            .await
            .map_err(failed)?;
        transaction
            .execute(
                "DELETE FROM opledger.webhook_attempts WHERE endpoint = $1 AND seq <= (
                     SELECT seq FROM opledger.webhook_attempts WHERE endpoint = $1
                     ORDER BY seq DESC LIMIT 1 OFFSET $2)",
                &[&attempt.endpoint, &MAX_WEBHOOK_ATTEMPTS_KEPT],
            )
            .await
            .map_err(failed)?;
        let advanced = match advance_under {
            Some((epoch, fence)) => advance(&transaction, fence, epoch, attempt.position).await?,
            None => false,
        };
        transaction.commit().await.map_err(failed)?;
        Ok(advanced)
    }

    /// Records a batch of one endpoint's successful attempts (in delivery order), trims its
    /// attempt log and moves its checkpoint to `checkpoint` under the fence, in one statement
    /// (one round trip and one commit per batch); whether the checkpoint moved. The attempts are
    /// recorded whether or not it did: they happened.
    pub async fn record_deliveries(
        &self,
        attempts: &[WebhookAttemptRow],
        fence: WebhookFence<'_>,
        epoch: u64,
        checkpoint: u64,
    ) -> Result<bool, StoreError> {
        let client = pooled(&self.pool).await?;
        let positions: Vec<i64> = attempts.iter().map(|a| to_sql(a.position)).collect();
        let ids: Vec<&str> = attempts.iter().map(|a| a.webhook_id.as_str()).collect();
        let numbers: Vec<i64> = attempts.iter().map(|a| i64::from(a.attempt)).collect();
        let ats: Vec<&str> = attempts.iter().map(|a| a.at.as_str()).collect();
        let statuses: Vec<Option<i32>> = attempts.iter().map(|a| a.status.map(i32::from)).collect();
        let durations: Vec<i64> = attempts.iter().map(|a| to_sql(a.duration_ms)).collect();
        let errors: Vec<Option<&str>> = attempts.iter().map(|a| a.error.as_deref()).collect();
        // One statement is one transaction: the attempts, the trim and the fenced checkpoint
        // commit together. The trim sees the table as it was before the statement (PostgreSQL
        // runs a statement's parts on one snapshot), so a batch's own rows are trimmed by the
        // next batch: the log holds at most MAX_WEBHOOK_ATTEMPTS_KEPT plus one batch.
        let row = client
            .query_one(
                "WITH inserted AS (
                     INSERT INTO opledger.webhook_attempts
                         (endpoint, position, webhook_id, attempt, at, status, duration_ms, error)
                     SELECT $1, b.position, b.webhook_id, b.attempt, b.at::timestamptz, b.status,
                            b.duration_ms, b.error
                     FROM unnest($2::bigint[], $3::text[], $4::bigint[], $5::text[], $6::int[],
                                 $7::bigint[], $8::text[]) WITH ORDINALITY
                          AS b(position, webhook_id, attempt, at, status, duration_ms, error, n)
                     ORDER BY b.n
                 ),
                 trimmed AS (
                     DELETE FROM opledger.webhook_attempts WHERE endpoint = $1 AND seq <= (
                         SELECT seq FROM opledger.webhook_attempts WHERE endpoint = $1
                         ORDER BY seq DESC LIMIT 1 OFFSET $9)
                 ),
                 advanced AS (
                     UPDATE opledger.webhook_endpoints SET checkpoint = $10
                     WHERE id = $1 AND epoch = $11 AND lease_holder = $12 AND lease_token = $13
                     RETURNING 1
                 )
                 SELECT count(*) FROM advanced",
                &[
                    &fence.endpoint,
                    &positions,
                    &ids,
                    &numbers,
                    &ats,
                    &statuses,
                    &durations,
                    &errors,
                    &MAX_WEBHOOK_ATTEMPTS_KEPT,
                    &to_sql(checkpoint),
                    &to_sql(epoch),
                    &fence.holder,
                    &to_sql(fence.token),
                ],
            )
            .await
            .map_err(|error| unavailable("cannot record a batch of webhook deliveries", &error))?;
        Ok(row.get::<_, i64>(0) == 1)
    }

    /// The endpoint's latest attempts, newest first.
    pub async fn attempts(
        &self,
        endpoint: &str,
        limit: u64,
    ) -> Result<Vec<WebhookAttemptRow>, StoreError> {
        let client = pooled(&self.pool).await?;
        let rows = client
            .query(
                "SELECT position, webhook_id, attempt,
                        to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
                        status, duration_ms, error
                 FROM opledger.webhook_attempts WHERE endpoint = $1 ORDER BY seq DESC LIMIT $2",
                &[&endpoint, &to_sql(limit)],
            )
            .await
            .map_err(|error| unavailable("cannot list webhook attempts", &error))?;
        Ok(rows
            .iter()
            .map(|row| WebhookAttemptRow {
                endpoint: endpoint.to_owned(),
                position: from_sql(row.get(0)),
                webhook_id: row.get(1),
                attempt: u32::try_from(row.get::<_, i64>(2)).unwrap_or(u32::MAX),
                at: row.get(3),
                status: row
                    .get::<_, Option<i32>>(4)
                    .and_then(|status| u16::try_from(status).ok()),
                duration_ms: from_sql(row.get(5)),
                error: row.get(6),
            })
            .collect())
    }

    /// Takes the lease for `holder` for `lease_ms` if it is free or expired.
    pub async fn acquire(
        &self,
        endpoint: &str,
        holder: &str,
        lease_ms: u64,
    ) -> Result<WebhookLeaseAsk, StoreError> {
        let client = pooled(&self.pool).await?;
        let granted = client
            .query_opt(
                "UPDATE opledger.webhook_endpoints
                 SET lease_holder = $2, lease_token = lease_token + 1,
                     lease_expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond'
                 WHERE id = $1 AND (lease_holder IS NULL OR lease_expires_at <= clock_timestamp())
                 RETURNING lease_token",
                &[&endpoint, &holder, &to_sql(lease_ms)],
            )
            .await
            .map_err(|error| unavailable("cannot take a webhook lease", &error))?;
        if let Some(row) = granted {
            return Ok(WebhookLeaseAsk::Granted(from_sql(row.get(0))));
        }
        let row = client
            .query_opt(
                "SELECT lease_holder FROM opledger.webhook_endpoints WHERE id = $1",
                &[&endpoint],
            )
            .await
            .map_err(|error| unavailable("cannot read a webhook lease", &error))?;
        Ok(WebhookLeaseAsk::HeldBy(
            row.and_then(|row| row.get::<_, Option<String>>(0))
                .unwrap_or_default(),
        ))
    }

    /// Extends the fence's lease by `lease_ms` from now; the endpoint's epoch while it is still
    /// the holder's, `None` once another instance took it.
    pub async fn renew(
        &self,
        fence: WebhookFence<'_>,
        lease_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let client = pooled(&self.pool).await?;
        let row = client
            .query_opt(
                "UPDATE opledger.webhook_endpoints
                 SET lease_expires_at = clock_timestamp() + $4::bigint * interval '1 millisecond'
                 WHERE id = $1 AND lease_holder = $2 AND lease_token = $3
                 RETURNING epoch",
                &[
                    &fence.endpoint,
                    &fence.holder,
                    &to_sql(fence.token),
                    &to_sql(lease_ms),
                ],
            )
            .await
            .map_err(|error| unavailable("cannot renew a webhook lease", &error))?;
        Ok(row.map(|row| from_sql(row.get(0))))
    }

    /// Gives the fence's lease up (nothing if it is no longer held).
    pub async fn release(&self, fence: WebhookFence<'_>) -> Result<(), StoreError> {
        let client = pooled(&self.pool).await?;
        client
            .execute(
                "UPDATE opledger.webhook_endpoints SET lease_holder = NULL, lease_expires_at = NULL
                 WHERE id = $1 AND lease_holder = $2 AND lease_token = $3",
                &[&fence.endpoint, &fence.holder, &to_sql(fence.token)],
            )
            .await
            .map_err(|error| unavailable("cannot give a webhook lease up", &error))?;
        Ok(())
    }
}

async fn read_endpoint(
    client: &impl GenericClient,
    endpoint: &str,
) -> Result<Option<WebhookEndpointRow>, StoreError> {
    let row = client
        .query_opt(
            &format!("SELECT {ENDPOINT_COLUMNS} FROM opledger.webhook_endpoints WHERE id = $1"),
            &[&endpoint],
        )
        .await
        .map_err(|error| unavailable("cannot read a webhook endpoint's row", &error))?;
    Ok(row.map(|row| WebhookEndpointRow {
        checkpoint: row.get::<_, Option<i64>>(0).map(from_sql),
        status: row.get(1),
        reason: row.get(2),
        epoch: from_sql(row.get(3)),
    }))
}

async fn advance(
    client: &impl GenericClient,
    fence: WebhookFence<'_>,
    epoch: u64,
    position: u64,
) -> Result<bool, StoreError> {
    let changed = client
        .execute(
            "UPDATE opledger.webhook_endpoints SET checkpoint = $5
             WHERE id = $1 AND epoch = $2 AND lease_holder = $3 AND lease_token = $4",
            &[
                &fence.endpoint,
                &to_sql(epoch),
                &fence.holder,
                &to_sql(fence.token),
                &to_sql(position),
            ],
        )
        .await
        .map_err(|error| unavailable("cannot move a webhook checkpoint", &error))?;
    Ok(changed == 1)
}

/// Positions, epochs, tokens and counts stay far below `i64::MAX`.
fn to_sql(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn from_sql(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}
