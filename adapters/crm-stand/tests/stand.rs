//! The CRM stand, driven over real HTTP on 127.0.0.1 with an ephemeral port: every shape's rules,
//! every fault kind as a client observes it, authentication, and the admin API.
//!
//! Time is the stand clock, moved with `POST /admin/clock/advance`; the only real waits are the
//! ones the contract makes real (a `late_response` delay, a client timeout), and they are short.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use opledger_crm_stand::{
    Fault, FaultKind, FaultMethod, Shape, Stand, StandAdmin, StandConfig, MAX_BODY_BYTES,
};
use reqwest::header::HeaderMap;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The provider adapters' client timeout, which faults are measured against.
const CLIENT_TIMEOUT_MS: u64 = 2_000;
/// A search lag long enough that "before the lag" cannot be reached by a slow test machine.
const LONG_LAG_MS: u64 = 3_600_000;
/// The bound on waiting for a condition the stand reaches by itself (a late response ending).
const EVENTUALLY_MS: u64 = 10_000;

const TOKEN_1: &str = "token-acct-1";

struct Fixture {
    stand: Stand,
    admin: StandAdmin,
    http: reqwest::Client,
}

/// What a provider request got back.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Value,
}

impl Answer {
    fn error_type(&self) -> &str {
        self.body["error"]["type"].as_str().unwrap_or("<none>")
    }

    fn id(&self) -> &str {
        self.body["id"].as_str().unwrap_or("<none>")
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

fn client(timeout_ms: u64) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(timeout_ms))
        .build()
        .expect("a plain HTTP client builds")
}

async fn start() -> Fixture {
    start_with(StandConfig::default()).await
}

async fn start_with(config: StandConfig) -> Fixture {
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("a loopback address");
    let stand = Stand::start(listen, config)
        .await
        .expect("the stand starts");
    let admin = StandAdmin::new(stand.base_url()).expect("the admin client builds");
    Fixture {
        stand,
        admin,
        http: client(CLIENT_TIMEOUT_MS),
    }
}

impl Fixture {
    async fn send_with(
        &self,
        http: &reqwest::Client,
        method: Method,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<String>,
    ) -> Result<Answer, reqwest::Error> {
        let mut request = http.request(method, format!("{}{path}", self.stand.base_url()));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await?;
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<String>,
    ) -> Answer {
        self.send_with(&self.http, method, path, token, headers, body)
            .await
            .expect("the stand answers")
    }

    async fn try_keyed(&self, key: &str, body: &Value) -> Result<Answer, reqwest::Error> {
        self.send_with(
            &self.http,
            Method::POST,
            "/keyed/acct-1/tasks",
            Some(TOKEN_1),
            &[("idempotency-key", key)],
            Some(body.to_string()),
        )
        .await
    }

    async fn keyed(&self, key: &str, body: &Value) -> Answer {
        self.try_keyed(key, body).await.expect("the stand answers")
    }

    async fn keyed_status(&self, key: &str) -> Answer {
        self.send(
            Method::GET,
            &format!("/keyed/acct-1/requests/{key}"),
            Some(TOKEN_1),
            &[],
            None,
        )
        .await
    }

    async fn labelled_put(&self, label: &str, body: &Value) -> Answer {
        self.send(
            Method::PUT,
            &format!("/labelled/acct-1/tasks/by-label/{label}"),
            Some(TOKEN_1),
            &[],
            Some(body.to_string()),
        )
        .await
    }

    async fn labelled_get(&self, label: &str) -> Answer {
        self.send(
            Method::GET,
            &format!("/labelled/acct-1/tasks/by-label/{label}"),
            Some(TOKEN_1),
            &[],
            None,
        )
        .await
    }

    async fn plain_create(&self, label: &str) -> Answer {
        self.send(
            Method::POST,
            "/plain/acct-1/tasks",
            Some(TOKEN_1),
            &[],
            Some(json!({"title": "call back", "opledger_label": label}).to_string()),
        )
        .await
    }

