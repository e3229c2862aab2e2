//! Reconciliation: what a lookup at the provider found, and what follows from it (design rule 8).
//!
//! It must never take an object of another account as evidence, never read an empty answer
//! inside a search's lag (or an inconclusive one) as proof of absence, and never schedule a
//! retry the contract and budget do not allow (rule 9).

use chrono::{DateTime, Utc};

use super::{clip, duplicate_of, schedule, On, Rejection};
use crate::contract::{
    check_automatic_retry, milliseconds, LookupSupport, ProviderCapabilities, RetryPolicy,
    SendBinding,
};
use crate::event::{
    DuplicateDetected, OperationEvent, ReconciliationRecorded, ReconciliationResult,
    RetryScheduled, ReviewRequired,
};
use crate::ids::ExternalObjectId;
use crate::state::{OperationState, Status};

/// The fields of [`crate::command::Command::RecordReconciliation`], borrowed.
pub(super) struct Lookup<'a> {
    pub(super) result: &'a ReconciliationResult,
    pub(super) duplicates: &'a [ExternalObjectId],
    pub(super) evidence: &'a str,
    pub(super) binding: &'a SendBinding,
    pub(super) capabilities: &'a ProviderCapabilities,
    pub(super) policy: &'a RetryPolicy,
    pub(super) retry_not_before: DateTime<Utc>,
    pub(super) next_check_not_before: DateTime<Utc>,
    pub(super) in_progress: bool,
}

impl Lookup<'_> {
    /// The event recording this lookup, with when to look again if it stays unknown.
    fn recorded(
        &self,
        on: &On<'_>,
        next_check_not_before: Option<DateTime<Utc>>,
    ) -> OperationEvent {
        OperationEvent::ReconciliationRecorded(ReconciliationRecorded {
            result: self.result.clone(),
            evidence: clip(self.evidence),
            next_check_not_before,
            at: on.now,
        })
    }

    /// The lookup recorded with its next check scheduled: the operation stays unknown. When
    /// this lookup used up the budget inside a search's lag, the next one (then the last before
    /// a person) waits until the lag has passed, so what the search could not show yet is seen.
    fn look_again(&self, on: &On<'_>) -> Vec<OperationEvent> {
        let mut next_check = self.next_check_not_before;
        if on.state.reconciliations.saturating_add(1) >= self.policy.max_reconciliations {
            if let Some(indexed_by) = indexed_by(self.capabilities, on.state) {
                next_check = next_check.max(indexed_by);
            }
        }
        let next_check = schedule(next_check, on.now);
        vec![self.recorded(on, Some(next_check))]
    }

    /// Whether it may stay unknown for another look (see [`may_keep_checking`]).
    fn may_keep_checking(&self, on: &On<'_>) -> bool {
        may_keep_checking(
            self.result,
            self.capabilities,
            self.policy,
            on.state,
            on.now,
        )
    }
}

