//! SIGTERM with work in flight: the server stops accepting, lets the sends it made finish and
//! records them, exits 0, and no acknowledged intent is lost.

use std::time::{Duration, Instant};

use opledger_crm_stand::{FaultKind, Shape};
use reqwest::{Method, StatusCode};

use crate::support::{Harness, TENANT_A_TOKEN};

#[tokio::test]
async fn sigterm_lets_sends_in_flight_finish_and_loses_no_acknowledged_intent() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    harness
        .fault(Shape::Keyed, FaultKind::LateResponse { delay_ms: 1_500 }, 3)
        .await;
    let mut ids = Vec::new();
    for number in 0..3 {
        let (status, recorded) = server
            .record(TENANT_A_TOKEN, "crm", &format!("slow {number}"), None)
            .await;
        assert_eq!(status, StatusCode::CREATED);
        ids.push(recorded["operation_id"].as_str().expect("id").to_owned());
    }
    let base = server.base.clone();
    let executes: Vec<_> = ids
        .iter()
        .map(|id| {
            let url = format!("{base}/v1/operations/{id}/execute?wait_ms=20000");
            tokio::spawn(async move {
                let response = reqwest::Client::new()
                    .post(url)
                    .bearer_auth(TENANT_A_TOKEN)
                    .send()
                    .await
                    .expect("answered before the server stopped");
                let status = response.status();
                let body: serde_json::Value =
                    serde_json::from_str(&response.text().await.expect("body")).expect("JSON");
                (status, body)
            })
        })
        .collect();
    // Wait until the stand holds all three slow requests (applied, their answers held back).
    let started = Instant::now();
    while slow_objects(&harness).await < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the sends never reached the stand"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Intents keep arriving while the server goes down; each one acknowledged must survive.
    let recorder = {
        let base = base.clone();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut acknowledged = Vec::new();
            for number in 0..10_000 {
                let body = serde_json::json!({"provider": "crm", "account": "acct-1",
                    "action": "create_task", "args": {"title": format!("burst {number}")}});
                let Ok(response) = client
                    .post(format!("{base}/v1/operations"))
                    .bearer_auth(TENANT_A_TOKEN)
                    .header("content-type", "application/json")
                    .body(body.to_string())
                    .send()
                    .await
                else {
                    break;
                };
                if response.status() != StatusCode::CREATED {
                    break;
                }
                let Ok(text) = response.text().await else {
                    break;
                };
                let Ok(body) = serde_json::from_str::<serde_json::Value>(&text) else {
                    break;
                };
                acknowledged.push(body["operation_id"].as_str().unwrap_or_default().to_owned());
            }
            acknowledged
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (code, printed) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .expect("terminated");
    assert_eq!(code, Some(0), "{printed:?}");
    for execute in executes {
        let (status, body) = execute.await.expect("task");
        assert_eq!(status, StatusCode::OK, "{body}");
        // The execute call may stop waiting when the server goes down (a worker may hold the
        // attempt); it never claims more than the ledger knows.
        assert!(
            ["succeeded", "in_flight"].contains(&body["state"].as_str().unwrap_or_default()),
            "{body}"
        );
        assert_eq!(
            body["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("Done")),
            body["state"] == "succeeded"
        );
    }
    let acknowledged = recorder.await.expect("recorder");
    assert!(
        !acknowledged.is_empty(),
        "some intents were acknowledged during the shutdown"
    );

    // Right after the restart — long before a 5 s lease could expire — the slow sends are
    // recorded as succeeded: the server finished them before it exited.
    let server = harness.serve();
    for id in &ids {
        let (_, body) = server
            .call(
                Method::GET,
                &format!("/v1/operations/{id}"),
                Some(TENANT_A_TOKEN),
                None,
            )
            .await;
        assert_eq!(body["state"], "succeeded", "{body}");
    }
    for id in ids.iter().chain(&acknowledged) {
        let (status, body) = server
            .call(
                Method::GET,
                &format!("/v1/operations/{id}"),
                Some(TENANT_A_TOKEN),
                None,
            )
            .await;
        assert_eq!(
            status,
            StatusCode::OK,
            "acknowledged intent {id} was lost: {body}"
        );
    }
    // The three slow operations made exactly three objects; the burst is still to be sent.
    assert_eq!(slow_objects(&harness).await, 3);
}

async fn slow_objects(harness: &Harness) -> usize {
    harness
        .objects()
        .await
        .iter()
        .filter(|object| {
            object.fields["title"]
                .as_str()
                .is_some_and(|t| t.starts_with("slow"))
        })
        .count()
}
