//! Given events / when command / then events, for every arrow of the state machine and for
//! every refusal.

use super::fixtures::*;
use super::Rejection;
use crate::args::ArgsSnapshot;
use crate::command::Command;
use crate::contract::{ContractViolation, ProviderCapabilities};
use crate::event::{OperationEvent, ReconciliationResult, ReviewDecision};
use crate::ids::AccountId;
use crate::state::{Status, Work};
use chrono::{DateTime, Utc};
use serde_json::json;

fn recorded() -> Scenario {
    given(vec![OperationEvent::IntentRecorded(intent(false))])
}

fn awaiting_approval() -> Scenario {
    given(vec![OperationEvent::IntentRecorded(intent(true))])
}

fn in_flight(capabilities: ProviderCapabilities) -> Scenario {
    recorded().when(&start(1, capabilities), t0()).scenario
}

fn unknown_after_first_attempt(capabilities: ProviderCapabilities) -> Scenario {
    in_flight(capabilities).when(&unknown(1), at_s(10)).scenario
}

fn reconcile(
    result: ReconciliationResult,
    capabilities: ProviderCapabilities,
    not_before: DateTime<Utc>,
) -> Command {
    Command::RecordReconciliation {
        result,
        duplicates: Vec::new(),
        evidence: "GET /tasks?label=op-7 → []".into(),
        binding: binding(),
        capabilities,
        policy: policy(),
        retry_not_before: not_before,
        next_check_not_before: not_before,
        in_progress: false,
    }
}

/// A keyed lookup answering "the first request with this key is still being processed".
fn reconcile_in_progress(capabilities: ProviderCapabilities, not_before: DateTime<Utc>) -> Command {
    Command::RecordReconciliation {
        duplicates: Vec::new(),
        result: ReconciliationResult::Inconclusive {
            reason: "200 in_progress".into(),
        },
        evidence: "GET /keyed/acct-1/requests/opk_1 → 200 in_progress".into(),
        binding: binding(),
        capabilities,
        policy: policy(),
        retry_not_before: not_before,
        next_check_not_before: not_before,
        in_progress: true,
    }
}

fn not_found() -> ReconciliationResult {
    ReconciliationResult::NotFound {
        authoritative: false,
    }
}

fn found(id: &str) -> ReconciliationResult {
    ReconciliationResult::Found {
        external_id: external(id),
        account: intent(false).account,
    }
}

fn needs_review() -> Scenario {
    unknown_after_first_attempt(lookup_only())
        .when(&reconcile(not_found(), lookup_only(), at_s(20)), at_s(20))
        .scenario
}

fn resolve(decision: ReviewDecision) -> Command {
    Command::ResolveReview {
        principal: None,
        reviewer: actor("operator"),
        decision,
        note: "checked the CRM by hand".into(),
        // The decider's own review tests are about the decisions; the duplicate-risk rule has
        // tests of its own below.
        accept_duplicate_risk: true,
        capabilities: None,
    }
}

// --- intent and approval ---------------------------------------------------------------------

#[test]
fn recording_an_intent_makes_it_pending() {
    let outcome = given(vec![]).when(&Command::RecordIntent(intent(false)), t0());
    assert_eq!(outcome.then_types(), ["IntentRecorded"]);
    assert_eq!(outcome.status(), "pending");
}

#[test]
fn recording_an_intent_that_needs_approval_waits_for_it() {
    let outcome = given(vec![]).when(&Command::RecordIntent(intent(true)), t0());
    assert_eq!(outcome.status(), "awaiting_approval");
}

#[test]
fn recording_an_intent_twice_is_refused() {
    let outcome = recorded().when(&Command::RecordIntent(intent(false)), t0());
    assert_eq!(
        outcome.rejection(),
        &Rejection::AlreadyRecorded { status: "pending" }
    );
}

#[test]
fn an_intent_whose_hash_does_not_match_its_arguments_is_refused() {
    let mut forged = intent(false);
    forged.args = ArgsSnapshot::new(json!({"title": "Something else"})).expect("valid");
    let outcome = given(vec![]).when(&Command::RecordIntent(forged), t0());
    assert!(matches!(outcome.rejection(), Rejection::Invalid(error) if error.field == "args_hash"));
}

#[test]
fn commands_on_an_operation_never_recorded_are_refused() {
    for command in [grant(), start(1, keyed()), success(1, "731"), unknown(1)] {
        let outcome = given(vec![]).when(&command, t0());
        assert_eq!(
            outcome.rejection(),
            &Rejection::NotRecorded,
            "{}",
            command.name()
        );
    }
}

#[test]
fn approval_of_the_recorded_snapshot_makes_it_pending() {
    let outcome = awaiting_approval().when(&grant(), at_s(1));
    assert_eq!(outcome.then_types(), ["ApprovalGranted"]);
    assert_eq!(outcome.status(), "pending");
}

#[test]
fn approval_of_other_arguments_is_refused() {
    let other = ArgsSnapshot::new(json!({"title": "Call the client", "due": "today"}))
        .expect("valid")
        .hash();
    let command = Command::GrantApproval {
        principal: None,
        approver: actor("boss"),
        args_hash: other.clone(),
    };
    let outcome = awaiting_approval().when(&command, at_s(1));
    assert_eq!(
        outcome.rejection(),
        &Rejection::ArgsHashMismatch {
            recorded: intent(true).args_hash,
            offered: other
        }
    );
}

#[test]
fn an_approval_records_the_token_that_gave_it_and_an_older_one_reads_and_hashes_as_before() {
    let principal = crate::event::Principal {
        kind: crate::event::PrincipalKind::TenantToken,
        name: "acme".into(),
    };
    let command = Command::GrantApproval {
        principal: Some(principal.clone()),
        approver: actor("Jane Doe (CFO)"),
        args_hash: intent(true).args_hash,
    };
    let outcome = awaiting_approval().when(&command, at_s(1));
    let [OperationEvent::ApprovalGranted(granted)] = outcome.events() else {
        panic!("one approval: {:?}", outcome.events());
    };
    assert_eq!(granted.principal.as_ref(), Some(&principal));
    let written = serde_json::to_value(granted).expect("serializes");
    assert_eq!(
        written["principal"],
        json!({"kind": "tenant_token", "name": "acme"})
    );
    // An approval written before principals were kept: read without one, written back the same
    // bytes, so its hash in the chain is unchanged.
    let mut older = written.clone();
    older
        .as_object_mut()
        .expect("an object")
        .remove("principal");
    let read: crate::event::ApprovalGranted =
        serde_json::from_value(older.clone()).expect("an older approval reads");
    assert_eq!(read.principal, None);
    assert_eq!(serde_json::to_value(&read).expect("serializes"), older);
}

#[test]
fn approving_twice_changes_nothing() {
    let outcome = awaiting_approval()
        .when(&grant(), at_s(1))
        .and(&grant(), at_s(2));
    assert!(outcome.events().is_empty());
}

#[test]
fn an_operation_that_needs_approval_cannot_start_before_it() {
    let outcome = awaiting_approval().when(&start(1, keyed()), at_s(1));
    assert_eq!(
        outcome.rejection(),
        &Rejection::NotAllowed {
            command: "start_attempt",
            status: "awaiting_approval"
        }
    );
}

#[test]
fn a_denied_operation_is_never_sent_or_approved() {
    let deny = Command::DenyApproval {
        principal: None,
        approver: actor("boss"),
        args_hash: intent(true).args_hash,
        reason: "wrong client".into(),
    };
    let outcome = awaiting_approval().when(&deny, at_s(1));
    assert_eq!(outcome.then_types(), ["ApprovalDenied"]);
    assert_eq!(outcome.status(), "denied");
    let denied = outcome.scenario;
    assert!(matches!(
        denied.when(&start(1, keyed()), at_s(2)).rejection(),
        Rejection::NotAllowed { .. }
    ));
    let denied = awaiting_approval().when(&deny, at_s(1)).scenario;
    assert!(matches!(
        denied.when(&grant(), at_s(2)).rejection(),
        Rejection::NotAllowed { .. }
    ));
}

