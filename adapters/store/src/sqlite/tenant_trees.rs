//! The tenants' trees in the ledger file (see `opledger_domain::merkle::tenants`): each tenant's
//! tree as its frontier (size and the roots of its perfect subtrees), grown by the writer in the
//! transaction of the events they cover, beside the log's tree.
//!
//! `tenant_trees` holds one row per tenant; `tenant_trees_cover` one row naming how many leaves
//! of the log's tree they cover. The writer grows them only when they cover exactly the log's
//! tree, and rewrites each tenant's row once per group commit, however many of its events the
//! group holds. Trees that cover less (a file from before them, or written with the tree off) are
//! caught up from the log when the file is opened with the tree on; they are derived from the
//! log's leaves, so a rebuild trusts nothing the log's tree does not. A checkpoint signs their
//! map only when they cover the log's tree exactly ([`tenant_heads`]).
//!
//! It must never write a tenant's row outside the transaction of the events it covers.

use std::collections::HashMap;
use std::sync::Arc;

use opledger_domain::merkle::tenants::{tenant_of_first_event, Frontier, TenantMap};
use opledger_domain::merkle::{Hash, TenantHeads};
use opledger_domain::store::{EventView, StoreError};
use rusqlite::{params, Connection, OptionalExtension};

use super::sqlite_error;

/// The tenant trees' tables; created in older files too (older builds ignore them).
pub(super) const CREATE_TENANT_SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS tenant_trees (
        tenant   TEXT    PRIMARY KEY,
        size     INTEGER NOT NULL CHECK (size > 0),
        frontier BLOB    NOT NULL
    ) STRICT, WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS tenant_trees_cover (
        only     INTEGER PRIMARY KEY CHECK (only = 1),
        log_size INTEGER NOT NULL CHECK (log_size >= 0)
    ) STRICT;
";

/// Most streams whose tenant the writer remembers between commits (a stream's tenant never
/// changes, so a remembered one is never stale); emptied when full, a miss costs one read of the
/// stream's first event. About 100 bytes each.
const MAX_REMEMBERED_STREAMS: usize = 65_536;

fn corrupt(reason: String) -> StoreError {
    StoreError::Corrupt { reason }
}

/// Each stream's tenant, remembered across commits by the writer.
#[derive(Debug)]
pub(super) struct StreamTenants {
    /// Made at its full size once: growing it rehashed every entry, a pause of the writer's.
    known: HashMap<Box<str>, Option<Arc<str>>>,
}

impl Default for StreamTenants {
    fn default() -> Self {
        Self {
            known: HashMap::with_capacity(MAX_REMEMBERED_STREAMS),
        }
    }
}

impl StreamTenants {
    /// The tenant of `event`'s stream: from the event itself when it is the stream's first, else
    /// from the stream's first event in the file.
    fn of(
        &mut self,
        connection: &Connection,
        event: &EventView<'_>,
    ) -> Result<Option<Arc<str>>, StoreError> {
        if let Some(known) = self.known.get(event.stream) {
            return Ok(known.clone());
        }
        let tenant = if event.version.value() == 0 {
            tenant_of_first_event(event.event_type, event.data)
        } else {
            let first: Option<(String, Vec<u8>)> = connection
                .prepare_cached(
                    "SELECT e.event_type, e.data FROM events e JOIN streams s \
                     ON e.stream_id = s.stream_id WHERE s.name = ?1 AND e.version = 0",
                )
                .and_then(|mut statement| {
                    statement
                        .query_row([event.stream], |row| Ok((row.get(0)?, row.get(1)?)))
                        .optional()
                })
                .map_err(|error| sqlite_error("cannot read a stream's first event", error))?;
            first.and_then(|(event_type, data)| tenant_of_first_event(&event_type, &data))
        };
        let tenant: Option<Arc<str>> = tenant.map(Arc::from);
        if self.known.len() >= MAX_REMEMBERED_STREAMS {
            self.known.clear();
        }
        self.known.insert(event.stream.into(), tenant.clone());
        Ok(tenant)
    }
}

/// The log size the tenant trees cover, if they were ever built.
fn cover(connection: &Connection) -> Result<Option<u64>, StoreError> {
    let covered: Option<i64> = connection
        .prepare_cached("SELECT log_size FROM tenant_trees_cover WHERE only = 1")
        .and_then(|mut statement| statement.query_row([], |row| row.get(0)).optional())
        .map_err(|error| sqlite_error("cannot read what the tenant trees cover", error))?;
    covered
        .map(|size| {
            u64::try_from(size)
                .map_err(|_| corrupt("the tenant trees cover a negative size".into()))
        })
        .transpose()
}

fn frontier_of(tenant: &str, size: i64, bytes: &[u8]) -> Result<Frontier, StoreError> {
    u64::try_from(size)
        .ok()
        .and_then(|size| Frontier::from_bytes(size, bytes))
        .ok_or_else(|| {
            corrupt(format!(
                "the tree of tenant `{tenant}` ({size} leaves) is not stored whole"
            ))
        })
}

/// Grows the tenant trees inside the writer's transaction, beside the log's tree.
pub(super) struct TenantAppender<'c> {
    connection: &'c Connection,
    streams: &'c mut StreamTenants,
    /// The trees grown by this transaction (each read first when it has one).
    trees: HashMap<Arc<str>, Frontier>,
    covered: u64,
}

