//! The store's tables in the database, their version, and the migrations between versions.
//!
//! Everything lives in one PostgreSQL schema, `opledger`, so the store shares a database with
//! other programs (a DBOS application, say) without touching their tables. The version is one
//! row in `opledger.schema_version`. Start-up reads it before it changes anything: a database of
//! a newer opledger is refused and left as it was. Older versions are brought up to date by the
//! migrations below, in order, in one transaction under an advisory lock, so several instances
//! starting at once migrate it once.

use tokio_postgres::{Client, GenericClient};

use crate::PostgresError;

/// The schema version this build creates and reads.
pub const SCHEMA_VERSION: i32 = 6;

/// The advisory lock key start-up holds while it creates or migrates the schema (the bytes of
/// "opledger" read as a number; any fixed key works, this one is unlikely to be another's).
const MIGRATION_LOCK_KEY: i64 = 0x6f70_6c65_6467_6572;

/// The migrations, one per version: `MIGRATIONS[n]` takes the schema from version `n` to `n + 1`.
///
/// Version 1. `log_head` is one row holding the newest position ever handed out; every writer
/// locks it (`SELECT … FOR UPDATE`) first thing in its transaction, so positions are assigned
/// and committed one transaction at a time across every instance (see the crate's docs).
/// `streams` gives each stream a small id and holds its last version; `events` is the log, keyed
/// by position, with the stream's name repeated so reading the log needs no join.
const MIGRATIONS: [&str; SCHEMA_VERSION as usize] = [
    "
    CREATE TABLE opledger.log_head (
        singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
        last_position bigint  NOT NULL CHECK (last_position >= 0)
    );
    INSERT INTO opledger.log_head (last_position) VALUES (0);
    CREATE TABLE opledger.streams (
        stream_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name         text   NOT NULL UNIQUE,
        last_version bigint NOT NULL CHECK (last_version >= 0)
    );
    CREATE TABLE opledger.events (
        position   bigint PRIMARY KEY CHECK (position >= 1),
        stream_id  bigint NOT NULL REFERENCES opledger.streams (stream_id),
        version    bigint NOT NULL CHECK (version >= 0),
        stream     text   NOT NULL,
        event_id   uuid   NOT NULL UNIQUE,
        event_type text   NOT NULL,
        data       bytea  NOT NULL,
        metadata   bytea  NOT NULL,
        UNIQUE (stream_id, version)
    );
",
    WEBHOOK_JOURNAL,
    LEDGER_IDENTITY,
    LOG_TREE,
    REVIEW_CLAIMS,
    TENANT_TREES,
];

/// Version 2: the webhooks' delivery journal, shared by every instance on the database
/// (`webhook_journal.rs`). An endpoint's row holds its checkpoint, status, epoch and lease (holder,
/// a token grown by every acquisition, and an expiry in the database's clock); its attempts are
/// kept to a bound by the writer, oldest deleted first.
const WEBHOOK_JOURNAL: &str = "
    CREATE TABLE opledger.webhook_endpoints (
        id               text        PRIMARY KEY,
        checkpoint       bigint      CHECK (checkpoint >= 0),
        status           text        NOT NULL CHECK (status IN ('active', 'paused', 'disabled')),
        reason           text,
        epoch            bigint      NOT NULL CHECK (epoch >= 0),
        lease_holder     text,
        lease_token      bigint      NOT NULL DEFAULT 0,
        lease_expires_at timestamptz
    );
    CREATE TABLE opledger.webhook_attempts (
        seq         bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        endpoint    text    NOT NULL,
        position    bigint  NOT NULL,
        webhook_id  text    NOT NULL,
        attempt     bigint  NOT NULL,
        at          timestamptz NOT NULL,
        status      integer,
        duration_ms bigint  NOT NULL,
        error       text
    );
    CREATE INDEX webhook_attempts_by_endpoint ON opledger.webhook_attempts (endpoint, seq);
";

/// Version 3: the ledger's identity (`identity.rs`), one row written once when the schema is
/// made, so a connection can tell this ledger from another and, with the cluster's system
/// identifier, timeline and the log's head, from an older copy of it. The id is made by the
/// server, from what differs between any two databases made anywhere (`gen_random_uuid` is
/// PostgreSQL 13's; this works on every version the store supports).
const LEDGER_IDENTITY: &str = "
    CREATE TABLE opledger.ledger (
        singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
        ledger_id  uuid        NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
    );
    INSERT INTO opledger.ledger (ledger_id)
    SELECT md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text
               || system_identifier::text)::uuid
    FROM pg_control_system();
";

