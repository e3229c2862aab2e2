//! `GET /v1/operations/{id}?as_of=`: an operation as it stood at a past moment. The test watches
//! a live server through a history with lost requests, lost responses, reconciliation and
//! retries, keeps every answer the live service gave, and afterwards asks for each one again as
//! of its moment — by the position of its last event, by a random position before the next
//! event of its stream, and by its time — expecting the very same answer, member for member.

use std::collections::BTreeMap;
use std::time::Duration;

use opledger_crm_stand::{FaultKind, Shape};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::support::{Harness, Server, TENANT_A_TOKEN, TENANT_B_TOKEN};

/// What the live service answered for an operation.
struct Seen {
    id: String,
    view: Value,
}

async fn live(server: &Server, id: &str) -> Value {
    let (status, view) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{id}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{view}");
    view
}

async fn as_of(server: &Server, id: &str, moment: &str) -> (StatusCode, Value) {
    server
        .call(
            Method::GET,
            &format!("/v1/operations/{id}?as_of={}", moment.replace('+', "%2B")),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await
}

/// Watches `ids` until each has answered one of `settled` states, keeping every distinct answer.
async fn watch(server: &Server, ids: &[String], settled: &[&str], seen: &mut Vec<Seen>) {
    for _ in 0..400 {
        let mut all_settled = true;
        for id in ids {
            let view = live(server, id).await;
            all_settled &= settled.contains(&view["state"].as_str().unwrap_or_default());
            let new = seen
                .iter()
                .rev()
                .find(|earlier| &earlier.id == id)
                .is_none_or(|earlier| earlier.view != view);
            if new {
                seen.push(Seen {
                    id: id.clone(),
                    view,
                });
            }
        }
        if all_settled {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the operations did not settle in {settled:?}");
}

/// Each version of the operation's stream and the global position it was written at.
async fn positions(server: &Server, id: &str) -> BTreeMap<u64, u64> {
    let (status, history) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{id}/events"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{history}");
    history["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|event| {
            (
                event["version"].as_u64().expect("a version"),
                event["position"].as_u64().expect("a position"),
            )
        })
        .collect()
}

/// A small seeded generator (the test must be repeatable, not clever).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound.max(1)
    }
}

#[tokio::test]
async fn as_of_any_moment_answers_what_the_live_service_answered_then() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let mut seen = Vec::new();
    let mut ids = Vec::new();

    // A plain success, a lost response the key makes safe to retry, a lost request on a
    // lookup-only CRM (reconciled, then retried or reviewed), and one left to the workers.
    harness
        .fault(Shape::Keyed, FaultKind::DropResponse, 1)
        .await;
    for (provider, title) in [
        ("crm", "Call the client"),
        ("crm", "Send the contract"),
        ("crm-plain", "Book the meeting"),
    ] {
        if provider == "crm-plain" {
            harness.fault(Shape::Plain, FaultKind::DropRequest, 1).await;
        }
        let (status, recorded) = server.record(TENANT_A_TOKEN, provider, title, None).await;
        assert_eq!(status, StatusCode::CREATED, "{recorded}");
        let id = recorded["operation_id"].as_str().expect("an id").to_owned();
        seen.push(Seen {
            id: id.clone(),
            view: live(&server, &id).await,
        });
        let _ = server.execute(TENANT_A_TOKEN, &id, 200).await;
        ids.push(id);
    }
    watch(
        &server,
        &ids,
        &["succeeded", "needs_review", "rejected"],
        &mut seen,
    )
    .await;
    let states: std::collections::BTreeSet<&str> = seen
        .iter()
        .filter_map(|seen| seen.view["state"].as_str())
        .collect();
    assert!(
        seen.len() >= 6 && states.len() >= 3,
        "a history with several steps: {} answers in states {states:?}",
        seen.len()
    );

    let mut random = Lcg(7);
    let head = server.log_head().await;
    for Seen { id, view } in &seen {
        let versions = positions(&server, id).await;
        let version = view["version"].as_u64().expect("a version");
        let at = versions[&version];
        let (status, then) = as_of(&server, id, &at.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{then}");
        assert_eq!(&then, view, "as of position {at}");

        // Any moment before the stream's next event shows the same.
        let next = versions.get(&(version + 1)).copied().unwrap_or(head + 1);
        let moment = at + random.below(next - at);
        let (_, then) = as_of(&server, id, &moment.to_string()).await;
        assert_eq!(&then, view, "as of position {moment} (before {next})");

        let time = view["updated_at"].as_str().expect("a time");
        let (_, then) = as_of(&server, id, time).await;
        assert_eq!(&then, view, "as of {time}");
    }
}

#[tokio::test]
async fn as_of_before_the_intent_is_not_found_and_a_bad_moment_is_refused() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let (_, first) = server.record(TENANT_A_TOKEN, "crm", "First", None).await;
    let (_, second) = server.record(TENANT_A_TOKEN, "crm", "Second", None).await;
    let first_id = first["operation_id"].as_str().expect("an id");
    let second_id = second["operation_id"].as_str().expect("an id");
    let first_position = positions(&server, first_id).await[&0];

    let (status, body) = as_of(&server, second_id, &first_position.to_string()).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = as_of(&server, second_id, "2000-01-01T00:00:00Z").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    for bad in ["yesterday", "0", "-3", "2026-13-01T00:00:00Z"] {
        let (status, body) = as_of(&server, first_id, bad).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains("as_of")),
            "{bad}: {body}"
        );
    }

    // Another tenant's operation stays invisible at every moment.
    let (status, _) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{first_id}?as_of={first_position}"),
            Some(TENANT_B_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
