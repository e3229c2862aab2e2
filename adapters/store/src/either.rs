//! Any event store, chosen at run time: the embedded SQLite file, a KurrentDB cluster or a
//! PostgreSQL database.
//! One enum rather than generics through every caller (a server's handlers, a test harness):
//! the choice is made once, at start, and each call is a match on it. It adds nothing to
//! either store's semantics.

use super::kurrentdb::{KurrentDbStore, KurrentDbSubscription};
use super::sqlite::{SqliteStore, SqliteSubscription};
use opledger_domain::ids::{GlobalPosition, StreamVersion};
use opledger_domain::merkle::{Hash, LogTree, TenantHeads};
use opledger_domain::store::{
    AppendOutcome, EventData, EventStore, EventView, ExpectedVersion, LogStart, RecordedEvent,
    StoreError, StreamName, Subscription,
};
use opledger_postgres::{PostgresStore, PostgresSubscription};

/// Either store.
#[derive(Clone, Debug)]
pub enum AnyStore {
    /// The embedded SQLite file.
    Sqlite(SqliteStore),
    /// A KurrentDB (EventStoreDB) node or cluster.
    KurrentDb(KurrentDbStore),
    /// A PostgreSQL database.
    Postgres(PostgresStore),
}

impl AnyStore {
    /// Waits until every acknowledged append is durable and closes the store.
    pub async fn close(self) -> Result<(), StoreError> {
        match self {
            Self::Sqlite(store) => store.close().await,
            // Every KurrentDB append is acknowledged only once the cluster has it; there is
            // nothing to flush.
            Self::KurrentDb(_) => Ok(()),
            Self::Postgres(store) => store.close().await,
        }
    }
}

/// A subscription of either store.
pub enum AnySubscription {
    /// The SQLite store's.
    Sqlite(SqliteSubscription),
    /// The KurrentDB store's (boxed: it is much larger than the SQLite one).
    KurrentDb(Box<KurrentDbSubscription>),
    /// The PostgreSQL store's.
    Postgres(PostgresSubscription),
}

impl Subscription for AnySubscription {
    async fn next(&mut self) -> Result<RecordedEvent, StoreError> {
        match self {
            Self::Sqlite(subscription) => subscription.next().await,
            Self::KurrentDb(subscription) => subscription.next().await,
            Self::Postgres(subscription) => subscription.next().await,
        }
    }
}

impl EventStore for AnyStore {
    type Subscription = AnySubscription;

    async fn append(
        &self,
        stream: &StreamName,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> Result<AppendOutcome, StoreError> {
        match self {
            Self::Sqlite(store) => store.append(stream, expected, events).await,
            Self::KurrentDb(store) => store.append(stream, expected, events).await,
            Self::Postgres(store) => store.append(stream, expected, events).await,
        }
    }

    async fn read_stream(
        &self,
        stream: &StreamName,
        from: StreamVersion,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        match self {
            Self::Sqlite(store) => store.read_stream(stream, from, max_count).await,
            Self::KurrentDb(store) => store.read_stream(stream, from, max_count).await,
            Self::Postgres(store) => store.read_stream(stream, from, max_count).await,
        }
    }

    async fn read_all(
        &self,
        start: LogStart,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        match self {
            Self::Sqlite(store) => store.read_all(start, max_count).await,
            Self::KurrentDb(store) => store.read_all(start, max_count).await,
            Self::Postgres(store) => store.read_all(start, max_count).await,
        }
    }

    async fn read_all_with<T, F>(
        &self,
        start: LogStart,
        max_count: usize,
        visit: F,
        into: Vec<T>,
    ) -> Result<Vec<T>, StoreError>
    where
        T: Send + 'static,
        F: FnMut(EventView<'_>) -> T + Send + 'static,
    {
        match self {
            Self::Sqlite(store) => store.read_all_with(start, max_count, visit, into).await,
            Self::KurrentDb(store) => store.read_all_with(start, max_count, visit, into).await,
            Self::Postgres(store) => store.read_all_with(start, max_count, visit, into).await,
        }
    }

    async fn head_position(&self) -> Result<Option<GlobalPosition>, StoreError> {
        match self {
            Self::Sqlite(store) => store.head_position().await,
            Self::KurrentDb(store) => store.head_position().await,
            Self::Postgres(store) => store.head_position().await,
        }
    }

    async fn subscribe_all(&self, start: LogStart) -> Result<AnySubscription, StoreError> {
        match self {
            Self::Sqlite(store) => store
                .subscribe_all(start)
                .await
                .map(AnySubscription::Sqlite),
            Self::KurrentDb(store) => store
                .subscribe_all(start)
                .await
                .map(|subscription| AnySubscription::KurrentDb(Box::new(subscription))),
            Self::Postgres(store) => store
                .subscribe_all(start)
                .await
                .map(AnySubscription::Postgres),
        }
    }
}

/// The transparency log's tree is kept by the SQLite and PostgreSQL stores, each in the
/// transaction of the events it covers. A KurrentDB store would need a tree of its own (its
/// `$all` positions are not leaf numbers; see docs/src/design/transparency-log-stores.md); until
/// then it says so, rather than serve a tree that does not cover its log.
impl LogTree for AnyStore {
    async fn tree_size(&self) -> Result<u64, StoreError> {
        match self {
            Self::Sqlite(store) => store.tree_size().await,
            Self::Postgres(store) => store.tree_size().await,
            Self::KurrentDb(_) => Err(self.no_tree()),
        }
    }

    async fn stored_hashes(&self, indexes: Vec<u64>) -> Result<Vec<Hash>, StoreError> {
        match self {
            Self::Sqlite(store) => store.stored_hashes(indexes).await,
            Self::Postgres(store) => store.stored_hashes(indexes).await,
            Self::KurrentDb(_) => Err(self.no_tree()),
        }
    }

    async fn keep_checkpoint(&self, size: u64, note: String) -> Result<(), StoreError> {
        match self {
            Self::Sqlite(store) => store.keep_checkpoint(size, note).await,
            Self::Postgres(store) => store.keep_checkpoint(size, note).await,
            Self::KurrentDb(_) => Err(self.no_tree()),
        }
    }

    async fn kept_checkpoint(
        &self,
        size: Option<u64>,
    ) -> Result<Option<(u64, String)>, StoreError> {
        match self {
            Self::Sqlite(store) => store.kept_checkpoint(size).await,
            Self::Postgres(store) => store.kept_checkpoint(size).await,
            Self::KurrentDb(_) => Err(self.no_tree()),
        }
    }

    async fn tenant_heads(&self) -> Result<Option<TenantHeads>, StoreError> {
        match self {
            Self::Sqlite(store) => store.tenant_heads().await,
            Self::Postgres(store) => store.tenant_heads().await,
            Self::KurrentDb(_) => Ok(None),
        }
    }
}

impl AnyStore {
    fn no_tree(&self) -> StoreError {
        StoreError::Unavailable {
            reason: "the KurrentDB store does not keep the transparency log's tree; use a SQLite or PostgreSQL ledger for checkpoints and proofs".into(),
        }
    }
}
