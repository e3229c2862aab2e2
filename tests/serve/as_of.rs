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
        assert_eq!(
            then["as_of_position"], at,
            "the answer names its position: {then}"
        );
        assert_eq!(&without_position(&then), view, "as of position {at}");
        // The CLI answers with the API's object, sentence and all.
        assert_eq!(
            ops_show(&harness, id, &at.to_string()),
            then,
            "ops show --as-of {at}"
        );

        // Any moment before the stream's next event shows the same.
        let next = versions.get(&(version + 1)).copied().unwrap_or(head + 1);
        let moment = at + random.below(next - at);
        let (_, then) = as_of(&server, id, &moment.to_string()).await;
        assert_eq!(
            &without_position(&then),
            view,
            "as of position {moment} (before {next})"
        );

        let time = view["updated_at"].as_str().expect("a time");
        let (_, then) = as_of(&server, id, time).await;
        assert_eq!(&without_position(&then), view, "as of {time}");
        assert!(then["as_of_position"].as_u64().is_some(), "{then}");
    }
}

/// An answer as of a moment without the position it names, to compare with a live answer.
fn without_position(value: &Value) -> Value {
    let mut value = value.clone();
    if let Some(members) = value.as_object_mut() {
        members.remove("as_of_position");
    }
    value
}

