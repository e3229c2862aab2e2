//! The events of an operation's stream: immutable, past-tense facts.
//!
//! Every arrow of the state machine in the design is one of these, appended to the operation's
//! own stream. Events are never edited or deleted; a new shape of an event is a new schema
//! version read beside the old one (see [`crate::codec`]).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::args::{ArgsHash, ArgsSnapshot};
use crate::ids::{
    AccountId, ActionName, ActorId, AttemptId, CredentialFingerprint, ExternalObjectId,
    IdempotencyKey, OperationId, OwnerId, ProviderId, ProviderRequestId, SourceId, TenantId,
    WorkerId,
};

/// What the user asked to be done, frozen: the first event of every operation stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntentRecorded {
    /// The operation's stable id.
    pub operation_id: OperationId,
    /// Whose operation it is.
    pub tenant: TenantId,
    /// Who asked for it, if known.
    pub owner: Option<OwnerId>,
    /// The external system it changes.
    pub provider: ProviderId,
    /// The account at that provider it is bound to.
    pub account: AccountId,
    /// The fingerprint of that account's credentials when the intent was recorded.
    pub credential_fingerprint: CredentialFingerprint,
    /// What it does there.
    pub action: ActionName,
    /// The frozen arguments.
    pub args: ArgsSnapshot,
    /// The hash of the frozen arguments' canonical JSON.
    pub args_hash: ArgsHash,
    /// The key every attempt of this operation carries.
    pub idempotency_key: IdempotencyKey,
    /// The delivery that asked for it, when one was named.
    pub source_id: Option<SourceId>,
    /// Whether a person must approve it before it may be sent.
    pub requires_approval: bool,
    /// Who carries it out: the ledger's connector, or the caller's own code (a guarded step).
    /// Absent from intents recorded before steps existed, and from every connector's intent:
    /// those read and hash as before.
    #[serde(default, skip_serializing_if = "Executor::is_ledger")]
    pub executor: Executor,
    /// When it was recorded.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

impl IntentRecorded {
    /// Whether the caller's own code carries it out (a guarded step), not a connector.
    pub fn executed_by_caller(&self) -> bool {
        self.executor == Executor::Caller
    }
}

/// Who carries an operation's side effect out. Frozen with the intent: a step recorded for the
/// caller's function is never sent by the ledger's workers, and a connector's operation is never
/// claimed by a caller, so one side effect has exactly one kind of sender.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Executor {
    /// A configured connector, sent by the ledger's engine.
    #[default]
    Ledger,
    /// The caller's own function: the caller claims an attempt (with a lease), runs it and
    /// reports what it did; the ledger records, expires the lease and hands a lost result to a
    /// person.
    Caller,
}

impl Executor {
    /// Whether this is the default, the ledger's own connector (left out of the stored event).
    pub fn is_ledger(&self) -> bool {
        *self == Self::Ledger
    }

    /// As written in events and answers: `ledger` or `caller`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ledger => "ledger",
            Self::Caller => "caller",
        }
    }
}

/// The credential that made a decision, as the server authenticated it. Beside the name a
/// decision carries (which a tenant's token may write freely), this is what the ledger vouches
/// for: which configured token decided. Absent from decisions recorded before it was kept, and
/// from those made without a token (the local `opledger review` command).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// Which kind of token.
    pub kind: PrincipalKind,
    /// Its configured name: the tenant's id, or the approver's or operator's id.
    pub name: String,
}

impl Principal {
    /// How a sentence names it: `with the approver token finance-lead`, or for a local decision
    /// `as the local account anna`.
    pub fn phrase(&self) -> String {
        match self.kind {
            PrincipalKind::Local => format!("as the local account {}", self.name),
            kind => format!(
                "with the {} token {}",
                kind.as_str().trim_end_matches("_token"),
                self.name
            ),
        }
    }
}

/// The kinds of token that can decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrincipalKind {
    /// A tenant's own token (`[[tenants]]`), approving while the tenant has no approver.
    TenantToken,
    /// An approver's token (`[[approvers]]`).
    Approver,
    /// An operator's token (`[[operators]]`).
    Operator,
    /// No token: a person deciding on the ledger file's own host (`opledger review`), whose
    /// credential is the operating system's access to the file; named by the account that ran
    /// the command.
    Local,
}

