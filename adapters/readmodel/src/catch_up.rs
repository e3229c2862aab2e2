//! Bounded catch-up and comparison of read-model files, for one-shot tools (the audit commands,
//! `replay --verify`) that must bring the read models up to the log's head and then stop, rather
//! than follow the log forever as [`super::ReadModelRunner`] does.
//!
//! [`catch_up`] must never apply past the target it was given, so two files caught up to the same
//! target hold the same rows. [`compare_files`] only reads: it opens both files read-only.

use std::path::Path;

use opledger_domain::ids::GlobalPosition;
use opledger_domain::store::{EventStore, LogStart, StoreError};
use rusqlite::{Connection, OpenFlags};

use super::{ReadModelError, ReadModels, MAX_BATCH_EVENTS};

/// Where a [`catch_up`] stands: reported after every committed batch and at the end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CatchUpProgress {
    /// The position it catches up to.
    pub target: Option<GlobalPosition>,
    /// The checkpoint now.
    pub checkpoint: Option<GlobalPosition>,
    /// Events applied by this catch-up so far.
    pub applied: u64,
    /// Events the catch-up had to apply when it started (target − checkpoint, in positions).
    pub behind: u64,
}

/// Applies the log to `read_models` from their checkpoint up to `target` (the log's head when it
/// started, if `None`), in bounded batches, and stops. Events after the target are never applied.
/// `progress` is called after each committed batch.
pub async fn catch_up<S: EventStore>(
    store: &S,
    read_models: &ReadModels,
    target: Option<GlobalPosition>,
    mut progress: impl FnMut(&CatchUpProgress),
) -> Result<CatchUpProgress, ReadModelError> {
    let head_requested = target.is_none();
    let target = match target {
        Some(target) => Some(target),
        None => store.head_position().await?,
    };
    check_ledger(store, read_models).await?;
    let mut checkpoint = read_models.checkpoint().await?;
    // Caught up to the head but past it: these read models describe another log.
    if head_requested && checkpoint > target {
        return Err(ReadModelError::AheadOfLedger {
            checkpoint: checkpoint.map_or(0, GlobalPosition::value),
            head: target.map_or(0, GlobalPosition::value),
        });
    }
    let value = |position: Option<GlobalPosition>| position.map_or(0, GlobalPosition::value);
    let mut report = CatchUpProgress {
        target,
        checkpoint,
        applied: 0,
        behind: value(target).saturating_sub(value(checkpoint)),
    };
    while checkpoint < target {
        let start = checkpoint.map_or(LogStart::Beginning, LogStart::After);
        let mut batch = store.read_all(start, MAX_BATCH_EVENTS).await?;
        // The target bounds the run: later events wait for the next catch-up.
        batch.retain(|event| Some(event.position) <= target);
        if batch.is_empty() {
            return Err(StoreError::Corrupt {
                reason: format!(
                    "the log reaches {target:?} but nothing after {start:?} can be read"
                ),
            }
            .into());
        }
        let outcome = read_models.apply_batch(batch).await?;
        // A checkpoint that did not move would loop forever; the store promised events after it.
        if outcome.checkpoint <= checkpoint {
            return Err(ReadModelError::Corrupt {
                reason: format!("the checkpoint stayed at {checkpoint:?} after a batch"),
            });
        }
        checkpoint = outcome.checkpoint;
        report.checkpoint = checkpoint;
        report.applied += outcome.applied as u64;
        progress(&report);
    }
    Ok(report)
}

/// Checks that `read_models` belong to `store`'s ledger (see
/// [`super::ReadModelStore::check_ledger_identity`]), reading only the log's first event: what a
/// start-up that leaves the catching up to the runner checks before serving.
pub async fn check_ledger<S: EventStore>(
    store: &S,
    read_models: &ReadModels,
) -> Result<(), ReadModelError> {
    let first = store
        .read_all(LogStart::Beginning, 1)
        .await?
        .first()
        .map(|event| event.event_id);
    read_models
        .call(move |store| store.check_ledger_identity(first))
        .await
}

/// How one table differs between two read-model files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableDifference {
    /// The table.
    pub table: String,
    /// Rows in the first file: `None` when the table is missing there.
    pub left_rows: Option<u64>,
    /// Rows in the second file: `None` when the table is missing there.
    pub right_rows: Option<u64>,
    /// Distinct rows of the first file that the second lacks.
    pub only_left: u64,
    /// Distinct rows of the second file that the first lacks.
    pub only_right: u64,
}

