//! The tenants' trees in the database (see `opledger_domain::merkle::tenants`), as the SQLite
//! store keeps them: each tenant's tree as its frontier (size and the roots of its perfect
//! subtrees), one row per tenant in `opledger.tenant_trees`, rewritten once per tenant per group
//! commit in the transaction of the events it covers, and beside the log's head the log size they
//! cover (`log_head.tenants_size`; `NULL` when they were never built).
//!
//! The writer grows them only while they cover exactly the log's tree, under the log's lock, so
//! several instances grow one set of trees in position order: a writer that committed last keeps
//! the frontiers it read or grew in memory ([`TenantTip`]) and, on the one-round-trip path,
//! writes their new rows without reading (the head's `UPDATE` refuses the round if another
//! instance wrote since, or the trees' cover moved); on the checked path it reads the rows of the
//! round's tenants in the round trip that takes the lock. A stream's tenant is stored on its row
//! (`streams.tenant`, from the intent that opens it), so that read needs nothing before it.
//!
//! Trees that do not cover the log's tree (a database from before them, a tree rebuilt, rows
//! changed by hand) are built again from the log when the store starts ([`rebuild`]); a checkpoint
//! signs their map only when they cover the log's tree exactly ([`read_heads`]).
//!
//! It must never write a tenant's row outside the transaction of the events it covers, nor grow a
//! tenant's tree from a frontier another instance may have moved since it was read.

use std::collections::HashMap;

use opledger_domain::merkle::tenants::{
    tenant_leaf_hash, tenant_of_first_event, Frontier, TenantMap,
};
use opledger_domain::merkle::{self, Hash, TenantHeads};
use opledger_domain::store::StoreError;
use tokio_postgres::GenericClient;

use crate::codec;

/// Most streams whose tenant the writer remembers between commits (a stream's tenant never
/// changes, so a remembered one is never stale); emptied when full. A miss sends the round to the
/// checked path, which reads the stream's row. About 100 bytes each.
const MAX_REMEMBERED_STREAMS: usize = 65_536;
/// Most tenants whose frontier the writer keeps between commits (under 2 KiB each); emptied when
/// full. A tenant not kept sends the round to the checked path, which reads its row.
const MAX_REMEMBERED_TENANTS: usize = 16_384;
/// Events read from the log at a time while the trees are built from it.
const REBUILD_BATCH: i64 = 4_096;

fn corrupt(reason: String) -> StoreError {
    crate::tree::corrupt(&reason)
}

/// Each stream's tenant, remembered by the writer across commits.
#[derive(Debug, Default)]
pub(crate) struct StreamTenants {
    known: HashMap<String, Option<String>>,
}

impl StreamTenants {
    /// The tenant of `stream`, when remembered (`Some(None)`: a stream of no tenant).
    pub(crate) fn get(&self, stream: &str) -> Option<&Option<String>> {
        self.known.get(stream)
    }

    pub(crate) fn remember(&mut self, stream: &str, tenant: Option<String>) {
        if self.known.len() >= MAX_REMEMBERED_STREAMS {
            self.known.clear();
        }
        self.known.insert(stream.to_owned(), tenant);
    }
}

/// The tenant trees as the writer's last commit left them, valid while no other instance has
/// written since (the head's `UPDATE` checks it).
#[derive(Clone, Debug, Default)]
pub(crate) struct TenantTip {
    /// The log size the stored trees cover (`None`: never built).
    pub(crate) covered: Option<i64>,
    /// The frontiers of tenants this writer read or grew.
    pub(crate) trees: HashMap<String, Frontier>,
}

impl TenantTip {
    /// Takes in the frontiers a commit read or grew, forgetting every other one when too many
    /// are kept.
    pub(crate) fn keep(&mut self, trees: impl IntoIterator<Item = (String, Frontier)>) {
        self.trees.extend(trees);
        if self.trees.len() > MAX_REMEMBERED_TENANTS {
            self.trees.clear();
        }
    }
}

/// The tenant trees' rows one commit writes: one per tenant it grew.
#[derive(Debug, Default)]
pub(crate) struct TenantRows {
    pub(crate) tenants: Vec<String>,
    pub(crate) sizes: Vec<i64>,
    pub(crate) frontiers: Vec<Vec<u8>>,
}

/// One commit's growth of the tenant trees, in position order, from the frontiers in `base`.
pub(crate) struct Growth<'b> {
    base: &'b HashMap<String, Frontier>,
    /// Whether a tenant missing from `base` has no tree yet (`base` was read under the lock for
    /// every tenant of the round) or is only not known here (`base` is the writer's memory).
    missing_is_new: bool,
    grown: HashMap<String, Frontier>,
}

impl<'b> Growth<'b> {
    pub(crate) fn new(base: &'b HashMap<String, Frontier>, missing_is_new: bool) -> Self {
        Self {
            base,
            missing_is_new,
            grown: HashMap::new(),
        }
    }

