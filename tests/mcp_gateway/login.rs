//! An upstream that acts for a person's account (`[upstream.login]`), against an MCP server whose
//! authorization server and protected resource are the official Python SDK's (`login_server.py`):
//! `opledger connectors login` runs the MCP authorization flow (the SDK refuses a code exchanged
//! with the wrong PKCE verifier), the gateway's calls carry the login's token, an expired or
//! refused access token is renewed and the call made once, a revoked login leaves the call not
//! applied with what to do, and no token is found in clear in the ledger file, the sealed login
//! file or the log output.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opledger_domain::state::Status;
use serde_json::{json, Value};

use super::support::{build_connector, here, python, succeeded_with, Gateway};

/// The key-encryption key the login is sealed under, as `OPLEDGER_KEK` carries it.
const KEK: &str = "5f0c6a1e2b3d4c5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6";

fn document(port: u16) -> String {
    use crate::faults::CREATE_RECORD_ACTION;
    format!(
        r#"
id = "upstream"
description = "A record store that acts for a person's account"
transport = "mcp"
call_timeout_ms = 5000
start_timeout_ms = 15000
restart_wait_ms = 0
read_only = ["find_records"]

[upstream]
url = "http://127.0.0.1:{port}/mcp"

[upstream.login]
scopes = ["records"]

[[accounts]]
id = "main"
tenants = ["acme"]

{CREATE_RECORD_ACTION}
"#
    )
}

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The upstream (its own authorization server), the serve configuration that names it, and a
/// person logged in with `opledger connectors login`.
struct LoggedIn {
    dir: tempfile::TempDir,
    port: u16,
    _server: Killed,
    /// What `opledger connectors login -vv` wrote on stdout and stderr.
    login_output: Vec<u8>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("an HTTP client")
}

impl LoggedIn {
    /// Starts the upstream granting access tokens for `expires_in_s`, and logs in; `before_callback`
    /// is run with the authorization response's redirect (code and state) before the redirect
    /// is followed to the login's listener.
    async fn start(expires_in_s: u32, before_callback: impl AsyncFnOnce(&Self, &str)) -> Self {
        let (dir, port, server) = serve_upstream(expires_in_s);
        let mut login = login_command(&dir);
        let mut stdout = login.stdout.take().expect("piped");
        let url = tokio::task::spawn_blocking(move || {
            use std::io::Read as _;
            let mut line = Vec::new();
            let mut byte = [0_u8; 1];
            while stdout.read(&mut byte).expect("stdout reads") == 1 && byte[0] != b'\n' {
                line.push(byte[0]);
            }
            (String::from_utf8(line).expect("a URL"), stdout)
        });
        let (url, mut stdout) = url.await.expect("the URL is printed");
        assert!(
            url.starts_with(&format!("http://127.0.0.1:{port}/authorize?"))
                && url.contains("code_challenge_method=S256")
                && url.contains(&format!("resource=http%3A%2F%2F127.0.0.1%3A{port}%2Fmcp")),
            "the authorization URL carries a PKCE challenge and the resource: {url}"
        );
        let approved = http()
            .get(&url)
            .send()
            .await
            .expect("the authorization server answers");
        assert_eq!(approved.status(), 302, "the person approves: {approved:?}");
        let redirect = approved.headers()["location"]
            .to_str()
            .expect("a redirect")
            .to_owned();
        let mut logged_in = Self {
            dir,
            port,
            _server: server,
            login_output: Vec::new(),
        };
        before_callback(&logged_in, &redirect).await;
        let page = http()
            .get(&redirect)
            .send()
            .await
            .expect("the login's listener answers");
        assert_eq!(page.status(), 200);
        let output = tokio::task::spawn_blocking(move || {
            use std::io::Read as _;
            let status = login.wait().expect("the login ends");
            let mut out = Vec::new();
            stdout.read_to_end(&mut out).expect("stdout");
            login
                .stderr
                .take()
                .expect("piped")
                .read_to_end(&mut out)
                .expect("stderr");
            (status, out)
        })
        .await
        .expect("the login's output");
        let (status, output) = output;
        let said = String::from_utf8_lossy(&output).into_owned();
        assert!(status.success(), "the login succeeds: {said}");
        assert!(
            said.contains("Logged in to `upstream`") && said.contains("(registered now)"),
            "it says who it logged in as: {said}"
        );
        logged_in.login_output = output;
        logged_in
    }

