//! Opening a read-model file: connection settings, the schema and its version.
//!
//! As with the event store's file, a file is read before it is changed: one from a newer opledger
//! or one another program created is refused and left as it was. Then it is switched to WAL
//! (queries never block the runner's commits) with `synchronous=FULL` (a committed checkpoint
//! survives power loss, so a restart never re-applies what it already holds), and both settings
//! are read back because SQLite silently keeps another mode when it cannot switch.

use std::path::Path;
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use super::{ReadModelError, BUSY_TIMEOUT_MS, SCHEMA_VERSION};

/// The tables of version 1 but those version 4 made anew (`operations`:
/// [`CREATE_OPERATIONS_V4`]; the id index: [`CREATE_ID_TABLES_V4`]). One table per read model,
/// plus the checkpoint.
///
/// The id index (`attempts`, `sources`, `external_ids`) is keyed by the id *and* the operation:
/// the read model records what the log says, and if a hand-written history ever reused an id for
/// two operations, both stay traceable instead of one event stopping the runner.
///
/// `STRICT` refuses values of the wrong type instead of converting them.
///
/// A CHECK lists allowed values with `OR`, not `IN (…)`: SQLite evaluates an `IN` list of three
/// or more constants by building a temporary B-tree of them for every row it checks, which cost
/// more than the rest of an `external_ids` insert. Files made before say `IN`; the rule is the
/// same, so they are not a different schema version.
const CREATE_TABLES_V1: &str = "
    CREATE TABLE checkpoint (
        id       INTEGER PRIMARY KEY CHECK (id = 1),
        position INTEGER NOT NULL CHECK (position >= 0)
    ) STRICT;

    CREATE TABLE review_queue (
        operation_id         TEXT    PRIMARY KEY,
        state                TEXT    NOT NULL CHECK (state IN ('unknown', 'needs_review')),
        since                TEXT    NOT NULL,
        tenant               TEXT    NOT NULL,
        provider             TEXT    NOT NULL,
        account              TEXT    NOT NULL,
        attempts             INTEGER NOT NULL CHECK (attempts >= 0),
        lookups              INTEGER NOT NULL CHECK (lookups >= 0),
        last_error           TEXT,
        last_lookup_result   TEXT,
        last_lookup_evidence TEXT,
        last_lookup_at       TEXT,
        review_reason        TEXT,
        review_evidence      TEXT,
        updated_at           TEXT    NOT NULL
    ) STRICT;

    CREATE TABLE duplicate_detections (
        position              INTEGER PRIMARY KEY,
        operation_id          TEXT    NOT NULL,
        provider              TEXT    NOT NULL,
        account               TEXT    NOT NULL,
        confirmed_external_id TEXT    NOT NULL,
        duplicate_external_id TEXT    NOT NULL,
        found_by              TEXT    NOT NULL,
        at                    TEXT    NOT NULL
    ) STRICT;

    CREATE TABLE possible_duplicate_intents (
        operation_id         TEXT    NOT NULL,
        earlier_operation_id TEXT    NOT NULL,
        tenant               TEXT    NOT NULL,
        provider             TEXT    NOT NULL,
        account              TEXT    NOT NULL,
        action               TEXT    NOT NULL,
        args_hash            TEXT    NOT NULL,
        source_id            TEXT,
        earlier_source_id    TEXT,
        gap_ms               INTEGER NOT NULL CHECK (gap_ms >= 0),
        at                   TEXT    NOT NULL,
        position             INTEGER NOT NULL,
        PRIMARY KEY (operation_id, earlier_operation_id)
    ) STRICT;

    CREATE TABLE counters (
        name  TEXT    PRIMARY KEY,
        value INTEGER NOT NULL CHECK (value >= 0)
    ) STRICT;
";

