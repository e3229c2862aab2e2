//! The work queue: which operations wait for the engine, and from when.
//!
//! A read model folded from the global log: for every operation not yet settled it keeps the
//! folded state and the time its next piece of work is due (a send once pending, a sweep once a
//! lease has run out, a lookup once the next check is due and no worker's claim on it holds — a
//! claimed lookup is due again when the claim's lease runs out, for another worker to take over). Workers ask it what is due instead of
//! scanning the ledger. Settled operations (succeeded, rejected, denied, abandoned) leave it, so
//! its size follows the open work, not the log.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use opledger_domain::event::OperationEvent;
use opledger_domain::ids::OperationId;
use opledger_domain::state::{evolve, OperationState, Work};

/// Operations not yet settled, with when each is next due.
#[derive(Debug, Default)]
pub struct WorkQueue {
    open: HashMap<OperationId, OperationState>,
    /// (due at, operation, work), ordered by due time.
    due: BTreeSet<(DateTime<Utc>, OperationId, Work)>,
    due_of: HashMap<OperationId, (DateTime<Utc>, Work)>,
    /// How much later than due a send is offered (see [`WorkQueue::with_send_delay`]).
    send_delay: chrono::Duration,
}

impl WorkQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty queue that offers sends `delay` after they fall due (sweeps and lookups as they
    /// fall due). A service that executes operations on request gives its callers this head
    /// start, so background workers do not race the caller for a fresh claim; they remain the
    /// safety net for operations nobody executes.
    pub fn with_send_delay(delay: chrono::Duration) -> Self {
        Self {
            send_delay: delay.max(chrono::Duration::zero()),
            ..Self::default()
        }
    }

    /// Folds one event of `operation_id`'s stream into the queue.
    pub fn apply(&mut self, operation_id: OperationId, event: &OperationEvent) {
        // A settled operation left the queue; a late annotation of it (a late response, a
        // duplicate) must not bring it back, nor be folded onto an empty state: that is no
        // history the decider wrote, and debug builds stop on it (`assert_invariants`).
        let Some(state) = self.open.remove(&operation_id).or_else(|| {
            matches!(event, OperationEvent::IntentRecorded(_)).then(OperationState::initial)
        }) else {
            return;
        };
        let state = evolve(state, event);
        if let Some(previous) = self.due_of.remove(&operation_id) {
            self.due.remove(&(previous.0, operation_id, previous.1));
        }
        if state.status.is_terminal() || state.intent.is_none() {
            return;
        }
        if let Some((due_at, work)) = state.next_work() {
            let due_at = match work {
                Work::Send => due_at + self.send_delay,
                Work::Sweep | Work::Reconcile => due_at,
            };
            self.due.insert((due_at, operation_id, work));
            self.due_of.insert(operation_id, (due_at, work));
        }
        self.open.insert(operation_id, state);
    }

    /// Takes `operation_id` out of the queue, whatever its state: the workers set aside an
    /// operation whose log they cannot read, so that nothing drives it on a partial fold.
    pub fn remove(&mut self, operation_id: OperationId) {
        self.open.remove(&operation_id);
        if let Some((due_at, work)) = self.due_of.remove(&operation_id) {
            self.due.remove(&(due_at, operation_id, work));
        }
    }

    /// Up to `limit` operations whose work is due at `now`, the longest-waiting first.
    pub fn due(&self, now: DateTime<Utc>, limit: usize) -> Vec<(OperationId, Work)> {
        self.due
            .iter()
            .take_while(|(due_at, _, _)| *due_at <= now)
            .take(limit)
            .map(|(_, operation_id, work)| (*operation_id, *work))
            .collect()
    }

    /// When the next piece of work falls due, if any is waiting.
    pub fn next_due_at(&self) -> Option<DateTime<Utc>> {
        self.due.first().map(|(due_at, _, _)| *due_at)
    }

    /// How many operations are open (not settled).
    pub fn open_operations(&self) -> usize {
        self.open.len()
    }

    /// The folded state of an open operation.
    pub fn state(&self, operation_id: OperationId) -> Option<&OperationState> {
        self.open.get(&operation_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use opledger_domain::args::ArgsSnapshot;
    use opledger_domain::event::{
        AttemptStarted, AttemptSucceeded, IntentRecorded, LookupClaimed, OutcomeUnknown,
        ReconciliationRecorded, ReconciliationResult,
    };
    use opledger_domain::ids::{
        AccountId, ActionName, AttemptId, CredentialFingerprint, ExternalObjectId, IdempotencyKey,
        ProviderId, TenantId, WorkerId,
    };
    use uuid::Uuid;

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + seconds, 0)
            .single()
            .expect("valid")
    }

    fn intent(operation_id: OperationId) -> OperationEvent {
        let args = ArgsSnapshot::new(serde_json::json!({"title": "t"})).expect("valid");
        OperationEvent::IntentRecorded(IntentRecorded {
            operation_id,
            tenant: TenantId::new("t").expect("valid"),
            owner: None,
            provider: ProviderId::new("p").expect("valid"),
            account: AccountId::new("a").expect("valid"),
            credential_fingerprint: CredentialFingerprint::new("f").expect("valid"),
            action: ActionName::new("create").expect("valid"),
            args_hash: args.hash(),
            args,
            idempotency_key: IdempotencyKey::new("k").expect("valid"),
            source_id: None,
            requires_approval: false,
            executor: Default::default(),
            at: at(0),
        })
    }

    #[test]
    fn a_send_delay_offers_fresh_sends_later_so_a_caller_executing_them_goes_first() {
        let operation = OperationId::from_uuid(Uuid::from_u128(7));
        let mut queue = WorkQueue::with_send_delay(chrono::Duration::seconds(2));
        queue.apply(operation, &intent(operation));
        assert!(queue.due(at(1), 10).is_empty());
        assert_eq!(queue.next_due_at(), Some(at(2)));
        assert_eq!(queue.due(at(2), 10), vec![(operation, Work::Send)]);
    }

    #[test]
    fn a_claimed_lookup_is_not_offered_until_its_claims_lease_runs_out_and_its_record_frees_it() {
        let operation = OperationId::from_uuid(Uuid::from_u128(3));
        let attempt = AttemptId::from_uuid(Uuid::from_u128(4));
        let mut queue = WorkQueue::new();
        queue.apply(operation, &intent(operation));
        queue.apply(
            operation,
            &OperationEvent::AttemptStarted(AttemptStarted {
                request: None,
                budget_wait: None,
                attempt_id: attempt,
                attempt_number: 1,
                worker: WorkerId::new("w").expect("valid"),
                lease_deadline: at(30),
                at: at(1),
            }),
        );
        queue.apply(
            operation,
            &OperationEvent::OutcomeUnknown(OutcomeUnknown {
                attempt_id: attempt,
                error: "timeout".into(),
                check_not_before: None,
                at: at(2),
            }),
        );
        assert_eq!(queue.due(at(2), 10), vec![(operation, Work::Reconcile)]);
        queue.apply(
            operation,
            &OperationEvent::LookupClaimed(LookupClaimed {
                budget_wait: None,
                worker: WorkerId::new("serve-1").expect("valid"),
                lease_deadline: at(7),
                at: at(2),
            }),
        );
        assert!(
            queue.due(at(6), 10).is_empty(),
            "another worker is looking it up"
        );
        assert_eq!(queue.next_due_at(), Some(at(7)));
        assert_eq!(
            queue.due(at(7), 10),
            vec![(operation, Work::Reconcile)],
            "its claimant may have died: due for another worker"
        );
        queue.apply(
            operation,
            &OperationEvent::ReconciliationRecorded(ReconciliationRecorded {
                result: ReconciliationResult::Inconclusive {
                    reason: "503".into(),
                },
                evidence: String::new(),
                next_check_not_before: Some(at(4)),
                at: at(3),
            }),
        );
        assert_eq!(
            queue.due(at(4), 10),
            vec![(operation, Work::Reconcile)],
            "the next round is anyone's"
        );
    }

    #[test]
    fn a_recorded_operation_is_due_for_sending_then_for_a_sweep_then_leaves_when_settled() {
        let operation = OperationId::from_uuid(Uuid::from_u128(1));
        let attempt = AttemptId::from_uuid(Uuid::from_u128(2));
        let mut queue = WorkQueue::new();
        queue.apply(operation, &intent(operation));
        assert_eq!(queue.due(at(0), 10), vec![(operation, Work::Send)]);
        queue.apply(
            operation,
            &OperationEvent::AttemptStarted(AttemptStarted {
                request: None,
                budget_wait: None,
                attempt_id: attempt,
                attempt_number: 1,
                worker: WorkerId::new("w").expect("valid"),
                lease_deadline: at(30),
                at: at(1),
            }),
        );
        assert!(
            queue.due(at(29), 10).is_empty(),
            "not due before the lease runs out"
        );
        assert_eq!(queue.due(at(30), 10), vec![(operation, Work::Sweep)]);
        assert_eq!(queue.next_due_at(), Some(at(30)));
        queue.apply(
            operation,
            &OperationEvent::AttemptSucceeded(AttemptSucceeded {
                attempt_id: attempt,
                external_id: ExternalObjectId::new("731").expect("valid"),
                provider_request_id: None,
                at: at(2),
            }),
        );
        assert_eq!(queue.open_operations(), 0);
        assert_eq!(queue.next_due_at(), None);
    }
}
