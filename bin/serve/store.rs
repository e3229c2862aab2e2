//! The ledger `serve` keeps: the embedded SQLite file or a KurrentDB cluster, chosen by the
//! configuration's `store` URL. One enum rather than generics through every handler: the
//! choice is made once, at start, and each call is a match on it.

use opledger_adapters::store::{KurrentDbStore, KurrentDbSubscription, SqliteSubscription};
use opledger_adapters::SqliteStore;
use opledger_domain::ids::{GlobalPosition, StreamVersion};
use opledger_domain::store::{
    AppendOutcome, EventData, EventStore, ExpectedVersion, LogStart, RecordedEvent, StoreError,
    StreamName, Subscription,
};

/// Either store.
#[derive(Clone)]
pub enum ServeStore {
    /// The embedded SQLite file.
    Sqlite(SqliteStore),
    /// A KurrentDB (EventStoreDB) node or cluster.
    KurrentDb(KurrentDbStore),
}

impl ServeStore {
    /// Waits until every acknowledged append is durable and closes the store.
    pub async fn close(self) -> Result<(), StoreError> {
        match self {
            Self::Sqlite(store) => store.close().await,
            // Every KurrentDB append is acknowledged only once the cluster has it; there is
            // nothing to flush.
            Self::KurrentDb(_) => Ok(()),
        }
    }
}

/// A subscription of either store.
pub enum ServeSubscription {
    /// The SQLite store's.
    Sqlite(SqliteSubscription),
    /// The KurrentDB store's (boxed: it is much larger than the SQLite one).
    KurrentDb(Box<KurrentDbSubscription>),
}

impl Subscription for ServeSubscription {
    async fn next(&mut self) -> Result<RecordedEvent, StoreError> {
        match self {
            Self::Sqlite(subscription) => subscription.next().await,
            Self::KurrentDb(subscription) => subscription.next().await,
        }
    }
}

impl EventStore for ServeStore {
    type Subscription = ServeSubscription;

    async fn append(
        &self,
        stream: &StreamName,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> Result<AppendOutcome, StoreError> {
        match self {
            Self::Sqlite(store) => store.append(stream, expected, events).await,
            Self::KurrentDb(store) => store.append(stream, expected, events).await,
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
        }
    }

    async fn head_position(&self) -> Result<Option<GlobalPosition>, StoreError> {
        match self {
            Self::Sqlite(store) => store.head_position().await,
            Self::KurrentDb(store) => store.head_position().await,
        }
    }

    async fn subscribe_all(&self, start: LogStart) -> Result<ServeSubscription, StoreError> {
        match self {
            Self::Sqlite(store) => store
                .subscribe_all(start)
                .await
                .map(ServeSubscription::Sqlite),
            Self::KurrentDb(store) => store
                .subscribe_all(start)
                .await
                .map(|subscription| ServeSubscription::KurrentDb(Box::new(subscription))),
        }
    }
}
