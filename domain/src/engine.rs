//! The execution engine: the article's `execute` and `reconcile`, done right, over the ports.
//!
//! `drive` moves one operation as far as it can go now: a pending operation is claimed (one
//! conditional append; exactly one worker wins), its binding and retry contract are checked again
//! right before the send, the attempt is sent with the operation's key, and what the provider
//! said is recorded with another conditional append. An expired lease becomes unknown (it does
//! not prove the request stopped). An unknown operation's lookup is claimed first (one more
//! conditional append, with a lease: of several instances sharing the ledger exactly one asks the
//! provider each round, and once a dead claimant's lease runs out another takes over), then it is
//! looked up; evidence settles it, a valid retry contract schedules a retry of the same operation
//! with the same key, anything else goes to a person. Every answer carries the one sentence the
//! agent may say.
//!
//! Inside one process, one operation is driven by one caller at a time ([`driving`]): an execute
//! call and a background worker that meet on one operation take turns, so one lookup or send is
//! made where two would have been.
//!
//! It must never send without a recorded claim, never send to an account other than the one the
//! intent is bound to, and never decide on its own that an unclear attempt failed.

use chrono::{DateTime, Utc};
use tracing::{debug, info, warn};

use crate::app::{AppError, IntentRequest, Ledger, LoadedOperation, RecordedIntent};
use crate::command::{
    Command, DEFAULT_LEASE_MS, MAX_LEASE_MS, MAX_SCHEDULE_AHEAD_MS, MIN_LEASE_MS,
};
use crate::contract::{
    check_retry_contract, milliseconds, Deduplication, LookupSupport, ProviderCapabilities,
    RetryPolicy, SendBinding, CALLER_STEP_CAPABILITIES,
};
use crate::decider::Rejection;
use crate::error::{OutOfRange, ValidationError};
use crate::event::{BudgetWait, IntentRecorded, Principal, ReconciliationResult, ReviewDecision};
use crate::ids::{
    AccountId, ActionName, ActorId, AttemptId, CredentialFingerprint, ExternalObjectId,
    OperationId, ProviderId, TenantId, WorkerId,
};
use crate::in_span::InSpanExt;
use crate::ports::{Clock, IdSource};
use crate::provider::{
    operation_label, Binding, BindingQuery, LookupOutcome, LookupRequest, Providers, Readiness,
    RequestKind, SendOutcome, SendRequest,
};
use crate::sentence::described_sentence;
use crate::state::{OperationState, PendingSince, Status};
use crate::store::EventStore;

mod driving;
use driving::Driving;

/// Most steps one `drive` call takes (claim + send, sweep, lookup) before it returns.
pub const MAX_DRIVE_STEPS: usize = 4;
/// The longest wait a provider's Retry-After may impose, in milliseconds.
pub const MAX_RETRY_AFTER_MS: u64 = 10 * 60 * 1000;
// A Retry-After is scheduled through the decider, which clamps anything further ahead.
const _: () = assert!(MAX_RETRY_AFTER_MS <= MAX_SCHEDULE_AHEAD_MS);

/// Shortest wait for an account's request budget that is recorded with the claim it preceded,
/// in milliseconds: shorter ones are pacing nobody reading a history needs to see (they still
/// count in the metrics).
pub const MIN_RECORDED_BUDGET_WAIT_MS: u64 = 100;
const _: () = assert!(MIN_RECORDED_BUDGET_WAIT_MS <= MAX_RETRY_AFTER_MS);

/// Shortest first backoff, in milliseconds: 0 would retry at once, and doubling 0 stays 0.
pub const MIN_BACKOFF_MS: u64 = 1;
/// Longest backoff, first or capped, in milliseconds: an hour, so a lookup or retry is never
/// further away than a person would wait before asking what happened.
pub const MAX_BACKOFF_MS: u64 = 3600 * 1000;
/// The first backoff unless configured otherwise, in milliseconds.
pub const DEFAULT_BACKOFF_BASE_MS: u64 = 500;
/// The longest backoff unless configured otherwise, in milliseconds.
pub const DEFAULT_BACKOFF_MAX_MS: u64 = 60_000;
const _: () = assert!(
    MIN_BACKOFF_MS <= DEFAULT_BACKOFF_BASE_MS
        && DEFAULT_BACKOFF_BASE_MS <= DEFAULT_BACKOFF_MAX_MS
        && DEFAULT_BACKOFF_MAX_MS <= MAX_BACKOFF_MS
);
// A backoff is scheduled through the decider, which clamps anything further ahead.
const _: () = assert!(MAX_BACKOFF_MS <= MAX_SCHEDULE_AHEAD_MS);

/// How the engine paces and bounds its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnginePolicy {
    /// How long a claim holds without an outcome, in milliseconds. Must exceed the providers'
    /// request timeouts, or healthy slow sends are swept to unknown.
    pub lease_ms: u64,
    /// The retry and lookup budget.
    pub retry: RetryPolicy,
    /// The first backoff, in milliseconds; it doubles per attempt or lookup.
    pub backoff_base_ms: u64,
    /// The longest backoff, in milliseconds.
    pub backoff_max_ms: u64,
}

impl EnginePolicy {
    /// Checks every field against its owning constants, so every entry point (a config file,
    /// the demo, a test) refuses the same values: the lease in
    /// [`MIN_LEASE_MS`]..=[`MAX_LEASE_MS`], the retry budget as [`RetryPolicy::validate`] says,
    /// the first backoff in [`MIN_BACKOFF_MS`]..=[`MAX_BACKOFF_MS`] and the longest between the
    /// first and [`MAX_BACKOFF_MS`]. The first field out of range is named with its value and
    /// range.
    pub fn validate(&self) -> Result<(), OutOfRange> {
        OutOfRange::check("lease_ms", self.lease_ms, MIN_LEASE_MS, MAX_LEASE_MS)?;
        self.retry.validate()?;
        OutOfRange::check(
            "backoff_base_ms",
            self.backoff_base_ms,
            MIN_BACKOFF_MS,
            MAX_BACKOFF_MS,
        )?;
        OutOfRange::check(
            "backoff_max_ms",
            self.backoff_max_ms,
            self.backoff_base_ms,
            MAX_BACKOFF_MS,
        )
    }

    /// Checks the policy's ranges ([`EnginePolicy::validate`]), then the policy against the
    /// providers it will drive: the lease must outlast the longest send, or the sweeper would
    /// call a send that is still running "unknown".
    pub fn check(&self, longest_send_ms: u64) -> Result<(), ValidationError> {
        self.validate()?;
        if longest_send_ms > 0 && self.lease_ms <= longest_send_ms {
            return Err(ValidationError::new(
                "lease_ms",
                format!(
                    "is {} ms, but one send may take up to {longest_send_ms} ms; make the lease longer than that, or the providers' timeouts shorter",
                    self.lease_ms
                ),
            ));
        }
        Ok(())
    }
}

impl Default for EnginePolicy {
    fn default() -> Self {
        Self {
            lease_ms: DEFAULT_LEASE_MS,
            retry: RetryPolicy::default(),
            backoff_base_ms: DEFAULT_BACKOFF_BASE_MS,
            backoff_max_ms: DEFAULT_BACKOFF_MAX_MS,
        }
    }
}

/// Where an operation stands after the engine worked on it, and what the agent may say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The operation.
    pub operation: LoadedOperation,
    /// The one truthful sentence for the agent.
    pub sentence: String,
}

