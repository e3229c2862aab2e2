//! The port's subscription on KurrentDB: a `$all` subscription filtered on the log's stream
//! prefix, that survives a lost connection or a node restart by subscribing again from where it
//! stands.
//!
//! Where it stands is a full server position (commit and prepare): the last event delivered, or a
//! later checkpoint the server sent for the filter (everything before it was considered and did
//! not match, so resuming there skips the scan again). Subscriptions start exclusive of their
//! position, so resuming there neither repeats nor skips; as a second guard an event at or before
//! the last one delivered is dropped. Reconnections in a row are bounded; after that the
//! subscription reports the store unavailable, and the caller resumes from its own checkpoint.

use std::time::Duration;

use kurrentdb::{Position, StreamPosition, SubscribeToAllOptions, SubscriptionEvent};
use opledger_domain::ids::GlobalPosition;
use opledger_domain::store::{LogStart, RecordedEvent, StoreError, Subscription};
use tracing::{debug, warn};

use super::config::{RESUBSCRIBE_FIRST_PAUSE_MS, RESUBSCRIBE_MAX_PAUSE_MS};
use super::{codec, KurrentDbStore};

/// A catch-up-then-live subscription to the store's global log.
pub struct KurrentDbSubscription {
    store: KurrentDbStore,
    /// The live server subscription, and the client generation it runs on.
    live: Option<(u64, kurrentdb::Subscription)>,
    /// Where a new server subscription starts (exclusive); `None`: the beginning.
    resume: Option<Position>,
    /// The last event delivered.
    delivered: Option<GlobalPosition>,
    /// Failed attempts since the last event or checkpoint.
    failures: u32,
}

impl std::fmt::Debug for KurrentDbSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KurrentDbSubscription")
            .field("resume", &self.resume)
            .field("delivered", &self.delivered)
            .field("failures", &self.failures)
            .finish_non_exhaustive()
    }
}

impl KurrentDbSubscription {
    pub(super) fn new(store: KurrentDbStore, start: LogStart) -> Self {
        let (resume, delivered) = match start {
            LogStart::Beginning => (None, None),
            LogStart::After(position) => (Some(codec::server_position(position)), Some(position)),
        };
        Self {
            store,
            live: None,
            resume,
            delivered,
            failures: 0,
        }
    }

    /// Opens a server subscription from `resume`. A free function over the store, not a method:
    /// the subscription itself is not `Sync`, so no reference to it may live across an await.
    async fn open(
        store: &KurrentDbStore,
        resume: Option<Position>,
    ) -> (u64, kurrentdb::Subscription) {
        let options = SubscribeToAllOptions::default()
            .position(match resume {
                Some(position) => StreamPosition::Position(position),
                None => StreamPosition::Start,
            })
            .filter(store.log_filter())
            .requires_leader(true);
        let options = store.with_credentials(options, |options, credentials| {
            options.authenticated(credentials)
        });
        let (generation, client) = store.client();
        (generation, client.subscribe_to_all(&options).await)
    }

    fn pause(&self) -> Duration {
        let doubled = RESUBSCRIBE_FIRST_PAUSE_MS.saturating_mul(1 << self.failures.min(16));
        Duration::from_millis(doubled.min(RESUBSCRIBE_MAX_PAUSE_MS))
    }

    fn advance_to(&mut self, position: Position) {
        if self
            .resume
            .is_none_or(|resume| codec::order(position) > codec::order(resume))
        {
            self.resume = Some(position);
        }
    }
}

impl Subscription for KurrentDbSubscription {
    async fn next(&mut self) -> Result<RecordedEvent, StoreError> {
        loop {
            let (generation, live) = match self.live.as_mut() {
                Some((generation, live)) => (*generation, live),
                None => {
                    let opened = Self::open(&self.store, self.resume).await;
                    self.live = Some(opened);
                    continue;
                }
            };
            match live.next_subscription_event().await {
                Ok(SubscriptionEvent::EventAppeared(resolved)) => {
                    self.failures = 0;
                    let Some(event) =
                        codec::recorded_event(&resolved, &self.store.shared.config.namespace)?
                    else {
                        continue;
                    };
                    self.advance_to(codec::server_position(event.position));
                    if self
                        .delivered
                        .is_some_and(|delivered| event.position <= delivered)
                    {
                        debug!(position = %event.position, "dropping an event delivered before");
                        continue;
                    }
                    self.delivered = Some(event.position);
                    return Ok(event);
                }
                Ok(SubscriptionEvent::Checkpoint(position)) => {
                    self.failures = 0;
                    self.advance_to(position);
                }
                Ok(_) => {}
                Err(error) => {
                    self.live = None;
                    self.failures += 1;
                    self.store.renew_if_dead(generation, &error);
                    let attempts = self.store.shared.config.resubscribe_attempts;
                    if matches!(error, kurrentdb::Error::AccessDenied) || self.failures > attempts {
                        return Err(StoreError::Unavailable {
                            reason: format!(
                                "the KurrentDB subscription failed {} times in a row: {error}",
                                self.failures
                            ),
                        });
                    }
                    let pause = self.pause();
                    warn!(%error, failures = self.failures, pause_ms = pause.as_millis() as u64, resume = ?self.resume, "KurrentDB subscription dropped; subscribing again");
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }
}