impl PrincipalKind {
    /// The kind as written in events: `tenant_token`, `approver`, `operator` or `local`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TenantToken => "tenant_token",
            Self::Approver => "approver",
            Self::Operator => "operator",
            Self::Local => "local",
        }
    }
}

/// A person approved exactly the snapshot with this hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalGranted {
    /// Who approved, as named.
    pub approver: ActorId,
    /// The token that decided (absent from older events: they read and hash as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<Principal>,
    /// The snapshot the approval covers.
    pub args_hash: ArgsHash,
    /// When.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// A person refused the snapshot with this hash; the operation will never be sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalDenied {
    /// Who denied, as named.
    pub approver: ActorId,
    /// The token that decided (absent from older events: they read and hash as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<Principal>,
    /// The snapshot the denial covers.
    pub args_hash: ArgsHash,
    /// Why, in their words.
    pub reason: String,
    /// When.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// A worker claimed the operation and is about to send it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptStarted {
    /// This attempt's id.
    pub attempt_id: AttemptId,
    /// 1 for the first attempt, then strictly growing.
    pub attempt_number: u32,
    /// The worker that owns it.
    pub worker: WorkerId,
    /// When the claim lapses if no outcome is recorded.
    #[serde(with = "crate::timestamp")]
    pub lease_deadline: DateTime<Utc>,
    /// How long the send waited for its account's request budget before it was claimed, when
    /// that was long enough to mention. (Absent from events written before budgets were
    /// recorded, and from sends that did not wait: such events read and hash as before.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_wait: Option<BudgetWait>,
    /// The request this attempt sends, as the connector builds it from the frozen intent: its
    /// method and URL (`POST https://crm.example.com/deals/42/notes`), secrets scrubbed, so an
    /// auditor sees what went over the wire. Recorded before it is sent; absent from attempts
    /// recorded before it was kept and from providers that cannot say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// When it started.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// A wait for an account's request budget, recorded with the claim it preceded, so the
/// operation's own history says why it started late (a lookup storm paced after an outage).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetWait {
    /// The account whose budget it was.
    pub account: AccountId,
    /// Which of its budgets: `sends` or `lookups`.
    pub budget: String,
    /// How long it waited, in milliseconds.
    pub waited_ms: u64,
}

impl std::fmt::Display for BudgetWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let budget = self.budget.strip_suffix('s').unwrap_or(&self.budget);
        write!(
            f,
            "waited {}.{} s for {}'s {budget} budget",
            self.waited_ms / 1000,
            self.waited_ms % 1000 / 100,
            self.account
        )
    }
}

/// The provider confirmed the attempt and named the object it created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptSucceeded {
    /// The attempt answered.
    pub attempt_id: AttemptId,
    /// The object the provider created.
    pub external_id: ExternalObjectId,
    /// The provider's id of the request, when it gave one.
    pub provider_request_id: Option<ProviderRequestId>,
    /// When the response arrived.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// The provider definitively refused the attempt: nothing was applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRejected {
    /// The attempt refused.
    pub attempt_id: AttemptId,
    /// The provider's code (status and error code).
    pub code: String,
    /// The provider's explanation.
    pub message: String,
    /// When the response arrived.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// The attempt may or may not have been applied (timeout after sending, reset, unclear 5xx).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeUnknown {
    /// The attempt concerned.
    pub attempt_id: AttemptId,
    /// What the transport reported.
    pub error: String,
    /// The earliest time to look it up, when the provider asked for a pause (a 5xx with
    /// Retry-After); absent: as soon as a worker is free.
    #[serde(
        default,
        with = "crate::timestamp::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub check_not_before: Option<DateTime<Utc>>,
    /// When.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// Provably nothing of the attempt was applied (the connection was never made, the provider
/// answered 429, or it said the same key is still being processed): the operation is pending
/// again, with the same key, under the same conditions it was claimed under.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptNotSent {
    /// The attempt concerned.
    pub attempt_id: AttemptId,
    /// Why nothing was applied.
    pub reason: String,
    /// The earliest start of the next attempt.
    #[serde(with = "crate::timestamp")]
    pub retry_not_before: DateTime<Utc>,
    /// When.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// A pending operation was not claimed because what its send needs before it may be recorded
