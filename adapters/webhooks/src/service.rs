//! The handle the server holds: starts one task per endpoint, and gives operators the
//! endpoints' state (with lag and counts), pause, resume, replay and the attempt log.
//!
//! With a shared journal (several instances on one database), one lease keeper per instance
//! renews the leases it holds every [`LEASE_RENEWALS_PER_LEASE`]th of the lease, and asks for
//! the free or expired ones at the same pace, so a killed instance's endpoints are taken over
//! within a lease and a renewal period. A renewal also tells the holder that an operator acted
//! on another instance (the endpoint's epoch moved), so its task reads the record again.
//!
//! It must never report an endpoint as delivering while its task is faulted or gone: `/healthz`
//! reads [`Webhooks::problem`].

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use opledger_domain::store::EventStore;
use serde::Serialize;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::client::client_for;
use crate::delivery::Unsaved;
use crate::delivery::{LeaseState, Task};
use crate::journal::{AttemptRecord, EndpointStatus, Journal};
use crate::latency::DeliveryLatency;
use crate::managed::Definition;
use crate::port::{Acquired, DeliveryJournal, Lease};
use crate::{
    Endpoint, Render, WebhookError, LEASE_RENEWALS_PER_LEASE, LEASE_VALID_PERCENT, MAX_ENDPOINTS,
};

/// How one instance takes part in delivering a shared journal's endpoints.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// This instance's name in the journal's leases: unique among the instances sharing it.
    pub holder: String,
    /// How long a lease lasts unrenewed, in milliseconds (`webhook_lease_ms`).
    pub lease_ms: u64,
}

/// What an endpoint's task is doing now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum DeliveryState {
    /// Following the log, delivering or waiting for events.
    Delivering,
    /// An event failed; the next attempt comes after a pause.
    Retrying {
        /// The event's position.
        position: u64,
        /// Failed attempts at it in a row.
        consecutive_failures: u32,
        /// The pause before the next, in milliseconds, as it was decided (it does not count
        /// down; `next_attempt_at` says when).
        retry_in_ms: u64,
        /// When the next attempt is due.
        next_attempt_at: DateTime<Utc>,
    },
    /// Paused by an operator.
    Paused,
    /// Another instance holds the endpoint's lease and delivers it; this one takes over if that
    /// lease runs out.
    Standby {
        /// The instance holding the lease, when known.
        #[serde(skip_serializing_if = "Option::is_none")]
        holder: Option<String>,
    },
    /// Disabled (410 Gone, or failing for its whole window); an operator resumes it.
    Disabled {
        /// Why.
        reason: String,
    },
    /// The journal or the log failed; the task starts again from the checkpoint after a pause.
    Faulted {
        /// What failed.
        error: String,
        /// The pause, in milliseconds, as it was decided.
        retry_in_ms: u64,
        /// When the task starts again.
        next_attempt_at: DateTime<Utc>,
    },
    /// The service is stopping.
    Finished,
}

/// An endpoint's counts and state, shared between its task and the handle.
#[derive(Clone, Debug)]
pub(crate) struct Health {
    inner: Arc<Mutex<Counts>>,
}

#[derive(Clone, Debug)]
struct Counts {
    state: DeliveryState,
    delivered_total: u64,
    failed_attempts_total: u64,
    disabled_total: u64,
    last_error: Option<String>,
    checkpoint: Option<u64>,
    latency: DeliveryLatency,
}

