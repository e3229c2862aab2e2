//! `GET /v1/events`: outcome events live, each with its log position as the SSE id, resumable
//! with `Last-Event-ID` across a server restart with no gap and no repeat; a bounded number of
//! streams. "Nothing else arrived" is shown by a marker operation recorded afterwards: every
//! event before the marker's is accounted for, no waiting for silence.

use std::time::Duration;

use reqwest::StatusCode;

use crate::support::{Harness, SseEvent, TENANT_A_TOKEN, TENANT_B_TOKEN};

fn is_recorded(operation_id: &str) -> impl Fn(&SseEvent) -> bool + '_ {
    move |event| event.event == "recorded" && event.data["operation_id"] == operation_id
}

#[tokio::test]
async fn events_arrive_live_and_resume_after_a_restart_with_no_gap_and_no_repeat() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let mut live = server.events(TENANT_A_TOKEN, "?types=all", None).await;
    assert_eq!(live.status, StatusCode::OK);
    let (_, first) = server.record(TENANT_A_TOKEN, "crm", "first", None).await;
    let first_id = first["operation_id"].as_str().expect("id").to_owned();
    server.execute(TENANT_A_TOKEN, &first_id, 5_000).await;
    let marker = server.marker(TENANT_A_TOKEN).await;
    let mut seen = live.until(is_recorded(&marker)).await;
    let marker_event = seen.pop().expect("the marker");
    let kinds: Vec<&str> = seen.iter().map(|event| event.event.as_str()).collect();
    assert_eq!(kinds, ["recorded", "started", "succeeded"], "{seen:?}");
    assert!(seen
        .iter()
        .all(|event| event.data["operation_id"] == first_id.as_str()));
    let ids: Vec<u64> = seen.iter().map(|event| event.id).collect();
    assert!(
        ids.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "positions in order: {ids:?}"
    );
    assert_eq!(marker_event.id, ids[2] + 1);
    assert!(seen.iter().all(|event| event.data["position"] == event.id));
    let last = marker_event.id;
    drop(live);

    let (code, _) = server.terminate();
    assert_eq!(code, Some(0));
    let server = harness.serve();
    let (_, second) = server.record(TENANT_A_TOKEN, "crm", "second", None).await;
    let second_id = second["operation_id"].as_str().expect("id").to_owned();
    server.execute(TENANT_A_TOKEN, &second_id, 5_000).await;
    let marker = server.marker(TENANT_A_TOKEN).await;

    let mut resumed = server
        .events(TENANT_A_TOKEN, "?types=all", Some(last))
        .await;
    assert_eq!(resumed.status, StatusCode::OK);
    let after = resumed.until(is_recorded(&marker)).await;
    let ids: Vec<u64> = after.iter().map(|event| event.id).collect();
    assert_eq!(
        ids,
        [last + 1, last + 2, last + 3, last + 4],
        "exactly what came after {last}: {after:?}"
    );
    assert!(after[..3]
        .iter()
        .all(|event| event.data["operation_id"] == second_id.as_str()));

    // The query parameter resumes the same way; the default types are the outcomes only, so the
    // first one after `last` is the second operation's success.
    let mut outcomes = server
        .events(TENANT_A_TOKEN, &format!("?after={last}"), None)
        .await;
    let first_outcome = outcomes
        .next(Duration::from_secs(10))
        .await
        .expect("an outcome");
    assert_eq!(first_outcome.event, "succeeded");
    assert_eq!(first_outcome.id, last + 3);
}

#[tokio::test]
async fn the_number_of_open_streams_is_bounded_and_a_closed_stream_frees_its_place() {
    let harness = Harness::new("max_sse_connections = 1").await;
    let server = harness.serve();
    let first = server.events(TENANT_A_TOKEN, "", None).await;
    assert_eq!(first.status, StatusCode::OK);
    let second = server.events(TENANT_A_TOKEN, "", None).await;
    assert_eq!(second.status, StatusCode::SERVICE_UNAVAILABLE);
    drop(second);
    drop(first);
    let started = std::time::Instant::now();
    loop {
        let third = server.events(TENANT_A_TOKEN, "", None).await;
        if third.status == StatusCode::OK {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the place was never freed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn one_tenant_cannot_take_every_stream_place() {
    let harness = Harness::new("max_sse_connections = 4\nmax_sse_connections_per_holder = 1").await;
    let server = harness.serve();
    let first = server.events(TENANT_A_TOKEN, "", None).await;
    assert_eq!(first.status, StatusCode::OK);
    let second = server.events(TENANT_A_TOKEN, "", None).await;
    assert_eq!(second.status, StatusCode::SERVICE_UNAVAILABLE);
    let other_tenant = server.events(TENANT_B_TOKEN, "", None).await;
    assert_eq!(other_tenant.status, StatusCode::OK, "B still has its place");
}