#[test]
fn an_operation_without_approval_cannot_be_approved() {
    let outcome = recorded().when(&grant(), at_s(1));
    assert!(matches!(
        outcome.rejection(),
        Rejection::NotAllowed {
            command: "grant_approval",
            ..
        }
    ));
}

#[test]
fn a_refusal_names_the_command_in_the_words_users_know() {
    let outcome = recorded().when(&grant(), at_s(1));
    assert_eq!(
        outcome.rejection().to_string(),
        "cannot approve an operation that is pending"
    );
}

// --- attempts ---------------------------------------------------------------------------------

#[test]
fn starting_an_attempt_claims_the_operation_with_a_lease() {
    let outcome = recorded().when(&start(1, keyed()), t0());
    let [OperationEvent::AttemptStarted(started)] = outcome.events() else {
        panic!("expected one AttemptStarted, got {:?}", outcome.events());
    };
    assert_eq!(started.attempt_number, 1);
    assert_eq!(started.lease_deadline, at_s(30));
    assert_eq!(outcome.status(), "in_flight");
}

#[test]
fn a_second_worker_cannot_claim_an_operation_in_flight() {
    let outcome = in_flight(keyed()).when(&start(2, keyed()), at_s(1));
    assert_eq!(
        outcome.rejection(),
        &Rejection::NotAllowed {
            command: "start_attempt",
            status: "in_flight"
        }
    );
}

#[test]
fn an_attempt_bound_to_another_account_credentials_or_arguments_is_refused() {
    let mut other_account = binding();
    other_account.account = AccountId::new("acct-2").expect("valid");
    let mut other_credentials = binding();
    other_credentials.credential_fingerprint =
        crate::ids::CredentialFingerprint::new("fp-2").expect("valid");
    let mut other_args = binding();
    other_args.args_hash = ArgsSnapshot::new(json!({"title": "x"}))
        .expect("valid")
        .hash();
    for offered in [other_account, other_credentials, other_args] {
        let command = start_with(1, keyed(), offered, 30_000);
        let outcome = recorded().when(&command, t0());
        assert!(
            matches!(outcome.rejection(), Rejection::BindingChanged(_)),
            "{:?}",
            outcome.rejection()
        );
    }
}

#[test]
fn a_lease_outside_its_limits_is_refused() {
    for lease_ms in [0, crate::command::MAX_LEASE_MS + 1] {
        let command = start_with(1, keyed(), binding(), lease_ms);
        assert!(
            matches!(recorded().when(&command, t0()).rejection(), Rejection::Invalid(e) if e.field == "lease_ms")
        );
    }
}

#[test]
fn a_confirmed_response_succeeds_with_its_external_id() {
    let outcome = in_flight(keyed()).when(&success(1, "731"), at_s(1));
    assert_eq!(outcome.then_types(), ["AttemptSucceeded"]);
    assert_eq!(
        outcome.scenario.state().external_id(),
        Some(&external("731"))
    );
}

#[test]
fn a_definitive_refusal_rejects_the_operation() {
    let command = Command::RecordRejection {
        attempt_id: attempt(1),
        code: "422".into(),
        message: "due date in the past".into(),
    };
    let outcome = in_flight(keyed()).when(&command, at_s(1));
    assert_eq!(outcome.then_types(), ["AttemptRejected"]);
    assert_eq!(outcome.status(), "rejected");
    let again = outcome.scenario.when(&command, at_s(2));
    assert!(
        again.events().is_empty(),
        "a repeated refusal of the same attempt records nothing new"
    );
}

#[test]
fn a_timeout_makes_the_outcome_unknown_and_is_not_recorded_twice() {
    let outcome = in_flight(keyed()).when(&unknown(1), at_s(10));
    assert_eq!(outcome.then_types(), ["OutcomeUnknown"]);
    assert_eq!(outcome.status(), "unknown");
    assert_eq!(outcome.scenario.state().unknown_since, Some(at_s(10)));
    assert!(outcome.and(&unknown(1), at_s(11)).events().is_empty());
}

#[test]
fn a_lease_cannot_expire_before_its_deadline() {
    let expire = Command::ExpireLease {
        attempt_id: attempt(1),
    };
    let outcome = in_flight(keyed()).when(&expire, at_s(29));
    assert_eq!(
        outcome.rejection(),
        &Rejection::LeaseStillValid {
            lease_deadline: at_s(30)
        }
    );
}

#[test]
fn an_expired_lease_makes_the_outcome_unknown() {
    let outcome = in_flight(keyed()).when(
        &Command::ExpireLease {
            attempt_id: attempt(1),
        },
        at_s(30),
    );
    assert_eq!(outcome.then_types(), ["LeaseExpired"]);
    assert_eq!(outcome.status(), "unknown");
}

#[test]
fn a_response_for_an_attempt_never_started_is_refused() {
    let outcome = in_flight(keyed()).when(&success(9, "731"), at_s(1));
    assert_eq!(
        outcome.rejection(),
        &Rejection::UnknownAttempt {
            attempt_id: attempt(9)
        }
    );
}

// --- reconciliation and retries --------------------------------------------------------------

#[test]
fn reconciliation_that_finds_the_object_settles_unknown_as_succeeded() {
    let outcome = unknown_after_first_attempt(lookup_only())
        .when(&reconcile(found("731"), lookup_only(), at_s(20)), at_s(20));
    assert_eq!(outcome.then_types(), ["ReconciliationRecorded"]);
    assert_eq!(
        outcome.scenario.state().external_id(),
        Some(&external("731"))
    );
}

#[test]
fn an_object_found_in_another_account_is_not_evidence() {
    let elsewhere = ReconciliationResult::Found {
        external_id: external("731"),
        account: AccountId::new("acct-2").expect("valid"),
    };
    let outcome = unknown_after_first_attempt(labelled())
        .when(&reconcile(elsewhere, labelled(), at_s(20)), at_s(20));
    assert!(matches!(
        outcome.rejection(),
        Rejection::EvidenceFromAnotherAccount { .. }
    ));
}

#[test]
fn no_evidence_under_a_fresh_idempotency_key_schedules_a_retry_with_the_same_key() {
    let outcome = unknown_after_first_attempt(keyed())
        .when(&reconcile(not_found(), keyed(), at_s(25)), at_s(20));
    assert_eq!(
        outcome.then_types(),
        ["ReconciliationRecorded", "RetryScheduled"]
    );
    let state = outcome.scenario.state();
    assert_eq!(state.status, Status::Pending);
    assert_eq!(state.retry_not_before, Some(at_s(25)));
    assert_eq!(
        state.intent.as_ref().map(|i| i.idempotency_key.as_str()),
        Some("opk_test")
    );
}

#[test]
fn no_evidence_under_a_unique_label_schedules_a_retry() {
    let outcome = unknown_after_first_attempt(labelled())
        .when(&reconcile(not_found(), labelled(), at_s(20)), at_s(20));
    assert_eq!(
        outcome.then_types(),
        ["ReconciliationRecorded", "RetryScheduled"]
    );
}

#[test]
fn an_empty_search_without_deduplication_goes_to_review_not_to_a_retry() {
    let outcome = unknown_after_first_attempt(lookup_only())
        .when(&reconcile(not_found(), lookup_only(), at_s(20)), at_s(20));
    assert_eq!(
        outcome.then_types(),
        ["ReconciliationRecorded", "ReviewRequired"]
    );
    assert_eq!(outcome.status(), "needs_review");
    assert!(outcome
        .scenario
        .state()
        .review_reason
        .is_some_and(|r| r.contains("neither honours")));
}

#[test]
fn no_evidence_after_the_key_retention_minus_margin_goes_to_review() {
    // Retention 24 h, margin 1 h: from 23 h after the first send the key is no longer trusted.
    let late = at_s(23 * 3600);
    let outcome =
        unknown_after_first_attempt(keyed()).when(&reconcile(not_found(), keyed(), late), late);
    assert_eq!(
        outcome.then_types(),
        ["ReconciliationRecorded", "ReviewRequired"]
    );
}

