//! One endpoint's task: follow the log from the endpoint's checkpoint and deliver, in log order,
//! each event it wants, retrying one event until it is delivered, the endpoint is disabled, or
//! an operator changes the endpoint.
//!
//! It delivers only while this instance holds the endpoint's lease (`port.rs`): it waits while
//! another instance holds it, and drops what it is doing — an attempt under way included — the
//! moment the lease is lost or its validity runs out unrenewed.
//!
//! It must never move the checkpoint past an event it has not delivered (or skipped by the
//! filter), never deliver without a valid lease, and never hold more than [`MAX_QUEUE_EVENTS`]
//! events in memory.
//!
//! Successful deliveries are written to the journal in batches ([`Unsaved`]): their attempts and
//! the checkpoint past them in one commit per [`CHECKPOINT_EVERY_DELIVERIES`] deliveries or
//! [`CHECKPOINT_DELIVERED_MS`], whichever comes first, and always before a failed attempt, a
//! disabling or the end of a pass. A crash loses at most the batch not yet written, which is
//! delivered again under the same `webhook-id`s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use opledger_domain::ids::GlobalPosition;
use opledger_domain::in_span::InSpanExt;
use opledger_domain::store::{EventStore, LogStart, RecordedEvent, StoreError, Subscription};
use opledger_runtime::system::RandomIds;
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant as TokioInstant;
use tracing::{info, warn};

use crate::client::{attempt, Answer};
use crate::journal::{AttemptRecord, EndpointRecord, EndpointStatus};
use crate::port::{DeliveryJournal, Lease};
use crate::schedule::pause;
use crate::service::{DeliveryState, Health};
use crate::signing::webhook_id;
use crate::{
    Endpoint, Render, WebhookError, CHECKPOINT_DELIVERED_MS, CHECKPOINT_EVERY_DELIVERIES,
    CHECKPOINT_EVERY_SKIPPED, CHECKPOINT_IDLE_MS, FAULT_RETRY_FIRST_MS, FAULT_RETRY_MAX_MS,
    MAX_PAYLOAD_BYTES, MAX_QUEUE_EVENTS, STOP_ATTEMPT_GRACE_MS,
};

/// Everything one endpoint's task holds.
pub(crate) struct Task<S, R> {
    pub store: S,
    pub render: Arc<R>,
    pub journal: Arc<dyn DeliveryJournal>,
    pub endpoint: Arc<Endpoint>,
    pub client: reqwest::Client,
    /// Rung after an operator changed the endpoint's record: re-read it.
    pub wake: Arc<Notify>,
    pub health: Health,
    pub stop: watch::Receiver<bool>,
    /// This instance's hold on the endpoint, kept by the service's lease keeper.
    pub lease: watch::Receiver<LeaseState>,
    /// The lease the current pass delivers under: the fence of its writes.
    pub held: Lease,
    /// What the current pass delivered or skipped and has not written yet.
    pub unsaved: Unsaved,
    /// How often the lease keeper renews, in milliseconds (what a holder whose renewals fail
    /// waits for at most before the next try).
    pub renew_every_ms: u64,
}

/// This instance's hold on an endpoint's lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LeaseState {
    /// Not held: another instance holds it (named when known), or it was not yet asked for.
    Standby { holder: Option<String> },
    /// Held; deliveries stop at `valid_until` unless a renewal moves it (`None`: for ever, the
    /// one process of an embedded journal).
    Held {
        lease: Lease,
        valid_until: Option<TokioInstant>,
    },
}

impl LeaseState {
    /// The lease, if it is held and still valid now.
    fn valid(&self) -> Option<&Lease> {
        match self {
            Self::Held { lease, valid_until } => valid_until
                .is_none_or(|until| until > TokioInstant::now())
                .then_some(lease),
            Self::Standby { .. } => None,
        }
    }
}