    async fn plain_search(&self, label: &str) -> Answer {
        self.send(
            Method::GET,
            &format!("/plain/acct-1/tasks/search?label={label}"),
            Some(TOKEN_1),
            &[],
            None,
        )
        .await
    }

    async fn object_count(&self) -> usize {
        self.admin.objects(None).await.expect("objects").len()
    }

    async fn queue(&self, fault: Fault) {
        self.admin.queue_fault(&fault).await.expect("fault queued");
    }

    async fn last_outcome(&self) -> String {
        let requests = self.admin.requests().await.expect("requests");
        requests
            .last()
            .map(|r| r.outcome.clone())
            .unwrap_or_default()
    }
}

fn task() -> Value {
    json!({"title": "call back", "due": "2025-01-01"})
}

fn assert_transport_failure(result: Result<Answer, reqwest::Error>, started: Instant) {
    let error = result.expect_err("the client must see no response");
    assert!(
        !error.is_timeout(),
        "a dropped connection is seen at once, not as a timeout: {error:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(CLIENT_TIMEOUT_MS / 2),
        "seen after {:?}",
        started.elapsed()
    );
}

// ---- keyed ----

#[tokio::test]
async fn keyed_create_then_replay_returns_the_first_answer_and_creates_nothing() {
    let f = start().await;
    let first = f.keyed("k1", &task()).await;
    assert_eq!((first.status, first.id()), (201, "731"));
    assert_eq!(first.header("request-id"), Some("req_1"));
    assert_eq!(first.header("idempotent-replayed"), None);

    let replay = f.keyed("k1", &task()).await;
    assert_eq!((replay.status, replay.id()), (201, "731"));
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.header("request-id"), Some("req_2"));
    assert_eq!(f.object_count().await, 1);
    assert_eq!(f.last_outcome().await, "replayed");

    let status = f.keyed_status("k1").await;
    assert_eq!(status.body, json!({"status": "completed", "id": "731"}));
    let unknown = f.keyed_status("never-used").await;
    assert_eq!((unknown.status, unknown.error_type()), (404, "not_found"));
}

#[tokio::test]
async fn keyed_same_key_with_a_different_body_is_refused_as_reuse() {
    let f = start().await;
    f.keyed("k1", &task()).await;
    let reused = f.keyed("k1", &json!({"title": "something else"})).await;
    assert_eq!(
        (reused.status, reused.error_type()),
        (400, "idempotency_key_reused")
    );
    assert_eq!(f.object_count().await, 1);
    assert_eq!(f.last_outcome().await, "refused");
}

#[tokio::test]
async fn keyed_requests_without_a_key_or_an_object_body_are_refused() {
    let f = start().await;
    let no_key = f
        .send(
            Method::POST,
            "/keyed/acct-1/tasks",
            Some(TOKEN_1),
            &[],
            Some(task().to_string()),
        )
        .await;
    assert_eq!(
        (no_key.status, no_key.error_type()),
        (400, "idempotency_key_missing")
    );
    for body in ["{not json", "[1, 2]", ""] {
        let bad = f
            .send(
                Method::POST,
                "/keyed/acct-1/tasks",
                Some(TOKEN_1),
                &[("idempotency-key", "k1")],
                Some(body.to_owned()),
            )
            .await;
        assert_eq!(
            (bad.status, bad.error_type()),
            (422, "invalid_body"),
            "{body:?}"
        );
        assert!(bad.body["error"]["message"].is_string());
    }
    assert_eq!(f.object_count().await, 0);
}