fn settle_without_lookup(capabilities: ProviderCapabilities, not_before: DateTime<Utc>) -> Command {
    Command::SettleWithoutLookup {
        binding: binding(),
        capabilities,
        policy: policy(),
        retry_not_before: not_before,
    }
}

/// A provider that deduplicates nothing and cannot be looked up (Pipedrive's activities).
fn neither() -> ProviderCapabilities {
    ProviderCapabilities {
        deduplication: crate::contract::Deduplication::None,
        lookup: crate::contract::LookupSupport::None,
    }
}

#[test]
fn an_unknown_keyed_action_without_a_lookup_schedules_its_retry_at_once_with_no_lookup_recorded() {
    let outcome = unknown_after_first_attempt(keyed())
        .when(&settle_without_lookup(keyed(), at_s(11)), at_s(10));
    assert_eq!(outcome.then_types(), ["RetryScheduled"]);
    assert_eq!(outcome.status(), "pending");
    assert_eq!(outcome.scenario.state().reconciliations, 0);
}

#[test]
fn an_unknown_action_without_a_lookup_or_a_contract_goes_to_a_person_at_once() {
    let outcome = unknown_after_first_attempt(neither())
        .when(&settle_without_lookup(neither(), at_s(11)), at_s(10));
    assert_eq!(outcome.then_types(), ["ReviewRequired"]);
    let reason = outcome.scenario.state().review_reason.unwrap_or_default();
    assert!(reason.contains("cannot be looked up"), "{reason}");
}

#[test]
fn an_unknown_keyed_action_without_a_lookup_past_its_key_retention_goes_to_a_person() {
    let late = at_s(23 * 3600);
    let outcome =
        unknown_after_first_attempt(keyed()).when(&settle_without_lookup(keyed(), late), late);
    assert_eq!(outcome.then_types(), ["ReviewRequired"]);
}

#[test]
fn settling_without_a_lookup_is_refused_for_an_action_that_has_one() {
    // Design rule 8: what can be looked up is reconciled before any retry.
    let outcome = unknown_after_first_attempt(labelled())
        .when(&settle_without_lookup(labelled(), at_s(11)), at_s(10));
    assert!(matches!(outcome.rejection(), Rejection::NotAllowed { .. }));
}

#[test]
fn settling_without_a_lookup_is_refused_unless_the_outcome_is_unknown() {
    let outcome = in_flight(keyed()).when(&settle_without_lookup(keyed(), at_s(11)), at_s(10));
    assert!(matches!(outcome.rejection(), Rejection::NotAllowed { .. }));
}

#[test]
fn a_scheduled_retry_waits_for_its_time_then_starts_attempt_two() {
    let scheduled = unknown_after_first_attempt(keyed())
        .when(&reconcile(not_found(), keyed(), at_s(25)), at_s(20))
        .scenario;
    let early = scheduled.when(&start(2, keyed()), at_s(24));
    assert_eq!(
        early.rejection(),
        &Rejection::NotYetDue {
            not_before: at_s(25)
        }
    );
    let outcome = early.scenario.when(&start(2, keyed()), at_s(25));
    let [OperationEvent::AttemptStarted(started)] = outcome.events() else {
        panic!("expected one AttemptStarted");
    };
    assert_eq!(started.attempt_number, 2);
}

#[test]
fn a_scheduled_retry_whose_key_expired_while_waiting_is_refused_and_goes_to_review() {
    let scheduled = unknown_after_first_attempt(keyed())
        .when(&reconcile(not_found(), keyed(), at_s(25)), at_s(20))
        .scenario;
    let outcome = scheduled.when(&start(2, keyed()), at_s(23 * 3600));
    assert!(matches!(
        outcome.rejection(),
        Rejection::RetryNotAllowed(ContractViolation::KeyRetentionPassed { .. })
    ));
    let review = Command::RequireReview {
        reason: "retry contract expired while queued".into(),
        evidence: String::new(),
    };
    let outcome = outcome.scenario.when(&review, at_s(23 * 3600));
    assert_eq!(outcome.status(), "needs_review");
}

#[test]
fn retries_stop_at_the_attempt_budget() {
    // policy(): at most 3 attempts.
    let mut scenario = unknown_after_first_attempt(keyed());
    for n in 2..=3 {
        let now = at_s(100 * i64::try_from(n).expect("small"));
        scenario = scenario
            .when(&reconcile(not_found(), keyed(), now), now)
            .and(&start(n, keyed()), now)
            .and(&unknown(n), now)
            .scenario;
    }
    let outcome = scenario.when(&reconcile(not_found(), keyed(), at_s(400)), at_s(400));
    assert_eq!(
        outcome.then_types(),
        ["ReconciliationRecorded", "ReviewRequired"]
    );
    assert!(outcome
        .scenario
        .state()
        .review_reason
        .is_some_and(|r| r.contains("3 attempts")));
}

#[test]
fn reconciliation_is_refused_where_nothing_is_unknown() {
    let outcome = in_flight(keyed()).when(&reconcile(not_found(), keyed(), at_s(1)), at_s(1));
    assert!(matches!(
        outcome.rejection(),
        Rejection::NotAllowed {
            command: "record_reconciliation",
            ..
        }
    ));
}

#[test]
fn review_can_be_required_of_a_pending_operation_but_not_of_one_in_flight() {
    let review = Command::RequireReview {
        reason: "why not".into(),
        evidence: String::new(),
    };
    assert!(matches!(
        in_flight(keyed()).when(&review, at_s(1)).rejection(),
        Rejection::NotAllowed { .. }
    ));
    // A pending send can become impossible while queued (binding changed, contract ran out).
    assert_eq!(recorded().when(&review, at_s(1)).status(), "needs_review");
}

// --- review -----------------------------------------------------------------------------------

#[test]
fn a_reviewer_retry_allows_an_attempt_without_a_retry_contract() {
    let outcome = needs_review().when(&resolve(ReviewDecision::Retry), at_s(30));
    assert_eq!(outcome.status(), "pending");
    let outcome = outcome.and(&start(2, lookup_only()), at_s(31));
    assert_eq!(outcome.then_types(), ["AttemptStarted"]);
}

#[test]
fn a_reviewer_can_confirm_the_object_they_found() {
    let outcome = needs_review().when(
        &resolve(ReviewDecision::ConfirmSucceeded {
            external_id: external("731"),
        }),
        at_s(30),
    );
    assert_eq!(
        outcome.scenario.state().external_id(),
        Some(&external("731"))
    );
}

#[test]
fn a_reviewer_can_give_up_for_good() {
    let outcome = needs_review().when(&resolve(ReviewDecision::Abandon), at_s(30));
    assert_eq!(outcome.status(), "abandoned");
    assert!(matches!(
        outcome
            .scenario
            .when(&start(2, keyed()), at_s(31))
            .rejection(),
        Rejection::NotAllowed { .. }
    ));
}

#[test]
fn review_decisions_are_refused_outside_review() {
    assert!(matches!(
        in_flight(keyed())
            .when(&resolve(ReviewDecision::Retry), at_s(1))
            .rejection(),
        Rejection::NotAllowed { .. }
    ));
}

#[test]
fn review_decisions_are_refused_before_the_first_attempt_and_after_a_settled_outcome() {
    for decision in [ReviewDecision::Retry, ReviewDecision::Abandon] {
        assert!(matches!(
            recorded()
                .when(&resolve(decision.clone()), at_s(1))
                .rejection(),
            Rejection::NotAllowed {
                status: "pending",
                ..
            }
        ));
        let succeeded = in_flight(keyed())
            .when(&success(1, "731"), at_s(2))
            .scenario;
        assert!(matches!(
            succeeded.when(&resolve(decision), at_s(3)).rejection(),
            Rejection::NotAllowed {
                status: "succeeded",
                ..
            }
        ));
    }
}