impl Health {
    fn new(checkpoint: Option<u64>) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Counts {
                state: DeliveryState::Delivering,
                delivered_total: 0,
                failed_attempts_total: 0,
                disabled_total: 0,
                last_error: None,
                checkpoint,
                latency: DeliveryLatency::default(),
            })),
        }
    }

    pub(crate) fn set(&self, state: DeliveryState) {
        self.lock().state = state;
    }

    pub(crate) fn checkpoint(&self, position: u64) {
        self.lock().checkpoint = Some(position);
    }

    /// One more delivery, `took` from its first attempt to the 2xx answered `at`; the
    /// checkpoint moves when its batch is written ([`Self::checkpoint`]).
    pub(crate) fn delivered(&self, took: Duration, at: DateTime<Utc>) {
        let mut counts = self.lock();
        counts.delivered_total += 1;
        counts.latency.delivered(took, at);
        counts.state = DeliveryState::Delivering;
    }

    pub(crate) fn failed(&self, error: Option<&str>) {
        let mut counts = self.lock();
        counts.failed_attempts_total += 1;
        counts.last_error = error.map(str::to_owned);
    }

    pub(crate) fn disabled(&self) {
        self.lock().disabled_total += 1;
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        // A few plain fields, each write complete on its own: a panic cannot leave them torn.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One endpoint as operators see it.
#[derive(Clone, Debug, Serialize)]
pub struct EndpointOverview {
    /// Its name.
    pub id: String,
    /// Where it delivers.
    pub url: String,
    /// The friendly event types it receives.
    pub events: Vec<String>,
    /// The tenants it receives (`None`: all).
    pub tenants: Option<Vec<String>>,
    /// Where it is defined: `configuration` (the file; changed there) or `api`.
    pub source: &'static str,
    /// The tenant whose own token defined it through the API (`None`: an operator's, or the
    /// file's); only that tenant's token (and operators) see it.
    pub managed_by: Option<String>,
    /// Active, paused or disabled, as the journal holds it.
    pub status: EndpointStatus,
    /// Why it is paused or disabled.
    pub reason: Option<String>,
    /// What its task is doing.
    pub delivery: DeliveryState,
    /// The last position delivered or skipped.
    pub checkpoint: Option<u64>,
    /// Positions of the log after the checkpoint: what it has still to go through.
    pub lag_positions: u64,
    /// Events delivered since the service started.
    pub delivered_total: u64,
    /// Failed attempts since the service started.
    pub failed_attempts_total: u64,
    /// Times it was disabled since the service started.
    pub disabled_total: u64,
    /// The last failed attempt's error.
    pub last_error: Option<String>,
    /// How long deliveries took since the service started, and the last 2xx (for `/metrics`).
    #[serde(skip)]
    pub latency: DeliveryLatency,
}

struct Handle {
    endpoint: Arc<Endpoint>,
    wake: Arc<Notify>,
    health: Health,
    lease: Arc<watch::Sender<LeaseState>>,
    /// Set to stop this endpoint's task alone (removed or redefined through the API); the
    /// service's stop reaches it too.
    stop: Arc<watch::Sender<bool>>,
    task: Mutex<Option<JoinHandle<()>>>,
    /// The endpoint's epoch at the keeper's last renewal: a change is an operator's action
    /// elsewhere.
    epoch: Mutex<Option<u64>>,
    /// For an endpoint defined through the API: the definition it runs, and when it changes by
    /// itself (a rotated-out secret's window ends).
    managed: Option<(String, Option<DateTime<Utc>>)>,
}

/// Starts an endpoint's task: the store and the renderer, whose types the handle does not carry.
trait Spawn: Send + Sync + 'static {
    fn spawn(
        &self,
        handle: &Handle,
        stop: watch::Receiver<bool>,
    ) -> Result<JoinHandle<()>, WebhookError>;

    fn head(&self) -> Pin<Box<dyn Future<Output = Result<Option<u64>, WebhookError>> + Send + '_>>;
}

struct Spawner<S, R> {
    store: S,
    render: Arc<R>,
    journal: Arc<dyn DeliveryJournal>,
    settings: LeaseSettings,
}