impl Report {
    /// The report of `operation`, its sentence in the words of `description` (the action's).
    fn of(operation: LoadedOperation, description: Option<&str>) -> Self {
        let sentence = described_sentence(&operation.state, description);
        Self {
            operation,
            sentence,
        }
    }

    /// The operation's state.
    pub fn state(&self) -> &OperationState {
        &self.operation.state
    }
}

/// The engine over a ledger and the providers it sends to.
#[derive(Debug)]
pub struct Engine<S, C, I, P> {
    ledger: Ledger<S, C, I>,
    providers: P,
    policy: EnginePolicy,
    worker: WorkerId,
    /// The operations this engine is driving now; every drive takes its operation's turn here.
    driving: Driving,
}

impl<S: EventStore, C: Clock, I: IdSource, P: Providers> Engine<S, C, I, P> {
    /// An engine that claims attempts as `worker`, after checking its policy against the
    /// providers (see [`EnginePolicy::check`]).
    pub fn try_new(
        ledger: Ledger<S, C, I>,
        providers: P,
        policy: EnginePolicy,
        worker: WorkerId,
    ) -> Result<Self, ValidationError> {
        policy.check(providers.longest_send_ms())?;
        Ok(Self::new(ledger, providers, policy, worker))
    }

    /// An engine that claims attempts as `worker`, without checking the policy against the
    /// providers (tests that want a lease shorter than a send use this). The policy's own
    /// ranges still hold: debug builds stop on one out of range ([`EnginePolicy::validate`]).
    pub fn new(
        ledger: Ledger<S, C, I>,
        providers: P,
        policy: EnginePolicy,
        worker: WorkerId,
    ) -> Self {
        debug_assert_eq!(policy.validate(), Ok(()), "an engine policy out of range");
        Self {
            ledger,
            providers,
            policy,
            worker,
            driving: Driving::default(),
        }
    }

    /// The ledger underneath.
    pub fn ledger(&self) -> &Ledger<S, C, I> {
        &self.ledger
    }

    /// The providers the engine sends to.
    pub fn providers(&self) -> &P {
        &self.providers
    }

    /// Moves the operation as far as it can go now and reports where it stands: terminal → its
    /// result; awaiting approval or review → as is; in flight → its status (or unknown, once the
    /// lease has run out); unknown → looked up; pending and due → claimed, sent, recorded.
    /// A drive of an operation another caller of this engine is driving waits for it to end.
    pub async fn drive(&self, operation_id: OperationId) -> Result<Report, AppError> {
        let _turn = self.driving.acquire(operation_id).await;
        let loaded = self.ledger.get(operation_id).await?;
        self.drive_steps(loaded).await
    }

    /// [`Engine::drive`] starting from an operation the caller just recorded or loaded, saving
    /// a read. A stale copy costs only a lost race: every step is a conditional append, and a
    /// lost one reloads. (Use it only with a state this process just wrote or read: a copy that
    /// says "nothing to do" is answered as it is.) If another drive of the operation ran while
    /// this one waited for its turn, the copy is stale for certain and is read again.
    pub async fn drive_from(&self, loaded: LoadedOperation) -> Result<Report, AppError> {
        let turn = self.driving.acquire(loaded.operation_id).await;
        let loaded = self.fresh_after(&turn, loaded).await?;
        self.drive_steps(loaded).await
    }

    /// `loaded` as it stands now, read again if another drive ran while `turn` was awaited.
    async fn fresh_after(
        &self,
        turn: &driving::DriveGuard<'_>,
        loaded: LoadedOperation,
    ) -> Result<LoadedOperation, AppError> {
        if turn.waited() {
            return self.ledger.get(loaded.operation_id).await;
        }
        Ok(loaded)
    }

    /// The steps of a drive, taken while holding the operation's turn.
    async fn drive_steps(&self, mut loaded: LoadedOperation) -> Result<Report, AppError> {
        // Work done later (a worker's lookup, a retry) joins the trace of the request that
        // recorded the intent; nothing when trace export is off.
        crate::trace_context::continue_from(
            &tracing::Span::current(),
            loaded.origin_traceparent.as_deref(),
        );
        for _ in 0..MAX_DRIVE_STEPS {
            let now = self.ledger.clock().now();
            let due = loaded
                .state
                .next_work()
                .is_some_and(|(due_at, _)| due_at <= now);
            if !due {
                break;
            }
            loaded = match loaded.state.status {
                Status::Pending => self.attempt(loaded).await?,
                Status::InFlight => self.expire(loaded).await?,
                Status::Unknown => self.reconcile_loaded(loaded).await?,
                // The look for a duplicate a lagging search asked for (see `next_work`): one
                // lookup, recorded whatever it finds, so it is due no more.
                Status::Succeeded { .. } => self.reconcile_loaded(loaded).await?,
                _ => break,
            };
        }
        Ok(self.report(loaded))
    }

    /// The caller claims the next attempt of its step `operation_id` as `caller`, for
    /// `lease_ms` (one conditional append: of two callers, one wins), as attempt `attempt_id`
    /// (a fresh one when `None`). The loaded operation shows
    /// the claim: its current attempt, its lease's end, the key to pass to the function. Refused
    /// with [`Rejection::NotAllowed`] unless the step is pending (another caller's claim is live,
    /// or it settled), and with [`Rejection::WrongExecutor`] for a connector's operation.
    pub async fn claim_step(
        &self,
        operation_id: OperationId,
        attempt_id: Option<AttemptId>,
        caller: WorkerId,
        lease_ms: u64,
    ) -> Result<LoadedOperation, AppError> {
        let _turn = self.driving.acquire(operation_id).await;
        let loaded = self.ledger.get(operation_id).await?;
        let command = Command::ClaimStep {
            // A caller that names its attempt can repeat a claim whose answer it lost: the same
            // claim again is answered as it was, instead of refused as another caller's.
            attempt_id: attempt_id.unwrap_or_else(|| self.ledger.ids().new_attempt_id()),
            caller,
            lease_ms,
        };
        let span = tracing::info_span!("claim_step", %operation_id);
        self.ledger
            .execute_from(loaded, &command)
            .in_span(span)
            .await
    }

    /// Records what the caller reports of its step's attempt (`command` is one of
    /// [`Command::RecordSuccess`], [`Command::RecordRejection`], [`Command::RecordUnknown`]),
    /// decided as a provider's answer is: a report for the live attempt settles it, a late one is
    /// evidence. An unknown outcome is driven on at once, so the answer already says that a
    /// person has it.
    pub async fn report_step(
        &self,
        operation_id: OperationId,
        command: &Command,
    ) -> Result<Report, AppError> {
        debug_assert!(matches!(
            command,
            Command::RecordSuccess { .. }
                | Command::RecordRejection { .. }
                | Command::RecordUnknown { .. }
        ));
        let recorded = {
            let _turn = self.driving.acquire(operation_id).await;
            let loaded = self.ledger.get(operation_id).await?;
            if !loaded.state.executed_by_caller() {
                let executor = loaded
                    .state
                    .intent
                    .as_ref()
                    .map_or(crate::event::Executor::Ledger, |intent| intent.executor);
                return Err(AppError::Rejected {
                    operation_id,
                    rejection: Rejection::WrongExecutor { executor },
                });
            }
            let span = tracing::info_span!("report_step", %operation_id, command = command.name());
            self.ledger
                .execute_from(loaded, command)
                .in_span(span)
                .await?
        };
        self.drive_from(recorded).await
    }