#[test]
fn a_reviewer_can_confirm_an_unknown_operation_with_the_id_found_by_hand() {
    let outcome = unknown_after_first_attempt(lookup_only()).when(
        &resolve(ReviewDecision::ConfirmSucceeded {
            external_id: external("731"),
        }),
        at_s(30),
    );
    assert_eq!(outcome.then_types(), ["ReviewResolved"]);
    assert_eq!(
        outcome.scenario.state().external_id(),
        Some(&external("731"))
    );
}

#[test]
fn a_reviewer_can_give_up_on_an_unknown_operation_and_nothing_is_looked_up_after() {
    let outcome = unknown_after_first_attempt(lookup_only())
        .when(&resolve(ReviewDecision::Abandon), at_s(30));
    assert_eq!(outcome.status(), "abandoned");
    assert_eq!(outcome.scenario.state().next_work(), None);
    assert!(matches!(
        outcome
            .scenario
            .when(&reconcile(not_found(), lookup_only(), at_s(31)), at_s(31))
            .rejection(),
        Rejection::NotAllowed { .. }
    ));
}

#[test]
fn a_reviewer_retry_of_an_unknown_operation_is_sent_without_a_retry_contract() {
    // The provider neither deduplicates nor answers: the person accepts the duplicate risk.
    let outcome =
        unknown_after_first_attempt(lookup_only()).when(&resolve(ReviewDecision::Retry), at_s(30));
    assert_eq!(outcome.status(), "pending");
    let outcome = outcome.and(&start(2, lookup_only()), at_s(31));
    assert_eq!(outcome.then_types(), ["AttemptStarted"]);
}

#[test]
fn a_reviewer_note_on_an_unknown_operation_is_held_to_the_same_limit() {
    let command = Command::ResolveReview {
        principal: None,
        reviewer: actor("op"),
        decision: ReviewDecision::Abandon,
        note: "x".repeat(crate::command::MAX_NOTE_BYTES + 1),
        accept_duplicate_risk: false,
        capabilities: None,
    };
    assert!(matches!(
        unknown_after_first_attempt(lookup_only()).when(&command, at_s(30)).rejection(),
        Rejection::Invalid(e) if e.field == "note"
    ));
}

#[test]
fn an_oversized_reviewer_note_is_refused() {
    let command = Command::ResolveReview {
        principal: None,
        reviewer: actor("op"),
        decision: ReviewDecision::Abandon,
        note: "x".repeat(crate::command::MAX_NOTE_BYTES + 1),
        accept_duplicate_risk: false,
        capabilities: None,
    };
    assert!(
        matches!(needs_review().when(&command, at_s(30)).rejection(), Rejection::Invalid(e) if e.field == "note")
    );
}

// --- late responses, no regression, duplicates -----------------------------------------------

#[test]
fn a_late_confirmation_settles_an_unknown_operation() {
    let outcome = unknown_after_first_attempt(lookup_only()).when(&success(1, "731"), at_s(40));
    assert_eq!(outcome.then_types(), ["LateResponseReceived"]);
    assert_eq!(
        outcome.scenario.state().external_id(),
        Some(&external("731"))
    );
}

#[test]
fn a_late_confirmation_settles_an_operation_waiting_for_review() {
    let outcome = needs_review().when(&success(1, "731"), at_s(40));
    assert_eq!(
        outcome.scenario.state().external_id(),
        Some(&external("731"))
    );
}

#[test]
fn late_success_after_reconciliation_is_not_regressed() {
    let succeeded = unknown_after_first_attempt(labelled())
        .when(&reconcile(found("731"), labelled(), at_s(20)), at_s(20))
        .scenario;
    for command in [
        unknown(1),
        Command::ExpireLease {
            attempt_id: attempt(1),
        },
        success(1, "731"),
    ] {
        let outcome = given(succeeded.history.clone()).when(&command, at_s(60));
        assert!(
            outcome.events().is_empty(),
            "{} must change nothing",
            command.name()
        );
        assert_eq!(
            outcome.scenario.state().external_id(),
            Some(&external("731"))
        );
    }
}

#[test]
fn a_late_refusal_after_success_is_kept_as_evidence_without_regression() {
    let succeeded = in_flight(keyed())
        .when(&success(1, "731"), at_s(1))
        .scenario;
    let refusal = Command::RecordRejection {
        attempt_id: attempt(1),
        code: "500".into(),
        message: "late".into(),
    };
    let outcome = succeeded.when(&refusal, at_s(2));
    assert_eq!(outcome.then_types(), ["LateResponseReceived"]);
    assert_eq!(outcome.status(), "succeeded");
}

#[test]
fn a_different_external_id_for_a_confirmed_operation_is_a_detected_duplicate() {
    let succeeded = unknown_after_first_attempt(lookup_only())
        .when(&reconcile(found("731"), lookup_only(), at_s(20)), at_s(20))
        .scenario;
    let outcome = succeeded.when(&success(1, "732"), at_s(21));
    assert_eq!(
        outcome.then_types(),
        ["LateResponseReceived", "DuplicateDetected"]
    );
    let state = outcome.scenario.state();
    assert_eq!(
        state.external_id(),
        Some(&external("731")),
        "the first confirmed object stays the outcome"
    );
    assert_eq!(state.duplicates, vec![external("732")]);
}

#[test]
fn reconciliation_finding_another_object_for_a_confirmed_operation_is_a_detected_duplicate() {
    let succeeded = in_flight(labelled())
        .when(&success(1, "731"), at_s(1))
        .scenario;
    let outcome = succeeded.when(&reconcile(found("732"), labelled(), at_s(2)), at_s(2));
    assert_eq!(
        outcome.then_types(),
        ["ReconciliationRecorded", "DuplicateDetected"]
    );
    assert_eq!(outcome.status(), "succeeded");
}

#[test]
fn a_late_confirmation_of_attempt_one_while_attempt_two_is_in_flight_settles_it() {
    let retrying = unknown_after_first_attempt(keyed())
        .when(&reconcile(not_found(), keyed(), at_s(20)), at_s(20))
        .and(&start(2, keyed()), at_s(20))
        .scenario;
    let outcome = retrying.when(&success(1, "731"), at_s(21));
    assert_eq!(
        outcome.scenario.state().external_id(),
        Some(&external("731"))
    );
    let outcome = outcome.and(&success(2, "731"), at_s(22));
    assert!(
        outcome.events().is_empty(),
        "the key replayed the same object: nothing new"
    );
}

#[test]
fn the_seed_incident_is_caught_the_lost_response_does_not_become_a_second_task() {
    // The article's story: task 731 was created, its response was lost. With a lookup-only CRM
    // whose search lags 5 s, the empty search right after proves nothing: the operation stays
    // unknown and is looked up again; no second create is ever allowed.
    let outcome = unknown_after_first_attempt(lookup_only())
        .when(&reconcile(not_found(), lookup_only(), at_s(12)), at_s(11));
    assert_eq!(outcome.then_types(), ["ReconciliationRecorded"]);
    let state = outcome.scenario.state();
    assert_eq!(state.status, Status::Unknown);
    assert_eq!(state.next_check_not_before, Some(at_s(12)));
    assert_eq!(state.reconciliations, 1);
    let outcome = outcome.and(&start(2, lookup_only()), at_s(12));
    assert!(matches!(outcome.rejection(), Rejection::NotAllowed { .. }));
    // Once the index has had its lag (unknown at 10 s + 5 s), an empty search ends in review.
    let outcome = outcome
        .scenario
        .when(&reconcile(not_found(), lookup_only(), at_s(16)), at_s(16));
    assert_eq!(
        outcome.then_types(),
        ["ReconciliationRecorded", "ReviewRequired"]
    );
}