/// The id index as version 4 has it (`attempts`, `sources`, `external_ids`): `WITHOUT ROWID`,
/// so each row is stored once, in its key's B-tree. Versions 1 to 3 kept a rowid table and an
/// index of the key beside it, two B-trees written per entry and the key stored twice (55 MB of
/// a 1M-event rebuild). Each statement creates one table, named after `CREATE TABLE `.
const CREATE_ID_TABLES_V4: [&str; 3] = [
    "CREATE TABLE attempts (
        attempt_id     TEXT    NOT NULL,
        operation_id   TEXT    NOT NULL,
        attempt_number INTEGER NOT NULL CHECK (attempt_number >= 1),
        worker         TEXT    NOT NULL,
        started_at     TEXT    NOT NULL,
        position       INTEGER NOT NULL,
        PRIMARY KEY (attempt_id, operation_id)
    ) STRICT, WITHOUT ROWID;",
    "CREATE TABLE sources (
        tenant       TEXT    NOT NULL,
        source_id    TEXT    NOT NULL,
        operation_id TEXT    NOT NULL,
        position     INTEGER NOT NULL,
        PRIMARY KEY (tenant, source_id, operation_id)
    ) STRICT, WITHOUT ROWID;",
    "CREATE TABLE external_ids (
        provider     TEXT    NOT NULL,
        account      TEXT    NOT NULL,
        external_id  TEXT    NOT NULL,
        operation_id TEXT    NOT NULL,
        role         TEXT    NOT NULL
            CHECK (role = 'confirmed' OR role = 'duplicate' OR role = 'reported'),
        position     INTEGER NOT NULL,
        PRIMARY KEY (provider, account, external_id, operation_id)
    ) STRICT, WITHOUT ROWID;",
];

/// The operations table as version 4 has it: the folded state stored compact (`state_codec.rs`)
/// instead of as JSON text, a third of the size (versions 1 to 3 declared `folded_state TEXT`).
///
/// `operations` keeps each operation's folded state (`folded_state`): the runner reads it back
/// to fold the operation's next event, so no per-operation state is held in memory. Its
/// immutable columns (binding, arguments, created_at) are written once, at the intent; later
/// events update only what changes, so only the state index is rewritten.
const CREATE_OPERATIONS_V4: &str = "
    CREATE TABLE operations (
        operation_id        TEXT    PRIMARY KEY,
        tenant              TEXT    NOT NULL,
        provider            TEXT    NOT NULL,
        account             TEXT    NOT NULL,
        action              TEXT    NOT NULL,
        args_hash           TEXT    NOT NULL,
        source_id           TEXT,
        state               TEXT    NOT NULL,
        attempts            INTEGER NOT NULL CHECK (attempts >= 0),
        external_id         TEXT,
        last_error          TEXT,
        created_at          TEXT    NOT NULL,
        updated_at          TEXT    NOT NULL,
        stream_version      INTEGER NOT NULL CHECK (stream_version >= 0),
        last_position       INTEGER NOT NULL CHECK (last_position >= 0),
        lease_deadline      TEXT,
        unknown_since       TEXT,
        needs_review_reason TEXT,
        folded_state        BLOB    NOT NULL
    ) STRICT;
";

/// What version 5 adds to `operations`: the hash of each intent's request (`sql::request_hash`),
/// which `operations_by_request` indexes instead of the five request columns
/// ([`CREATE_OPERATIONS_INDEXES_V5`]). A new file's table gets it by this same statement, so a new
/// and a converted file have the same `CREATE TABLE` text. The default only fills the rows of a
/// converted file until [`migrate_request_hash_v5`] writes each one's hash; every insert binds it.
const ADD_REQUEST_HASH_V5: &str =
    "ALTER TABLE operations ADD COLUMN request_hash INTEGER NOT NULL DEFAULT 0;";

/// The columns of `operations` but the state, as the version 4 migration copies them.
const OPERATIONS_COLUMNS_BUT_STATE: &str = "operation_id, tenant, provider, account, action,
    args_hash, source_id, state, attempts, external_id, last_error, created_at, updated_at,
    stream_version, last_position, lease_deadline, unknown_since, needs_review_reason";

/// What version 2 adds: gauges, the current counts the metrics report (operations by state and
/// by attempts, external ids named by more than one operation), kept up to date by every batch
/// so that a report reads a few rows instead of scanning every operation (a scan took 0.4 s at
/// 400,000 operations, holding the connection the runner writes with). A gauge that falls to
/// zero is deleted in the same transaction, so a file holds the same rows however it got there;
/// one that would fall below zero fails the batch (the file does not match its log).
const CREATE_TABLES_V2: &str = "
    CREATE TABLE gauges (
        name  TEXT    PRIMARY KEY,
        value INTEGER NOT NULL CHECK (value >= 0)
    ) STRICT;
