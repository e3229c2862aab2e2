//! Delivery against real HTTP receivers on 127.0.0.1: order, signatures, retries, Retry-After,
//! 410, the retry window, restarts from the checkpoint, replay, filters, a dead endpoint beside a
//! live one (and holding no more than its bound of events), and a holder losing its lease. The
//! log is the memory store; the journal a real SQLite file (behind a test double holding the
//! leases in memory, for the lease test).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use opledger_domain::ids::EventId;
use opledger_domain::store::{EventData, EventStore, ExpectedVersion, RecordedEvent, StreamName};
use opledger_store::MemoryStore;
use opledger_webhooks::endpoint::check_url;
use opledger_webhooks::signing::Secret;
use opledger_webhooks::{
    Acquired, AttemptRecord, DeliveryJournal, DeliveryState, Endpoint, EndpointRecord,
    EndpointStatus, JournalFuture, Lease, LeaseSettings, Message, Render, Webhooks,
};
use tokio::sync::watch;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const DEADLINE: Duration = Duration::from_secs(20);

/// Reads the test events' data: `{"kind": …, "tenant": …}`.
struct DataRender;

impl Render for DataRender {
    async fn render(
        &self,
        event: &RecordedEvent,
        _kinds: &std::collections::BTreeSet<String>,
    ) -> Result<Option<Message>, String> {
        let data: serde_json::Value =
            serde_json::from_slice(&event.data).map_err(|error| error.to_string())?;
        let kind = match data["kind"].as_str() {
            Some("succeeded") => "succeeded",
            Some("unknown") => "unknown",
            _ => return Ok(None),
        };
        Ok(Some(Message {
            kind,
            tenant: data["tenant"].as_str().unwrap_or_default().to_owned(),
            at: chrono::Utc::now(),
            data: serde_json::json!({ "position": event.position.value(), "n": data["n"] }),
            answer_seal: None,
        }))
    }
}

/// One delivery the receiver got.
#[derive(Clone, Debug)]
struct Received {
    id: String,
    timestamp: String,
    signature: String,
    body: serde_json::Value,
    raw: Bytes,
    at: Instant,
}

/// A loopback receiver answering from a script, then 200.
#[derive(Clone, Default)]
struct Receiver {
    received: Arc<Mutex<Vec<Received>>>,
    script: Arc<Mutex<VecDeque<Response>>>,
    /// Answer every request with this status (after the script), when set.
    always: Arc<Mutex<Option<StatusCode>>>,
    /// How long each answer takes.
    delay: Arc<Mutex<Duration>>,
}