#[tokio::test]
async fn keyed_forgotten_key_creates_a_second_task_after_the_retention_passes() {
    let f = start().await;
    f.admin
        .set_config(Some(60), None)
        .await
        .expect("config set");
    let first = f.keyed("k1", &task()).await;
    f.admin.advance_clock_ms(60_000).await.expect("advance");
    let status = f.keyed_status("k1").await;
    assert_eq!((status.status, status.error_type()), (404, "not_found"));

    let late_retry = f.keyed("k1", &task()).await;
    assert_eq!(late_retry.status, 201);
    assert_eq!(late_retry.header("idempotent-replayed"), None);
    assert_ne!(late_retry.id(), first.id());
    assert_eq!(
        f.object_count().await,
        2,
        "the danger the ledger must avoid"
    );
}

// ---- labelled ----

#[tokio::test]
async fn labelled_create_find_again_conflict_and_lookup() {
    let f = start().await;
    let created = f.labelled_put("op-1", &task()).await;
    assert_eq!(created.status, 201);
    assert_eq!(created.body, json!({"id": "731", "created": true}));

    let again = f.labelled_put("op-1", &task()).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body, json!({"id": "731", "created": false}));

    let conflict = f.labelled_put("op-1", &json!({"title": "other"})).await;
    assert_eq!(
        (conflict.status, conflict.error_type()),
        (409, "label_conflict")
    );

    let found = f.labelled_get("op-1").await;
    assert_eq!(
        (found.status, found.body.clone()),
        (200, json!({"id": "731"}))
    );
    let missing = f.labelled_get("op-2").await;
    assert_eq!((missing.status, missing.error_type()), (404, "not_found"));
    assert_eq!(f.object_count().await, 1);
}

// ---- plain ----

#[tokio::test]
async fn plain_tasks_appear_in_search_only_after_the_lag() {
    let f = start().await;
    f.admin
        .set_config(None, Some(LONG_LAG_MS))
        .await
        .expect("config set");
    let first = f.plain_create("op-1").await;
    let second = f.plain_create("op-1").await;
    assert_eq!((first.status, first.id()), (201, "731"));
    assert_eq!(
        (second.status, second.id()),
        (201, "732"),
        "plain always creates"
    );

    let before = f.plain_search("op-1").await;
    assert_eq!(
        (before.status, before.body.clone()),
        (200, json!({"results": []}))
    );

    f.admin
        .advance_clock_ms(LONG_LAG_MS)
        .await
        .expect("advance");
    let after = f.plain_search("op-1").await;
    assert_eq!(
        after.body,
        json!({"results": [
            {"id": "731", "opledger_label": "op-1", "account": "acct-1"},
            {"id": "732", "opledger_label": "op-1", "account": "acct-1"},
        ]})
    );
    let other = f.plain_search("op-2").await;
    assert_eq!(
        (other.status, other.body.clone()),
        (200, json!({"results": []}))
    );
}

// ---- faults ----

#[tokio::test]
async fn drop_request_closes_the_connection_and_applies_nothing() {
    let f = start().await;
    f.queue(Fault::new(FaultKind::DropRequest).shape(Shape::Keyed))
        .await;
    let started = Instant::now();
    assert_transport_failure(f.try_keyed("k1", &task()).await, started);
    assert_eq!(f.object_count().await, 0);
    assert_eq!(f.last_outcome().await, "fault:drop_request");
    let status = f.keyed_status("k1").await;
    assert_eq!(status.status, 404, "the key was never seen");

    let retry = f.keyed("k1", &task()).await;
    assert_eq!((retry.status, retry.id()), (201, "731"));
}

#[tokio::test]
async fn drop_response_commits_then_closes_and_a_keyed_retry_replays() {
    let f = start().await;
    f.queue(Fault::new(FaultKind::DropResponse).shape(Shape::Keyed))
        .await;
    let started = Instant::now();
    assert_transport_failure(f.try_keyed("k1", &task()).await, started);
    let objects = f.admin.objects(Some("acct-1")).await.expect("objects");
    assert_eq!(objects.len(), 1, "the task was committed");
    assert_eq!(objects[0].key.as_deref(), Some("k1"));
    assert_eq!(f.last_outcome().await, "fault:drop_response");

    let retry = f.keyed("k1", &task()).await;
    assert_eq!((retry.status, retry.id()), (201, "731"));
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
}