";

/// Fills the gauges of a version 1 file from its rows, as the batches would have. The names are
/// those of the `*_GAUGE` constants in `apply.rs`; a test migrates a file and compares the
/// report and every table with a rebuild.
const FILL_GAUGES_V2: &str = "
    INSERT INTO gauges (name, value)
        SELECT 'operations_in_state:' || state, count(*) FROM operations GROUP BY state;
    INSERT INTO gauges (name, value)
        SELECT 'operations_with_attempts:' || attempts, count(*) FROM operations GROUP BY attempts;
    INSERT INTO gauges (name, value)
        SELECT 'shared_external_ids', count(*) FROM (
            SELECT 1 FROM external_ids GROUP BY provider, account, external_id HAVING count(*) > 1
        ) HAVING count(*) > 0;
";

/// What version 3 adds: the durable work queue, one row per operation that waits for the
/// workers (a send once pending, a sweep once its lease runs out, a lookup once the next check is
/// due), with when it falls due and the stream version it was computed at. The workers start
/// from it instead of folding the log from position 0, so start-up and their memory do not grow
/// with the history; an operation waiting for a person (approval, review) or settled has no row.
/// `due_at` sorts as text in time order (`sql.rs`), so the index answers "what of each kind is
/// due now" by a range scan per kind.
const CREATE_TABLES_V3: &str = "
    CREATE TABLE work_queue (
        operation_id   TEXT    PRIMARY KEY,
        due_at         TEXT    NOT NULL,
        work           TEXT    NOT NULL CHECK (work = 'send' OR work = 'sweep' OR work = 'reconcile'),
        stream_version INTEGER NOT NULL CHECK (stream_version >= 0)
    ) STRICT;
";

/// The index of version 3: the work queue by due time.
pub(super) const CREATE_INDEXES_V3: &str = "
    CREATE INDEX work_queue_by_due ON work_queue (work, due_at, operation_id);
";

/// The secondary indexes of version 1. Apart from the tables because a rebuild creates them
/// after loading the rows: sorting once reads and writes each index page once, where keeping
/// them in order row by row inserts on random pages once they outgrow the page cache. Their
/// text is the same either way, so the schemas are identical.
pub(super) const CREATE_INDEXES_V1: &str = "
    CREATE INDEX review_queue_by_age ON review_queue (since, operation_id);
    CREATE INDEX review_queue_by_state ON review_queue (state, since, operation_id);
    CREATE INDEX possible_duplicate_intents_by_position ON possible_duplicate_intents (position);
";

/// The indexes of the id index (version 1's, apart because the version 4 migration makes those
/// tables anew).
pub(super) const CREATE_ID_INDEXES_V1: &str = "
    CREATE INDEX sources_by_id ON sources (source_id, position);
    CREATE INDEX external_ids_by_id ON external_ids (external_id, position);
";

/// The indexes of `operations` as version 5 has them: version 1's, but the request index is on
/// the request's hash ([`ADD_REQUEST_HASH_V5`]). Its five text columns were ~190 of a 1M-event
/// rebuild's index bytes per operation and the slowest index to build: sorting compared records
/// whose tenant, provider, account and action are mostly equal, deep into `args_hash`. Measured
/// by `bench projections --floor`: 1.1–1.8 µs of wall per event to build it, 0.63–0.67 on the
/// hash.
pub(super) const CREATE_OPERATIONS_INDEXES_V5: &str = "
    CREATE INDEX operations_by_created ON operations (created_at, operation_id);
    CREATE INDEX operations_by_state ON operations (state, created_at, operation_id);
    CREATE INDEX operations_by_tenant ON operations (tenant, created_at, operation_id);
    CREATE INDEX operations_by_request ON operations (request_hash, created_at, operation_id);
";

/// The indexes of `operations` (version 1's, apart because the version 4 migration makes the
/// table anew; version 5 replaces the request index).
pub(super) const CREATE_OPERATIONS_INDEXES_V1: &str = "
    CREATE INDEX operations_by_created ON operations (created_at, operation_id);
    CREATE INDEX operations_by_state ON operations (state, created_at, operation_id);
    CREATE INDEX operations_by_tenant ON operations (tenant, created_at, operation_id);
    CREATE INDEX operations_by_request
        ON operations (tenant, provider, account, action, args_hash, created_at, operation_id);