impl<S: EventStore + Clone + 'static, R: Render> Spawn for Spawner<S, R> {
    fn spawn(
        &self,
        handle: &Handle,
        stop: watch::Receiver<bool>,
    ) -> Result<JoinHandle<()>, WebhookError> {
        let task = Task {
            store: self.store.clone(),
            render: Arc::clone(&self.render),
            journal: Arc::clone(&self.journal),
            client: client_for(&handle.endpoint)?,
            held: Lease {
                endpoint: handle.endpoint.id.clone(),
                holder: self.settings.holder.clone(),
                token: 0,
            },
            endpoint: Arc::clone(&handle.endpoint),
            unsaved: Unsaved::default(),
            wake: Arc::clone(&handle.wake),
            health: handle.health.clone(),
            stop,
            lease: handle.lease.subscribe(),
            renew_every_ms: self.settings.lease_ms / LEASE_RENEWALS_PER_LEASE,
        };
        Ok(tokio::spawn(task.run()))
    }

    fn head(&self) -> Pin<Box<dyn Future<Output = Result<Option<u64>, WebhookError>> + Send + '_>> {
        Box::pin(async move { Ok(self.store.head_position().await?.map(|head| head.value())) })
    }
}

/// The endpoints running now and how to start more: shared by the handle and the lease keeper.
struct Registry {
    journal: Arc<dyn DeliveryJournal>,
    spawner: Box<dyn Spawn>,
    settings: LeaseSettings,
    handles: Mutex<Vec<Arc<Handle>>>,
    /// The service's stop.
    stop: watch::Receiver<bool>,
    /// Serialises [`Registry::sync`] so two callers never start one endpoint twice.
    syncing: tokio::sync::Mutex<()>,
}

