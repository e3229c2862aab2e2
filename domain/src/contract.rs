//! When may an operation be sent again? The retry contract, as a pure function.
//!
//! A retry after an unclear outcome is only safe when the provider will recognise it as the same
//! request: it honours our idempotency key (and still remembers it), or it atomically refuses a
//! second object with our unique label. On top of that the retry must go to the same account, with
//! the same credentials and the same arguments, and stay inside the attempt and time budget.
//! Everything else stops at a person (design rules 9 and 10).

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use crate::args::ArgsHash;
use crate::error::OutOfRange;
use crate::ids::{AccountId, CredentialFingerprint};
use crate::state::OperationState;

/// Fewest attempts a policy may allow: the first one (1 means "never retry automatically").
pub const MIN_ATTEMPTS: u32 = 1;
/// Most attempts any policy may allow for one operation.
pub const MAX_ATTEMPTS_LIMIT: u32 = 100;
/// The attempts a policy allows unless configured otherwise.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
const _: () =
    assert!(MIN_ATTEMPTS <= DEFAULT_MAX_ATTEMPTS && DEFAULT_MAX_ATTEMPTS <= MAX_ATTEMPTS_LIMIT);

/// Shortest retry time budget a policy may set, in milliseconds. A budget under a second is
/// shorter than one send and one backoff step, so it would refuse every retry while looking as if
/// it allowed some; a policy that wants no retries says `max_attempts = 1`.
pub const MIN_TOTAL_MS: u64 = 1_000;
/// Longest retry time budget a policy may set, in milliseconds: one day, the shortest common
/// idempotency-key retention (Stripe's). A keyed provider's retention check would cut a longer
/// budget anyway, and for a label-deduplicated one a day of automatic retries is as long as a
/// request stays the one its user is waiting for; after that a person decides.
pub const MAX_TOTAL_MS: u64 = 24 * 3600 * 1000;
/// The retry time budget unless configured otherwise, in milliseconds.
pub const DEFAULT_MAX_TOTAL_MS: u64 = 15 * 60 * 1000;
const _: () = assert!(MIN_TOTAL_MS <= DEFAULT_MAX_TOTAL_MS && DEFAULT_MAX_TOTAL_MS <= MAX_TOTAL_MS);
// The retry budget is scheduled time: a budget beyond what may be scheduled could never be used.
const _: () = assert!(MAX_TOTAL_MS <= crate::command::MAX_SCHEDULE_AHEAD_MS);

/// Fewest lookups a policy may allow before an unknown operation goes to a person: one (it then
/// goes on the first lookup without evidence; 0 would mean the same, so it is not offered).
pub const MIN_RECONCILIATIONS: u32 = 1;
/// Most lookups a policy may allow before an unknown operation goes to a person. Each one is a
/// call to the provider; paced by the backoff (at most an hour apart), 100 lookups keep an
/// operation unknown for at most about four days before anyone sees it.
pub const MAX_RECONCILIATIONS_LIMIT: u32 = 100;
/// The lookups a policy allows unless configured otherwise.
pub const DEFAULT_MAX_RECONCILIATIONS: u32 = 10;
const _: () = assert!(
    MIN_RECONCILIATIONS <= DEFAULT_MAX_RECONCILIATIONS
        && DEFAULT_MAX_RECONCILIATIONS <= MAX_RECONCILIATIONS_LIMIT
);

/// How a provider deduplicates repeated requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Deduplication {
    /// Nothing: every create makes a new object. No retry after an unclear outcome is safe.
    None,
    /// The provider replays the first response for a repeated idempotency key while it remembers
    /// the key (Stripe-style).
    IdempotencyKey {
        /// How long the provider remembers a key after first seeing it, in seconds.
        retention_s: u64,
        /// How much of the retention we refuse to use, covering queueing and delivery time, in seconds.
        safety_margin_s: u64,
    },
    /// The provider atomically refuses a second object with the same caller-chosen label
    /// (Salesforce External ID, Dataverse alternate key). Never expires.
    UniqueLabel,
    /// Repeating the same request has no further effect (a PUT of a whole state, a DELETE):
    /// every retry of the frozen request is safe, for as long as it stays the frozen request.
    NaturallyIdempotent,
}

/// How an operation's outcome can be looked up at the provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LookupSupport {
    /// No lookup at all: evidence only comes from responses.
    None,
    /// A consistent lookup (by key or by unique label): "not found" is authoritative.
    Consistent,
    /// A search whose index lags by up to `lag_ms`: "not found" proves nothing.
    EventuallyConsistent {
        /// The longest the index may lag behind a create, in milliseconds.
        lag_ms: u64,
    },
}