#[test]
fn a_lookup_budget_spent_inside_the_search_lag_leaves_its_last_lookup_for_after_the_lag() {
    // policy(): at most 3 lookups; lookup_only(): the search lags 5 s; unknown at 10 s, so the
    // index shows everything from 15 s. Three empty searches within a second prove nothing.
    let mut scenario = unknown_after_first_attempt(lookup_only());
    for at in [11, 11, 12] {
        let outcome = scenario.when(&reconcile(not_found(), lookup_only(), at_s(at)), at_s(at));
        assert_eq!(
            outcome.then_types(),
            ["ReconciliationRecorded"],
            "at {at} s"
        );
        scenario = outcome.scenario;
    }
    // The one that spent the budget put the next check after the lag, not a backoff away.
    let state = scenario.state();
    assert_eq!(state.status, Status::Unknown);
    assert_eq!(state.next_check_not_before, Some(at_s(15)));
    // The last lookup, after the lag: an empty search now means something, and a person decides.
    let outcome = scenario.when(&reconcile(not_found(), lookup_only(), at_s(15)), at_s(15));
    assert_eq!(
        outcome.then_types(),
        ["ReconciliationRecorded", "ReviewRequired"]
    );
}

#[test]
fn a_search_that_finds_the_object_inside_its_lag_settles_it_and_looks_once_more_after_the_lag() {
    // lookup_only(): the search lags 5 s; unknown at 10 s, so the index shows everything from
    // 15 s. The search at 11 s shows one labelled object: evidence, the operation succeeds.
    let scenario = unknown_after_first_attempt(lookup_only())
        .when(&reconcile(found("731"), lookup_only(), at_s(11)), at_s(11))
        .scenario;
    let state = scenario.state();
    assert_eq!(state.external_id(), Some(&external("731")));
    // A second object the search could not show yet would go unseen: one more look is due
    // when the index has caught up, as work for a worker.
    assert_eq!(state.next_check_not_before, Some(at_s(15)));
    assert_eq!(state.next_work(), Some((at_s(15), Work::Reconcile)));
    // After the lag the search shows a second labelled object: a detected duplicate.
    let mut look = reconcile(found("731"), lookup_only(), at_s(15));
    if let Command::RecordReconciliation { duplicates, .. } = &mut look {
        *duplicates = vec![external("732")];
    }
    let outcome = scenario.clone().when(&look, at_s(15));
    assert_eq!(
        outcome.then_types(),
        ["ReconciliationRecorded", "DuplicateDetected"]
    );
    let state = outcome.scenario.state();
    assert_eq!(state.duplicates, vec![external("732")]);
    assert_eq!(state.external_id(), Some(&external("731")), "no regression");
    assert_eq!(state.next_check_not_before, None);
    assert_eq!(state.next_work(), None, "looked once, not again");
}

#[test]
fn the_look_after_the_lag_that_finds_nothing_new_is_recorded_and_not_asked_for_again() {
    let scenario = unknown_after_first_attempt(lookup_only())
        .when(&reconcile(found("731"), lookup_only(), at_s(11)), at_s(11))
        .scenario;
    for result in [found("731"), not_found()] {
        let outcome = scenario
            .clone()
            .when(&reconcile(result, lookup_only(), at_s(16)), at_s(16));
        assert_eq!(outcome.then_types(), ["ReconciliationRecorded"]);
        let state = outcome.scenario.state();
        assert_eq!(state.next_work(), None);
        assert!(state.duplicates.is_empty());
    }
}

#[test]
fn a_search_that_finds_the_object_after_its_lag_settles_it_without_another_look() {
    let outcome = unknown_after_first_attempt(lookup_only())
        .when(&reconcile(found("731"), lookup_only(), at_s(15)), at_s(15));
    assert_eq!(outcome.then_types(), ["ReconciliationRecorded"]);
    assert_eq!(outcome.scenario.state().next_work(), None);
}

#[test]
fn an_inconclusive_lookup_keeps_checking_until_the_lookup_budget_is_spent() {
    // policy(): at most 3 lookups leave the operation unknown.
    let inconclusive = || ReconciliationResult::Inconclusive {
        reason: "503".into(),
    };
    let mut scenario = unknown_after_first_attempt(lookup_only());
    for n in 1..=2 {
        let outcome = scenario.when(
            &reconcile(inconclusive(), lookup_only(), at_s(20)),
            at_s(20),
        );
        assert_eq!(
            outcome.then_types(),
            ["ReconciliationRecorded"],
            "lookup {n}"
        );
        scenario = outcome.scenario;
    }
    let outcome = scenario.when(
        &reconcile(inconclusive(), lookup_only(), at_s(20)),
        at_s(20),
    );
    assert_eq!(
        outcome.then_types(),
        ["ReconciliationRecorded", "ReviewRequired"]
    );
}

#[test]
fn an_inconclusive_lookup_looks_again_before_retrying_even_where_a_retry_would_be_safe() {
    // A keyed provider's lookup fails (a 503): a retry now might race the first request or be
    // refused (spending the attempt budget), so the lookup is made again first.
    let in_progress = || ReconciliationResult::Inconclusive {
        reason: "503 unavailable".into(),
    };
    let mut scenario = unknown_after_first_attempt(keyed());
    for n in 1..=2 {
        let outcome = scenario.when(&reconcile(in_progress(), keyed(), at_s(20)), at_s(20));
        assert_eq!(
            outcome.then_types(),
            ["ReconciliationRecorded"],
            "lookup {n}"
        );
        assert_eq!(outcome.status(), "unknown");
        scenario = outcome.scenario;
    }
    // With the lookup budget spent, the retry contract decides: the same key, sent again.
    let outcome = scenario.when(&reconcile(in_progress(), keyed(), at_s(20)), at_s(20));
    assert_eq!(
        outcome.then_types(),
        ["ReconciliationRecorded", "RetryScheduled"]
    );
    // An authoritative "never arrived" still retries at once.
    let outcome = unknown_after_first_attempt(keyed()).when(
        &reconcile(
            ReconciliationResult::NotFound {
                authoritative: true,
            },
            keyed(),
            at_s(20),
        ),
        at_s(20),
    );
    assert_eq!(
        outcome.then_types(),
        ["ReconciliationRecorded", "RetryScheduled"]
    );
}

#[test]
fn a_request_still_in_progress_is_looked_up_again_and_never_retried_even_with_a_safe_contract() {
    // policy(): at most 3 lookups leave the operation unknown; the keyed contract would allow a
    // retry, which the provider would refuse as in flight or which would race the first request.
    let mut scenario = unknown_after_first_attempt(keyed());
    for n in 1..=2 {
        let outcome = scenario.when(&reconcile_in_progress(keyed(), at_s(20 + n)), at_s(20));
        assert_eq!(
            outcome.then_types(),
            ["ReconciliationRecorded"],
            "lookup {n}"
        );
        assert_eq!(outcome.status(), "unknown");
        assert_eq!(
            outcome.scenario.state().next_check_not_before,
            Some(at_s(20 + n))
        );
        scenario = outcome.scenario;
    }
    let outcome = scenario.when(&reconcile_in_progress(keyed(), at_s(40)), at_s(30));
    assert_eq!(
        outcome.then_types(),
        ["ReconciliationRecorded", "ReviewRequired"],
        "a person, not a retry"
    );
    let reason = outcome
        .scenario
        .state()
        .review_reason
        .clone()
        .unwrap_or_default();
    assert!(
        reason.contains("in progress") && reason.contains("3 lookups"),
        "{reason}"
    );
    assert_eq!(outcome.scenario.state().attempts, 1, "no attempt spent");
}

#[test]
fn a_request_still_in_progress_after_the_total_time_budget_goes_to_a_person() {
    // policy(): retries and waits are allowed for an hour after the first attempt (at 0 s).
    let outcome = unknown_after_first_attempt(keyed())
        .when(&reconcile_in_progress(keyed(), at_s(3_700)), at_s(3_600));
    assert_eq!(
        outcome.then_types(),
        ["ReconciliationRecorded", "ReviewRequired"]
    );
    let reason = outcome
        .scenario
        .state()
        .review_reason
        .clone()
        .unwrap_or_default();
    assert!(reason.contains("time budget"), "{reason}");
}

#[test]
fn a_found_object_settles_the_operation_even_when_the_lookup_was_flagged_in_progress() {
    let mut found_late = reconcile_in_progress(keyed(), at_s(30));
    if let Command::RecordReconciliation { result, .. } = &mut found_late {
        *result = found("731");
    }
    let outcome = unknown_after_first_attempt(keyed()).when(&found_late, at_s(20));
    assert_eq!(
        outcome.scenario.state().external_id(),
        Some(&external("731"))
    );
}