#[tokio::test]
async fn late_response_outlasts_the_client_and_keeps_the_key_in_flight_until_sent() {
    const DELAY_MS: u64 = 1_500;
    const SHORT_TIMEOUT_MS: u64 = 300;
    let f = start().await;
    f.queue(
        Fault::new(FaultKind::LateResponse { delay_ms: DELAY_MS })
            .shape(Shape::Keyed)
            .method(FaultMethod::Post),
    )
    .await;
    let impatient = client(SHORT_TIMEOUT_MS);
    let gave_up = f
        .send_with(
            &impatient,
            Method::POST,
            "/keyed/acct-1/tasks",
            Some(TOKEN_1),
            &[("idempotency-key", "k1")],
            Some(task().to_string()),
        )
        .await
        .expect_err("the answer is held past the client's timeout");
    assert!(gave_up.is_timeout(), "{gave_up:?}");

    // The task exists from the moment of apply; the key is in flight while the answer is held.
    assert_eq!(f.object_count().await, 1);
    let in_flight = f.keyed("k1", &task()).await;
    assert_eq!(
        (in_flight.status, in_flight.error_type()),
        (409, "idempotency_in_flight")
    );
    assert_eq!(
        f.keyed_status("k1").await.body,
        json!({"status": "in_progress"})
    );

    // The delay ends by itself, whether or not the client waited for it.
    let deadline = Instant::now() + Duration::from_millis(EVENTUALLY_MS);
    while f.keyed_status("k1").await.body["status"] != "completed" {
        assert!(Instant::now() < deadline, "the held answer was never sent");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let replay = f.keyed("k1", &task()).await;
    assert_eq!((replay.status, replay.id()), (201, "731"));
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(f.object_count().await, 1);
}

#[tokio::test]
async fn late_response_reaches_a_client_that_waits() {
    const DELAY_MS: u64 = 300;
    let f = start().await;
    f.queue(Fault::new(FaultKind::LateResponse { delay_ms: DELAY_MS }).shape(Shape::Labelled))
        .await;
    let started = Instant::now();
    let late = f.labelled_put("op-1", &task()).await;
    assert!(started.elapsed() >= Duration::from_millis(DELAY_MS));
    assert_eq!(late.body, json!({"id": "731", "created": true}));
    assert_eq!(late.header("request-id"), Some("req_1"));
    assert_eq!(f.last_outcome().await, "fault:late_response");
}

#[tokio::test]
async fn error_after_commit_answers_the_status_but_the_task_exists() {
    let f = start().await;
    f.queue(
        Fault::new(FaultKind::ErrorAfterCommit {
            status: 503,
            retry_after_s: None,
        })
        .shape(Shape::Labelled),
    )
    .await;
    let failed = f.labelled_put("op-1", &task()).await;
    assert_eq!((failed.status, failed.error_type()), (503, "internal"));
    assert!(failed.header("request-id").is_some());
    assert_eq!(f.object_count().await, 1);
    assert_eq!(f.last_outcome().await, "fault:error_after_commit");

    let again = f.labelled_put("op-1", &task()).await;
    assert_eq!(again.body, json!({"id": "731", "created": false}));
}

#[tokio::test]
async fn error_before_commit_answers_the_status_and_applies_nothing() {
    let f = start().await;
    f.queue(Fault::new(FaultKind::ErrorBeforeCommit { status: 502 }).shape(Shape::Plain))
        .await;
    let failed = f.plain_create("op-1").await;
    assert_eq!((failed.status, failed.error_type()), (502, "internal"));
    assert_eq!(f.object_count().await, 0);
    assert_eq!(f.last_outcome().await, "fault:error_before_commit");
}

#[tokio::test]
async fn rate_limit_answers_429_with_retry_after_in_seconds() {
    let f = start().await;
    f.queue(
        Fault::new(FaultKind::RateLimit {
            retry_after_s: 7,
            retry_after_http_date: false,
        })
        .shape(Shape::Keyed),
    )
    .await;
    let limited = f.keyed("k1", &task()).await;
    assert_eq!(
        (limited.status, limited.error_type()),
        (429, "rate_limited")
    );
    assert_eq!(limited.header("retry-after"), Some("7"));
    assert_eq!(f.object_count().await, 0);
    assert_eq!(f.keyed_status("k1").await.status, 404, "no key recorded");
}

#[tokio::test]
async fn rate_limit_answers_429_with_retry_after_as_an_http_date_on_the_stand_clock() {
    let f = start().await;
    // A stand clock far from real time shows that the date is the stand's, not the machine's.
    let before_ms = f.admin.advance_clock_ms(86_400_000).await.expect("advance");
    f.queue(Fault::new(FaultKind::RateLimit {
        retry_after_s: 30,
        retry_after_http_date: true,
    }))
    .await;
    let limited = f.plain_create("op-1").await;
    let after_ms = f.admin.advance_clock_ms(0).await.expect("read the clock");
    assert_eq!(limited.status, 429);
    let date = limited.header("retry-after").expect("Retry-After");
    assert!(date.ends_with(" GMT") && date.len() == 29, "{date:?}");
    let at_s = chrono::DateTime::parse_from_rfc2822(date)
        .expect("an IMF-fixdate parses as RFC 2822")
        .timestamp();
    let at_ms = u64::try_from(at_s).expect("after 1970") * 1_000;
    assert!(
        at_ms >= before_ms + 30_000,
        "{date} is less than 30 s ahead"
    );
    assert!(at_ms <= after_ms + 31_000, "{date} is too far ahead");
}

#[tokio::test]
async fn faults_hit_only_matching_requests_in_order() {
    let f = start().await;
    f.queue(
        Fault::new(FaultKind::ErrorBeforeCommit { status: 500 })
            .account("acct-2")
            .method(FaultMethod::Get)
            .times(2),
    )
    .await;
    assert_eq!(f.labelled_put("op-1", &task()).await.status, 201);
    assert_eq!(
        f.labelled_get("op-1").await.status,
        200,
        "acct-1 is not matched"
    );
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let answer = f
            .send(
                Method::GET,
                "/labelled/acct-2/tasks/by-label/op-1",
                Some("token-acct-2"),
                &[],
                None,
            )
            .await;
        statuses.push(answer.status);
    }
    assert_eq!(statuses, [500, 500, 404], "two uses, then spent");
}