/// What a provider adapter can promise; supplied by the adapter, checked by the domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderCapabilities {
    /// How repeated requests are deduplicated.
    pub deduplication: Deduplication,
    /// How an outcome can be looked up.
    pub lookup: LookupSupport,
}

/// What a step the caller's own code carries out promises: nothing the ledger can hold it to.
/// The ledger cannot look the caller's system up, and cannot know that the function honours the
/// key it is given, so an unknown step is never retried automatically: it goes to a person, and
/// a person's retry is taken to risk a second effect.
pub const CALLER_STEP_CAPABILITIES: ProviderCapabilities = ProviderCapabilities {
    deduplication: Deduplication::None,
    lookup: LookupSupport::None,
};

/// The budget of automatic retries for one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Most attempts in total, the first included.
    pub max_attempts: u32,
    /// Longest time from the first attempt to the start of the last one, in milliseconds.
    pub max_total_ms: u64,
    /// Most lookups that may leave an operation unknown before it goes to a person.
    pub max_reconciliations: u32,
}

impl RetryPolicy {
    /// Checks every field against its owning constants ([`MIN_ATTEMPTS`]..=[`MAX_ATTEMPTS_LIMIT`],
    /// [`MIN_TOTAL_MS`]..=[`MAX_TOTAL_MS`],
    /// [`MIN_RECONCILIATIONS`]..=[`MAX_RECONCILIATIONS_LIMIT`]); the first one out of range is
    /// named with its value and range.
    pub fn validate(&self) -> Result<(), OutOfRange> {
        OutOfRange::check(
            "max_attempts",
            self.max_attempts.into(),
            MIN_ATTEMPTS.into(),
            MAX_ATTEMPTS_LIMIT.into(),
        )?;
        OutOfRange::check(
            "max_total_ms",
            self.max_total_ms,
            MIN_TOTAL_MS,
            MAX_TOTAL_MS,
        )?;
        OutOfRange::check(
            "max_reconciliations",
            self.max_reconciliations.into(),
            MIN_RECONCILIATIONS.into(),
            MAX_RECONCILIATIONS_LIMIT.into(),
        )
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_total_ms: DEFAULT_MAX_TOTAL_MS,
            max_reconciliations: DEFAULT_MAX_RECONCILIATIONS,
        }
    }
}

/// What a sender is about to use, checked against what the intent froze (design rule 4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendBinding {
    /// The account the request would go to.
    pub account: AccountId,
    /// The fingerprint of the credentials it would carry.
    pub credential_fingerprint: CredentialFingerprint,
    /// The hash of the arguments it would send.
    pub args_hash: ArgsHash,
}

/// Why an automatic retry is not allowed now.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ContractViolation {
    /// The provider cannot tell a retry from a second request.
    #[error("the provider neither honours idempotency keys nor enforces a unique label, so a retry could create a second object")]
    NoDeduplication,
    /// The provider may have forgotten the key.
    #[error("the idempotency key was first sent at {first_sent_at} and is only safe until {safe_until} (retention minus safety margin)")]
    KeyRetentionPassed {
        /// When the key was first sent.
        first_sent_at: DateTime<Utc>,
        /// The end of the safe part of the retention window.
        safe_until: DateTime<Utc>,
    },
    /// The request would go to another account, where the key means nothing.
    #[error("the operation is bound to account `{bound}` but the send would go to `{offered}`")]
    AccountChanged {
        /// The account in the intent.
        bound: AccountId,
        /// The account offered now.
        offered: AccountId,
    },
    /// The credentials changed since the intent was recorded.
    #[error("the credentials of account `{account}` changed since the intent was recorded")]
    CredentialsChanged {
        /// The account concerned.
        account: AccountId,
    },
    /// The arguments to send are not the frozen snapshot.
    #[error("the arguments to send hash to {offered}, not to the recorded {bound}")]
    ArgumentsChanged {
        /// The hash in the intent.
        bound: ArgsHash,
        /// The hash of what would be sent.
        offered: ArgsHash,
    },
    /// The attempt budget is spent.
    #[error("{attempts} attempts made; the policy allows {max_attempts}")]
    AttemptsExhausted {
        /// Attempts made so far.
        attempts: u32,
        /// The policy's limit.
        max_attempts: u32,
    },
    /// The time budget is spent.
    #[error(
        "the first attempt started at {first_attempt_at}; retries were allowed until {deadline}"
    )]
    TotalTimeExhausted {
        /// When the first attempt started.
        first_attempt_at: DateTime<Utc>,
        /// The end of the retry time budget.
        deadline: DateTime<Utc>,
    },
    /// There is no intent to retry.
    #[error("the operation has no recorded intent")]
    NoIntent,
}