    /// Records that this engine's attempt of `operation_id` was cut off before its outcome was
    /// recorded (the process is stopping): its outcome is unknown from now on, instead of in
    /// flight until the lease runs out, and the reconciler finds out what the provider did.
    /// Returns whether anything was recorded — nothing if the attempt already ended or belongs
    /// to another worker.
    pub async fn record_interrupted(&self, operation_id: OperationId) -> Result<bool, AppError> {
        let loaded = self.ledger.get(operation_id).await?;
        let Some(attempt) = loaded.state.current_attempt.as_ref().filter(|attempt| {
            matches!(loaded.state.status, Status::InFlight) && attempt.worker == self.worker
        }) else {
            return Ok(false);
        };
        let command = Command::RecordUnknown {
            attempt_id: attempt.attempt_id,
            error: "the process stopped while this attempt was in progress; whether the provider applied it is unknown".into(),
            check_not_before: None,
        };
        let before = loaded.version;
        let after = self.ledger.execute_from(loaded, &command).await?;
        Ok(after.version != before)
    }

    /// Records a reviewer's decision taken on exactly `seen` (the version the reviewer looked at):
    /// refused with [`AppError::Moved`] if the operation moved on meanwhile. For a retry, drives
    /// the operation on.
    pub async fn resolve_review_seen(
        &self,
        seen: LoadedOperation,
        reviewer: ActorId,
        principal: Option<Principal>,
        decision: ReviewDecision,
        note: String,
        accept_duplicate_risk: bool,
    ) -> Result<Report, AppError> {
        let capabilities = self.contract_of(&seen.state);
        let (command, retry) = review_command(
            reviewer,
            principal,
            decision,
            note,
            accept_duplicate_risk,
            capabilities,
        );
        let span = review_span(&seen, &command);
        let resolved = self
            .ledger
            .execute_on_seen(seen, &command)
            .in_span(span)
            .await?;
        self.after_review(resolved, retry).await
    }

    /// Records a reviewer's decision and, for a retry, drives the operation on.
    pub async fn resolve_review(
        &self,
        operation_id: OperationId,
        reviewer: ActorId,
        principal: Option<Principal>,
        decision: ReviewDecision,
        note: String,
        accept_duplicate_risk: bool,
    ) -> Result<Report, AppError> {
        let loaded = self.ledger.get(operation_id).await?;
        let capabilities = self.contract_of(&loaded.state);
        let (command, retry) = review_command(
            reviewer,
            principal,
            decision,
            note,
            accept_duplicate_risk,
            capabilities,
        );
        let span = review_span(&loaded, &command);
        let resolved = self
            .ledger
            .execute_from(loaded, &command)
            .in_span(span)
            .await?;
        self.after_review(resolved, retry).await
    }

    /// Where `operation` stands, said in its action's configured words.
    fn report(&self, operation: LoadedOperation) -> Report {
        let description = operation.state.intent.as_ref().and_then(|intent| {
            self.providers
                .action_description(&intent.provider, &intent.action)
        });
        Report::of(operation, description.as_deref())
    }

    /// The contract the operation's action has as configured now, if it is bound.
    fn contract_of(&self, state: &OperationState) -> Option<ProviderCapabilities> {
        let intent = state.intent.as_ref()?;
        if intent.executed_by_caller() {
            return Some(CALLER_STEP_CAPABILITIES);
        }
        self.providers
            .bind(&binding_query(intent))
            .ok()
            .map(|bound| bound.capabilities)
    }

    /// A retry decided by a person is sent at once, from the state just written.
    async fn after_review(
        &self,
        resolved: LoadedOperation,
        retry: bool,
    ) -> Result<Report, AppError> {
        if retry {
            return self.drive_from(resolved).await;
        }
        Ok(self.report(resolved))
    }

    /// Records an intent and, when it can be sent now, claims its first attempt in the same
    /// append, then sends it and records the outcome: one durable write fewer than recording and
    /// driving separately, with the same rule — nothing is sent before the intent (and the
    /// claim) are on disk. An intent that needs an approval, or a person, is recorded alone and
    /// driven as [`Engine::drive_from`] would. The recorded operation is returned with the
    /// drive's result, so a failing send never hides that the intent is durable.
    pub async fn record_and_drive(
        &self,
        request: IntentRequest,
    ) -> Result<(RecordedIntent, Result<Report, AppError>), AppError> {
        let (recorded, claimed) = self.record_and_claim(request).await?;
        let report = self
            .drive_recorded(recorded.operation.clone(), claimed)
            .await;
        Ok((recorded, report))
    }

    /// The first half of [`Engine::record_and_drive`]: records the intent, with the claim of its
    /// first attempt in the same append when it can be sent now, and returns the recorded
    /// operation and the attempt this engine claimed (if it did). Nothing is sent.
    pub async fn record_and_claim(
        &self,
        request: IntentRequest,
    ) -> Result<(RecordedIntent, Option<AttemptId>), AppError> {
        self.record_personal_and_claim(request, None).await
    }

    /// [`Engine::record_and_claim`] for an intent with personal data (see
    /// [`Ledger::record_personal_then`]).
    pub async fn record_personal_and_claim(
        &self,
        request: IntentRequest,
        personal: Option<crate::personal::Personal>,
    ) -> Result<(RecordedIntent, Option<AttemptId>), AppError> {
        let attempt_id = self.ledger.ids().new_attempt_id();
        let ready = self.ready_at_once(&request).await;
        let recorded = self
            .ledger
            .record_personal_then(request, personal, |state| {
                let now = self.ledger.clock().now();
                let due = ready
                    && state.status == Status::Pending
                    && state.next_work().is_some_and(|(due_at, _)| due_at <= now);
                match self.claim_plan(state, attempt_id) {
                    Some(ClaimPlan::Claim(claim)) if due => Some(*claim),
                    _ => None,
                }
            })
            .await?;
        // The attempt id is fresh to this call: if the operation's current attempt carries it,
        // this call's claim is what was appended, whatever else happened.
        let state = &recorded.operation.state;
        let claimed = (state.status == Status::InFlight
            && state
                .current_attempt
                .as_ref()
                .is_some_and(|attempt| attempt.attempt_id == attempt_id))
        .then_some(attempt_id);
        Ok((recorded, claimed))
    }

    /// The second half of [`Engine::record_and_drive`]: sends the attempt `claimed` (this
    /// engine's claim from [`Engine::record_and_claim`]) and records the outcome, then drives on;
    /// without a claim, drives the operation as [`Engine::drive_from`] does.
    pub async fn drive_recorded(
        &self,
        operation: LoadedOperation,
        claimed: Option<AttemptId>,
    ) -> Result<Report, AppError> {
        let turn = self.driving.acquire(operation.operation_id).await;
        match claimed {
            // The claim is this engine's own: nobody else sends it, whoever drove meanwhile.
            Some(attempt_id) => {
                let sent = self.send_claimed(operation, attempt_id).await?;
                self.drive_steps(sent).await
            }
            None => {
                let operation = self.fresh_after(&turn, operation).await?;
                self.drive_steps(operation).await
            }
        }
    }

