//! The current state of one operation: a left fold of its events ([`evolve`]).
//!
//! `evolve` never refuses an event: events are facts that already happened. It trusts that they
//! were produced by [`crate::decider::decide`]. A history that breaks an invariant (a success
//! left, an attempt number that does not grow) can only come from outside the decider — a hand
//! edit, another client of the store — so debug builds stop on it, and release builds keep the
//! invariant instead of folding the break in: a success keeps its first external id, attempt
//! numbers only grow. Loading a stream must not crash a server.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::event::{
    IntentRecorded, LateResponse, OperationEvent, ReconciliationResult, ReviewDecision,
};
use crate::ids::{AttemptId, ExternalObjectId, WorkerId};

/// Where an operation stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Status {
    /// Nothing recorded yet: the stream does not exist.
    New,
    /// Recorded; a person must approve it before it may be sent.
    AwaitingApproval,
    /// A person refused it. Terminal.
    Denied,
    /// May be claimed by a worker and sent.
    Pending,
    /// A worker claimed it and is sending it.
    InFlight,
    /// The provider confirmed it with this object. Terminal (annotations aside).
    Succeeded {
        /// The object the provider created.
        external_id: ExternalObjectId,
    },
    /// The provider refused it definitively; nothing was applied. Terminal.
    Rejected,
    /// It may or may not have been applied; evidence is being sought.
    Unknown,
    /// Automation stopped; a person decides.
    NeedsReview,
    /// A person gave up on it. Terminal.
    Abandoned,
}

impl Status {
    /// The status's name as the API and read models show it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::New => "new",
            Self::AwaitingApproval => "awaiting_approval",
            Self::Denied => "denied",
            Self::Pending => "pending",
            Self::InFlight => "in_flight",
            Self::Succeeded { .. } => "succeeded",
            Self::Rejected => "rejected",
            Self::Unknown => "unknown",
            Self::NeedsReview => "needs_review",
            Self::Abandoned => "abandoned",
        }
    }

    /// Whether nothing but annotations can follow.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::Denied | Self::Succeeded { .. } | Self::Rejected | Self::Abandoned
        )
    }
}

/// How an operation came to be pending; decides which checks its next attempt must pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PendingSince {
    /// Never attempted: recorded (and approved, if that was required).
    Recorded,
    /// An automatic retry was scheduled under a valid retry contract, re-checked before sending.
    RetryScheduled,
    /// A reviewer decided to send it again.
    ReviewerRetry,
}

/// Work an operation waits for (see [`OperationState::next_work`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Work {
    /// Claim it and send it.
    Send,
    /// Its attempt's lease ran out: record that the outcome is unknown.
    Sweep,
    /// Look it up at the provider.
    Reconcile,
}

/// The latest attempt of an operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptInfo {
    /// Its id.
    pub attempt_id: AttemptId,
    /// Its number (1 for the first).
    pub number: u32,
    /// The worker that made it.
    pub worker: WorkerId,
    /// When its lease lapses.
    pub lease_deadline: DateTime<Utc>,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// How the operation was pending when this attempt claimed it; restored if provably nothing
    /// was sent, so the next attempt passes exactly the checks this one had to.
    pub claimed_from: PendingSince,
}

/// The state of one operation, folded from its stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationState {
    /// Where it stands.
    pub status: Status,
    /// The frozen intent (`None` only while [`Status::New`]).
    pub intent: Option<IntentRecorded>,
    /// Why it is pending, when it is.
    pub pending_since: Option<PendingSince>,
    /// Attempts started so far; also the number of the latest one.
    pub attempts: u32,
    /// When the first attempt started: the idempotency key was first sent then.
    pub first_attempt_at: Option<DateTime<Utc>>,
    /// The latest attempt.
    pub current_attempt: Option<AttemptInfo>,
    /// Every attempt's id, oldest first (bounded by the attempt limit).
    pub attempt_ids: Vec<AttemptId>,
    /// The earliest start of the next attempt, after a scheduled retry.
    pub retry_not_before: Option<DateTime<Utc>>,
    /// When it last became unknown.
    pub unknown_since: Option<DateTime<Utc>>,
    /// Attempts that ended without a known outcome (a timeout, an expired lease).
    pub uncertain_attempts: u32,
    /// Lookups made since it last became unknown.
    pub reconciliations: u32,
    /// While unknown: the earliest time to look again.
    pub next_check_not_before: Option<DateTime<Utc>>,
    /// The latest error or refusal, for people.
    pub last_error: Option<String>,
    /// Why it needs review, when it does.
    pub review_reason: Option<String>,
    /// Other objects found for it after it was confirmed.
    pub duplicates: Vec<ExternalObjectId>,
    /// When the latest event happened.
    pub updated_at: Option<DateTime<Utc>>,
}

