//! The transparency log's tree in the ledger file: the stored hashes of the Merkle tree over the
//! log (see `opledger_domain::merkle`), written by the writer in the same transaction as the
//! events they hash, and the signed checkpoints kept over it.
//!
//! The stored hashes a transaction adds have consecutive stored hash indexes (about two per
//! event), so `log_tree_runs` keeps them as runs: one row per commit (or per
//! [`MAX_RUN_HASHES`] hashes), keyed by the stored hash index of its first hash, the hashes
//! concatenated. A tree head or a proof reads O(log n) hashes, each from the run holding it (one
//! lookup by primary key). A row per hash cost the writer a B-tree insert per hash, most of
//! what the tree cost each append; a row per run costs one per commit. Files written before kept
//! a row per hash in `log_tree`: they are copied into runs when first opened with the tree on.
//! Leaf `position − 1` is the event at `position`: the writer refuses to grow the
//! tree out of step with the log, so a tree and its log always commit together. A file without a
//! tree (from before it, or written with it switched off from the start) gets one built from its
//! log when it is opened with the tree on: the tree is rebuildable from the log alone.
//!
//! It must never write a stored hash outside the transaction of the events it covers, and never
//! rewrite one: a stored hash, once committed, is what every checkpoint signed since relies on.

use opledger_domain::ids::GlobalPosition;
use opledger_domain::merkle::{self, Hash, HashReader, HASH_SIZE};
use opledger_domain::store::{EventView, RecordedEvent, StoreError};
use rusqlite::{params, Connection, OptionalExtension};

use super::codec::{EventRow, EVENT_COLUMNS};
use super::sqlite_error;
use super::tenant_trees::{self, StreamTenants, TenantAppender};
pub use opledger_store_core::marks::{LogMarks, StreamAhead};

/// The tree's tables; created in files made before the tree existed, too (older builds ignore
/// them, so a file stays readable by them).
pub(super) const CREATE_TREE_SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS log_tree (
        stored_index INTEGER PRIMARY KEY CHECK (stored_index >= 0),
        hash         BLOB    NOT NULL CHECK (length(hash) = 32)
    ) STRICT;
    CREATE TABLE IF NOT EXISTS log_tree_runs (
        first_index INTEGER PRIMARY KEY CHECK (first_index >= 0),
        hashes      BLOB    NOT NULL
                    CHECK (length(hashes) % 32 = 0 AND length(hashes) BETWEEN 32 AND 3840)
    ) STRICT;
    CREATE TABLE IF NOT EXISTS log_checkpoints (
        tree_size INTEGER PRIMARY KEY CHECK (tree_size >= 0),
        note      TEXT    NOT NULL
    ) STRICT;
";

/// Events read from the log at a time while the tree catches up with it.
const CATCH_UP_BATCH: i64 = 4_096;

/// Most hashes in one run (3,840 bytes): a row that fits in a 4 KiB page, so reading one hash
/// reads one page. A commit of a group of appends makes far fewer; a catch-up over a whole log
/// writes a row every this many.
const MAX_RUN_HASHES: usize = 120;

/// The run holding stored hash index `?1`: the one that starts at it or nearest before it.
const RUN_AT: &str = "SELECT first_index, hashes FROM log_tree_runs \
                      WHERE first_index <= ?1 ORDER BY first_index DESC LIMIT 1";

