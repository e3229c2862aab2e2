//! The floor of a rebuild: what SQLite alone costs to write a rebuild's rows.
//!
//! A rebuild reads and decodes the log, folds it and builds rows on some threads, and SQLite
//! writes them on one ([`super::rebuild`]). How fast the rest could ever be made, the rebuild
//! cannot go below the time SQLite takes to write the same rows into the same layout. This
//! measures that time: the rows of a finished rebuild are read into memory first ([`FloorRows`]),
//! then written into a fresh file made exactly as a rebuild makes its own (the same tables, page
//! size, page cache, no journal, exclusive lock, transactions of [`REBUILD_COMMIT_EVENTS`] rows),
//! each table's rows in the order the rebuild left them, and the secondary indexes are created
//! at the end by the same statements. No log is read, nothing decoded or folded: the time per
//! event is the layout's floor on this machine. It is a measurement, not a way to build read
//! models (`opledger bench projections --floor`).

use std::path::Path;

use rusqlite::types::Value;
use rusqlite::{Connection, OpenFlags};

use super::rebuild::{REBUILD_CACHE_KIB, REBUILD_COMMIT_EVENTS, REBUILD_PAGE_SIZE};
use super::{schema, ReadModelError};

/// The tables a rebuild writes, in the order the floor writes them: the big ones first, as the
/// rebuild's rows mostly are, then the few rows it writes at the end.
const FLOOR_TABLES: [&str; 12] = [
    "operations",
    "operation_terms",
    "work_queue",
    "review_queue",
    "duplicate_detections",
    "possible_duplicate_intents",
    "attempts",
    "sources",
    "external_ids",
    "counters",
    "gauges",
    "checkpoint",
];

/// Most rows the floor holds in memory: ~1 KiB each with their values (a 1M-event rebuild's
/// 1,002,006 rows peaked at ~1 GB), so at most ~2 GiB. A rebuild of up to ~2M events fits; the
/// floor is a per-event figure, which a longer log does not change much.
pub const MAX_FLOOR_ROWS: usize = 2_000_000;

/// The layout the floor writes: today's, or a candidate for a narrower one, measured before
/// anyone writes its migration. (Schema version 5's request hash was measured this way first.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FloorLayout {
    /// No `operations_by_created`: what that index costs to build.
    pub without_created_index: bool,
}

impl FloorLayout {
    /// Today's layout, as a rebuild writes it.
    pub const CURRENT: Self = Self {
        without_created_index: false,
    };
}

/// Every row of a rebuilt file, held in memory by table, ready to be written again.
pub struct FloorRows {
    tables: Vec<TableRows>,
}

struct TableRows {
    name: &'static str,
    columns: usize,
    rows: Vec<Vec<Value>>,
}

/// What a floor's write did: the sorter threads SQLite took (it caps the setting at what it was
/// compiled for), and the wall time of each step: each table's inserts (`insert <table>`) and
/// each index's creation (`index <name>`), in the order they ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FloorWritten {
    /// Sorter helper threads SQLite took.
    pub sorter_threads: i64,
    /// Each step and its wall time.
    pub steps: Vec<(String, std::time::Duration)>,
}

/// Where the floor's time went, phase by phase; the caller measures each (wall and CPU time)
/// from the calls to its `phase` callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloorPhase {
    /// The rows are about to be inserted.
    Inserting,
    /// The rows are in; the secondary indexes are about to be created.
    CreatingIndexes,
    /// The indexes exist; the file is about to be committed, closed and fsynced.
    Closing,
    /// Done.
    Done,
}

impl FloorRows {
    /// Reads every row of the rebuilt file at `path` (left as it is): a rowid table's rows in
    /// rowid order, the order the rebuild inserted them; a `WITHOUT ROWID` table's in key order,
    /// the order the rebuild appends them.
    pub fn load(path: &Path) -> Result<Self, ReadModelError> {
        Self::load_at_most(path, MAX_FLOOR_ROWS)
    }