/// `opledger ops show --json` of `id` as of `moment`, on the server's ledger and configuration.
fn ops_show(harness: &Harness, id: &str, moment: &str) -> Value {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["ops", "show", "--json", "--as-of", moment, "--db"])
        .arg(harness.dir.path().join("ledger.db"))
        .arg("--config")
        .arg(&harness.config)
        .arg(id)
        .env_remove("OPLEDGER_DB")
        .output()
        .expect("the opledger binary runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("ops show --json prints JSON")
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

    // Past the head, or later than now: refused, naming what may be asked; never "now".
    let head = server.log_head().await;
    let (status, body) = as_of(&server, first_id, &(head + 1).to_string()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains(&format!("newest position {head}"))),
        "{body}"
    );
    let (status, body) = as_of(&server, first_id, "2999-01-01T00:00:00Z").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    // Refused in words of what was expected, not the parser's.
    let (_, body) = as_of(&server, first_id, "abc").await;
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        !message.contains("premature")
            && message.contains("neither a position nor an RFC 3339 time"),
        "{body}"
    );

    // The history and the trace are cut at the moment too, and say where.
    for path in [
        format!("/v1/operations/{first_id}/events?as_of={first_position}"),
        format!("/v1/trace/{first_id}?as_of={first_position}"),
    ] {
        let (status, body) = server
            .call(Method::GET, &path, Some(TENANT_A_TOKEN), None)
            .await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        assert_eq!(body["as_of_position"], first_position, "{path}: {body}");
        assert_eq!(
            body["events"].as_array().map(Vec::len),
            Some(1),
            "{path}: {body}"
        );
    }
    let (status, body) = server
        .call(
            Method::GET,
            &format!("/v1/trace/{second_id}?as_of={first_position}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "not recorded yet then: {body}"
    );

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

/// What the live service listed while the log stood still at `head`: the tenant's operations and
/// the operators' review queue.
#[derive(Debug)]
struct Listed {
    head: u64,
    operations: Value,
    queue: Value,
}

const OPERATIONS: &str = "/v1/operations?limit=1000";
const QUEUE: &str = "/v1/review?limit=1000";

async fn get_ok(server: &Server, path: &str, token: &str) -> Value {
    let (status, body) = server.call(Method::GET, path, Some(token), None).await;
    assert_eq!(status, StatusCode::OK, "{path}: {body}");
    body
}

/// The live listings, when the log did not move while they were read (the answer is then the
/// listing at that head exactly: a listing waits for the read models to reach the head).
async fn listed_now(server: &Server) -> Option<Listed> {
    let head = server.log_head().await;
    let operations = get_ok(server, OPERATIONS, TENANT_A_TOKEN).await;
    let queue = get_ok(server, QUEUE, crate::support::OPERATOR_TOKEN).await;
    (server.log_head().await == head).then_some(Listed {
        head,
        operations,
        queue,
    })
}

/// `value` without its `age_s` members: an age is measured from when the answer was given (the
/// live one from the wall clock, the past one from the moment), the one field that says when
/// it was asked rather than what the ledger held.
fn without_ages(value: &Value) -> Value {
    match value {
        Value::Object(members) => Value::Object(
            members
                .iter()
                .filter(|(name, _)| name.as_str() != "age_s" && name.as_str() != "as_of_position")
                .map(|(name, member)| (name.clone(), without_ages(member)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_ages).collect()),
        other => other.clone(),
    }
}

#[tokio::test]
async fn listings_and_the_review_queue_as_of_any_moment_are_what_the_live_service_listed_then() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let mut listed: Vec<Listed> = Vec::new();
    let look = async |server: &Server, listed: &mut Vec<Listed>| {
        if let Some(now) = listed_now(server).await {
            if listed.last().is_none_or(|last| last.head != now.head) {
                listed.push(now);
            }
        }
    };

    // Another tenant's operation, never in tenant A's listing; one waiting for approval; a lost
    // response the key makes safe to retry; a lost request on a lookup-only CRM (into the review
    // queue); and a plain success.
    let (status, _) = server.record(TENANT_B_TOKEN, "crm", "Theirs", None).await;
    assert_eq!(status, StatusCode::CREATED);
    server
        .record_for_approval(TENANT_A_TOKEN, "Wait for the boss")
        .await;
    look(&server, &mut listed).await;
    harness
        .fault(Shape::Keyed, FaultKind::DropResponse, 1)
        .await;
    let mut ids = Vec::new();
    for (provider, title) in [
        ("crm", "Call the client"),
        ("crm-plain", "Book the meeting"),
        ("crm", "Send the contract"),
    ] {
        if provider == "crm-plain" {
            harness.fault(Shape::Plain, FaultKind::DropRequest, 1).await;
        }
        let (status, recorded) = server.record(TENANT_A_TOKEN, provider, title, None).await;
        assert_eq!(status, StatusCode::CREATED, "{recorded}");
        look(&server, &mut listed).await;
        let id = recorded["operation_id"].as_str().expect("an id").to_owned();
        let _ = server.execute(TENANT_A_TOKEN, &id, 200).await;
        look(&server, &mut listed).await;
        ids.push(id);
    }
    for _ in 0..400 {
        look(&server, &mut listed).await;
        let mut settled = true;
        for id in &ids {
            let view = live(&server, id).await;
            settled &= ["succeeded", "needs_review", "rejected"]
                .contains(&view["state"].as_str().unwrap_or_default());
        }
        if settled {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    look(&server, &mut listed).await;
    let queued = listed
        .iter()
        .filter(|seen| !seen.queue["queue"].as_array().is_none_or(Vec::is_empty))
        .count();
    assert!(
        listed.len() >= 6 && queued >= 1 && queued < listed.len(),
        "a history of several listings, the queue empty in some and not in others: {} listings, {queued} with a queue",
        listed.len()
    );

    for seen in &listed {
        let at = seen.head;
        let operations = get_ok(&server, &format!("{OPERATIONS}&as_of={at}"), TENANT_A_TOKEN).await;
        assert_eq!(operations["as_of_position"], at, "{operations}");
        assert_eq!(
            without_ages(&operations),
            without_ages(&seen.operations),
            "operations as of position {at}"
        );
        let queue = get_ok(
            &server,
            &format!("{QUEUE}&as_of={at}"),
            crate::support::OPERATOR_TOKEN,
        )
        .await;
        assert_eq!(
            without_ages(&queue),
            without_ages(&seen.queue),
            "the review queue as of position {at}"
        );
        // Paged one row at a time, the same rows in the same order.
        let mut paged = Vec::new();
        let mut after = String::new();
        loop {
            let page = get_ok(
                &server,
                &format!("/v1/operations?limit=1&as_of={at}{after}"),
                TENANT_A_TOKEN,
            )
            .await;
            paged.extend(page["operations"].as_array().expect("rows").iter().cloned());
            match page["next"].as_str() {
                Some(next) => after = format!("&after={next}"),
                None => break,
            }
        }
        assert_eq!(
            without_ages(&Value::Array(paged)),
            without_ages(&seen.operations["operations"]),
            "paged as of position {at}"
        );
    }
}

#[tokio::test]
async fn a_listing_as_of_a_bad_moment_is_refused_naming_as_of() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    for path in ["/v1/operations", "/v1/review"] {
        let token = if path == "/v1/review" {
            crate::support::OPERATOR_TOKEN
        } else {
            TENANT_A_TOKEN
        };
        for bad in ["yesterday", "0", "-3"] {
            let (status, body) = server
                .call(
                    Method::GET,
                    &format!("{path}?as_of={bad}"),
                    Some(token),
                    None,
                )
                .await;
            assert_eq!(
                status,
                StatusCode::UNPROCESSABLE_ENTITY,
                "{path} {bad}: {body}"
            );
            assert!(
                body["error"]["message"]
                    .as_str()
                    .is_some_and(|message| message.contains("as_of")),
                "{path} {bad}: {body}"
            );
        }
    }
}
