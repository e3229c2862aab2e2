//! Deliveries per second from one endpoint's task to a loopback receiver that answers 200 at once:
//! `cargo run -p opledger-webhooks --example throughput -- 2000`. The log is the memory store
//! (the ledger's own cost is `bench http`'s), the journal a real SQLite file in a temporary
//! directory, so each delivery pays its HTTP round trip and its journal commits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opledger_domain::ids::EventId;
use opledger_domain::store::{EventData, EventStore, ExpectedVersion, RecordedEvent, StreamName};
use opledger_store::MemoryStore;
use opledger_webhooks::endpoint::check_url;
use opledger_webhooks::signing::Secret;
use opledger_webhooks::{Endpoint, Message, Render, Webhooks, DEFAULT_REQUEST_TIMEOUT_MS};

struct Every;

impl Render for Every {
    async fn render(
        &self,
        event: &RecordedEvent,
        _kinds: &std::collections::BTreeSet<String>,
    ) -> Result<Option<Message>, String> {
        Ok(Some(Message {
            kind: "succeeded",
            tenant: "acme".into(),
            at: chrono::Utc::now(),
            data: serde_json::json!({ "position": event.position.value() }),
            answer_seal: None,
        }))
    }
}

#[tokio::main]
async fn main() {
    let events: u64 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    let received = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&received);
    let app = axum::Router::new().route(
        "/hooks",
        axum::routing::post(move || {
            let counter = Arc::clone(&counter);
            async move {
                counter.fetch_add(1, Ordering::Relaxed);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!(
        "http://{}/hooks",
        listener.local_addr().expect("an address")
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let store = MemoryStore::new();
    let dir = tempfile::tempdir().expect("a directory");
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let endpoint = Endpoint {
        id: "bench".into(),
        url: check_url(&url, false).expect("loopback"),
        secrets: vec![Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("valid")],
        events: ["succeeded".to_owned()].into(),
        tenants: None,
        allow_private_network: false,
        retry_window_s: 60,
        request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
    };
    let webhooks = Webhooks::start(
        &store,
        Arc::new(Every),
        vec![endpoint],
        &dir.path().join("bench.webhooks"),
        stopping,
    )
    .await
    .expect("started");
    for n in 0..events {
        let stream = StreamName::new(format!("bench-{n}")).expect("a name");
        store
            .append(
                &stream,
                ExpectedVersion::NoStream,
                vec![EventData {
                    event_id: EventId::from_uuid(uuid::Uuid::from_u128(u128::from(n) + 1)),
                    event_type: "Bench".into(),
                    data: b"{}".to_vec(),
                    metadata: b"{}".to_vec(),
                }],
            )
            .await
            .expect("appended");
    }
    // Timed from the first delivery, so the appends above do not count.
    while received.load(Ordering::Relaxed) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let started = Instant::now();
    let first = received.load(Ordering::Relaxed);
    while received.load(Ordering::Relaxed) < events {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    let delivered = events - first;
    println!(
        "{delivered} deliveries in {:.2} s: {:.0}/s, {:.2} ms each (one endpoint, in log order)",
        elapsed.as_secs_f64(),
        delivered as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1_000.0 / delivered as f64
    );
    let _ = stop.send(true);
    webhooks.join().await;
}