// ---- authentication and limits ----

#[tokio::test]
async fn wrong_or_missing_tokens_are_401_and_unknown_accounts_404_and_nothing_is_applied() {
    let f = start().await;
    for token in [Some("token-acct-2"), None] {
        let refused = f
            .send(
                Method::POST,
                "/keyed/acct-1/tasks",
                token,
                &[("idempotency-key", "k1")],
                Some(task().to_string()),
            )
            .await;
        assert_eq!(
            (refused.status, refused.error_type()),
            (401, "unauthorized")
        );
        assert!(refused.header("request-id").is_some());
    }
    let unknown = f
        .send(
            Method::PUT,
            "/labelled/acct-9/tasks/by-label/op-1",
            Some(TOKEN_1),
            &[],
            Some(task().to_string()),
        )
        .await;
    assert_eq!(
        (unknown.status, unknown.error_type()),
        (404, "account_not_found")
    );
    assert_eq!(f.object_count().await, 0);
    assert_eq!(f.last_outcome().await, "refused");
}

#[tokio::test]
async fn a_refused_request_does_not_consume_a_fault() {
    let f = start().await;
    f.queue(Fault::new(FaultKind::DropRequest)).await;
    let refused = f
        .send(
            Method::POST,
            "/plain/acct-1/tasks",
            None,
            &[],
            Some("{}".into()),
        )
        .await;
    assert_eq!(refused.status, 401);
    let started = Instant::now();
    let dropped = f
        .send_with(
            &f.http,
            Method::POST,
            "/plain/acct-1/tasks",
            Some(TOKEN_1),
            &[],
            Some("{}".into()),
        )
        .await;
    assert_transport_failure(dropped, started);
}