/// was not there: its account's credentials (the token endpoint refused them or did not answer)
/// or a slot in its request budget soon enough. Nothing was claimed and nothing sent, so no
/// attempt is used up; the operation stays pending until `not_before`, when its account is
/// asked again (the account's wait, shared by all its operations).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendPostponed {
    /// Why, naming the account and what to do.
    pub reason: String,
    /// The earliest claim of its next attempt.
    #[serde(with = "crate::timestamp")]
    pub not_before: DateTime<Utc>,
    /// When.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// An unknown operation's lookup was put off before anything was asked: what it needs first
/// (the account's access token, a budget slot) is not there. Unlike a recorded lookup it is not
/// counted against the lookup budget; the operation stays unknown until `not_before`, when it
/// is looked up again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupPostponed {
    /// Why, naming the account and what to do.
    pub reason: String,
    /// The earliest next lookup.
    #[serde(with = "crate::timestamp")]
    pub not_before: DateTime<Utc>,
    /// When.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// The attempt's lease ran out with no outcome recorded. Its request may still be running.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseExpired {
    /// The attempt concerned.
    pub attempt_id: AttemptId,
    /// The deadline that passed.
    #[serde(with = "crate::timestamp")]
    pub lease_deadline: DateTime<Utc>,
    /// When the expiry was noticed.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// A worker claimed the next lookup of an unknown operation: until `lease_deadline` no other
/// worker looks it up. Appended at the expected stream version, like a send's claim, so of
/// several workers — several instances sharing one ledger — exactly one wins each round; a
/// claim whose lease ran out (its worker died mid-lookup) may be taken over. The
/// [`ReconciliationRecorded`] of the lookup ends the claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupClaimed {
    /// The worker that looks it up.
    pub worker: WorkerId,
    /// When the claim lapses if no lookup is recorded.
    #[serde(with = "crate::timestamp")]
    pub lease_deadline: DateTime<Utc>,
    /// How long the lookup waited for its account's lookup budget before it was claimed, when
    /// long enough to mention (absent otherwise, and from older events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_wait: Option<BudgetWait>,
    /// When it was claimed.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// What a lookup at the provider found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReconciliationResult {
    /// The object exists, in this account.
    Found {
        /// The object the provider holds for this operation.
        external_id: ExternalObjectId,
        /// The account it belongs to.
        account: AccountId,
    },
    /// Nothing was found.
    NotFound {
        /// Whether the lookup is consistent; a lagging search index proves nothing.
        authoritative: bool,
    },
    /// The lookup gave no usable answer.
    Inconclusive {
        /// Why.
        reason: String,
    },
}

/// The result of asking the provider what became of the operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconciliationRecorded {
    /// What was found.
    pub result: ReconciliationResult,
    /// The evidence, as the provider gave it.
    pub evidence: String,
    /// When the operation stays unknown: the earliest time to look again. When a lagging search
    /// found the object inside its lag (the operation succeeds): when to look once more, after
    /// the lag, for a duplicate the search could not show yet.
    #[serde(
        default,
        with = "crate::timestamp::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub next_check_not_before: Option<DateTime<Utc>>,
    /// When.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// A retry of the same operation, with the same key, is allowed from `not_before` on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryScheduled {
    /// The earliest start of the next attempt.
    #[serde(with = "crate::timestamp")]
    pub not_before: DateTime<Utc>,
    /// Why a retry is safe.
    pub reason: String,
    /// When it was scheduled.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// Automation stops: a person must decide.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewRequired {
    /// Why automation cannot go on.
    pub reason: String,
    /// What is known, for the reviewer.
    pub evidence: String,
    /// When.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// What a reviewer decided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReviewDecision {
    /// Send again, with the same key.
    Retry,
    /// The reviewer found the object: the operation succeeded with this id.
    ConfirmSucceeded {
        /// The object the reviewer found.
        external_id: ExternalObjectId,
    },
    /// Give up: the operation will not be sent again.
    Abandon,
}

