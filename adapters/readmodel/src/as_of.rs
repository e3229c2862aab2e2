//! Listings and the review queue as they were at a past moment, folded from the log.
//!
//! The read-model file holds only "now". A listing at a past position is answered by folding the
//! global log from its start up to that moment into a temporary, in-memory copy of the two read
//! models a listing shows (the operations' rows and the review queue), with the very folds the
//! runner writes to the file (`opledger_projections`), then filtering, ordering and paging it as
//! the SQL queries do. So the answer is the listing the live service gave at that moment, not a
//! reconstruction of it.
//!
//! The cost is the log up to the moment: a read and a decode per event of the listed operations
//! (other tenants' events are skipped undecoded). Keeping every operation's state changes in the
//! file instead would make a past listing one query, but would write a row per event into the
//! read models, which the rebuild (its target is 500k events/s) cannot afford. Both the events read
//! and the operations held are bounded ([`MAX_AS_OF_FOLD_EVENTS`], [`MAX_AS_OF_OPERATIONS`]); a
//! moment beyond them is refused with what to ask instead, never answered in part.
//!
//! It must never write anything, and never answer a listing that mixes moments.

use std::collections::{BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Utc};
use opledger_domain::codec;
use opledger_domain::event::OperationEvent;
use opledger_domain::ids::{
    AccountId, GlobalPosition, OperationId, ProviderId, StreamVersion, TenantId,
};
use opledger_domain::state::OperationState;
use opledger_domain::store::{EventStore, LogStart, RecordedEvent};
use opledger_projections::operations::{self, OperationRow};
use opledger_projections::read_models::fold_in_place;
use opledger_projections::review_queue::ReviewChange;

use crate::query::{page_of, OperationCursor, OperationPage, ReviewItem};
use crate::{OperationFilter, ReadModelError, MAX_QUERY_ROWS};

/// Most events an as-of listing reads from the log. The log is read and decoded at 1.1–1.2M
/// events/s on one core (`bench replay`), so this is about two seconds of one core per request,
/// and a ledger of at most this many events can be listed at any of its moments.
pub const MAX_AS_OF_FOLD_EVENTS: u64 = 2_000_000;

/// Most operations of the listed scope an as-of listing holds folded in memory: a folded state
/// with its intent's arguments is around a kilobyte, so about 100 MB at this bound.
pub const MAX_AS_OF_OPERATIONS: usize = 100_000;

/// Events read from the log at a time. Each read is an await, so a long fold gives its executor
/// thread back between batches.
const AS_OF_READ_BATCH: usize = 4_096;

const _: () = assert!(AS_OF_READ_BATCH as u64 <= MAX_AS_OF_FOLD_EVENTS);
const _: () = assert!(MAX_QUERY_ROWS <= MAX_AS_OF_OPERATIONS);

/// The bounds of one past listing: [`MAX_AS_OF_FOLD_EVENTS`] and [`MAX_AS_OF_OPERATIONS`] by
/// default; tests set smaller ones to reach the refusals on a short log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PastLimits {
    /// Most events read from the log.
    pub fold_events: u64,
    /// Most operations of the scope held.
    pub operations: usize,
}

impl Default for PastLimits {
    fn default() -> Self {
        Self {
            fold_events: MAX_AS_OF_FOLD_EVENTS,
            operations: MAX_AS_OF_OPERATIONS,
        }
    }
}

/// A moment of the log: which events were in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    /// Every event up to and including this position.
    Position(GlobalPosition),
    /// Every event recorded at or before this time, to the millisecond
    /// ([`opledger_domain::timestamp::at_or_before`]). A stream's events are in time order, so a
    /// stream is cut at its first event after the time (as `ops show --as-of` cuts it).
    Time(DateTime<Utc>),
}

/// Whose operations a past listing folds: a condition left `None` admits all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PastScope {
    /// Only these tenants' operations.
    pub tenants: Option<BTreeSet<TenantId>>,
    /// Only operations sent to this provider.
    pub provider: Option<ProviderId>,
    /// Only operations bound to this account.
    pub account: Option<AccountId>,
}

