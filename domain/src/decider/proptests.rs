//! Random command sequences never break the ledger's invariants.
//!
//! Each case picks a provider shape and whether approval is needed, then throws up to 60 random
//! commands at the decider (most of them refused, which is the point) while a simulated clock
//! moves forward by random steps. After every accepted command the invariants are checked.

use chrono::Duration;
use proptest::prelude::*;

use super::fixtures::*;
use crate::codec;
use crate::command::Command;
use crate::contract::check_automatic_retry;
use crate::contract::ProviderCapabilities;
use crate::event::IntentRecorded;
use crate::event::{OperationEvent, ReconciliationResult, ReviewDecision};
use crate::ids::{OperationId, StreamVersion};
use crate::state::{evolve, fold, OperationState, PendingSince, Status};
use crate::store::{RecordedEvent, StreamName};
use chrono::{DateTime, Utc};

#[derive(Clone, Debug)]
enum Which {
    Current,
    Earlier(usize),
    Never,
}

#[derive(Clone, Debug)]
enum Action {
    Grant,
    Deny,
    Start,
    /// The caller claims a step's next attempt.
    ClaimStep,
    Succeed(Which, u8),
    Reject(Which),
    Unknown(Which),
    NotSent(Which),
    Expire(Which),
    Reconcile(Option<u8>),
    /// A lookup saying the first request is still being processed.
    StillInProgress,
    /// Settling an unknown operation as if its action had no lookup.
    SettleWithoutLookup,
    /// One of three workers claims the next lookup.
    ClaimLookup(u8),
    RequireReview,
    Resolve(u8, u8),
}

fn which() -> impl Strategy<Value = Which> {
    prop_oneof![4 => Just(Which::Current), 2 => (0..4_usize).prop_map(Which::Earlier), 1 => Just(Which::Never)]
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        1 => Just(Action::Grant),
        1 => Just(Action::Deny),
        4 => Just(Action::Start),
        3 => Just(Action::ClaimStep),
        3 => (which(), 0..3_u8).prop_map(|(w, id)| Action::Succeed(w, id)),
        1 => which().prop_map(Action::Reject),
        3 => which().prop_map(Action::Unknown),
        2 => which().prop_map(Action::NotSent),
        2 => which().prop_map(Action::Expire),
        3 => proptest::option::of(0..3_u8).prop_map(Action::Reconcile),
        1 => Just(Action::StillInProgress),
        1 => Just(Action::SettleWithoutLookup),
        2 => (0..3_u8).prop_map(Action::ClaimLookup),
        1 => Just(Action::RequireReview),
        2 => (0..3_u8, 0..3_u8).prop_map(|(d, id)| Action::Resolve(d, id)),
    ]
}

fn steps() -> impl Strategy<Value = Vec<(Action, i64)>> {
    // Steps of up to 2 h, so key retention (23 h usable) and the 1 h retry budget both run out
    // in some cases and not in others.
    prop::collection::vec((action(), 0..7_200_i64), 1..60)
}

