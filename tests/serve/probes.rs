//! The probes Kubernetes reads by status code: `/livez` and `/readyz`, and the drain on SIGTERM
//! (readiness fails first while requests are still served, then the listener closes). The
//! PostgreSQL cases (a silent network path) are in `postgres.rs`.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};

use crate::support::{Harness, DEADLINE, TENANT_A_TOKEN};

#[tokio::test]
async fn on_sigterm_readyz_fails_first_while_requests_are_still_served_then_the_server_stops() {
    let harness = Harness::new("shutdown_drain_ms = 3000").await;
    let server = harness.serve();
    let (status, live) = server.call(Method::GET, "/livez", None, None).await;
    assert_eq!((status, &live["status"]), (StatusCode::OK, &"alive".into()));
    let (status, ready) = server.call(Method::GET, "/readyz", None, None).await;
    assert_eq!(
        (status, &ready["status"]),
        (StatusCode::OK, &"ready".into()),
        "{ready}"
    );

    server.send_sigterm();
    let signalled = Instant::now();
    let not_ready = loop {
        let (status, body) = server.call(Method::GET, "/readyz", None, None).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            break body;
        }
        assert!(signalled.elapsed() < DEADLINE, "readiness never failed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(not_ready["status"], "not_ready");
    assert!(
        not_ready["reasons"][0]
            .as_str()
            .unwrap_or_default()
            .contains("draining"),
        "{not_ready}"
    );
    // Still served while draining: a new intent is recorded, and the process is alive.
    let (status, recorded) = server
        .record(TENANT_A_TOKEN, "crm", "while draining", None)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    let (status, _) = server.call(Method::GET, "/livez", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        signalled.elapsed() < Duration::from_millis(3_000),
        "the checks took the whole drain ({:?}); the test proves nothing on so slow a machine",
        signalled.elapsed()
    );

    let (code, _) = server.wait_for_exit();
    assert_eq!(code, Some(0));
    assert!(
        signalled.elapsed() >= Duration::from_millis(3_000),
        "the listener closed before the drain time ({:?})",
        signalled.elapsed()
    );
}