impl PastScope {
    fn admits(&self, event: &OperationEvent) -> bool {
        let OperationEvent::IntentRecorded(intent) = event else {
            return false;
        };
        self.tenants
            .as_ref()
            .is_none_or(|tenants| tenants.contains(&intent.tenant))
            && self
                .provider
                .as_ref()
                .is_none_or(|provider| *provider == intent.provider)
            && self
                .account
                .as_ref()
                .is_none_or(|account| *account == intent.account)
    }
}

/// One operation of the scope, folded up to the moment.
struct Held {
    state: OperationState,
    version: StreamVersion,
    position: GlobalPosition,
    at: DateTime<Utc>,
}

/// The operations' rows and the review queue of one scope as they were at a moment.
pub struct PastReadModels {
    held: HashMap<OperationId, Held>,
    review: HashMap<OperationId, ReviewItem>,
    /// The time of the moment: the time asked, or the time of the last event folded (a position's
    /// moment), or `None` when nothing was in the log then.
    time: Option<DateTime<Utc>>,
}

impl PastReadModels {
    /// Folds the log from its start up to `moment` (and no further than its head now) for the
    /// operations `scope` admits.
    pub async fn fold<S: EventStore>(
        store: &S,
        moment: Moment,
        scope: &PastScope,
    ) -> Result<Self, ReadModelError> {
        Self::fold_within(store, moment, scope, PastLimits::default()).await
    }

    /// [`Self::fold`] within other bounds than the defaults.
    pub async fn fold_within<S: EventStore>(
        store: &S,
        moment: Moment,
        scope: &PastScope,
        limits: PastLimits,
    ) -> Result<Self, ReadModelError> {
        let mut folding = Folding {
            limits,
            past: Self {
                held: HashMap::new(),
                review: HashMap::new(),
                time: match moment {
                    Moment::Time(time) => Some(time),
                    Moment::Position(_) => None,
                },
            },
            skipped: HashSet::new(),
            cut: HashSet::new(),
        };
        let Some(head) = store.head_position().await? else {
            return Ok(folding.past);
        };
        let end = match moment {
            Moment::Position(position) => position.min(head),
            Moment::Time(_) => head,
        };
        let mut start = LogStart::Beginning;
        let mut read: u64 = 0;
        // The last event in the moment, whatever its stream: a position's moment is its time.
        let mut last_in: Option<RecordedEvent> = None;
        loop {
            let batch = store.read_all(start, AS_OF_READ_BATCH).await?;
            let Some(last) = batch.last() else { break };
            start = LogStart::After(last.position);
            let within = batch.partition_point(|recorded| recorded.position <= end);
            if let Some(recorded) = within.checked_sub(1).and_then(|index| batch.get(index)) {
                last_in = Some(recorded.clone());
            }
            for recorded in &batch[..within] {
                read += 1;
                if read > limits.fold_events {
                    return Err(ReadModelError::AsOfBeyondLimit {
                        reason: format!(
                            "a listing as of a moment folds the log from its start, at most {} events, and this moment is further in (past position {}); ask an earlier moment, one operation with GET /v1/operations/{{id}}?as_of= (ops show --as-of), or the events themselves with opledger export --to",
                            limits.fold_events,
                            recorded.position
                        ),
                    });
                }
                folding.event(recorded, moment, scope)?;
            }
            if within < batch.len() || batch.len() < AS_OF_READ_BATCH || last.position >= end {
                break;
            }
        }
        if let (Moment::Position(_), Some(recorded)) = (
            moment,
            last_in.filter(|recorded| recorded.stream.operation_id().is_some()),
        ) {
            let event = codec::decode(&recorded).map_err(|source| ReadModelError::Decode {
                position: recorded.position,
                source,
            })?;
            folding.past.time = Some(event.at());
        }
        Ok(folding.past)
    }

    /// The time the moment stands for, from which ages and `older_than` are measured.
    pub fn time(&self) -> Option<DateTime<Utc>> {
        self.time
    }