/// Sends raw bytes and reads until the stand closes the connection. A reset counts as a close:
/// what matters is which bytes arrived before it.
async fn raw_exchange(addr: SocketAddr, request: &str) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("write the request");
    let mut received = Vec::new();
    let read = tokio::time::timeout(
        Duration::from_millis(CLIENT_TIMEOUT_MS),
        stream.read_to_end(&mut received),
    )
    .await
    .expect("the stand closes the connection before the client's timeout");
    if let Err(e) = read {
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    }
    received
}

#[tokio::test]
async fn drop_faults_write_not_a_single_byte_of_a_response() {
    let f = start().await;
    let body = task().to_string();
    let request = format!(
        "POST /keyed/acct-1/tasks HTTP/1.1\r\nhost: stand\r\nauthorization: Bearer {TOKEN_1}\r\n\
         idempotency-key: k1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    for kind in [FaultKind::DropRequest, FaultKind::DropResponse] {
        f.queue(Fault::new(kind)).await;
        let received = raw_exchange(f.stand.addr(), &request).await;
        assert!(
            received.is_empty(),
            "{:?}",
            String::from_utf8_lossy(&received)
        );
    }
    assert_eq!(f.object_count().await, 1, "only drop_response applied");
    let answered = raw_exchange(f.stand.addr(), &request).await;
    assert!(
        answered.starts_with(b"HTTP/1.1 201 "),
        "{:?}",
        String::from_utf8_lossy(&answered)
    );
}

#[tokio::test]
async fn bodies_over_the_limit_are_refused_with_413_before_they_are_read() {
    let f = start().await;
    // Only the headers are sent: the stand must refuse on the announced length alone.
    let request = format!(
        "POST /plain/acct-1/tasks HTTP/1.1\r\nhost: stand\r\nauthorization: Bearer {TOKEN_1}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        MAX_BODY_BYTES + 1
    );
    let received =
        String::from_utf8(raw_exchange(f.stand.addr(), &request).await).expect("a UTF-8 answer");
    assert!(received.starts_with("HTTP/1.1 413 "), "{received:?}");
    assert!(received.contains("\"body_too_large\""), "{received:?}");
    assert!(
        received.to_ascii_lowercase().contains("request-id: req_1"),
        "{received:?}"
    );
    assert_eq!(f.object_count().await, 0);
}

// ---- admin ----