#[test]
fn an_attempt_provably_not_sent_is_pending_again_under_the_conditions_it_was_claimed_under() {
    let not_sent = Command::RecordNotSent {
        attempt_id: attempt(1),
        reason: "429 rate limited".into(),
        retry_not_before: at_s(30),
    };
    let outcome = in_flight(lookup_only()).when(&not_sent, at_s(1));
    assert_eq!(outcome.then_types(), ["AttemptNotSent"]);
    let state = outcome.scenario.state();
    assert_eq!(state.status, Status::Pending);
    assert_eq!(
        state.pending_since,
        Some(crate::state::PendingSince::Recorded)
    );
    assert_eq!(state.retry_not_before, Some(at_s(30)));
    let early = outcome.scenario.when(&start(2, lookup_only()), at_s(29));
    assert_eq!(
        early.rejection(),
        &Rejection::NotYetDue {
            not_before: at_s(30)
        }
    );
    let outcome = early.scenario.when(&start(2, lookup_only()), at_s(30));
    assert_eq!(outcome.then_types(), ["AttemptStarted"]);
}

#[test]
fn a_retry_that_was_not_sent_still_needs_its_contract_on_the_next_claim() {
    let scheduled = unknown_after_first_attempt(keyed())
        .when(&reconcile(not_found(), keyed(), at_s(20)), at_s(20))
        .and(&start(2, keyed()), at_s(20))
        .and(
            &Command::RecordNotSent {
                attempt_id: attempt(2),
                reason: "409 idempotency_in_flight".into(),
                retry_not_before: at_s(21),
            },
            at_s(20),
        )
        .scenario;
    assert_eq!(
        scheduled.state().pending_since,
        Some(crate::state::PendingSince::RetryScheduled)
    );
    let outcome = scheduled.when(&start(3, keyed()), at_s(23 * 3600));
    assert!(matches!(
        outcome.rejection(),
        Rejection::RetryNotAllowed(ContractViolation::KeyRetentionPassed { .. })
    ));
}

// --- refusals after uncertainty, reused ids, bounds --------------------------------------------

#[test]
fn a_refused_retry_after_an_unknown_attempt_leaves_the_operation_unknown_not_rejected() {
    // Attempt 1 timed out; attempt 2 is refused as a duplicate *because* attempt 1 worked.
    let refused = unknown_after_first_attempt(labelled())
        .when(&reconcile(not_found(), labelled(), at_s(20)), at_s(20))
        .and(&start(2, labelled()), at_s(20))
        .and(
            &Command::RecordRejection {
                attempt_id: attempt(2),
                code: "400 DUPLICATE_VALUE".into(),
                message: "label exists".into(),
            },
            at_s(21),
        );
    assert_eq!(refused.then_types(), ["AttemptRejected"]);
    assert_eq!(refused.status(), "unknown");
    let found = refused.and(&reconcile(found("731"), labelled(), at_s(22)), at_s(22));
    assert_eq!(found.scenario.state().external_id(), Some(&external("731")));
}

#[test]
fn a_late_confirmation_settles_a_rejected_or_abandoned_operation() {
    let rejected = in_flight(keyed())
        .when(
            &Command::RecordRejection {
                attempt_id: attempt(1),
                code: "422".into(),
                message: "no".into(),
            },
            at_s(1),
        )
        .scenario;
    let abandoned = needs_review()
        .when(&resolve(ReviewDecision::Abandon), at_s(30))
        .scenario;
    for settled in [rejected, abandoned] {
        let outcome = settled.when(&success(1, "731"), at_s(40));
        assert_eq!(outcome.then_types(), ["LateResponseReceived"]);
        assert_eq!(
            outcome.scenario.state().external_id(),
            Some(&external("731"))
        );
    }
}

#[test]
fn the_same_claim_again_changes_nothing_and_a_reused_attempt_id_is_refused() {
    let again = in_flight(keyed()).when(&start(1, keyed()), at_s(1));
    assert!(again.events().is_empty());
    let reused = unknown_after_first_attempt(keyed())
        .when(&reconcile(not_found(), keyed(), at_s(20)), at_s(20))
        .and(&start(1, keyed()), at_s(20));
    assert!(matches!(reused.rejection(), Rejection::Invalid(error) if error.field == "attempt_id"));
}

#[test]
fn a_schedule_absurdly_far_ahead_is_kept_within_a_week() {
    let far = at_s(10) + chrono::Duration::days(365 * 9000);
    let outcome = in_flight(keyed()).when(
        &Command::RecordNotSent {
            attempt_id: attempt(1),
            reason: "429".into(),
            retry_not_before: far,
        },
        at_s(10),
    );
    let state = outcome.scenario.state();
    assert_eq!(
        state.retry_not_before,
        Some(
            at_s(10) + chrono::Duration::milliseconds(crate::command::MAX_SCHEDULE_AHEAD_MS as i64)
        )
    );
}

#[test]
fn a_denial_of_other_arguments_is_refused() {
    let other = ArgsSnapshot::new(json!({"title": "other"}))
        .expect("valid")
        .hash();
    let deny = Command::DenyApproval {
        principal: None,
        approver: actor("boss"),
        args_hash: other,
        reason: "no".into(),
    };
    assert!(matches!(
        awaiting_approval().when(&deny, at_s(1)).rejection(),
        Rejection::ArgsHashMismatch { .. }
    ));
}

#[test]
fn no_evidence_after_the_retry_time_budget_goes_to_review() {
    // policy(): retries allowed for one hour after the first attempt.
    let late = at_s(3600);
    let outcome = unknown_after_first_attempt(labelled())
        .when(&reconcile(not_found(), labelled(), late), late);
    assert_eq!(
        outcome.then_types(),
        ["ReconciliationRecorded", "ReviewRequired"]
    );
    assert!(outcome
        .scenario
        .state()
        .review_reason
        .is_some_and(|reason| reason.contains("retries were allowed until")));
}

#[test]
fn an_unknown_operation_can_be_handed_to_a_person_directly() {
    let review = Command::RequireReview {
        reason: "lookup keeps failing".into(),
        evidence: "503 x10".into(),
    };
    let outcome = unknown_after_first_attempt(keyed()).when(&review, at_s(20));
    assert_eq!(outcome.status(), "needs_review");
}

#[test]
fn reconciliation_is_refused_before_any_attempt_and_during_review() {
    for scenario in [recorded(), needs_review(), awaiting_approval()] {
        let outcome = scenario.when(&reconcile(not_found(), keyed(), at_s(40)), at_s(40));
        assert!(matches!(
            outcome.rejection(),
            Rejection::NotAllowed {
                command: "record_reconciliation",
                ..
            }
        ));
    }
}

#[test]
fn attempts_provably_not_sent_do_not_use_up_the_attempts_but_the_time_budget_ends_them() {
    // policy(): at most 3 attempts, in an hour.
    let not_sent = |n| Command::RecordNotSent {
        attempt_id: attempt(n),
        reason: "429 rate limited".into(),
        retry_not_before: at_s(0),
    };
    let mut scenario = in_flight(lookup_only())
        .when(&not_sent(1), at_s(1))
        .scenario;
    for n in 2..=3 {
        scenario = scenario
            .when(&start(n, lookup_only()), at_s(2))
            .and(&not_sent(n), at_s(2))
            .scenario;
    }
    // Three 429s risked nothing: a fourth attempt is as safe as the first.
    let fourth = scenario.clone().when(&start(4, lookup_only()), at_s(3));
    assert_eq!(fourth.then_types(), ["AttemptStarted"]);
    // An hour after the first attempt, a person decides.
    let late = scenario.when(&start(4, lookup_only()), at_s(3_600));
    assert!(matches!(
        late.rejection(),
        Rejection::RetryNotAllowed(ContractViolation::TotalTimeExhausted { .. })
    ));
}

// --- connectors: duplicates found by a search, the reviewer's duplicate risk, pauses --------