";

/// What version 6 adds: the search terms (`terms.rs`), one row per owner and top-level argument
/// value of each operation. A rowid table with its index apart ([`CREATE_INDEXES_V6`]), so a
/// rebuild appends the rows and sorts the index once.
const CREATE_TABLES_V6: &str = "
    CREATE TABLE operation_terms (
        term      TEXT NOT NULL,
        at        TEXT NOT NULL,
        operation TEXT NOT NULL
    ) STRICT;
";

/// The index of version 6: a term's operations in the listings' order, so a search reads the
/// matching rows only.
pub(super) const CREATE_INDEXES_V6: &str = "
    CREATE INDEX operation_terms_by_term ON operation_terms (term, at, operation);
";

/// The tables of the current version; a file claiming it must have all of them.
const TABLES: [&str; 12] = [
    "operation_terms",
    "work_queue",
    "gauges",
    "checkpoint",
    "operations",
    "review_queue",
    "duplicate_detections",
    "possible_duplicate_intents",
    "attempts",
    "sources",
    "external_ids",
    "counters",
];

/// `PRAGMA synchronous` reads back 2 for FULL.
const SYNCHRONOUS_FULL: i64 = 2;

/// Pages of WAL after which a commit copies the WAL back into the file. Under load a runner's
/// batch writes about a thousand pages, so SQLite's default (1000) made nearly every batch also
/// checkpoint, writing the same hot pages (the operations' tail, the index leaves) to the file
/// again each time. At 10 000 pages (about 40 MiB) a checkpoint comes every several batches
/// and writes each of those pages once; a crash replays a larger WAL. The ledger's writer uses
/// the same figure for the same reason (`adapters/store/src/sqlite/schema.rs`).
pub(super) const WAL_AUTOCHECKPOINT_PAGES: i64 = 10_000;
/// The page cache of the read models' connection, in KiB. SQLite's default (2 MiB) held less
/// than one batch's pages, so pages written by the last batch were read back from the WAL with
/// one `pread` each; 16 MiB keeps a busy batch's working set. Not larger: SQLite scans the
/// cache's hash table at the end of every write transaction (see the ledger's writer cache).
pub(super) const CACHE_KIB: i64 = 16 * 1024;

/// Opens (and if needed creates) the read-model file.
pub(super) fn open(path: &Path) -> Result<Connection, ReadModelError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut connection = Connection::open_with_flags(path, flags)
        .map_err(|error| ReadModelError::sqlite(format!("opening `{}`", path.display()), error))?;
    connection
        .busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))
        .map_err(|error| ReadModelError::sqlite("setting the busy timeout", error))?;
    keep_plans(&connection)?;

    // Everything up to the journal-mode switch only reads, so a refused file stays untouched.
    let found = schema_version(&connection, path)?;
    check_version(found, path)?;
    if found == 0 && has_objects(&connection)? {
        return Err(ReadModelError::ForeignDatabase {
            path: path.to_path_buf(),
        });
    }

    enable_wal(&connection, path)?;
    enable_full_sync(&connection)?;
    connection
        .execute_batch(&format!(
            "PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}; PRAGMA cache_size = -{CACHE_KIB};"
        ))
        .map_err(|error| ReadModelError::sqlite("setting the cache and checkpoint sizes", error))?;
    if found < SCHEMA_VERSION {
        create_schema(&mut connection, path, Indexes::Now)?;
    }
    check_tables(&connection, path)?;
    Ok(connection)
}

/// The schema version of the read models at `path` when it is older than this build's and
/// above zero: a file [`open`] would upgrade. Only reads.
pub(super) fn older_version(path: &Path) -> Result<Option<i64>, ReadModelError> {
    if !path.exists() {
        return Ok(None);
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let connection = Connection::open_with_flags(path, flags)
        .map_err(|error| ReadModelError::sqlite(format!("opening `{}`", path.display()), error))?;
    connection
        .busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))
        .map_err(|error| ReadModelError::sqlite("setting the busy timeout", error))?;
    let found = schema_version(&connection, path)?;
    Ok((1..SCHEMA_VERSION).contains(&found).then_some(found))
}