    /// Up to `limit` (at most [`MAX_QUERY_ROWS`]) operations matching `filter`, oldest first,
    /// after the operation `after` (which must have been listed then): the page
    /// [`crate::ReadModelStore::list_operations`] gave at the moment.
    pub fn list_operations(
        &self,
        filter: &OperationFilter,
        limit: usize,
        after: Option<OperationId>,
    ) -> Result<OperationPage, ReadModelError> {
        let limit = limit.min(MAX_QUERY_ROWS);
        let cursor = match after {
            Some(operation_id) => Some(self.cursor(operation_id, filter)?),
            None => None,
        };
        // A search's terms, matched as the file's index matches them.
        let wanted = filter.terms();
        let mut rows: Vec<OperationRow> = self
            .held
            .iter()
            .filter(|(_, held)| {
                wanted.is_empty() || {
                    let terms = crate::terms::terms_of(&held.state);
                    wanted.iter().all(|term| terms.contains(term))
                }
            })
            .filter_map(|(operation_id, held)| {
                operations::row(
                    *operation_id,
                    &held.state,
                    held.version,
                    held.position,
                    held.at,
                )
            })
            .filter(|row| listed(row, filter, cursor.as_ref()))
            .collect();
        rows.sort_unstable_by(|a, b| {
            let order = (a.created_at, a.operation_id).cmp(&(b.created_at, b.operation_id));
            if filter.newest_first {
                order.reverse()
            } else {
                order
            }
        });
        rows.truncate(limit + 1);
        Ok(page_of(rows, limit))
    }

    /// Up to `limit` (at most [`MAX_QUERY_ROWS`]) operations of the review queue, the
    /// longest-waiting first, as the queue held them at the moment.
    pub fn review_queue(&self, limit: usize) -> Vec<ReviewItem> {
        let mut items: Vec<&ReviewItem> = self.review.values().collect();
        items.sort_unstable_by_key(|item| (item.since, item.operation_id));
        items
            .into_iter()
            .take(limit.min(MAX_QUERY_ROWS))
            .cloned()
            .collect()
    }

    /// Whether `operation_id`'s intent had every one of `terms` (`terms.rs`) at the moment: how a
    /// past review queue is searched by owner or argument, as the file's index matches them.
    pub fn has_terms(&self, operation_id: OperationId, terms: &[String]) -> bool {
        terms.is_empty()
            || self.held.get(&operation_id).is_some_and(|held| {
                let held_terms = crate::terms::terms_of(&held.state);
                terms.iter().all(|term| held_terms.contains(term))
            })
    }

    fn cursor(
        &self,
        operation_id: OperationId,
        filter: &OperationFilter,
    ) -> Result<OperationCursor, ReadModelError> {
        match self.held.get(&operation_id).and_then(|held| held.state.intent.as_ref()) {
            Some(intent) if filter.tenant.as_ref().is_none_or(|t| *t == intent.tenant) => {
                Ok(OperationCursor {
                    created_at: intent.at,
                    operation_id,
                })
            }
            _ => Err(ReadModelError::InvalidQuery {
                reason: format!(
                    "after={operation_id} names no operation of yours at that moment; pass the `next` of the previous page, with the same as_of"
                ),
            }),
        }
    }
}

/// Whether `row` is on a page of `filter` after `cursor`: the conditions of the SQL listing.
fn listed(row: &OperationRow, filter: &OperationFilter, cursor: Option<&OperationCursor>) -> bool {
    filter
        .state
        .as_deref()
        .is_none_or(|state| state == row.state)
        && filter.tenant.as_ref().is_none_or(|t| *t == row.tenant)
        && filter.provider.as_ref().is_none_or(|p| *p == row.provider)
        && filter.account.as_ref().is_none_or(|a| *a == row.account)
        && filter.older_than.is_none_or(|time| row.created_at < time)
        && filter.since.is_none_or(|time| row.created_at >= time)
        && filter.action.as_ref().is_none_or(|a| *a == row.action)
        && filter
            .source_id
            .as_ref()
            .is_none_or(|s| row.source_id.as_ref() == Some(s))
        && cursor.is_none_or(|cursor| {
            let key = (row.created_at, row.operation_id);
            let cursor = (cursor.created_at, cursor.operation_id);
            if filter.newest_first {
                key < cursor
            } else {
                key > cursor
            }
        })
}