/// Version 4: the transparency log's tree (`tree.rs`): its stored hashes, the checkpoints kept
/// over it, and beside the log's head the tree's size and frontier, which the writer reads and
/// moves under the same lock as the head. A database from before it gets its tree built from its
/// log in the migration's transaction ([`crate::tree::rebuild`]).
const LOG_TREE: &str = "
    ALTER TABLE opledger.log_head
        ADD COLUMN tree_size     bigint NOT NULL DEFAULT 0 CHECK (tree_size >= 0),
        ADD COLUMN tree_frontier bytea  NOT NULL DEFAULT '\\x';
    CREATE TABLE opledger.log_tree (
        stored_index bigint PRIMARY KEY CHECK (stored_index >= 0),
        hash         bytea  NOT NULL CHECK (length(hash) = 32)
    );
    CREATE TABLE opledger.log_checkpoints (
        tree_size bigint PRIMARY KEY CHECK (tree_size >= 0),
        note      text   NOT NULL
    );
";

/// The schema version from which the log's tree exists.
const TREE_VERSION: i32 = 4;
/// The schema version from which the tenants' trees exist.
const TENANT_TREES_VERSION: i32 = 6;

/// Version 5: operators' claims on review items (`review_claims.rs`), one row per claimed
/// operation with its holder and an expiry in the database's clock, so every instance on the
/// database refuses a second claimer (expired rows are deleted by the next claim that meets
/// them); and the webhook endpoints defined through the API (`webhook_journal.rs`), one JSON
/// definition per endpoint, which every instance reads.
const REVIEW_CLAIMS: &str = "
    CREATE TABLE opledger.webhook_definitions (
        id         text PRIMARY KEY,
        definition text NOT NULL
    );
    CREATE TABLE opledger.review_claims (
        operation_id uuid        PRIMARY KEY,
        holder       text        NOT NULL,
        expires_at   timestamptz NOT NULL
    );
    CREATE INDEX review_claims_by_expiry ON opledger.review_claims (expires_at);
";

/// Version 6: the tenants' trees (`tenant_trees.rs`): one frontier per tenant, the log size they
/// cover beside the log's head (moved by the writer under the same lock; `NULL` until they are
/// built), and each stream's tenant on its row, so the writer reads a stream's tenant with the
/// stream. A database from before them gets them built from its log in the migration's
/// transaction ([`crate::tenant_trees::rebuild`]).
const TENANT_TREES: &str = "
    ALTER TABLE opledger.log_head
        ADD COLUMN tenants_size bigint CHECK (tenants_size >= 0);
    ALTER TABLE opledger.streams ADD COLUMN tenant text;
    CREATE TABLE opledger.tenant_trees (
        tenant   text   PRIMARY KEY,
        size     bigint NOT NULL CHECK (size > 0),
        frontier bytea  NOT NULL
    );
";

/// The version the database holds (0: no opledger schema yet), read without changing anything.
async fn found_version(client: &impl GenericClient) -> Result<i32, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT to_regclass('opledger.schema_version') IS NOT NULL",
            &[],
        )
        .await?;
    if !row.get::<_, bool>(0) {
        return Ok(0);
    }
    let row = client
        .query_opt("SELECT version FROM opledger.schema_version", &[])
        .await?;
    Ok(row.map_or(0, |row| row.get(0)))
}

/// What [`prepare`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Migration {
    /// The version found (0: no opledger schema yet).
    pub from: i32,
    /// The version left (this build's [`SCHEMA_VERSION`]).
    pub to: i32,
    /// Leaves the log's tree was built with from the log, when this migration created the tree
    /// for a log that already held events.
    pub tree_built: Option<u64>,
    /// Leaves of the log the tenants' trees were built from, when start-up built them (a
    /// database from before them, or trees that did not cover the log's tree).
    pub tenant_trees_built: Option<u64>,
}

impl Migration {
    /// Whether the database was already at this build's version.
    pub fn changed_nothing(&self) -> bool {
        self.from == self.to
    }
}