impl Registry {
    fn handles(&self) -> Vec<Arc<Handle>> {
        self.handles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Gives the endpoint a record (a new one starts at the log's head) and starts its task.
    async fn start(
        &self,
        endpoint: Endpoint,
        managed: Option<(String, Option<DateTime<Utc>>)>,
        head: Option<u64>,
    ) -> Result<(), WebhookError> {
        let record = self.journal.ensure(&endpoint.id, head).await?;
        // An embedded journal's one process holds every lease for ever; a shared one's leases
        // are asked for by the keeper.
        let initial = if self.journal.shared() {
            LeaseState::Standby { holder: None }
        } else {
            match self
                .journal
                .acquire(&endpoint.id, &self.settings.holder, self.settings.lease_ms)
                .await?
            {
                Acquired::Held(lease) => LeaseState::Held {
                    lease,
                    valid_until: None,
                },
                Acquired::HeldBy(holder) => LeaseState::Standby {
                    holder: Some(holder),
                },
            }
        };
        let (own_stop, stopped) = watch::channel(false);
        let handle = Arc::new(Handle {
            endpoint: Arc::new(endpoint),
            wake: Arc::new(Notify::new()),
            health: Health::new(record.checkpoint),
            lease: Arc::new(watch::channel(initial).0),
            stop: Arc::new(own_stop),
            task: Mutex::new(None),
            epoch: Mutex::new(None),
            managed,
        });
        let task = self.spawner.spawn(&handle, stopped)?;
        *handle.task.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
        // The service's stop reaches the task through its own stop; the forwarder ends with the
        // task (its receiver dropped) or with the service.
        let (mut service_stop, own) = (self.stop.clone(), Arc::clone(&handle.stop));
        tokio::spawn(async move {
            tokio::select! {
                _ = service_stop.wait_for(|stop| *stop) => { own.send_replace(true); }
                () = own.closed() => {}
            }
        });
        self.handles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(handle);
        Ok(())
    }

    /// Stops endpoint `id`'s task and forgets it; its journal record and attempts stay.
    async fn stop_one(&self, id: &str) {
        let removed = {
            let mut handles = self.handles.lock().unwrap_or_else(PoisonError::into_inner);
            let index = handles.iter().position(|handle| handle.endpoint.id == id);
            index.map(|index| handles.remove(index))
        };
        let Some(handle) = removed else {
            return;
        };
        handle.stop.send_replace(true);
        let task = handle
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
        let state = handle.lease.borrow().clone();
        if let LeaseState::Held { lease, .. } = state {
            if let Err(error) = self.journal.release(&lease).await {
                warn!(endpoint = %id, %error, "the webhook lease could not be given up");
            }
        }
    }

    /// Brings the running endpoints defined through the API in line with the journal's
    /// definitions: new ones started, changed ones restarted from their checkpoint, removed ones
    /// stopped, and those whose rotated-out secret's window ended restarted without it.
    async fn sync(&self) -> Result<(), WebhookError> {
        let _one_at_a_time = self.syncing.lock().await;
        let definitions = self.journal.definitions().await?;
        let now = Utc::now();
        let running = self.handles();
        for handle in running.iter().filter(|handle| handle.managed.is_some()) {
            let id = &handle.endpoint.id;
            let current = definitions.iter().find(|(defined, _)| defined == id);
            let (text, changes_at) = handle.managed.as_ref().expect("filtered on managed");
            let stale = match current {
                None => true,
                Some((_, defined)) => defined != text || changes_at.is_some_and(|at| at <= now),
            };
            if stale {
                self.stop_one(id).await;
            }
        }
        let head = self.spawner.head().await?;
        for (id, text) in definitions {
            let known = self.handles().iter().any(|handle| handle.endpoint.id == id);
            if known {
                continue;
            }
            let definition = match Definition::parse(&text) {
                Ok(definition) => definition,
                Err(error) => {
                    warn!(endpoint = %id, %error, "a webhook endpoint's definition cannot be used; it is not delivered");
                    continue;
                }
            };
            let endpoint = match definition.endpoint(&id, now) {
                Ok(endpoint) => endpoint,
                Err(error) => {
                    warn!(endpoint = %id, %error, "a webhook endpoint's definition cannot be used; it is not delivered");
                    continue;
                }
            };
            if self.handles().len() >= MAX_ENDPOINTS {
                warn!(endpoint = %id, "more webhook endpoints are defined than one server delivers ({MAX_ENDPOINTS}); this one is not delivered");
                continue;
            }
            let changes_at = definition.next_change(now);
            self.start(endpoint, Some((text, changes_at)), head).await?;
        }
        Ok(())
    }
}

/// The webhooks of one server.
pub struct Webhooks {
    /// `None` on a ledger without a journal (KurrentDB): nothing is delivered.
    registry: Option<Arc<Registry>>,
    /// The lease keeper, with a shared journal; taken by [`Webhooks::join`].
    keeper: Mutex<Option<JoinHandle<()>>>,
}

impl Webhooks {
    /// Opens the journal at `journal_path`, gives every endpoint a record (a new one starts at
    /// `head`, the log's newest position now), and starts one task per endpoint that runs until
    /// `stop` says `true`.
    pub async fn start<S: EventStore + Clone + 'static, R: Render>(
        store: &S,
        render: Arc<R>,
        endpoints: Vec<Endpoint>,
        journal_path: &Path,
        stop: watch::Receiver<bool>,
    ) -> Result<Self, WebhookError> {
        let journal = Arc::new(Journal::open(journal_path).await?);
        let settings = LeaseSettings {
            holder: format!("pid-{}", std::process::id()),
            lease_ms: crate::DEFAULT_WEBHOOK_LEASE_MS,
        };
        Self::start_with(store, render, endpoints, journal, settings, stop).await
    }

    /// Starts the configured endpoints and those defined through the API on `journal`, which
    /// may be shared with other instances (then each endpoint is delivered by whichever instance
    /// holds its lease).
    pub async fn start_with<S: EventStore + Clone + 'static, R: Render>(
        store: &S,
        render: Arc<R>,
        endpoints: Vec<Endpoint>,
        journal: Arc<dyn DeliveryJournal>,
        settings: LeaseSettings,
        stop: watch::Receiver<bool>,
    ) -> Result<Self, WebhookError> {
        assert!(
            endpoints.len() <= MAX_ENDPOINTS,
            "the configuration check bounds the endpoints"
        );
        let registry = Arc::new(Registry {
            spawner: Box::new(Spawner {
                store: store.clone(),
                render,
                journal: Arc::clone(&journal),
                settings: settings.clone(),
            }),
            journal: Arc::clone(&journal),
            settings: settings.clone(),
            handles: Mutex::new(Vec::new()),
            stop: stop.clone(),
            syncing: tokio::sync::Mutex::new(()),
        });
        let head = registry.spawner.head().await?;
        for endpoint in endpoints {
            registry.start(endpoint, None, head).await?;
        }
        registry.sync().await?;
        let keeper = tokio::spawn(keep_leases(Arc::clone(&registry), stop));
        Ok(Self {
            registry: Some(registry),
            keeper: Mutex::new(Some(keeper)),
        })
    }

