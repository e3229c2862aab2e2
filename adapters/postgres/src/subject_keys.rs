//! The data subjects' key table in the ledger's database: `opledger.subject_keys` (a row per
//! subject and tenant: its data key wrapped by the key-encryption key, its name sealed under the
//! data key), `opledger.subject_operations` (which operations have values sealed under which
//! key) and `opledger.subject_keys_meta` (the key store's header). Every `opledger serve` on the
//! database shares them, so a subject has one key whichever instance recorded it; the log itself
//! never holds a key.
//!
//! # A synchronous table over an asynchronous client
//!
//! The key store's [`KeyTable`] is synchronous: its writer is a thread of its own, and a seal
//! reads a subject's row in the middle of a record call. The `postgres` crate (the synchronous
//! wrapper of `tokio-postgres`) is not in the tree, and it runs its own runtime's `block_on`,
//! which panics when called from a thread that is already inside a tokio runtime — exactly where
//! a seal runs. So each [`PostgresKeyTable`] owns a thread with a single-threaded runtime and one
//! connection (opened and checked by the store's connector, so it reaches this ledger's current
//! copy); a call sends its question there over a channel and waits for the answer on a plain
//! `std` channel, which may be waited on from anywhere. A connection that fails is dropped and
//! opened again by the next call.
//!
//! # Destroying a key in PostgreSQL's own copies
//!
//! PostgreSQL never overwrites a row: an `UPDATE` writes a new version and leaves the old one,
//! key bytes included, in the table's heap page as a dead tuple. A plain `VACUUM` marks its space
//! free and usually moves the page's other rows over it, but not always: when the dead version
//! is the lowest on its page (the newest row of a full page) its bytes stay in the free space
//! until a later row happens to land there. So every destruction (and every re-wrap under a new
//! key-encryption key) ends with `VACUUM (FULL)` of the key table, which writes its live rows
//! into a new file and truncates the old one at once; the table's file node must change, or the
//! destruction is reported failed with what to do (the role must own the table). What PostgreSQL
//! keeps beyond the table's files — its write-ahead log until the segments are recycled, WAL
//! archives, replicas, base backups — opledger does not control: there the key stays wrapped
//! under the key-encryption key, and rotating that key (and destroying the old one) makes such
//! copies useless. The book's erasure page says so.
//!
//! What must never happen: a key stored in clear; two keys stored for one subject of a tenant;
//! a destruction reported done while the key's row is readable or its bytes are in the table's
//! current file.

use std::sync::mpsc as answer_channel;
use std::time::Duration;

use opledger_subjects::table::{generation_of, KeyTable, Row, Write};
use opledger_subjects::SubjectsError;
use tokio::sync::mpsc;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use crate::{describe, Connection, Connector, PostgresError, PostgresStore};

/// The advisory lock the tables are created under, so instances starting at once create them
/// once (the bytes of "opsubkey"; the schema's migration lock is another key).
const CREATE_LOCK_KEY: i64 = 0x6f70_7375_626b_6579;

/// How long a destruction may take, in milliseconds: its `VACUUM (FULL)` rewrites the whole key
/// table (about 200 bytes a subject: a million subjects rewrite in seconds). Every statement is
/// also bounded by the session's `statement_timeout`.
pub const DESTROY_TIMEOUT_MS: u64 = 300_000;

/// How many times a batch of new keys and links is tried when PostgreSQL ends it as a deadlock
/// with another instance's batch (their rows met in different orders); one of the two always
/// goes through, so a few tries suffice.
pub const WRITE_ATTEMPTS: u32 = 3;

const TABLES: &str = "
    CREATE TABLE IF NOT EXISTS opledger.subject_keys_meta (
        name  text  PRIMARY KEY,
        value bytea NOT NULL
    );
    CREATE TABLE IF NOT EXISTS opledger.subject_keys (
        key_id           text  PRIMARY KEY,
        tag              bytea NOT NULL UNIQUE,
        tenant           text  NOT NULL,
        wrapped_key      bytea,
        sealed_name      bytea,
        created_at       text  NOT NULL,
        last_recorded_at text  NOT NULL,
        erased_at        text,
        erased_by        text,
        CHECK ((erased_at IS NULL) = (wrapped_key IS NOT NULL)),
        CHECK (erased_at IS NULL OR sealed_name IS NULL)
    );
    CREATE TABLE IF NOT EXISTS opledger.subject_operations (
        key_id       text NOT NULL REFERENCES opledger.subject_keys (key_id),
        operation_id text NOT NULL,
        PRIMARY KEY (key_id, operation_id)
    );