    /// Whether a new intent's first attempt may be claimed in the same append as the intent:
    /// its account's credentials and a budget slot are at hand now. Nothing is waited for
    /// before the intent is durable; one that must wait is recorded alone and then driven, which
    /// waits (or postpones) before its claim.
    async fn ready_at_once(&self, request: &IntentRequest) -> bool {
        if request.requires_approval {
            return false;
        }
        // An intent these do not parse for is refused by the recording itself.
        let (Ok(tenant), Ok(provider), Ok(account), Ok(action)) = (
            TenantId::new(request.tenant.as_str()),
            ProviderId::new(request.provider.as_str()),
            AccountId::new(request.account.as_str()),
            ActionName::new(request.action.as_str()),
        ) else {
            return false;
        };
        let query = BindingQuery {
            tenant: &tenant,
            provider: &provider,
            account: &account,
            action: &action,
        };
        let readiness = self.providers.prepare(&query, RequestKind::Send, false);
        matches!(readiness.await, Readiness::Ready { .. })
    }

    /// What a request of `kind` for `intent` needs before its claim (see
    /// [`Providers::prepare`]), with a budget wait kept only when it is worth recording.
    async fn prepare(&self, intent: &IntentRecorded, kind: RequestKind) -> Readiness {
        // Debug, so not exported: the claim and send after it carry the account, and a span
        // per request for the budget check was the trace's most common and least telling one.
        let span = tracing::debug_span!("prepare", account = %intent.account, kind = ?kind);
        let readiness = self
            .providers
            .prepare(&binding_query(intent), kind, true)
            .in_span(span)
            .await;
        match readiness {
            Readiness::Ready { budget_wait } => Readiness::Ready {
                budget_wait: budget_wait
                    .filter(|wait| wait.waited_ms >= MIN_RECORDED_BUDGET_WAIT_MS),
            },
            wait @ Readiness::Wait { .. } => wait,
        }
    }

    /// Puts off the claim of a pending operation whose account's credentials or budget are not
    /// there (see [`Readiness::Wait`]): one append, no attempt started or used up.
    async fn postpone(
        &self,
        loaded: LoadedOperation,
        reason: String,
        retry_after_ms: u64,
    ) -> Result<LoadedOperation, AppError> {
        let operation_id = loaded.operation_id;
        let now = self.ledger.clock().now();
        // The account's own wait, not a backoff per operation: every operation of the account
        // asks again at the same step, and the adapter makes one request for all of them.
        let wait = retry_after_ms.clamp(MIN_BACKOFF_MS, MAX_RETRY_AFTER_MS);
        let not_before = now.checked_add_signed(milliseconds(wait)).unwrap_or(now);
        info!(%operation_id, %reason, wait_ms = wait, "send postponed; no attempt started");
        let command = Command::PostponeSend { reason, not_before };
        match self.ledger.execute_from(loaded, &command).await {
            // Another worker moved it on meanwhile: report where it stands.
            Err(AppError::Rejected {
                rejection: Rejection::NotAllowed { .. },
                ..
            }) => self.ledger.get(operation_id).await,
            other => other,
        }
    }

    /// The claim of a new attempt of a pending operation, or why a person must look at it
    /// instead; `None` without an intent.
    fn claim_plan(&self, state: &OperationState, attempt_id: AttemptId) -> Option<ClaimPlan> {
        let intent = state.intent.as_ref()?;
        // Asked again before every send: an account removed or handed to another tenant since
        // the intent was recorded stops here, before anything is sent.
        let Binding {
            capabilities,
            credential_fingerprint,
            earlier_fingerprints,
        } = match self.providers.bind(&binding_query(intent)) {
            Ok(bound) => bound,
            Err(unbound) => {
                return Some(ClaimPlan::Review(format!(
                    "the operation cannot be sent as recorded: {unbound}; it stays bound to what it was recorded with"
                )))
            }
        };
        let credential_fingerprint =
            carried_over(intent, credential_fingerprint, &earlier_fingerprints);
        let binding = send_binding(intent, credential_fingerprint);
        // What will go over the wire, recorded with the claim, before anything is sent.
        let request = self.providers.describe_send(intent);
        Some(ClaimPlan::Claim(Box::new(Command::StartAttempt {
            request,
            attempt_id,
            worker: self.worker.clone(),
            lease_ms: self.policy.lease_ms,
            binding,
            capabilities,
            policy: self.policy.retry,
            // Set by the caller once the budget has been waited for.
            budget_wait: None,
        })))
    }

    /// Claims, sends and records one attempt of a pending operation.
    async fn attempt(&self, loaded: LoadedOperation) -> Result<LoadedOperation, AppError> {
        let operation_id = loaded.operation_id;
        if intent_of(&loaded).is_ok_and(|intent| crate::personal::is_erased(intent.args.as_map())) {
            return self
                .require_review(loaded, crate::personal::ERASED_REASON.to_owned())
                .await;
        }
        let attempt_id = self.ledger.ids().new_attempt_id();
        let mut claim = match self.claim_plan(&loaded.state, attempt_id) {
            Some(ClaimPlan::Claim(claim)) => *claim,
            Some(ClaimPlan::Review(reason)) => return self.require_review(loaded, reason).await,
            None => return Err(AppError::NotFound { operation_id }),
        };
        // Before the claim: a wait for the budget is then not taken from the claim's lease and
        // is recorded with it, and credentials that cannot be had start no attempt at all.
        match self.prepare(intent_of(&loaded)?, RequestKind::Send).await {
            Readiness::Ready { budget_wait } => {
                if let Command::StartAttempt {
                    budget_wait: waited,
                    ..
                } = &mut claim
                {
                    *waited = budget_wait;
                }
            }
            Readiness::Wait {
                reason,
                retry_after_ms,
            } => return self.postpone(loaded, reason, retry_after_ms).await,
        }
        let span = tracing::info_span!("claim", %operation_id, %attempt_id);
        let claimed = match self.ledger.execute_from(loaded, &claim).in_span(span).await {
            Ok(claimed) => claimed,
            Err(AppError::Rejected {
                rejection:
                    Rejection::RetryNotAllowed(violation) | Rejection::BindingChanged(violation),
                ..
            }) => {
                let current = self.ledger.get(operation_id).await?;
                let reason = if nothing_sent(&current.state) {
                    format!(
                        "the provider took none of {} attempts, and nothing was sent ({}), until the retry budget ran out: {violation}; a retry is safe, since nothing reached the provider",
                        current.state.attempts,
                        current.state.last_error.as_deref().unwrap_or("no answer recorded"),
                    )
                } else {
                    format!("the send is not safe any more: {violation}")
                };
                return self.require_review(current, reason).await;
            }
            // Another worker claimed it, or its time has not come: report where it stands.
            Err(AppError::Rejected {
                rejection: Rejection::NotAllowed { .. } | Rejection::NotYetDue { .. },
                ..
            }) => return self.ledger.get(operation_id).await,
            Err(error) => return Err(error),
        };
        self.send_claimed(claimed, attempt_id).await
    }