impl Default for OperationState {
    fn default() -> Self {
        Self::initial()
    }
}

impl OperationState {
    /// The state before any event: nothing recorded.
    pub const fn initial() -> Self {
        Self {
            status: Status::New,
            intent: None,
            pending_since: None,
            attempts: 0,
            first_attempt_at: None,
            current_attempt: None,
            attempt_ids: Vec::new(),
            retry_not_before: None,
            unknown_since: None,
            uncertain_attempts: 0,
            reconciliations: 0,
            next_check_not_before: None,
            last_error: None,
            review_reason: None,
            duplicates: Vec::new(),
            updated_at: None,
        }
    }

    /// The object the provider confirmed, once it has.
    pub fn external_id(&self) -> Option<&ExternalObjectId> {
        match &self.status {
            Status::Succeeded { external_id } => Some(external_id),
            _ => None,
        }
    }

    /// Whether `attempt` is the latest attempt.
    pub fn is_current_attempt(&self, attempt: AttemptId) -> bool {
        self.current_attempt
            .as_ref()
            .is_some_and(|current| current.attempt_id == attempt)
    }

    /// What work the operation waits for, and from when: a send once pending is due, a sweep
    /// once the lease has run out, a lookup once the next check is due. `None` when only an
    /// outside event (approval, review, a response) can move it.
    pub fn next_work(&self) -> Option<(DateTime<Utc>, Work)> {
        let since = self.updated_at?;
        match &self.status {
            Status::Pending => Some((self.retry_not_before.unwrap_or(since), Work::Send)),
            Status::InFlight => self
                .current_attempt
                .as_ref()
                .map(|attempt| (attempt.lease_deadline, Work::Sweep)),
            Status::Unknown => Some((self.next_check_not_before.unwrap_or(since), Work::Reconcile)),
            _ => None,
        }
    }

    /// Whether `attempt` is one of this operation's attempts.
    pub fn knows_attempt(&self, attempt: AttemptId) -> bool {
        self.attempt_ids.contains(&attempt)
    }

    /// Whether a late confirmation of one of its attempts settles the operation as succeeded:
    /// it was attempted and is not already confirmed. That includes `rejected` and `abandoned`:
    /// the provider's own confirmation outranks a refusal of another attempt or a reviewer who
    /// gave up without it. A denied operation was never sent and cannot be confirmed.
    pub fn settles_with_late_confirmation(&self) -> bool {
        self.attempts > 0 && !matches!(self.status, Status::Succeeded { .. } | Status::Denied)
    }

    fn enter(&mut self, status: Status) {
        // A confirmed success is never left (design rule 7); the decider guarantees it and
        // a history that says otherwise must not be folded into a regression.
        let leaves_success = matches!(self.status, Status::Succeeded { .. })
            && !matches!(status, Status::Succeeded { .. });
        debug_assert!(
            !leaves_success,
            "a succeeded operation cannot move to {}",
            status.name()
        );
        if leaves_success {
            return;
        }
        if status != Status::Pending {
            self.pending_since = None;
            self.retry_not_before = None;
        }
        if status != Status::NeedsReview {
            self.review_reason = None;
        }
        if status == Status::Unknown && self.status != Status::Unknown {
            self.unknown_since = self.updated_at;
            self.reconciliations = 0;
        }
        if status != Status::Unknown {
            self.next_check_not_before = None;
        }
        self.status = status;
    }

    fn succeed(&mut self, external_id: &ExternalObjectId) {
        if self.external_id().is_none() {
            self.enter(Status::Succeeded {
                external_id: external_id.clone(),
            });
        }
    }
}