";

const COLUMNS: &str = "key_id, tag, tenant, wrapped_key, sealed_name, created_at, last_recorded_at, erased_at, erased_by";

impl PostgresStore {
    /// A connection of its own to the subjects' key table in this store's database (created on
    /// first use), on a thread of its own: the PostgreSQL side of the key store.
    pub fn key_table(&self) -> Result<PostgresKeyTable, PostgresError> {
        PostgresKeyTable::start(
            std::sync::Arc::clone(&self.shared.connector),
            self.shared.target.clone(),
        )
    }
}

/// One question to the table's thread.
enum Ask {
    Meta(String),
    SetMeta(Vec<(String, Vec<u8>)>),
    RowByTag(Vec<u8>),
    RowByKey(String),
    Rows,
    OperationsOf(String),
    Write(Vec<Write>),
    Destroy {
        key_id: String,
        at: String,
        by: String,
    },
    Rewrap {
        keys: Vec<(String, Vec<u8>)>,
        meta: Vec<(String, Vec<u8>)>,
    },
    Generation,
}

/// The thread's answer.
enum Answer {
    Bytes(Option<Vec<u8>>),
    Done,
    Row(Option<Row>),
    Rows(Vec<Row>),
    Ids(Vec<String>),
    Number(i64),
}

type Reply = answer_channel::SyncSender<Result<Answer, String>>;

/// The key table on PostgreSQL (see the module's documentation).
pub struct PostgresKeyTable {
    asks: mpsc::UnboundedSender<(Ask, Reply)>,
    thread: Option<std::thread::JoinHandle<()>>,
    target: String,
}

impl std::fmt::Debug for PostgresKeyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresKeyTable")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl PostgresKeyTable {
    fn start(connector: std::sync::Arc<Connector>, target: String) -> Result<Self, PostgresError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| PostgresError::Setup {
                reason: format!("cannot start the key table's runtime: {error}"),
            })?;
        let (asks, mut asked) = mpsc::unbounded_channel::<(Ask, Reply)>();
        let thread = std::thread::Builder::new()
            .name("opledger-pg-keys".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let mut session = Session {
                        connector,
                        connection: None,
                        created: false,
                    };
                    while let Some((ask, reply)) = asked.recv().await {
                        let answer = session.answer(ask).await;
                        // The caller may have given up; nobody else wants the answer.
                        let _ = reply.send(answer);
                    }
                });
            })
            .map_err(|error| PostgresError::Setup {
                reason: format!("cannot start the key table's thread: {error}"),
            })?;
        let table = Self {
            asks,
            thread: Some(thread),
            target,
        };
        Ok(table)
    }

    fn ask(&self, action: &'static str, ask: Ask) -> Result<Answer, SubjectsError> {
        let (reply, answer) = answer_channel::sync_channel(1);
        self.asks
            .send((ask, reply))
            .map_err(|_| SubjectsError::table(action, "the key table's thread has stopped"))?;
        answer
            .recv()
            .map_err(|_| SubjectsError::table(action, "the key table's thread has stopped"))?
            .map_err(|reason| SubjectsError::table(action, reason))
    }
}

impl Drop for PostgresKeyTable {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop once the question under way is answered.
        let (closed, _) = mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.asks, closed));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn unexpected(action: &'static str) -> SubjectsError {
    SubjectsError::table(action, "the key table's thread answered another question")
}

impl KeyTable for PostgresKeyTable {
    fn meta(&mut self, name: &str) -> Result<Option<Vec<u8>>, SubjectsError> {
        const ACTION: &str = "read the key store's header";
        match self.ask(ACTION, Ask::Meta(name.to_owned()))? {
            Answer::Bytes(value) => Ok(value),
            _ => Err(unexpected(ACTION)),
        }
    }

    fn set_meta(&mut self, values: &[(&str, Vec<u8>)]) -> Result<(), SubjectsError> {
        const ACTION: &str = "write the key store's header";
        let values = values
            .iter()
            .map(|(name, value)| ((*name).to_owned(), value.clone()))
            .collect();
        match self.ask(ACTION, Ask::SetMeta(values))? {
            Answer::Done => Ok(()),
            _ => Err(unexpected(ACTION)),
        }
    }