impl Receiver {
    async fn start() -> (Self, String) {
        let receiver = Self::default();
        let app = axum::Router::new()
            .route("/hooks", axum::routing::post(answer))
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let address: SocketAddr = listener.local_addr().expect("an address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, format!("http://{address}/hooks"))
    }

    fn then(&self, response: Response) {
        self.script.lock().expect("lock").push_back(response);
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }

    async fn wait_for(&self, count: usize) -> Vec<Received> {
        let started = Instant::now();
        loop {
            let received = self.received();
            if received.len() >= count {
                return received;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "only {} of {count} deliveries arrived: {received:?}",
                received.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn answer(
    axum::extract::State(receiver): axum::extract::State<Receiver>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    receiver.received.lock().expect("lock").push(Received {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
        body: serde_json::from_slice(&body).expect("the payload is JSON"),
        raw: body,
        at: Instant::now(),
    });
    let delay = *receiver.delay.lock().expect("lock");
    tokio::time::sleep(delay).await;
    if let Some(response) = receiver.script.lock().expect("lock").pop_front() {
        return response;
    }
    match *receiver.always.lock().expect("lock") {
        Some(status) => status.into_response(),
        None => StatusCode::OK.into_response(),
    }
}

fn endpoint(id: &str, url: &str) -> Endpoint {
    Endpoint {
        id: id.into(),
        url: check_url(url, false).expect("a loopback URL"),
        secrets: vec![Secret::parse(SECRET).expect("valid")],
        events: ["succeeded".to_owned(), "unknown".to_owned()].into(),
        tenants: None,
        allow_private_network: false,
        retry_window_s: 60,
        request_timeout_ms: opledger_webhooks::DEFAULT_REQUEST_TIMEOUT_MS,
    }
}

async fn append(store: &MemoryStore, n: u64, kind: &str, tenant: &str) {
    let stream = StreamName::new(format!("test-{n}")).expect("a name");
    store
        .append(
            &stream,
            ExpectedVersion::NoStream,
            vec![EventData {
                event_id: EventId::from_uuid(uuid::Uuid::from_u128(u128::from(n) + 1)),
                event_type: "Test".into(),
                data: serde_json::to_vec(
                    &serde_json::json!({"kind": kind, "tenant": tenant, "n": n}),
                )
                .expect("JSON"),
                metadata: b"{}".to_vec(),
            }],
        )
        .await
        .expect("appended");
}

struct Running {
    webhooks: Webhooks,
    stop: watch::Sender<bool>,
    _dir: Arc<tempfile::TempDir>,
}

async fn start(
    store: &MemoryStore,
    endpoints: Vec<Endpoint>,
    dir: Arc<tempfile::TempDir>,
) -> Running {
    let (stop, stopping) = watch::channel(false);
    let webhooks = Webhooks::start(
        store,
        Arc::new(DataRender),
        endpoints,
        &dir.path().join("test.webhooks"),
        stopping,
    )
    .await
    .expect("webhooks start");
    Running {
        webhooks,
        stop,
        _dir: dir,
    }
}

/// Like [`start`], with one `billing` endpoint at `url` on a journal the test holds (to count or
/// take leases behind the service's back), held by `holder` under leases of `lease_ms`.
async fn start_on(
    store: &MemoryStore,
    url: &str,
    journal: Arc<dyn DeliveryJournal>,
    holder: &str,
    lease_ms: u64,
    dir: Arc<tempfile::TempDir>,
) -> Running {
    let (stop, stopping) = watch::channel(false);
    let webhooks = Webhooks::start_with(
        store,
        Arc::new(DataRender),
        vec![endpoint("billing", url)],
        journal,
        LeaseSettings {
            holder: holder.into(),
            lease_ms,
        },
        stopping,
    )
    .await
    .expect("webhooks start");
    Running {
        webhooks,
        stop,
        _dir: dir,
    }
}

impl Running {
    async fn shut(self) {
        let _ = self.stop.send(true);
        self.webhooks.join().await;
    }

    async fn wait_for_checkpoint(&self, id: &str, wanted: u64) {
        let started = Instant::now();
        loop {
            let overview = self.webhooks.endpoint(id, None).await.expect("an endpoint");
            if overview.checkpoint == Some(wanted) {
                return;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "{id} never reached {wanted}: {overview:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn wait_for_status(&self, id: &str, wanted: EndpointStatus) {
        let started = Instant::now();
        loop {
            let overview = self.webhooks.endpoint(id, None).await.expect("an endpoint");
            if overview.status == wanted {
                return;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "{id} never became {wanted:?}: {overview:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The URL of a receiver that accepts connections and never answers: each attempt there waits
/// out the request timeout.
async fn dead_receiver() -> String {
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!("http://{}/hooks", dead.local_addr().expect("an address"));
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = dead.accept().await {
            held.push(socket);
        }
    });
    url
}

fn positions(received: &[Received]) -> Vec<u64> {
    received
        .iter()
        .map(|r| r.body["data"]["position"].as_u64().expect("a position"))
        .collect()
}

fn dir() -> Arc<tempfile::TempDir> {
    Arc::new(tempfile::tempdir().expect("a temporary directory"))
}

#[tokio::test]
async fn every_event_arrives_in_log_order_signed_under_an_id_derived_from_the_event() {
    let store = MemoryStore::new();
    let (receiver, url) = Receiver::start().await;
    let running = start(&store, vec![endpoint("billing", &url)], dir()).await;
    for n in 0..5 {
        append(&store, n, "succeeded", "acme").await;
    }
    let received = receiver.wait_for(5).await;
    assert_eq!(positions(&received), vec![1, 2, 3, 4, 5]);
    for (n, delivery) in received.iter().enumerate() {
        assert_eq!(delivery.body["type"], "operation.succeeded");
        let event_id = uuid::Uuid::from_u128(n as u128 + 1);
        assert_eq!(delivery.id, format!("msg_{}", event_id.simple()));
        let signed = format!(
            "{}.{}.{}",
            delivery.id,
            delivery.timestamp,
            String::from_utf8_lossy(&delivery.raw)
        );
        assert_eq!(delivery.signature, expected_signature(&signed));
    }
    running.shut().await;
}

/// The signature computed independently of the crate's signing code (the Python library checks
/// it again in the serve tests).
fn expected_signature(signed: &str) -> String {
    use hmac::Mac;
    let key = base64::engine::general_purpose::STANDARD
        .decode(SECRET.trim_start_matches("whsec_"))
        .expect("base64");
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).expect("any key length");
    mac.update(signed.as_bytes());
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

#[tokio::test]
async fn a_429_with_retry_after_is_retried_no_sooner_than_asked_under_the_same_id() {
    let store = MemoryStore::new();
    let (receiver, url) = Receiver::start().await;
    receiver.then(
        (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "2")],
            "slow down",
        )
            .into_response(),
    );
    let running = start(&store, vec![endpoint("billing", &url)], dir()).await;
    append(&store, 0, "succeeded", "acme").await;
    let received = receiver.wait_for(2).await;
    assert_eq!(received[0].id, received[1].id);
    let waited = received[1].at - received[0].at;
    assert!(
        waited >= Duration::from_millis(1_900),
        "retried after {waited:?}"
    );
    // The receiver logs a request before its answer is recorded: wait for the acknowledgement.
    running.wait_for_checkpoint("billing", 1).await;
    let attempts = running
        .webhooks
        .attempts("billing", 10)
        .await
        .expect("listed");
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[1].status, Some(429));
    assert!(attempts[1]
        .error
        .as_deref()
        .is_some_and(|e| e.contains("slow down")));
    assert_eq!(attempts[0].status, Some(200));
    assert_eq!(attempts[0].attempt, 2);
    running.shut().await;
}

#[tokio::test]
async fn a_410_disables_the_endpoint_until_an_operator_resumes_it() {
    let store = MemoryStore::new();
    let (receiver, url) = Receiver::start().await;
    receiver.then(StatusCode::GONE.into_response());
    let running = start(&store, vec![endpoint("billing", &url)], dir()).await;
    append(&store, 0, "succeeded", "acme").await;
    append(&store, 1, "succeeded", "acme").await;
    running
        .wait_for_status("billing", EndpointStatus::Disabled)
        .await;
    let overview = running
        .webhooks
        .endpoint("billing", Some(2))
        .await
        .expect("listed");
    assert_eq!(overview.lag_positions, 2);
    assert_eq!(
        receiver.received().len(),
        1,
        "nothing more goes to a disabled endpoint"
    );
    running.webhooks.resume("billing").await.expect("resumed");
    let received = receiver.wait_for(3).await;
    assert_eq!(
        positions(&received),
        vec![1, 1, 2],
        "the event that got 410 comes again first"
    );
    running.shut().await;
}

#[tokio::test]
async fn an_endpoint_failing_for_its_whole_retry_window_is_disabled_and_says_why() {
    let store = MemoryStore::new();
    let (receiver, url) = Receiver::start().await;
    *receiver.always.lock().expect("lock") = Some(StatusCode::INTERNAL_SERVER_ERROR);
    let short = Endpoint {
        retry_window_s: 1,
        ..endpoint("billing", &url)
    };
    let running = start(&store, vec![short], dir()).await;
    append(&store, 0, "succeeded", "acme").await;
    // While it waits, the endpoint says when the next attempt is due, a moment that does not
    // move as time passes (a pause in milliseconds was the same number however long ago).
    let started = Instant::now();
    let due = loop {
        let overview = running
            .webhooks
            .endpoint("billing", None)
            .await
            .expect("listed");
        if let DeliveryState::Retrying {
            next_attempt_at,
            retry_in_ms,
            ..
        } = overview.delivery
        {
            break (next_attempt_at, retry_in_ms);
        }
        assert!(started.elapsed() < DEADLINE, "never retrying: {overview:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let (next_attempt_at, retry_in_ms) = due;
    let from_now = next_attempt_at - chrono::Utc::now();
    assert!(
        from_now <= chrono::Duration::milliseconds(i64::try_from(retry_in_ms).expect("small"))
            && from_now > chrono::Duration::milliseconds(-500),
        "the next attempt is due at {next_attempt_at}, {from_now} from now ({retry_in_ms} ms pause)"
    );
    running
        .wait_for_status("billing", EndpointStatus::Disabled)
        .await;
    // Disabled only once it failed for the whole window: its last attempt came a window after
    // the first (the last pause cut short to end there, not the endpoint given up a pause early).
    let received = receiver.received.lock().expect("lock").clone();
    let (first, last) = (
        received.first().expect("attempted"),
        received.last().expect("attempted"),
    );
    assert!(
        last.at.duration_since(first.at) >= Duration::from_secs(1),
        "disabled {:?} after the first attempt, inside its 1 s window",
        last.at.duration_since(first.at)
    );
    // The task counts the disabling right after the journal's commit, which the status above
    // already shows: wait for the count too.
    let started = Instant::now();
    let overview = loop {
        let overview = running
            .webhooks
            .endpoint("billing", None)
            .await
            .expect("listed");
        if overview.disabled_total > 0 {
            break overview;
        }
        assert!(started.elapsed() < DEADLINE, "never counted: {overview:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let reason = overview.reason.clone().expect("a reason");
    assert!(reason.contains("whole retry window of 1 s"), "{reason}");
    assert_eq!(overview.disabled_total, 1);
    assert!(overview.failed_attempts_total >= 2, "{overview:?}");
    running.shut().await;
}

#[tokio::test]
async fn a_restart_resumes_after_the_last_delivered_event_and_skips_none() {
    let store = MemoryStore::new();
    let dir = dir();
    let (receiver, url) = Receiver::start().await;
    let running = start(&store, vec![endpoint("billing", &url)], Arc::clone(&dir)).await;
    for n in 0..3 {
        append(&store, n, "succeeded", "acme").await;
    }
    receiver.wait_for(3).await;
    // Stopping while the third answer is on its way would repeat it (at least once); this test
    // is about resuming after what was acknowledged, so it waits for the third checkpoint.
    running.wait_for_checkpoint("billing", 3).await;
    running.shut().await;
    for n in 3..6 {
        append(&store, n, "succeeded", "acme").await;
    }
    let running = start(&store, vec![endpoint("billing", &url)], dir).await;
    let received = receiver.wait_for(6).await;
    assert_eq!(positions(&received), vec![1, 2, 3, 4, 5, 6]);
    running.shut().await;
}

#[tokio::test]
async fn a_new_endpoint_starts_at_the_head_and_replay_delivers_the_history_again() {
    let store = MemoryStore::new();
    for n in 0..3 {
        append(&store, n, "succeeded", "acme").await;
    }
    let (receiver, url) = Receiver::start().await;
    let running = start(&store, vec![endpoint("billing", &url)], dir()).await;
    append(&store, 3, "succeeded", "acme").await;
    assert_eq!(positions(&receiver.wait_for(1).await), vec![4]);
    running
        .webhooks
        .replay("billing", Some(1), Some(4))
        .await
        .expect("replayed");
    let received = receiver.wait_for(4).await;
    assert_eq!(positions(&received), vec![4, 2, 3, 4]);
    running.shut().await;
}

#[tokio::test]
async fn a_replay_after_the_head_is_refused_and_later_events_are_still_delivered() {
    let store = MemoryStore::new();
    let (receiver, url) = Receiver::start().await;
    let running = start(&store, vec![endpoint("billing", &url)], dir()).await;
    append(&store, 0, "succeeded", "acme").await;
    running.wait_for_checkpoint("billing", 1).await;
    let refused = running
        .webhooks
        .replay("billing", Some(999_999), Some(1))
        .await
        .expect_err("a replay past the head is refused");
    assert!(
        refused.to_string().contains("from 0 to 1"),
        "the refusal says what may be given: {refused}"
    );
    let overview = running
        .webhooks
        .endpoint("billing", Some(1))
        .await
        .expect("an endpoint");
    assert_eq!(overview.checkpoint, Some(1), "the checkpoint did not move");
    append(&store, 1, "succeeded", "acme").await;
    assert_eq!(positions(&receiver.wait_for(2).await), vec![1, 2]);
    running.shut().await;
}

#[tokio::test]
async fn a_checkpoint_beyond_the_head_stops_delivery_and_says_so_until_replayed() {
    let store = MemoryStore::new();
    let dir = dir();
    let journal_path = dir.path().join("test.webhooks");
    append(&store, 0, "succeeded", "acme").await;
    // A checkpoint the log has not reached, as a ledger restored from an older copy leaves it:
    // written into the journal behind the service's back.
    let journal = opledger_webhooks::Journal::open(&journal_path)
        .await
        .expect("a journal");
    journal
        .ensure("billing", Some(999))
        .await
        .expect("a record");
    drop(journal);
    let (receiver, url) = Receiver::start().await;
    let running = start(&store, vec![endpoint("billing", &url)], Arc::clone(&dir)).await;
    let started = Instant::now();
    let problem = loop {
        if let Some(problem) = running.webhooks.problem() {
            break problem;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the checkpoint was never reported"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(
        problem.contains("checkpoint 999 is beyond the log's newest position 1"),
        "{problem}"
    );
    let overview = running
        .webhooks
        .endpoint("billing", Some(1))
        .await
        .expect("an endpoint");
    assert!(
        matches!(&overview.delivery, DeliveryState::Faulted { error, .. } if error.contains("beyond")),
        "the endpoint's own state says it too: {overview:?}"
    );
    running
        .webhooks
        .replay("billing", Some(0), Some(1))
        .await
        .expect("replayed");
    append(&store, 1, "succeeded", "acme").await;
    assert_eq!(positions(&receiver.wait_for(2).await), vec![1, 2]);
    assert_eq!(running.webhooks.problem(), None);
    running.shut().await;
}

#[tokio::test]
async fn an_endpoint_receives_only_its_event_types_and_tenants() {
    let store = MemoryStore::new();
    let (receiver, url) = Receiver::start().await;
    let picky = Endpoint {
        events: ["succeeded".to_owned()].into(),
        tenants: Some(["acme".to_owned()].into()),
        ..endpoint("billing", &url)
    };
    let running = start(&store, vec![picky], dir()).await;
    append(&store, 0, "unknown", "acme").await;
    append(&store, 1, "succeeded", "globex").await;
    append(&store, 2, "succeeded", "acme").await;
    append(&store, 3, "other", "acme").await;
    append(&store, 4, "succeeded", "acme").await;
    assert_eq!(positions(&receiver.wait_for(2).await), vec![3, 5]);
    // Events it does not want still move its checkpoint, once the log is quiet.
    append(&store, 5, "unknown", "acme").await;
    running.wait_for_checkpoint("billing", 6).await;
    running.shut().await;
}

#[tokio::test]
async fn a_paused_endpoint_waits_on_its_checkpoint_and_resumes_where_it_stopped() {
    let store = MemoryStore::new();
    let (receiver, url) = Receiver::start().await;
    let running = start(&store, vec![endpoint("billing", &url)], dir()).await;
    running
        .webhooks
        .pause("billing", "oncall")
        .await
        .expect("paused");
    running
        .wait_for_status("billing", EndpointStatus::Paused)
        .await;
    append(&store, 0, "succeeded", "acme").await;
    append(&store, 1, "succeeded", "acme").await;
    let overview = running
        .webhooks
        .endpoint("billing", Some(2))
        .await
        .expect("listed");
    assert_eq!(overview.lag_positions, 2);
    assert_eq!(overview.reason.as_deref(), Some("paused by oncall"));
    running.webhooks.resume("billing").await.expect("resumed");
    assert_eq!(positions(&receiver.wait_for(2).await), vec![1, 2]);
    running.shut().await;
}

#[tokio::test]
async fn a_dead_endpoint_beside_a_live_one_does_not_slow_it() {
    let store = MemoryStore::new();
    let dead_url = dead_receiver().await;
    let (receiver, url) = Receiver::start().await;
    let running = start(
        &store,
        vec![endpoint("dead", &dead_url), endpoint("live", &url)],
        dir(),
    )
    .await;
    let started = Instant::now();
    for n in 0..300 {
        append(&store, n, "succeeded", "acme").await;
    }
    let received = receiver.wait_for(300).await;
    assert_eq!(positions(&received), (1..=300).collect::<Vec<u64>>());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the live endpoint took {:?}",
        started.elapsed()
    );
    let dead = running
        .webhooks
        .endpoint("dead", Some(300))
        .await
        .expect("listed");
    assert_eq!(dead.delivered_total, 0);
    assert_eq!(dead.lag_positions, 300);
    running.shut().await;
}

#[tokio::test]
async fn an_event_still_failing_at_a_restart_is_delivered_after_it_not_skipped() {
    let store = MemoryStore::new();
    let dir = dir();
    let (receiver, url) = Receiver::start().await;
    *receiver.always.lock().expect("lock") = Some(StatusCode::SERVICE_UNAVAILABLE);
    let running = start(&store, vec![endpoint("billing", &url)], Arc::clone(&dir)).await;
    append(&store, 0, "succeeded", "acme").await;
    append(&store, 1, "succeeded", "acme").await;
    receiver.wait_for(1).await;
    running.shut().await;
    *receiver.always.lock().expect("lock") = None;
    let running = start(&store, vec![endpoint("billing", &url)], dir).await;
    let received = receiver.wait_for(3).await;
    let delivered: Vec<u64> = positions(&received)
        .into_iter()
        .skip_while(|p| *p == 1)
        .collect();
    assert_eq!(positions(&received)[0], 1);
    assert_eq!(
        delivered,
        vec![2],
        "after the failures of 1 and its delivery, 2 follows"
    );
    assert!(
        received
            .iter()
            .filter(|r| r.body["data"]["position"] == 1)
            .count()
            >= 2
    );
    running.shut().await;
}

#[tokio::test]
async fn a_redirect_is_a_failed_attempt_and_is_not_followed() {
    let store = MemoryStore::new();
    let (receiver, url) = Receiver::start().await;
    let elsewhere = format!("{url}-elsewhere");
    receiver.then((StatusCode::FOUND, [("location", elsewhere.as_str())]).into_response());
    let running = start(&store, vec![endpoint("billing", &url)], dir()).await;
    append(&store, 0, "succeeded", "acme").await;
    receiver.wait_for(2).await;
    let attempts = running
        .webhooks
        .attempts("billing", 10)
        .await
        .expect("listed");
    let first = attempts.last().expect("an attempt");
    assert_eq!(first.status, Some(302));
    assert!(
        first
            .error
            .as_deref()
            .is_some_and(|e| e.contains("redirects are not followed")),
        "{first:?}"
    );
    running.shut().await;
}

#[tokio::test]
async fn a_receiver_that_never_answers_times_out_and_is_retried() {
    let store = MemoryStore::new();
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!("http://{}/hooks", silent.local_addr().expect("an address"));
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let impatient = Endpoint {
        request_timeout_ms: 200,
        ..endpoint("billing", &url)
    };
    let running = start(&store, vec![impatient], dir()).await;
    append(&store, 0, "succeeded", "acme").await;
    let started = Instant::now();
    let attempts = loop {
        let attempts = running
            .webhooks
            .attempts("billing", 10)
            .await
            .expect("listed");
        if attempts.len() >= 2 {
            break attempts;
        }
        assert!(started.elapsed() < DEADLINE, "{attempts:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    for attempt in &attempts {
        assert_eq!(attempt.status, None);
        assert!(
            attempt
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with("timed out")),
            "{attempt:?}"
        );
        assert!((200..2_000).contains(&attempt.duration_ms), "{attempt:?}");
    }
    running.shut().await;
}

#[tokio::test]
async fn delivery_that_cannot_read_the_log_is_a_problem_until_it_resumes_from_its_checkpoint() {
    let store = TestLog::default();
    store.down.store(true, std::sync::atomic::Ordering::SeqCst);
    let (receiver, url) = Receiver::start().await;
    let (stop, stopping) = watch::channel(false);
    let dir = dir();
    let webhooks = Webhooks::start(
        &store,
        Arc::new(DataRender),
        vec![endpoint("billing", &url)],
        &dir.path().join("test.webhooks"),
        stopping,
    )
    .await
    .expect("webhooks start");
    let started = Instant::now();
    let problem = loop {
        if let Some(problem) = webhooks.problem() {
            break problem;
        }
        assert!(started.elapsed() < DEADLINE, "the fault was never reported");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(problem.contains("the test took the log down"), "{problem}");
    append(&store.inner, 0, "succeeded", "acme").await;
    store.down.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(positions(&receiver.wait_for(1).await), vec![1]);
    assert_eq!(webhooks.problem(), None);
    let _ = stop.send(true);
    webhooks.join().await;
    assert!(
        webhooks
            .problem()
            .is_some_and(|p| p.contains("has stopped")),
        "a stopped delivery is reported as stopped"
    );
}

#[tokio::test]
async fn a_server_without_configured_endpoints_lists_none_and_has_no_problem() {
    // Its journal is opened all the same: endpoints may be defined through the API later.
    let store = MemoryStore::new();
    let dir = dir();
    let running = start(&store, Vec::new(), Arc::clone(&dir)).await;
    assert!(running
        .webhooks
        .overview(None)
        .await
        .expect("empty")
        .is_empty());
    assert_eq!(running.webhooks.problem(), None);
    assert!(running.webhooks.attempts("billing", 1).await.is_err());
    running.shut().await;
}

#[tokio::test]
async fn a_stop_lets_the_delivery_under_way_finish_so_a_restart_does_not_repeat_it() {
    let store = MemoryStore::new();
    let dir = dir();
    let (receiver, url) = Receiver::start().await;
    *receiver.delay.lock().expect("lock") = Duration::from_millis(300);
    let running = start(&store, vec![endpoint("billing", &url)], Arc::clone(&dir)).await;
    append(&store, 0, "succeeded", "acme").await;
    receiver.wait_for(1).await;
    // The receiver has the request and answers in 300 ms: stop now.
    running.shut().await;
    *receiver.delay.lock().expect("lock") = Duration::ZERO;
    append(&store, 1, "succeeded", "acme").await;
    let running = start(&store, vec![endpoint("billing", &url)], dir).await;
    let received = receiver.wait_for(2).await;
    assert_eq!(positions(&received), vec![1, 2], "nothing repeated");
    running.shut().await;
}

/// A journal shared by instances, for the lease tests: the real SQLite journal for records and
/// attempts, the leases in memory where the test hands them from one holder to another (as
/// another instance would take an expired one). Its fences are the port's: a write under a
/// token that is not the current one does nothing.
struct SharedLeases {
    inner: opledger_webhooks::Journal,
    /// Per endpoint: the holder (`None`: free) and the current token.
    leases: Mutex<std::collections::HashMap<String, (Option<String>, u64)>>,
}

impl SharedLeases {
    fn current(&self, lease: &Lease) -> bool {
        self.leases.lock().expect("lock").get(&lease.endpoint)
            == Some(&(Some(lease.holder.clone()), lease.token))
    }

    /// Another instance takes the endpoint (a new token), as after this one's lease expired.
    fn hand_to(&self, endpoint: &str, holder: &str) {
        let mut leases = self.leases.lock().expect("lock");
        let lease = leases.entry(endpoint.to_owned()).or_default();
        *lease = (Some(holder.to_owned()), lease.1 + 1);
    }

    /// The other instance gives it up.
    fn free(&self, endpoint: &str) {
        if let Some(lease) = self.leases.lock().expect("lock").get_mut(endpoint) {
            lease.0 = None;
        }
    }
}

impl DeliveryJournal for SharedLeases {
    fn shared(&self) -> bool {
        true
    }

    fn definitions(&self) -> JournalFuture<'_, Vec<(String, String)>> {
        DeliveryJournal::definitions(&self.inner)
    }

    fn define(&self, endpoint: &str, definition: Option<String>) -> JournalFuture<'_, ()> {
        DeliveryJournal::define(&self.inner, endpoint, definition)
    }

    fn ensure(&self, endpoint: &str, start: Option<u64>) -> JournalFuture<'_, EndpointRecord> {
        DeliveryJournal::ensure(&self.inner, endpoint, start)
    }

    fn record(&self, endpoint: &str) -> JournalFuture<'_, Option<EndpointRecord>> {
        DeliveryJournal::record(&self.inner, endpoint)
    }

    fn advance(&self, lease: &Lease, epoch: u64, position: u64) -> JournalFuture<'_, bool> {
        if !self.current(lease) {
            return Box::pin(async { Ok(false) });
        }
        DeliveryJournal::advance(&self.inner, lease, epoch, position)
    }

    fn set_status(
        &self,
        endpoint: &str,
        status: EndpointStatus,
        reason: Option<String>,
        replay_after: Option<Option<u64>>,
        fence: Option<(u64, &Lease)>,
    ) -> JournalFuture<'_, bool> {
        if fence.is_some_and(|(_, lease)| !self.current(lease)) {
            return Box::pin(async { Ok(false) });
        }
        DeliveryJournal::set_status(&self.inner, endpoint, status, reason, replay_after, fence)
    }

    fn record_attempt(&self, attempt: AttemptRecord) -> JournalFuture<'_, ()> {
        DeliveryJournal::record_attempt(&self.inner, attempt)
    }

    fn record_deliveries(
        &self,
        attempts: Vec<AttemptRecord>,
        lease: &Lease,
        epoch: u64,
        checkpoint: u64,
    ) -> JournalFuture<'_, bool> {
        if !self.current(lease) {
            return Box::pin(async move {
                for attempt in attempts {
                    DeliveryJournal::record_attempt(&self.inner, attempt).await?;
                }
                Ok(false)
            });
        }
        DeliveryJournal::record_deliveries(&self.inner, attempts, lease, epoch, checkpoint)
    }

    fn attempts(&self, endpoint: &str, limit: u64) -> JournalFuture<'_, Vec<AttemptRecord>> {
        DeliveryJournal::attempts(&self.inner, endpoint, limit)
    }

    fn acquire(&self, endpoint: &str, holder: &str, _lease_ms: u64) -> JournalFuture<'_, Acquired> {
        let mut leases = self.leases.lock().expect("lock");
        let lease = leases.entry(endpoint.to_owned()).or_default();
        let acquired = match &lease.0 {
            Some(other) => Acquired::HeldBy(other.clone()),
            None => {
                *lease = (Some(holder.to_owned()), lease.1 + 1);
                Acquired::Held(Lease {
                    endpoint: endpoint.to_owned(),
                    holder: holder.to_owned(),
                    token: lease.1,
                })
            }
        };
        Box::pin(async move { Ok(acquired) })
    }

    fn renew(&self, lease: &Lease, _lease_ms: u64) -> JournalFuture<'_, Option<u64>> {
        let current = self.current(lease);
        let endpoint = lease.endpoint.clone();
        Box::pin(async move {
            if !current {
                return Ok(None);
            }
            Ok(DeliveryJournal::record(&self.inner, &endpoint)
                .await?
                .map(|record| record.epoch))
        })
    }