    /// Sends the attempt `attempt_id` that this engine just claimed, and records what the
    /// provider said.
    async fn send_claimed(
        &self,
        claimed: LoadedOperation,
        attempt_id: AttemptId,
    ) -> Result<LoadedOperation, AppError> {
        let operation_id = claimed.operation_id;
        // Design rule 5: only the claim just appended may be sent, so the attempt sent must be
        // the operation's current one, in flight. Anything else is a bug in this engine, and a
        // send without its claim is the duplicate the ledger exists to prevent, so this is a
        // plain assert: two comparisons before a network call, stopping release builds too.
        assert!(
            claimed.state.status == Status::InFlight
                && claimed.state.is_current_attempt(attempt_id),
            "operation {operation_id}: sending attempt {attempt_id}, which is not its current attempt in flight (it is {})",
            claimed.state.status.name()
        );
        let intent = intent_of(&claimed)?.clone();
        let now = self.ledger.clock().now();
        if let Some(reason) = self.stale_claim(&claimed, &intent, now) {
            // Nothing leaves: the attempt is provably not sent, and its next claim (if any)
            // meets the same checks in the decider.
            warn!(%operation_id, %attempt_id, %reason, "claim not sent");
            let command = Command::RecordNotSent {
                attempt_id,
                reason,
                retry_not_before: now,
            };
            return self.ledger.execute_from(claimed, &command).await;
        }
        let attempt_number = claimed.state.attempts;
        let request = SendRequest {
            operation_id,
            attempt_id,
            tenant: intent.tenant.clone(),
            provider: intent.provider.clone(),
            account: intent.account.clone(),
            action: intent.action.clone(),
            args: intent.args.clone(),
            idempotency_key: intent.idempotency_key.clone(),
            label: operation_label(operation_id),
        };
        let span = tracing::info_span!(
            "send",
            %operation_id,
            %attempt_id,
            attempt_number,
            tenant = %intent.tenant,
            provider = %intent.provider,
            account = %intent.account,
            action = %intent.action,
            state = tracing::field::Empty,
            external_id = tracing::field::Empty,
        );
        let outcome = self.providers.execute(&request).in_span(span.clone()).await;
        let now = self.ledger.clock().now();
        let command = self.outcome_command(
            outcome,
            (operation_id, attempt_id),
            attempt_number,
            now,
            &span,
        );
        // A failure here leaves the attempt in flight: its lease runs out, the sweeper makes it
        // unknown and the reconciler finds what the provider did. Nothing is guessed.
        let recorded = self
            .ledger
            .execute_from(claimed, &command)
            .in_span(span.clone())
            .await?;
        span.record("state", recorded.state.status.name());
        Ok(recorded)
    }

    /// Why a claim must not be sent any more, if so: its lease ran out (the sweeper may have
    /// given the attempt up as unknown and another claim may follow it), or, for an automatic
    /// retry, its contract stopped holding while the claim waited (design rule 9: re-checked
    /// right before each send). A claim is decided before its append, and the append can take
    /// long — a slow store, a paused process — long enough for a key to leave its retention
    /// (found by the simulator, seed 1005).
    fn stale_claim(
        &self,
        claimed: &LoadedOperation,
        intent: &IntentRecorded,
        now: DateTime<Utc>,
    ) -> Option<String> {
        let attempt = claimed.state.current_attempt.as_ref()?;
        if crate::personal::is_erased(intent.args.as_map()) {
            // Claimed before the erasure, sent after it: nothing may leave.
            return Some(crate::personal::ERASED_REASON.to_owned());
        }
        if now >= attempt.lease_deadline {
            return Some(format!(
                "the claim's lease ran out at {} before it was sent",
                attempt.lease_deadline
            ));
        }
        if attempt.claimed_from != PendingSince::RetryScheduled {
            return None;
        }
        let bound = match self.providers.bind(&binding_query(intent)) {
            Ok(bound) => bound,
            Err(unbound) => {
                return Some(format!(
                    "the operation cannot be sent as recorded: {unbound}"
                ))
            }
        };
        let binding = send_binding(intent, bound.credential_fingerprint);
        check_retry_contract(&bound.capabilities, &claimed.state, &binding, now)
            .err()
            .map(|violation| format!("the send is not safe any more: {violation}"))
    }

    /// The command recording what the provider said about attempt `attempt_id`.
    fn outcome_command(
        &self,
        outcome: SendOutcome,
        (operation_id, attempt_id): (OperationId, AttemptId),
        attempt_number: u32,
        now: DateTime<Utc>,
        span: &tracing::Span,
    ) -> Command {
        match outcome {
            SendOutcome::Confirmed {
                external_id,
                provider_request_id,
            } => {
                span.record("external_id", tracing::field::display(&external_id));
                info!(parent: span, "confirmed");
                Command::RecordSuccess {
                    attempt_id,
                    external_id,
                    provider_request_id,
                }
            }
            SendOutcome::Rejected { code, message } => {
                info!(parent: span, %code, "rejected");
                Command::RecordRejection {
                    attempt_id,
                    code,
                    message,
                }
            }
            SendOutcome::Uncertain {
                error,
                retry_after_ms,
            } => {
                // The ids in the line itself: at the default level the span is not written.
                warn!(parent: span, %operation_id, %attempt_id, %error, retry_after_ms, "outcome unknown");
                // A provider that failed and asked for a pause (a 5xx with Retry-After) is
                // not looked up before it said it would answer again.
                Command::RecordUnknown {
                    attempt_id,
                    error,
                    check_not_before: retry_after_ms
                        .map(|wait_ms| self.later(now, attempt_number, Some(wait_ms))),
                }
            }
            SendOutcome::NotSent {
                reason,
                retry_after_ms,
            } => {
                info!(parent: span, %reason, "not sent");
                Command::RecordNotSent {
                    attempt_id,
                    reason,
                    retry_not_before: self.later(now, attempt_number, retry_after_ms),
                }
            }
        }
    }

    /// Records that an in-flight attempt's lease ran out.
    async fn expire(&self, loaded: LoadedOperation) -> Result<LoadedOperation, AppError> {
        let Some(attempt) = loaded.state.current_attempt.clone() else {
            return Ok(loaded);
        };
        warn!(operation_id = %loaded.operation_id, attempt_id = %attempt.attempt_id, "lease expired; the outcome is unknown");
        let command = Command::ExpireLease {
            attempt_id: attempt.attempt_id,
        };
        match self.ledger.execute_from(loaded, &command).await {
            Err(AppError::Rejected {
                operation_id,
                rejection: Rejection::LeaseStillValid { .. },
            }) => self.ledger.get(operation_id).await,
            other => other,
        }
    }