    fn row_by_tag(&mut self, tag: &[u8]) -> Result<Option<Row>, SubjectsError> {
        const ACTION: &str = "read a subject";
        match self.ask(ACTION, Ask::RowByTag(tag.to_vec()))? {
            Answer::Row(row) => Ok(row),
            _ => Err(unexpected(ACTION)),
        }
    }

    fn row_by_key(&mut self, key_id: &str) -> Result<Option<Row>, SubjectsError> {
        const ACTION: &str = "read a subject";
        match self.ask(ACTION, Ask::RowByKey(key_id.to_owned()))? {
            Answer::Row(row) => Ok(row),
            _ => Err(unexpected(ACTION)),
        }
    }

    fn rows(&mut self) -> Result<Vec<Row>, SubjectsError> {
        const ACTION: &str = "list subjects";
        match self.ask(ACTION, Ask::Rows)? {
            Answer::Rows(rows) => Ok(rows),
            _ => Err(unexpected(ACTION)),
        }
    }

    fn operations_of(&mut self, key_id: &str) -> Result<Vec<String>, SubjectsError> {
        const ACTION: &str = "list a subject's operations";
        match self.ask(ACTION, Ask::OperationsOf(key_id.to_owned()))? {
            Answer::Ids(ids) => Ok(ids),
            _ => Err(unexpected(ACTION)),
        }
    }

    fn write(&mut self, writes: &[Write]) -> Result<Vec<String>, SubjectsError> {
        const ACTION: &str = "write new data keys and links";
        match self.ask(ACTION, Ask::Write(writes.to_vec()))? {
            Answer::Ids(lost) => Ok(lost),
            _ => Err(unexpected(ACTION)),
        }
    }

    fn destroy(&mut self, key_id: &str, at: &str, by: &str) -> Result<i64, SubjectsError> {
        const ACTION: &str = "destroy a data key";
        let ask = Ask::Destroy {
            key_id: key_id.to_owned(),
            at: at.to_owned(),
            by: by.to_owned(),
        };
        match self.ask(ACTION, ask)? {
            Answer::Number(generation) => Ok(generation),
            _ => Err(unexpected(ACTION)),
        }
    }

    fn rewrap(
        &mut self,
        keys: &[(String, Vec<u8>)],
        meta: &[(&str, Vec<u8>)],
    ) -> Result<i64, SubjectsError> {
        const ACTION: &str = "re-wrap the data keys";
        let ask = Ask::Rewrap {
            keys: keys.to_vec(),
            meta: meta
                .iter()
                .map(|(name, value)| ((*name).to_owned(), value.clone()))
                .collect(),
        };
        match self.ask(ACTION, ask)? {
            Answer::Number(generation) => Ok(generation),
            _ => Err(unexpected(ACTION)),
        }
    }

    fn generation(&mut self) -> Result<i64, SubjectsError> {
        const ACTION: &str = "read the key store's generation";
        match self.ask(ACTION, Ask::Generation)? {
            Answer::Number(generation) => Ok(generation),
            _ => Err(unexpected(ACTION)),
        }
    }

    fn describe(&self) -> String {
        format!("the table opledger.subject_keys of {}", self.target)
    }
}

/// The table thread's connection, opened when first needed and again after a failure.
struct Session {
    connector: std::sync::Arc<Connector>,
    connection: Option<Connection>,
    /// Whether this session made sure the tables exist.
    created: bool,
}