    /// A server's webhooks when its ledger keeps no journal.
    pub fn none() -> Self {
        Self {
            registry: None,
            keeper: Mutex::new(None),
        }
    }

    /// Every endpoint, configured ones first, with its lag behind `head` (the log's newest
    /// position).
    pub async fn overview(&self, head: Option<u64>) -> Result<Vec<EndpointOverview>, WebhookError> {
        let Some(registry) = &self.registry else {
            return Ok(Vec::new());
        };
        let mut overviews = Vec::new();
        for handle in registry.handles() {
            overviews.push(self.overview_of(&handle, head).await?);
        }
        Ok(overviews)
    }

    /// One endpoint's overview.
    pub async fn endpoint(
        &self,
        id: &str,
        head: Option<u64>,
    ) -> Result<EndpointOverview, WebhookError> {
        let handle = self.handle(id)?;
        self.overview_of(&handle, head).await
    }

    /// The definition of an endpoint defined through the API (`None` for a configured one).
    pub async fn definition(&self, id: &str) -> Result<Option<Definition>, WebhookError> {
        let handle = self.handle(id)?;
        if handle.managed.is_none() {
            return Ok(None);
        }
        let stored = self
            .journal()?
            .definitions()
            .await?
            .into_iter()
            .find(|(defined, _)| defined == id)
            .ok_or_else(|| WebhookError::NoSuchEndpoint { id: id.to_owned() })?;
        Definition::parse(&stored.1)
            .map(Some)
            .map_err(|reason| WebhookError::Journal { reason })
    }

    /// Whether endpoint `id` comes from the configuration file (the API changes only its own).
    pub fn configured(&self, id: &str) -> bool {
        self.handle(id).is_ok_and(|handle| handle.managed.is_none())
    }

    /// Defines (or redefines) endpoint `id` and starts delivering it at once, without a restart.
    /// A new endpoint starts at the log's head, as a configured one does; a redefined one goes
    /// on from its checkpoint. Other instances sharing the journal pick it up within a lease
    /// renewal period.
    pub async fn define(&self, id: &str, definition: &Definition) -> Result<(), WebhookError> {
        let registry = self.registry()?;
        // Checked as it will be read back, so a definition that cannot run is never written.
        definition
            .endpoint(id, Utc::now())
            .map_err(|reason| WebhookError::Definition { reason })?;
        let exists = self.handle(id).is_ok();
        if !exists && registry.handles().len() >= MAX_ENDPOINTS {
            return Err(WebhookError::Definition {
                reason: format!("{MAX_ENDPOINTS} endpoints are defined already, the most one server delivers; delete one first"),
            });
        }
        if !exists {
            // A new endpoint (perhaps named as a deleted one was) starts at the head, not at an
            // old record's checkpoint.
            let head = registry.spawner.head().await?;
            registry.journal.ensure(id, head).await?;
            registry
                .journal
                .set_status(id, EndpointStatus::Active, None, Some(head), None)
                .await?;
        }
        registry.journal.define(id, Some(definition.text())).await?;
        registry.sync().await
    }

