//! Outcome webhooks end to end: a real `opledger serve` delivering to a receiver written in Python
//! that verifies every delivery with the official Standard Webhooks library from PyPI
//! (`standardwebhooks`), not with this project's code. The receiver logs each request (path,
//! webhook-id, whether the signature verified, the payload) to a file, one JSON line each, and
//! answers per path: `/ok` 200, `/flaky` 500 twice then 200, `/429` 429 with `Retry-After: 2`
//! once then 200, `/gone` 410. Each line also says how many other requests to the same path
//! were under way when it arrived, so a test sees two instances delivering at once.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use super::python::python_venv::python_with as venv_python_with;
use super::support::{
    Harness, Server, DEADLINE, OPERATOR_B_TOKEN, OPERATOR_TOKEN, TENANT_A_TOKEN, TENANT_B_TOKEN,
};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SECRET_ENV: &str = "OPLEDGER_TEST_WEBHOOK_SECRET";

const RECEIVER: &str = r#"
import json, sys, threading, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
from standardwebhooks.webhooks import Webhook

secret, log_path, delay_ms = sys.argv[1], sys.argv[2], int(sys.argv[3])
webhook = Webhook(secret)
lock = threading.Lock()
counts = {}
inflight = {}

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        headers = {key.lower(): value for key, value in self.headers.items()}
        try:
            payload, verified, error = webhook.verify(body, headers), True, None
        except Exception as failure:
            payload, verified, error = None, False, repr(failure)
        with lock:
            n = counts.get(self.path, 0) + 1
            counts[self.path] = n
            overlapping = inflight.get(self.path, 0)
            inflight[self.path] = overlapping + 1
            with open(log_path, "a") as log:
                log.write(json.dumps({"path": self.path, "id": headers.get("webhook-id"),
                    "verified": verified, "error": error, "payload": payload, "at": time.time(),
                    "overlapping": overlapping}) + "\n")
        # A delivery is under way from its arrival until its answer is decided, not until the
        # answer's bytes are out: a sender that has read them sends its next request on a new
        # connection, which can arrive before this thread runs again, and would be counted as
        # overlapping this one although the one sender never had two requests out at once.
        try:
            status, extra = self.answer(verified, n)
        finally:
            with lock:
                inflight[self.path] -= 1
        self.send_response(status)
        for key, value in extra.items():
            self.send_header(key, value)
        self.send_header("content-length", "0")
        self.end_headers()

    def answer(self, verified, n):
        if delay_ms:
            time.sleep(delay_ms / 1000)
        status, extra = 200, {}
        if not verified:
            status = 400
        elif self.path == "/flaky" and n <= 2:
            status = 500
        elif self.path == "/429" and n == 1:
            status, extra = 429, {"Retry-After": "2"}
        elif self.path == "/gone":
            status = 410
        return status, extra

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

/// The receiver: a Python process and its log.
struct Receiver {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request the receiver logged.
#[derive(Debug, Clone)]
struct Logged {
    path: String,
    id: String,
    verified: bool,
    error: Option<String>,
    payload: Value,
    at: f64,
    /// Other requests to the same path under way when this one arrived.
    overlapping: u64,
}

impl Receiver {
    async fn start(dir: &Path, delay_ms: u64) -> Self {
        let python = tokio::task::spawn_blocking(|| {
            venv_python_with("webhooks-venv", &["standardwebhooks>=1.0.0"])
        })
        .await
        .expect("the virtual environment is made");
        let script = dir.join("receiver.py");
        std::fs::write(&script, RECEIVER).expect("the receiver is written");
        let log = dir.join("received.jsonl");
        let mut child = Command::new(python)
            .arg(&script)
            .arg(SECRET)
            .arg(&log)
            .arg(delay_ms.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the receiver starts");
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut first)
            .expect("the receiver prints its port");
        let port = first.trim().parse().expect("a port");
        Self { child, port, log }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn logged(&self, path: &str) -> Vec<Logged> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .map(|line| serde_json::from_str::<Value>(line).expect("a JSON line"))
            .map(|line| Logged {
                path: line["path"].as_str().unwrap_or_default().to_owned(),
                id: line["id"].as_str().unwrap_or_default().to_owned(),
                verified: line["verified"].as_bool().unwrap_or(false),
                error: line["error"].as_str().map(str::to_owned),
                payload: line["payload"].clone(),
                at: line["at"].as_f64().unwrap_or(0.0),
                overlapping: line["overlapping"].as_u64().unwrap_or(0),
            })
            .filter(|logged| logged.path == path)
            .inspect(|logged| {
                // Every verified delivery's data is the event stream's payload, as the catalog
                // documents it for its type.
                if logged.verified {
                    crate::contract::check_catalog(&logged.payload["data"]);
                }
            })
            .collect()
    }