/// Keeps each prepared statement's plan whatever values are bound. Without this SQLite compiles
/// a statement again every time a new value is bound to a parameter its planner looked at, and
/// it looks at every `LIMIT ?`: the similar-intent query was parsed and planned anew for every
/// intent (about 4 % of the CPU of `bench http`). Our statements have one good plan each.
fn keep_plans(connection: &Connection) -> Result<(), ReadModelError> {
    connection
        .set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map(drop)
        .map_err(|error| ReadModelError::sqlite("keeping the query plans stable", error))
}

/// Whether [`create_schema`] creates the secondary indexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Indexes {
    /// With the tables: every row written later keeps them in order.
    Now,
    /// Not yet: a rebuild loads the rows first and then calls [`create_indexes`].
    Later,
}

/// Creates the tables in a new, empty file for a rebuild, set for writing fast: no journal and
/// no fsyncs, one connection holding the file exclusively, pages of `page_size` bytes and a page
/// cache of `cache_kib` KiB. The secondary indexes are left out until [`create_indexes`]: a
/// query that needs one must not run before. Only for a file that nobody else knows of and that
/// is discarded if the rebuild does not finish (see `rebuild/`); [`open`] puts the finished
/// file back to WAL with `synchronous=FULL`.
pub(super) fn create_for_rebuild(
    path: &Path,
    page_size: u32,
    cache_kib: i64,
) -> Result<Connection, ReadModelError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut connection = Connection::open_with_flags(path, flags)
        .map_err(|error| ReadModelError::sqlite(format!("opening `{}`", path.display()), error))?;
    keep_plans(&connection)?;
    let found = schema_version(&connection, path)?;
    if found != 0 || has_objects(&connection)? {
        return Err(ReadModelError::AlreadyExists {
            path: path.to_path_buf(),
        });
    }
    connection
        .execute_batch(&format!(
            "PRAGMA page_size = {page_size};
             PRAGMA journal_mode = OFF;
             PRAGMA synchronous = OFF;
             PRAGMA locking_mode = EXCLUSIVE;
             PRAGMA cache_size = -{cache_kib};"
        ))
        .map_err(|error| ReadModelError::sqlite("setting up the rebuild file", error))?;
    create_schema(&mut connection, path, Indexes::Later)?;
    check_tables(&connection, path)?;
    Ok(connection)
}

/// Lets SQLite's sorter (`CREATE INDEX`, big `ORDER BY`s) start up to `threads` helper threads
/// on this connection; returns how many it took: SQLite quietly caps the setting at the most it
/// was compiled for, and a build without threads keeps none. Only speed depends on it.
pub(super) fn set_sorter_threads(
    connection: &Connection,
    threads: u32,
) -> Result<i64, ReadModelError> {
    connection
        .pragma_update_and_check(None, "threads", threads, |row| row.get(0))
        .map_err(|error| ReadModelError::sqlite("setting the sorter's threads", error))
}

/// Creates the secondary indexes a rebuild left out ([`create_for_rebuild`]); each one is built
/// by sorting the rows already written.
pub(super) fn create_indexes(connection: &Connection) -> Result<(), ReadModelError> {
    connection
        .execute_batch(CREATE_OPERATIONS_INDEXES_V5)
        .and_then(|()| connection.execute_batch(CREATE_INDEXES_V1))
        .and_then(|()| connection.execute_batch(CREATE_ID_INDEXES_V1))
        .and_then(|()| connection.execute_batch(CREATE_INDEXES_V3))
        .and_then(|()| connection.execute_batch(CREATE_INDEXES_V6))
        .map_err(|error| ReadModelError::sqlite("creating the indexes", error))
}

fn schema_version(connection: &Connection, path: &Path) -> Result<i64, ReadModelError> {
    // The first statement that reads the file: a file that is not a database fails here.
    connection
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|error| {
            ReadModelError::sqlite(
                format!("reading the schema version of `{}`", path.display()),
                error,
            )
        })
}

fn check_version(found: i64, path: &Path) -> Result<(), ReadModelError> {
    if (0..=SCHEMA_VERSION).contains(&found) {
        Ok(())
    } else {
        Err(ReadModelError::IncompatibleSchema {
            path: path.to_path_buf(),
            found,
            supported: SCHEMA_VERSION,
        })
    }
}