/// The command an action stands for, against the operation as it stands.
fn command_for(
    action: &Action,
    state: &OperationState,
    first: &IntentRecorded,
    capabilities: ProviderCapabilities,
    now: DateTime<Utc>,
    next_attempt: &mut u128,
) -> Command {
    let pick = |which: &Which| match which {
        Which::Current => state
            .current_attempt
            .as_ref()
            .map_or(attempt(999), |a| a.attempt_id),
        Which::Earlier(index) => state
            .attempt_ids
            .get(*index)
            .copied()
            .unwrap_or(attempt(998)),
        Which::Never => attempt(997),
    };
    match action {
        Action::Grant => grant(),
        Action::Deny => Command::DenyApproval {
            principal: None,
            approver: actor("boss"),
            args_hash: first.args_hash.clone(),
            reason: "no".into(),
        },
        Action::Start => {
            *next_attempt += 1;
            start(*next_attempt, capabilities)
        }
        // A lease of 30 min against steps of up to 2 h: some claims lapse, some are reported.
        Action::ClaimStep => {
            *next_attempt += 1;
            Command::ClaimStep {
                attempt_id: attempt(*next_attempt),
                caller: worker(STEP_CALLER),
                lease_ms: 30 * 60 * 1000,
            }
        }
        Action::Succeed(w, id) => Command::RecordSuccess {
            attempt_id: pick(w),
            external_id: external(&format!("73{id}")),
            provider_request_id: None,
        },
        Action::Reject(w) => Command::RecordRejection {
            attempt_id: pick(w),
            code: "422".into(),
            message: "no".into(),
        },
        Action::Unknown(w) => Command::RecordUnknown {
            attempt_id: pick(w),
            error: "timeout".into(),
            check_not_before: None,
        },
        Action::NotSent(w) => Command::RecordNotSent {
            attempt_id: pick(w),
            reason: "429".into(),
            retry_not_before: now + Duration::seconds(30),
        },
        Action::Expire(w) => Command::ExpireLease {
            attempt_id: pick(w),
        },
        Action::Reconcile(found) => Command::RecordReconciliation {
            duplicates: found
                .map(|id| vec![external(&format!("74{id}"))])
                .unwrap_or_default(),
            result: match found {
                Some(id) => ReconciliationResult::Found {
                    external_id: external(&format!("73{id}")),
                    account: first.account.clone(),
                },
                None => ReconciliationResult::NotFound {
                    authoritative: false,
                },
            },
            evidence: "lookup".into(),
            binding: binding(),
            capabilities,
            policy: policy(),
            retry_not_before: now + Duration::seconds(5),
            next_check_not_before: now + Duration::seconds(5),
            in_progress: false,
        },
        Action::StillInProgress => Command::RecordReconciliation {
            duplicates: Vec::new(),
            result: ReconciliationResult::Inconclusive {
                reason: "200 in_progress".into(),
            },
            evidence: "lookup".into(),
            binding: binding(),
            capabilities,
            policy: policy(),
            retry_not_before: now + Duration::seconds(5),
            next_check_not_before: now + Duration::seconds(5),
            in_progress: true,
        },
        Action::SettleWithoutLookup => Command::SettleWithoutLookup {
            binding: binding(),
            capabilities,
            policy: policy(),
            retry_not_before: now + Duration::seconds(5),
        },
        // A lease of 30 min against steps of up to 2 h: claims lapse in some cases, not in others.
        Action::ClaimLookup(n) => Command::ClaimLookup {
            budget_wait: None,
            worker: worker(&format!("serve-{n}")),
            lease_ms: 30 * 60 * 1000,
        },
        Action::RequireReview => Command::RequireReview {
            reason: "stuck".into(),
            evidence: String::new(),
        },
        Action::Resolve(decision, id) => Command::ResolveReview {
            principal: None,
            reviewer: actor("operator"),
            decision: match decision {
                0 => ReviewDecision::Retry,
                1 => ReviewDecision::ConfirmSucceeded {
                    external_id: external(&format!("73{id}")),
                },
                _ => ReviewDecision::Abandon,
            },
            note: String::new(),
            // Both ways: a retry refused for its risk must leave the state as it was.
            accept_duplicate_risk: id % 2 == 0,
            capabilities: Some(capabilities),
        },
    }
}

/// The caller that claims a step's attempts.
const STEP_CALLER: &str = "caller:job";

/// What the property test carries from step to step.
struct Run {
    capabilities: ProviderCapabilities,
    first: IntentRecorded,
    history: Vec<OperationEvent>,
    state: OperationState,
    now: DateTime<Utc>,
    /// Whether an attempt ended without a known outcome since the last reviewer's retry.
    uncertain_since_decision: bool,
}

impl Run {
    /// Checks one decided event against the state before the command, then folds it in.
    fn apply(
        &mut self,
        before: &OperationState,
        event: &OperationEvent,
    ) -> Result<(), TestCaseError> {
        let now = self.now;
        let capabilities = self.capabilities;
        // Attempt numbers strictly grow, one at a time.
        if let OperationEvent::AttemptStarted(started) = event {
            prop_assert_eq!(started.attempt_number, before.attempts + 1);
            // One kind of sender per operation: the caller for a step, a worker otherwise.
            prop_assert_eq!(
                started.worker.as_str() == STEP_CALLER,
                self.first.executed_by_caller(),
                "a step sent by a worker, or a connector's operation claimed by a caller"
            );
            prop_assert_eq!(
                &before.status,
                &Status::Pending,
                "attempts start only from pending"
            );
            // No attempt after an uncertain one without a valid contract or a person's
            // decision (attempts provably not sent leave nothing to be uncertain about).
            if self.uncertain_since_decision {
                match before.pending_since {
                    Some(PendingSince::ReviewerRetry) => {}
                    Some(PendingSince::RetryScheduled) => prop_assert!(
                        check_automatic_retry(&capabilities, &policy(), before, &binding(), now)
                            .is_ok(),
                        "an automatic retry started without a valid contract"
                    ),
                    other => prop_assert!(
                        false,
                        "attempt {} started from {:?}",
                        started.attempt_number,
                        other
                    ),
                }
            }
        }
        if before.status.is_terminal() {
            prop_assert!(
                matches!(
                    event,
                    OperationEvent::LateResponseReceived(_)
                        | OperationEvent::DuplicateDetected(_)
                        | OperationEvent::ReconciliationRecorded(_)
                ),
                "a {} operation got {}",
                before.status.name(),
                event.type_name()
            );
        }
        // One lookup claim at a time: taken only while unknown, due, and no live claim holds.
        if let OperationEvent::LookupClaimed(claimed) = event {
            prop_assert_eq!(&before.status, &Status::Unknown);
            prop_assert!(before
                .lookup_claim
                .as_ref()
                .is_none_or(|held| held.lease_deadline <= now));
            prop_assert!(before.next_check_not_before.is_none_or(|due| due <= now));
            prop_assert!(claimed.lease_deadline > now);
        }
        // A refusal ends an operation only if no earlier attempt may have applied it.
        if let OperationEvent::AttemptRejected(_) = event {
            let after = evolve(self.state.clone(), event);
            let rejected = after.status == Status::Rejected;
            prop_assert_eq!(rejected, before.uncertain_attempts == 0);
        }
        self.check_codec(event)?;
        match event {
            OperationEvent::OutcomeUnknown(_) | OperationEvent::LeaseExpired(_) => {
                self.uncertain_since_decision = true
            }
            OperationEvent::ReviewResolved(resolved)
                if resolved.decision == ReviewDecision::Retry =>
            {
                self.uncertain_since_decision = false;
            }
            _ => {}
        }
        self.state = evolve(self.state.clone(), event);
        // Every intermediate state keeps the invariants, not only the one a command ends in.
        self.state.assert_invariants();
        self.history.push(event.clone());
        Ok(())
    }