/// A reviewer decided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewResolved {
    /// Who decided, as named.
    pub reviewer: ActorId,
    /// The token that decided (absent from older events: they read and hash as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<Principal>,
    /// What they decided.
    pub decision: ReviewDecision,
    /// Their note.
    pub note: String,
    /// The reviewer retried knowing the provider could not tell the retry from a second
    /// request (no deduplication, or a key past its retention): a duplicate was accepted as a
    /// risk, and the ledger says who accepted it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accept_duplicate_risk: bool,
    /// When.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// A response that arrived after its attempt stopped being the open one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LateResponse {
    /// The provider confirmed, naming an object.
    Succeeded {
        /// The object it names.
        external_id: ExternalObjectId,
        /// The provider's request id, when given.
        provider_request_id: Option<ProviderRequestId>,
    },
    /// The provider refused.
    Rejected {
        /// The provider's code.
        code: String,
        /// The provider's explanation.
        message: String,
    },
}

/// A response arrived late. A late confirmation is the provider's own evidence and settles an
/// unresolved operation; it never changes one already settled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LateResponseReceived {
    /// The attempt it answers.
    pub attempt_id: AttemptId,
    /// What it said.
    pub response: LateResponse,
    /// When it arrived.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// A second external object showed up for an operation already confirmed with another one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DuplicateDetected {
    /// The object the operation was confirmed with; it stays the operation's outcome.
    pub confirmed_external_id: ExternalObjectId,
    /// The other object.
    pub duplicate_external_id: ExternalObjectId,
    /// How it was found (a late response, a reconciliation).
    pub found_by: String,
    /// When.
    #[serde(with = "crate::timestamp")]
    pub at: DateTime<Utc>,
}

/// Every fact an operation's stream can hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OperationEvent {
    /// See [`IntentRecorded`].
    IntentRecorded(IntentRecorded),
    /// See [`ApprovalGranted`].
    ApprovalGranted(ApprovalGranted),
    /// See [`ApprovalDenied`].
    ApprovalDenied(ApprovalDenied),
    /// See [`AttemptStarted`].
    AttemptStarted(AttemptStarted),
    /// See [`AttemptSucceeded`].
    AttemptSucceeded(AttemptSucceeded),
    /// See [`AttemptRejected`].
    AttemptRejected(AttemptRejected),
    /// See [`OutcomeUnknown`].
    OutcomeUnknown(OutcomeUnknown),
    /// See [`AttemptNotSent`].
    AttemptNotSent(AttemptNotSent),
    /// See [`SendPostponed`].
    SendPostponed(SendPostponed),
    /// See [`LeaseExpired`].
    LeaseExpired(LeaseExpired),
    /// See [`LookupClaimed`].
    LookupClaimed(LookupClaimed),
    /// See [`LookupPostponed`].
    LookupPostponed(LookupPostponed),
    /// See [`ReconciliationRecorded`].
    ReconciliationRecorded(ReconciliationRecorded),
    /// See [`RetryScheduled`].
    RetryScheduled(RetryScheduled),
    /// See [`ReviewRequired`].
    ReviewRequired(ReviewRequired),
    /// See [`ReviewResolved`].
    ReviewResolved(ReviewResolved),
    /// See [`LateResponseReceived`].
    LateResponseReceived(LateResponseReceived),
    /// See [`DuplicateDetected`].
    DuplicateDetected(DuplicateDetected),
}

impl OperationEvent {
    /// When the fact happened.
    pub fn at(&self) -> DateTime<Utc> {
        match self {
            Self::IntentRecorded(e) => e.at,
            Self::ApprovalGranted(e) => e.at,
            Self::ApprovalDenied(e) => e.at,
            Self::AttemptStarted(e) => e.at,
            Self::AttemptSucceeded(e) => e.at,
            Self::AttemptRejected(e) => e.at,
            Self::OutcomeUnknown(e) => e.at,
            Self::AttemptNotSent(e) => e.at,
            Self::SendPostponed(e) => e.at,
            Self::LeaseExpired(e) => e.at,
            Self::LookupClaimed(e) => e.at,
            Self::LookupPostponed(e) => e.at,
            Self::ReconciliationRecorded(e) => e.at,
            Self::RetryScheduled(e) => e.at,
            Self::ReviewRequired(e) => e.at,
            Self::ReviewResolved(e) => e.at,
            Self::LateResponseReceived(e) => e.at,
            Self::DuplicateDetected(e) => e.at,
        }
    }
}