/// The stored hashes in the file, read on `connection`.
fn stored_count(connection: &Connection) -> Result<u64, StoreError> {
    let newest: Option<(i64, i64)> = connection
        .prepare_cached(
            "SELECT first_index, length(hashes) / 32 FROM log_tree_runs \
             ORDER BY first_index DESC LIMIT 1",
        )
        .and_then(|mut statement| {
            statement
                .query_row([], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()
        })
        .map_err(|error| sqlite_error("cannot read the log tree's size", error))?;
    let Some((first, count)) = newest else {
        return Ok(0);
    };
    let first = u64::try_from(first).map_err(|_| corrupt("a stored hash index is negative"))?;
    Ok(first + u64::try_from(count).unwrap_or(0))
}

/// Leaves in the tree stored in the file, read on `connection`.
pub(super) fn size(connection: &Connection) -> Result<u64, StoreError> {
    let count = stored_count(connection)?;
    if count == 0 {
        return Ok(0);
    }
    merkle::size_from_stored_count(count).ok_or_else(|| {
        corrupt(&format!(
            "the log tree holds {count} stored hashes, which no tree of whole leaves does"
        ))
    })
}

fn corrupt(reason: &str) -> StoreError {
    StoreError::Corrupt {
        reason: reason.to_owned(),
    }
}

/// Reads stored hashes by index on `connection`; the run last read is kept for the next index,
/// so the neighbouring hashes a proof or a tile asks for cost one read.
pub(super) fn read(connection: &Connection, indexes: &[u64]) -> Result<Vec<Hash>, StoreError> {
    let mut statement = connection
        .prepare_cached(RUN_AT)
        .map_err(|error| sqlite_error("cannot prepare the log tree query", error))?;
    let mut run: Option<(u64, Vec<u8>)> = None;
    indexes
        .iter()
        .map(|&index| {
            let lacks = || corrupt(&format!("the log tree lacks stored hash {index}"));
            let held = |run: &Option<(u64, Vec<u8>)>| {
                run.as_ref()
                    .and_then(|(first, hashes)| {
                        let offset = usize::try_from(index.checked_sub(*first)?).ok()?;
                        hashes.get(offset * HASH_SIZE..(offset + 1) * HASH_SIZE)
                    })
                    .map(|bytes| Hash(bytes.try_into().expect("a slice of one hash")))
            };
            if let Some(hash) = held(&run) {
                return Ok(hash);
            }
            let sql_index = i64::try_from(index)
                .map_err(|_| corrupt(&format!("stored hash index {index} is out of range")))?;
            let found: Option<(i64, Vec<u8>)> = statement
                .query_row([sql_index], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()
                .map_err(|error| sqlite_error("cannot read the log tree", error))?;
            let (first, hashes) = found.ok_or_else(lacks)?;
            let first = u64::try_from(first).map_err(|_| lacks())?;
            run = Some((first, hashes));
            held(&run).ok_or_else(lacks)
        })
        .collect()
}

/// Copies a file's tree kept a row per hash (`log_tree`, written before runs) into runs, in one
/// transaction of its own; the rows are then removed. Runs already there (written by this build,
/// then the file opened by an older one that rebuilt `log_tree` and appended beside it) give
/// way to the older build's rows, which cover everything it appended.
fn runs_from_rows(connection: &Connection) -> Result<(), StoreError> {
    let has_rows: bool = connection
        .query_row("SELECT EXISTS (SELECT 1 FROM log_tree)", [], |row| {
            row.get(0)
        })
        .map_err(|error| sqlite_error("cannot read the log tree", error))?;
    if !has_rows {
        return Ok(());
    }
    let copied = in_open_transaction(
        connection,
        "copying the log tree into runs",
        "the log tree's rows cannot be copied into runs; they are left as they are",
        || {
            connection
                .execute_batch("DELETE FROM log_tree_runs")
                .map_err(|error| sqlite_error("cannot clear the log tree's runs", error))?;
            let mut rows = connection
                .prepare("SELECT stored_index, hash FROM log_tree ORDER BY stored_index")
                .map_err(|error| sqlite_error("cannot read the log tree", error))?;
            let mut rows = rows
                .query([])
                .map_err(|error| sqlite_error("cannot read the log tree", error))?;
            let mut writer = RunWriter::new(0);
            let mut copied = 0_u64;
            while let Some(row) = rows
                .next()
                .map_err(|error| sqlite_error("cannot read the log tree", error))?
            {
                let index: i64 = row
                    .get(0)
                    .map_err(|error| sqlite_error("cannot read the log tree", error))?;
                let bytes: Vec<u8> = row
                    .get(1)
                    .map_err(|error| sqlite_error("cannot read the log tree", error))?;
                if u64::try_from(index).ok() != Some(copied) {
                    return Err(corrupt(&format!("the log tree lacks stored hash {copied}")));
                }
                let hash = <[u8; HASH_SIZE]>::try_from(bytes.as_slice())
                    .map_err(|_| corrupt(&format!("stored hash {index} is not 32 bytes")))?;
                writer.push(connection, Hash(hash))?;
                copied += 1;
            }
            writer.flush(connection)?;
            connection
                .execute_batch("DELETE FROM log_tree")
                .map_err(|error| sqlite_error("cannot remove the copied log tree rows", error))?;
            Ok(copied)
        },
    )?;
    if let Some(copied) = copied {
        tracing::info!(
            stored_hashes = copied,
            "the log tree's rows were copied into runs"
        );
    }
    Ok(())
}

/// Runs `work` in an immediate transaction of its own, as opening a file does to bring its
/// trees up to date: committed when it succeeds (`Some` of what it returns), rolled back when
/// it fails. A tree found corrupt is reported (`unusable`) and left as it is (`None`): the log
/// itself is intact, and verifying it says what is wrong with the tree.
fn in_open_transaction<T>(
    connection: &Connection,
    what: &str,
    unusable: &str,
    work: impl FnOnce() -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    connection
        .execute_batch("BEGIN IMMEDIATE")
        .map_err(|error| sqlite_error(format!("cannot start {what}"), error))?;
    match work() {
        Ok(done) => {
            connection
                .execute_batch("COMMIT")
                .map_err(|error| sqlite_error(format!("cannot commit {what}"), error))?;
            Ok(Some(done))
        }
        Err(StoreError::Corrupt { reason }) => {
            let _ = connection.execute_batch("ROLLBACK");
            tracing::warn!(%reason, "{unusable}");
            Ok(None)
        }
        Err(error) => {
            let _ = connection.execute_batch("ROLLBACK");
            Err(error)
        }
    }
}

/// Writes consecutive stored hashes as runs of at most [`MAX_RUN_HASHES`].
struct RunWriter {
    /// The stored hash index of `pending[0]`: every index below it is in the file.
    first: u64,
    /// Hashes not written yet, at consecutive stored hash indexes.
    pending: Vec<Hash>,
}

impl RunWriter {
    fn new(first: u64) -> Self {
        Self {
            first,
            pending: Vec::new(),
        }
    }

    fn push(&mut self, connection: &Connection, hash: Hash) -> Result<(), StoreError> {
        self.pending.push(hash);
        if self.pending.len() >= MAX_RUN_HASHES {
            self.flush(connection)?;
        }
        Ok(())
    }

    /// The pending hash at stored hash index `index`, if it is one.
    fn at(&self, index: u64) -> Option<Hash> {
        let offset = usize::try_from(index.checked_sub(self.first)?).ok()?;
        self.pending.get(offset).copied()
    }

    /// Writes the pending hashes as one run.
    fn flush(&mut self, connection: &Connection) -> Result<(), StoreError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        debug_assert!(self.pending.len() <= MAX_RUN_HASHES);
        let first = i64::try_from(self.first)
            .map_err(|_| corrupt("the log tree outgrew what SQLite can index"))?;
        let bytes: Vec<u8> = self.pending.iter().flat_map(|hash| hash.0).collect();
        connection
            .prepare_cached("INSERT INTO log_tree_runs (first_index, hashes) VALUES (?1, ?2)")
            .and_then(|mut statement| statement.execute(params![first, bytes]))
            .map_err(|error| sqlite_error("cannot grow the log tree", error))?;
        self.first += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }
}

/// The checkpoint kept for `size` leaves, or the newest one.
pub(super) fn kept_checkpoint(
    connection: &Connection,
    size: Option<u64>,
) -> Result<Option<(u64, String)>, StoreError> {
    let found: Option<(i64, String)> = match size {
        Some(size) => connection
            .prepare_cached("SELECT tree_size, note FROM log_checkpoints WHERE tree_size = ?1")
            .and_then(|mut statement| {
                statement
                    .query_row([i64::try_from(size).unwrap_or(i64::MAX)], |row| {
                        Ok((row.get(0)?, row.get(1)?))
                    })
                    .optional()
            }),
        None => connection
            .prepare_cached(
                "SELECT tree_size, note FROM log_checkpoints ORDER BY tree_size DESC LIMIT 1",
            )
            .and_then(|mut statement| {
                statement
                    .query_row([], |row| Ok((row.get(0)?, row.get(1)?)))
                    .optional()
            }),
    }
    .map_err(|error| sqlite_error("cannot read the kept checkpoints", error))?;
    found
        .map(|(size, note)| {
            u64::try_from(size)
                .map(|size| (size, note))
                .map_err(|_| corrupt("a kept checkpoint's size is negative"))
        })
        .transpose()
}

/// Keeps a checkpoint; the first one kept for a size stays.
pub(super) fn keep_checkpoint(
    connection: &Connection,
    size: u64,
    note: &str,
) -> Result<(), StoreError> {
    let size = i64::try_from(size).map_err(|_| StoreError::InvalidAppend {
        reason: format!("a tree of {size} leaves cannot be stored"),
    })?;
    connection
        .prepare_cached("INSERT OR IGNORE INTO log_checkpoints (tree_size, note) VALUES (?1, ?2)")
        .and_then(|mut statement| statement.execute(params![size, note]))
        .map(drop)
        .map_err(|error| sqlite_error("cannot keep the checkpoint", error))
}

/// Builds the tree of a file that has none yet (one from before the tree, or written with it
/// off from the start) from its log, in one transaction of its own: the tree is rebuildable from
/// the log. A tree that exists but is behind its log is never extended here: events it did not
/// see appended cannot be told from events inserted behind the ledger's back, so they stay out of
/// it, `opledger verify` names them, and appends are refused. (Deleting the `log_tree_runs` rows and
/// opening the file rebuilds the tree from the log as it is then: a rebuild trusts the log, and
/// checkpoints kept outside the ledger still catch what was changed before it.) A log with a
/// position missing keeps the tree up to the gap; the open goes on.
pub(super) fn catch_up_at_open(
    connection: &Connection,
    head: Option<GlobalPosition>,
) -> Result<(), StoreError> {
    runs_from_rows(connection)?;
    if size(connection)? == 0 {
        build_at_open(connection, head)?;
    }
    catch_up_tenants(connection)
}

fn build_at_open(connection: &Connection, head: Option<GlobalPosition>) -> Result<(), StoreError> {
    let caught_up = in_open_transaction(
        connection,
        "the log tree's catch-up",
        "the log tree cannot catch up with the log",
        || {
            let mut tree = TreeAppender::open(connection, None)?;
            // Another opener may have built it between the look above and this lock.
            if tree.size > 0 {
                return Ok(0);
            }
            let added = tree.catch_up(head)?;
            tree.finish()?;
            Ok(added)
        },
    )?;
    if let Some(added @ 1..) = caught_up {
        tracing::info!(added, "the log tree caught up with the log");
    }
    Ok(())
}

/// Brings the tenant trees up to the log's tree (built from its leaves when they were never
/// built), in one transaction of its own; see `tenant_trees.rs`.
fn catch_up_tenants(connection: &Connection) -> Result<(), StoreError> {
    let caught_up = in_open_transaction(
        connection,
        "the tenant trees' catch-up",
        "the tenant trees cannot catch up with the log; checkpoints sign the log's tree alone",
        || {
            let log_size = size(connection)?;
            let Some(covered) = tenant_trees::behind(connection, log_size)? else {
                return Ok(0);
            };
            let mut streams = StreamTenants::default();
            let mut tenants = TenantAppender::open(connection, &mut streams, covered)?
                .expect("`behind` left the trees covering `covered` leaves");
            let mut at = covered;
            while at < log_size {
                let batch = read_after(connection, at)?;
                let Some(last) = batch.last() else { break };
                let last = last.position.value();
                for event in batch
                    .iter()
                    .take_while(|event| event.position.value() <= log_size)
                {
                    if event.position.value() != at + 1 {
                        return Err(corrupt(&format!(
                            "position {} is missing from the log its tree covers",
                            at + 1
                        )));
                    }
                    let view = event.view();
                    tenants.append(&view, merkle::leaf_hash(&view))?;
                    at += 1;
                }
                if last >= log_size {
                    break;
                }
            }
            tenants.finish()?;
            Ok(at - covered)
        },
    )?;
    if let Some(added @ 1..) = caught_up {
        tracing::info!(added, "the tenant trees caught up with the log");
    }
    Ok(())
}

/// Grows the tree inside the writer's transaction: one leaf per event, in position order, and
/// each event's tenant's tree beside it when the tenant trees are in step.
pub(super) struct TreeAppender<'c> {
    connection: &'c Connection,
    size: u64,
    /// The hashes made by this transaction and not written yet; the next leaves' subtrees read
    /// them from here.
    runs: RunWriter,
    tenants: Option<TenantAppender<'c>>,
}