    /// Deletes endpoint `id` defined through the API and stops delivering it; its attempt log
    /// stays readable until the id is reused.
    pub async fn delete(&self, id: &str) -> Result<(), WebhookError> {
        let registry = self.registry()?;
        self.handle(id)?;
        registry.journal.define(id, None).await?;
        registry.sync().await
    }

    /// Sends `body` once to endpoint `id` now as delivery `webhook_id`, signed with its
    /// secrets, and records the attempt (at `position`, 0 for a test event that is no event of
    /// the log). Its answer: the status and error as recorded.
    pub async fn send_once(
        &self,
        id: &str,
        position: u64,
        webhook_id: &str,
        body: &[u8],
    ) -> Result<AttemptRecord, WebhookError> {
        let registry = self.registry()?;
        let handle = self.handle(id)?;
        let client = client_for(&handle.endpoint)?;
        let at = Utc::now();
        let attempted =
            crate::client::attempt(&client, &handle.endpoint, webhook_id, body, None).await;
        let (status, error) = match attempted.answer {
            crate::client::Answer::Delivered { status } => (Some(status), None),
            crate::client::Answer::Gone => (Some(410), Some("answered 410 Gone".to_owned())),
            crate::client::Answer::Failed { status, error, .. } => (status, Some(error)),
        };
        let record = AttemptRecord {
            endpoint: id.to_owned(),
            position,
            webhook_id: webhook_id.to_owned(),
            attempt: 1,
            at,
            status,
            duration_ms: u64::try_from(attempted.duration.as_millis()).unwrap_or(u64::MAX),
            error,
        };
        registry.journal.record_attempt(record.clone()).await?;
        Ok(record)
    }

    /// Picks up endpoints defined, changed or deleted on another instance sharing the journal.
    pub async fn sync(&self) -> Result<(), WebhookError> {
        self.registry()?.sync().await
    }

    async fn overview_of(
        &self,
        handle: &Handle,
        head: Option<u64>,
    ) -> Result<EndpointOverview, WebhookError> {
        let endpoint = &handle.endpoint;
        let record = self.journal()?.record(&endpoint.id).await?.ok_or_else(|| {
            WebhookError::NoSuchEndpoint {
                id: endpoint.id.clone(),
            }
        })?;
        let counts = handle.health.lock().clone();
        Ok(EndpointOverview {
            id: endpoint.id.clone(),
            url: endpoint.url.to_string(),
            events: endpoint.events.iter().cloned().collect(),
            tenants: endpoint
                .tenants
                .as_ref()
                .map(|tenants| tenants.iter().cloned().collect()),
            managed_by: handle
                .managed
                .as_ref()
                .and_then(|(text, _)| Definition::parse(text).ok())
                .and_then(|definition| definition.managed_by),
            source: if handle.managed.is_some() {
                "api"
            } else {
                "configuration"
            },
            status: record.status,
            reason: record.reason,
            delivery: counts.state,
            checkpoint: record.checkpoint,
            lag_positions: head
                .unwrap_or(0)
                .saturating_sub(record.checkpoint.unwrap_or(0)),
            delivered_total: counts.delivered_total,
            failed_attempts_total: counts.failed_attempts_total,
            disabled_total: counts.disabled_total,
            last_error: counts.last_error,
            latency: counts.latency,
        })
    }

    /// Pauses an endpoint: its events wait on its checkpoint until it is resumed.
    pub async fn pause(&self, id: &str, by: &str) -> Result<(), WebhookError> {
        let reason = Some(format!("paused by {by}"));
        self.change(id, EndpointStatus::Paused, reason, None).await
    }

    /// Resumes a paused or disabled endpoint from its checkpoint.
    pub async fn resume(&self, id: &str) -> Result<(), WebhookError> {
        self.change(id, EndpointStatus::Active, None, None).await
    }