fn has_objects(connection: &Connection) -> Result<bool, ReadModelError> {
    let objects: i64 = connection
        .query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0))
        .map_err(|error| ReadModelError::sqlite("listing the database's tables", error))?;
    Ok(objects > 0)
}

fn enable_wal(connection: &Connection, path: &Path) -> Result<(), ReadModelError> {
    let mode: String = connection
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(|error| ReadModelError::sqlite("switching to WAL", error))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(ReadModelError::Corrupt {
            reason: format!(
                "`{}` cannot be put in WAL mode (its journal mode stays `{mode}`)",
                path.display()
            ),
        });
    }
    Ok(())
}

fn enable_full_sync(connection: &Connection) -> Result<(), ReadModelError> {
    connection
        .pragma_update(None, "synchronous", "FULL")
        .map_err(|error| ReadModelError::sqlite("setting synchronous=FULL", error))?;
    let level: i64 = connection
        .pragma_query_value(None, "synchronous", |row| row.get(0))
        .map_err(|error| ReadModelError::sqlite("reading back the synchronous level", error))?;
    if level != SYNCHRONOUS_FULL {
        return Err(ReadModelError::Corrupt {
            reason: format!(
                "synchronous is {level} after setting FULL ({SYNCHRONOUS_FULL}); checkpoints would not be durable"
            ),
        });
    }
    Ok(())
}

fn create_schema(
    connection: &mut Connection,
    path: &Path,
    indexes: Indexes,
) -> Result<(), ReadModelError> {
    let transaction = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|error| ReadModelError::sqlite("starting the schema transaction", error))?;
    // Another process may have created the schema between our first look and this lock.
    let found: i64 = transaction
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|error| ReadModelError::sqlite("reading the schema version", error))?;
    check_version(found, path)?;
    if found == 0 {
        transaction
            .execute_batch(CREATE_TABLES_V1)
            .and_then(|()| transaction.execute_batch(CREATE_OPERATIONS_V4))
            .and_then(|()| transaction.execute_batch(ADD_REQUEST_HASH_V5))
            .and_then(|()| {
                CREATE_ID_TABLES_V4
                    .iter()
                    .try_for_each(|create| transaction.execute_batch(create))
            })
            .and_then(|()| transaction.execute_batch(CREATE_TABLES_V2))
            .and_then(|()| transaction.execute_batch(CREATE_TABLES_V3))
            .and_then(|()| transaction.execute_batch(CREATE_TABLES_V6))
            .map_err(|error| ReadModelError::sqlite("creating the schema", error))?;
        if indexes == Indexes::Now {
            create_indexes(&transaction)?;
        }
        return finish_schema(transaction, found);
    }
    if found < 4 {
        // First: the work queue's fill below reads the states in their version 4 form.
        migrate_states_v4(&transaction)?;
        migrate_id_tables_v4(&transaction)?;
    }
    if found == 1 {
        // Additive: the new table, filled from the rows in the same transaction, so a file is
        // never seen at version 2 without its gauges.
        transaction
            .execute_batch(CREATE_TABLES_V2)
            .and_then(|()| transaction.execute_batch(FILL_GAUGES_V2))
            .map_err(|error| {
                ReadModelError::sqlite("adding the gauges of schema version 2", error)
            })?;
    }
    if found < 3 {
        // Additive too, filled from the stored states in the same transaction.
        transaction
            .execute_batch(CREATE_TABLES_V3)
            .and_then(|()| transaction.execute_batch(CREATE_INDEXES_V3))
            .map_err(|error| {
                ReadModelError::sqlite("adding the work queue of schema version 3", error)
            })?;
        super::apply::fill_work_queue(&transaction)?;
    }
    if found < 5 {
        // After version 4's conversion: its new table has no hash yet either.
        migrate_request_hash_v5(&transaction)?;
    }
    if found < 6 {
        // Additive: the terms of every operation, from its stored state, in the same
        // transaction, so a file is never seen at version 6 without them.
        transaction
            .execute_batch(CREATE_TABLES_V6)
            .map_err(|error| {
                ReadModelError::sqlite("adding the search terms of version 6", error)
            })?;
        fill_terms_v6(&transaction)?;
        transaction
            .execute_batch(CREATE_INDEXES_V6)
            .map_err(|error| {
                ReadModelError::sqlite("indexing the search terms of version 6", error)
            })?;
    }
    finish_schema(transaction, found)
}