impl<'c> TreeAppender<'c> {
    /// The tree as stored, read under the write transaction's lock; with `streams`, the tenant
    /// trees grow too (when they cover the same leaves).
    pub(super) fn open(
        connection: &'c Connection,
        streams: Option<&'c mut StreamTenants>,
    ) -> Result<Self, StoreError> {
        let size = size(connection)?;
        let tenants = match streams {
            Some(streams) => TenantAppender::open(connection, streams, size)?,
            None => None,
        };
        Ok(Self {
            size,
            connection,
            runs: RunWriter::new(merkle::stored_hash_index(0, size)),
            tenants,
        })
    }

    /// Ends the transaction's growth: inserts the hashes it made and writes the tenant trees it
    /// grew. Must run before the transaction commits.
    pub(super) fn finish(mut self) -> Result<(), StoreError> {
        self.runs.flush(self.connection)?;
        match self.tenants {
            Some(tenants) => tenants.finish(),
            None => Ok(()),
        }
    }

    /// Appends the leaf of `event`, which must be the event at position `size + 1`.
    pub(super) fn append(&mut self, event: &EventView<'_>) -> Result<(), StoreError> {
        let expected = self.size + 1;
        if event.position.value() != expected {
            return Err(corrupt(&format!(
                "the log tree has {} leaves, so its next leaf is the event at position {expected}, \
                 but the event being added is at position {}: the ledger file was changed behind \
                 opledger's back; run `opledger verify`",
                self.size, event.position
            )));
        }
        let leaf = merkle::leaf_hash(event);
        let hashes = merkle::hashes_to_store(self.size, leaf, self)
            .map_err(|error| corrupt(&error.to_string()))?;
        debug_assert_eq!(
            self.runs.first + self.runs.pending.len() as u64,
            merkle::stored_hash_index(0, self.size),
            "a leaf's hashes follow the previous leaf's"
        );
        for hash in hashes {
            self.runs.push(self.connection, hash)?;
        }
        self.size += 1;
        if let Some(tenants) = self.tenants.as_mut() {
            tenants.append(event, leaf)?;
        }
        Ok(())
    }