/// Progress of a pass not yet in the journal: delivered attempts and skipped events after the
/// written checkpoint. At most [`CHECKPOINT_EVERY_DELIVERIES`] attempts.
#[derive(Debug, Default)]
pub(crate) struct Unsaved {
    /// The successful attempts, in delivery order.
    delivered: Vec<AttemptRecord>,
    /// Skipped events among them.
    skipped: u64,
    /// The last position delivered or skipped: where the checkpoint moves at the next write.
    checkpoint: Option<u64>,
    /// When the oldest unwritten delivery must be written.
    due: Option<TokioInstant>,
}

impl Unsaved {
    /// Waits until something must be written: the oldest delivery's [`CHECKPOINT_DELIVERED_MS`]
    /// deadline, or, with skips alone, [`CHECKPOINT_IDLE_MS`] of a quiet log (restarted every
    /// time it is polled anew, that is after every event); never when nothing is unwritten.
    async fn write_due(&self) {
        match (self.due, self.checkpoint) {
            (Some(due), _) => tokio::time::sleep_until(due).await,
            (None, Some(_)) => {
                tokio::time::sleep(Duration::from_millis(CHECKPOINT_IDLE_MS)).await;
            }
            (None, None) => std::future::pending::<()>().await,
        }
    }

    /// Whether enough is unwritten to write it now, without waiting for the timer.
    fn full(&self) -> bool {
        self.delivered.len() >= CHECKPOINT_EVERY_DELIVERIES
            || self.skipped >= CHECKPOINT_EVERY_SKIPPED
    }
}

/// What a pass waited for.
enum Next {
    /// The service is stopping.
    Stop,
    /// An operator acted.
    Wake,
    /// The log's next event (`None`: the feed closed).
    Event(Option<Result<RecordedEvent, StoreError>>),
    /// Unwritten progress is due to be written.
    WriteDue,
}

/// What became of one event.
enum Handled {
    /// Delivered or skipped; added to [`Unsaved`].
    Done,
    /// The pass must end.
    End(Ended),
}

/// How one pass over the log ended.
enum Ended {
    /// The service is stopping.
    Stopped,
    /// The endpoint's record changed (an operator, or a disabling): read it again.
    Changed,
    /// The lease was lost or ran out unrenewed: wait for it again.
    LeaseLost,
}