    fn release(&self, lease: &Lease) -> JournalFuture<'_, ()> {
        if self.current(lease) {
            self.free(&lease.endpoint);
        }
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test]
async fn a_holder_whose_lease_is_taken_drops_the_attempt_under_way_and_moves_no_checkpoint() {
    let store = MemoryStore::new();
    let (receiver, url) = Receiver::start().await;
    let dir = dir();
    let journal = Arc::new(SharedLeases {
        inner: opledger_webhooks::Journal::open(dir.path().join("shared.webhooks"))
            .await
            .expect("opens"),
        leases: Mutex::default(),
    });
    let running = start_on(
        &store,
        &url,
        Arc::clone(&journal) as Arc<dyn DeliveryJournal>,
        "a",
        opledger_webhooks::MIN_WEBHOOK_LEASE_MS,
        dir,
    )
    .await;
    // The first answer takes far longer than the test: only a dropped attempt lets the
    // delivery come again soon.
    *receiver.delay.lock().expect("lock") = Duration::from_secs(60);
    append(&store, 1, "succeeded", "acme").await;
    let first = receiver.wait_for(1).await;
    *receiver.delay.lock().expect("lock") = Duration::ZERO;

    // Another instance takes the endpoint while the attempt waits for its answer: at its next
    // renewal this one learns it, stands by naming the holder, and drops the attempt.
    journal.hand_to("billing", "b");
    let started = Instant::now();
    loop {
        let overview = running
            .webhooks
            .endpoint("billing", None)
            .await
            .expect("listed");
        if overview.delivery
            == (DeliveryState::Standby {
                holder: Some("b".into()),
            })
        {
            assert_eq!(overview.checkpoint, None, "the loser moved no checkpoint");
            break;
        }
        assert!(started.elapsed() < DEADLINE, "never stood by: {overview:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // It gives the endpoint back: the event comes again under its id, answered at once, and
    // the dropped attempt left no row (only the new one's 200 is in the log).
    journal.free("billing");
    let again = receiver.wait_for(2).await;
    assert_eq!(again[1].id, first[0].id);
    assert!(
        again[1].at.duration_since(first[0].at) < Duration::from_secs(10),
        "the first attempt was not dropped: the second came after its request timeout (15 s)"
    );
    running.wait_for_checkpoint("billing", 1).await;
    let attempts = running
        .webhooks
        .attempts("billing", 10)
        .await
        .expect("lists");
    assert_eq!(
        attempts.iter().map(|a| a.status).collect::<Vec<_>>(),
        vec![Some(200)],
        "{attempts:?}"
    );
    running.shut().await;
}

/// The SQLite journal, counting the commits that write deliveries.
struct CountingJournal {
    inner: opledger_webhooks::Journal,
    /// The size of every batch of deliveries written, in order.
    batches: Mutex<Vec<usize>>,
}

impl DeliveryJournal for CountingJournal {
    fn shared(&self) -> bool {
        false
    }

    fn definitions(&self) -> JournalFuture<'_, Vec<(String, String)>> {
        DeliveryJournal::definitions(&self.inner)
    }

    fn define(&self, endpoint: &str, definition: Option<String>) -> JournalFuture<'_, ()> {
        DeliveryJournal::define(&self.inner, endpoint, definition)
    }

    fn ensure(&self, endpoint: &str, start: Option<u64>) -> JournalFuture<'_, EndpointRecord> {
        DeliveryJournal::ensure(&self.inner, endpoint, start)
    }

    fn record(&self, endpoint: &str) -> JournalFuture<'_, Option<EndpointRecord>> {
        DeliveryJournal::record(&self.inner, endpoint)
    }

    fn advance(&self, lease: &Lease, epoch: u64, position: u64) -> JournalFuture<'_, bool> {
        DeliveryJournal::advance(&self.inner, lease, epoch, position)
    }

    fn set_status(
        &self,
        endpoint: &str,
        status: EndpointStatus,
        reason: Option<String>,
        replay_after: Option<Option<u64>>,
        fence: Option<(u64, &Lease)>,
    ) -> JournalFuture<'_, bool> {
        DeliveryJournal::set_status(&self.inner, endpoint, status, reason, replay_after, fence)
    }

    fn record_attempt(&self, attempt: AttemptRecord) -> JournalFuture<'_, ()> {
        DeliveryJournal::record_attempt(&self.inner, attempt)
    }

    fn record_deliveries(
        &self,
        attempts: Vec<AttemptRecord>,
        lease: &Lease,
        epoch: u64,
        checkpoint: u64,
    ) -> JournalFuture<'_, bool> {
        self.batches.lock().expect("lock").push(attempts.len());
        DeliveryJournal::record_deliveries(&self.inner, attempts, lease, epoch, checkpoint)
    }

    fn attempts(&self, endpoint: &str, limit: u64) -> JournalFuture<'_, Vec<AttemptRecord>> {
        DeliveryJournal::attempts(&self.inner, endpoint, limit)
    }

    fn acquire(&self, endpoint: &str, holder: &str, lease_ms: u64) -> JournalFuture<'_, Acquired> {
        DeliveryJournal::acquire(&self.inner, endpoint, holder, lease_ms)
    }

    fn renew(&self, lease: &Lease, lease_ms: u64) -> JournalFuture<'_, Option<u64>> {
        DeliveryJournal::renew(&self.inner, lease, lease_ms)
    }

    fn release(&self, lease: &Lease) -> JournalFuture<'_, ()> {
        DeliveryJournal::release(&self.inner, lease)
    }
}

