//! The real parts every serve test stands on: the CRM stand on an ephemeral loopback port, a
//! configuration file naming it, and a real `opledger serve` child process on its own port and
//! SQLite file, talked to over HTTP — plus a small Server-Sent Events reader.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use opledger_crm_stand::{
    Fault, FaultKind, FaultMethod, Shape, Stand, StandAdmin, StandConfig, StandObject,
};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tempfile::TempDir;

pub const TENANT_A_TOKEN: &str = "tenant-a-token-0123456789";
pub const TENANT_B_TOKEN: &str = "tenant-b-token-0123456789";
pub const OPERATOR_TOKEN: &str = "operator-all-0123456789";
pub const OPERATOR_B_TOKEN: &str = "operator-b-only-0123456789";
pub const APPROVER_B_TOKEN: &str = "approver-b-only-0123456789";
/// The stand's account and the token it knows it by.
pub const ACCOUNT: &str = "acct-1";
pub const ACCOUNT_TOKEN: &str = "token-acct-1";
/// A second account at the stand, owned by tenant A alone, and the token the stand knows it by.
pub const A_ONLY_ACCOUNT: &str = "acct-2";
pub const A_ONLY_ACCOUNT_TOKEN: &str = "token-acct-2";
/// The stand's search lag, short so lookup-only scenarios settle quickly.
pub const SEARCH_LAG_MS: u64 = 200;
/// How long a test waits for the server to start or for an outcome before it fails.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A stand and a directory holding a ledger and a configuration, from which servers start.
pub struct Harness {
    pub dir: TempDir,
    /// Kept so the stand runs as long as the harness.
    _stand: Stand,
    pub admin: StandAdmin,
    pub config: PathBuf,
}

impl Harness {
    /// A fresh stand and directory; `limits` is extra TOML for the `[limits]` table.
    pub async fn new(limits: &str) -> Self {
        Self::with_store(limits, None).await
    }

    /// The same with the ledger in KurrentDB at `store_url` (`None`: a SQLite file).
    pub async fn with_store(limits: &str, store_url: Option<String>) -> Self {
        let stand = Stand::start(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            StandConfig {
                search_lag_ms: SEARCH_LAG_MS,
                ..StandConfig::default()
            },
        )
        .await
        .expect("the stand starts");
        let admin = stand.admin().expect("admin client");
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("serve.toml");
        let ledger = dir.path().join("ledger.db");
        let store = store_url.unwrap_or_else(|| format!("sqlite://{}", ledger.display()));
        let views = dir.path().join("ledger.views");
        let base = stand.base_url();
        let text = format!(
            r#"
listen = "127.0.0.1:0"
store = "{store}"
views = "{views}"

[engine]
lease_ms = 5000
workers = 4
backoff_base_ms = 50
backoff_max_ms = 200
max_attempts = 3
max_total_ms = 60000
max_reconciliations = 5

[limits]
{limits}

# Two tenants close /metrics unless a scraper token is given or it is declared open, and sum the
# webhook metrics over endpoints unless labels are asked for; the tests read it as any scraper of
# a single-team installation would.
[metrics]
open = true
endpoint_labels = true

[[tenants]]
id = "tenant-a"
token = "{TENANT_A_TOKEN}"

[[tenants]]
id = "tenant-b"
token = "{TENANT_B_TOKEN}"

[[operators]]
id = "oncall"
token = "{OPERATOR_TOKEN}"

[[operators]]
id = "b-reviewer"
token = "{OPERATOR_B_TOKEN}"
tenants = ["tenant-b"]

[[approvers]]
id = "b-approver"
token = "{APPROVER_B_TOKEN}"
tenants = ["tenant-b"]

[[connectors]]
id = "crm"
preset = "crm-stand-keyed"
base_url = "{base}"
request_timeout_ms = 2000
connect_timeout_ms = 500

[[connectors.accounts]]
id = "{ACCOUNT}"
tenants = ["tenant-a", "tenant-b"]
token = "{ACCOUNT_TOKEN}"

[[connectors.accounts]]
id = "{A_ONLY_ACCOUNT}"
tenants = ["tenant-a"]
token = "{A_ONLY_ACCOUNT_TOKEN}"

[[connectors]]
id = "crm-plain"
file = "crm-plain.toml"
base_url = "{base}"
request_timeout_ms = 2000
connect_timeout_ms = 500

[[connectors.accounts]]
id = "{ACCOUNT}"
tenants = ["tenant-a", "tenant-b"]
token = "{ACCOUNT_TOKEN}"
"#,
            views = views.display(),
        );
        std::fs::write(&config, text).expect("config written");
        // The plain shape as a connector file beside the configuration, as a user writes one:
        // the stand preset with this stand's search lag.
        let plain = opledger_providers::presets::preset("crm-stand-plain")
            .expect("the preset")
            .1
            .replace("lag_ms = 2000", &format!("lag_ms = {SEARCH_LAG_MS}"));
        assert!(plain.contains(&format!("lag_ms = {SEARCH_LAG_MS}")));
        std::fs::write(dir.path().join("crm-plain.toml"), plain).expect("connector written");
        Self {
            dir,
            _stand: stand,
            admin,
            config,
        }
    }