    /// A gateway whose connector reads the login from where `serve` would.
    async fn gateway(self) -> (Gateway, Upstream) {
        let connector = build_connector(&self.dir, &document(self.port), Vec::new());
        let kek = opledger_subjects::Kek::parse(KEK, "the test").expect("a key");
        connector.place_login(
            self.dir.path().join("opledger-mcp-login-upstream.sealed"),
            kek.subkey(opledger_providers::mcp::LOGIN_KEY_PURPOSE),
        );
        let upstream = Upstream {
            port: self.port,
            dir: self.dir.path().to_path_buf(),
            login_output: self.login_output,
            _server: self._server,
        };
        (
            Gateway::start_with_connector(self.dir, connector).await,
            upstream,
        )
    }
}

/// Starts the upstream granting access tokens for `expires_in_s` in a new folder beside the
/// serve configuration that names it; answers the folder, the port and the server.
fn serve_upstream(expires_in_s: u32) -> (tempfile::TempDir, u16, Killed) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let port = free_port();
    let server = Killed(
        Command::new(python())
            .arg(here("login_server.py"))
            .args([
                port.to_string(),
                dir.path()
                    .join("issued")
                    .to_str()
                    .expect("UTF-8")
                    .to_owned(),
                expires_in_s.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the upstream starts"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the upstream listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(dir.path().join("upstream.toml"), document(port)).expect("the document");
    std::fs::write(
            dir.path().join("opledger.toml"),
            "listen = \"127.0.0.1:0\"\nstore = \"sqlite://ledger.db\"\n\n[[tenants]]\nid = \"acme\"\ntoken_env = \"ACME_API_TOKEN\"\n\n[[connectors]]\nfile = \"upstream.toml\"\n",
        )
        .expect("the configuration");
    (dir, port, server)
}

/// `opledger connectors login upstream -vv` in `dir`, its output piped.
fn login_command(dir: &tempfile::TempDir) -> Child {
    Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args([
            "connectors",
            "login",
            "upstream",
            "--timeout-s",
            "60",
            "-vv",
        ])
        .arg("--config")
        .arg(dir.path().join("opledger.toml"))
        .current_dir(dir.path())
        .env("ACME_API_TOKEN", "acme-secret-token")
        .env("OPLEDGER_KEK", KEK)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the login starts")
}

/// The upstream while a gateway holds the test's folder.
struct Upstream {
    port: u16,
    dir: PathBuf,
    login_output: Vec<u8>,
    _server: Killed,
}

impl Upstream {
    async fn state(&self) -> Value {
        let answer = http()
            .get(format!("http://127.0.0.1:{}/test/state", self.port))
            .send()
            .await
            .expect("the upstream answers");
        serde_json::from_slice(&answer.bytes().await.expect("a body")).expect("JSON")
    }

    async fn control(&self, what: &str) {
        let answer = http()
            .post(format!("http://127.0.0.1:{}/test/{what}", self.port))
            .send()
            .await
            .expect("the upstream answers");
        assert!(answer.status().is_success());
    }

    /// Every token the authorization server granted.
    fn issued(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("issued"))
            .expect("tokens were granted")
            .lines()
            .map(|line| line.split_once(' ').expect("kind token").1.to_owned())
            .collect()
    }

    /// Fails if any granted token is in clear in the ledger's files, the sealed login, the
    /// login's output or `log`.
    fn no_token_in_clear(&self, log: &[u8]) {
        let mut places: Vec<(String, Vec<u8>)> = vec![
            ("the login's output".to_owned(), self.login_output.clone()),
            ("the log".to_owned(), log.to_vec()),
        ];
        for entry in std::fs::read_dir(&self.dir).expect("the folder lists") {
            let path = entry.expect("an entry").path();
            let name = path
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            if name.starts_with("ledger.db") || name.starts_with("opledger-mcp-login") {
                places.push((name, std::fs::read(&path).expect("readable")));
            }
        }
        assert!(
            places.iter().any(|(name, _)| name == "ledger.db"),
            "the ledger file is searched"
        );
        assert!(
            places.iter().any(|(name, _)| name.ends_with(".sealed")),
            "the sealed login is searched"
        );
        assert!(
            log.len() > 1_000,
            "the log was captured ({} bytes)",
            log.len()
        );
        let tokens = self.issued();
        assert!(
            tokens.len() >= 2,
            "an access and a refresh token were granted"
        );
        for token in &tokens {
            for (name, bytes) in &places {
                assert!(
                    !bytes
                        .windows(token.len())
                        .any(|window| window == token.as_bytes()),
                    "a granted token is in clear in {name}"
                );
            }
        }
    }
}

/// Everything logged on this thread (every target, TRACE) while the guard lives: a test's
/// runtime runs on its own thread, so the SDK's and the engine's log lines land here.
struct Captured {
    bytes: Arc<Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

#[derive(Clone)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("the log lock")
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_log() -> Captured {
    let bytes = Arc::new(Mutex::new(Vec::new()));
    let sink = Sink(Arc::clone(&bytes));
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    Captured {
        bytes,
        _guard: tracing::subscriber::set_default(subscriber),
    }
}

impl Captured {
    fn bytes(&self) -> Vec<u8> {
        self.bytes.lock().expect("the log lock").clone()
    }
}

async fn create(gateway: &Gateway, source_id: &str) -> opledger_domain::ids::OperationId {
    gateway
        .record(
            "create_record",
            json!({"title": "Call the client"}),
            source_id,
        )
        .await
}

#[tokio::test]
async fn a_person_logs_in_with_pkce_and_the_gateways_calls_carry_the_login() {
    let log = capture_log();
    let logged_in = LoggedIn::start(600, async |upstream: &LoggedIn, redirect: &str| {
        // The code alone is worth nothing: the SDK's token endpoint refuses it with a verifier
        // other than the one the login's challenge was made from (and keeps it for the login).
        let callback = reqwest::Url::parse(redirect).expect("a URL");
        let code = callback
            .query_pairs()
            .find(|(key, _)| key == "code")
            .expect("a code")
            .1
            .into_owned();
        let state = upstream_state(upstream.port).await;
        let client_id = state["client_id"].as_str().map(str::to_owned);
        let refused = http()
            .post(format!("http://127.0.0.1:{}/token", upstream.port))
            .form(&[
                ("grant_type", "authorization_code"),
                ("code", code.as_str()),
                (
                    "redirect_uri",
                    &redirect[..redirect.find('?').expect("a query")],
                ),
                ("client_id", client_id.as_deref().unwrap_or_default()),
                (
                    "code_verifier",
                    "a-verifier-the-login-never-made-0123456789abcdef",
                ),
            ])
            .send()
            .await
            .expect("the token endpoint answers");
        let status = refused.status();
        let body = refused.text().await.expect("a body");
        assert_eq!(status, 400, "a wrong verifier is refused: {body}");
        assert!(body.contains("incorrect code_verifier"), "{body}");
    })
    .await;
    let sealed = logged_in
        .dir
        .path()
        .join("opledger-mcp-login-upstream.sealed");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&sealed)
            .expect("the login is kept")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "only its owner may read the sealed login");
    }
    let (gateway, upstream) = logged_in.gateway().await;
    let operation = create(&gateway, "call-1").await;
    assert_eq!(succeeded_with(&gateway.settle(operation).await), "731");
    let state = upstream.state().await;
    assert_eq!(state["records"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        state["codes_exchanged"], 1,
        "one code, exchanged by the login"
    );
    assert_eq!(state["refreshed"], 0, "a fresh login needs no renewal");
    upstream.no_token_in_clear(&log.bytes());
}

