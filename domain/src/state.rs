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
    AttemptNotSent, AttemptStarted, IntentRecorded, LateResponse, OperationEvent,
    ReconciliationRecorded, ReconciliationResult, ReviewDecision,
};
use crate::ids::{AttemptId, ExternalObjectId, WorkerId};

mod invariants;
#[cfg(debug_assertions)]
use invariants::Before;

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

    /// Whether one decided command may take an operation from this status to `next`: the
    /// arrows of the state machine in [`crate::decider`], a command's events taken together
    /// (a lookup that schedules a retry goes `unknown → pending` in one decision). Staying put
    /// is always allowed: an empty decision, or annotations.
    pub fn may_become(&self, next: &Status) -> bool {
        use Status::{
            Abandoned, AwaitingApproval, Denied, InFlight, NeedsReview, New, Pending, Rejected,
            Succeeded, Unknown,
        };
        if std::mem::discriminant(self) == std::mem::discriminant(next) {
            // Within succeeded, only the same object: a success keeps its first external id.
            return self == next || !matches!(self, Succeeded { .. });
        }
        match (self, next) {
            (New, AwaitingApproval | Pending) => true,
            (AwaitingApproval, Pending | Denied) => true,
            // From pending to succeeded: the late confirmation of an attempt not sent again yet.
            (Pending, InFlight | NeedsReview | Succeeded { .. }) => true,
            (InFlight, Succeeded { .. } | Rejected | Unknown | Pending) => true,
            // To abandoned: a person gave up on an unknown operation without waiting for review.
            (Unknown, Succeeded { .. } | Pending | NeedsReview | Abandoned) => true,
            (NeedsReview, Pending | Succeeded { .. } | Abandoned) => true,
            // The documented late confirmation, the provider's own evidence.
            (Rejected | Abandoned, Succeeded { .. }) => true,
            _ => false,
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

/// Who is looking an unknown operation up now (see [`crate::event::LookupClaimed`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupClaim {
    /// The worker looking it up.
    pub worker: WorkerId,
    /// When the claim lapses if no lookup is recorded.
    pub lease_deadline: DateTime<Utc>,
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
    /// While unknown: the earliest time to look again. While succeeded: when to look once more,
    /// after a lagging search's lag, for a duplicate the search could not show yet (set when a
    /// search inside its lag settled the operation; cleared by that look).
    pub next_check_not_before: Option<DateTime<Utc>>,
    /// While unknown: the worker that claimed the lookup in progress, until it is recorded.
    /// (Absent from states serialised before lookups were claimed.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookup_claim: Option<LookupClaim>,
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
            lookup_claim: None,
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
    /// once the lease has run out, a lookup once the next check is due and no other worker's
    /// claim on it holds (a claimed lookup falls due again when its claim's lease runs out, for
    /// another worker to take over). `None` when only an outside event (approval, review, a
    /// response) can move it.
    pub fn next_work(&self) -> Option<(DateTime<Utc>, Work)> {
        let since = self.updated_at?;
        match &self.status {
            // A caller's step is claimed by the caller, never sent by the ledger: a pending one
            // is the caller's work, not the workers'.
            Status::Pending if self.executed_by_caller() => None,
            Status::Pending => Some((self.retry_not_before.unwrap_or(since), Work::Send)),
            Status::InFlight => self
                .current_attempt
                .as_ref()
                .map(|attempt| (attempt.lease_deadline, Work::Sweep)),
            Status::Unknown => {
                let check = self.next_check_not_before.unwrap_or(since);
                let due = self
                    .lookup_claim
                    .as_ref()
                    .map_or(check, |claim| check.max(claim.lease_deadline));
                Some((due, Work::Reconcile))
            }
            // Settled by a lagging search inside its lag: one more look after the lag, for an
            // object the search could not show yet (a duplicate behind the success).
            Status::Succeeded { .. } => self
                .next_check_not_before
                .map(|check| (check, Work::Reconcile)),
            _ => None,
        }
    }

    /// Whether the caller's own code carries the operation out (a guarded step), not a connector.
    pub fn executed_by_caller(&self) -> bool {
        self.intent
            .as_ref()
            .is_some_and(crate::event::IntentRecorded::executed_by_caller)
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
            self.lookup_claim = None;
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
    // TigerBeetle's "assert_invariants(); defer assert_invariants();": every relation between
    // the fields is checked before and after each step, in debug builds only, since it walks
    // the attempt ids.
    #[cfg(debug_assertions)]
    state.assert_invariants();
    #[cfg(debug_assertions)]
    let before = Before::of(&state);
    state.updated_at = Some(event.at());
    match event {
        OperationEvent::IntentRecorded(intent) => state.record_intent(intent),
        OperationEvent::ApprovalGranted(_) => state.become_pending(PendingSince::Recorded),
        OperationEvent::ApprovalDenied(denied) => {
            state.last_error = Some(format!("denied by {}: {}", denied.approver, denied.reason));
            state.enter(Status::Denied);
        }
        OperationEvent::AttemptStarted(started) => state.start_attempt(started),
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
            state.end_uncertain(unknown.error.clone());
            state.next_check_not_before = unknown.check_not_before;
        }
        OperationEvent::AttemptNotSent(not_sent) => state.return_not_sent(not_sent),
        OperationEvent::SendPostponed(postponed) => {
            // Still pending as it was (no attempt started, none used up), until the account's
            // credentials or budget are asked again.
            state.last_error = Some(format!("waiting: {}", postponed.reason));
            state.retry_not_before = Some(postponed.not_before);
        }
        OperationEvent::LeaseExpired(expired) => {
            let what = if state.executed_by_caller() {
                // The evidence a reviewer reads: the step's function is the caller's, so only
                // the caller could have said whether it ran.
                format!("the caller's process stopped reporting: its claim ran out at {} without an outcome, so whether its function ran is unknown", expired.lease_deadline)
            } else {
                format!("lease expired at {}", expired.lease_deadline)
            };
            state.end_uncertain(what);
        }
        OperationEvent::LookupClaimed(claimed) => {
            if state.status == Status::Unknown {
                state.lookup_claim = Some(LookupClaim {
                    worker: claimed.worker.clone(),
                    lease_deadline: claimed.lease_deadline,
                });
            }
        }
        OperationEvent::LookupPostponed(postponed) => {
            // Still unknown, no lookup counted: nothing was asked. The claim (if one was taken)
            // has served its purpose.
            if state.status == Status::Unknown {
                state.lookup_claim = None;
                state.last_error = Some(format!("lookup waiting: {}", postponed.reason));
                state.next_check_not_before = Some(postponed.not_before);
            } else if state.next_check_not_before.is_some() {
                // A confirmed operation's look for a duplicate, put off the same way.
                state.next_check_not_before = Some(postponed.not_before);
            }
        }
        OperationEvent::ReconciliationRecorded(reconciled) => state.reconcile(reconciled),
        OperationEvent::RetryScheduled(retry) => {
            state.become_pending(PendingSince::RetryScheduled);
            state.retry_not_before = Some(retry.not_before);
        }
        OperationEvent::ReviewRequired(review) => {
            state.enter(Status::NeedsReview);
            state.review_reason = Some(review.reason.clone());
        }
        OperationEvent::ReviewResolved(resolved) => match &resolved.decision {
            ReviewDecision::Retry => state.become_pending(PendingSince::ReviewerRetry),
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
                let duplicate = duplicate.duplicate_external_id.clone();
                state.duplicates.push(duplicate);
            }
        }
    }
    #[cfg(debug_assertions)]
    before.assert_step(&state, event);
    #[cfg(debug_assertions)]
    state.assert_invariants();
    state
}

