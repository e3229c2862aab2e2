//! What can be asked of an operation. Each command is decided by [`crate::decider::decide`]
//! against the current state and the time it is decided at.

use chrono::{DateTime, Utc};

use crate::args::ArgsHash;
use crate::contract::{ProviderCapabilities, RetryPolicy, SendBinding};
use crate::event::{BudgetWait, IntentRecorded, Principal, ReconciliationResult, ReviewDecision};
use crate::ids::{ActorId, AttemptId, ExternalObjectId, ProviderRequestId, WorkerId};

/// Shortest lease a worker may take on an attempt, in milliseconds.
pub const MIN_LEASE_MS: u64 = 100;
/// Longest lease a worker may take on an attempt, in milliseconds. An expired lease is how a
/// crashed worker's attempt becomes unknown, so a longer one would leave it in flight, unseen by
/// reconciliation, for longer than a person waiting for an answer would accept.
pub const MAX_LEASE_MS: u64 = 10 * 60 * 1000;
/// The lease an engine takes unless configured otherwise, in milliseconds: three times the
/// provider adapters' default request timeout (10 s), with room for a slow store.
pub const DEFAULT_LEASE_MS: u64 = 30_000;
const _: () = assert!(MIN_LEASE_MS <= DEFAULT_LEASE_MS && DEFAULT_LEASE_MS <= MAX_LEASE_MS);
/// Furthest ahead a retry or a lookup may be scheduled, in milliseconds.
pub const MAX_SCHEDULE_AHEAD_MS: u64 = 7 * 24 * 3600 * 1000;
// A lease is a schedule too (the sweep after it); it must fit in what may be scheduled.
const _: () = assert!(MAX_LEASE_MS <= MAX_SCHEDULE_AHEAD_MS);
/// Longest free text a person writes into the ledger (notes, reasons), in bytes.
pub const MAX_NOTE_BYTES: usize = 4 * 1024;
/// Longest text from a provider or transport kept in an event (messages, evidence), in bytes;
/// longer text is cut, because an outside system's verbosity must not fail a recording.
pub const MAX_PROVIDER_TEXT_BYTES: usize = 16 * 1024;