impl<S: EventStore + Clone + 'static, R: Render> Task<S, R> {
    /// Runs until the service stops; faults (the journal, the log) pause and start over from the
    /// checkpoint.
    pub async fn run(mut self) {
        let mut faults: u32 = 0;
        loop {
            let Some(lease) = self.wait_for_lease().await else {
                break;
            };
            let token = lease.token;
            self.held = lease;
            // The pass is dropped the moment the lease goes, an attempt under way with it: a
            // request still running when another instance takes over would be a concurrent
            // delivery, and the writes it would make are refused by the fence anyway.
            let lost = lease_lost(self.lease.clone(), token);
            let passed = tokio::select! {
                biased;
                () = lost => Ok(Ended::LeaseLost),
                passed = self.pass() => passed,
            };
            match passed {
                Ok(Ended::Stopped) => break,
                Ok(Ended::Changed) => faults = 0,
                Ok(Ended::LeaseLost) => {
                    faults = 0;
                    info!(endpoint = %self.endpoint.id, "this instance no longer holds the webhook endpoint's lease; it stops delivering it");
                }
                Err(error) => {
                    faults = faults.saturating_add(1);
                    let doublings = (faults - 1).min(16);
                    let backoff = FAULT_RETRY_FIRST_MS
                        .saturating_mul(1 << doublings)
                        .min(FAULT_RETRY_MAX_MS);
                    warn!(endpoint = %self.endpoint.id, %error, retry_in_ms = backoff, "webhook delivery failed; it resumes from its checkpoint after the pause");
                    self.health.set(DeliveryState::Faulted {
                        error: error.to_string(),
                        retry_in_ms: backoff,
                        next_attempt_at: after_ms(backoff),
                    });
                    if self.rest(Duration::from_millis(backoff)).await.is_some() {
                        break;
                    }
                }
            }
        }
        self.health.set(DeliveryState::Finished);
    }

    /// Waits until this instance holds the endpoint's lease; `None` if the service stops first.
    async fn wait_for_lease(&mut self) -> Option<Lease> {
        loop {
            let state = self.lease.borrow_and_update().clone();
            if let Some(lease) = state.valid() {
                return Some(lease.clone());
            }
            self.health.set(match state {
                LeaseState::Standby { holder } => DeliveryState::Standby { holder },
                // Held but run out: the renewals failed (the journal did not answer). This
                // instance cannot deliver, and another takes over once the lease expires there.
                LeaseState::Held { .. } => DeliveryState::Faulted {
                    error: "this instance's lease on the endpoint ran out unrenewed (the journal did not answer)".into(),
                    retry_in_ms: self.renew_every_ms,
                    next_attempt_at: after_ms(self.renew_every_ms),
                },
            });
            tokio::select! {
                biased;
                _ = self.stop.wait_for(|stop| *stop) => return None,
                changed = self.lease.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
            }
        }
    }

    /// Waits `duration`, or less if an operator acts; `Some` if the service stops meanwhile.
    async fn rest(&mut self, duration: Duration) -> Option<Ended> {
        tokio::select! {
            biased;
            _ = self.stop.wait_for(|stop| *stop) => Some(Ended::Stopped),
            () = self.wake.notified() => None,
            () = tokio::time::sleep(duration) => None,
        }
    }

    /// One pass: read the record; wait while paused or disabled; otherwise follow the log.
    async fn pass(&mut self) -> Result<Ended, WebhookError> {
        let record = self
            .journal
            .record(&self.endpoint.id)
            .await?
            .ok_or_else(|| WebhookError::Journal {
                reason: format!("endpoint `{}` has no record", self.endpoint.id),
            })?;
        if record.status != EndpointStatus::Active {
            self.health.set(match record.status {
                EndpointStatus::Paused => DeliveryState::Paused,
                _ => DeliveryState::Disabled {
                    reason: record.reason.clone().unwrap_or_default(),
                },
            });
            return Ok(tokio::select! {
                biased;
                _ = self.stop.wait_for(|stop| *stop) => Ended::Stopped,
                () = self.wake.notified() => Ended::Changed,
            });
        }
        // A checkpoint the log has not reached would wait, silently, for events that are then
        // skipped: refused here, so the endpoint shows it (and `/healthz` with it).
        if let Some(checkpoint) = record.checkpoint {
            let head = self
                .store
                .head_position()
                .await?
                .map_or(0, GlobalPosition::value);
            if checkpoint > head {
                return Err(WebhookError::CheckpointBeyondHead { checkpoint, head });
            }
        }
        self.health.set(DeliveryState::Delivering);
        let start = record.checkpoint.map_or(LogStart::Beginning, |at| {
            LogStart::After(GlobalPosition::new(at))
        });
        let subscription = self.store.subscribe_all(start).await?;
        let (sender, mut receiver) = mpsc::channel(MAX_QUEUE_EVENTS);
        let feed = feed(subscription, sender);
        tokio::pin!(feed);
        // What an earlier pass left unwritten is delivered again from the checkpoint.
        self.unsaved = Unsaved::default();
        loop {
            let next = tokio::select! {
                biased;
                _ = self.stop.wait_for(|stop| *stop) => Next::Stop,
                () = self.wake.notified() => Next::Wake,
                () = &mut feed => return Err(StoreError::Unavailable { reason: "the log feed ended".into() }.into()),
                next = receiver.recv() => Next::Event(next),
                () = self.unsaved.write_due() => Next::WriteDue,
            };
            let next = match next {
                Next::Event(next) => next,
                Next::Stop => {
                    // A planned stop writes what was delivered, so a restart does not repeat it.
                    self.save(&record).await?;
                    return Ok(Ended::Stopped);
                }
                Next::Wake => {
                    // Written under the epoch it was delivered at: refused if the operator's
                    // action changed it, the attempts recorded either way.
                    self.save(&record).await?;
                    return Ok(Ended::Changed);
                }
                Next::WriteDue => {
                    if !self.save(&record).await? {
                        return Ok(Ended::Changed);
                    }
                    continue;
                }
            };
            let Some(next) = next else {
                return Err(WebhookError::Journal {
                    reason: "the log feed closed".into(),
                });
            };
            let event = next?;
            if let Handled::End(ended) = self.handle(&record, &event).await? {
                return Ok(ended);
            }
            // Written in batches: a commit per delivery was a commit (and a WAL append) per
            // event the ledger produced; a commit per skipped event, an fsync per event for every
            // endpoint. Losing unwritten progress in a crash only means reading (and delivering)
            // those events again.
            if self.unsaved.full() && !self.save(&record).await? {
                return Ok(Ended::Changed);
            }
        }
    }

    /// Writes the unwritten deliveries and the checkpoint past them (and past skipped events) in
    /// one commit; `false` when the record changed meanwhile (the attempts are recorded, the
    /// checkpoint is not moved).
    async fn save(&mut self, record: &EndpointRecord) -> Result<bool, WebhookError> {
        let unsaved = std::mem::take(&mut self.unsaved);
        let Some(position) = unsaved.checkpoint else {
            return Ok(true);
        };
        let saved = if unsaved.delivered.is_empty() {
            self.journal
                .advance(&self.held, record.epoch, position)
                .await?
        } else {
            self.journal
                .record_deliveries(unsaved.delivered, &self.held, record.epoch, position)
                .await?
        };
        if saved {
            self.health.checkpoint(position);
        }
        Ok(saved)
    }

    /// Delivers `event` if the endpoint wants it.
    async fn handle(
        &mut self,
        record: &EndpointRecord,
        event: &RecordedEvent,
    ) -> Result<Handled, WebhookError> {
        let position = event.position.value();
        let message = self
            .render
            .render(event, &self.endpoint.events)
            .await
            .map_err(|reason| WebhookError::Render { position, reason })?;
        let wanted = message.filter(|message| self.endpoint.wants(message.kind, &message.tenant));
        let Some(message) = wanted else {
            self.unsaved.skipped += 1;
            self.unsaved.checkpoint = Some(position);
            return Ok(Handled::Done);
        };
        let id = webhook_id(event.event_id);
        let body = serde_json::to_vec(&Payload {
            data: &message.data,
            timestamp: &message.at,
            kind: OperationKind(message.kind),
        })
        .map_err(|error| WebhookError::Render {
            position,
            reason: error.to_string(),
        })?;
        if body.len() > MAX_PAYLOAD_BYTES {
            return Err(WebhookError::Render {
                position,
                reason: format!(
                    "the payload is {} bytes, over the limit of {MAX_PAYLOAD_BYTES}",
                    body.len()
                ),
            });
        }
        let span = tracing::info_span!(
            "webhook_delivery",
            endpoint = %self.endpoint.id,
            webhook_id = %id,
            position,
            operation_id = event.stream.operation_id().map(tracing::field::display),
        );
        // The delivery belongs to the trace the event was written in (a child of the span that
        // wrote it), not to a trace of its own; the receiver is sent its context. Nothing when
        // trace export is off or the event was written under no trace.
        let written_under = opledger_domain::codec::traceparent_of(&event.metadata);
        opledger_domain::trace_context::continue_from(&span, written_under.as_deref());
        let traceparent = opledger_domain::trace_context::traceparent_of(&span);
        let render = Arc::clone(&self.render);
        let kept = move |answer: String| render.kept_answer(&message, answer);
        let ended = self
            .deliver(record, position, &id, &body, traceparent.as_deref(), &kept)
            .in_span(span)
            .await?;
        Ok(ended.map_or(Handled::Done, Handled::End))
    }

    /// Attempts one event until it is delivered (then added to [`Unsaved`]: `None`), the
    /// endpoint is disabled, an operator acts or the service stops (`Some`).
    async fn deliver(
        &mut self,
        record: &EndpointRecord,
        position: u64,
        id: &str,
        body: &[u8],
        traceparent: Option<&str>,
        kept: &(dyn Fn(String) -> String + Send + Sync),
    ) -> Result<Option<Ended>, WebhookError> {
        let window = Duration::from_secs(self.endpoint.retry_window_s);
        let mut first_failure: Option<Instant> = None;
        let first_attempt = Instant::now();
        for number in 1u32.. {
            let at = chrono::Utc::now();
            let attempted = {
                let under_way = attempt(&self.client, &self.endpoint, id, body, traceparent);
                tokio::pin!(under_way);
                tokio::select! {
                    biased;
                    attempted = &mut under_way => attempted,
                    // The guard `wait_for` returns is dropped at once: it must not live across
                    // the wait below (it is not `Send`).
                    () = async { drop(self.stop.wait_for(|stop| *stop).await) } => {
                        // A stop lets the request under way finish, within a bound, so a planned
                        // restart does not repeat what the receiver already has; the pass ends at
                        // its next wait.
                        let grace = Duration::from_millis(STOP_ATTEMPT_GRACE_MS);
                        match tokio::time::timeout(grace, &mut under_way).await {
                            Ok(attempted) => attempted,
                            Err(_) => return Ok(Some(Ended::Stopped)),
                        }
                    }
                }
            };
            let (status, error) = match &attempted.answer {
                Answer::Delivered { status } => (Some(*status), None),
                Answer::Gone => (Some(410), Some("answered 410 Gone".to_owned())),
                // The receiver's words may echo the payload: kept as the renderer says.
                Answer::Failed { status, error, .. } => (*status, Some(kept(error.clone()))),
            };
            let row = AttemptRecord {
                endpoint: self.endpoint.id.clone(),
                position,
                webhook_id: id.to_owned(),
                attempt: number,
                at,
                status,
                duration_ms: u64::try_from(attempted.duration.as_millis()).unwrap_or(u64::MAX),
                error: error.clone(),
            };
            // A delivery waits for its batch's commit; a failure is written at once, after the
            // deliveries before it (the attempt log stays in order, and the checkpoint does not
            // wait behind a receiver that may fail for days).
            if let Answer::Delivered { .. } = attempted.answer {
                self.unsaved.delivered.push(row);
                self.unsaved.checkpoint = Some(position);
                self.unsaved.due.get_or_insert_with(|| {
                    TokioInstant::now() + Duration::from_millis(CHECKPOINT_DELIVERED_MS)
                });
                self.health
                    .delivered(first_attempt.elapsed(), chrono::Utc::now());
                return Ok(None);
            }
            let saved = self.save(record).await?;
            self.journal.record_attempt(row).await?;
            if !saved {
                return Ok(Some(Ended::Changed));
            }
            let retry_after = match attempted.answer {
                Answer::Delivered { .. } => unreachable!("a delivery returned above"),
                Answer::Gone => {
                    self.health.failed(error.as_deref());
                    return self
                        .disable(
                            record,
                            "the endpoint answered 410 Gone; resume it once the receiver is back"
                                .into(),
                        )
                        .await;
                }
                Answer::Failed { retry_after, .. } => retry_after,
            };
            self.health.failed(error.as_deref());
            let first = *first_failure.get_or_insert_with(Instant::now);
            let elapsed = first.elapsed();
            if elapsed >= window {
                let reason = format!(
                    "the event at position {position} failed for the whole retry window of {} s ({number} attempts over {} s; last: {}); resume the endpoint once the receiver is fixed",
                    self.endpoint.retry_window_s,
                    elapsed.as_secs(),
                    error.as_deref().unwrap_or("no answer"),
                );
                return self.disable(record, reason).await;
            }
            // The last attempt comes at the window's end, not a whole backoff before it: an
            // endpoint is disabled only once it has failed for the whole window it was given.
            let wait = pause(number, retry_after, &RandomIds).min(window - elapsed);
            let retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
            self.health.set(DeliveryState::Retrying {
                position,
                consecutive_failures: number,
                retry_in_ms,
                next_attempt_at: after_ms(retry_in_ms),
            });
            if let Some(ended) = self.rest(wait).await {
                return Ok(Some(ended));
            }
            // An operator acted during the pause (`rest` returned early): read the record again.
            if self.record_changed(record).await? {
                return Ok(Some(Ended::Changed));
            }
            self.health.set(DeliveryState::Delivering);
        }
        unreachable!("attempt numbers run out only after u32::MAX attempts, beyond any window")
    }

    async fn record_changed(&self, record: &EndpointRecord) -> Result<bool, WebhookError> {
        let now = self.journal.record(&self.endpoint.id).await?;
        Ok(now.is_none_or(|now| now.epoch != record.epoch))
    }

    async fn disable(
        &mut self,
        record: &EndpointRecord,
        reason: String,
    ) -> Result<Option<Ended>, WebhookError> {
        let disabled = self
            .journal
            .set_status(
                &self.endpoint.id,
                EndpointStatus::Disabled,
                Some(reason.clone()),
                None,
                Some((record.epoch, &self.held)),
            )
            .await?;
        if disabled {
            warn!(endpoint = %self.endpoint.id, %reason, "webhook endpoint disabled");
            self.health.disabled();
        } else {
            info!(endpoint = %self.endpoint.id, "an operator changed the endpoint first; it is not disabled");
        }
        Ok(Some(Ended::Changed))
    }
}