fn resolve_retry(
    accept_duplicate_risk: bool,
    capabilities: Option<ProviderCapabilities>,
) -> Command {
    Command::ResolveReview {
        principal: None,
        reviewer: actor("operator"),
        decision: ReviewDecision::Retry,
        note: "the CRM was down; retrying".into(),
        accept_duplicate_risk,
        capabilities,
    }
}

#[test]
fn a_search_that_finds_several_objects_records_each_other_one_as_a_duplicate() {
    let mut lookup = reconcile(found("731"), lookup_only(), at_s(20));
    if let Command::RecordReconciliation { duplicates, .. } = &mut lookup {
        *duplicates = vec![
            external("731"),
            external("735"),
            external("735"),
            external("736"),
        ];
    }
    let outcome = unknown_after_first_attempt(lookup_only()).when(&lookup, at_s(20));
    assert_eq!(
        outcome.then_types(),
        [
            "ReconciliationRecorded",
            "DuplicateDetected",
            "DuplicateDetected"
        ]
    );
    assert_eq!(outcome.status(), "succeeded");
    let state = outcome.scenario.state();
    assert_eq!(state.duplicates, vec![external("735"), external("736")]);
}

#[test]
fn a_reviewer_retry_without_deduplication_needs_the_duplicate_risk_accepted() {
    let refused = needs_review().when(&resolve_retry(false, Some(lookup_only())), at_s(30));
    assert!(
        matches!(refused.rejection(), Rejection::DuplicateRiskNotAccepted { why } if why.contains("neither honours")),
        "{:?}",
        refused.result
    );
    let accepted = needs_review().when(&resolve_retry(true, Some(lookup_only())), at_s(30));
    assert_eq!(accepted.status(), "pending");
    let Some(OperationEvent::ReviewResolved(resolved)) = accepted.events().first() else {
        panic!("a ReviewResolved");
    };
    assert!(
        resolved.accept_duplicate_risk,
        "the ledger says the risk was accepted"
    );
}

#[test]
fn a_reviewer_retry_of_an_unknown_contract_needs_the_duplicate_risk_accepted() {
    assert!(matches!(
        needs_review()
            .when(&resolve_retry(false, None), at_s(30))
            .rejection(),
        Rejection::DuplicateRiskNotAccepted { .. }
    ));
}

#[test]
fn a_reviewer_retry_under_a_unique_label_or_a_natural_idempotency_needs_no_acknowledgement() {
    let natural = ProviderCapabilities {
        deduplication: crate::contract::Deduplication::NaturallyIdempotent,
        lookup: crate::contract::LookupSupport::None,
    };
    for capabilities in [labelled(), natural] {
        let outcome = unknown_after_first_attempt(capabilities)
            .when(&resolve_retry(false, Some(capabilities)), at_s(30));
        assert_eq!(outcome.status(), "pending", "{capabilities:?}");
        let Some(OperationEvent::ReviewResolved(resolved)) = outcome.events().first() else {
            panic!("a ReviewResolved");
        };
        assert!(!resolved.accept_duplicate_risk);
    }
}

#[test]
fn a_reviewer_retry_of_a_key_past_its_retention_needs_the_duplicate_risk_accepted() {
    let day_s = 24 * 3600;
    let inside =
        unknown_after_first_attempt(keyed()).when(&resolve_retry(false, Some(keyed())), at_s(60));
    assert_eq!(
        inside.status(),
        "pending",
        "inside the retention the key makes it safe"
    );
    let past = unknown_after_first_attempt(keyed())
        .when(&resolve_retry(false, Some(keyed())), at_s(day_s));
    assert!(
        matches!(past.rejection(), Rejection::DuplicateRiskNotAccepted { why } if why.contains("only safe until")),
        "{:?}",
        past.result
    );
}

#[test]
fn the_flag_is_recorded_only_on_a_retry() {
    let command = Command::ResolveReview {
        principal: None,
        reviewer: actor("operator"),
        decision: ReviewDecision::Abandon,
        note: "not needed any more".into(),
        accept_duplicate_risk: true,
        capabilities: None,
    };
    let outcome = needs_review().when(&command, at_s(30));
    let Some(OperationEvent::ReviewResolved(resolved)) = outcome.events().first() else {
        panic!("a ReviewResolved");
    };
    assert!(!resolved.accept_duplicate_risk);
}

#[test]
fn an_unknown_outcome_with_a_pause_asked_is_not_looked_up_before_it() {
    let command = Command::RecordUnknown {
        attempt_id: crate::testing::attempt(1),
        error: "503 internal".into(),
        check_not_before: Some(at_s(70)),
    };
    let outcome = in_flight(lookup_only()).when(&command, at_s(10));
    assert_eq!(outcome.status(), "unknown");
    assert_eq!(
        outcome.scenario.state().next_check_not_before,
        Some(at_s(70))
    );
    let without = in_flight(lookup_only()).when(&unknown(1), at_s(10));
    assert_eq!(without.scenario.state().next_check_not_before, None);
}

// --- lookup claims ----------------------------------------------------------------------------

/// `name` claims the lookup, with a lease of 5 s.
fn claim_lookup(name: &str) -> Command {
    Command::ClaimLookup {
        budget_wait: None,
        worker: worker(name),
        lease_ms: 5_000,
    }
}

#[test]
fn a_due_unknown_operation_is_claimed_for_a_lookup_and_is_not_due_again_until_the_lease_runs_out() {
    let outcome = unknown_after_first_attempt(keyed()).when(&claim_lookup("serve-1"), at_s(20));
    assert_eq!(outcome.then_types(), vec!["LookupClaimed"]);
    assert_eq!(outcome.status(), "unknown");
    let state = outcome.scenario.state();
    assert_eq!(
        state.lookup_claim.as_ref().map(|claim| &claim.worker),
        Some(&worker("serve-1"))
    );
    assert_eq!(state.next_work(), Some((at_s(25), Work::Reconcile)));
}

#[test]
fn a_second_worker_is_refused_the_lookup_while_the_first_ones_claim_holds() {
    let claimed = unknown_after_first_attempt(keyed())
        .when(&claim_lookup("serve-1"), at_s(20))
        .scenario;
    for claimant in ["serve-2", "serve-1"] {
        let outcome = claimed.clone().when(&claim_lookup(claimant), at_s(24));
        assert_eq!(
            outcome.rejection(),
            &Rejection::LookupClaimed {
                worker: worker("serve-1"),
                lease_deadline: at_s(25),
            },
            "{claimant} is refused: one lookup in flight at a time"
        );
    }
}

#[test]
fn a_claim_whose_lease_ran_out_is_taken_over_by_another_worker() {
    let outcome = unknown_after_first_attempt(keyed())
        .when(&claim_lookup("serve-1"), at_s(20))
        .and(&claim_lookup("serve-2"), at_s(25));
    assert_eq!(outcome.then_types(), vec!["LookupClaimed"]);
    let state = outcome.scenario.state();
    assert_eq!(
        state.lookup_claim.map(|claim| claim.worker),
        Some(worker("serve-2"))
    );
}

#[test]
fn a_recorded_lookup_ends_the_claim_and_the_next_round_is_anyones() {
    let outcome = unknown_after_first_attempt(lookup_only())
        .when(&claim_lookup("serve-1"), at_s(11))
        .and(&reconcile(not_found(), lookup_only(), at_s(12)), at_s(11));
    assert_eq!(outcome.then_types(), vec!["ReconciliationRecorded"]);
    let state = outcome.scenario.state();
    assert_eq!(state.lookup_claim, None);
    assert_eq!(state.next_work(), Some((at_s(12), Work::Reconcile)));
    let next = outcome.scenario.when(&claim_lookup("serve-2"), at_s(12));
    assert_eq!(next.then_types(), vec!["LookupClaimed"]);
}