/// Makes the operations table anew with each stored state in its compact form, inside the
/// schema transaction: SQLite cannot change a column's type in place, and a `STRICT` table's
/// `TEXT` column refuses the bytes. The rows keep their values; only `folded_state` changes, from
/// the JSON of versions 1 to 3 to the same state encoded by `state_codec.rs`. One row at a time,
/// so memory does not grow with the file.
fn migrate_states_v4(connection: &Connection) -> Result<(), ReadModelError> {
    let sqlite = |error| ReadModelError::sqlite("converting the stored states to version 4", error);
    let create =
        CREATE_OPERATIONS_V4.replacen("CREATE TABLE operations ", "CREATE TABLE operations_v4 ", 1);
    connection.execute_batch(&create).map_err(sqlite)?;
    // The states are written below; an empty blob holds each row's place until then.
    connection
        .execute_batch(&format!(
            "INSERT INTO operations_v4 ({OPERATIONS_COLUMNS_BUT_STATE}, folded_state)
                 SELECT {OPERATIONS_COLUMNS_BUT_STATE}, x'' FROM operations ORDER BY operation_id"
        ))
        .map_err(sqlite)?;
    let mut read = connection
        .prepare("SELECT operation_id, folded_state FROM operations")
        .map_err(sqlite)?;
    let mut write = connection
        .prepare("UPDATE operations_v4 SET folded_state = ?2 WHERE operation_id = ?1")
        .map_err(sqlite)?;
    let mut rows = read.query([]).map_err(sqlite)?;
    let mut stored = Vec::new();
    while let Some(row) = rows.next().map_err(sqlite)? {
        let operation_id: String = row.get(0).map_err(sqlite)?;
        let json: String = row.get(1).map_err(sqlite)?;
        let state: opledger_domain::state::OperationState =
            serde_json::from_str(&json).map_err(|error| {
                super::sql::corrupt(format!(
                    "the stored state of operation {operation_id} cannot be read: {error}"
                ))
            })?;
        super::state_codec::encode_into(&state, &mut stored);
        write
            .execute(rusqlite::params![operation_id, stored])
            .map_err(sqlite)?;
    }
    drop(rows);
    drop((read, write));
    connection
        .execute_batch(
            "DROP TABLE operations;
             ALTER TABLE operations_v4 RENAME TO operations;",
        )
        .and_then(|()| connection.execute_batch(CREATE_OPERATIONS_INDEXES_V1))
        .map_err(sqlite)
}

/// Adds the request hash to `operations` and indexes it instead of the request's columns, inside
/// the schema transaction. One row at a time, so memory does not grow with the file.
fn migrate_request_hash_v5(connection: &Connection) -> Result<(), ReadModelError> {
    let sqlite = |error| ReadModelError::sqlite("adding the request hash of version 5", error);
    connection
        .execute_batch(ADD_REQUEST_HASH_V5)
        .map_err(sqlite)?;
    let mut read = connection
        .prepare("SELECT rowid, tenant, provider, account, action, args_hash FROM operations")
        .map_err(sqlite)?;
    let mut write = connection
        .prepare("UPDATE operations SET request_hash = ?2 WHERE rowid = ?1")
        .map_err(sqlite)?;
    let mut rows = read.query([]).map_err(sqlite)?;
    while let Some(row) = rows.next().map_err(sqlite)? {
        let rowid: i64 = row.get(0).map_err(sqlite)?;
        let mut request = [""; 5];
        for (column, text) in request.iter_mut().enumerate() {
            *text = row
                .get_ref(column + 1)
                .and_then(|value| Ok(value.as_str()?))
                .map_err(sqlite)?;
        }
        let hash = super::sql::request_hash(request);
        write
            .execute(rusqlite::params![rowid, hash])
            .map_err(sqlite)?;
    }
    drop(rows);
    drop((read, write));
    connection
        .execute_batch(
            "DROP INDEX operations_by_request;
             CREATE INDEX operations_by_request ON operations (request_hash, created_at, operation_id);",
        )
        .map_err(sqlite)
}