/// The wall-clock time `ms` milliseconds from now, for an operator reading when something is due.
fn after_ms(ms: u64) -> chrono::DateTime<chrono::Utc> {
    let now = chrono::Utc::now();
    now.checked_add_signed(chrono::Duration::milliseconds(
        i64::try_from(ms).unwrap_or(i64::MAX),
    ))
    .unwrap_or(now)
}

/// Completes when the lease with `token` is no longer held, or its validity runs out before a
/// renewal extends it.
async fn lease_lost(mut lease: watch::Receiver<LeaseState>, token: u64) {
    loop {
        let state = lease.borrow_and_update().clone();
        let valid_until = match state {
            LeaseState::Held { lease, valid_until } if lease.token == token => valid_until,
            _ => return,
        };
        let renewed = async {
            match valid_until {
                Some(until) => tokio::select! {
                    () = tokio::time::sleep_until(until) => false,
                    changed = lease.changed() => changed.is_ok(),
                },
                None => lease.changed().await.is_ok(),
            }
        };
        if !renewed.await {
            return;
        }
    }
}

/// A delivery's body, `{"data": …, "timestamp": …, "type": "operation.<kind>"}`, written
/// straight from the message it borrows: a `json!` tree here copied the whole rendered `data`
/// (every string of it) once more per delivery. Fields in the order the tree wrote its keys.
#[derive(serde::Serialize)]
struct Payload<'a> {
    data: &'a serde_json::Value,
    timestamp: &'a chrono::DateTime<chrono::Utc>,
    #[serde(rename = "type")]
    kind: OperationKind,
}