impl<'c> TenantAppender<'c> {
    /// The tenant trees, when they cover exactly the `log_size` leaves of the log's tree; `None`
    /// when they do not (they are then caught up when the file is next opened).
    pub(super) fn open(
        connection: &'c Connection,
        streams: &'c mut StreamTenants,
        log_size: u64,
    ) -> Result<Option<Self>, StoreError> {
        if cover(connection)? != Some(log_size) {
            return Ok(None);
        }
        Ok(Some(Self {
            connection,
            streams,
            trees: HashMap::new(),
            covered: log_size,
        }))
    }

    /// Appends `event` (whose leaf hash in the log's tree is `leaf`, at leaf `covered`) to its
    /// tenant's tree, if it has a tenant.
    pub(super) fn append(&mut self, event: &EventView<'_>, leaf: Hash) -> Result<(), StoreError> {
        debug_assert_eq!(event.position.value(), self.covered + 1);
        self.covered += 1;
        let Some(tenant) = self.streams.of(self.connection, event)? else {
            return Ok(());
        };
        if !self.trees.contains_key(&tenant) {
            let stored: Option<(i64, Vec<u8>)> = self
                .connection
                .prepare_cached("SELECT size, frontier FROM tenant_trees WHERE tenant = ?1")
                .and_then(|mut statement| {
                    statement
                        .query_row([&*tenant], |row| Ok((row.get(0)?, row.get(1)?)))
                        .optional()
                })
                .map_err(|error| sqlite_error("cannot read a tenant's tree", error))?;
            let frontier = match stored {
                Some((size, bytes)) => frontier_of(&tenant, size, &bytes)?,
                None => Frontier::new(),
            };
            self.trees.insert(Arc::clone(&tenant), frontier);
        }
        let tree = self
            .trees
            .get_mut(&tenant)
            .expect("read or made just above");
        tree.push(opledger_domain::merkle::tenants::tenant_leaf_hash(
            event.position.value(),
            leaf,
        ));
        Ok(())
    }

    /// Writes the trees this transaction grew, once each, and the size they now cover.
    pub(super) fn finish(self) -> Result<(), StoreError> {
        let mut statement = self
            .connection
            .prepare_cached(
                "INSERT INTO tenant_trees (tenant, size, frontier) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (tenant) DO UPDATE SET size = excluded.size, frontier = excluded.frontier",
            )
            .map_err(|error| sqlite_error("cannot prepare the tenant tree write", error))?;
        for (tenant, tree) in &self.trees {
            let size = i64::try_from(tree.size())
                .map_err(|_| corrupt("a tenant's tree outgrew SQLite".into()))?;
            statement
                .execute(params![&**tenant, size, tree.to_bytes()])
                .map_err(|error| sqlite_error("cannot grow a tenant's tree", error))?;
        }
        set_cover(self.connection, self.covered)
    }
}

fn set_cover(connection: &Connection, log_size: u64) -> Result<(), StoreError> {
    let size = i64::try_from(log_size).map_err(|_| corrupt("the log outgrew SQLite".into()))?;
    connection
        .prepare_cached(
            "INSERT INTO tenant_trees_cover (only, log_size) VALUES (1, ?1) \
             ON CONFLICT (only) DO UPDATE SET log_size = excluded.log_size",
        )
        .and_then(|mut statement| statement.execute([size]))
        .map(drop)
        .map_err(|error| sqlite_error("cannot record what the tenant trees cover", error))
}

/// Makes the tenant trees cover nothing yet (before a rebuild from the log), inside the caller's
/// transaction.
pub(super) fn reset(connection: &Connection) -> Result<(), StoreError> {
    connection
        .execute_batch("DELETE FROM tenant_trees")
        .map_err(|error| sqlite_error("cannot clear the tenant trees", error))?;
    set_cover(connection, 0)
}

/// Whether the tenant trees must be caught up (or rebuilt) to cover `log_size` leaves: `Some`
/// with the size they cover now, after clearing trees that cannot be extended.
pub(super) fn behind(connection: &Connection, log_size: u64) -> Result<Option<u64>, StoreError> {
    match cover(connection)? {
        Some(covered) if covered == log_size => Ok(None),
        Some(covered) if covered < log_size => Ok(Some(covered)),
        // Never built, or covering more than the log's tree (which a rebuilt log tree can do):
        // built again from the first leaf.
        _ => {
            reset(connection)?;
            Ok(Some(0))
        }
    }
}

/// Every tenant's head and the log size they cover, read in one transaction; `None` when they do
/// not cover the log's tree exactly (a file being caught up, or written with the tree off).
pub(super) fn tenant_heads(connection: &Connection) -> Result<Option<TenantHeads>, StoreError> {
    connection
        .execute_batch("BEGIN")
        .map_err(|error| sqlite_error("cannot start reading the tenant trees", error))?;
    let read = read_heads(connection);
    let _ = connection.execute_batch("COMMIT");
    read
}

fn read_heads(connection: &Connection) -> Result<Option<TenantHeads>, StoreError> {
    let log_size = super::tree::size(connection)?;
    if cover(connection)? != Some(log_size) {
        return Ok(None);
    }
    let mut statement = connection
        .prepare_cached("SELECT tenant, size, frontier FROM tenant_trees")
        .map_err(|error| sqlite_error("cannot prepare the tenant trees' read", error))?;
    let rows = statement
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, Vec<u8>>(2)?,
            ))
        })
        .map_err(|error| sqlite_error("cannot read the tenant trees", error))?;
    let mut heads = Vec::new();
    for row in rows {
        let (tenant, size, bytes) =
            row.map_err(|error| sqlite_error("cannot read the tenant trees", error))?;
        let head = frontier_of(&tenant, size, &bytes)?.head();
        heads.push((tenant, head));
    }
    Ok(Some(TenantHeads {
        log_size,
        map: TenantMap::new(heads),
    }))
}