    /// Asks the provider what became of an unknown operation and records the answer; for a
    /// succeeded one, the look for a duplicate a lagging search asked for.
    async fn reconcile_loaded(&self, loaded: LoadedOperation) -> Result<LoadedOperation, AppError> {
        let operation_id = loaded.operation_id;
        let intent = intent_of(&loaded)?.clone();
        let confirmed = matches!(loaded.state.status, Status::Succeeded { .. });
        if intent.executed_by_caller() && !confirmed {
            // Nothing to ask: the step's function is the caller's, and its contract is none, so
            // the decider hands the unknown step to a person at once.
            let fingerprint = intent.credential_fingerprint.clone();
            return self
                .settle_without_lookup(loaded, &intent, CALLER_STEP_CAPABILITIES, fingerprint)
                .await;
        }
        let bound = self.providers.bind(&binding_query(&intent));
        if confirmed {
            let unable = match &bound {
                Err(unbound) => Some(format!(
                    "the operation cannot be looked up as recorded: {unbound}"
                )),
                Ok(bound) if bound.capabilities.lookup == LookupSupport::None => {
                    Some("the action has no lookup any more".to_owned())
                }
                Ok(_) => None,
            };
            if let Some(reason) = unable {
                return self.end_duplicate_check(loaded, &intent, reason).await;
            }
        }
        let Binding {
            capabilities,
            credential_fingerprint,
            earlier_fingerprints,
        } = match bound {
            Ok(bound) => bound,
            Err(unbound) => {
                return self
                    .require_review(
                        loaded,
                        format!("the operation cannot be looked up as recorded: {unbound}"),
                    )
                    .await
            }
        };
        let credential_fingerprint =
            carried_over(&intent, credential_fingerprint, &earlier_fingerprints);
        if capabilities.lookup == LookupSupport::None {
            return self
                .settle_without_lookup(loaded, &intent, capabilities, credential_fingerprint)
                .await;
        }
        let span = tracing::info_span!(
            "lookup",
            %operation_id,
            tenant = %intent.tenant,
            provider = %intent.provider,
            account = %intent.account,
            action = %intent.action,
            worker = %self.worker,
            state = tracing::field::Empty,
            external_id = tracing::field::Empty,
        );
        // The budget and credentials before the claim, as for a send: a lookup that cannot be
        // made now is put off without a claim, and is not counted as one.
        let budget_wait = match self.prepare(&intent, RequestKind::Lookup).await {
            Readiness::Ready { budget_wait } => budget_wait,
            Readiness::Wait {
                reason,
                retry_after_ms,
            } => {
                return self
                    .postpone_lookup(loaded, reason, retry_after_ms, span)
                    .await
            }
        };
        // A confirmed operation's look for a duplicate is not claimed: it can only add a
        // duplicate found, and two instances making it at once cost one read-only request more.
        let loaded = if matches!(loaded.state.status, Status::Succeeded { .. }) {
            loaded
        } else {
            let claimed = self.claim_lookup(loaded, budget_wait);
            match claimed.in_span(span.clone()).await? {
                LookupTurn::Ours(claimed) => claimed,
                LookupTurn::Elsewhere(current) => return Ok(current),
            }
        };
        let request = LookupRequest {
            operation_id,
            tenant: intent.tenant.clone(),
            action: intent.action.clone(),
            provider: intent.provider.clone(),
            account: intent.account.clone(),
            idempotency_key: intent.idempotency_key.clone(),
            label: operation_label(operation_id),
        };
        let lookup = self.providers.lookup(&request).in_span(span.clone()).await;
        if let LookupOutcome::NotAsked {
            reason,
            retry_after_ms,
        } = lookup
        {
            // The account's token could not be had after the claim: nothing was asked.
            return self
                .postpone_lookup(loaded, reason, retry_after_ms, span)
                .await;
        }
        if let LookupOutcome::Refused { reason } = lookup {
            if confirmed {
                // A confirmed operation is no person's business: its look for a duplicate ends.
                let reason = format!(
                    "the provider refused the lookup for account `{}`'s credentials: {reason}",
                    intent.account
                );
                return self.end_duplicate_check(loaded, &intent, reason).await;
            }
            // Wrong or revoked credentials do not clear on their own: looking again would only
            // repeat the refusal until the lookup budget ran out. A person fixes the account.
            warn!(parent: &span, %reason, "lookup refused for its credentials");
            return self
                .require_review(
                    loaded,
                    format!("the provider refused the lookup for account `{}`'s credentials, which does not clear on its own; fix the account's token, then decide: {reason}", intent.account),
                )
                .await;
        }
        let in_progress = matches!(lookup, LookupOutcome::InProgress { .. });
        let LookupAnswer {
            result,
            duplicates,
            evidence,
            retry_after_ms,
        } = reconciliation_of(lookup, &span);
        let now = self.ledger.clock().now();
        let state = &loaded.state;
        let command = Command::RecordReconciliation {
            result,
            duplicates,
            evidence,
            binding: send_binding(&intent, credential_fingerprint),
            capabilities,
            policy: self.policy.retry,
            retry_not_before: self.later(now, state.attempts, retry_after_ms),
            next_check_not_before: self.later(
                now,
                state.reconciliations.saturating_add(1),
                retry_after_ms,
            ),
            in_progress,
        };
        self.record_reconciliation(loaded, &command, span).await
    }

    /// Records that a confirmed operation's look for a duplicate cannot be made (its provider or
    /// its lookup is no longer configured), so it is due no more. The record of a confirmed
    /// operation's lookup reads no contract: the ones given are what the action has now.
    async fn end_duplicate_check(
        &self,
        loaded: LoadedOperation,
        intent: &IntentRecorded,
        reason: String,
    ) -> Result<LoadedOperation, AppError> {
        let now = self.ledger.clock().now();
        warn!(operation_id = %loaded.operation_id, %reason, "the look for a duplicate after the search's lag cannot be made");
        let command = Command::RecordReconciliation {
            result: ReconciliationResult::Inconclusive {
                reason: reason.clone(),
            },
            duplicates: Vec::new(),
            evidence: reason,
            binding: send_binding(intent, intent.credential_fingerprint.clone()),
            capabilities: ProviderCapabilities {
                deduplication: Deduplication::None,
                lookup: LookupSupport::None,
            },
            policy: self.policy.retry,
            retry_not_before: now,
            next_check_not_before: now,
            in_progress: false,
        };
        let span = tracing::info_span!("lookup", operation_id = %loaded.operation_id, state = tracing::field::Empty, external_id = tracing::field::Empty);
        self.record_reconciliation(loaded, &command, span).await
    }

    /// Puts off the lookup of an unknown operation whose account's credentials or budget are not
    /// there (see [`Readiness::Wait`], [`LookupOutcome::NotAsked`]): one append, no lookup
    /// counted, so an outage of the account's credentials keeps its operations unknown instead of
    /// spending their lookup budget and handing them to a person.
    async fn postpone_lookup(
        &self,
        loaded: LoadedOperation,
        reason: String,
        retry_after_ms: u64,
        span: tracing::Span,
    ) -> Result<LoadedOperation, AppError> {
        let operation_id = loaded.operation_id;
        let now = self.ledger.clock().now();
        // The account's own wait, as for a send (see `postpone`).
        let wait = retry_after_ms.clamp(MIN_BACKOFF_MS, MAX_RETRY_AFTER_MS);
        let not_before = now.checked_add_signed(milliseconds(wait)).unwrap_or(now);
        info!(parent: &span, %operation_id, %reason, wait_ms = wait, "lookup postponed; nothing asked, no lookup counted");
        span.record("state", loaded.state.status.name());
        let command = Command::PostponeLookup {
            worker: self.worker.clone(),
            reason,
            not_before,
        };
        match self
            .ledger
            .execute_from(loaded, &command)
            .in_span(span)
            .await
        {
            // Another worker settled it, or is looking it up: report where it stands.
            Err(AppError::Rejected {
                rejection: Rejection::NotAllowed { .. } | Rejection::LookupClaimed { .. },
                ..
            }) => self.ledger.get(operation_id).await,
            other => other,
        }
    }

    /// Decides an unknown operation whose action cannot be looked up, without claiming or
    /// recording a lookup that could only say "no lookup": a retry under its contract now (after
    /// the usual backoff), or a person now. Before this, such an operation spent its whole lookup
    /// budget first — a quarter of an hour of backoff before a retry the key already made safe.
    async fn settle_without_lookup(
        &self,
        loaded: LoadedOperation,
        intent: &IntentRecorded,
        capabilities: ProviderCapabilities,
        credential_fingerprint: CredentialFingerprint,
    ) -> Result<LoadedOperation, AppError> {
        let operation_id = loaded.operation_id;
        let now = self.ledger.clock().now();
        let command = Command::SettleWithoutLookup {
            binding: send_binding(intent, credential_fingerprint),
            capabilities,
            policy: self.policy.retry,
            retry_not_before: self.later(now, loaded.state.attempts, None),
        };
        info!(%operation_id, provider = %intent.provider, account = %intent.account, "the action has no lookup: settling without one");
        match self.ledger.execute_from(loaded, &command).await {
            // Another worker settled it first, or it moved on: report where it stands.
            Err(AppError::Rejected {
                rejection: Rejection::NotAllowed { .. },
                ..
            }) => self.ledger.get(operation_id).await,
            other => other,
        }
    }