    /// Delivers again every event after `after` (`None`: from the log's beginning), and resumes
    /// the endpoint if it was paused or disabled. `head` is the log's newest position now: a
    /// replay after it is refused, since a checkpoint beyond the head would skip every event
    /// written until the log caught up with it, silently.
    pub async fn replay(
        &self,
        id: &str,
        after: Option<u64>,
        head: Option<u64>,
    ) -> Result<(), WebhookError> {
        self.handle(id)?;
        if let Some(after) = after.filter(|after| *after > head.unwrap_or(0)) {
            return Err(WebhookError::ReplayBeyondHead {
                after,
                head: head.unwrap_or(0),
            });
        }
        self.change(id, EndpointStatus::Active, None, Some(after))
            .await
    }

    /// The endpoint's latest attempts, newest first.
    pub async fn attempts(&self, id: &str, limit: u64) -> Result<Vec<AttemptRecord>, WebhookError> {
        self.handle(id)?;
        self.journal()?.attempts(id, limit).await
    }

    /// The endpoint's attempts at any of `positions` (one operation's events), newest first.
    pub async fn attempts_at(
        &self,
        id: &str,
        positions: &[u64],
    ) -> Result<Vec<AttemptRecord>, WebhookError> {
        self.handle(id)?;
        self.journal()?.attempts_at(id, positions).await
    }

    /// Why webhook delivery cannot be trusted to be running, if it cannot: a task that is
    /// faulted (its journal or the log failing) or has ended while the service runs. A paused or
    /// disabled endpoint is an operator's decision or the receiver's state, shown in the
    /// overview, not a fault of this instance.
    pub fn problem(&self) -> Option<String> {
        let registry = self.registry.as_ref()?;
        let mut problems = Vec::new();
        for handle in registry.handles() {
            let state = handle.health.lock().state.clone();
            // A task that panicked never says Finished: its handle tells (until `join` takes it).
            let ended = handle
                .task
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .is_some_and(JoinHandle::is_finished);
            match state {
                DeliveryState::Faulted { error, next_attempt_at, .. } => problems.push(format!(
                    "webhook endpoint `{}` cannot deliver ({error}); it tries again at {} from its checkpoint",
                    handle.endpoint.id,
                    next_attempt_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                )),
                DeliveryState::Finished => problems.push(format!(
                    "webhook delivery to `{}` has stopped (the service is shutting down)",
                    handle.endpoint.id
                )),
                _ if ended => problems.push(format!(
                    "webhook delivery to `{}` has stopped unexpectedly; restart the service (the log has the panic)",
                    handle.endpoint.id
                )),
                _ => {}
            }
        }
        (!problems.is_empty()).then(|| problems.join("; "))
    }

    /// Waits for every task to end (after `stop` said `true`), then gives the leases this
    /// instance holds up, so another instance takes its endpoints over at once instead of after
    /// the lease.
    pub async fn join(&self) {
        let Some(registry) = &self.registry else {
            return;
        };
        let handles = registry.handles();
        for handle in &handles {
            let task = handle
                .task
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(task) = task {
                let _ = task.await;
            }
        }
        let keeper = self
            .keeper
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(keeper) = keeper {
            let _ = keeper.await;
        }
        if !registry.journal.shared() {
            return;
        }
        for handle in &handles {
            let state = handle.lease.borrow().clone();
            if let LeaseState::Held { lease, .. } = state {
                if let Err(error) = registry.journal.release(&lease).await {
                    warn!(endpoint = %lease.endpoint, %error, "the webhook lease could not be given up; another instance takes the endpoint over when it runs out");
                }
            }
        }
    }

    async fn change(
        &self,
        id: &str,
        status: EndpointStatus,
        reason: Option<String>,
        replay_after: Option<Option<u64>>,
    ) -> Result<(), WebhookError> {
        let handle = self.handle(id)?;
        self.journal()?
            .set_status(id, status, reason, replay_after, None)
            .await?;
        handle.wake.notify_one();
        Ok(())
    }

    fn registry(&self) -> Result<&Registry, WebhookError> {
        self.registry.as_deref().ok_or(WebhookError::NoJournal)
    }