/// A request to change an operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Record the frozen intent; only an operation with no history accepts it.
    RecordIntent(IntentRecorded),
    /// Approve the snapshot with `args_hash`.
    GrantApproval {
        /// Who approves.
        approver: ActorId,
        /// The token that decides, when one did.
        principal: Option<Principal>,
        /// The snapshot the approver saw; must be the recorded one.
        args_hash: ArgsHash,
    },
    /// Refuse the snapshot with `args_hash`.
    DenyApproval {
        /// Who refuses.
        approver: ActorId,
        /// The token that decides, when one did.
        principal: Option<Principal>,
        /// The snapshot the approver saw; must be the recorded one.
        args_hash: ArgsHash,
        /// Why.
        reason: String,
    },
    /// Claim the operation for one attempt: the single-sender move `pending → in_flight`.
    StartAttempt {
        /// The new attempt's id.
        attempt_id: AttemptId,
        /// The worker claiming it.
        worker: WorkerId,
        /// How long the claim holds without an outcome, in milliseconds.
        lease_ms: u64,
        /// What the send would use, checked against the intent.
        binding: SendBinding,
        /// What the provider promises, for the retry contract.
        capabilities: ProviderCapabilities,
        /// The retry budget.
        policy: RetryPolicy,
        /// The wait for the account's send budget before this claim, to record with it.
        budget_wait: Option<BudgetWait>,
        /// The request the attempt sends (method and URL), to record with it.
        request: Option<String>,
    },
    /// The caller claims the next attempt of a step its own code carries out (see
    /// [`crate::event::Executor::Caller`]): the same single-sender move `pending → in_flight` as
    /// [`Command::StartAttempt`], with a lease. The caller may run its function only while it
    /// holds the claim; when the lease runs out without an outcome the step is unknown.
    ClaimStep {
        /// The new attempt's id.
        attempt_id: AttemptId,
        /// Who claims it (the caller's name for its process, or the tenant).
        caller: WorkerId,
        /// How long the claim holds without an outcome, in milliseconds.
        lease_ms: u64,
    },
    /// Put off the claim of a pending operation's next attempt until `not_before`: what its
    /// send needs first (the account's credentials, a budget slot) is not there. No attempt is
    /// started, so none is used up.
    PostponeSend {
        /// Why, naming the account and what to do.
        reason: String,
        /// The earliest claim of its next attempt (clamped to what may be scheduled).
        not_before: DateTime<Utc>,
    },
    /// Put off an unknown operation's lookup until `not_before`: what it needs first (the
    /// account's access token, a budget slot) is not there, so nothing was asked. Not counted as
    /// a lookup. `worker` may hold the lookup's claim; another worker's live claim refuses it.
    PostponeLookup {
        /// The worker putting it off.
        worker: WorkerId,
        /// Why, naming the account and what to do.
        reason: String,
        /// The earliest next lookup (clamped to what may be scheduled).
        not_before: DateTime<Utc>,
    },
    /// The provider confirmed `attempt_id` with an object.
    RecordSuccess {
        /// The attempt answered.
        attempt_id: AttemptId,
        /// The object created.
        external_id: ExternalObjectId,
        /// The provider's request id, if given.
        provider_request_id: Option<ProviderRequestId>,
    },
    /// The provider definitively refused `attempt_id`.
    RecordRejection {
        /// The attempt refused.
        attempt_id: AttemptId,
        /// The provider's code.
        code: String,
        /// The provider's explanation.
        message: String,
    },
    /// `attempt_id` ended without a clear outcome.
    RecordUnknown {
        /// The attempt concerned.
        attempt_id: AttemptId,
        /// What the transport reported.
        error: String,
        /// The earliest lookup, when the provider asked for a pause (the caller adds it).
        check_not_before: Option<DateTime<Utc>>,
    },
    /// Provably nothing of `attempt_id` was applied; the operation may be sent again later.
    RecordNotSent {
        /// The attempt concerned.
        attempt_id: AttemptId,
        /// Why nothing was applied.
        reason: String,
        /// The earliest start of the next attempt (the caller adds backoff and Retry-After).
        retry_not_before: DateTime<Utc>,
    },
    /// `attempt_id`'s lease has run out.
    ExpireLease {
        /// The attempt whose lease is checked.
        attempt_id: AttemptId,
    },
    /// Claim the next lookup of an unknown operation for one worker, for `lease_ms`: the other
    /// workers (other instances sharing the ledger) leave it alone until the lookup is recorded
    /// or the lease runs out.
    ClaimLookup {
        /// The worker that will look it up.
        worker: WorkerId,
        /// How long the claim holds without a recorded lookup, in milliseconds (the range of an
        /// attempt's lease: a lookup takes a provider request, as a send does).
        lease_ms: u64,
        /// The wait for the account's lookup budget before this claim, to record with it.
        budget_wait: Option<BudgetWait>,
    },
    /// Record what a lookup at the provider found, and what follows from it.
    RecordReconciliation {
        /// What the lookup found.
        result: ReconciliationResult,
        /// Further objects the lookup found for this operation (a search that found several
        /// with its label); each becomes a [`crate::event::DuplicateDetected`].
        duplicates: Vec<ExternalObjectId>,
        /// The provider's evidence.
        evidence: String,
        /// What a retry would use, for the retry contract.
        binding: SendBinding,
        /// What the provider promises.
        capabilities: ProviderCapabilities,
        /// The retry budget.
        policy: RetryPolicy,
        /// When a retry may start, if one is allowed (the caller adds jittered backoff).
        retry_not_before: DateTime<Utc>,
        /// When to look again, if the operation stays unknown (the caller adds backoff).
        next_check_not_before: DateTime<Utc>,
        /// The provider said the first request is still being processed (the result is
        /// inconclusive): look again while the lookup and time budgets last, never retry.
        in_progress: bool,
    },
    /// Decide an unknown operation of an action that cannot be looked up: a retry under a valid
    /// contract (its key still inside retention less the margin), else a person, at once. A
    /// lookup that cannot be made proves nothing and changes nothing, so none is claimed or
    /// recorded; refused for an action that can be looked up (design rule 8: reconcile first).
    SettleWithoutLookup {
        /// What a retry would use, for the retry contract.
        binding: SendBinding,
        /// What the provider promises; its lookup must be [`crate::contract::LookupSupport::None`].
        capabilities: ProviderCapabilities,
        /// The retry budget.
        policy: RetryPolicy,
        /// When a retry may start, if one is allowed (the caller adds jittered backoff).
        retry_not_before: DateTime<Utc>,
    },
    /// Stop automation and hand the operation to a person.
    RequireReview {
        /// Why.
        reason: String,
        /// What is known.
        evidence: String,
    },
    /// A person decided about an operation in review.
    ResolveReview {
        /// Who decided.
        reviewer: ActorId,
        /// The token that decides, when one did.
        principal: Option<Principal>,
        /// What.
        decision: ReviewDecision,
        /// Their note.
        note: String,
        /// For a retry: the reviewer accepts that the provider may not tell it from a second
        /// request. Required when the contract cannot make the retry safe.
        accept_duplicate_risk: bool,
        /// The action's contract as configured now, if it is (`None`: unknown, so a retry is
        /// taken to risk a duplicate).
        capabilities: Option<ProviderCapabilities>,
    },
}