    /// The stand's base URL (its admin API is under `/admin`).
    pub fn stand_url(&self) -> String {
        self._stand.base_url()
    }

    /// Starts `opledger serve` on this harness's configuration.
    pub fn serve(&self) -> Server {
        Server::start_with(
            &["serve", "--config", &self.config.display().to_string()],
            self.dir.path(),
        )
    }

    /// A configuration for instance `n` of several sharing this harness's ledger (a KurrentDB
    /// one): the harness's file with its own read-model file, and `replacements` applied to the
    /// text (each `(from, to)` must occur). Start it with [`Harness::serve_with`].
    pub fn instance_config(&self, n: usize, replacements: &[(&str, &str)]) -> PathBuf {
        let mut text = std::fs::read_to_string(&self.config).expect("the configuration");
        let views = self.dir.path().join("ledger.views");
        let own = self.dir.path().join(format!("instance-{n}.views"));
        let views_line = format!("views = \"{}\"", views.display());
        assert!(text.contains(&views_line), "the views line is in the file");
        text = text.replace(&views_line, &format!("views = \"{}\"", own.display()));
        for (from, to) in replacements {
            assert!(text.contains(from), "`{from}` is in the configuration");
            text = text.replace(from, to);
        }
        let path = self.dir.path().join(format!("serve-{n}.toml"));
        std::fs::write(&path, text).expect("instance configuration written");
        path
    }

    /// Starts `opledger serve` on the configuration at `config`.
    pub fn serve_with(&self, config: &Path) -> Server {
        Server::start_with(
            &["serve", "--config", &config.display().to_string()],
            self.dir.path(),
        )
    }

    /// Queues `times` faults of `kind` for creates (POST) of the `shape` CRM at the stand.
    pub async fn fault(&self, shape: Shape, kind: FaultKind, times: u32) {
        self.fault_on(shape, FaultMethod::Post, kind, times).await;
    }

    /// Queues `times` faults of `kind` for `method` requests of the `shape` CRM at the stand
    /// (`Get`: its lookups).
    pub async fn fault_on(&self, shape: Shape, method: FaultMethod, kind: FaultKind, times: u32) {
        self.admin
            .queue_fault(&Fault {
                shape: Some(shape),
                account: None,
                method: Some(method),
                kind,
                times,
            })
            .await
            .expect("fault queued");
    }

    /// The stand's objects.
    pub async fn objects(&self) -> Vec<StandObject> {
        self.admin.objects(None).await.expect("stand objects")
    }
}

/// A running `opledger serve` child process.
pub struct Server {
    child: Child,
    pub base: String,
    client: reqwest::Client,
    /// Every line the server printed on stdout after its address.
    lines: mpsc::Receiver<String>,
}

impl Server {
    /// Starts `opledger` with `args`; its log goes to a file in `dir`.
    pub fn start_with(args: &[&str], dir: &Path) -> Self {
        Self::start_with_env(args, dir, &[])
    }