    /// Adds the leaves of the events stored after the tree's last leaf, up to and including
    /// `head`: a file from before the tree, or written with it switched off. Stops at the first
    /// position missing from the log (the tree cannot cover an event that is not there) and says
    /// so in the error.
    pub(super) fn catch_up(&mut self, head: Option<GlobalPosition>) -> Result<u64, StoreError> {
        let head = head.map_or(0, GlobalPosition::value);
        let before = self.size;
        while self.size < head {
            let batch = read_after(self.connection, self.size)?;
            if batch.is_empty() {
                break;
            }
            for event in &batch {
                self.append(&event.view())?;
            }
        }
        Ok(self.size - before)
    }
}

/// Up to [`CATCH_UP_BATCH`] events after `position`, in position order.
fn read_after(connection: &Connection, position: u64) -> Result<Vec<RecordedEvent>, StoreError> {
    let sql = format!(
        "SELECT {EVENT_COLUMNS} FROM events WHERE position > ?1 ORDER BY position LIMIT ?2"
    );
    let after = i64::try_from(position).unwrap_or(i64::MAX);
    let mut statement = connection
        .prepare_cached(&sql)
        .map_err(|error| sqlite_error("cannot prepare the log read", error))?;
    let rows = statement
        .query_map(params![after, CATCH_UP_BATCH], EventRow::from_row)
        .map_err(|error| sqlite_error("cannot read the log", error))?;
    rows.map(|row| {
        row.map_err(|error| sqlite_error("cannot read the log", error))?
            .decode()
    })
    .collect()
}

