//! The event store on a KurrentDB (EventStoreDB) node or cluster, through the official `kurrentdb`
//! gRPC client: the store for running several `opledger serve` instances on one ledger.
//!
//! The port maps onto KurrentDB directly: a port stream is a KurrentDB stream (`operation-<uuid>`,
//! so the server's category features work), an expected version is an expected revision, and the
//! global log is `$all` filtered on the streams' prefix. What this adapter adds is care:
//! - every append states its stream state (no stream, or an exact revision; never "any", the
//!   client's default) and a deadline, and goes to the leader;
//! - an append whose answer is lost (deadline exceeded, server error, connection closed, a
//!   leader change) is resolved by reading the stream back and looking for our event ids: found →
//!   success, someone else's → a version conflict, nothing there yet → "outcome unknown", which
//!   the domain answers by sending the very same events again (their ids are deterministic, so
//!   the server treats that as idempotent). It never re-appends with new ids;
//! - positions: see `codec.rs`; subscriptions: see `subscription.rs`;
//! - a client whose connection task has died (the official client gives up for good when a node
//!   is unreachable while it reconnects) is replaced by a fresh one from the same settings.
//!
//! One difference from the SQLite store is the server's, not ours: KurrentDB compares event ids
//! only at the expected revision, so an id already stored in another stream is not refused. The
//! domain's ids embed the operation and the version, so opledger itself never reuses one.
//!
//! Use [`KurrentDbStore::connect`] with a connection string.

mod codec;
mod config;
mod resolve;
mod subscription;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kurrentdb::{
    AppendToStreamOptions, Client, ReadAllOptions, ReadStreamOptions, StreamPosition, StreamState,
    SubscriptionFilter,
};
use opledger_domain::ids::{GlobalPosition, StreamVersion};
use opledger_domain::store::{
    AppendOutcome, EventData, EventStore, ExpectedVersion, LogStart, RecordedEvent, StoreError,
    StreamName, MAX_READ_BATCH,
};
use tracing::{debug, instrument, warn};

use super::rules;

pub use config::{
    KurrentDbConfig, DEFAULT_APPEND_DEADLINE_MS, DEFAULT_READ_DEADLINE_MS,
    DEFAULT_RESUBSCRIBE_ATTEMPTS, PASSWORD_VAR, SCHEMES, USERNAME_VAR,
};
pub use subscription::KurrentDbSubscription;

/// Failures to set the store up; once it runs, failures are the port's [`StoreError`]s.
#[derive(Debug, thiserror::Error)]
pub enum KurrentDbError {
    /// The connection string (or a setting derived from it) is not usable.
    #[error("the KurrentDB connection string is not usable: {reason}")]
    InvalidConnectionString {
        /// What is wrong, without the password.
        reason: String,
    },
    /// The credential variables are half set.
    #[error("KurrentDB credentials: {reason}")]
    Credentials {
        /// What is wrong.
        reason: String,
    },
    /// The client could not be created.
    #[error("the KurrentDB client could not start: {reason}")]
    Client {
        /// The client's reason.
        reason: String,
    },
    /// The server did not answer a first read.
    #[error("KurrentDB did not answer: {source}")]
    Unreachable {
        /// The read's failure.
        source: StoreError,
    },
}

/// The KurrentDB event store. Cloning gives another handle to the same client.
#[derive(Clone, Debug)]
pub struct KurrentDbStore {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    config: KurrentDbConfig,
    client: Mutex<ClientSlot>,
}

/// The current client and how many times it has been replaced.
struct ClientSlot {
    generation: u64,
    client: Client,
}