    /// Adds the event at `position` (log leaf hash `leaf`) to `tenant`'s tree; `false` when that
    /// tree is not known here (the round then reads it under the lock).
    pub(crate) fn push(&mut self, tenant: &str, position: u64, leaf: Hash) -> bool {
        if !self.grown.contains_key(tenant) {
            let tree = match self.base.get(tenant) {
                Some(tree) => tree.clone(),
                None if self.missing_is_new => Frontier::new(),
                None => return false,
            };
            self.grown.insert(tenant.to_owned(), tree);
        }
        self.grown
            .get_mut(tenant)
            .expect("inserted just above")
            .push(tenant_leaf_hash(position, leaf));
        true
    }

    /// The trees grown and the rows to write for them, in the tenants' order.
    pub(crate) fn finish(self) -> Result<(HashMap<String, Frontier>, TenantRows), StoreError> {
        let mut rows = TenantRows::default();
        let mut tenants: Vec<&String> = self.grown.keys().collect();
        tenants.sort();
        for tenant in tenants {
            let tree = &self.grown[tenant];
            rows.sizes.push(
                i64::try_from(tree.size())
                    .map_err(|_| corrupt("a tenant's tree outgrew a bigint".into()))?,
            );
            rows.frontiers.push(tree.to_bytes());
            rows.tenants.push(tenant.clone());
        }
        Ok((self.grown, rows))
    }
}

/// A tenant's frontier as its row stores it.
pub(crate) fn frontier_of(tenant: &str, size: i64, bytes: &[u8]) -> Result<Frontier, StoreError> {
    u64::try_from(size)
        .ok()
        .and_then(|size| Frontier::from_bytes(size, bytes))
        .ok_or_else(|| {
            corrupt(format!(
                "the tree of tenant `{tenant}` ({size} leaves) is not stored whole"
            ))
        })
}

/// The tenant a stream's first event names (see [`tenant_of_first_event`]).
pub(crate) fn tenant_of(event_type: &str, data: &[u8]) -> Option<String> {
    tenant_of_first_event(event_type, data)
}

/// Every tenant's head and the log size they cover, read by one statement (one snapshot);
/// `None` when they do not cover the log's tree exactly.
pub(crate) async fn read_heads(
    client: &impl GenericClient,
) -> Result<Option<TenantHeads>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT h.tree_size, h.tenants_size, t.tenant, t.size, t.frontier \
             FROM opledger.log_head h LEFT JOIN opledger.tenant_trees t ON true",
            &[],
        )
        .await?;
    Ok(heads_of(&rows))
}

fn heads_of(rows: &[tokio_postgres::Row]) -> Option<TenantHeads> {
    let first = rows.first()?;
    let (tree_size, covered): (i64, Option<i64>) = (first.get(0), first.get(1));
    if covered != Some(tree_size) {
        return None;
    }
    let mut heads = Vec::with_capacity(rows.len());
    for row in rows {
        let Some(tenant) = row.get::<_, Option<String>>(2) else {
            continue;
        };
        let size: i64 = row.get(3);
        let bytes: Vec<u8> = row.get(4);
        // A row that is not a frontier makes no map: the checkpoint then signs the log alone,
        // and `opledger verify` names the tenant.
        let head = frontier_of(&tenant, size, &bytes).ok()?.head();
        heads.push((tenant, head));
    }
    Some(TenantHeads {
        log_size: u64::try_from(tree_size).ok()?,
        map: TenantMap::new(heads),
    })
}

/// Builds every tenant's tree again from the log's first `tree_size` events, on `client`'s
/// transaction, under the log's lock: each stream's tenant is written on its row from the event
/// that opens it, then the events are walked in position order and each tenant's tree grown by
/// its events' leaves. Returns the leaves walked. A position missing from the log stops the walk;
/// the trees are then left not covering the log's tree (a checkpoint signs the log alone).
pub(crate) async fn rebuild(client: &impl GenericClient) -> Result<u64, String> {
    let failed = |error: tokio_postgres::Error| {
        format!(
            "cannot build the tenants' trees from the log: {}",
            crate::describe(&error)
        )
    };
    let tree_size: i64 = client
        .query_one("SELECT tree_size FROM opledger.log_head FOR UPDATE", &[])
        .await
        .map_err(failed)?
        .get(0);
    client
        .batch_execute(
            "DELETE FROM opledger.tenant_trees; UPDATE opledger.log_head SET tenants_size = NULL",
        )
        .await
        .map_err(failed)?;
    name_stream_tenants(client, tree_size).await?;
    let read = client
        .prepare(&format!(
            "SELECT {}, s.tenant FROM opledger.events e JOIN opledger.streams s \
             ON s.stream_id = e.stream_id WHERE e.position > $1 AND e.position <= $2 \
             ORDER BY e.position LIMIT $3",
            qualified_event_columns()
        ))
        .await
        .map_err(failed)?;
    let mut trees: HashMap<String, Frontier> = HashMap::new();
    let mut at = 0_i64;
    while at < tree_size {
        let rows = client
            .query(&read, &[&at, &tree_size, &REBUILD_BATCH])
            .await
            .map_err(failed)?;
        if rows.is_empty() {
            break;
        }
        for row in &rows {
            let event = codec::event(row).map_err(|error| error.to_string())?;
            if event.position.value() != at as u64 + 1 {
                tracing::warn!(
                    missing = at + 1,
                    "the log has a position missing; the tenants' trees are not built"
                );
                return Ok(at as u64);
            }
            if let Some(tenant) = row.get::<_, Option<String>>(7) {
                trees.entry(tenant).or_default().push(tenant_leaf_hash(
                    event.position.value(),
                    merkle::leaf_hash(&event.view()),
                ));
            }
            at += 1;
        }
    }
    if at < tree_size {
        tracing::warn!(
            walked = at,
            tree_size,
            "the log ends before its tree; the tenants' trees are not built"
        );
        return Ok(at as u64);
    }
    let mut growth_rows = TenantRows::default();
    for (tenant, tree) in trees {
        growth_rows
            .sizes
            .push(i64::try_from(tree.size()).map_err(|_| "a tenant's tree outgrew a bigint")?);
        growth_rows.frontiers.push(tree.to_bytes());
        growth_rows.tenants.push(tenant);
    }
    client
        .execute(
            "INSERT INTO opledger.tenant_trees (tenant, size, frontier) \
             SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::bytea[])",
            &[
                &growth_rows.tenants,
                &growth_rows.sizes,
                &growth_rows.frontiers,
            ],
        )
        .await
        .map_err(failed)?;
    client
        .execute(
            "UPDATE opledger.log_head SET tenants_size = $1",
            &[&tree_size],
        )
        .await
        .map_err(failed)?;
    tracing::info!(
        leaves = at,
        tenants = growth_rows.tenants.len(),
        "the tenants' trees were built from the log"
    );
    Ok(at as u64)
}