impl HashReader for TreeAppender<'_> {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, merkle::TlogError> {
        let missing: Vec<u64> = indexes
            .iter()
            .copied()
            .filter(|&index| self.runs.at(index).is_none())
            .collect();
        let mut from_file = read(self.connection, &missing)
            .map_err(|error| merkle::TlogError::InvalidInput(error.to_string()))?
            .into_iter();
        Ok(indexes
            .iter()
            .map(|&index| match self.runs.at(index) {
                Some(hash) => hash,
                None => from_file
                    .next()
                    .expect("one hash read from the file per index missing from memory"),
            })
            .collect())
    }
}

/// Most streams [`log_marks`] lists whose recorded last version is ahead of their events.
const MAX_STREAMS_AHEAD: i64 = 1_000;

/// What the file itself remembers of its log beside the events, read on `connection`: the
/// highest position ever handed out and each stream's last version. Removing events with plain
/// SQL leaves both behind, so they show a removed tail that the events alone cannot.
pub(super) fn log_marks(connection: &Connection) -> Result<LogMarks, StoreError> {
    let sequence: Option<i64> = connection
        .query_row(
            "SELECT seq FROM sqlite_sequence WHERE name = 'events'",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(|error| sqlite_error("cannot read the log's sequence", error))?;
    let mut statement = connection
        .prepare(
            "SELECT name, last_version, stored FROM ( \
                 SELECT s.name, s.last_version, \
                        (SELECT MAX(e.version) FROM events e WHERE e.stream_id = s.stream_id) AS stored \
                 FROM streams s) \
             WHERE stored IS NULL OR stored < last_version ORDER BY name LIMIT ?1",
        )
        .map_err(|error| sqlite_error("cannot prepare the streams' versions query", error))?;
    let rows = statement
        .query_map([MAX_STREAMS_AHEAD], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, Option<i64>>(2)?,
            ))
        })
        .map_err(|error| sqlite_error("cannot read the streams' versions", error))?;
    let mut streams_ahead = Vec::new();
    for row in rows {
        let (name, last, stored) =
            row.map_err(|error| sqlite_error("cannot read the streams' versions", error))?;
        streams_ahead.push(StreamAhead {
            stream: name,
            last_version: u64::try_from(last).unwrap_or(0),
            newest_stored: stored.and_then(|stored| u64::try_from(stored).ok()),
        });
    }
    Ok(LogMarks {
        highest_position: sequence.and_then(|sequence| u64::try_from(sequence).ok()),
        streams_ahead,
    })
}