/// Writes every operation's search terms from its stored state, inside the schema transaction.
/// One row at a time, so memory does not grow with the file.
fn fill_terms_v6(connection: &Connection) -> Result<(), ReadModelError> {
    let sqlite = |error| ReadModelError::sqlite("filling the search terms of version 6", error);
    let mut read = connection
        .prepare("SELECT operation_id, created_at, folded_state FROM operations")
        .map_err(sqlite)?;
    let mut write = connection
        .prepare("INSERT INTO operation_terms (term, at, operation) VALUES (?1, ?2, ?3)")
        .map_err(sqlite)?;
    let mut rows = read.query([]).map_err(sqlite)?;
    while let Some(row) = rows.next().map_err(sqlite)? {
        let operation_id: String = row.get(0).map_err(sqlite)?;
        let created_at: String = row.get(1).map_err(sqlite)?;
        let bytes: Vec<u8> = row.get(2).map_err(sqlite)?;
        let state = super::state_codec::decode(&bytes).map_err(|error| {
            super::sql::corrupt(format!(
                "the stored state of operation {operation_id} cannot be read: {error}"
            ))
        })?;
        for term in super::terms::terms_of(&state) {
            write
                .execute(rusqlite::params![term, created_at, operation_id])
                .map_err(sqlite)?;
        }
    }
    Ok(())
}

/// Makes the id index's tables anew `WITHOUT ROWID` ([`CREATE_ID_TABLES_V4`]), inside the schema
/// transaction: the same columns in the same order, the same rows.
fn migrate_id_tables_v4(connection: &Connection) -> Result<(), ReadModelError> {
    for create in CREATE_ID_TABLES_V4 {
        let table = create
            .strip_prefix("CREATE TABLE ")
            .and_then(|rest| rest.split_whitespace().next())
            .expect("each statement of CREATE_ID_TABLES_V4 names its table first");
        let create_new = create.replacen(
            &format!("CREATE TABLE {table} "),
            &format!("CREATE TABLE {table}_v4 "),
            1,
        );
        connection
            .execute_batch(&format!(
                "{create_new}
                 INSERT INTO {table}_v4 SELECT * FROM {table};
                 DROP TABLE {table};
                 ALTER TABLE {table}_v4 RENAME TO {table};"
            ))
            .map_err(|error| {
                ReadModelError::sqlite(format!("making `{table}` WITHOUT ROWID (version 4)"), error)
            })?;
    }
    connection
        .execute_batch(CREATE_ID_INDEXES_V1)
        .map_err(|error| ReadModelError::sqlite("indexing the id index anew (version 4)", error))
}

/// Records the schema version (when it changed) and commits the schema transaction.
fn finish_schema(transaction: rusqlite::Transaction<'_>, found: i64) -> Result<(), ReadModelError> {
    if found < SCHEMA_VERSION {
        transaction
            .pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(|error| ReadModelError::sqlite("recording the schema version", error))?;
    }
    transaction
        .commit()
        .map_err(|error| ReadModelError::sqlite("committing the schema", error))
}

fn check_tables(connection: &Connection, path: &Path) -> Result<(), ReadModelError> {
    let mut statement = connection
        .prepare("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?1")
        .map_err(|error| ReadModelError::sqlite("looking for the read-model tables", error))?;
    for table in TABLES {
        let present: i64 = statement
            .query_row([table], |row| row.get(0))
            .map_err(|error| ReadModelError::sqlite("looking for the read-model tables", error))?;
        if present != 1 {
            return Err(ReadModelError::Corrupt {
                reason: format!(
                    "`{}` has schema version {SCHEMA_VERSION} but lacks the `{table}` table",
                    path.display()
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_opened_file_is_durable_and_checkpoints_every_ten_thousand_pages() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let connection = open(&dir.path().join("views.db")).expect("a new file opens");
        let pragma = |name: &str| -> i64 {
            connection
                .pragma_query_value(None, name, |row| row.get(0))
                .expect("the pragma reads back")
        };
        assert_eq!(pragma("synchronous"), SYNCHRONOUS_FULL);
        assert_eq!(pragma("wal_autocheckpoint"), WAL_AUTOCHECKPOINT_PAGES);
        assert_eq!(pragma("cache_size"), -CACHE_KIB);
    }
}
