//! The provider port: what the ledger needs from an external system it changes (a CRM).
//!
//! An adapter says what the provider can promise ([`ProviderCapabilities`]), carries out one
//! attempt ([`Providers::execute`]) and looks an operation up ([`Providers::lookup`]). It
//! classifies what happened honestly: `Confirmed` only with the provider's object id, `Rejected`
//! only when the provider proved nothing was applied, `NotSent` only when provably nothing left
//! the client or the provider said it processed nothing; everything else is `Uncertain`. A title
//! match is never evidence: a lookup matches the operation's own label or key, in its account.

use std::future::Future;

use crate::args::ArgsSnapshot;
use crate::contract::ProviderCapabilities;
use crate::event::BudgetWait;
use crate::ids::{
    AccountId, ActionName, AttemptId, CredentialFingerprint, ExternalObjectId, IdempotencyKey,
    OperationId, ProviderId, ProviderRequestId, TenantId,
};

/// What a send or a lookup of one operation would be bound to: whose it is, where it goes, what
/// it does. Asked of the adapter when the intent is recorded and again before every send and
/// every lookup, so a configuration change (an account removed, handed to another tenant, its
/// credentials rotated) is seen before anything leaves the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindingQuery<'a> {
    /// The operation's tenant: it must own the account.
    pub tenant: &'a TenantId,
    /// The provider.
    pub provider: &'a ProviderId,
    /// The account at the provider.
    pub account: &'a AccountId,
    /// The action.
    pub action: &'a ActionName,
}

/// What the adapter can send an operation under, now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// What the provider promises for this action: its deduplication and lookup contract.
    pub capabilities: ProviderCapabilities,
    /// The fingerprint of the account's credentials configured now.
    pub credential_fingerprint: CredentialFingerprint,
    /// The same credentials' fingerprints in the forms an earlier version recorded (the unkeyed
    /// `sha256:` one, before fingerprints were keyed): an operation recorded with one of them is
    /// bound to these very credentials, and its sends and lookups go on.
    pub earlier_fingerprints: Vec<CredentialFingerprint>,
}

/// Why an operation cannot be bound (nothing is recorded or sent then). Each message names what
/// is missing and where it would be configured.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unbound {
    /// The provider is not configured.
    #[error("provider `{provider}` is not configured on this server; use one of its connectors")]
    Provider {
        /// The provider asked for.
        provider: ProviderId,
    },
    /// The provider has no such action.
    #[error("provider `{provider}` has no action `{action}`; its actions are: {}", known.join(", "))]
    Action {
        /// The provider.
        provider: ProviderId,
        /// The action asked for.
        action: ActionName,
        /// The actions it has.
        known: Vec<String>,
    },
    /// The account is not configured at the provider. Said exactly as [`Unbound::NotOwned`]
    /// is, so a tenant cannot learn from the answer which names are another tenant's accounts.
    #[error("`{account}` is not an account of provider `{provider}` that this tenant may use; an account's `tenants` list says who may use it")]
    Account {
        /// The provider.
        provider: ProviderId,
        /// The account asked for.
        account: AccountId,
    },
    /// The account exists, but another tenant owns it.
    #[error("`{account}` is not an account of provider `{provider}` that this tenant may use; an account's `tenants` list says who may use it")]
    NotOwned {
        /// The provider.
        provider: ProviderId,
        /// The account.
        account: AccountId,
        /// The tenant that asked.
        tenant: TenantId,
    },
}

impl Unbound {
    /// The field of the request the refusal is about: `provider`, `action` or `account`.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Provider { .. } => "provider",
            Self::Action { .. } => "action",
            Self::Account { .. } | Self::NotOwned { .. } => "account",
        }
    }
}

/// One way a call's arguments fail the action's input schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgProblem {
    /// The JSON pointer of the failing value inside the arguments (`""` for the whole object).
    pub pointer: String,
    /// What is wrong with it.
    pub message: String,
}

/// Every problem as `args/title: …`, joined with `; ` (for a message naming each field).
pub fn describe_arg_problems(problems: &[ArgProblem]) -> String {
    problems
        .iter()
        .map(|problem| format!("args{}: {}", problem.pointer, problem.message))
        .collect::<Vec<_>>()
        .join("; ")
}