    /// Claims the lookup of `loaded` for this engine's worker with one conditional append, so that
    /// the other workers sharing the ledger (other instances) leave it alone until it is recorded
    /// or the claim's lease runs out. Only an unknown operation is looked up, so a send that
    /// succeeds never pays for this append.
    async fn claim_lookup(
        &self,
        loaded: LoadedOperation,
        budget_wait: Option<BudgetWait>,
    ) -> Result<LookupTurn, AppError> {
        let operation_id = loaded.operation_id;
        let command = Command::ClaimLookup {
            worker: self.worker.clone(),
            lease_ms: self.policy.lease_ms,
            budget_wait,
        };
        match self.ledger.execute_from(loaded, &command).await {
            Ok(claimed) => {
                info!("lookup claimed");
                Ok(LookupTurn::Ours(claimed))
            }
            // Another worker won the claim, or moved the operation on, or it is not due after
            // all: its lookup is that worker's to make. Report where it stands, as a lost send
            // claim does.
            Err(AppError::Rejected {
                rejection:
                    Rejection::LookupClaimed { .. }
                    | Rejection::NotAllowed { .. }
                    | Rejection::NotYetDue { .. },
                ..
            }) => {
                debug!("the lookup is another worker's");
                Ok(LookupTurn::Elsewhere(self.ledger.get(operation_id).await?))
            }
            Err(error) => Err(error),
        }
    }

    /// Appends a lookup's result; evidence from another account goes to a person, and a lookup
    /// another worker recorded first leaves the operation as that one did.
    async fn record_reconciliation(
        &self,
        loaded: LoadedOperation,
        command: &Command,
        span: tracing::Span,
    ) -> Result<LoadedOperation, AppError> {
        let operation_id = loaded.operation_id;
        let recorded = self
            .ledger
            .execute_from(loaded, command)
            .in_span(span.clone())
            .await;
        if let Ok(recorded) = &recorded {
            span.record("state", recorded.state.status.name());
        }
        match recorded {
            Err(AppError::Rejected {
                rejection: Rejection::EvidenceFromAnotherAccount { bound, found },
                ..
            }) => {
                let current = self.ledger.get(operation_id).await?;
                self.require_review(current, format!("the lookup returned an object of account `{found}`, not `{bound}`: no evidence"))
                    .await
            }
            // Another worker recorded its lookup first and moved the operation on: report
            // where it stands now, as a lost claim does.
            Err(AppError::Rejected {
                rejection: Rejection::NotAllowed { .. },
                ..
            }) => self.ledger.get(operation_id).await,
            other => other,
        }
    }

    async fn require_review(
        &self,
        loaded: LoadedOperation,
        reason: String,
    ) -> Result<LoadedOperation, AppError> {
        warn!(operation_id = %loaded.operation_id, %reason, "handing the operation to a person");
        let evidence = loaded.state.last_error.clone().unwrap_or_default();
        match self
            .ledger
            .execute_from(loaded, &Command::RequireReview { reason, evidence })
            .await
        {
            // Someone else moved it on meanwhile; report where it is.
            Err(AppError::Rejected {
                operation_id,
                rejection: Rejection::NotAllowed { .. },
            }) => self.ledger.get(operation_id).await,
            other => other,
        }
    }

    /// `now` plus the jittered exponential backoff for the `n`th try, or the provider's
    /// Retry-After (capped) when that is longer.
    fn later(&self, now: DateTime<Utc>, n: u32, retry_after_ms: Option<u64>) -> DateTime<Utc> {
        let exponent = n.saturating_sub(1).min(30);
        let backoff = self
            .policy
            .backoff_base_ms
            .saturating_mul(1_u64 << exponent)
            .min(self.policy.backoff_max_ms);
        // "Equal jitter": half fixed, half random, so retries spread out but never bunch at 0.
        let jittered = backoff / 2 + self.ledger.ids().random_below(backoff / 2 + 1);
        let wait = jittered.max(retry_after_ms.unwrap_or(0).min(MAX_RETRY_AFTER_MS));
        now.checked_add_signed(milliseconds(wait)).unwrap_or(now)
    }
}

/// Whether none of the operation's attempts was sent: pending since it was recorded (an attempt
/// that may have reached the provider moves it to unknown, and on from there), with no attempt
/// that ended unclear.
fn nothing_sent(state: &OperationState) -> bool {
    state.pending_since == Some(PendingSince::Recorded) && state.uncertain_attempts == 0
}

/// What claiming a pending operation's next attempt comes to.
enum ClaimPlan {
    /// The claim to append.
    Claim(Box<Command>),
    /// It cannot be sent as bound; a person must look (the reason).
    Review(String),
}

/// Who makes an unknown operation's next lookup, as its claim decided.
enum LookupTurn {
    /// This engine claimed it: the operation as claimed.
    Ours(LoadedOperation),
    /// Another worker holds it (or the operation moved on): the operation as it stands.
    Elsewhere(LoadedOperation),
}

/// What a lookup's answer means for the ledger.
struct LookupAnswer {
    /// The result to record.
    result: ReconciliationResult,
    /// Further objects found for the operation, to record as duplicates.
    duplicates: Vec<ExternalObjectId>,
    /// The evidence to keep.
    evidence: String,
    /// The provider's Retry-After, if it gave one.
    retry_after_ms: Option<u64>,
}

/// What a lookup's answer means for the ledger (see [`LookupAnswer`]).
fn reconciliation_of(lookup: LookupOutcome, span: &tracing::Span) -> LookupAnswer {
    let (result, evidence, retry_after_ms, duplicates) = match lookup {
        LookupOutcome::Found {
            external_id,
            account,
            duplicates,
            evidence,
        } => {
            span.record("external_id", tracing::field::display(&external_id));
            info!(parent: span, %external_id, duplicates = duplicates.len(), "found");
            (
                ReconciliationResult::Found {
                    external_id,
                    account,
                },
                evidence,
                None,
                duplicates,
            )
        }
        LookupOutcome::NotFound {
            authoritative,
            evidence,
        } => (
            ReconciliationResult::NotFound { authoritative },
            evidence,
            None,
            Vec::new(),
        ),
        LookupOutcome::InProgress {
            evidence,
            retry_after_ms,
        } => (
            ReconciliationResult::Inconclusive {
                reason: "the provider is still processing the first request".to_owned(),
            },
            evidence,
            retry_after_ms,
            Vec::new(),
        ),
        // `reconcile_loaded` hands a refused lookup to a person before it gets here; were it
        // recorded, it would be what it is: no usable answer.
        LookupOutcome::Refused { reason } => (
            ReconciliationResult::Inconclusive {
                reason: reason.clone(),
            },
            reason,
            None,
            Vec::new(),
        ),
        LookupOutcome::Unavailable {
            reason,
            retry_after_ms,
        } => (
            ReconciliationResult::Inconclusive {
                reason: reason.clone(),
            },
            reason,
            retry_after_ms,
            Vec::new(),
        ),
        // `reconcile_loaded` postpones a lookup that asked nothing before it gets here; were it
        // recorded, it would be what an unavailable lookup is: no usable answer.
        LookupOutcome::NotAsked {
            reason,
            retry_after_ms,
        } => {
            return reconciliation_of(
                LookupOutcome::Unavailable {
                    reason,
                    retry_after_ms: Some(retry_after_ms),
                },
                span,
            )
        }
    };
    LookupAnswer {
        result,
        duplicates,
        evidence,
        retry_after_ms,
    }
}