impl Session {
    async fn answer(&mut self, ask: Ask) -> Result<Answer, String> {
        let limit = match ask {
            Ask::Destroy { .. } | Ask::Rewrap { .. } => Duration::from_millis(DESTROY_TIMEOUT_MS),
            _ => self.connector.round_trip.saturating_mul(4),
        };
        let outcome = match tokio::time::timeout(limit, self.answer_unbounded(ask)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!(
                "no answer from PostgreSQL within {} ms; the connection was closed and is replaced",
                limit.as_millis()
            )),
        };
        if outcome.is_err() {
            // In any state after a failure: the next question opens a fresh one.
            self.connection = None;
        }
        outcome
    }

    async fn answer_unbounded(&mut self, ask: Ask) -> Result<Answer, String> {
        if self
            .connection
            .as_ref()
            .is_none_or(|c| c.client.is_closed())
        {
            self.connection = Some(self.connector.connect().await.map_err(|e| e.to_string())?);
        }
        let connection = self.connection.as_mut().expect("opened just above");
        let client = &mut connection.client;
        if !self.created {
            create_tables(client).await?;
            self.created = true;
        }
        let failed = |error: tokio_postgres::Error| describe(&error);
        match ask {
            Ask::Meta(name) => Ok(Answer::Bytes(
                client
                    .query_opt(
                        "SELECT value FROM opledger.subject_keys_meta WHERE name = $1",
                        &[&name],
                    )
                    .await
                    .map_err(failed)?
                    .map(|row| row.get(0)),
            )),
            Ask::SetMeta(values) => {
                let transaction = client.transaction().await.map_err(failed)?;
                for (name, value) in &values {
                    transaction
                        .execute(
                            "INSERT INTO opledger.subject_keys_meta (name, value) VALUES ($1, $2)
                             ON CONFLICT (name) DO NOTHING",
                            &[name, value],
                        )
                        .await
                        .map_err(failed)?;
                }
                transaction.commit().await.map_err(failed)?;
                Ok(Answer::Done)
            }
            Ask::RowByTag(tag) => row_where(client, "tag = $1", &tag).await.map(Answer::Row),
            Ask::RowByKey(key_id) => row_where(client, "key_id = $1", &key_id)
                .await
                .map(Answer::Row),
            Ask::Rows => Ok(Answer::Rows(
                client
                    .query(
                        &format!(
                            "SELECT {COLUMNS} FROM opledger.subject_keys ORDER BY created_at, key_id"
                        ),
                        &[],
                    )
                    .await
                    .map_err(failed)?
                    .iter()
                    .map(row_of)
                    .collect(),
            )),
            Ask::OperationsOf(key_id) => Ok(Answer::Ids(
                client
                    .query(
                        "SELECT operation_id FROM opledger.subject_operations WHERE key_id = $1 ORDER BY operation_id",
                        &[&key_id],
                    )
                    .await
                    .map_err(failed)?
                    .iter()
                    .map(|row| row.get(0))
                    .collect(),
            )),
            Ask::Write(writes) => write(client, &writes).await.map(Answer::Ids),
            Ask::Destroy { key_id, at, by } => {
                destroy(client, &key_id, &at, &by).await.map(Answer::Number)
            }
            Ask::Rewrap { keys, meta } => rewrap(client, &keys, &meta).await.map(Answer::Number),
            Ask::Generation => Ok(Answer::Number(generation_of(
                client
                    .query_opt(
                        "SELECT value FROM opledger.subject_keys_meta WHERE name = 'generation'",
                        &[],
                    )
                    .await
                    .map_err(failed)?
                    .map(|row| row.get::<_, Vec<u8>>(0))
                    .as_deref(),
            ))),
        }
    }
}

/// Creates the key tables if they are missing, once across instances (the advisory lock). They
/// are not among the schema's migrations: a ledger without personal data has no key table.
async fn create_tables(client: &mut Client) -> Result<(), String> {
    let exists = client
        .query_one(
            "SELECT to_regclass('opledger.subject_operations') IS NOT NULL",
            &[],
        )
        .await
        .map_err(|error| describe(&error))?;
    if exists.get::<_, bool>(0) {
        return Ok(());
    }
    let refused = |error: tokio_postgres::Error| {
        format!(
            "cannot create the key tables (opledger.subject_keys and beside it): {}; start once with a role that may create tables in schema opledger",
            describe(&error)
        )
    };
    let transaction = client.transaction().await.map_err(refused)?;
    transaction
        .execute("SELECT pg_advisory_xact_lock($1)", &[&CREATE_LOCK_KEY])
        .await
        .map_err(refused)?;
    transaction.batch_execute(TABLES).await.map_err(refused)?;
    transaction.commit().await.map_err(refused)
}

async fn row_where(
    client: &Client,
    condition: &str,
    value: &(dyn tokio_postgres::types::ToSql + Sync),
) -> Result<Option<Row>, String> {
    client
        .query_opt(
            &format!("SELECT {COLUMNS} FROM opledger.subject_keys WHERE {condition}"),
            &[value],
        )
        .await
        .map(|row| row.as_ref().map(row_of))
        .map_err(|error| describe(&error))
}