/// The steps of [`evolve`] longer than a line.
impl OperationState {
    fn record_intent(&mut self, intent: &IntentRecorded) {
        debug_assert!(
            self.intent.is_none(),
            "an operation records its intent once; the arguments never change under it"
        );
        self.intent = Some(intent.clone());
        if intent.requires_approval {
            self.enter(Status::AwaitingApproval);
        } else {
            self.become_pending(PendingSince::Recorded);
        }
    }

    fn become_pending(&mut self, since: PendingSince) {
        self.enter(Status::Pending);
        self.pending_since = Some(since);
    }

    fn start_attempt(&mut self, started: &AttemptStarted) {
        debug_assert!(
            started.attempt_number > self.attempts,
            "attempt numbers only grow: {} after {}",
            started.attempt_number,
            self.attempts
        );
        self.attempts = self.attempts.max(started.attempt_number);
        self.attempt_ids.push(started.attempt_id);
        self.first_attempt_at.get_or_insert(started.at);
        self.current_attempt = Some(AttemptInfo {
            attempt_id: started.attempt_id,
            number: started.attempt_number,
            worker: started.worker.clone(),
            lease_deadline: started.lease_deadline,
            started_at: started.at,
            claimed_from: self.pending_since.unwrap_or(PendingSince::Recorded),
        });
        self.enter(Status::InFlight);
    }

    /// An attempt ended without a known outcome (a timeout, an expired lease).
    fn end_uncertain(&mut self, error: String) {
        self.uncertain_attempts += 1;
        self.last_error = Some(error);
        self.enter(Status::Unknown);
    }

    fn return_not_sent(&mut self, not_sent: &AttemptNotSent) {
        self.last_error = Some(format!("not sent: {}", not_sent.reason));
        let claimed_from = self
            .current_attempt
            .as_ref()
            .map_or(PendingSince::Recorded, |attempt| attempt.claimed_from);
        self.become_pending(claimed_from);
        self.retry_not_before = Some(not_sent.retry_not_before);
    }

    fn reconcile(&mut self, reconciled: &ReconciliationRecorded) {
        // The lookup is recorded, whoever made it: the claim on it has served its purpose.
        self.lookup_claim = None;
        if matches!(self.status, Status::Succeeded { .. }) {
            // The look after a lagging search's lag (any other lookup of a confirmed operation
            // is recorded only for what it found): it is made, none is due any more.
            self.next_check_not_before = None;
        } else if let ReconciliationResult::Found { external_id, .. } = &reconciled.result {
            self.succeed(external_id);
            // Found inside a search's lag: the decider asks for one more look after the lag.
            if matches!(self.status, Status::Succeeded { .. }) {
                self.next_check_not_before = reconciled.next_check_not_before;
            }
        } else if self.status == Status::Unknown {
            self.reconciliations += 1;
            self.next_check_not_before = reconciled.next_check_not_before;
            if let ReconciliationResult::Inconclusive { reason } = &reconciled.result {
                self.last_error = Some(format!("lookup inconclusive: {reason}"));
            }
        }
    }
}

/// Folds a whole history into a state.
pub fn fold<'a>(events: impl IntoIterator<Item = &'a OperationEvent>) -> OperationState {
    events.into_iter().fold(OperationState::initial(), evolve)
}
