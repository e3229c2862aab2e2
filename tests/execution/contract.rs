//! The binding and the retry contract: a send goes only to the account the operation is bound
//! to, with the credentials it was recorded with, and a retry only while the provider still
//! remembers the key. Otherwise a person decides, and nothing reaches the CRM.

use chrono::Duration as ChronoDuration;
use opledger_crm_stand::FaultKind;
use opledger_domain::event::{OperationEvent, ReconciliationResult};
use opledger_domain::state::Status;

use super::support::{
    names, settle, wait_until, Crm, Harness, Setup, ACCOUNT, ACCOUNT_TOKEN, OTHER_ACCOUNT,
    OTHER_ACCOUNT_TOKEN, WORKER,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_whose_crm_account_was_switched_goes_to_a_person_and_nothing_is_sent() {
    let h = Harness::start().await;
    let recorded = h.record(h.request(Crm::Keyed, Some("toolcall-1"))).await;
    let intent = recorded.intent();
    // The configuration changed: the provider now acts only in the other account.
    let switched = h.engine_with(
        h.setup
            .providers(&h.base_url(), &[(OTHER_ACCOUNT, OTHER_ACCOUNT_TOKEN)]),
        WORKER,
    );

    let report = settle(&switched, intent.operation_id).await;

    assert_eq!(report.state().status, Status::NeedsReview);
    let reason = report
        .state()
        .review_reason
        .clone()
        .expect("a review has a reason");
    assert!(reason.contains(ACCOUNT), "{reason}");
    assert!(h.requests().await.is_empty(), "no request reached the CRM");
    assert!(h.objects_in(ACCOUNT).await.is_empty());
    assert!(h.objects_in(OTHER_ACCOUNT).await.is_empty());
    assert_eq!(
        h.event_names(intent.operation_id).await,
        ["IntentRecorded", "ReviewRequired"]
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_whose_account_credentials_changed_goes_to_a_person_and_nothing_is_sent() {
    let h = Harness::start().await;
    let recorded = h.record(h.request(Crm::Keyed, Some("toolcall-1"))).await;
    let intent = recorded.intent();
    let rotated = h.engine_with(
        h.setup.providers(
            &h.base_url(),
            &[(ACCOUNT, &format!("{ACCOUNT_TOKEN}-rotated"))],
        ),
        WORKER,
    );

    let report = settle(&rotated, intent.operation_id).await;

    assert_eq!(report.state().status, Status::NeedsReview);
    let reason = report
        .state()
        .review_reason
        .clone()
        .expect("a review has a reason");
    assert!(
        reason.contains("credentials") && reason.contains(ACCOUNT),
        "{reason}"
    );
    assert!(h.requests().await.is_empty(), "no request reached the CRM");
    assert!(h.objects_in(ACCOUNT).await.is_empty());
    assert_eq!(
        h.event_names(intent.operation_id).await,
        ["IntentRecorded", "ReviewRequired"]
    );
    h.finish().await;
}

/// A keyed provider that remembers keys for 2 s, of which the ledger may use 1 s.
fn short_key_retention() -> Setup {
    Setup {
        stand_key_retention_s: 2,
        key_retention_s: 2,
        key_safety_margin_s: 1,
        ..Setup::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_past_its_retention_is_not_retried_even_when_the_lookup_finds_nothing() {
    let h = Harness::with(short_key_retention()).await;
    h.queue(Crm::Keyed.create_fault(FaultKind::DropRequest))
        .await;
    let recorded = h.record(h.request(Crm::Keyed, Some("toolcall-1"))).await;
    let intent = recorded.intent();
    let operation_id = intent.operation_id;
    // The first attempt ends unknown, and its worker stops before it looks the operation up.
    let unknown = h.first_attempt_left_unknown(operation_id).await;

    // Wait until the usable part of the key's retention has passed.
    let first_sent_at = unknown.first_attempt_at.expect("the key was sent once");
    let usable = ChronoDuration::seconds(
        i64::try_from(h.setup.key_retention_s - h.setup.key_safety_margin_s).expect("small"),
    );
    wait_until(first_sent_at + usable + ChronoDuration::milliseconds(50)).await;
    let report = h.drive(operation_id).await;

    assert_eq!(report.state().status, Status::NeedsReview);
    let reason = report
        .state()
        .review_reason
        .clone()
        .expect("a review has a reason");
    assert!(reason.contains("idempotency key"), "{reason}");
    assert!(
        h.objects_for(Crm::Keyed, intent).await.is_empty(),
        "no blind retry, no task"
    );
    assert_eq!(h.creates(Crm::Keyed).await.len(), 1);
    assert_eq!(h.lookups().await.len(), 1, "the key was looked up");
    let events = h.events(operation_id).await;
    assert_eq!(
        names(&events),
        [
            "IntentRecorded",
            "AttemptStarted",
            "OutcomeUnknown",
            "LookupClaimed",
            "ReconciliationRecorded",
            "ReviewRequired",
        ]
    );
    assert!(
        matches!(
            &events[4],
            OperationEvent::ReconciliationRecorded(reconciled)
                if reconciled.result == ReconciliationResult::NotFound { authoritative: true }
        ),
        "{:?}",
        events[4]
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_scheduled_inside_the_key_retention_is_checked_again_before_it_is_sent() {
    // The key is usable for 2 s after the first send; the retry's backoff is longer than that.
    let mut setup = Setup {
        stand_key_retention_s: 3,
        key_retention_s: 3,
        key_safety_margin_s: 1,
        ..Setup::default()
    };
    setup.policy.backoff_base_ms = 5_000;
    setup.policy.backoff_max_ms = 5_000;
    let h = Harness::with(setup).await;
    h.queue(Crm::Keyed.create_fault(FaultKind::DropRequest))
        .await;
    let recorded = h.record(h.request(Crm::Keyed, Some("toolcall-1"))).await;
    let intent = recorded.intent();

    let report = h.settle(intent.operation_id).await;

    assert_eq!(report.state().status, Status::NeedsReview);
    let reason = report
        .state()
        .review_reason
        .clone()
        .expect("a review has a reason");
    assert!(
        reason.contains("not safe any more") && reason.contains("idempotency key"),
        "{reason}"
    );
    assert!(h.objects_for(Crm::Keyed, intent).await.is_empty());
    assert_eq!(h.creates(Crm::Keyed).await.len(), 1, "no second send");
    let events = h.events(intent.operation_id).await;
    assert_eq!(
        names(&events),
        [
            "IntentRecorded",
            "AttemptStarted",
            "OutcomeUnknown",
            "LookupClaimed",
            "ReconciliationRecorded",
            "RetryScheduled",
            "ReviewRequired",
        ]
    );
    // The retry was allowed when it was scheduled, and due only after the key's usable window.
    let (OperationEvent::AttemptStarted(started), OperationEvent::RetryScheduled(retry)) =
        (&events[1], &events[5])
    else {
        panic!("{events:?}");
    };
    assert!(retry.at < started.at + ChronoDuration::seconds(2));
    assert!(retry.not_before > started.at + ChronoDuration::seconds(2));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_attempts_sent_nothing_so_they_do_not_use_up_the_attempts_allowed() {
    let h = Harness::start().await;
    let max_attempts = h.setup.policy.retry.max_attempts;
    // As many 429s as the policy allows attempts: each provably sent nothing.
    h.queue(
        Crm::Keyed
            .create_fault(FaultKind::RateLimit {
                retry_after_s: 0,
                retry_after_http_date: false,
            })
            .times(max_attempts),
    )
    .await;
    let recorded = h.record(h.request(Crm::Keyed, Some("toolcall-1"))).await;
    let intent = recorded.intent();

    let report = h.settle(intent.operation_id).await;

    assert_eq!(
        report.state().status.name(),
        "succeeded",
        "{:?}",
        report.state()
    );
    assert_eq!(report.state().attempts, max_attempts + 1);
    assert_eq!(h.objects_for(Crm::Keyed, intent).await.len(), 1);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crm_that_keeps_rate_limiting_goes_to_a_person_when_the_time_budget_ends_saying_a_retry_is_safe(
) {
    let mut setup = Setup::default();
    setup.policy.retry.max_total_ms = opledger_domain::contract::MIN_TOTAL_MS;
    let h = Harness::with(setup).await;
    h.queue(
        Crm::Keyed
            .create_fault(FaultKind::RateLimit {
                retry_after_s: 0,
                retry_after_http_date: false,
            })
            .times(1_000),
    )
    .await;
    let recorded = h.record(h.request(Crm::Keyed, Some("toolcall-1"))).await;
    let intent = recorded.intent();

    let report = h.settle(intent.operation_id).await;

    assert_eq!(report.state().status, Status::NeedsReview);
    let reason = report.state().review_reason.clone().unwrap_or_default();
    assert!(
        !reason.contains("not safe")
            && reason.contains("a retry is safe, since nothing reached the provider"),
        "{reason}"
    );
    assert!(h.objects_for(Crm::Keyed, intent).await.is_empty());
    let names = h.event_names(intent.operation_id).await;
    assert!(!names.contains(&"OutcomeUnknown"), "{names:?}");
    assert_eq!(names.last(), Some(&"ReviewRequired"), "{names:?}");
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_refused_for_revoked_credentials_goes_to_a_person_at_once_and_is_not_repeated() {
    let h = Harness::start().await;
    h.queue(Crm::Keyed.create_fault(FaultKind::DropResponse))
        .await;
    let recorded = h.record(h.request(Crm::Keyed, Some("toolcall-1"))).await;
    let operation_id = recorded.intent().operation_id;
    h.first_attempt_left_unknown(operation_id).await;
    // The token is revoked at the CRM after the send: every lookup with it answers 401.
    h.admin
        .set_account_token(ACCOUNT, &format!("{ACCOUNT_TOKEN}-revoked"))
        .await
        .expect("the stand takes the new token");

    let report = h.drive(operation_id).await;

    assert_eq!(report.state().status, Status::NeedsReview);
    let reason = report.state().review_reason.clone().unwrap_or_default();
    assert!(
        reason.contains("credentials") && reason.contains("401") && reason.contains(ACCOUNT),
        "{reason}"
    );
    let lookups = h.lookups().await;
    assert_eq!(lookups.len(), 1, "asked once: {lookups:?}");
    assert_eq!(h.creates(Crm::Keyed).await.len(), 1, "no retry");
    assert_eq!(
        h.event_names(operation_id).await,
        [
            "IntentRecorded",
            "AttemptStarted",
            "OutcomeUnknown",
            "LookupClaimed",
            "ReviewRequired"
        ]
    );
    h.finish().await;
}