impl Command {
    /// The command's name, for errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Self::RecordIntent(_) => "record_intent",
            Self::GrantApproval { .. } => "grant_approval",
            Self::DenyApproval { .. } => "deny_approval",
            Self::StartAttempt { .. } => "start_attempt",
            Self::ClaimStep { .. } => "claim_step",
            Self::PostponeSend { .. } => "postpone_send",
            Self::PostponeLookup { .. } => "postpone_lookup",
            Self::RecordSuccess { .. } => "record_success",
            Self::RecordRejection { .. } => "record_rejection",
            Self::RecordUnknown { .. } => "record_unknown",
            Self::RecordNotSent { .. } => "record_not_sent",
            Self::ExpireLease { .. } => "expire_lease",
            Self::ClaimLookup { .. } => "claim_lookup",
            Self::RecordReconciliation { .. } => "record_reconciliation",
            Self::SettleWithoutLookup { .. } => "settle_without_lookup",
            Self::RequireReview { .. } => "require_review",
            Self::ResolveReview { .. } => "resolve_review",
        }
    }
}

/// A command's [`Command::name`] in the words a person reading a refusal knows (the CLI's and the
/// API's verbs, not the internal names), as it reads in "cannot … an operation that is …". An
/// unknown name is returned as it is.
pub fn user_name(name: &str) -> &str {
    match name {
        "record_intent" => "record",
        "grant_approval" => "approve",
        "deny_approval" => "deny",
        "start_attempt" => "send",
        "claim_step" => "claim",
        "postpone_send" => "postpone the send of",
        "postpone_lookup" => "postpone the lookup of",
        "record_success" => "record a success for",
        "record_rejection" => "record a refusal for",
        "record_unknown" => "record an unknown outcome for",
        "record_not_sent" => "record an unsent attempt for",
        "expire_lease" => "expire the lease of",
        "claim_lookup" => "claim a lookup of",
        "record_reconciliation" => "record a lookup for",
        "settle_without_lookup" => "settle without a lookup",
        "require_review" => "hand to a person",
        "resolve_review" => "resolve the review of",
        other => other,
    }
}
