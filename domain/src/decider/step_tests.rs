//! Given / when / then for steps the caller's own code carries out: claimed by the caller, never
//! sent by the ledger, settled by what the caller reports, handed to a person when it stops.

use super::fixtures::*;
use super::Rejection;
use crate::command::Command;
use crate::contract::CALLER_STEP_CAPABILITIES;
use crate::event::{Executor, OperationEvent};
use crate::state::{Status, Work};

fn step_recorded() -> Scenario {
    let mut intent = intent(false);
    intent.executor = Executor::Caller;
    given(vec![OperationEvent::IntentRecorded(intent)])
}

fn claim(n: u128) -> Command {
    Command::ClaimStep {
        attempt_id: attempt(n),
        caller: worker("billing-job"),
        lease_ms: 30_000,
    }
}

fn settle() -> Command {
    Command::SettleWithoutLookup {
        binding: binding(),
        capabilities: CALLER_STEP_CAPABILITIES,
        policy: policy(),
        retry_not_before: at_s(60),
    }
}

#[test]
fn a_recorded_step_is_no_work_for_the_ledgers_workers() {
    assert_eq!(step_recorded().state().next_work(), None);
}

#[test]
fn the_ledger_never_sends_a_step() {
    let outcome = step_recorded().when(&start(1, keyed()), t0());
    assert!(matches!(
        outcome.rejection(),
        Rejection::WrongExecutor {
            executor: Executor::Caller
        }
    ));
}

#[test]
fn a_caller_never_claims_a_connectors_operation() {
    let outcome = given(vec![OperationEvent::IntentRecorded(intent(false))]).when(&claim(1), t0());
    assert!(matches!(
        outcome.rejection(),
        Rejection::WrongExecutor {
            executor: Executor::Ledger
        }
    ));
}

#[test]
fn the_callers_claim_starts_an_attempt_with_a_lease_and_the_sweep_is_due_at_its_end() {
    let outcome = step_recorded().when(&claim(1), t0());
    assert_eq!(outcome.then_types(), ["AttemptStarted"]);
    assert_eq!(outcome.status(), "in_flight");
    assert_eq!(
        outcome.scenario.state().next_work(),
        Some((at_s(30), Work::Sweep))
    );
}

#[test]
fn a_second_claim_is_refused_while_the_first_lease_is_live() {
    let outcome = step_recorded()
        .when(&claim(1), t0())
        .and(&claim(2), at_s(5));
    assert!(matches!(
        outcome.rejection(),
        Rejection::NotAllowed {
            command: "claim_step",
            status: "in_flight"
        }
    ));
    assert_eq!(
        step_recorded()
            .when(&claim(1), t0())
            .and(&claim(1), at_s(5))
            .then_types(),
        Vec::<&str>::new(),
        "the same claim again changes nothing"
    );
}

#[test]
fn a_reported_success_settles_the_step_with_its_result() {
    let outcome = step_recorded()
        .when(&claim(1), t0())
        .and(&success(1, "inv_731"), at_s(2));
    assert_eq!(outcome.then_types(), ["AttemptSucceeded"]);
    assert_eq!(
        outcome.scenario.state().status,
        Status::Succeeded {
            external_id: external("inv_731")
        }
    );
}

#[test]
fn a_lapsed_claim_makes_the_step_unknown_and_then_a_persons_with_the_callers_silence_as_evidence() {
    let outcome = step_recorded().when(&claim(1), t0()).and(
        &Command::ExpireLease {
            attempt_id: attempt(1),
        },
        at_s(31),
    );
    assert_eq!(outcome.status(), "unknown");
    let state = outcome.scenario.state();
    assert!(
        state
            .last_error
            .as_deref()
            .is_some_and(|error| error.contains("the caller's process stopped reporting")),
        "{:?}",
        state.last_error
    );
    let review = outcome.and(&settle(), at_s(31));
    assert_eq!(review.then_types(), ["ReviewRequired"]);
    let OperationEvent::ReviewRequired(required) = &review.events()[0] else {
        unreachable!("checked above");
    };
    assert!(
        required.reason.contains("caller's own code"),
        "{}",
        required.reason
    );
    assert!(
        required.evidence.contains("stopped reporting"),
        "{}",
        required.evidence
    );
    assert_eq!(review.scenario.state().next_work(), None);
}

#[test]
fn a_late_success_after_the_lease_ran_out_settles_the_step_and_is_never_regressed() {
    let outcome = step_recorded()
        .when(&claim(1), t0())
        .and(
            &Command::ExpireLease {
                attempt_id: attempt(1),
            },
            at_s(31),
        )
        .and(&settle(), at_s(31))
        .and(&success(1, "inv_731"), at_s(40));
    assert_eq!(outcome.then_types(), ["LateResponseReceived"]);
    assert_eq!(outcome.status(), "succeeded");
    let after = outcome.and(&unknown(1), at_s(41));
    assert_eq!(after.then_types(), Vec::<&str>::new());
    assert_eq!(after.status(), "succeeded");
}

#[test]
fn a_different_result_after_success_is_a_detected_duplicate() {
    let outcome = step_recorded()
        .when(&claim(1), t0())
        .and(&success(1, "inv_731"), at_s(2))
        .and(&success(1, "inv_732"), at_s(3));
    assert_eq!(
        outcome.then_types(),
        ["LateResponseReceived", "DuplicateDetected"]
    );
    assert_eq!(outcome.status(), "succeeded");
}

#[test]
fn a_step_in_review_is_claimed_again_only_after_a_persons_retry_that_accepts_the_risk() {
    let in_review = step_recorded()
        .when(&claim(1), t0())
        .and(&unknown(1), at_s(2))
        .and(&settle(), at_s(2));
    assert_eq!(in_review.status(), "needs_review");
    let refused = in_review.clone().and(&claim(2), at_s(3));
    assert!(matches!(refused.rejection(), Rejection::NotAllowed { .. }));
    let retry = |accept| Command::ResolveReview {
        reviewer: actor("anna"),
        principal: None,
        decision: crate::event::ReviewDecision::Retry,
        note: "checked the billing system: no invoice".into(),
        accept_duplicate_risk: accept,
        capabilities: Some(CALLER_STEP_CAPABILITIES),
    };
    assert!(matches!(
        in_review.clone().and(&retry(false), at_s(4)).rejection(),
        Rejection::DuplicateRiskNotAccepted { .. }
    ));
    let retried = in_review.and(&retry(true), at_s(4));
    assert_eq!(retried.status(), "pending");
    assert_eq!(
        retried.scenario.state().next_work(),
        None,
        "the caller claims it, not a worker"
    );
    assert_eq!(retried.and(&claim(2), at_s(5)).status(), "in_flight");
}