impl std::fmt::Debug for ClientSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSlot")
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl KurrentDbStore {
    /// Connects to the node or cluster named by `connection_string` (`kurrentdb://…`,
    /// `kurrentdb+discover://…`, `esdb://…`, `esdb+discover://…`), with credentials from
    /// [`USERNAME_VAR`] / [`PASSWORD_VAR`] when set, and checks the server answers a read.
    /// Must be called inside a tokio runtime; the client's connection task runs on it.
    ///
    /// ```no_run
    /// # async fn serve() -> Result<(), opledger_store::kurrentdb::KurrentDbError> {
    /// use opledger_store::kurrentdb::KurrentDbStore;
    /// let store = KurrentDbStore::connect("esdb://node1:2113,node2:2113,node3:2113?tls=true&nodePreference=leader").await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn connect(connection_string: &str) -> Result<Self, KurrentDbError> {
        Self::connect_with(KurrentDbConfig::from_connection_string(connection_string)?).await
    }

    /// Connects with a configuration built by [`KurrentDbConfig::from_connection_string`] and
    /// adjusted (deadlines, namespace, log prefix).
    pub async fn connect_with(config: KurrentDbConfig) -> Result<Self, KurrentDbError> {
        config.validate()?;
        let client =
            Client::new(config.settings.clone()).map_err(|error| KurrentDbError::Client {
                reason: error.to_string(),
            })?;
        let store = Self {
            shared: Arc::new(Shared {
                config,
                client: Mutex::new(ClientSlot {
                    generation: 0,
                    client,
                }),
            }),
        };
        store
            .head_position()
            .await
            .map_err(|source| KurrentDbError::Unreachable { source })?;
        Ok(store)
    }

    /// The configuration in force.
    pub fn config(&self) -> &KurrentDbConfig {
        &self.shared.config
    }

    fn slot(&self) -> MutexGuard<'_, ClientSlot> {
        // The slot is replaced whole; a panic elsewhere cannot leave it half written.
        self.shared
            .client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The current client and its generation.
    fn client(&self) -> (u64, Client) {
        let slot = self.slot();
        (slot.generation, slot.client.clone())
    }

    /// Replaces the client of `generation` if `error` says its connection task has ended; a
    /// client already replaced by another caller is left alone.
    fn renew_if_dead(&self, generation: u64, error: &kurrentdb::Error) {
        let dead = matches!(
            error,
            kurrentdb::Error::ConnectionClosed | kurrentdb::Error::GrpcConnectionError(_)
        );
        if !dead {
            return;
        }
        let mut slot = self.slot();
        if slot.generation != generation {
            return;
        }
        match Client::new(self.shared.config.settings.clone()) {
            Ok(client) => {
                warn!(%error, generation, "the KurrentDB client's connection ended; starting a new client");
                slot.client = client;
                slot.generation += 1;
            }
            Err(error) => {
                warn!(%error, "a new KurrentDB client could not start; keeping the old one")
            }
        }
    }

    fn server_stream(&self, stream: &StreamName) -> String {
        format!("{}{}", self.shared.config.namespace, stream.as_str())
    }

    fn append_deadline(&self) -> Duration {
        Duration::from_millis(self.shared.config.append_deadline_ms)
    }

    fn read_deadline(&self) -> Duration {
        Duration::from_millis(self.shared.config.read_deadline_ms)
    }

    fn log_filter(&self) -> SubscriptionFilter {
        SubscriptionFilter::on_stream_name().add_prefix(self.shared.config.log_stream_prefix())
    }

    fn with_credentials<O>(
        &self,
        options: O,
        authenticate: impl FnOnce(O, kurrentdb::Credentials) -> O,
    ) -> O {
        match &self.shared.config.credentials {
            Some(credentials) => authenticate(options, credentials.clone()),
            None => options,
        }
    }

    /// Up to `max_count` events of `stream` from `from` on, as the server has them; a missing
    /// stream reads as empty. Bounded by the read deadline, which the client does not enforce.
    async fn read_stream_events(
        &self,
        stream: &StreamName,
        from: StreamVersion,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        self.within_read_deadline(self.read_stream_unbounded(stream, from, max_count))
            .await
    }

    async fn read_stream_unbounded(
        &self,
        stream: &StreamName,
        from: StreamVersion,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let max_count = max_count.min(MAX_READ_BATCH);
        if max_count == 0 {
            return Ok(Vec::new());
        }
        let options = ReadStreamOptions::default()
            .forwards()
            .position(StreamPosition::Position(from.value()))
            .max_count(max_count)
            .requires_leader(true)
            .deadline(self.read_deadline());
        let options = self.with_credentials(options, |options, credentials| {
            options.authenticated(credentials)
        });
        let (generation, client) = self.client();
        let mut read = match client
            .read_stream(self.server_stream(stream), &options)
            .await
        {
            Ok(read) => read,
            Err(error) => return Err(self.read_failed(generation, &error)),
        };
        let mut events = Vec::with_capacity(max_count.min(64));
        loop {
            match read.next().await {
                Ok(Some(resolved)) => {
                    if let Some(event) =
                        codec::recorded_event(&resolved, &self.shared.config.namespace)?
                    {
                        events.push(event);
                    }
                }
                Ok(None) => break,
                // The server answers a missing stream with "not found": the port reads it as empty.
                Err(kurrentdb::Error::ResourceNotFound) => return Ok(Vec::new()),
                Err(error) => return Err(self.read_failed(generation, &error)),
            }
            if events.len() >= max_count {
                break;
            }
        }
        Ok(events)
    }

    /// The last version of `stream` (`None`: it does not exist).
    async fn last_version(&self, stream: &StreamName) -> Result<Option<StreamVersion>, StoreError> {
        self.within_read_deadline(self.last_version_unbounded(stream))
            .await
    }

    async fn last_version_unbounded(
        &self,
        stream: &StreamName,
    ) -> Result<Option<StreamVersion>, StoreError> {
        let options = ReadStreamOptions::default()
            .backwards()
            .position(StreamPosition::End)
            .max_count(1)
            .requires_leader(true)
            .deadline(self.read_deadline());
        let options = self.with_credentials(options, |options, credentials| {
            options.authenticated(credentials)
        });
        let (generation, client) = self.client();
        let mut read = match client
            .read_stream(self.server_stream(stream), &options)
            .await
        {
            Ok(read) => read,
            Err(error) => return Err(self.read_failed(generation, &error)),
        };
        match read.next().await {
            Ok(Some(resolved)) => Ok(resolved
                .event
                .as_ref()
                .map(|event| StreamVersion::new(event.revision))),
            Ok(None) | Err(kurrentdb::Error::ResourceNotFound) => Ok(None),
            Err(error) => Err(self.read_failed(generation, &error)),
        }
    }

    /// Reads the log: forwards from `start` (the server's reads include the position named, the
    /// port's exclude it) or backwards from the end.
    async fn read_log(
        &self,
        start: Option<LogStart>,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        self.within_read_deadline(self.read_log_unbounded(start, max_count))
            .await
    }

    /// Runs a read under the read deadline.
    async fn within_read_deadline<T>(
        &self,
        read: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.read_deadline(), read)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Unavailable {
                    reason: format!(
                        "KurrentDB did not answer a read within {} ms",
                        self.shared.config.read_deadline_ms
                    ),
                })
            })
    }

    async fn read_log_unbounded(
        &self,
        start: Option<LogStart>,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let max_count = max_count.min(MAX_READ_BATCH);
        if max_count == 0 {
            return Ok(Vec::new());
        }
        let options = ReadAllOptions::default().filter(self.log_filter());
        let (options, after) = match start {
            None => (
                options
                    .backwards()
                    .position(StreamPosition::End)
                    .max_count(max_count),
                None,
            ),
            Some(LogStart::Beginning) => (
                options
                    .forwards()
                    .position(StreamPosition::Start)
                    .max_count(max_count),
                None,
            ),
            // One more than asked: the event at `after` itself comes back first and is dropped.
            Some(LogStart::After(after)) => (
                options
                    .forwards()
                    .position(StreamPosition::Position(codec::server_position(after)))
                    .max_count(max_count + 1),
                Some(after),
            ),
        };
        let options = options.requires_leader(true).deadline(self.read_deadline());
        let options = self.with_credentials(options, |options, credentials| {
            options.authenticated(credentials)
        });
        let (generation, client) = self.client();
        let mut read = match client.read_all(&options).await {
            Ok(read) => read,
            Err(error) => return Err(self.read_failed(generation, &error)),
        };
        let mut events = Vec::with_capacity(max_count.min(64));
        while events.len() < max_count {
            match read.next().await {
                Ok(Some(resolved)) => {
                    let Some(event) =
                        codec::recorded_event(&resolved, &self.shared.config.namespace)?
                    else {
                        continue;
                    };
                    if after.is_some_and(|after| event.position <= after) {
                        continue;
                    }
                    events.push(event);
                }
                Ok(None) => break,
                Err(error) => return Err(self.read_failed(generation, &error)),
            }
        }
        Ok(events)
    }

    /// Maps a read failure, replacing a dead client on the way.
    fn read_failed(&self, generation: u64, error: &kurrentdb::Error) -> StoreError {
        self.renew_if_dead(generation, error);
        match error {
            kurrentdb::Error::AccessDenied => StoreError::Unavailable {
                reason: "KurrentDB denied access; check the credentials".into(),
            },
            other => StoreError::Unavailable {
                reason: format!("KurrentDB read failed: {other}"),
            },
        }
    }
}