#[tokio::test]
async fn a_burst_of_deliveries_is_written_in_batches_each_recording_every_attempt_in_it() {
    const EVENTS: u64 = 300;
    let store = MemoryStore::new();
    // The burst is in the log before delivery starts: the task always has the next event ready.
    for n in 0..EVENTS {
        append(&store, n, "succeeded", "acme").await;
    }
    let (receiver, url) = Receiver::start().await;
    let dir = dir();
    let journal = Arc::new(CountingJournal {
        inner: opledger_webhooks::Journal::open(dir.path().join("counted.webhooks"))
            .await
            .expect("opens"),
        batches: Mutex::default(),
    });
    // A new endpoint starts at the log's head: created first at the beginning, it has the burst.
    journal
        .inner
        .ensure("billing", None)
        .await
        .expect("created");
    let running = start_on(
        &store,
        &url,
        Arc::clone(&journal) as Arc<dyn DeliveryJournal>,
        "only",
        opledger_webhooks::DEFAULT_WEBHOOK_LEASE_MS,
        dir,
    )
    .await;
    assert_eq!(
        positions(&receiver.wait_for(EVENTS as usize).await),
        (1..=EVENTS).collect::<Vec<_>>()
    );
    running.wait_for_checkpoint("billing", EVENTS).await;
    let batches = journal.batches.lock().expect("lock").clone();
    assert_eq!(
        batches.iter().sum::<usize>(),
        EVENTS as usize,
        "{batches:?}"
    );
    assert!(
        batches
            .iter()
            .all(|size| *size <= opledger_webhooks::CHECKPOINT_EVERY_DELIVERIES),
        "{batches:?}"
    );
    // One commit per delivery would be 300; batches of up to 100, cut early by the 100 ms
    // deadline on a slow machine, stay far below.
    assert!(
        batches.len() <= 30,
        "{} commits: {batches:?}",
        batches.len()
    );
    let attempts = running
        .webhooks
        .attempts("billing", 1_000)
        .await
        .expect("listed");
    assert_eq!(attempts.len(), EVENTS as usize);
    assert_eq!(attempts[0].position, EVENTS, "newest first");
    running.shut().await;
}