/// Checks that the send about to happen is bound to what the intent froze: same account, same
/// credentials, same arguments. Applies to every attempt, the first included.
pub fn check_binding(
    state: &OperationState,
    offered: &SendBinding,
) -> Result<(), ContractViolation> {
    let intent = state.intent.as_ref().ok_or(ContractViolation::NoIntent)?;
    if intent.account != offered.account {
        return Err(ContractViolation::AccountChanged {
            bound: intent.account.clone(),
            offered: offered.account.clone(),
        });
    }
    if intent.credential_fingerprint != offered.credential_fingerprint {
        return Err(ContractViolation::CredentialsChanged {
            account: intent.account.clone(),
        });
    }
    if intent.args_hash != offered.args_hash {
        return Err(ContractViolation::ArgumentsChanged {
            bound: intent.args_hash.clone(),
            offered: offered.args_hash.clone(),
        });
    }
    Ok(())
}

/// The retry contract: may `state` be sent again at `now` without risking a second object?
///
/// Valid when the provider deduplicates (by key still inside its retention minus the safety
/// margin, or by unique label) and the send is bound to the same account, credentials and
/// arguments. Pure: the same inputs always give the same answer.
pub fn check_retry_contract(
    capabilities: &ProviderCapabilities,
    state: &OperationState,
    offered: &SendBinding,
    now: DateTime<Utc>,
) -> Result<(), ContractViolation> {
    check_binding(state, offered)?;
    match capabilities.deduplication {
        Deduplication::None => Err(ContractViolation::NoDeduplication),
        Deduplication::UniqueLabel | Deduplication::NaturallyIdempotent => Ok(()),
        Deduplication::IdempotencyKey {
            retention_s,
            safety_margin_s,
        } => {
            let Some(first_sent_at) = state.first_attempt_at else {
                // The key was never sent, so the provider has nothing to forget yet.
                return Ok(());
            };
            let usable_s = retention_s.saturating_sub(safety_margin_s);
            let Some(safe_until) = first_sent_at.checked_add_signed(seconds(usable_s)) else {
                // A retention beyond the calendar's end never runs out.
                return Ok(());
            };
            if now < safe_until {
                Ok(())
            } else {
                Err(ContractViolation::KeyRetentionPassed {
                    first_sent_at,
                    safe_until,
                })
            }
        }
    }
}

/// The retry budget: attempts and total time left under `policy` at `now`.
pub fn check_retry_budget(
    policy: &RetryPolicy,
    state: &OperationState,
    now: DateTime<Utc>,
) -> Result<(), ContractViolation> {
    let max_attempts = policy.max_attempts.min(MAX_ATTEMPTS_LIMIT);
    if state.attempts >= max_attempts {
        return Err(ContractViolation::AttemptsExhausted {
            attempts: state.attempts,
            max_attempts,
        });
    }
    check_retry_time(policy, state, now)
}

/// The time part of the retry budget alone: `policy.max_total_ms` from the first attempt.
pub fn check_retry_time(
    policy: &RetryPolicy,
    state: &OperationState,
    now: DateTime<Utc>,
) -> Result<(), ContractViolation> {
    if let Some(first_attempt_at) = state.first_attempt_at {
        let deadline = first_attempt_at.checked_add_signed(milliseconds(policy.max_total_ms));
        if let Some(deadline) = deadline.filter(|deadline| now >= *deadline) {
            return Err(ContractViolation::TotalTimeExhausted {
                first_attempt_at,
                deadline,
            });
        }
    }
    Ok(())
}

/// Both checks an automatic retry needs: the contract and the budget.
pub fn check_automatic_retry(
    capabilities: &ProviderCapabilities,
    policy: &RetryPolicy,
    state: &OperationState,
    offered: &SendBinding,
    now: DateTime<Utc>,
) -> Result<(), ContractViolation> {
    check_retry_contract(capabilities, state, offered, now)?;
    check_retry_budget(policy, state, now)
}

/// Converts a configured number of seconds into a duration, saturating instead of overflowing.
pub(crate) fn seconds(value: u64) -> Duration {
    Duration::try_seconds(i64::try_from(value).unwrap_or(i64::MAX / 1000)).unwrap_or(Duration::MAX)
}

/// Converts a configured number of milliseconds into a duration, saturating instead of overflowing.
pub(crate) fn milliseconds(value: u64) -> Duration {
    Duration::try_milliseconds(i64::try_from(value).unwrap_or(i64::MAX)).unwrap_or(Duration::MAX)
}