/// The event columns of [`codec::EVENT_COLUMNS`], of the events table aliased `e`.
fn qualified_event_columns() -> String {
    codec::EVENT_COLUMNS
        .split(", ")
        .map(|column| format!("e.{column}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Writes on each stream's row the tenant its first event names (`NULL` for none), for every
/// stream opened in the log's first `tree_size` positions.
async fn name_stream_tenants(client: &impl GenericClient, tree_size: i64) -> Result<(), String> {
    let failed = |error: tokio_postgres::Error| {
        format!(
            "cannot write the streams' tenants: {}",
            crate::describe(&error)
        )
    };
    let read = client
        .prepare(
            "SELECT position, stream_id, event_type, data FROM opledger.events \
             WHERE version = 0 AND position > $1 AND position <= $2 ORDER BY position LIMIT $3",
        )
        .await
        .map_err(failed)?;
    let write = client
        .prepare(
            "UPDATE opledger.streams AS s SET tenant = t.tenant \
             FROM UNNEST($1::bigint[], $2::text[]) AS t (stream_id, tenant) \
             WHERE s.stream_id = t.stream_id",
        )
        .await
        .map_err(failed)?;
    let mut after = 0_i64;
    loop {
        let rows = client
            .query(&read, &[&after, &tree_size, &REBUILD_BATCH])
            .await
            .map_err(failed)?;
        let Some(last) = rows.last() else {
            return Ok(());
        };
        after = last.get(0);
        let ids: Vec<i64> = rows.iter().map(|row| row.get(1)).collect();
        let tenants: Vec<Option<String>> = rows
            .iter()
            .map(|row| tenant_of(row.get(2), row.get::<_, &[u8]>(3)))
            .collect();
        client
            .execute(&write, &[&ids, &tenants])
            .await
            .map_err(failed)?;
    }
}

/// Builds the tenant trees again when they do not cover the log's tree, or were all removed
/// (see [`rebuild`]), in a transaction of its own; `None` when they already do.
pub(crate) async fn rebuild_if_behind(
    client: &mut tokio_postgres::Client,
    lock_key: i64,
) -> Result<Option<u64>, String> {
    let failed = |error: tokio_postgres::Error| {
        format!(
            "cannot read the tenants' trees: {}",
            crate::describe(&error)
        )
    };
    // Not covering the log's tree, or all removed (as deleting the SQLite ledger's rows does, it
    // asks for a rebuild from the log).
    let behind = "SELECT tenants_size IS DISTINCT FROM tree_size \
                  OR (NOT EXISTS (SELECT 1 FROM opledger.tenant_trees) \
                      AND EXISTS (SELECT 1 FROM opledger.streams WHERE tenant IS NOT NULL)) \
                  FROM opledger.log_head";
    if !client
        .query_one(behind, &[])
        .await
        .map_err(failed)?
        .get::<_, bool>(0)
    {
        return Ok(None);
    }
    let transaction = client.transaction().await.map_err(failed)?;
    transaction
        .execute("SELECT pg_advisory_xact_lock($1)", &[&lock_key])
        .await
        .map_err(failed)?;
    // Another instance may have built them while this one waited for the lock.
    if !transaction
        .query_one(behind, &[])
        .await
        .map_err(failed)?
        .get::<_, bool>(0)
    {
        return Ok(None);
    }
    let built = rebuild(&transaction).await?;
    transaction.commit().await.map_err(failed)?;
    Ok(Some(built))
}