    /// The same with extra environment variables (e.g. a webhook secret named by `secret_env`).
    pub fn start_with_env(args: &[&str], dir: &Path, env: &[(&str, &str)]) -> Self {
        let log = dir.join(format!(
            "serve-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let stderr = std::fs::File::create(&log).expect("log file");
        let mut child = Command::new(env!("CARGO_BIN_EXE_opledger"))
            .args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("opledger serve starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let started = Instant::now();
        let base = loop {
            let line = lines
                .recv_timeout(DEADLINE.saturating_sub(started.elapsed()))
                .unwrap_or_else(|error| {
                    panic!(
                        "the server did not print its address ({error}); its log:\n{}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    )
                });
            if let Some(rest) = line.split("listening on ").nth(1) {
                let address = rest.split_whitespace().next().expect("an address");
                break address.to_owned();
            }
        };
        Self {
            child,
            base,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("client"),
            lines,
        }
    }

    /// Sends a request with `token` (if any) and a JSON `body` (if any); returns the status and
    /// the parsed JSON body (`Null` if it was not JSON).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .client
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.expect("the server answers");
        answer(method.as_str(), path, response).await
    }

    /// POSTs a JSON `body` with `token` and extra `headers`; returns the status, the answer's
    /// headers and the parsed JSON body (checked against the OpenAPI document like every answer).
    pub async fn post_with_headers(
        &self,
        path: &str,
        token: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body.to_string());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("the server answers");
        let answered = response.headers().clone();
        let (status, json) = answer("POST", path, response).await;
        (status, answered, json)
    }

    /// POSTs a JSON `body` with `token`.
    pub async fn post(&self, path: &str, token: &str, body: &Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(token), Some(body)).await
    }

    /// Sends raw bytes as the body.
    pub async fn call_raw(&self, path: &str, token: &str, body: Vec<u8>) -> (StatusCode, Value) {
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("the server answers");
        answer("POST", path, response).await
    }

    /// Records an intent that waits for approval, so nothing else happens to it: a marker that
    /// shows where a stream has got to. Returns its operation id.
    pub async fn marker(&self, token: &str) -> String {
        let recorded = self.record_for_approval(token, "marker").await;
        recorded["operation_id"].as_str().expect("an id").to_owned()
    }

    /// Records a create_task intent that needs approval; returns the answer (201 checked).
    pub async fn record_for_approval(&self, token: &str, title: &str) -> Value {
        let body = json!({
            "provider": "crm", "account": ACCOUNT, "action": "create_task",
            "args": {"title": title}, "requires_approval": true,
        });
        let (status, recorded) = self
            .call(Method::POST, "/v1/operations", Some(token), Some(&body))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{recorded}");
        recorded
    }

    /// Records a create_task intent for `tenant_token`; returns the status and body.
    pub async fn record(
        &self,
        token: &str,
        provider: &str,
        title: &str,
        source_id: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut body = json!({
            "provider": provider,
            "account": ACCOUNT,
            "action": "create_task",
            "args": {"title": title},
        });
        if let Some(source_id) = source_id {
            body["source_id"] = json!(source_id);
        }
        self.call(Method::POST, "/v1/operations", Some(token), Some(&body))
            .await
    }

    /// Executes an operation, waiting up to `wait_ms`.
    pub async fn execute(
        &self,
        token: &str,
        operation_id: &str,
        wait_ms: u64,
    ) -> (StatusCode, Value) {
        self.call(
            Method::POST,
            &format!("/v1/operations/{operation_id}/execute?wait_ms={wait_ms}"),
            Some(token),
            None,
        )
        .await
    }

    /// Polls the operation until `done` holds for its state, or fails after the deadline.
    pub async fn wait_for_state(&self, token: &str, operation_id: &str, done: &[&str]) -> Value {
        self.wait_for_state_within(token, operation_id, done, DEADLINE)
            .await
    }

    /// [`Server::wait_for_state`] with a deadline of its own, for an operation whose last lookup
    /// waits out a provider's declared search lag.
    pub async fn wait_for_state_within(
        &self,
        token: &str,
        operation_id: &str,
        done: &[&str],
        deadline: Duration,
    ) -> Value {
        let started = Instant::now();
        loop {
            let (status, body) = self
                .call(
                    Method::GET,
                    &format!("/v1/operations/{operation_id}"),
                    Some(token),
                    None,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            if done.contains(&body["state"].as_str().unwrap_or_default()) {
                return body;
            }
            assert!(
                started.elapsed() < deadline,
                "operation {operation_id} stayed {} instead of {done:?}: {body}",
                body["state"]
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The log's head position, from `/healthz`.
    pub async fn log_head(&self) -> u64 {
        let (status, body) = self.call(Method::GET, "/healthz", None, None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["log_head"].as_u64().unwrap_or(0)
    }

    /// Opens an event stream.
    pub async fn events(
        &self,
        token: &str,
        query: &str,
        last_event_id: Option<u64>,
    ) -> EventStream {
        let mut request = self
            .client
            .get(format!("{}/v1/events{query}", self.base))
            .bearer_auth(token);
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id.to_string());
        }
        let response = request.send().await.expect("the server answers");
        EventStream {
            status: response.status(),
            response,
            buffer: String::new(),
        }
    }

    /// The child's process id (its worker id is `serve-<pid>-<random>` unless configured).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGKILL and waits for the process to be gone: no shutdown, no cleanup, as a crash.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL is sent");
        self.child.wait().expect("the killed process is reaped");
    }

    /// Sends SIGTERM and waits for the process to exit; returns its exit code and what it printed
    /// after starting.
    pub fn terminate(self) -> (Option<i32>, Vec<String>) {
        self.send_sigterm();
        self.wait_for_exit()
    }

    /// Sends SIGTERM and returns at once (the server drains meanwhile).
    pub fn send_sigterm(&self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill runs");
        assert!(sent.success());
    }

    /// Waits for the process to exit after a signal; returns its exit code and what it printed
    /// after starting.
    pub fn wait_for_exit(mut self) -> (Option<i32>, Vec<String>) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                let printed: Vec<String> = self.lines.try_iter().collect();
                return (status.code(), printed);
            }
            assert!(
                started.elapsed() < DEADLINE,
                "the server did not stop within {DEADLINE:?} of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads an answer, checks it against the OpenAPI document (see `contract.rs`), and returns its
/// status and parsed JSON body (`Null` if it was not JSON).
async fn answer(method: &str, path: &str, response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.expect("a body");
    let json = serde_json::from_str::<Value>(&text).ok();
    crate::contract::check_answer(method, path, status.as_u16(), json.as_ref(), &text);
    (status, json.unwrap_or(Value::Null))
}

/// One Server-Sent Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    pub id: u64,
    pub event: String,
    pub data: Value,
}

/// An open event stream.
pub struct EventStream {
    pub status: StatusCode,
    response: reqwest::Response,
    buffer: String,
}

impl EventStream {
    /// The next event, or `None` if none arrives within `wait` (or the stream ended).
    pub async fn next(&mut self, wait: Duration) -> Option<SseEvent> {
        let deadline = Instant::now() + wait;
        loop {
            while let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                if let Some(event) = parse_block(&block) {
                    return Some(event);
                }
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            match tokio::time::timeout(left, self.response.chunk()).await {
                Ok(Ok(Some(chunk))) => self.buffer.push_str(&String::from_utf8_lossy(&chunk)),
                _ => return None,
            }
        }
    }

    /// Every event up to and including the first that `last` picks; fails the test if it does
    /// not arrive within the deadline.
    pub async fn until(&mut self, last: impl Fn(&SseEvent) -> bool) -> Vec<SseEvent> {
        let started = Instant::now();
        let mut events = Vec::new();
        loop {
            let left = DEADLINE.saturating_sub(started.elapsed());
            let Some(event) = self.next(left).await else {
                panic!("the awaited event never came; received {events:?}");
            };
            let done = last(&event);
            events.push(event);
            if done {
                return events;
            }
        }
    }
}

fn parse_block(block: &str) -> Option<SseEvent> {
    let (mut id, mut event, mut data) = (None, None, None);
    for line in block.lines() {
        if let Some(value) = line.strip_prefix("id:") {
            id = value.trim().parse().ok();
        } else if let Some(value) = line.strip_prefix("event:") {
            event = Some(value.trim().to_owned());
        } else if let Some(value) = line.strip_prefix("data:") {
            data = serde_json::from_str(value.trim()).ok();
        }
    }
    let data = data?;
    crate::contract::check_outcome_event(&data);
    Some(SseEvent {
        id: id?,
        event: event?,
        data,
    })
}