    /// Waits until `done` holds for what `path` received.
    async fn wait_until(&self, path: &str, done: impl Fn(&[Logged]) -> bool) -> Vec<Logged> {
        let started = Instant::now();
        loop {
            let logged = self.logged(path);
            if done(&logged) {
                return logged;
            }
            assert!(
                started.elapsed() < DEADLINE * 2,
                "{path} never got what was expected; it got {logged:#?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// The harness's configuration with `entries` appended; serve started with the secret set.
fn serve_with_webhooks(harness: &Harness, entries: &str) -> (Server, PathBuf) {
    let mut text = std::fs::read_to_string(&harness.config).expect("the configuration");
    text.push_str(entries);
    let config = harness.dir.path().join("serve-webhooks.toml");
    std::fs::write(&config, text).expect("configuration written");
    let server = start(harness, &config);
    (server, config)
}

fn start(harness: &Harness, config: &Path) -> Server {
    Server::start_with_env(
        &["serve", "--config", &config.display().to_string()],
        harness.dir.path(),
        &[(SECRET_ENV, SECRET)],
    )
}

fn entry(id: &str, url: &str, events: &str) -> String {
    format!("\n[[webhooks]]\nid = \"{id}\"\nurl = \"{url}\"\nsecret_env = \"{SECRET_ENV}\"\nevents = {events}\n")
}

/// Records and executes `count` operations of tenant A, waiting for each to succeed.
async fn operations(server: &Server, title: &str, count: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for n in 0..count {
        let (_, recorded) = server
            .record(TENANT_A_TOKEN, "crm", &format!("{title} {n}"), None)
            .await;
        let id = recorded["operation_id"].as_str().expect("an id").to_owned();
        server.execute(TENANT_A_TOKEN, &id, 5_000).await;
        server
            .wait_for_state(TENANT_A_TOKEN, &id, &["succeeded"])
            .await;
        ids.push(id);
    }
    ids
}

/// Never skipped, in log order: each of `deliveries` is the next position after the highest
/// seen (starting after `highest`), or a repeat of one seen (a delivery a kill interrupted
/// before its checkpoint was written).
fn assert_in_log_order(deliveries: &[Logged], mut highest: u64) {
    for delivery in deliveries {
        let at = position(delivery);
        assert!(
            at <= highest + 1,
            "position {at} arrived after {highest}: a skip"
        );
        highest = highest.max(at);
    }
}

/// At least once: every position 1..=head of the log arrived, and each under one webhook-id
/// however often it came.
fn assert_every_position_arrived_under_one_id(logged: &[Logged], head: u64) {
    let mut ids: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for delivery in logged {
        ids.entry(position(delivery))
            .or_default()
            .insert(delivery.id.clone());
    }
    assert_eq!(
        ids.keys().copied().collect::<Vec<_>>(),
        (1..=head).collect::<Vec<_>>()
    );
    assert!(
        ids.values().all(|ids| ids.len() == 1),
        "a repeated event came under another webhook-id: {ids:?}"
    );
}

fn position(logged: &Logged) -> u64 {
    logged.payload["data"]["position"]
        .as_u64()
        .expect("a position")
}

#[tokio::test]
async fn every_event_reaches_the_receiver_verified_in_log_order_across_a_sigkill() {
    let harness = Harness::new("").await;
    // Each answer takes 150 ms, so deliveries trail the operations and the kill lands while
    // some are under way.
    let receiver = Receiver::start(harness.dir.path(), 150).await;
    let (server, config) =
        serve_with_webhooks(&harness, &entry("all", &receiver.url("/ok"), r#"["all"]"#));
    operations(&server, "before the kill", 4).await;
    receiver.wait_until("/ok", |logged| logged.len() >= 3).await;
    server.kill();
    let server = start(&harness, &config);
    operations(&server, "after the restart", 2).await;
    let head = server.log_head().await;
    let logged = receiver
        .wait_until("/ok", |logged| {
            logged.iter().map(position).collect::<BTreeSet<_>>().len() as u64 >= head
        })
        .await;
    if let Some(refused) = logged.iter().find(|l| !l.verified) {
        panic!(
            "standardwebhooks refused a delivery ({:?}): {refused:?}",
            refused.error
        );
    }
    // At least once: every position of the log arrived. Never skipped, in log order: each
    // delivery is either the next position after the highest seen, or a repeat of one seen (a
    // delivery the kill interrupted before its checkpoint was written).
    assert_in_log_order(&logged, 0);
    assert_every_position_arrived_under_one_id(&logged, head);
    let succeeded = logged
        .iter()
        .find(|l| l.payload["type"] == "operation.succeeded")
        .expect("a success was delivered");
    let data = &succeeded.payload["data"];
    assert_eq!(data["tenant"], "tenant-a");
    assert_eq!(data["state"], "succeeded");
    assert!(data["external_id"].is_string(), "{data}");
    assert!(
        data["sentence"]
            .as_str()
            .is_some_and(|s| s.starts_with("Done:")),
        "{data}"
    );
    assert!(
        data.get("args").is_none() && data.get("idempotency_key").is_none(),
        "arguments and keys are never sent: {data}"
    );
    // One payload for every subscriber: the event stream's data for each position is the
    // webhook's, member for member.
    let mut stream = server.events(TENANT_A_TOKEN, "?types=all", Some(0)).await;
    let streamed = stream.until(|event| event.id >= head).await;
    assert_eq!(
        streamed.len() as u64,
        head,
        "every event of tenant A's operations"
    );
    for event in &streamed {
        let delivered = logged
            .iter()
            .find(|l| position(l) == event.id)
            .expect("delivered");
        assert_eq!(
            event.data, delivered.payload["data"],
            "position {}",
            event.id
        );
    }
    println!(
        "{} deliveries for {head} events ({} repeated after the kill)",
        logged.len(),
        logged.len() as u64 - head
    );
}

#[tokio::test]
async fn failures_429_and_410_are_retried_disabled_listed_and_resumed_by_an_operator() {
    let harness = Harness::new("").await;
    let receiver = Receiver::start(harness.dir.path(), 0).await;
    let succeeded = r#"["succeeded"]"#;
    let entries = [
        entry("flaky", &receiver.url("/flaky"), succeeded),
        entry("slow", &receiver.url("/429"), succeeded),
        entry("gone", &receiver.url("/gone"), succeeded),
    ]
    .concat()
        + "tenants = [\"tenant-b\"]\n";
    let (server, _) = serve_with_webhooks(&harness, &entries);
    // `gone` is for tenant B only: an operator limited to tenant B sees it alone.
    let (status, listed) = server
        .call(Method::GET, "/v1/webhooks", Some(OPERATOR_B_TOKEN), None)
        .await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(
        listed["endpoints"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    // A tenant's token lists only endpoints it defined itself: none of the file's.
    let (status, listed) = server
        .call(Method::GET, "/v1/webhooks", Some(TENANT_A_TOKEN), None)
        .await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["endpoints"], json!([]), "{listed}");
    operations(&server, "retried", 1).await;
    let flaky = receiver.wait_until("/flaky", |l| l.len() >= 3).await;
    assert!(
        flaky.iter().all(|l| l.verified && l.id == flaky[0].id),
        "{flaky:#?}"
    );
    let slow = receiver.wait_until("/429", |l| l.len() >= 2).await;
    assert_eq!(slow[0].id, slow[1].id);
    assert!(
        slow[1].at - slow[0].at >= 1.95,
        "Retry-After: 2 was not honoured (the backoff alone waits at most 1 s): {slow:#?}"
    );
    // The receiver logs a request before its answer is recorded: wait for the third row.
    let attempts = wait_for_attempts(&server, "flaky", 3).await;
    let statuses: Vec<u64> = attempts["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| a["status"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(statuses, vec![200, 500, 500], "newest first: {attempts}");
    // Tenant B's operation goes to `gone`, which answers 410: disabled, and said so.
    let (_, recorded) = server
        .record(super::support::TENANT_B_TOKEN, "crm", "for b", None)
        .await;
    let id = recorded["operation_id"].as_str().expect("an id").to_owned();
    server
        .execute(super::support::TENANT_B_TOKEN, &id, 5_000)
        .await;
    receiver.wait_until("/gone", |l| !l.is_empty()).await;
    let gone = wait_for_endpoint(&server, "gone", |e| {
        e["status"] == "disabled" && e["disabled_total"] == 1
    })
    .await;
    assert!(
        gone["reason"].as_str().is_some_and(|r| r.contains("410")),
        "{gone}"
    );
    let text = metrics_text(&server).await;
    assert!(
        text.contains("opledger_webhook_disabled_total{endpoint=\"gone\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("opledger_webhook_delivered_total{endpoint=\"flaky\"} "),
        "{text}"
    );
    // The build's version, and time in seconds (Prometheus' base unit), not milliseconds.
    assert!(
        text.contains(&format!(
            "opledger_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )) && text.contains("opledger_provider_budget_wait_seconds_total{")
            && !text.contains("_ms_total"),
        "{text}"
    );
    // The operator resumes it: the same event is delivered again under the same id.
    let (status, resumed) = server
        .call(
            Method::POST,
            "/v1/webhooks/gone/resume",
            Some(OPERATOR_B_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, 200, "{resumed}");
    let again = receiver.wait_until("/gone", |l| l.len() >= 2).await;
    assert_eq!(again[0].id, again[1].id);
    // Replay from the beginning on `flaky`: its success is delivered again.
    let before = receiver.logged("/flaky").len();
    let (status, replayed) = server
        .call(
            Method::POST,
            "/v1/webhooks/flaky/replay",
            Some(OPERATOR_TOKEN),
            Some(&json!({"after_position": 0})),
        )
        .await;
    assert_eq!(status, 200, "{replayed}");
    let replays = receiver.wait_until("/flaky", |l| l.len() > before).await;
    assert_eq!(replays[before].id, flaky[0].id);
    let (status, _) = server
        .call(
            Method::POST,
            "/v1/webhooks/nope/pause",
            Some(OPERATOR_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, 404);
}

async fn wait_for_endpoint(server: &Server, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let (status, listed) = server
            .call(Method::GET, "/v1/webhooks", Some(OPERATOR_TOKEN), None)
            .await;
        assert_eq!(status, 200, "{listed}");
        let endpoint = listed["endpoints"]
            .as_array()
            .and_then(|all| all.iter().find(|e| e["id"] == id))
            .cloned()
            .expect("the endpoint is listed");
        if done(&endpoint) {
            return endpoint;
        }
        assert!(started.elapsed() < DEADLINE, "{id} stayed {endpoint}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn wait_for_attempts(server: &Server, id: &str, count: usize) -> Value {
    let started = Instant::now();
    loop {
        let (status, attempts) = server
            .call(
                Method::GET,
                &format!("/v1/webhooks/{id}/attempts?limit=10"),
                Some(OPERATOR_TOKEN),
                None,
            )
            .await;
        assert_eq!(status, 200, "{attempts}");
        if attempts["attempts"].as_array().map_or(0, Vec::len) >= count {
            return attempts;
        }
        assert!(started.elapsed() < DEADLINE, "{id} has {attempts}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn metrics_text(server: &Server) -> String {
    reqwest::get(format!("{}/metrics", server.base))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text")
}

#[tokio::test]
async fn replay_since_a_time_delivers_again_exactly_the_events_from_that_time_on() {
    let harness = Harness::new("").await;
    let receiver = Receiver::start(harness.dir.path(), 0).await;
    let (server, _) =
        serve_with_webhooks(&harness, &entry("all", &receiver.url("/ok"), r#"["all"]"#));
    operations(&server, "early", 1).await;
    let early_head = server.log_head().await;
    receiver
        .wait_until("/ok", |l| l.len() as u64 >= early_head)
        .await;
    let since = chrono::Utc::now();
    operations(&server, "late", 1).await;
    let head = server.log_head().await;
    let before = receiver
        .wait_until("/ok", |l| l.len() as u64 >= head)
        .await
        .len();
    let (status, replayed) = server
        .call(
            Method::POST,
            "/v1/webhooks/all/replay",
            Some(OPERATOR_TOKEN),
            Some(&json!({ "since": since })),
        )
        .await;
    assert_eq!(status, 200, "{replayed}");
    // The task may already have delivered again by the time the answer is read.
    assert!(
        replayed["checkpoint"].as_u64() >= Some(early_head),
        "{replayed}"
    );
    let late = head - early_head;
    let logged = receiver
        .wait_until("/ok", |l| (l.len() - before) as u64 >= late)
        .await;
    let again: Vec<u64> = logged[before..].iter().map(position).collect();
    assert_eq!(again, (early_head + 1..=head).collect::<Vec<_>>());
    let (status, refused) = server
        .call(
            Method::POST,
            "/v1/webhooks/all/replay",
            Some(OPERATOR_TOKEN),
            Some(&json!({})),
        )
        .await;
    assert_eq!(status, 422, "{refused}");
    // A replay after the head would skip every event until the log reached it: refused, naming
    // the head, and the endpoint goes on delivering what comes next.
    let head = server.log_head().await;
    let (status, refused) = server
        .call(
            Method::POST,
            "/v1/webhooks/all/replay",
            Some(OPERATOR_TOKEN),
            Some(&json!({ "after_position": head + 999_999 })),
        )
        .await;
    assert_eq!(status, 422, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains(&format!("from 0 to {head}"))),
        "{refused}"
    );
    let delivered = receiver.logged("/ok").len();
    operations(&server, "after the refusal", 1).await;
    let head_after = server.log_head().await;
    receiver
        .wait_until("/ok", |l| {
            l.len() as u64 >= delivered as u64 + head_after - head
        })
        .await;
}

#[tokio::test]
async fn a_dead_endpoint_beside_a_live_one_does_not_hold_it_back() {
    let harness = Harness::new("").await;
    let receiver = Receiver::start(harness.dir.path(), 0).await;
    // The dead receiver accepts connections and never answers: every attempt waits out the
    // request timeout, then the backoff.
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let dead_url = format!("http://{}/hooks", dead.local_addr().expect("an address"));
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = dead.accept().await {
            held.push(socket);
        }
    });
    let entries = [
        entry("dead", &dead_url, r#"["all"]"#),
        entry("live", &receiver.url("/ok"), r#"["all"]"#),
    ]
    .concat();
    let (server, _) = serve_with_webhooks(&harness, &entries);
    let started = Instant::now();
    operations(&server, "beside a dead one", 10).await;
    let head = server.log_head().await;
    let logged = receiver.wait_until("/ok", |l| l.len() as u64 >= head).await;
    assert_eq!(
        logged.iter().map(position).collect::<Vec<_>>(),
        (1..=head).collect::<Vec<_>>()
    );
    let elapsed = started.elapsed();
    let dead = wait_for_endpoint(&server, "dead", |_| true).await;
    let live = wait_for_endpoint(&server, "live", |e| e["lag_positions"] == 0).await;
    assert_eq!(dead["delivered_total"], 0, "{dead}");
    assert_eq!(dead["lag_positions"], json!(head), "{dead}");
    assert_eq!(live["delivered_total"], json!(head), "{live}");
    // One attempt at the dead endpoint waits 15 s; the live one finished long before.
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");

    // /metrics tells them apart: the live endpoint's every delivery is in its latency histogram
    // and its last success is now; the dead one has no delivery and no last success at all.
    let samples = metric_samples(&metrics_text(&server).await);
    let sample = |series: &str| {
        samples
            .get(series)
            .copied()
            .unwrap_or_else(|| panic!("{series} missing from {samples:#?}"))
    };
    let latency = "opledger_webhook_delivery_latency_seconds";
    assert_eq!(
        sample(&format!("{latency}_count{{endpoint=\"live\"}}")),
        head as f64
    );
    assert_eq!(
        sample(&format!(
            "{latency}_bucket{{endpoint=\"live\",le=\"+Inf\"}}"
        )),
        head as f64
    );
    let live_sum = sample(&format!("{latency}_sum{{endpoint=\"live\"}}"));
    assert!(
        live_sum > 0.0 && live_sum < elapsed.as_secs_f64() * head as f64,
        "{live_sum}"
    );
    assert_eq!(
        sample(&format!("{latency}_count{{endpoint=\"dead\"}}")),
        0.0
    );
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let last = sample("opledger_webhook_last_success_timestamp_seconds{endpoint=\"live\"}");
    assert!(
        now_s - last >= 0.0 && now_s - last < elapsed.as_secs_f64() + 5.0,
        "{last} vs {now_s}"
    );
    assert!(
        !samples.contains_key("opledger_webhook_last_success_timestamp_seconds{endpoint=\"dead\"}")
    );
    // The standard process series, as every Prometheus client exports them.
    assert!(sample("process_cpu_seconds_total") > 0.0);
    assert!(sample("process_resident_memory_bytes") > 1_000_000.0);
    assert!(sample("process_virtual_memory_bytes") >= sample("process_resident_memory_bytes"));
    assert!(sample("process_open_fds") >= 3.0);
    assert!(sample("process_max_fds") >= sample("process_open_fds"));
    let started_s = sample("process_start_time_seconds");
    assert!(
        started_s <= now_s && now_s - started_s < 600.0,
        "{started_s} vs {now_s}"
    );
}

/// The samples of a Prometheus text answer: each series (name and labels, as written) to its
/// value; every sample line must parse.
fn metric_samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("a sample: {line}"));
            let value = value
                .parse()
                .unwrap_or_else(|_| panic!("a sample's value: {line}"));
            (series.to_owned(), value)
        })
        .collect()
}

/// Two instances on one PostgreSQL ledger with one endpoint: the lease makes one of them the
/// sender and the other a standby naming it; the receiver never has two deliveries under way
/// at once and gets each event once while both run. SIGKILL of the holder mid-stream: the
/// standby takes the endpoint over within the lease (and one renewal period), and every event
/// reaches the receiver at least once, in log order, none skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_postgres_deliver_an_endpoint_one_at_a_time_and_a_killed_holders_is_taken_over(
) {
    /// The lease the instances run with (`webhook_lease_ms`).
    const LEASE_MS: u64 = 2_000;
    /// What a takeover may take beyond the lease and a renewal period: the survivor's first
    /// delivery (rendering, a 150 ms answer) on a machine shared with other builds.
    const TAKEOVER_MARGIN_MS: u64 = 3_000;
    let database = crate::postgres_server::server().database();
    let url = crate::postgres_server::server().url(&database);
    let harness = Harness::with_store("", Some(url)).await;
    // Each answer takes 150 ms, so deliveries trail the operations and the kill lands while
    // some are under way.
    let receiver = Receiver::start(harness.dir.path(), 150).await;
    let text = std::fs::read_to_string(&harness.config).expect("the configuration");
    // A top-level key goes before the file's first table.
    let text = format!("webhook_lease_ms = {LEASE_MS}\n{text}")
        + &entry("all", &receiver.url("/ok"), r#"["all"]"#);
    std::fs::write(&harness.config, text).expect("configuration written");
    let mut servers: Vec<Server> = (0..2)
        .map(|n| start(&harness, &harness.instance_config(n, &[])))
        .collect();

    // One holds the lease; the other stands by and names it.
    let (holder, standby) = holder_and_standby(&servers).await;
    let holder_pid = servers[holder].pid();
    operations(&servers[standby], "while both run", 2).await;
    operations(&servers[holder], "while both run", 1).await;
    let head = servers[0].log_head().await;
    let before_kill = receiver
        .wait_until("/ok", |logged| {
            logged.iter().map(position).collect::<BTreeSet<_>>().len() as u64 >= head
        })
        .await;
    let mut ids: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for delivery in &before_kill {
        ids.entry(position(delivery))
            .or_default()
            .insert(delivery.id.clone());
    }
    assert_eq!(
        before_kill.len() as u64,
        head,
        "while both instances ran, each event arrived once (one sender): {ids:?}"
    );

    let first_head = head;
    // The holder has recorded its last delivery and waits for events: nothing of its own will
    // make it read the endpoint's record again.
    wait_for_endpoint(&servers[holder], "all", |e| e["checkpoint"] == json!(head)).await;
    // An operator replays through the standby: the holder hears of it at its next renewal
    // (the endpoint's epoch moved) and delivers the history again, though no new event came.
    let (status, replayed) = servers[standby]
        .call(
            Method::POST,
            "/v1/webhooks/all/replay",
            Some(OPERATOR_TOKEN),
            Some(&json!({"after_position": 0})),
        )
        .await;
    assert_eq!(status, 200, "{replayed}");
    let replayed = receiver
        .wait_until("/ok", |logged| logged.len() as u64 >= 2 * head)
        .await;

    // Mid-stream: more events than the receiver has answered when the holder is killed.
    let survivor_index = standby;
    operations(&servers[survivor_index], "before the kill", 3).await;
    let delivered = replayed.len();
    receiver
        .wait_until("/ok", |logged| logged.len() > delivered)
        .await;
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let victim = servers.remove(holder);
    victim.kill();
    let survivor = &servers[0];
    operations(survivor, "after the kill", 2).await;
    let head = survivor.log_head().await;
    let logged = receiver
        .wait_until("/ok", |logged| {
            logged.iter().map(position).collect::<BTreeSet<_>>().len() as u64 >= head
        })
        .await;
    if let Some(refused) = logged.iter().find(|l| !l.verified) {
        panic!(
            "standardwebhooks refused a delivery ({:?}): {refused:?}",
            refused.error
        );
    }
    let overlapping: Vec<&Logged> = logged.iter().filter(|l| l.overlapping > 0).collect();
    assert!(
        overlapping.is_empty(),
        "two deliveries were under way at once (two senders): {overlapping:#?}"
    );
    // After the replay (which starts again from position 1), in log order: each delivery is
    // the next position after the highest seen, or a repeat (the one the kill interrupted).
    assert_in_log_order(&logged[delivered..], first_head);
    assert_every_position_arrived_under_one_id(&logged, head);
    // The takeover: from the kill to the first delivery the survivor made.
    let first_after = logged
        .iter()
        .find(|l| l.at > killed_at)
        .map(|l| l.at)
        .expect("deliveries after the kill");
    let takeover_ms = ((first_after - killed_at) * 1000.0) as u64;
    let survivor_view = wait_for_endpoint(survivor, "all", |e| {
        e["delivery"]["state"] == "delivering" && e["lag_positions"] == 0
    })
    .await;
    println!(
        "holder serve-{holder_pid} SIGKILLed: the other instance delivered {takeover_ms} ms later (lease {LEASE_MS} ms); {} deliveries for {head} events ({first_head} replayed, {} repeated after the kill)",
        logged.len(),
        logged.len() as u64 - head - first_head
    );
    let bound = LEASE_MS + LEASE_MS / 3 + TAKEOVER_MARGIN_MS;
    assert!(
        takeover_ms <= bound,
        "the endpoint was taken over in {takeover_ms} ms, over {bound} ms: {survivor_view}"
    );
}

/// Which of two servers holds the endpoint `all`'s lease (delivering) and which stands by
/// naming it, once they agree.
async fn holder_and_standby(servers: &[Server]) -> (usize, usize) {
    let started = Instant::now();
    loop {
        let mut states = Vec::new();
        for server in servers {
            let endpoint = wait_for_endpoint(server, "all", |_| true).await;
            states.push(endpoint["delivery"].clone());
        }
        let delivering: Vec<usize> = (0..servers.len())
            .filter(|&n| states[n]["state"] == "delivering")
            .collect();
        let standing_by: Vec<usize> = (0..servers.len())
            .filter(|&n| states[n]["state"] == "standby")
            .collect();
        if let ([holder], [standby]) = (delivering.as_slice(), standing_by.as_slice()) {
            let named = states[*standby]["holder"].as_str().unwrap_or_default();
            if named.starts_with(&format!("serve-{}-", servers[*holder].pid())) {
                return (*holder, *standby);
            }
        }
        assert!(
            started.elapsed() < DEADLINE,
            "no single holder with a standby naming it: {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A proxy named by the environment (`HTTP_PROXY` and its kin) would resolve an endpoint's name
/// itself, past the check that refuses private addresses: deliveries never go through one.
#[tokio::test]
async fn deliveries_never_go_through_a_proxy_named_by_the_environment() {
    let harness = Harness::new("").await;
    let receiver = Receiver::start(harness.dir.path(), 0).await;
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port for the would-be proxy");
    let proxy_url = format!("http://{}", proxy.local_addr().expect("its address"));
    let reached = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&reached);
    tokio::spawn(async move {
        while let Ok((connection, _)) = proxy.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(connection);
        }
    });
    let mut text = std::fs::read_to_string(&harness.config).expect("the configuration");
    text.push_str(&entry("all", &receiver.url("/ok"), r#"["succeeded"]"#));
    let config = harness.dir.path().join("serve-webhooks.toml");
    std::fs::write(&config, text).expect("configuration written");
    let mut env = vec![(SECRET_ENV, SECRET)];
    for name in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        env.push((name, proxy_url.as_str()));
    }
    let server = Server::start_with_env(
        &["serve", "--config", &config.display().to_string()],
        harness.dir.path(),
        &env,
    );
    operations(&server, "with a proxy in the environment", 1).await;
    let logged = receiver
        .wait_until("/ok", |logged| !logged.is_empty())
        .await;
    assert!(logged[0].verified, "{:?}", logged[0].error);
    assert_eq!(
        reached.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the delivery went straight to the endpoint"
    );
}

/// Every request the receiver logged at `path`, as raw JSON lines (test events included, which
/// are no event of the catalog).
fn raw_lines(receiver: &Receiver, path: &str) -> Vec<Value> {
    std::fs::read_to_string(&receiver.log)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("a JSON line"))
        .filter(|line| line["path"] == path)
        .collect()
}

#[tokio::test]
async fn an_endpoint_defined_through_the_api_receives_deliveries_signed_with_a_secret_rotated_through_the_api(
) {
    let harness = Harness::new("").await;
    let receiver = Receiver::start(harness.dir.path(), 0).await;
    // No [[webhooks]] in the file: the endpoint comes from the API, without a restart.
    let server = start(&harness, &harness.config);
    let url = receiver.url("/api");
    let first_secret = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

    // Bad input is refused with the field named and nothing defined.
    for (body, field, says) in [
        (
            json!({"id": "crm-sync", "url": "https://169.254.169.254/latest", "events": ["succeeded"]}),
            "url",
            "allow_private_network",
        ),
        (
            json!({"id": "crm-sync", "url": url, "events": ["delivered"]}),
            "events",
            "delivered",
        ),
        (
            json!({"id": "crm sync", "url": url, "events": ["succeeded"]}),
            "id",
            "letters, digits",
        ),
        (
            json!({"id": "crm-sync", "url": url, "events": ["succeeded"], "secret": "hunter2"}),
            "secret",
            "whsec_",
        ),
        (
            json!({"id": "crm-sync", "url": url, "events": ["succeeded"], "tenants": ["tenant-z"]}),
            "tenants",
            "tenant-z",
        ),
    ] {
        let (status, refused) = server.post("/v1/webhooks", OPERATOR_TOKEN, &body).await;
        assert_eq!(status, 422, "{body} → {refused}");
        assert!(
            refused["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(field) && m.contains(says)),
            "{field}: {refused}"
        );
    }
    let (_, listed) = server
        .call(Method::GET, "/v1/webhooks", Some(OPERATOR_TOKEN), None)
        .await;
    assert_eq!(
        listed["endpoints"],
        json!([]),
        "nothing was defined: {listed}"
    );

    let (status, created) = server
        .post(
            "/v1/webhooks",
            OPERATOR_TOKEN,
            &json!({"id": "crm-sync", "url": url, "events": ["succeeded"], "secret": first_secret}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["source"], "api", "{created}");
    assert_eq!(created["secret"], first_secret);
    let (status, again) = server
        .post(
            "/v1/webhooks",
            OPERATOR_TOKEN,
            &json!({"id": "crm-sync", "url": url, "events": ["succeeded"]}),
        )
        .await;
    assert_eq!(status, 409, "{again}");

    // Rotated to the secret the receiver verifies with; the first keeps signing for an hour,
    // so a receiver still on it would verify too (Standard Webhooks' several signatures).
    let (status, rotated) = server
        .post(
            "/v1/webhooks/crm-sync/rotate-secret",
            OPERATOR_TOKEN,
            &json!({"secret": SECRET, "overlap_s": 3600}),
        )
        .await;
    assert_eq!(status, 200, "{rotated}");
    assert!(
        rotated["previous_secret_expires_at"].is_string(),
        "{rotated}"
    );

    let ids = operations(&server, "defined through the API", 1).await;
    let logged = receiver
        .wait_until("/api", |logged| {
            logged
                .iter()
                .any(|l| l.payload["type"] == "operation.succeeded")
        })
        .await;
    let delivered = logged
        .iter()
        .find(|l| l.payload["type"] == "operation.succeeded")
        .expect("delivered");
    assert!(
        delivered.verified,
        "standardwebhooks verifies with the rotated secret: {:?}",
        delivered.error
    );
    assert_eq!(delivered.payload["data"]["operation_id"], ids[0].as_str());
    let position = position(delivered);

    // Resend that one event to this endpoint: the same webhook-id, verified again.
    let (status, resent) = server
        .post(
            "/v1/webhooks/crm-sync/resend",
            OPERATOR_TOKEN,
            &json!({"position": position}),
        )
        .await;
    assert_eq!(status, 200, "{resent}");
    assert_eq!(resent["attempt"]["status"], 200, "{resent}");
    let again = receiver
        .wait_until("/api", |logged| {
            logged.iter().filter(|l| l.id == delivered.id).count() == 2
        })
        .await;
    assert!(again.iter().all(|l| l.verified));

    // A test event: sent at once, its answer returned, verified by the receiver.
    let (status, tested) = server
        .post("/v1/webhooks/crm-sync/test", OPERATOR_TOKEN, &json!({}))
        .await;
    assert_eq!(status, 200, "{tested}");
    assert_eq!(tested["attempt"]["status"], 200, "{tested}");
    let test_line = raw_lines(&receiver, "/api")
        .into_iter()
        .find(|line| line["payload"]["type"] == "webhook.test")
        .expect("the test event arrived");
    assert_eq!(test_line["verified"], true, "{test_line}");
    let (_, attempts) = server
        .call(
            Method::GET,
            "/v1/webhooks/crm-sync/attempts",
            Some(OPERATOR_TOKEN),
            None,
        )
        .await;
    // The resend and the test are in the attempt log (the first delivery's own row comes with
    // its batch's commit, which may be a moment later).
    let logged = attempts["attempts"].as_array().expect("attempts");
    let resend_logged = logged
        .iter()
        .any(|a| a["webhook_id"] == delivered.id.as_str() && a["position"] == position);
    let test_logged = logged.iter().any(|a| {
        a["position"] == 0
            && a["webhook_id"]
                .as_str()
                .is_some_and(|id| id.starts_with("msg_test_"))
    });
    assert!(
        resend_logged && test_logged,
        "the resend and the test are in the attempt log: {attempts}"
    );

    // Changed and then deleted, each without a restart.
    let (status, changed) = server
        .call(
            Method::PATCH,
            "/v1/webhooks/crm-sync",
            Some(OPERATOR_TOKEN),
            Some(&json!({"events": ["succeeded", "needs_review"]})),
        )
        .await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["events"], json!(["needs_review", "succeeded"]));
    let (status, deleted) = server
        .call(
            Method::DELETE,
            "/v1/webhooks/crm-sync",
            Some(OPERATOR_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, 200, "{deleted}");
    let (_, listed) = server
        .call(Method::GET, "/v1/webhooks", Some(OPERATOR_TOKEN), None)
        .await;
    assert_eq!(listed["endpoints"], json!([]), "{listed}");
}

#[tokio::test]
async fn an_endpoint_from_the_configuration_file_is_not_changed_through_the_api() {
    let harness = Harness::new("").await;
    let (server, _) = serve_with_webhooks(
        &harness,
        &entry("billing", "http://127.0.0.1:9/ok", r#"["succeeded"]"#),
    );
    for (method, path) in [
        (Method::PATCH, "/v1/webhooks/billing"),
        (Method::DELETE, "/v1/webhooks/billing"),
        (Method::POST, "/v1/webhooks/billing/rotate-secret"),
    ] {
        let (status, refused) = server
            .call(method, path, Some(OPERATOR_TOKEN), Some(&json!({})))
            .await;
        assert_eq!(status, 409, "{path}: {refused}");
        assert_eq!(refused["error"]["code"], "configured_in_file", "{refused}");
    }
}

#[tokio::test]
async fn a_tenants_endpoint_may_not_post_to_loopback_unless_an_operator_allows_it_for_that_tenant()
{
    let harness = Harness::new("").await;
    let config = harness.instance_config(
        0,
        &[(
            "[[tenants]]\nid = \"tenant-b\"",
            "[[tenants]]\nid = \"tenant-b\"\nwebhooks_to_loopback = true",
        )],
    );
    let server = start(&harness, &config);
    // Any port of the server's own host, in every way loopback is written: tenant A would learn
    // from each delivery's status what listens there.
    for url in [
        "http://127.0.0.1:5432/",
        "http://127.9.9.9:6379/hooks",
        "http://[::1]:22/",
        "http://LOCALHOST:8080/hooks",
        "https://localhost/hooks",
    ] {
        let body = json!({"id": "a-probe", "url": url, "events": ["succeeded"], "secret": SECRET});
        let (status, refused) = server.post("/v1/webhooks", TENANT_A_TOKEN, &body).await;
        assert_eq!(status, 403, "{url}: {refused}");
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("may not post to loopback")
                && message.contains("webhooks_to_loopback = true"),
            "{url}: {refused}"
        );
    }
    let (_, listed) = server
        .call(Method::GET, "/v1/webhooks", Some(TENANT_A_TOKEN), None)
        .await;
    assert_eq!(
        listed["endpoints"],
        json!([]),
        "nothing was defined: {listed}"
    );
    // A public address is the tenant's to choose; moving it to loopback afterwards is refused too.
    let public = json!({"id": "a-feed", "url": "https://hooks.example.com/opledger", "events": ["succeeded"], "secret": SECRET});
    let (status, defined) = server.post("/v1/webhooks", TENANT_A_TOKEN, &public).await;
    assert_eq!(status, 201, "{defined}");
    let (status, refused) = server
        .call(
            Method::PATCH,
            "/v1/webhooks/a-feed",
            Some(TENANT_A_TOKEN),
            Some(&json!({"url": "http://127.0.0.1:5432/"})),
        )
        .await;
    assert_eq!(status, 403, "{refused}");
    // The tenant the operator allowed, and operators themselves, may.
    for (token, id) in [(TENANT_B_TOKEN, "b-local"), (OPERATOR_TOKEN, "ops-local")] {
        let body = json!({"id": id, "url": "http://127.0.0.1:9/hooks", "events": ["succeeded"], "secret": SECRET});
        let (status, defined) = server.post("/v1/webhooks", token, &body).await;
        assert_eq!(status, 201, "{id}: {defined}");
    }
}

/// Records and executes one operation of the tenant whose token is `token`, waiting for it to
/// succeed; its id.
async fn succeeded_for(server: &Server, token: &str, title: &str) -> String {
    let (_, recorded) = server.record(token, "crm", title, None).await;
    let id = recorded["operation_id"].as_str().expect("an id").to_owned();
    server.execute(token, &id, 5_000).await;
    server.wait_for_state(token, &id, &["succeeded"]).await;
    id
}

#[tokio::test]
async fn a_tenant_manages_its_own_endpoints_which_receive_its_events_alone_and_never_sees_anothers()
{
    let harness = Harness::new("").await;
    let receiver = Receiver::start(harness.dir.path(), 0).await;
    // The receiver listens on loopback, which a tenant's endpoint reaches only when the operator
    // allows it for that tenant.
    let config = harness.instance_config(
        0,
        &[
            (
                "[[tenants]]\nid = \"tenant-a\"",
                "[[tenants]]\nid = \"tenant-a\"\nwebhooks_to_loopback = true",
            ),
            (
                "[[tenants]]\nid = \"tenant-b\"",
                "[[tenants]]\nid = \"tenant-b\"\nwebhooks_to_loopback = true",
            ),
        ],
    );
    let server = start(&harness, &config);
    let define = |token: &'static str, id: &str, path: &str| {
        let body =
            json!({"id": id, "url": receiver.url(path), "events": ["succeeded"], "secret": SECRET});
        let server = &server;
        async move { server.post("/v1/webhooks", token, &body).await }
    };
    let (status, ops) = define(OPERATOR_TOKEN, "ops-feed", "/ops").await;
    assert_eq!(status, 201, "{ops}");
    let (status, a_feed) = define(TENANT_A_TOKEN, "a-feed", "/a").await;
    assert_eq!(status, 201, "{a_feed}");
    assert_eq!(a_feed["managed_by"], "tenant-a", "{a_feed}");
    assert_eq!(
        a_feed["tenants"],
        json!(["tenant-a"]),
        "its own tenant's events only"
    );
    let (status, b_feed) = define(TENANT_B_TOKEN, "b-feed", "/b").await;
    assert_eq!(status, 201, "{b_feed}");

    // A tenant may not widen its endpoint to another tenant, nor open private networks.
    let (status, refused) = server
        .post(
            "/v1/webhooks",
            TENANT_A_TOKEN,
            &json!({"id": "a-wide", "url": receiver.url("/a"), "events": ["succeeded"], "tenants": ["tenant-b"]}),
        )
        .await;
    assert_eq!(status, 422, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("managed by tenant `tenant-a`")),
        "{refused}"
    );
    let (status, refused) = server
        .post(
            "/v1/webhooks",
            TENANT_A_TOKEN,
            &json!({"id": "a-lan", "url": "https://10.0.0.8/hooks", "events": ["succeeded"], "allow_private_network": true}),
        )
        .await;
    assert_eq!(status, 403, "{refused}");
    let (status, refused) = server
        .call(
            Method::PATCH,
            "/v1/webhooks/a-feed",
            Some(TENANT_A_TOKEN),
            Some(&json!({"tenants": ["tenant-a", "tenant-b"]})),
        )
        .await;
    assert_eq!(status, 422, "{refused}");
    // Nor may an operator: the endpoint is the tenant's.
    let (status, refused) = server
        .call(
            Method::PATCH,
            "/v1/webhooks/a-feed",
            Some(OPERATOR_TOKEN),
            Some(&json!({"tenants": null})),
        )
        .await;
    assert_eq!(status, 200, "left out, it stays the tenant's: {refused}");
    assert_eq!(refused["tenants"], json!(["tenant-a"]), "{refused}");

    // Each token lists its own; operators list all.
    let listed = |token: &'static str| {
        let server = &server;
        async move {
            let (_, listed) = server
                .call(Method::GET, "/v1/webhooks", Some(token), None)
                .await;
            listed["endpoints"]
                .as_array()
                .expect("endpoints")
                .iter()
                .map(|endpoint| endpoint["id"].as_str().expect("an id").to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(TENANT_A_TOKEN).await, ["a-feed"]);
    assert_eq!(listed(TENANT_B_TOKEN).await, ["b-feed"]);
    let mut all = listed(OPERATOR_TOKEN).await;
    all.sort();
    assert_eq!(all, ["a-feed", "b-feed", "ops-feed"]);

    // Another tenant's endpoint and an operator's answer as if they did not exist, on every
    // route; pausing and replays are operators' even on its own.
    for other in ["b-feed", "ops-feed"] {
        for (method, path, body) in [
            (
                Method::PATCH,
                format!("/v1/webhooks/{other}"),
                Some(json!({"events": ["all"]})),
            ),
            (Method::DELETE, format!("/v1/webhooks/{other}"), None),
            (
                Method::POST,
                format!("/v1/webhooks/{other}/rotate-secret"),
                Some(json!({})),
            ),
            (
                Method::POST,
                format!("/v1/webhooks/{other}/test"),
                Some(json!({})),
            ),
            (
                Method::POST,
                format!("/v1/webhooks/{other}/resend"),
                Some(json!({"position": 1})),
            ),
            (Method::GET, format!("/v1/webhooks/{other}/attempts"), None),
            (
                Method::GET,
                format!("/v1/webhooks/{other}/payload?position=1"),
                None,
            ),
        ] {
            let (status, refused) = server
                .call(method.clone(), &path, Some(TENANT_A_TOKEN), body.as_ref())
                .await;
            assert_eq!(status, 404, "{method} {path}: {refused}");
        }
    }
    for action in ["pause", "resume", "replay"] {
        let (status, refused) = server
            .post(
                &format!("/v1/webhooks/a-feed/{action}"),
                TENANT_A_TOKEN,
                &json!({"after_position": 0}),
            )
            .await;
        assert_eq!(status, 403, "{action}: {refused}");
    }

    // Tenant B's operation first, then tenant A's: delivered in log order, so once A's arrives
    // at /a, B's has been passed over there.
    let b_operation = succeeded_for(&server, TENANT_B_TOKEN, "tenant B's task").await;
    let a_operation = succeeded_for(&server, TENANT_A_TOKEN, "tenant A's task").await;
    let at_a = receiver
        .wait_until("/a", |logged| {
            logged
                .iter()
                .any(|l| l.payload["data"]["operation_id"] == a_operation.as_str())
        })
        .await;
    let at_b = receiver
        .wait_until("/b", |logged| {
            logged
                .iter()
                .any(|l| l.payload["data"]["operation_id"] == b_operation.as_str())
        })
        .await;
    receiver
        .wait_until("/ops", |logged| logged.len() >= 2)
        .await;
    assert!(
        at_a.iter()
            .all(|l| l.verified && l.payload["data"]["operation_id"] != b_operation.as_str()),
        "{at_a:#?}"
    );
    assert!(
        at_b.iter()
            .all(|l| l.verified && l.payload["data"]["operation_id"] != a_operation.as_str()),
        "{at_b:#?}"
    );
    let a_position = position(
        at_a.iter()
            .find(|l| l.payload["data"]["operation_id"] == a_operation.as_str())
            .expect("A's delivery"),
    );
    let b_position = position(&at_b[0]);

    // Its own endpoint: rotated, tested, one event resent; another tenant's event is not one
    // it receives.
    for (path, body) in [
        (
            "/v1/webhooks/a-feed/rotate-secret",
            json!({"secret": SECRET, "overlap_s": 0}),
        ),
        ("/v1/webhooks/a-feed/test", json!({})),
        (
            "/v1/webhooks/a-feed/resend",
            json!({"position": a_position}),
        ),
    ] {
        let (status, answer) = server.post(path, TENANT_A_TOKEN, &body).await;
        assert_eq!(status, 200, "{path}: {answer}");
    }
    let (status, refused) = server
        .post(
            "/v1/webhooks/a-feed/resend",
            TENANT_A_TOKEN,
            &json!({"position": b_position}),
        )
        .await;
    assert_eq!(status, 422, "{refused}");

    // The attempt log links each attempt to its operation, and its payload is readable.
    let attempts = wait_for_attempts_by(&server, TENANT_A_TOKEN, "a-feed", 2).await;
    assert!(
        attempts["attempts"]
            .as_array()
            .expect("attempts")
            .iter()
            .any(|a| a["position"] == a_position && a["operation_id"] == a_operation.as_str()),
        "{attempts}"
    );
    let (status, payload) = server
        .call(
            Method::GET,
            &format!("/v1/webhooks/a-feed/payload?position={a_position}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, 200, "{payload}");
    assert_eq!(
        payload["payload"]["data"]["operation_id"],
        a_operation.as_str()
    );
    assert_eq!(payload["operation_id"], a_operation.as_str());

    // An operation's deliveries: a tenant sees its own endpoint's, an operator every endpoint's;
    // another tenant's operation is not found.
    let deliveries = |token: &'static str, operation: String| {
        let server = &server;
        async move {
            server
                .call(
                    Method::GET,
                    &format!("/v1/operations/{operation}/deliveries"),
                    Some(token),
                    None,
                )
                .await
        }
    };
    let endpoints_of = |answer: &Value| -> BTreeSet<String> {
        answer["deliveries"]
            .as_array()
            .expect("deliveries")
            .iter()
            .map(|d| d["endpoint"].as_str().expect("an endpoint").to_owned())
            .collect()
    };
    // The first delivery's own row comes with its batch's commit, a moment after the receiver
    // has it; the resend's at once.
    let own = wait_for_deliveries(&server, TENANT_A_TOKEN, &a_operation, |answer| {
        answer["deliveries"].as_array().is_some_and(|all| {
            all.iter()
                .any(|d| d["position"] == a_position && d["attempts"].as_u64() >= Some(2))
        })
    })
    .await;
    assert_eq!(
        endpoints_of(&own),
        BTreeSet::from(["a-feed".to_owned()]),
        "{own}"
    );
    let delivered = own["deliveries"]
        .as_array()
        .expect("deliveries")
        .iter()
        .find(|d| d["position"] == a_position)
        .expect("the succeeded event's delivery");
    assert_eq!(delivered["delivered"], true, "{own}");
    assert_eq!(delivered["last_status"], 200, "{own}");
    assert_eq!(delivered["event_type"], "AttemptSucceeded", "{own}");
    let seen_by_operator = wait_for_deliveries(&server, OPERATOR_TOKEN, &a_operation, |answer| {
        endpoints_of(answer).len() == 2
    })
    .await;
    assert_eq!(
        endpoints_of(&seen_by_operator),
        BTreeSet::from(["a-feed".to_owned(), "ops-feed".to_owned()]),
        "{seen_by_operator}"
    );
    let (status, refused) = deliveries(TENANT_A_TOKEN, b_operation.clone()).await;
    assert_eq!(status, 404, "{refused}");

    let (status, deleted) = server
        .call(
            Method::DELETE,
            "/v1/webhooks/a-feed",
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, 200, "{deleted}");
    assert!(listed(TENANT_A_TOKEN).await.is_empty());
}

/// Waits until `done` holds for the deliveries of `operation` that `token` reads (a batch's
/// attempt rows are written with its checkpoint, a moment after the receiver has them).
async fn wait_for_deliveries(
    server: &Server,
    token: &str,
    operation: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        let (status, answer) = server
            .call(
                Method::GET,
                &format!("/v1/operations/{operation}/deliveries"),
                Some(token),
                None,
            )
            .await;
        assert_eq!(status, 200, "{answer}");
        if done(&answer) {
            return answer;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "deliveries never as expected: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `token` reads at least `count` attempts of endpoint `id`.
async fn wait_for_attempts_by(server: &Server, token: &str, id: &str, count: usize) -> Value {
    let started = Instant::now();
    loop {
        let (_, attempts) = server
            .call(
                Method::GET,
                &format!("/v1/webhooks/{id}/attempts"),
                Some(token),
                None,
            )
            .await;
        if attempts["attempts"]
            .as_array()
            .is_some_and(|all| all.len() >= count)
        {
            return attempts;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{id} never had {count} attempts: {attempts}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