/// Compares two read-model files table by table (every table, the checkpoint included) and
/// returns the tables that differ; empty when they hold the same rows. Both files are opened
/// read-only; the comparison runs inside SQLite, so memory stays bounded whatever the sizes.
/// Blocking: call it from a blocking thread.
pub fn compare_files(left: &Path, right: &Path) -> Result<Vec<TableDifference>, ReadModelError> {
    let connection = open_attached(left, right)?;
    let left_tables = table_names(&connection, "main")?;
    let right_tables = table_names(&connection, "other")?;
    let mut all: Vec<&String> = left_tables.iter().chain(right_tables.iter()).collect();
    all.sort();
    all.dedup();
    let mut differences = Vec::new();
    for table in all {
        let in_left = left_tables.contains(table);
        let in_right = right_tables.contains(table);
        if let Some(difference) = compare_table(&connection, table, in_left, in_right)? {
            differences.push(difference);
        }
    }
    Ok(differences)
}

/// Opens `left` read-only as `main`, with `right` attached as `other`.
fn open_attached(left: &Path, right: &Path) -> Result<Connection, ReadModelError> {
    let open = |path: &Path| {
        Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|error| {
            ReadModelError::sqlite(format!("opening `{}` to compare", path.display()), error)
        })
    };
    let connection = open(left)?;
    // Attaching by a bound parameter keeps any character of the path out of the SQL text.
    let right_text = right.to_str().ok_or_else(|| ReadModelError::InvalidQuery {
        reason: format!("`{}` is not a UTF-8 path", right.display()),
    })?;
    connection
        .execute("ATTACH DATABASE ?1 AS other", [right_text])
        .map_err(|error| ReadModelError::sqlite("attaching the file to compare with", error))?;
    Ok(connection)
}

/// The tables of `schema` to compare, by name: all but the ledger's identity.
fn table_names(connection: &Connection, schema: &str) -> Result<Vec<String>, ReadModelError> {
    let mut statement = connection
        .prepare(&format!(
            "SELECT name FROM {schema}.sqlite_schema
             WHERE type = 'table' AND name <> 'ledger_identity' ORDER BY name"
        ))
        .map_err(|error| ReadModelError::sqlite("listing tables", error))?;
    let names = statement
        .query_map([], |row| row.get::<_, String>(0))
        .map_err(|error| ReadModelError::sqlite("listing tables", error))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| ReadModelError::sqlite("listing tables", error))?;
    Ok(names)
}

/// How `table` differs between the two files, or `None` when both hold the same rows.
fn compare_table(
    connection: &Connection,
    table: &str,
    in_left: bool,
    in_right: bool,
) -> Result<Option<TableDifference>, ReadModelError> {
    // Table names come from the files' own schema; quoting keeps them names, not SQL.
    let quoted = format!("\"{}\"", table.replace('"', "\"\""));
    let count = |query: &str| count_of(connection, query);
    let left_rows = if in_left {
        Some(count(&format!("SELECT count(*) FROM main.{quoted}"))?)
    } else {
        None
    };
    let right_rows = if in_right {
        Some(count(&format!("SELECT count(*) FROM other.{quoted}"))?)
    } else {
        None
    };
    let (only_left, only_right) = if in_left && in_right {
        (
            count(&format!(
                "SELECT count(*) FROM (SELECT * FROM main.{quoted} EXCEPT SELECT * FROM other.{quoted})"
            ))?,
            count(&format!(
                "SELECT count(*) FROM (SELECT * FROM other.{quoted} EXCEPT SELECT * FROM main.{quoted})"
            ))?,
        )
    } else {
        (left_rows.unwrap_or(0), right_rows.unwrap_or(0))
    };
    if left_rows == right_rows && only_left == 0 && only_right == 0 {
        return Ok(None);
    }
    Ok(Some(TableDifference {
        table: table.to_owned(),
        left_rows,
        right_rows,
        only_left,
        only_right,
    }))
}

/// The single count `query` returns.
fn count_of(connection: &Connection, query: &str) -> Result<u64, ReadModelError> {
    let value: i64 = connection
        .query_row(query, [], |row| row.get(0))
        .map_err(|error| ReadModelError::sqlite("comparing tables", error))?;
    super::sql::count_from(value)
}

/// Whether `path` is a read-model file (it has the read models' checkpoint and operations
/// tables), checked read-only. Tools that replace a read-model file call this first, so a mistaken
/// `--read-models` pointing at a ledger or any other database is refused instead of overwritten.
/// Blocking: call it from a blocking thread.
pub fn is_read_model_file(path: &Path) -> Result<bool, ReadModelError> {
    let connection = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|error| {
        ReadModelError::sqlite(format!("opening `{}` to check it", path.display()), error)
    })?;
    let tables: i64 = connection
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name IN ('checkpoint', 'operations')",
            [],
            |row| row.get(0),
        )
        // A file that is not a database at all is not a read-model file either.
        .unwrap_or(0);
    Ok(tables == 2)
}
