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

use std::path::Path;
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
}

/// The webhooks of one server.
pub struct Webhooks {
    /// `None` when no endpoint is configured: a server without webhooks leaves no journal file.
    journal: Option<Arc<dyn DeliveryJournal>>,
    endpoints: Vec<Handle>,
    /// Taken by [`Webhooks::join`]; until then, one per endpoint in configuration order.
    tasks: Mutex<Vec<JoinHandle<()>>>,
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
        if endpoints.is_empty() {
            return Ok(Self::without_endpoints());
        }
        let journal = Arc::new(Journal::open(journal_path).await?);
        let settings = LeaseSettings {
            holder: format!("pid-{}", std::process::id()),
            lease_ms: crate::DEFAULT_WEBHOOK_LEASE_MS,
        };
        Self::start_with(store, render, endpoints, journal, settings, stop).await
    }

    /// Starts the endpoints on `journal`, which may be shared with other instances (then each
    /// endpoint is delivered by whichever instance holds its lease).
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
        if endpoints.is_empty() {
            return Ok(Self::without_endpoints());
        }
        let head = store.head_position().await?.map(|head| head.value());
        let mut handles = Vec::with_capacity(endpoints.len());
        let mut tasks = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let record = journal.ensure(&endpoint.id, head).await?;
            // An embedded journal's one process holds every lease for ever; a shared one's
            // leases are asked for by the keeper below.
            let initial = if journal.shared() {
                LeaseState::Standby { holder: None }
            } else {
                match journal
                    .acquire(&endpoint.id, &settings.holder, settings.lease_ms)
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
            let (lease, leased) = watch::channel(initial);
            let endpoint = Arc::new(endpoint);
            let handle = Handle {
                endpoint: Arc::clone(&endpoint),
                wake: Arc::new(Notify::new()),
                health: Health::new(record.checkpoint),
                lease: Arc::new(lease),
            };
            let task = Task {
                store: store.clone(),
                render: Arc::clone(&render),
                journal: Arc::clone(&journal),
                client: client_for(&endpoint)?,
                held: Lease {
                    endpoint: endpoint.id.clone(),
                    holder: settings.holder.clone(),
                    token: 0,
                },
                endpoint,
                unsaved: Unsaved::default(),
                wake: Arc::clone(&handle.wake),
                health: handle.health.clone(),
                stop: stop.clone(),
                lease: leased,
                renew_every_ms: settings.lease_ms / LEASE_RENEWALS_PER_LEASE,
            };
            tasks.push(tokio::spawn(task.run()));
            handles.push(handle);
        }
        let keeper = journal.shared().then(|| {
            let kept = handles
                .iter()
                .map(|handle| Kept {
                    endpoint: handle.endpoint.id.clone(),
                    lease: Arc::clone(&handle.lease),
                    wake: Arc::clone(&handle.wake),
                    epoch: None,
                })
                .collect();
            tokio::spawn(keep_leases(Arc::clone(&journal), settings, kept, stop))
        });
        Ok(Self {
            journal: Some(journal),
            endpoints: handles,
            tasks: Mutex::new(tasks),
            keeper: Mutex::new(keeper),
        })
    }

    /// A server's webhooks when none is configured.
    pub fn none() -> Self {
        Self::without_endpoints()
    }

    fn without_endpoints() -> Self {
        Self {
            journal: None,
            endpoints: Vec::new(),
            tasks: Mutex::new(Vec::new()),
            keeper: Mutex::new(None),
        }
    }

    /// Every endpoint, in configuration order, with its lag behind `head` (the log's newest
    /// position).
    pub async fn overview(&self, head: Option<u64>) -> Result<Vec<EndpointOverview>, WebhookError> {
        let mut overviews = Vec::with_capacity(self.endpoints.len());
        for handle in &self.endpoints {
            overviews.push(self.overview_of(handle, head).await?);
        }
        Ok(overviews)
    }

    /// One endpoint's overview.
    pub async fn endpoint(
        &self,
        id: &str,
        head: Option<u64>,
    ) -> Result<EndpointOverview, WebhookError> {
        self.overview_of(self.handle(id)?, head).await
    }

    async fn overview_of(
        &self,
        handle: &Handle,
        head: Option<u64>,
    ) -> Result<EndpointOverview, WebhookError> {
        let endpoint = &handle.endpoint;
        let record = self.journal().record(&endpoint.id).await?.ok_or_else(|| {
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
        self.journal().attempts(id, limit).await
    }

    /// Why webhook delivery cannot be trusted to be running, if it cannot: a task that is
    /// faulted (its journal or the log failing) or has ended while the service runs. A paused or
    /// disabled endpoint is an operator's decision or the receiver's state, shown in the
    /// overview, not a fault of this instance.
    pub fn problem(&self) -> Option<String> {
        let mut problems = Vec::new();
        let tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        for (index, handle) in self.endpoints.iter().enumerate() {
            let state = handle.health.lock().state.clone();
            // A task that panicked never says Finished: its handle tells (until `join` takes it).
            let ended = tasks.get(index).is_some_and(JoinHandle::is_finished);
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
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        for task in tasks {
            let _ = task.await;
        }
        let keeper = self
            .keeper
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(keeper) = keeper else {
            return;
        };
        let _ = keeper.await;
        for handle in &self.endpoints {
            let state = handle.lease.borrow().clone();
            if let LeaseState::Held { lease, .. } = state {
                if let Err(error) = self.journal().release(&lease).await {
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
        self.journal()
            .set_status(id, status, reason, replay_after, None)
            .await?;
        handle.wake.notify_one();
        Ok(())
    }

    fn journal(&self) -> &dyn DeliveryJournal {
        self.journal
            .as_deref()
            .expect("endpoints exist only with a journal, and every caller names one")
    }

    fn handle(&self, id: &str) -> Result<&Handle, WebhookError> {
        self.endpoints
            .iter()
            .find(|handle| handle.endpoint.id == id)
            .ok_or_else(|| WebhookError::NoSuchEndpoint { id: id.to_owned() })
    }
}

/// One endpoint as the lease keeper sees it.
struct Kept {
    endpoint: String,
    lease: Arc<watch::Sender<LeaseState>>,
    wake: Arc<Notify>,
    /// The endpoint's epoch at the last renewal: a change is an operator's action elsewhere.
    epoch: Option<u64>,
}

/// Renews the leases this instance holds and asks for the others, every
/// `lease_ms / LEASE_RENEWALS_PER_LEASE`, until the service stops.
async fn keep_leases(
    journal: Arc<dyn DeliveryJournal>,
    settings: LeaseSettings,
    mut kept: Vec<Kept>,
    mut stop: watch::Receiver<bool>,
) {
    let every = Duration::from_millis(settings.lease_ms / LEASE_RENEWALS_PER_LEASE);
    // The holder stops delivering before the journal lets another instance take over: its
    // validity counts from before the renewal was sent, and ends short of the whole lease, so
    // a clock running a little slow or a request still being dropped cannot overlap the next
    // holder's first delivery.
    let valid_for = Duration::from_millis(settings.lease_ms * LEASE_VALID_PERCENT / 100);
    loop {
        for endpoint in &mut kept {
            keep_one(journal.as_ref(), &settings, endpoint, valid_for).await;
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
    kept: &mut Kept,
    valid_for: Duration,
) {
    let asked_at = tokio::time::Instant::now();
    let state = kept.lease.borrow().clone();
    match state {
        LeaseState::Held { lease, .. } => match journal.renew(&lease, settings.lease_ms).await {
            Ok(Some(epoch)) => {
                kept.lease.send_replace(LeaseState::Held {
                    lease,
                    valid_until: Some(asked_at + valid_for),
                });
                if kept.epoch.is_some_and(|before| before != epoch) {
                    kept.wake.notify_one();
                }
                kept.epoch = Some(epoch);
            }
            Ok(None) => {
                warn!(endpoint = %kept.endpoint, holder = %settings.holder, "another instance took the webhook endpoint's lease; this one stops delivering it");
                kept.lease
                    .send_replace(LeaseState::Standby { holder: None });
            }
            // The validity runs out by itself if the journal stays unreachable.
            Err(error) => {
                warn!(endpoint = %kept.endpoint, %error, "the webhook lease could not be renewed")
            }
        },
        LeaseState::Standby { .. } => {
            match journal
                .acquire(&kept.endpoint, &settings.holder, settings.lease_ms)
                .await
            {
                Ok(Acquired::Held(lease)) => {
                    info!(endpoint = %kept.endpoint, holder = %settings.holder, token = lease.token, "this instance took the webhook endpoint's lease and delivers it");
                    kept.epoch = None;
                    kept.lease.send_replace(LeaseState::Held {
                        lease,
                        valid_until: Some(asked_at + valid_for),
                    });
                }
                Ok(Acquired::HeldBy(holder)) => {
                    kept.lease.send_if_modified(|state| {
                        let standby = LeaseState::Standby {
                            holder: Some(holder),
                        };
                        let changed = *state != standby;
                        *state = standby;
                        changed
                    });
                }
                Err(error) => {
                    warn!(endpoint = %kept.endpoint, %error, "the webhook lease could not be asked for")
                }
            }
        }
    }
}