#[test]
fn a_lookup_recorded_by_a_worker_the_claim_did_not_name_is_evidence_all_the_same() {
    // The claim decides who asks the provider, never what its answer means: the answer of a
    // claimant whose lease ran out meanwhile still settles the operation.
    let outcome = unknown_after_first_attempt(labelled())
        .when(&claim_lookup("serve-1"), at_s(20))
        .and(&claim_lookup("serve-2"), at_s(26))
        .and(&reconcile(found("731"), labelled(), at_s(27)), at_s(27));
    assert_eq!(outcome.status(), "succeeded");
    assert_eq!(outcome.scenario.state().lookup_claim, None);
}

#[test]
fn a_lookup_is_not_claimed_before_it_is_due_nor_for_an_operation_that_is_not_unknown() {
    let outcome = in_flight(keyed()).when(&claim_lookup("serve-1"), at_s(1));
    assert_eq!(
        outcome.rejection(),
        &Rejection::NotAllowed {
            command: "claim_lookup",
            status: "in_flight"
        }
    );
    let outcome = unknown_after_first_attempt(lookup_only())
        .when(
            &reconcile(
                ReconciliationResult::Inconclusive {
                    reason: "503".into(),
                },
                lookup_only(),
                at_s(30),
            ),
            at_s(20),
        )
        .and(&claim_lookup("serve-1"), at_s(21));
    assert_eq!(
        outcome.rejection(),
        &Rejection::NotYetDue {
            not_before: at_s(30)
        }
    );
}

#[test]
fn a_lookup_claim_with_a_lease_out_of_range_is_refused_naming_the_field() {
    let outcome = unknown_after_first_attempt(keyed()).when(
        &Command::ClaimLookup {
            budget_wait: None,
            worker: worker("serve-1"),
            lease_ms: 1,
        },
        at_s(20),
    );
    assert!(
        matches!(outcome.rejection(), Rejection::Invalid(error) if error.field == "lease_ms"),
        "{:?}",
        outcome.rejection()
    );
}

#[test]
fn a_person_deciding_an_unknown_operation_ends_a_lookup_claim() {
    let outcome = unknown_after_first_attempt(keyed())
        .when(&claim_lookup("serve-1"), at_s(20))
        .and(
            &Command::RequireReview {
                reason: "looks odd".into(),
                evidence: String::new(),
            },
            at_s(21),
        );
    assert_eq!(outcome.status(), "needs_review");
    assert_eq!(outcome.scenario.state().lookup_claim, None);
}

/// `name` puts the lookup off until `not_before`: the account has no access token.
fn postpone_lookup(name: &str, not_before: DateTime<Utc>) -> Command {
    Command::PostponeLookup {
        worker: worker(name),
        reason: "account `acct-1` has no access token: invalid_grant; nothing was asked".into(),
        not_before,
    }
}

#[test]
fn a_postponed_lookup_stays_unknown_counts_no_lookup_and_is_due_again_after_the_wait() {
    // policy(): at most 3 lookups. Ten postponements (credentials refused for a long time)
    // count none, so the operation stays unknown and is looked up when the token is back.
    let mut scenario = unknown_after_first_attempt(lookup_only());
    for n in 0..10 {
        let claimed = scenario.when(&claim_lookup("serve-1"), at_s(n * 60 + 20));
        let outcome = claimed.scenario.when(
            &postpone_lookup("serve-1", at_s(n * 60 + 80)),
            at_s(n * 60 + 21),
        );
        assert_eq!(outcome.then_types(), vec!["LookupPostponed"]);
        assert_eq!(outcome.status(), "unknown");
        scenario = outcome.scenario;
    }
    let state = scenario.state();
    assert_eq!(state.reconciliations, 0, "nothing was asked");
    assert_eq!(state.lookup_claim, None, "the claim has served its purpose");
    assert_eq!(state.next_work(), Some((at_s(620), Work::Reconcile)));
    assert!(state
        .last_error
        .as_deref()
        .is_some_and(|reason| reason.starts_with("lookup waiting: account `acct-1`")));
    let found = scenario.when(&claim_lookup("serve-2"), at_s(620)).and(
        &reconcile(found("task-9"), lookup_only(), at_s(621)),
        at_s(621),
    );
    assert_eq!(found.status(), "succeeded");
}

#[test]
fn a_lookup_is_postponed_without_a_claim_but_never_under_another_workers_claim() {
    let unknown = unknown_after_first_attempt(keyed());
    let unclaimed = unknown
        .clone()
        .when(&postpone_lookup("serve-2", at_s(80)), at_s(20));
    assert_eq!(unclaimed.then_types(), vec!["LookupPostponed"]);
    let claimed = unknown.when(&claim_lookup("serve-1"), at_s(20)).scenario;
    let outcome = claimed.when(&postpone_lookup("serve-2", at_s(80)), at_s(21));
    assert_eq!(
        outcome.rejection(),
        &Rejection::LookupClaimed {
            worker: worker("serve-1"),
            lease_deadline: at_s(25),
        },
        "serve-1 is asking; its answer is recorded, not put off by another worker"
    );
}

#[test]
fn only_an_unknown_operations_lookup_is_postponed() {
    let outcome = in_flight(lookup_only()).when(&postpone_lookup("serve-1", at_s(60)), at_s(1));
    assert!(matches!(outcome.rejection(), Rejection::NotAllowed { .. }));
    let outcome = recorded().when(&postpone_lookup("serve-1", at_s(60)), at_s(1));
    assert!(matches!(outcome.rejection(), Rejection::NotAllowed { .. }));
}

// --- credentials and budgets: what a send needs before its claim ------------------------------

fn postpone(not_before: DateTime<Utc>) -> Command {
    Command::PostponeSend {
        reason: "account `acct-1` has no access token: invalid_grant; fix the account's OAuth2 credentials".into(),
        not_before,
    }
}

#[test]
fn a_postponed_send_stays_pending_with_its_reason_and_uses_up_no_attempt() {
    // policy(): at most 3 attempts. Ten postponements (credentials refused for a long time)
    // start none, so the first attempt after them is still allowed.
    let mut scenario = recorded();
    for n in 0..10 {
        let outcome = scenario.when(&postpone(at_s(n * 60 + 60)), at_s(n * 60));
        assert_eq!(outcome.then_types(), vec!["SendPostponed"]);
        assert_eq!(outcome.status(), "pending");
        scenario = outcome.scenario;
    }
    let state = scenario.state();
    assert_eq!(state.attempts, 0);
    assert_eq!(state.first_attempt_at, None, "nothing was sent");
    assert_eq!(state.next_work(), Some((at_s(600), Work::Send)));
    assert!(state
        .last_error
        .as_deref()
        .is_some_and(|reason| reason.starts_with("waiting: account `acct-1`")));
    // Not before its time; then claimed as attempt 1.
    let early = scenario.clone().when(&start(1, lookup_only()), at_s(599));
    assert!(matches!(early.rejection(), Rejection::NotYetDue { .. }));
    let claimed = scenario.when(&start(1, lookup_only()), at_s(600));
    assert_eq!(claimed.status(), "in_flight");
}

#[test]
fn only_a_pending_send_is_postponed() {
    let outcome = in_flight(lookup_only()).when(&postpone(at_s(60)), at_s(1));
    assert!(matches!(outcome.rejection(), Rejection::NotAllowed { .. }));
    let outcome = awaiting_approval().when(&postpone(at_s(60)), at_s(1));
    assert!(matches!(outcome.rejection(), Rejection::NotAllowed { .. }));
}

#[test]
fn a_budget_wait_is_recorded_with_the_claim_it_preceded() {
    let wait = crate::event::BudgetWait {
        account: AccountId::new("acct-1").expect("valid"),
        budget: "sends".into(),
        waited_ms: 1_250,
    };
    let mut claim = start(1, lookup_only());
    if let Command::StartAttempt {
        request: None,
        budget_wait,
        ..
    } = &mut claim
    {
        *budget_wait = Some(wait.clone());
    }
    let outcome = recorded().when(&claim, at_s(1));
    let OperationEvent::AttemptStarted(started) = &outcome.events()[0] else {
        panic!("a claim: {:?}", outcome.events());
    };
    assert_eq!(started.budget_wait, Some(wait.clone()));
    assert_eq!(wait.to_string(), "waited 1.2 s for acct-1's send budget");
}