    /// Every event survives the codec unchanged.
    fn check_codec(&self, event: &OperationEvent) -> Result<(), TestCaseError> {
        let operation = OperationId::from_uuid(uuid::Uuid::from_u128(7));
        let version = StreamVersion::new(self.history.len() as u64);
        let (data, _) = codec::encode(operation, version, event, None);
        let recorded = RecordedEvent {
            stream: StreamName::for_operation(operation),
            version,
            position: crate::ids::GlobalPosition::new(1),
            event_id: data.event_id,
            event_type: data.event_type,
            data: data.data,
            metadata: data.metadata,
        };
        prop_assert_eq!(&codec::decode(&recorded).expect("decodes"), event);
        Ok(())
    }

    /// Checks the state a whole command left, against the state before it.
    fn check_step(
        &self,
        before: &OperationState,
        events: &[OperationEvent],
    ) -> Result<(), TestCaseError> {
        let state = &self.state;
        state.assert_invariants();
        prop_assert!(
            before.status.may_become(&state.status),
            "{} became {}, which is no arrow of the state machine",
            before.status.name(),
            state.status.name()
        );
        // A success carries an external id and keeps its first one; terminal stays terminal.
        if let Status::Succeeded { external_id } = &before.status {
            prop_assert_eq!(state.external_id(), Some(external_id));
        }
        // Terminal stays terminal, except that the provider's own late confirmation settles a
        // rejected or abandoned operation as succeeded.
        if before.status.is_terminal() && state.status != before.status {
            let settled_late = matches!(before.status, Status::Rejected | Status::Abandoned)
                && state.external_id().is_some()
                && events
                    .iter()
                    .any(|event| matches!(event, OperationEvent::LateResponseReceived(_)));
            prop_assert!(
                settled_late,
                "{} became {}",
                before.status.name(),
                state.status.name()
            );
        }
        if state.status.name() == "succeeded" {
            prop_assert!(state.external_id().is_some());
        }
        // The arguments never change under an operation.
        prop_assert_eq!(state.intent.as_ref(), Some(&self.first));
        // The incremental state is the fold of the whole history.
        prop_assert_eq!(&fold(&self.history), state);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn random_command_sequences_never_break_an_invariant(
        shape in 0..4_u8,
        requires_approval in any::<bool>(),
        steps in steps(),
    ) {
        // Shape 3: a step the caller's own code carries out, with the contract every step has.
        let capabilities = match shape {
            0 => keyed(),
            1 => labelled(),
            2 => lookup_only(),
            _ => crate::contract::CALLER_STEP_CAPABILITIES,
        };
        let mut first = intent(requires_approval);
        if shape == 3 {
            first.executor = crate::event::Executor::Caller;
        }
        let history = vec![OperationEvent::IntentRecorded(first.clone())];
        let state = fold(&history);
        state.assert_invariants();
        let mut run = Run { capabilities, first, history, state, now: t0(), uncertain_since_decision: false };
        let mut next_attempt = 1_u128;

        for (action, advance_s) in steps {
            run.now += Duration::seconds(advance_s);
            let command = command_for(&action, &run.state, &run.first, capabilities, run.now, &mut next_attempt);
            let Ok(events) = super::decide(&command, &run.state, run.now) else { continue };
            let before = run.state.clone();
            for event in &events {
                run.apply(&before, event)?;
            }
            run.check_step(&before, &events)?;
        }
    }
}