/// The `client_id` the upstream last registered (the login registers itself: no id is
/// configured).
async fn upstream_state(port: u16) -> Value {
    let answer = http()
        .get(format!("http://127.0.0.1:{port}/test/clients"))
        .send()
        .await
        .expect("the upstream answers");
    serde_json::from_slice(&answer.bytes().await.expect("a body")).expect("JSON")
}

/// How the access token stops being good before the call.
#[derive(Clone, Copy, Debug)]
enum Expiry {
    /// Its lifetime runs out: the SDK's client renews it before sending.
    Lifetime,
    /// The upstream refuses it early (401): renewed once, the request sent again.
    Refused,
}

async fn renewed_once(expiry: Expiry) {
    let log = capture_log();
    let lifetime_s = match expiry {
        Expiry::Lifetime => 2,
        Expiry::Refused => 600,
    };
    let (gateway, upstream) = LoggedIn::start(lifetime_s, async |_: &LoggedIn, _: &str| {})
        .await
        .gateway()
        .await;
    match expiry {
        Expiry::Lifetime => tokio::time::sleep(Duration::from_millis(2_200)).await,
        Expiry::Refused => upstream.control("expire-access").await,
    }
    let operation = create(&gateway, "call-1").await;
    assert_eq!(succeeded_with(&gateway.settle(operation).await), "731");
    assert_eq!(
        gateway.events(operation).await,
        ["IntentRecorded", "AttemptStarted", "AttemptSucceeded"],
        "the renewal is the client's business: one attempt, one call"
    );
    let state = upstream.state().await;
    assert_eq!(
        state["records"].as_array().map(Vec::len),
        Some(1),
        "one record"
    );
    assert_eq!(state["refreshed"], 1, "renewed once");
    assert!(
        gateway.connector().login_saves() >= Some(1),
        "the rotated refresh token is sealed again"
    );
    let logged = log.bytes();
    assert!(
        String::from_utf8_lossy(&logged).contains("Refreshed access token"),
        "the SDK's client renewed the token"
    );
    upstream.no_token_in_clear(&logged);
}