    fn journal(&self) -> Result<&dyn DeliveryJournal, WebhookError> {
        Ok(self.registry()?.journal.as_ref())
    }

    fn handle(&self, id: &str) -> Result<Arc<Handle>, WebhookError> {
        self.registry()
            .map_err(|_| WebhookError::NoSuchEndpoint { id: id.to_owned() })?
            .handles()
            .into_iter()
            .find(|handle| handle.endpoint.id == id)
            .ok_or_else(|| WebhookError::NoSuchEndpoint { id: id.to_owned() })
    }
}

/// Every `lease_ms / LEASE_RENEWALS_PER_LEASE` until the service stops: with a shared journal,
/// renews the leases this instance holds and asks for the others; with any journal, picks up
/// endpoints defined, changed or deleted through the API (on another instance, or a rotated-out
/// secret's window ending).
async fn keep_leases(registry: Arc<Registry>, mut stop: watch::Receiver<bool>) {
    let settings = registry.settings.clone();
    let every = Duration::from_millis(settings.lease_ms / LEASE_RENEWALS_PER_LEASE);
    // The holder stops delivering before the journal lets another instance take over: its
    // validity counts from before the renewal was sent, and ends short of the whole lease, so
    // a clock running a little slow or a request still being dropped cannot overlap the next
    // holder's first delivery.
    let valid_for = Duration::from_millis(settings.lease_ms * LEASE_VALID_PERCENT / 100);
    loop {
        if let Err(error) = registry.sync().await {
            warn!(%error, "webhook endpoint definitions could not be read; the running ones go on");
        }
        if registry.journal.shared() {
            for handle in registry.handles() {
                keep_one(registry.journal.as_ref(), &settings, &handle, valid_for).await;
            }
        }
        tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// One renewal or one ask for one endpoint's lease.
async fn keep_one(
    journal: &dyn DeliveryJournal,
    settings: &LeaseSettings,
    handle: &Handle,
    valid_for: Duration,
) {
    let asked_at = tokio::time::Instant::now();
    let state = handle.lease.borrow().clone();
    let endpoint = &handle.endpoint.id;
    match state {
        LeaseState::Held { lease, .. } => match journal.renew(&lease, settings.lease_ms).await {
            Ok(Some(epoch)) => {
                handle.lease.send_replace(LeaseState::Held {
                    lease,
                    valid_until: Some(asked_at + valid_for),
                });
                let mut kept = handle.epoch.lock().unwrap_or_else(PoisonError::into_inner);
                if kept.is_some_and(|before| before != epoch) {
                    handle.wake.notify_one();
                }
                *kept = Some(epoch);
            }
            Ok(None) => {
                warn!(%endpoint, holder = %settings.holder, "another instance took the webhook endpoint's lease; this one stops delivering it");
                handle
                    .lease
                    .send_replace(LeaseState::Standby { holder: None });
            }
            // The validity runs out by itself if the journal stays unreachable.
            Err(error) => {
                warn!(%endpoint, %error, "the webhook lease could not be renewed")
            }
        },
        LeaseState::Standby { .. } => {
            match journal
                .acquire(endpoint, &settings.holder, settings.lease_ms)
                .await
            {
                Ok(Acquired::Held(lease)) => {
                    info!(%endpoint, holder = %settings.holder, token = lease.token, "this instance took the webhook endpoint's lease and delivers it");
                    *handle.epoch.lock().unwrap_or_else(PoisonError::into_inner) = None;
                    handle.lease.send_replace(LeaseState::Held {
                        lease,
                        valid_until: Some(asked_at + valid_for),
                    });
                }
                Ok(Acquired::HeldBy(holder)) => {
                    handle.lease.send_if_modified(|state| {
                        let standby = LeaseState::Standby {
                            holder: Some(holder),
                        };
                        let changed = *state != standby;
                        *state = standby;
                        changed
                    });
                }
                Err(error) => {
                    warn!(%endpoint, %error, "the webhook lease could not be asked for")
                }
            }
        }
    }
}