/// One attempt to carry an operation out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendRequest {
    /// The operation.
    pub operation_id: OperationId,
    /// This attempt.
    pub attempt_id: AttemptId,
    /// Whose operation it is; the adapter checks again that the tenant owns the account.
    pub tenant: TenantId,
    /// The provider to send to.
    pub provider: ProviderId,
    /// The account there.
    pub account: AccountId,
    /// What to do.
    pub action: ActionName,
    /// The frozen arguments.
    pub args: ArgsSnapshot,
    /// The operation's key, the same on every attempt.
    pub idempotency_key: IdempotencyKey,
    /// The operation's external label (see [`operation_label`]).
    pub label: String,
}

/// How one attempt ended, as the adapter could tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendOutcome {
    /// The provider confirmed and named the object.
    Confirmed {
        /// The object created (or, for a replayed key or an existing label, the one created first).
        external_id: ExternalObjectId,
        /// The provider's request id, when given.
        provider_request_id: Option<ProviderRequestId>,
    },
    /// The provider refused definitively: nothing was applied.
    Rejected {
        /// Status and error code, e.g. `422 validation_failed`.
        code: String,
        /// The provider's explanation.
        message: String,
    },
    /// It may have been applied (timeout after sending, reset, unclear 5xx).
    Uncertain {
        /// What the transport or provider reported.
        error: String,
        /// How long the provider asked us to wait, if it did, in milliseconds.
        retry_after_ms: Option<u64>,
    },
    /// Provably nothing was applied by this attempt (the connection was never made, the provider
    /// answered 429, or it said the same key is still being processed).
    NotSent {
        /// Why.
        reason: String,
        /// How long the provider asked us to wait, if it did, in milliseconds.
        retry_after_ms: Option<u64>,
    },
}

/// A request for evidence of what became of an operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupRequest {
    /// The operation.
    pub operation_id: OperationId,
    /// Whose operation it is; the adapter checks again that the tenant owns the account.
    pub tenant: TenantId,
    /// The provider.
    pub provider: ProviderId,
    /// The action the operation did, whose lookup is asked.
    pub action: ActionName,
    /// The account the operation is bound to.
    pub account: AccountId,
    /// The operation's key.
    pub idempotency_key: IdempotencyKey,
    /// The operation's external label.
    pub label: String,
}

/// What a lookup found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LookupOutcome {
    /// The provider holds an object for this operation.
    Found {
        /// Its id.
        external_id: ExternalObjectId,
        /// The account it belongs to.
        account: AccountId,
        /// Other objects the lookup found for this operation (a search that found several
        /// carrying its label): each is recorded as a detected duplicate.
        duplicates: Vec<ExternalObjectId>,
        /// The provider's answer, for the ledger.
        evidence: String,
    },
    /// Nothing was found.
    NotFound {
        /// Whether the lookup is consistent; a lagging search proves nothing.
        authoritative: bool,
        /// The provider's answer, for the ledger.
        evidence: String,
    },
    /// The provider holds the operation's first request and is still processing it (a keyed
    /// lookup answering "in progress"): no evidence yet, and a retry now would only be refused
    /// or race it. Look again later.
    InProgress {
        /// The provider's answer, for the ledger.
        evidence: String,
        /// How long the provider asked us to wait, if it did, in milliseconds.
        retry_after_ms: Option<u64>,
    },
    /// The provider refused the lookup itself for the credentials it carried (401, 403: wrong
    /// or revoked credentials). That does not clear on its own, so asking again is pointless
    /// until a person fixed the configuration.
    Refused {
        /// What the provider said.
        reason: String,
    },
    /// Nothing was asked: what the lookup needs before it goes out (the account's access token)
    /// is not there, and is asked for again after `retry_after_ms`. Not a lookup, so it is not
    /// counted against the lookup budget: a long credentials outage must not hand every unknown
    /// operation of the account to a person for lookups that never happened.
    NotAsked {
        /// Why, naming the account and what to do.
        reason: String,
        /// When the account's credentials are asked for again, in milliseconds.
        retry_after_ms: u64,
    },
    /// The lookup could not be made or gave no usable answer; a later one may (a timeout, a
    /// 5xx, a rate limit).
    Unavailable {
        /// Why.
        reason: String,
        /// How long the provider asked us to wait, if it did, in milliseconds.
        retry_after_ms: Option<u64>,
    },
}