/// `unknown --RecordReconciliation--> succeeded | pending | unknown | needs_review`; on a
/// confirmed operation, a different object found is a detected duplicate.
pub(super) fn record(on: &On<'_>, lookup: &Lookup<'_>) -> Result<Vec<OperationEvent>, Rejection> {
    if let ReconciliationResult::Found { account, .. } = lookup.result {
        if *account != on.intent.account {
            return Err(Rejection::EvidenceFromAnotherAccount {
                bound: on.intent.account.clone(),
                found: account.clone(),
            });
        }
    }
    match (&on.state.status, lookup.result) {
        (Status::Unknown, ReconciliationResult::Found { external_id, .. }) => {
            // Found by a search inside its lag: it settles the operation, and one more look
            // after the lag comes, since a second labelled object (a duplicate) may not show yet.
            let look_again = indexed_by(lookup.capabilities, on.state)
                .filter(|indexed_by| on.now < *indexed_by)
                .map(|indexed_by| schedule(indexed_by, on.now));
            let mut events = vec![lookup.recorded(on, look_again)];
            events.extend(also_found(on, lookup, external_id));
            Ok(events)
        }
        // The first request is still running at the provider: only time can tell, so look
        // again within the budgets, then a person. Never a retry — the provider would refuse it
        // as in flight (each refusal an attempt spent) or it would race the first request.
        (Status::Unknown, ReconciliationResult::Inconclusive { .. }) if lookup.in_progress => {
            Ok(still_in_progress(on, lookup))
        }
        // An inconclusive answer (a lookup that failed) is not "no evidence": a retry now would
        // race the first request or be refused, spending the attempt budget. Look again first,
        // while the lookup budget lasts; only then do a retry or a person come in.
        (Status::Unknown, ReconciliationResult::Inconclusive { .. })
            if lookup.may_keep_checking(on) =>
        {
            Ok(lookup.look_again(on))
        }
        (Status::Unknown, _) => Ok(without_evidence(on, lookup)),
        (
            Status::Succeeded {
                external_id: confirmed,
            },
            ReconciliationResult::Found { external_id, .. },
        ) => {
            let mut found = Vec::new();
            if !on.state.duplicates.contains(external_id) {
                found.extend(duplicate_of(
                    on.state,
                    external_id,
                    "reconciliation",
                    on.now,
                ));
            }
            found.extend(also_found(on, lookup, confirmed));
            // The look a lagging search asked for is recorded whatever it found (it clears the
            // check); another lookup of a confirmed operation only when it found a duplicate.
            if found.is_empty() && on.state.next_check_not_before.is_none() {
                return Ok(Vec::new());
            }
            let mut events = vec![lookup.recorded(on, None)];
            events.extend(found);
            Ok(events)
        }
        // The look for a duplicate after the lag, which found nothing new (or could not look):
        // recorded, so it is not asked for again.
        (Status::Succeeded { .. }, _) if on.state.next_check_not_before.is_some() => {
            Ok(vec![lookup.recorded(on, None)])
        }
        (Status::Succeeded { .. }, _) => Ok(Vec::new()),
        _ => Err(on.refuse()),
    }
}

/// The further objects a lookup found beside the one it names, as detected duplicates of
/// `confirmed` (the object the operation is, or now becomes, confirmed with). Each object once:
/// the one confirmed is no duplicate of itself, and one the stream already names is not
/// recorded again.
fn also_found(
    on: &On<'_>,
    lookup: &Lookup<'_>,
    confirmed: &ExternalObjectId,
) -> Vec<OperationEvent> {
    let mut seen: Vec<&ExternalObjectId> = Vec::new();
    lookup
        .duplicates
        .iter()
        .take(MAX_DUPLICATES_PER_LOOKUP)
        .filter(|duplicate| *duplicate != confirmed && !on.state.duplicates.contains(duplicate))
        .filter(|duplicate| {
            let new = !seen.contains(duplicate);
            seen.push(duplicate);
            new
        })
        .map(|duplicate| {
            OperationEvent::DuplicateDetected(DuplicateDetected {
                confirmed_external_id: confirmed.clone(),
                duplicate_external_id: duplicate.clone(),
                found_by: "reconciliation".to_owned(),
                at: on.now,
            })
        })
        .collect()
}

/// Most duplicates one lookup records: a search answering with hundreds of copies is a
/// provider's bug or a label collision, and a person reads the evidence instead.
pub const MAX_DUPLICATES_PER_LOOKUP: usize = 50;

/// The provider still processes the first request: another look while the lookup budget and
/// the total time budget last, else a person.
fn still_in_progress(on: &On<'_>, lookup: &Lookup<'_>) -> Vec<OperationEvent> {
    let state = on.state;
    let lookups = state.reconciliations.saturating_add(1);
    let lookups_left = lookups < lookup.policy.max_reconciliations;
    let deadline = state
        .first_attempt_at
        .and_then(|first| first.checked_add_signed(milliseconds(lookup.policy.max_total_ms)));
    let time_left = deadline.is_none_or(|deadline| on.now < deadline);
    if lookups_left && time_left {
        return lookup.look_again(on);
    }
    let spent = if lookups_left {
        format!(
            "the time budget of {} ms since the first attempt is spent",
            lookup.policy.max_total_ms
        )
    } else {
        format!("{lookups} lookups made, the most the policy allows")
    };
    vec![
        lookup.recorded(on, None),
        OperationEvent::ReviewRequired(ReviewRequired {
            reason: format!(
                "the provider still reports the first request in progress and {spent}; a retry would be refused or race it"
            ),
            evidence: clip(lookup.evidence),
            at: on.now,
        }),
    ]
}