fn row_of(row: &tokio_postgres::Row) -> Row {
    Row {
        key_id: row.get(0),
        tag: row.get(1),
        tenant: row.get(2),
        wrapped_key: row.get(3),
        sealed_name: row.get(4),
        created_at: row.get(5),
        last_recorded_at: row.get(6),
        erased_at: row.get(7),
        erased_by: row.get(8),
    }
}

async fn write_meta(
    transaction: &tokio_postgres::Transaction<'_>,
    values: &[(String, Vec<u8>)],
) -> Result<(), String> {
    for (name, value) in values {
        transaction
            .execute(
                "INSERT INTO opledger.subject_keys_meta (name, value) VALUES ($1, $2)
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                &[name, value],
            )
            .await
            .map_err(|error| describe(&error))?;
    }
    Ok(())
}

async fn bump_generation(transaction: &tokio_postgres::Transaction<'_>) -> Result<i64, String> {
    let row = transaction
        .query_one(
            "INSERT INTO opledger.subject_keys_meta AS meta (name, value) VALUES ('generation', '1')
             ON CONFLICT (name) DO UPDATE SET value = convert_to(
                 (convert_from(meta.value, 'UTF8')::bigint + 1)::text, 'UTF8')
             RETURNING value",
            &[],
        )
        .await
        .map_err(|error| describe(&error))?;
    Ok(generation_of(Some(&row.get::<_, Vec<u8>>(0))))
}

/// New keys and links in one transaction (see [`KeyTable::write`]), tried again when it ends as
/// a deadlock with another instance's batch.
async fn write(client: &mut Client, writes: &[Write]) -> Result<Vec<String>, String> {
    let mut attempt = 1;
    loop {
        match write_once(client, writes).await {
            Err(error) if attempt < WRITE_ATTEMPTS && conflicted(&error) => {
                attempt += 1;
            }
            outcome => return outcome.map_err(|error| describe(&error)),
        }
    }
}

/// Whether PostgreSQL ended the transaction for meeting another one (it may be tried again).
fn conflicted(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED)
        || error.code() == Some(&SqlState::T_R_SERIALIZATION_FAILURE)
}

async fn write_once(
    client: &mut Client,
    writes: &[Write],
) -> Result<Vec<String>, tokio_postgres::Error> {
    let mut keys: Vec<&Write> = writes
        .iter()
        .filter(|write| matches!(write, Write::Key { .. }))
        .collect();
    // Rows met in one order by every instance: two batches wait for each other, never in a
    // circle.
    keys.sort_by(|a, b| match (a, b) {
        (Write::Key { tag: a, .. }, Write::Key { tag: b, .. }) => a.cmp(b),
        _ => std::cmp::Ordering::Equal,
    });
    let mut links: Vec<(&str, &str, &str)> = writes
        .iter()
        .filter_map(|write| match write {
            Write::Link {
                key_id,
                operation_id,
                at,
            } => Some((key_id.as_str(), operation_id.as_str(), at.as_str())),
            Write::Key { .. } => None,
        })
        .collect();
    links.sort_unstable();
    let transaction = client.transaction().await?;
    // A new key is durable before anything sealed under it is appended; links alone repeat what
    // the log holds (each token names its key and operation), so they need not wait for a
    // flush of PostgreSQL's log: the next key's commit makes them durable too (as the SQLite
    // table's `synchronous = NORMAL` for them).
    if keys.is_empty() {
        transaction
            .batch_execute("SET LOCAL synchronous_commit = off")
            .await?;
    }
    let mut lost = Vec::new();
    for write in keys {
        let Write::Key {
            key_id,
            tag,
            tenant,
            wrapped_key,
            sealed_name,
            at,
        } = write
        else {
            continue;
        };
        let stored = transaction
            .execute(
                "INSERT INTO opledger.subject_keys (key_id, tag, tenant, wrapped_key, sealed_name, created_at, last_recorded_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $6) ON CONFLICT (tag) DO NOTHING",
                &[key_id, tag, tenant, wrapped_key, sealed_name, at],
            )
            .await?;
        if stored == 0 {
            lost.push(key_id.clone());
        }
    }
    if !links.is_empty() {
        let key_ids: Vec<&str> = links.iter().map(|link| link.0).collect();
        let operations: Vec<&str> = links.iter().map(|link| link.1).collect();
        let times: Vec<&str> = links.iter().map(|link| link.2).collect();
        // One statement for the batch's links, and one that moves each key's last use on: a
        // batch holds hundreds of them at concurrency 64. A key that is not stored (another
        // instance's won, or it was never written) gets no link.
        transaction
            .execute(
                "INSERT INTO opledger.subject_operations (key_id, operation_id)
                 SELECT link.key_id, link.operation_id
                 FROM unnest($1::text[], $2::text[]) AS link (key_id, operation_id)
                 WHERE EXISTS (SELECT 1 FROM opledger.subject_keys k WHERE k.key_id = link.key_id)
                 ORDER BY link.key_id, link.operation_id
                 ON CONFLICT DO NOTHING",
                &[&key_ids, &operations],
            )
            .await?;
        transaction
            .execute(
                "UPDATE opledger.subject_keys AS k SET last_recorded_at = latest.at
                 FROM (SELECT link.key_id, max(link.at) AS at
                       FROM unnest($1::text[], $2::text[]) AS link (key_id, at)
                       GROUP BY link.key_id) AS latest
                 WHERE k.key_id = latest.key_id AND k.last_recorded_at < latest.at",
                &[&key_ids, &times],
            )
            .await?;
    }
    transaction.commit().await?;
    Ok(lost)
}