    /// [`FloorRows::load`] holding at most `max_rows` rows; a file with more is refused.
    pub fn load_at_most(path: &Path, max_rows: usize) -> Result<Self, ReadModelError> {
        let connection = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|error| ReadModelError::sqlite(format!("opening `{}`", path.display()), error))?;
        let mut tables = Vec::with_capacity(FLOOR_TABLES.len());
        for name in FLOOR_TABLES {
            let context = || format!("reading the rows of `{name}`");
            let mut statement = connection
                .prepare(&format!("SELECT * FROM {name}"))
                .map_err(|error| ReadModelError::sqlite(context(), error))?;
            let columns = statement.column_count();
            let held: usize = tables
                .iter()
                .map(|table: &TableRows| table.rows.len())
                .sum();
            let mut rows = Vec::new();
            let mut read = statement
                .query([])
                .map_err(|error| ReadModelError::sqlite(context(), error))?;
            while let Some(row) = read
                .next()
                .map_err(|error| ReadModelError::sqlite(context(), error))?
            {
                if held + rows.len() >= max_rows {
                    return Err(ReadModelError::InvalidQuery {
                        reason: format!(
                            "`{}` has more than {max_rows} rows, the most the floor holds in \
                             memory (MAX_FLOOR_ROWS is {MAX_FLOOR_ROWS}); measure the floor on a \
                             smaller ledger (~2M events or fewer)",
                            path.display()
                        ),
                    });
                }
                rows.push(
                    (0..columns)
                        .map(|column| row.get::<_, Value>(column))
                        .collect::<Result<Vec<Value>, _>>()
                        .map_err(|error| ReadModelError::sqlite(context(), error))?,
                );
            }
            drop(read);
            tables.push(TableRows {
                name,
                columns,
                rows,
            });
        }
        Ok(Self { tables })
    }

    /// Rows held, all tables together.
    pub fn rows(&self) -> usize {
        self.tables.iter().map(|table| table.rows.len()).sum()
    }

    /// Writes the rows into a new file at `target` (which must not exist) as a rebuild writes its
    /// own, then creates the secondary indexes with `sorter_threads` helper threads for SQLite's
    /// sorter (`PRAGMA threads`), calling `phase` at each phase. The indexes are the rebuild's
    /// statements, one at a time so that each is timed.
    pub fn write(
        &self,
        target: &Path,
        layout: FloorLayout,
        sorter_threads: u32,
        mut phase: impl FnMut(FloorPhase),
    ) -> Result<FloorWritten, ReadModelError> {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(target)
            .map_err(|source| ReadModelError::Create {
                path: target.to_path_buf(),
                source,
            })?;
        let connection = schema::create_for_rebuild(target, REBUILD_PAGE_SIZE, REBUILD_CACHE_KIB)?;
        let run = |sql: &str| {
            connection
                .execute_batch(sql)
                .map_err(|error| ReadModelError::sqlite(format!("floor: `{sql}`"), error))
        };
        phase(FloorPhase::Inserting);
        run("BEGIN IMMEDIATE")?;
        let mut since_commit = 0;
        let mut steps = Vec::new();
        for table in &self.tables {
            let started = std::time::Instant::now();
            let placeholders = (1..=table.columns)
                .map(|column| format!("?{column}"))
                .collect::<Vec<_>>()
                .join(", ");
            let mut statement = connection
                .prepare(&format!(
                    "INSERT INTO {} VALUES ({placeholders})",
                    table.name
                ))
                .map_err(|error| ReadModelError::sqlite("floor: preparing an insert", error))?;
            for row in &table.rows {
                statement
                    .execute(rusqlite::params_from_iter(row.iter()))
                    .map_err(|error| {
                        ReadModelError::sqlite(
                            format!("floor: inserting into {}", table.name),
                            error,
                        )
                    })?;
                since_commit += 1;
                if since_commit == REBUILD_COMMIT_EVENTS {
                    run("COMMIT; BEGIN IMMEDIATE")?;
                    since_commit = 0;
                }
            }
            steps.push((format!("insert {}", table.name), started.elapsed()));
        }
        phase(FloorPhase::CreatingIndexes);
        let took = schema::set_sorter_threads(&connection, sorter_threads)?;
        let creates = [
            schema::CREATE_OPERATIONS_INDEXES_V5,
            schema::CREATE_INDEXES_V1,
            schema::CREATE_ID_INDEXES_V1,
            schema::CREATE_INDEXES_V3,
            schema::CREATE_INDEXES_V6,
        ];
        for create in creates.iter().flat_map(|batch| batch.split_inclusive(';')) {
            let Some(name) = create.split_whitespace().nth(2) else {
                continue;
            };
            if layout.without_created_index && name == "operations_by_created" {
                continue;
            }
            let started = std::time::Instant::now();
            run(create)?;
            steps.push((format!("index {name}"), started.elapsed()));
        }
        phase(FloorPhase::Closing);
        run("COMMIT")?;
        connection
            .close()
            .map_err(|(_, error)| ReadModelError::sqlite("closing the floor's file", error))?;
        std::fs::File::open(target)
            .and_then(|file| file.sync_all())
            .map_err(|source| ReadModelError::Create {
                path: target.to_path_buf(),
                source,
            })?;
        phase(FloorPhase::Done);
        Ok(FloorWritten {
            sorter_threads: took,
            steps,
        })
    }
}