/// `unknown --SettleWithoutLookup--> pending | needs_review`: an action that cannot be looked up
/// waits for no evidence, because none can come. With a valid retry contract (a key inside its
/// retention less the margin, the same binding, budget left) the retry is scheduled now; without
/// one a person decides now. Refused for an action that has a lookup: that one reconciles first.
pub(super) fn without_lookup(
    on: &On<'_>,
    binding: &SendBinding,
    capabilities: &ProviderCapabilities,
    policy: &RetryPolicy,
    retry_not_before: DateTime<Utc>,
) -> Result<Vec<OperationEvent>, Rejection> {
    if on.state.status != Status::Unknown || capabilities.lookup != LookupSupport::None {
        return Err(on.refuse());
    }
    let events = match check_automatic_retry(capabilities, policy, on.state, binding, on.now) {
        Ok(()) => OperationEvent::RetryScheduled(RetryScheduled {
            not_before: schedule(retry_not_before, on.now),
            reason: "the action cannot be looked up, and the retry contract holds".to_owned(),
            at: on.now,
        }),
        Err(_) if on.intent.executed_by_caller() => OperationEvent::ReviewRequired(ReviewRequired {
            reason: "the step is carried out by the caller's own code, which the ledger cannot look up, and the caller did not report what it did; running it again could do it twice, so a person checks the caller's system and confirms the result, retries or gives up".to_owned(),
            evidence: clip(on.state.last_error.as_deref().unwrap_or_default()),
            at: on.now,
        }),
        Err(violation) => OperationEvent::ReviewRequired(ReviewRequired {
            reason: format!(
                "the action cannot be looked up, so no evidence can come, and there is no safe retry: {violation}"
            ),
            evidence: clip(on.state.last_error.as_deref().unwrap_or_default()),
            at: on.now,
        }),
    };
    Ok(vec![events])
}

/// No evidence either way: a retry under a valid contract, another look while the answer may
/// still change, or a person.
fn without_evidence(on: &On<'_>, lookup: &Lookup<'_>) -> Vec<OperationEvent> {
    let contract = check_automatic_retry(
        lookup.capabilities,
        lookup.policy,
        on.state,
        lookup.binding,
        on.now,
    );
    match contract {
        Ok(()) => vec![
            lookup.recorded(on, None),
            OperationEvent::RetryScheduled(RetryScheduled {
                not_before: schedule(lookup.retry_not_before, on.now),
                reason: "no evidence of the earlier attempts; the retry contract holds".to_owned(),
                at: on.now,
            }),
        ],
        Err(_) if lookup.may_keep_checking(on) => lookup.look_again(on),
        Err(violation) => vec![
            lookup.recorded(on, None),
            OperationEvent::ReviewRequired(ReviewRequired {
                reason: format!("no evidence, and no safe retry: {violation}"),
                evidence: clip(lookup.evidence),
                at: on.now,
            }),
        ],
    }
}

/// Whether an operation without a safe retry may stay unknown and be looked up again rather
/// than go to a person now: only while the lookup budget lasts, and only when the answer could
/// still change — the lookup was inconclusive, or a lagging search may not show the object yet.
///
/// An empty search inside the lag proves nothing whatever the budget says: the budget then
/// allows one more lookup, after the lag ([`Lookup::look_again`] schedules it), so the last
/// lookup before a person is one whose "not found" means something. Found by a schedule that
/// spent three lookups in 436 ms against a declared lag of 2 s.
fn may_keep_checking(
    result: &ReconciliationResult,
    capabilities: &ProviderCapabilities,
    policy: &RetryPolicy,
    state: &OperationState,
    now: DateTime<Utc>,
) -> bool {
    let inside_lag = indexed_by(capabilities, state).is_some_and(|indexed_by| now < indexed_by);
    let empty_search_inside_lag = inside_lag
        && matches!(
            result,
            ReconciliationResult::NotFound {
                authoritative: false
            }
        );
    if empty_search_inside_lag {
        return true;
    }
    if state.reconciliations.saturating_add(1) >= policy.max_reconciliations {
        return false;
    }
    matches!(result, ReconciliationResult::Inconclusive { .. })
}

/// When a lagging search shows every object created before the operation became unknown (the
/// create, if any, happened before that); `None` for a lookup without lag.
fn indexed_by(
    capabilities: &ProviderCapabilities,
    state: &OperationState,
) -> Option<DateTime<Utc>> {
    let LookupSupport::EventuallyConsistent { lag_ms } = capabilities.lookup else {
        return None;
    };
    state
        .unknown_since
        .and_then(|since| since.checked_add_signed(milliseconds(lag_ms)))
}