/// Builds the tree again from the log when its rows were all removed (as in the SQLite ledger:
/// a rebuild trusts the log as it is then, and checkpoints kept outside the ledger still catch
/// what was changed before it). A tree that exists but is behind its log is never extended.
async fn rebuild_emptied_tree(
    client: &mut Client,
    database: &str,
) -> Result<Option<u64>, PostgresError> {
    let setup = |error: tokio_postgres::Error| PostgresError::Setup {
        reason: format!(
            "cannot read the log's tree in database `{database}`: {}",
            crate::describe(&error)
        ),
    };
    let emptied = "SELECT tree_size = 0 AND last_position > 0 \
                   AND NOT EXISTS (SELECT 1 FROM opledger.log_tree) FROM opledger.log_head";
    if !client
        .query_one(emptied, &[])
        .await
        .map_err(setup)?
        .get::<_, bool>(0)
    {
        return Ok(None);
    }
    let transaction = client.transaction().await.map_err(setup)?;
    transaction
        .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await
        .map_err(setup)?;
    // Another instance may have built it while this one waited for the lock.
    if !transaction
        .query_one(emptied, &[])
        .await
        .map_err(setup)?
        .get::<_, bool>(0)
    {
        return Ok(None);
    }
    let built = crate::tree::rebuild(&transaction)
        .await
        .map_err(|reason| PostgresError::Setup { reason })?;
    transaction.commit().await.map_err(setup)?;
    Ok(Some(built))
}

/// SQLSTATE 42501: the role lacks a privilege (here: to create or alter opledger's tables).
const INSUFFICIENT_PRIVILEGE: &str = "42501";

/// Creates or migrates the schema, refusing a newer one before changing anything. A role that
/// may not change the schema (one granted only reads and writes of its rows) is refused with
/// what to run instead.
pub(crate) async fn prepare(
    client: &mut Client,
    database: &str,
) -> Result<Migration, PostgresError> {
    let setup = |error: tokio_postgres::Error| PostgresError::Setup {
        reason: format!(
            "cannot create or read opledger's tables in database `{database}`: {}",
            crate::describe(&error)
        ),
    };
    let newer = |found: i32| PostgresError::NewerSchema {
        database: database.to_owned(),
        found,
        supported: SCHEMA_VERSION,
    };
    let found = found_version(client).await.map_err(setup)?;
    if found > SCHEMA_VERSION {
        return Err(newer(found));
    }
    if found == SCHEMA_VERSION {
        let tree_built = rebuild_emptied_tree(client, database).await?;
        let tenant_trees_built = crate::tenant_trees::rebuild_if_behind(client, MIGRATION_LOCK_KEY)
            .await
            .map_err(|reason| PostgresError::Setup { reason })?;
        return Ok(Migration {
            from: found,
            to: found,
            tree_built,
            tenant_trees_built,
        });
    }
    let not_owner = |error: tokio_postgres::Error| match error.code() {
        Some(code) if code.code() == INSUFFICIENT_PRIVILEGE => PostgresError::SchemaNotOwned {
            database: database.to_owned(),
            found,
            needed: SCHEMA_VERSION,
            reason: crate::describe(&error),
        },
        _ => setup(error),
    };
    let transaction = client.transaction().await.map_err(setup)?;
    transaction
        .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await
        .map_err(setup)?;
    transaction
        .batch_execute(
            "CREATE SCHEMA IF NOT EXISTS opledger;
             CREATE TABLE IF NOT EXISTS opledger.schema_version (
                 singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
                 version   integer NOT NULL
             );",
        )
        .await
        .map_err(not_owner)?;
    // Another instance may have migrated while this one waited for the lock.
    let found = found_version(&transaction).await.map_err(setup)?;
    if found > SCHEMA_VERSION {
        return Err(newer(found));
    }
    for (from, migration) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tracing::info!(
            from,
            to = from + 1,
            "migrating the PostgreSQL store's schema"
        );
        transaction
            .batch_execute(migration)
            .await
            .map_err(not_owner)?;
    }
    // A log from before the tree gets one built from it, in this transaction: the tree is
    // rebuildable from the log alone. (A new schema's log is empty; its tree is too.)
    let tree_built = match (1..TREE_VERSION).contains(&found) {
        true => Some(
            crate::tree::rebuild(&transaction)
                .await
                .map_err(|reason| PostgresError::Setup { reason })?,
        ),
        false => None,
    };
    // And a log from before the tenants' trees gets them built from it, after its tree (a new
    // schema's are built empty, so they cover its empty tree).
    let tenant_trees_built = match found < TENANT_TREES_VERSION {
        true => Some(
            crate::tenant_trees::rebuild(&transaction)
                .await
                .map_err(|reason| PostgresError::Setup { reason })?,
        ),
        false => None,
    };
    transaction
        .execute(
            "INSERT INTO opledger.schema_version (version) VALUES ($1)
             ON CONFLICT (singleton) DO UPDATE SET version = excluded.version",
            &[&SCHEMA_VERSION],
        )
        .await
        .map_err(setup)?;
    transaction.commit().await.map_err(setup)?;
    Ok(Migration {
        from: found,
        to: SCHEMA_VERSION,
        tree_built,
        tenant_trees_built,
    })
}