/// The memory store, whose subscriptions fail to start while `down` is set (a log that cannot be
/// read for a while), counting for each subscription how many events it handed out (what an
/// endpoint's task has taken from the log, delivered or not).
#[derive(Clone, Default)]
struct TestLog {
    inner: MemoryStore,
    down: Arc<std::sync::atomic::AtomicBool>,
    taken: Arc<Mutex<Vec<Arc<std::sync::atomic::AtomicUsize>>>>,
}

struct CountingSubscription {
    inner: <MemoryStore as EventStore>::Subscription,
    taken: Arc<std::sync::atomic::AtomicUsize>,
}

impl opledger_domain::store::Subscription for CountingSubscription {
    async fn next(&mut self) -> Result<RecordedEvent, opledger_domain::store::StoreError> {
        let next = self.inner.next().await;
        self.taken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        next
    }
}

impl EventStore for TestLog {
    type Subscription = CountingSubscription;

    async fn append(
        &self,
        stream: &StreamName,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> Result<opledger_domain::store::AppendOutcome, opledger_domain::store::StoreError> {
        self.inner.append(stream, expected, events).await
    }

    async fn read_stream(
        &self,
        stream: &StreamName,
        from: opledger_domain::ids::StreamVersion,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, opledger_domain::store::StoreError> {
        self.inner.read_stream(stream, from, max_count).await
    }

    async fn read_all(
        &self,
        start: opledger_domain::store::LogStart,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, opledger_domain::store::StoreError> {
        self.inner.read_all(start, max_count).await
    }

    async fn head_position(
        &self,
    ) -> Result<Option<opledger_domain::ids::GlobalPosition>, opledger_domain::store::StoreError>
    {
        self.inner.head_position().await
    }

    async fn subscribe_all(
        &self,
        start: opledger_domain::store::LogStart,
    ) -> Result<Self::Subscription, opledger_domain::store::StoreError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(opledger_domain::store::StoreError::Unavailable {
                reason: "the test took the log down".into(),
            });
        }
        let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        self.taken
            .lock()
            .expect("the counters")
            .push(Arc::clone(&taken));
        Ok(CountingSubscription {
            inner: self.inner.subscribe_all(start).await?,
            taken,
        })
    }
}

#[tokio::test]
async fn a_dead_endpoint_holds_no_more_than_its_bound_of_events_however_far_the_log_runs_ahead() {
    let store = TestLog::default();
    let dead_url = dead_receiver().await;
    let (receiver, url) = Receiver::start().await;
    let (stop, stopping) = watch::channel(false);
    let dir = dir();
    let webhooks = Webhooks::start(
        &store,
        Arc::new(DataRender),
        vec![endpoint("dead", &dead_url), endpoint("live", &url)],
        &dir.path().join("test.webhooks"),
        stopping,
    )
    .await
    .expect("webhooks start");
    // Four times the bound: a task that read ahead without one would take them all.
    let events = 4 * opledger_webhooks::MAX_QUEUE_EVENTS;
    for n in 0..events as u64 {
        append(&store.inner, n, "succeeded", "acme").await;
    }
    assert_eq!(receiver.wait_for(events).await.len(), events);
    // The dead endpoint's reading has had the time the live one needed, and more, to run ahead.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut taken: Vec<usize> = store
        .taken
        .lock()
        .expect("the counters")
        .iter()
        .map(|taken| taken.load(std::sync::atomic::Ordering::SeqCst))
        .collect();
    taken.sort_unstable();
    // The queue's events, the one waiting for room in it, and the one being delivered.
    let bound = opledger_webhooks::MAX_QUEUE_EVENTS + 2;
    assert_eq!(taken.len(), 2, "one subscription per endpoint: {taken:?}");
    assert!(
        taken[0] <= bound,
        "the dead endpoint took {} events from the log; its bound is {bound}",
        taken[0]
    );
    assert!(
        taken[1] >= events,
        "the live endpoint took only {} of {events} events",
        taken[1]
    );
    let _ = stop.send(true);
    webhooks.join().await;
}