/// The fold in progress: what is held, and which streams are passed over.
struct Folding {
    limits: PastLimits,
    past: PastReadModels,
    /// Operations outside the scope: their events are not decoded.
    skipped: HashSet<OperationId>,
    /// Streams cut by a time moment: their later events came after it.
    cut: HashSet<OperationId>,
}

impl Folding {
    fn event(
        &mut self,
        recorded: &RecordedEvent,
        moment: Moment,
        scope: &PastScope,
    ) -> Result<(), ReadModelError> {
        // Streams that are not an operation's hold nothing a listing shows (the runner skips
        // them too).
        let Some(operation_id) = recorded.stream.operation_id() else {
            return Ok(());
        };
        if self.skipped.contains(&operation_id) || self.cut.contains(&operation_id) {
            return Ok(());
        }
        let event = codec::decode(recorded).map_err(|source| ReadModelError::Decode {
            position: recorded.position,
            source,
        })?;
        if let Moment::Time(time) = moment {
            if !opledger_domain::timestamp::at_or_before(event.at(), time) {
                self.cut.insert(operation_id);
                return Ok(());
            }
        }
        let past = &mut self.past;
        let held = match past.held.get_mut(&operation_id) {
            Some(held) => held,
            None if !scope.admits(&event) => {
                self.skipped.insert(operation_id);
                return Ok(());
            }
            None => {
                if past.held.len() >= self.limits.operations {
                    return Err(ReadModelError::AsOfBeyondLimit {
                        reason: format!(
                            "a listing as of a moment holds at most {} operations in memory, and this one has more by position {}; name a tenant, provider or account, or ask an earlier moment",
                            self.limits.operations,
                            recorded.position
                        ),
                    });
                }
                past.held.entry(operation_id).or_insert(Held {
                    state: OperationState::initial(),
                    version: recorded.version,
                    position: recorded.position,
                    at: event.at(),
                })
            }
        };
        let last = held.state.intent.as_ref().map(|_| held.version);
        let changes = fold_in_place(
            operation_id,
            &mut held.state,
            last,
            recorded.version,
            recorded.position,
            // Similar intents only feed the duplicates model, which no listing shows.
            &[],
            &event,
        )
        .map_err(|source| ReadModelError::Fold {
            position: recorded.position,
            source,
        })?;
        held.version = recorded.version;
        held.position = recorded.position;
        held.at = event.at();
        if let Some(change) = changes.review {
            apply_review(&mut past.review, change);
        }
        Ok(())
    }
}

/// The review queue's change in memory, as `apply.rs` makes it in the file: evidence an update
/// does not bring keeps what an earlier event brought.
fn apply_review(queue: &mut HashMap<OperationId, ReviewItem>, change: ReviewChange) {
    match change {
        ReviewChange::Enter(entry) => {
            let progress = entry.progress;
            queue.insert(
                entry.operation_id,
                ReviewItem {
                    operation_id: entry.operation_id,
                    state: progress.state,
                    since: entry.since,
                    tenant: entry.tenant,
                    provider: entry.provider,
                    account: entry.account,
                    attempts: progress.attempts,
                    lookups: progress.lookups,
                    last_error: progress.last_error,
                    last_lookup: progress.lookup,
                    review: progress.review,
                    updated_at: progress.updated_at,
                },
            );
        }
        ReviewChange::Update {
            operation_id,
            progress,
        } => {
            if let Some(item) = queue.get_mut(&operation_id) {
                item.state = progress.state;
                item.attempts = progress.attempts;
                item.lookups = progress.lookups;
                item.last_error = progress.last_error;
                item.updated_at = progress.updated_at;
                if progress.lookup.is_some() {
                    item.last_lookup = progress.lookup;
                }
                if progress.review.is_some() {
                    item.review = progress.review;
                }
            }
        }
        ReviewChange::Leave { operation_id } => {
            queue.remove(&operation_id);
        }
    }
}