/// Destroys a key and rewrites the table so no copy of it is left in the table's files.
async fn destroy(client: &mut Client, key_id: &str, at: &str, by: &str) -> Result<i64, String> {
    let failed = |error: tokio_postgres::Error| describe(&error);
    let transaction = client.transaction().await.map_err(failed)?;
    transaction
        .execute(
            "UPDATE opledger.subject_keys SET wrapped_key = NULL, sealed_name = NULL, erased_at = $2, erased_by = $3
             WHERE key_id = $1 AND erased_at IS NULL",
            &[&key_id, &at, &by],
        )
        .await
        .map_err(failed)?;
    let generation = bump_generation(&transaction).await?;
    transaction.commit().await.map_err(failed)?;
    rewrite(client, &["opledger.subject_keys"]).await?;
    Ok(generation)
}

/// Wraps live keys again and writes the header (a rotation of the key-encryption key), then
/// rewrites the tables so the keys wrapped under the old one are gone from their files.
async fn rewrap(
    client: &mut Client,
    keys: &[(String, Vec<u8>)],
    meta: &[(String, Vec<u8>)],
) -> Result<i64, String> {
    let failed = |error: tokio_postgres::Error| describe(&error);
    let transaction = client.transaction().await.map_err(failed)?;
    for (key_id, wrapped) in keys {
        transaction
            .execute(
                "UPDATE opledger.subject_keys SET wrapped_key = $2 WHERE key_id = $1 AND erased_at IS NULL",
                &[key_id, wrapped],
            )
            .await
            .map_err(failed)?;
    }
    write_meta(&transaction, meta).await?;
    let generation = bump_generation(&transaction).await?;
    transaction.commit().await.map_err(failed)?;
    rewrite(
        client,
        &["opledger.subject_keys", "opledger.subject_keys_meta"],
    )
    .await?;
    Ok(generation)
}

/// `VACUUM (FULL)` of each table, checked: its file node must change (PostgreSQL skips a table
/// the role does not own with only a warning).
async fn rewrite(client: &Client, tables: &[&str]) -> Result<(), String> {
    let failed = |error: tokio_postgres::Error| describe(&error);
    for table in tables {
        let node = |row: tokio_postgres::Row| row.get::<_, Option<i64>>(0);
        let filenode = "SELECT pg_relation_filenode($1::text::regclass)::bigint";
        let before = node(client.query_one(filenode, &[table]).await.map_err(failed)?);
        client
            .batch_execute(&format!("VACUUM (FULL) {table}"))
            .await
            .map_err(|error| {
                format!(
                    "the key is destroyed, but {table} could not be rewritten to drop the old copy of its row from the table's file: {}; run `VACUUM (FULL) {table}` as the table's owner",
                    describe(&error)
                )
            })?;
        let after = node(client.query_one(filenode, &[table]).await.map_err(failed)?);
        if before == after {
            return Err(format!(
                "the key is destroyed, but PostgreSQL did not rewrite {table} (the role is not its owner), so the old copy of its row may stay in the table's file; run `VACUUM (FULL) {table}` as the table's owner, and start opledger as that role"
            ));
        }
    }
    Ok(())
}