/// Applies one event to a state: the fold step of every projection of an operation.
pub fn evolve(mut state: OperationState, event: &OperationEvent) -> OperationState {
    state.updated_at = Some(event.at());
    match event {
        OperationEvent::IntentRecorded(intent) => {
            state.intent = Some(intent.clone());
            if intent.requires_approval {
                state.enter(Status::AwaitingApproval);
            } else {
                state.enter(Status::Pending);
                state.pending_since = Some(PendingSince::Recorded);
            }
        }
        OperationEvent::ApprovalGranted(_) => {
            state.enter(Status::Pending);
            state.pending_since = Some(PendingSince::Recorded);
        }
        OperationEvent::ApprovalDenied(denied) => {
            state.last_error = Some(format!("denied by {}: {}", denied.approver, denied.reason));
            state.enter(Status::Denied);
        }
        OperationEvent::AttemptStarted(started) => {
            debug_assert!(
                started.attempt_number > state.attempts,
                "attempt numbers only grow: {} after {}",
                started.attempt_number,
                state.attempts
            );
            state.attempts = state.attempts.max(started.attempt_number);
            state.attempt_ids.push(started.attempt_id);
            state.first_attempt_at.get_or_insert(started.at);
            state.current_attempt = Some(AttemptInfo {
                attempt_id: started.attempt_id,
                number: started.attempt_number,
                worker: started.worker.clone(),
                lease_deadline: started.lease_deadline,
                started_at: started.at,
                claimed_from: state.pending_since.unwrap_or(PendingSince::Recorded),
            });
            state.enter(Status::InFlight);
        }
        OperationEvent::AttemptSucceeded(succeeded) => state.succeed(&succeeded.external_id),
        OperationEvent::AttemptRejected(rejected) => {
            state.last_error = Some(format!("{}: {}", rejected.code, rejected.message));
            // A refusal proves only that *this* attempt applied nothing. After an attempt whose
            // outcome is unknown (a retry refused as "duplicate" because the first one worked),
            // the operation is still unknown, and reconciliation finds out.
            if state.uncertain_attempts > 0 {
                state.enter(Status::Unknown);
            } else {
                state.enter(Status::Rejected);
            }
        }
        OperationEvent::OutcomeUnknown(unknown) => {
            state.uncertain_attempts += 1;
            state.last_error = Some(unknown.error.clone());
            state.enter(Status::Unknown);
        }
        OperationEvent::AttemptNotSent(not_sent) => {
            state.last_error = Some(format!("not sent: {}", not_sent.reason));
            let claimed_from = state
                .current_attempt
                .as_ref()
                .map_or(PendingSince::Recorded, |attempt| attempt.claimed_from);
            state.enter(Status::Pending);
            state.pending_since = Some(claimed_from);
            state.retry_not_before = Some(not_sent.retry_not_before);
        }
        OperationEvent::LeaseExpired(expired) => {
            state.uncertain_attempts += 1;
            state.last_error = Some(format!("lease expired at {}", expired.lease_deadline));
            state.enter(Status::Unknown);
        }
        OperationEvent::ReconciliationRecorded(reconciled) => {
            if let ReconciliationResult::Found { external_id, .. } = &reconciled.result {
                state.succeed(external_id);
            } else if state.status == Status::Unknown {
                state.reconciliations += 1;
                state.next_check_not_before = reconciled.next_check_not_before;
                if let ReconciliationResult::Inconclusive { reason } = &reconciled.result {
                    state.last_error = Some(format!("lookup inconclusive: {reason}"));
                }
            }
        }
        OperationEvent::RetryScheduled(retry) => {
            state.enter(Status::Pending);
            state.pending_since = Some(PendingSince::RetryScheduled);
            state.retry_not_before = Some(retry.not_before);
        }
        OperationEvent::ReviewRequired(review) => {
            state.enter(Status::NeedsReview);
            state.review_reason = Some(review.reason.clone());
        }
        OperationEvent::ReviewResolved(resolved) => match &resolved.decision {
            ReviewDecision::Retry => {
                state.enter(Status::Pending);
                state.pending_since = Some(PendingSince::ReviewerRetry);
            }
            ReviewDecision::ConfirmSucceeded { external_id } => state.succeed(external_id),
            ReviewDecision::Abandon => state.enter(Status::Abandoned),
        },
        OperationEvent::LateResponseReceived(late) => {
            if let LateResponse::Succeeded { external_id, .. } = &late.response {
                if state.settles_with_late_confirmation() {
                    state.succeed(external_id);
                }
            }
        }
        OperationEvent::DuplicateDetected(duplicate) => {
            if !state.duplicates.contains(&duplicate.duplicate_external_id) {
                state
                    .duplicates
                    .push(duplicate.duplicate_external_id.clone());
            }
        }
    }
    state
}

/// Folds a whole history into a state.
pub fn fold<'a>(events: impl IntoIterator<Item = &'a OperationEvent>) -> OperationState {
    events.into_iter().fold(OperationState::initial(), evolve)
}