#[tokio::test]
async fn an_access_token_past_its_lifetime_is_renewed_and_the_call_made_once() {
    renewed_once(Expiry::Lifetime).await;
}

#[tokio::test]
async fn an_access_token_the_upstream_refuses_is_renewed_once_and_the_call_made_once() {
    renewed_once(Expiry::Refused).await;
}

#[tokio::test]
async fn a_revoked_login_leaves_the_call_not_applied_and_says_to_log_in_again() {
    let log = capture_log();
    let (gateway, upstream) = LoggedIn::start(600, async |_: &LoggedIn, _: &str| {})
        .await
        .gateway()
        .await;
    let first = create(&gateway, "call-1").await;
    succeeded_with(&gateway.settle(first).await);
    upstream.control("revoke").await;
    let second = create(&gateway, "call-2").await;
    let report = gateway
        .engine
        .drive(second)
        .await
        .expect("the engine drives the operation");
    let state = report.state();
    assert!(
        matches!(state.status, Status::Pending),
        "refused before anything ran, so not applied and still to send: {state:?}"
    );
    assert_eq!(
        gateway.events(second).await,
        ["IntentRecorded", "AttemptStarted", "AttemptNotSent"]
    );
    let said = state.last_error.clone().unwrap_or_default();
    assert!(
        said.contains("refused") && said.contains("run `opledger connectors login upstream` again"),
        "the reason says what to do: {said}"
    );
    // The next call finds no session to start: the login is refused at `initialize` too.
    let third = create(&gateway, "call-3").await;
    let report = gateway
        .engine
        .drive(third)
        .await
        .expect("the engine drives the operation");
    let said = report.state().last_error.clone().unwrap_or_default();
    assert!(
        matches!(report.state().status, Status::Pending)
            && said.contains("run `opledger connectors login upstream` again"),
        "not applied, with what to do: {:?}",
        report.state()
    );
    assert_eq!(
        upstream.state().await["records"].as_array().map(Vec::len),
        Some(1),
        "nothing reached the tool"
    );
    upstream.no_token_in_clear(&log.bytes());
}

#[tokio::test]
async fn a_login_nobody_finishes_stops_at_its_timeout_or_on_ctrl_c_and_stores_nothing() {
    let (dir, _port, _server) = serve_upstream(600);
    for stop in ["timeout", "ctrl-c"] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_opledger"));
        command
            .args(["connectors", "login", "upstream", "--timeout-s"])
            .arg(if stop == "timeout" { "1" } else { "60" })
            .arg("--config")
            .arg(dir.path().join("opledger.toml"))
            .current_dir(dir.path())
            .env("ACME_API_TOKEN", "acme-secret-token")
            .env("OPLEDGER_KEK", KEK)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut login = command.spawn().expect("the login starts");
        let output = tokio::task::spawn_blocking(move || {
            use std::io::BufRead as _;
            let mut stdout = std::io::BufReader::new(login.stdout.take().expect("piped"));
            let mut url = String::new();
            stdout.read_line(&mut url).expect("the URL is printed");
            assert!(url.contains("/authorize?"), "{stop}: the URL: {url}");
            if stop == "ctrl-c" {
                // The URL is printed, so the listener is up; the person presses Ctrl-C.
                let status = Command::new("kill")
                    .args(["-INT", &login.id().to_string()])
                    .status()
                    .expect("kill runs");
                assert!(status.success());
            }
            login.wait_with_output().expect("the login ends")
        })
        .await
        .expect("the login's output");
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stop}: the login fails");
        let expected = if stop == "timeout" {
            "no answer reached"
        } else {
            "the login was stopped"
        };
        assert!(
            said.contains(expected) && said.contains("nothing was stored"),
            "{stop}: it says what happened: {said}"
        );
        assert!(
            !dir.path()
                .join("opledger-mcp-login-upstream.sealed")
                .exists(),
            "{stop}: no login is kept"
        );
    }
}