/// Which of an account's request budgets a request is counted in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// A send (an attempt).
    Send,
    /// A lookup (reconciliation).
    Lookup,
}

/// Whether a send or a lookup may be claimed now, asked before its claim is appended (see
/// [`Providers::prepare`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Go: the account's credentials are at hand and its budget slot is taken (after waiting
    /// for it, if `budget_wait` says so).
    Ready {
        /// How long the caller waited for the slot, if it did.
        budget_wait: Option<BudgetWait>,
    },
    /// Not now, and nothing was sent: no credentials to be had (the token endpoint refused them
    /// or did not answer), or no budget slot within the wait allowed. Claiming would only use up
    /// an attempt; the operation waits `retry_after_ms` with `reason`.
    Wait {
        /// Why, naming the account and what to do.
        reason: String,
        /// How long to wait, in milliseconds (the account's wait, shared by its operations).
        retry_after_ms: u64,
    },
}

/// Every provider the ledger can send to, routed by [`ProviderId`].
pub trait Providers: Send + Sync {
    /// What an operation would be sent under now: the action's contract and the account's
    /// credential fingerprint (compared with the intent's before every send), or why it cannot
    /// be sent at all.
    fn bind(&self, query: &BindingQuery<'_>) -> Result<Binding, Unbound>;

    /// Checks a call's arguments against the action's input schema, before anything is
    /// recorded; every failing field is named. An unknown provider or action passes here:
    /// [`Providers::bind`] names it.
    fn check_args(
        &self,
        provider: &ProviderId,
        action: &ActionName,
        args: &serde_json::Value,
    ) -> Result<(), Vec<ArgProblem>>;

    /// The action's one-line description ("create a task"), for the agent's sentence and tool
    /// listings; `None` when the provider or the action is not configured.
    fn action_description(&self, provider: &ProviderId, action: &ActionName) -> Option<String>;

    /// What a request of `kind` for the bound account needs before its claim is appended: its
    /// credentials (an access token obtained now, so a refusal is known before any attempt is
    /// started) and a slot in its `kind` budget, waited for when `may_wait` (a caller that must
    /// not wait is told [`Readiness::Wait`] instead, also when credentials would first have to be
    /// fetched). A `Ready` answer has taken the slot: the
    /// request that follows is not counted again. Adapters without credentials to fetch or
    /// budgets to keep are always ready.
    fn prepare(
        &self,
        query: &BindingQuery<'_>,
        kind: RequestKind,
        may_wait: bool,
    ) -> impl Future<Output = Readiness> + Send {
        let _ = (query, kind, may_wait);
        std::future::ready(Readiness::Ready { budget_wait: None })
    }

    /// The request a send of `intent` would make, as one line for the record: its method and
    /// URL (`POST https://crm.example.com/deals/42/notes`), secrets scrubbed; `None` when the
    /// adapter cannot say (the default) or the request cannot be built.
    fn describe_send(&self, intent: &crate::event::IntentRecorded) -> Option<String> {
        let _ = intent;
        None
    }

    /// Carries out one attempt.
    fn execute(&self, request: &SendRequest) -> impl Future<Output = SendOutcome> + Send;

    /// Looks the operation up.
    fn lookup(&self, request: &LookupRequest) -> impl Future<Output = LookupOutcome> + Send;

    /// The longest one [`Providers::execute`] call can take, in milliseconds (0: unknown). A
    /// claim's lease must outlast it, or a healthy slow send is swept to unknown while it runs.
    fn longest_send_ms(&self) -> u64 {
        0
    }
}

/// The label an operation carries to the provider (a unique external id or a custom field), so
/// that a lookup can find exactly this operation's object: `opl-` and the operation id.
pub fn operation_label(operation_id: OperationId) -> String {
    format!("opl-{operation_id}")
}