/// The binding an operation's intent asks the providers for.
/// The span of a reviewer's decision: who decided what, on which operation (never the note).
fn review_span(loaded: &LoadedOperation, command: &Command) -> tracing::Span {
    let intent = loaded.state.intent.as_ref();
    let (reviewer, decision) = match command {
        Command::ResolveReview {
            reviewer, decision, ..
        } => (
            reviewer.to_string(),
            match decision {
                ReviewDecision::Retry => "retry",
                ReviewDecision::ConfirmSucceeded { .. } => "confirm",
                ReviewDecision::Abandon => "abandon",
            },
        ),
        _ => (String::new(), ""),
    };
    tracing::info_span!(
        "review_decision",
        operation_id = %loaded.operation_id,
        tenant = intent.map(|intent| intent.tenant.to_string()),
        provider = intent.map(|intent| intent.provider.to_string()),
        account = intent.map(|intent| intent.account.to_string()),
        %reviewer,
        decision,
    )
}

fn binding_query(intent: &IntentRecorded) -> BindingQuery<'_> {
    BindingQuery {
        tenant: &intent.tenant,
        provider: &intent.provider,
        account: &intent.account,
        action: &intent.action,
    }
}

/// The fingerprint a send of `intent` is checked with: the one recorded, when it is an earlier
/// form of the credentials configured now (an operation recorded before fingerprints were keyed);
/// else the one of today, which the binding check compares with the recorded one.
fn carried_over(
    intent: &IntentRecorded,
    now: CredentialFingerprint,
    earlier: &[CredentialFingerprint],
) -> CredentialFingerprint {
    if earlier.contains(&intent.credential_fingerprint) {
        intent.credential_fingerprint.clone()
    } else {
        now
    }
}

/// What a send of `intent` would carry today: its account, the credentials the account has now
/// (`credential_fingerprint`), and the hash of the arguments as they will actually be sent —
/// recomputed, not copied from the intent.
fn send_binding(
    intent: &IntentRecorded,
    credential_fingerprint: CredentialFingerprint,
) -> SendBinding {
    SendBinding {
        account: intent.account.clone(),
        credential_fingerprint,
        args_hash: sent_args_hash(intent),
    }
}

/// The hash of the arguments a send would carry. A plain hash is recomputed from them. A keyed
/// one (personal data) cannot be recomputed without the subject's key, and need not be: the
/// arguments were opened from authenticated ciphertext bound to this operation, so they are
/// exactly those recorded — unless the subject was erased, when they show `[erased]`, and the
/// plain hash of that (which never equals a keyed one) refuses the send.
fn sent_args_hash(intent: &IntentRecorded) -> crate::args::ArgsHash {
    if intent.args_hash.is_keyed() && !crate::personal::is_erased(intent.args.as_map()) {
        return intent.args_hash.clone();
    }
    intent.args.hash()
}

fn intent_of(loaded: &LoadedOperation) -> Result<&IntentRecorded, AppError> {
    loaded.state.intent.as_ref().ok_or(AppError::NotFound {
        operation_id: loaded.operation_id,
    })
}

/// The command recording a reviewer's decision, and whether it asks for a retry.
fn review_command(
    reviewer: ActorId,
    principal: Option<Principal>,
    decision: ReviewDecision,
    note: String,
    accept_duplicate_risk: bool,
    capabilities: Option<ProviderCapabilities>,
) -> (Command, bool) {
    let retry = decision == ReviewDecision::Retry;
    (
        Command::ResolveReview {
            reviewer,
            principal,
            decision,
            note,
            accept_duplicate_risk,
            capabilities,
        },
        retry,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{MAX_TOTAL_MS, MIN_TOTAL_MS};

    #[test]
    fn a_lease_shorter_than_the_longest_send_is_refused_with_both_numbers() {
        let policy = EnginePolicy {
            lease_ms: 2_000,
            ..EnginePolicy::default()
        };
        let error = policy
            .check(2_000)
            .expect_err("a lease equal to the send is too short");
        assert_eq!(error.field, "lease_ms");
        assert!(
            error.message.contains("2000 ms") && error.message.contains("up to 2000"),
            "{error}"
        );
        assert!(policy.check(1_999).is_ok());
        assert!(
            policy.check(0).is_ok(),
            "an unknown send time cannot be checked"
        );
    }

    #[test]
    fn the_default_policy_is_within_every_range() {
        assert_eq!(EnginePolicy::default().validate(), Ok(()));
    }

    #[test]
    fn every_engine_value_out_of_range_is_refused_naming_its_field_value_and_range() {
        let default = EnginePolicy::default();
        let retry = |retry: RetryPolicy| EnginePolicy { retry, ..default };
        // A table: one row per field and side, (policy, field, value, min, max).
        #[rustfmt::skip]
        let cases = [
            (EnginePolicy { lease_ms: 900_000, ..default }, "lease_ms", 900_000, MIN_LEASE_MS, MAX_LEASE_MS),
            (EnginePolicy { lease_ms: MIN_LEASE_MS - 1, ..default }, "lease_ms", MIN_LEASE_MS - 1, MIN_LEASE_MS, MAX_LEASE_MS),
            (retry(RetryPolicy { max_attempts: 0, ..default.retry }), "max_attempts", 0, 1, 100),
            (retry(RetryPolicy { max_attempts: 101, ..default.retry }), "max_attempts", 101, 1, 100),
            (retry(RetryPolicy { max_total_ms: 999, ..default.retry }), "max_total_ms", 999, MIN_TOTAL_MS, MAX_TOTAL_MS),
            (retry(RetryPolicy { max_total_ms: MAX_TOTAL_MS + 1, ..default.retry }), "max_total_ms", MAX_TOTAL_MS + 1, MIN_TOTAL_MS, MAX_TOTAL_MS),
            (retry(RetryPolicy { max_reconciliations: 0, ..default.retry }), "max_reconciliations", 0, 1, 100),
            (retry(RetryPolicy { max_reconciliations: 101, ..default.retry }), "max_reconciliations", 101, 1, 100),
            (EnginePolicy { backoff_base_ms: 0, ..default }, "backoff_base_ms", 0, MIN_BACKOFF_MS, MAX_BACKOFF_MS),
            (EnginePolicy { backoff_base_ms: 600, backoff_max_ms: 599, ..default }, "backoff_max_ms", 599, 600, MAX_BACKOFF_MS),
            (EnginePolicy { backoff_max_ms: MAX_BACKOFF_MS + 1, ..default }, "backoff_max_ms", MAX_BACKOFF_MS + 1, DEFAULT_BACKOFF_BASE_MS, MAX_BACKOFF_MS),
        ];
        for (policy, field, value, min, max) in cases {
            assert_eq!(
                policy.validate(),
                Err(OutOfRange {
                    field,
                    value,
                    min,
                    max
                }),
                "{policy:?}"
            );
            let error = policy.check(0).expect_err("check inherits the ranges");
            assert_eq!(error.field, field);
            assert!(error.message.contains(&format!("is {value};")), "{error}");
        }
    }
}