impl EventStore for KurrentDbStore {
    type Subscription = KurrentDbSubscription;

    #[instrument(skip_all, fields(stream = %stream, operation_id = ?stream.operation_id(), ?expected, events = events.len()))]
    async fn append(
        &self,
        stream: &StreamName,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> Result<AppendOutcome, StoreError> {
        rules::check_append(stream, &events)?;
        let state = match expected {
            ExpectedVersion::NoStream => StreamState::NoStream,
            ExpectedVersion::Exact(version) => StreamState::StreamRevision(version.value()),
        };
        let options = AppendToStreamOptions::default()
            .stream_state(state)
            .deadline(self.append_deadline())
            .requires_leader(true);
        let options = self.with_credentials(options, |options, credentials| {
            options.authenticated(credentials)
        });
        let proposed: Vec<_> = events.iter().map(codec::client_event).collect();
        let (generation, client) = self.client();
        // The client only sends the deadline to the server (`grpc-timeout`); it does not enforce
        // it itself, so a connection that hangs would hang the append. Enforced here too.
        let answer = tokio::time::timeout(
            self.append_deadline(),
            client.append_to_stream(self.server_stream(stream), &options, proposed),
        )
        .await
        .unwrap_or(Err(kurrentdb::Error::DeadlineExceeded));
        match answer {
            Ok(written) => resolve::written(self, stream, expected, &events, written).await,
            Err(kurrentdb::Error::WrongExpectedVersion { current, .. }) => {
                Err(StoreError::VersionConflict {
                    stream: stream.clone(),
                    expected,
                    actual: match current {
                        kurrentdb::CurrentRevision::Current(revision) => {
                            Some(StreamVersion::new(revision))
                        }
                        kurrentdb::CurrentRevision::NoStream => None,
                    },
                })
            }
            // Refused before anything was written.
            Err(kurrentdb::Error::AccessDenied) => Err(StoreError::Unavailable {
                reason: "KurrentDB denied the append; check the credentials".into(),
            }),
            Err(kurrentdb::Error::ResourceDeleted) => Err(StoreError::InvalidAppend {
                reason: format!("stream `{stream}` was deleted on the server"),
            }),
            Err(error) => {
                // Anything else may have happened after the server wrote: find out.
                debug!(%error, "append answer lost; reading the stream back");
                self.renew_if_dead(generation, &error);
                resolve::unclear(self, stream, expected, &events, &error.to_string()).await
            }
        }
    }

    async fn read_stream(
        &self,
        stream: &StreamName,
        from: StreamVersion,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        self.read_stream_events(stream, from, max_count).await
    }

    async fn read_all(
        &self,
        start: LogStart,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        self.read_log(Some(start), max_count).await
    }

    async fn head_position(&self) -> Result<Option<GlobalPosition>, StoreError> {
        Ok(self
            .read_log(None, 1)
            .await?
            .first()
            .map(|event| event.position))
    }

    async fn subscribe_all(&self, start: LogStart) -> Result<KurrentDbSubscription, StoreError> {
        Ok(KurrentDbSubscription::new(self.clone(), start))
    }
}