#[tokio::test]
async fn admin_objects_filter_and_the_request_log_records_every_provider_request() {
    let f = start().await;
    f.keyed("k1", &task()).await;
    f.labelled_put("op-1", &task()).await;
    f.send(
        Method::POST,
        "/plain/acct-2/tasks",
        Some("token-acct-2"),
        &[],
        Some(json!({"opledger_label": "op-1"}).to_string()),
    )
    .await;

    let all = f.admin.objects(None).await.expect("objects");
    let ids: Vec<_> = all.iter().map(|o| (o.id.as_str(), o.shape)).collect();
    assert_eq!(
        ids,
        [
            ("731", Shape::Keyed),
            ("732", Shape::Labelled),
            ("733", Shape::Plain)
        ]
    );
    assert_eq!(all[1].label.as_deref(), Some("op-1"));
    assert_eq!(
        all[0].fields,
        task().as_object().cloned().unwrap_or_default()
    );
    let acct2 = f.admin.objects(Some("acct-2")).await.expect("objects");
    assert_eq!(acct2.len(), 1);
    assert_eq!(acct2[0].label.as_deref(), Some("op-1"));

    let log = f.admin.requests().await.expect("requests");
    let summary: Vec<_> = log
        .iter()
        .map(|r| {
            (
                r.n,
                r.method.as_str(),
                r.path.as_str(),
                r.account.as_deref(),
                r.outcome.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (1, "POST", "/keyed/acct-1/tasks", Some("acct-1"), "applied"),
            (
                2,
                "PUT",
                "/labelled/acct-1/tasks/by-label/op-1",
                Some("acct-1"),
                "applied"
            ),
            (3, "POST", "/plain/acct-2/tasks", Some("acct-2"), "applied"),
        ]
    );
    assert_eq!(log[0].key.as_deref(), Some("k1"));
    assert_eq!(log[2].label.as_deref(), Some("op-1"));
}

#[tokio::test]
async fn reset_forgets_objects_keys_faults_and_the_log_but_keeps_config_and_tokens() {
    let f = start().await;
    f.admin
        .set_account_token("acct-3", "token-acct-3")
        .await
        .expect("account added");
    let settings = f
        .admin
        .set_config(Some(5), Some(10))
        .await
        .expect("config set");
    assert_eq!((settings.key_retention_s, settings.search_lag_ms), (5, 10));
    f.keyed("k1", &task()).await;
    f.queue(Fault::new(FaultKind::DropRequest)).await;

    f.admin.reset().await.expect("reset");
    assert_eq!(f.object_count().await, 0);
    assert!(f.admin.requests().await.expect("requests").is_empty());
    assert_eq!(f.admin.clear_faults().await.expect("cleared"), 0);

    let fresh = f.keyed("k1", &task()).await;
    assert_eq!(
        (fresh.status, fresh.id()),
        (201, "731"),
        "ids restart, the key is new"
    );
    assert_eq!(fresh.header("request-id"), Some("req_1"));
    let acct3 = f
        .send(
            Method::POST,
            "/plain/acct-3/tasks",
            Some("token-acct-3"),
            &[],
            Some("{}".into()),
        )
        .await;
    assert_eq!(acct3.status, 201, "tokens survive a reset");
    let settings = f.admin.set_config(None, None).await.expect("config read");
    assert_eq!((settings.key_retention_s, settings.search_lag_ms), (5, 10));
}

#[tokio::test]
async fn admin_refuses_faults_it_cannot_carry_out() {
    let f = start().await;
    let error = f
        .admin
        .queue_fault(&Fault::new(FaultKind::ErrorAfterCommit {
            status: 418,
            retry_after_s: None,
        }))
        .await
        .expect_err("418 is not a server error");
    assert!(error.to_string().contains("invalid_fault"), "{error}");
    f.admin.health().await.expect("healthz");
}

// ---- lifecycle ----

#[tokio::test]
async fn the_stand_refuses_to_listen_beyond_loopback() {
    let everywhere: SocketAddr = "0.0.0.0:0".parse().expect("an address");
    let refused = Stand::start(everywhere, StandConfig::default()).await;
    assert!(refused.is_err());
}

#[tokio::test]
async fn shutdown_is_prompt_even_while_a_response_is_held() {
    let f = start().await;
    f.queue(Fault::new(FaultKind::LateResponse { delay_ms: 60_000 }))
        .await;
    let base_url = f.stand.base_url();
    let held = tokio::spawn(async move {
        client(30_000)
            .put(format!("{base_url}/labelled/acct-1/tasks/by-label/op-1"))
            .bearer_auth(TOKEN_1)
            .body("{}")
            .send()
            .await
            .map(|response| response.status().as_u16())
    });
    // Wait until the stand holds the request, then stop it.
    let deadline = Instant::now() + Duration::from_millis(EVENTUALLY_MS);
    while f.object_count().await == 0 {
        assert!(Instant::now() < deadline, "the request never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    f.stand.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let answered = held.await.expect("the client task ends");
    assert_eq!(
        answered.ok(),
        Some(201),
        "a held answer is released on shutdown"
    );
}
