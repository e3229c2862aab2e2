//! Claims on review items across `opledger serve` instances sharing one ledger, and across a
//! restart: a claim taken on one instance is refused to a second operator on another, names its
//! holder, stops the second operator's decision, and is still there when every instance that saw
//! it taken has been killed. On the SQLite ledger (two processes on one file, the claims in the
//! file beside it) and on PostgreSQL (the claims in the shared database).

use opledger_crm_stand::{FaultKind, Shape};
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{Harness, DEADLINE, OPERATOR_TOKEN, TENANT_A_TOKEN};

const SECOND_OPERATOR_TOKEN: &str = "second-operator-0123456789";

/// Every instance's configuration: the harness's with a second operator for tenant A.
fn instance(harness: &Harness, n: usize) -> std::path::PathBuf {
    harness.instance_config(
        n,
        &[(
            "[[approvers]]",
            &format!(
                "[[operators]]\nid = \"second-operator\"\ntoken = \"{SECOND_OPERATOR_TOKEN}\"\ntenants = [\"tenant-a\"]\n\n[[approvers]]"
            ),
        )],
    )
}

async fn a_claim_is_seen_by_every_instance_and_outlives_them(harness: Harness) {
    let first = harness.serve_with(&instance(&harness, 0));
    let second = harness.serve_with(&instance(&harness, 1));
    harness.fault(Shape::Plain, FaultKind::DropRequest, 1).await;
    let (_, recorded) = first
        .record(TENANT_A_TOKEN, "crm-plain", "Call the client", None)
        .await;
    let id = recorded["operation_id"].as_str().expect("an id").to_owned();
    first.execute(TENANT_A_TOKEN, &id, 200).await;
    first
        .wait_for_state(TENANT_A_TOKEN, &id, &["needs_review"])
        .await;

    let claim = format!("/v1/review/{id}/claim");
    let (status, taken) = first
        .post(&claim, OPERATOR_TOKEN, &json!({"lease_s": 600}))
        .await;
    assert_eq!(status, StatusCode::OK, "{taken}");
    assert_eq!(taken["claim"]["holder"], "oncall", "{taken}");

    let (status, refused) = second.post(&claim, SECOND_OPERATOR_TOKEN, &json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"]["code"], "claimed", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("oncall")),
        "the refusal names who holds it: {refused}"
    );
    let decide = format!("/v1/operations/{id}/review");
    let abandon = json!({"decision": "abandon", "note": "duplicate of the CRM's own task"});
    let (status, refused) = second.post(&decide, SECOND_OPERATOR_TOKEN, &abandon).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"]["code"], "claimed", "{refused}");
    // The other instance's read models follow the shared log on their own: wait for the item.
    let deadline = std::time::Instant::now() + DEADLINE;
    let item = loop {
        let (status, item) = second
            .call(
                Method::GET,
                &format!("/v1/review/{id}"),
                Some(SECOND_OPERATOR_TOKEN),
                None,
            )
            .await;
        if status == StatusCode::OK || std::time::Instant::now() > deadline {
            break item;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(item["claim"]["holder"], "oncall", "shown to others: {item}");

    // Every instance that saw the claim taken dies; one started afterwards still refuses.
    first.kill();
    second.kill();
    let third = harness.serve_with(&instance(&harness, 2));
    let (status, refused) = third.post(&claim, SECOND_OPERATOR_TOKEN, &json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("oncall")),
        "{refused}"
    );
    // The holder decides; the decision ends the case for everyone.
    let (status, decided) = third.post(&decide, OPERATOR_TOKEN, &abandon).await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    assert_eq!(decided["state"], "abandoned", "{decided}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_a_sqlite_ledger_is_refused_to_a_second_instances_operator_and_survives_a_restart(
) {
    a_claim_is_seen_by_every_instance_and_outlives_them(Harness::new("").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_a_postgres_ledger_is_refused_to_a_second_instances_operator_and_survives_a_restart(
) {
    let server = crate::postgres_server::server();
    let url = server.url(&server.database());
    a_claim_is_seen_by_every_instance_and_outlives_them(Harness::with_store("", Some(url)).await)
        .await;
}