/// `operation.<kind>`, written without building the string first.
struct OperationKind(&'static str);

impl serde::Serialize for OperationKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&format_args!("operation.{}", self.0))
    }
}

/// Sends the subscription's events down the channel until a read fails (that error is sent too)
/// or the task is gone; then waits for ever, so the events before an error are still handled.
async fn feed(
    mut subscription: impl Subscription,
    sender: mpsc::Sender<Result<RecordedEvent, StoreError>>,
) {
    loop {
        let next = subscription.next().await;
        let failed = next.is_err();
        if sender.send(next).await.is_err() || failed {
            break;
        }
    }
    std::future::pending::<()>().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_borrowed_payload_writes_the_same_bytes_as_the_json_tree_it_replaced() {
        let data = serde_json::json!({
            "operation_id": "0190c7e6-0000-7000-8000-000000000001",
            "sentence": "Task \"call the client\" created (id 731).",
            "external_id": "731",
            "position": 42,
        });
        let at = chrono::DateTime::parse_from_rfc3339("2026-12-03T19:20:00.123456Z")
            .expect("a time")
            .with_timezone(&chrono::Utc);
        let written = serde_json::to_vec(&Payload {
            data: &data,
            timestamp: &at,
            kind: OperationKind("succeeded"),
        })
        .expect("serialisable");
        let tree = serde_json::to_vec(&serde_json::json!({
            "type": "operation.succeeded",
            "timestamp": at,
            "data": data,
        }))
        .expect("serialisable");
        assert_eq!(
            String::from_utf8(written).expect("utf-8"),
            String::from_utf8(tree).expect("utf-8")
        );
    }
}
