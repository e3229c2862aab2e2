//! Ledger totals: how many intents, attempts and outcomes the log holds.
//!
//! The cheapest useful read model: its memory is constant whatever the size of the log, so it is
//! what a full replay folds into when only the totals are wanted (and what the replay benchmark
//! measures). Counts are of facts recorded, not of current states: an operation that went
//! unknown and then succeeded counts once in each.

use opledger_domain::event::{OperationEvent, ReconciliationResult};

/// Counts of recorded facts across the whole ledger, by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Events folded.
    pub events: u64,
    /// Intents recorded (operations created).
    pub intents: u64,
    /// Attempts started.
    pub attempts: u64,
    /// Attempts the provider confirmed in their own response.
    pub confirmed_responses: u64,
    /// Definitive refusals.
    pub rejections: u64,
    /// Attempts provably not applied (never connected, rate limited, key in flight).
    pub not_sent: u64,
    /// Attempts that ended without a known outcome (timeouts, expired leases).
    pub unknown_outcomes: u64,
    /// Reconciliations that found the object.
    pub reconciliations_found: u64,
    /// Responses that arrived after their attempt stopped being the open one.
    pub late_responses: u64,
    /// Hand-overs to a person.
    pub reviews_required: u64,
    /// Reviewer decisions.
    pub reviews_resolved: u64,
    /// Duplicates detected.
    pub duplicates: u64,
}

impl Totals {
    /// Folds one event into the totals.
    pub fn apply(&mut self, event: &OperationEvent) {
        self.events += 1;
        let counter = match event {
            OperationEvent::IntentRecorded(_) => &mut self.intents,
            OperationEvent::AttemptStarted(_) => &mut self.attempts,
            OperationEvent::AttemptSucceeded(_) => &mut self.confirmed_responses,
            OperationEvent::AttemptRejected(_) => &mut self.rejections,
            OperationEvent::AttemptNotSent(_) => &mut self.not_sent,
            OperationEvent::OutcomeUnknown(_) | OperationEvent::LeaseExpired(_) => {
                &mut self.unknown_outcomes
            }
            OperationEvent::ReconciliationRecorded(reconciled) => match reconciled.result {
                ReconciliationResult::Found { .. } => &mut self.reconciliations_found,
                _ => return,
            },
            OperationEvent::LateResponseReceived(_) => &mut self.late_responses,
            OperationEvent::ReviewRequired(_) => &mut self.reviews_required,
            OperationEvent::ReviewResolved(_) => &mut self.reviews_resolved,
            OperationEvent::DuplicateDetected(_) => &mut self.duplicates,
            OperationEvent::ApprovalGranted(_)
            | OperationEvent::ApprovalDenied(_)
            | OperationEvent::LookupClaimed(_)
            | OperationEvent::SendPostponed(_)
            | OperationEvent::LookupPostponed(_)
            | OperationEvent::RetryScheduled(_) => return,
        };
        *counter += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_domain::event::{DuplicateDetected, ReconciliationRecorded};
    use opledger_domain::ids::{AccountId, ExternalObjectId};

    fn at() -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::UNIX_EPOCH
    }

    #[test]
    fn totals_count_each_fact_by_kind_and_only_finds_as_reconciled() {
        let id = |s: &str| ExternalObjectId::new(s).expect("valid");
        let reconciled = |result| {
            OperationEvent::ReconciliationRecorded(ReconciliationRecorded {
                result,
                evidence: String::new(),
                next_check_not_before: None,
                at: at(),
            })
        };
        let mut totals = Totals::default();
        totals.apply(&reconciled(ReconciliationResult::Found {
            external_id: id("1"),
            account: AccountId::new("a").expect("valid"),
        }));
        totals.apply(&reconciled(ReconciliationResult::NotFound {
            authoritative: false,
        }));
        totals.apply(&OperationEvent::DuplicateDetected(DuplicateDetected {
            confirmed_external_id: id("1"),
            duplicate_external_id: id("2"),
            found_by: "test".into(),
            at: at(),
        }));
        assert_eq!(
            totals,
            Totals {
                events: 3,
                reconciliations_found: 1,
                duplicates: 1,
                ..Totals::default()
            }
        );
    }
}
