//! Erasing a data subject end to end: a real `opledger serve` on a real SQLite ledger with its
//! key store beside it, and on a real PostgreSQL database with its key table in it, operations
//! recorded with a person's e-mail address (one of them denied with a reason quoting it, whose
//! webhook a receiver refuses with the payload echoed back), the person erased, and then every
//! byte of every file opledger wrote (ledger, WAL, read models, webhook journal, key store,
//! logs, exports; a `pg_dump` of the database and the cluster's own files) searched for the
//! address and its SHA-256. The proofs are checked by the binary (`opledger verify`), by the
//! offline verifier in Python on exports made before and after, and against a checkpoint kept
//! before the erasure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::support::{
    Harness, Server, ACCOUNT, DEADLINE, OPERATOR_TOKEN, TENANT_A_TOKEN, TENANT_B_TOKEN,
};
use crate::postgres_server;

pub(super) const KEK: &str = "3c1f0a9e5b7d2c4e6f8a1b3d5c7e9f0a2b4c6d8e1f3a5b7c9d0e2f4a6b8c1d3e";
const OTHER_KEK: &str = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
pub(super) const KEK_ENV: &str = "OPLEDGER_TEST_KEK";
const WEBHOOK_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const WEBHOOK_SECRET_ENV: &str = "OPLEDGER_TEST_ERASURE_WEBHOOK_SECRET";

/// An address nobody else writes: random words and a number from the clock.
pub(super) fn unique_email() -> String {
    const WORDS: [&str; 16] = [
        "amber", "birch", "cobalt", "dune", "ember", "fjord", "garnet", "heron", "indigo",
        "juniper", "kestrel", "lichen", "marlin", "nettle", "opal", "quartz",
    ];
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let word = |shift: u32| WORDS[((nanos >> shift) % WORDS.len() as u128) as usize];
    format!(
        "{}.{}.{}{}@example.org",
        word(7),
        word(13),
        word(19),
        nanos % 1_000_000
    )
}

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The harness's configuration with personal data on (the key from `KEK_ENV`).
async fn harness() -> Harness {
    harness_on(None).await
}

/// The same with the ledger at `store` (`None`: a SQLite file).
async fn harness_on(store: Option<String>) -> Harness {
    let harness = Harness::with_store("", store).await;
    append_config(
        &harness,
        &format!("\n[personal_data]\nkek_env = \"{KEK_ENV}\"\n"),
    );
    harness
}

fn append_config(harness: &Harness, text: &str) {
    let mut config = std::fs::read_to_string(&harness.config).expect("the configuration");
    config.push_str(text);
    std::fs::write(&harness.config, config).expect("configuration written");
}

fn serve(harness: &Harness, kek: &str) -> Server {
    Server::start_with_env(
        &["serve", "--config", &harness.config.display().to_string()],
        harness.dir.path(),
        &[(KEK_ENV, kek), (WEBHOOK_SECRET_ENV, WEBHOOK_SECRET)],
    )
}

/// A webhook receiver that refuses every delivery with 400 and the delivery's body echoed back,
/// as a receiver's validation error quoting what it was sent does; its URL.
async fn echoing_receiver() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let port = listener.local_addr().expect("bound").port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    let Ok(read) = socket.read(&mut chunk).await else {
                        return;
                    };
                    if read == 0 {
                        return;
                    }
                    request.extend_from_slice(&chunk[..read]);
                    let text = String::from_utf8_lossy(&request).into_owned();
                    let Some(end) = text.find("\r\n\r\n") else {
                        continue;
                    };
                    let length: usize = text[..end]
                        .lines()
                        .find_map(|line| {
                            let (name, value) = line.split_once(':')?;
                            name.eq_ignore_ascii_case("content-length")
                                .then(|| value.trim().parse().ok())?
                        })
                        .unwrap_or(0);
                    if request.len() < end + 4 + length {
                        continue;
                    }
                    let echoed = format!(
                        "{{\"refused\": {}}}",
                        String::from_utf8_lossy(&request[end + 4..end + 4 + length])
                    );
                    let answer = format!(
                        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{echoed}",
                        echoed.len()
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                    return;
                }
            });
        }
    });
    format!("http://127.0.0.1:{port}/hook")
}

/// A webhook endpoint for denials, at `url`.
fn webhook_entry(url: &str) -> String {
    format!("\n[[webhooks]]\nid = \"echo\"\nurl = \"{url}\"\nsecret_env = \"{WEBHOOK_SECRET_ENV}\"\nevents = [\"denied\"]\n")
}

/// Records an operation about the person and denies it with a reason quoting their address; its
/// webhook goes to the echoing receiver.
async fn deny_quoting(server: &Server, email: &str) -> String {
    let recorded = record(
        server,
        TENANT_A_TOKEN,
        email,
        json!({"provider": "crm", "account": ACCOUNT, "action": "create_task",
               "args": {"title": "Send the offer", "email": email}, "requires_approval": true}),
        "",
    )
    .await;
    let id = recorded["operation_id"].as_str().unwrap().to_owned();
    let (status, denied) = server
        .post(
            &format!("/v1/operations/{id}/deny"),
            TENANT_A_TOKEN,
            &json!({"approver": "boss", "args_hash": recorded["args_hash"],
                    "reason": format!("not to {email}: they asked not to be contacted")}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{denied}");
    id
}

/// The echo endpoint's attempts once one failed; the operator's listing.
async fn failed_attempts(server: &Server) -> Value {
    let started = Instant::now();
    loop {
        let (status, attempts) = server
            .call(
                Method::GET,
                "/v1/webhooks/echo/attempts?limit=10",
                Some(OPERATOR_TOKEN),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{attempts}");
        if attempts["attempts"]
            .as_array()
            .is_some_and(|all| all.iter().any(|a| a["error"].is_string()))
        {
            return attempts;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "no failed delivery: {attempts}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            found.extend(files(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// The files under `dir` whose bytes contain `needle`.
pub(super) fn holding(dir: &Path, needle: &str) -> Vec<PathBuf> {
    files(dir)
        .into_iter()
        .filter(|path| {
            let bytes = std::fs::read(path).unwrap_or_default();
            bytes
                .windows(needle.len())
                .any(|window| window == needle.as_bytes())
        })
        .collect()
}

fn opledger(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(args)
        .env_remove("OPLEDGER_DB")
        .env_remove("OPLEDGER_KEK")
        .envs(env.iter().copied())
        .output()
        .expect("opledger runs")
}

fn succeeded(output: &std::process::Output, what: &str) -> String {
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{what} failed: {printed}");
    printed
}

fn python_verifies(export: &Path) {
    let verifier =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/verify-export/verify_export.py");
    let output = Command::new("python3")
        .arg(verifier)
        .arg(export)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 runs (install python3)");
    succeeded(
        &output,
        &format!("the offline verifier on {}", export.display()),
    );
}

async fn record(server: &Server, token: &str, email: &str, body: Value, query: &str) -> Value {
    let mut body = body;
    body["subject"] = json!(email);
    let (status, recorded) = server
        .post(&format!("/v1/operations{query}"), token, &body)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    recorded
}

/// Records what the erasure tests erase: one operation about the person sent and confirmed, one
/// waiting for an approval (open), and one about somebody else, which the erasure must leave
/// readable; then a denial whose webhook receiver echoes the address back (the journal keeps it
/// sealed like the values it quotes, and the operator reads it while the key lives). Checks that
/// while the key lives the API shows the values. The sent and the open operations' answers, and
/// the other operation's id.
async fn record_the_persons_operations(server: &Server, email: &str) -> (Value, Value, String) {
    let create = |title: String, approval: bool| {
        json!({"provider": "crm", "account": ACCOUNT, "action": "create_task",
               "args": {"title": title, "email": email}, "requires_approval": approval})
    };
    let sent = record(
        server,
        TENANT_A_TOKEN,
        email,
        create(format!("Call {email}"), false),
        "?execute=true&wait_ms=5000",
    )
    .await;
    assert_eq!(sent["state"], "succeeded", "{sent}");
    let open = record(
        server,
        TENANT_A_TOKEN,
        email,
        create("Follow up".into(), true),
        "",
    )
    .await;
    let open_id = open["operation_id"].as_str().unwrap().to_owned();
    let other = record(server, TENANT_A_TOKEN, "someone.else@example.org", json!({"provider": "crm", "account": ACCOUNT, "action": "create_task", "args": {"title": "Unrelated"}}), "").await;
    let other_id = other["operation_id"].as_str().unwrap().to_owned();
    deny_quoting(server, email).await;
    let attempts = failed_attempts(server).await;
    assert!(attempts.to_string().contains(email), "{attempts}");
    let (_, shown) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{open_id}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(shown["args"]["email"], email, "{shown}");
    (sent, open, other_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erased_persons_address_is_found_nowhere_opledger_wrote_and_every_proof_still_verifies()
{
    let harness = harness().await;
    append_config(&harness, &webhook_entry(&echoing_receiver().await));
    let dir = harness.dir.path().to_path_buf();
    let db = dir.join("ledger.db");
    let db_arg = db.display().to_string();
    let email = unique_email();
    let hash = sha256_hex(&email);
    let server = serve(&harness, KEK);

    let (sent, open, other_id) = record_the_persons_operations(&server, &email).await;
    let open_id = open["operation_id"].as_str().unwrap().to_owned();
    assert!(
        sent["args_hash"]
            .as_str()
            .unwrap()
            .starts_with("hmac-sha256:"),
        "{sent}"
    );
    let before = dir.join("before.ndjson");
    succeeded(
        &opledger(
            &[
                "export",
                "--db",
                &db_arg,
                "--out",
                &before.display().to_string(),
            ],
            &[],
        ),
        "export before",
    );
    assert_eq!(
        holding(&dir, &email),
        Vec::<PathBuf>::new(),
        "the address in clear before erasure"
    );
    assert_eq!(
        holding(&dir, &hash),
        Vec::<PathBuf>::new(),
        "the address's SHA-256 before erasure"
    );
    assert!(
        !holding(&dir, "opledger-sealed:v1:").is_empty(),
        "the values are stored, sealed"
    );

    // A tenant cannot erase; an unknown subject is refused; the operator erases, twice.
    let erase = format!("/v1/subjects/{email}/erase");
    let reason = json!({"reason": "GDPR art. 17 request #4711"});
    let (status, refused) = server.post(&erase, TENANT_A_TOKEN, &reason).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    let (status, unknown) = server
        .post(
            "/v1/subjects/nobody@example.org/erase",
            OPERATOR_TOKEN,
            &reason,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{unknown}");
    let (status, erased) = server.post(&erase, OPERATOR_TOKEN, &reason).await;
    assert_eq!(status, StatusCode::OK, "{erased}");
    assert_eq!(erased["erased"][0]["operations"], 3, "{erased}");
    assert_eq!(erased["erased"][0]["recorded"], true, "{erased}");
    let (status, again) = server.post(&erase, OPERATOR_TOKEN, &reason).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert!(
        again["erased"][0]["already_erased_at"].is_string(),
        "{again}"
    );
    assert_eq!(again["erased"][0]["recorded"], false, "{again}");

    // Every place that showed the values shows [erased]; the other person's stay readable.
    let (_, shown) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{open_id}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(shown["args"]["email"], "[erased]", "{shown}");
    assert_eq!(
        shown["args"]["title"], "[erased]",
        "every value is personal by default: {shown}"
    );
    let (_, listed) = server
        .call(
            Method::GET,
            "/v1/operations?limit=50",
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert!(!listed.to_string().contains(&email), "{listed}");
    let attempts = failed_attempts(&server).await;
    assert!(
        !attempts.to_string().contains(&email) && attempts.to_string().contains("[erased]"),
        "the receiver's answer quoting the address reads [erased]: {attempts}"
    );
    let (_, others) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{other_id}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(others["args"]["title"], "Unrelated", "{others}");
    let (_, subjects) = server
        .call(Method::GET, "/v1/subjects", Some(OPERATOR_TOKEN), None)
        .await;
    assert!(!subjects.to_string().contains(&email), "{subjects}");
    assert_eq!(
        subjects["subjects"].as_array().unwrap().len(),
        2,
        "{subjects}"
    );

    // The open operation can no longer be sent: approved, it goes to a person.
    let (status, approved) = server
        .post(
            &format!("/v1/operations/{open_id}/approve"),
            TENANT_A_TOKEN,
            &json!({"approver": "boss", "args_hash": open["args_hash"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    let reviewed = server
        .wait_for_state(TENANT_A_TOKEN, &open_id, &["needs_review"])
        .await;
    assert!(reviewed.to_string().contains("erased"), "{reviewed}");
    let objects = format!("{:?}", harness.objects().await);
    assert_eq!(
        objects.matches(&format!("Call {email}")).count(),
        1,
        "only the operation sent before the erasure reached the CRM: {objects}"
    );
    assert!(
        !objects.contains("Follow up") && !objects.contains("[erased]"),
        "{objects}"
    );

    // A tenant token does not list subjects either.
    let (status, _) = server
        .call(Method::GET, "/v1/subjects", Some(TENANT_B_TOKEN), None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (code, _) = server.terminate();
    assert_eq!(code, Some(0));

    // The history is complete and unaltered: the binary, the offline verifier on an export made
    // before and one made after all agree.
    succeeded(
        &opledger(&["verify", "--db", &db_arg], &[]),
        "opledger verify",
    );
    let after = dir.join("after.ndjson");
    succeeded(
        &opledger(
            &[
                "export",
                "--db",
                &db_arg,
                "--out",
                &after.display().to_string(),
            ],
            &[],
        ),
        "export after",
    );
    python_verifies(&before);
    python_verifies(&after);
    let before_text = std::fs::read_to_string(&before).expect("export");
    let after_text = std::fs::read_to_string(&after).expect("export");
    // The events' lines (the header and the closing line name the export, not an event).
    let before_lines: Vec<&str> = before_text
        .lines()
        .filter(|l| l.contains("\"stream\":"))
        .collect();
    assert!(before_lines.len() >= 4, "{before_text}");
    for line in &before_lines {
        assert!(
            after_text.contains(line),
            "every event exported before is exported after, byte for byte: {line}"
        );
    }
    assert!(
        after_text.contains("SubjectErased"),
        "the erasure is an event of the log"
    );

    // And now nothing opledger wrote — ledger, WAL, read models, key store, logs, exports —
    // holds the address or its hash; the key store holds no key for it.
    if let Some(file) = holding(&dir, &email).first() {
        let text = String::from_utf8_lossy(&std::fs::read(file).unwrap_or_default()).into_owned();
        let lines: Vec<&str> = text.lines().filter(|line| line.contains(&email)).collect();
        panic!(
            "the address in clear after erasure, in {}: {lines:#?}",
            file.display()
        );
    }
    assert_eq!(
        holding(&dir, &hash),
        Vec::<PathBuf>::new(),
        "the address's SHA-256 after erasure"
    );
    let shown = succeeded(
        &opledger(
            &["subjects", "list", "--db", &db_arg, "--json"],
            &[("OPLEDGER_KEK", KEK)],
        ),
        "subjects list",
    );
    assert!(!shown.contains(&email), "{shown}");
    assert!(shown.contains("someone.else@example.org"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_started_with_another_key_is_refused_and_a_rotated_key_opens_every_value() {
    let harness = harness().await;
    let dir = harness.dir.path().to_path_buf();
    let db_arg = dir.join("ledger.db").display().to_string();
    let email = unique_email();
    // Recorded from the command line, under the key in the environment.
    let output = opledger(
        &[
            "record",
            "--db",
            &db_arg,
            "--tenant",
            "tenant-a",
            "--provider",
            "crm",
            "--account",
            ACCOUNT,
            "--credential-fingerprint",
            "fp",
            "--action",
            "create_task",
            "--args",
            &json!({"title": email}).to_string(),
            "--subject",
            &email,
            "--json",
        ],
        &[("OPLEDGER_KEK", KEK)],
    );
    succeeded(&output, "record --subject");
    let operation: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let operation_id = operation["operation_id"].as_str().unwrap().to_owned();

    // An auditor keeps a signed checkpoint of the log as it is now.
    let log_key = dir.join("log.key");
    let generated = succeeded(
        &opledger(
            &[
                "keys",
                "generate",
                "--name",
                "ledger.example.com/test",
                "--out",
                &log_key.display().to_string(),
            ],
            &[],
        ),
        "keys generate",
    );
    let verifier_key = generated
        .lines()
        .next()
        .expect("the verifier key")
        .trim()
        .to_owned();
    let checkpoint = dir.join("before.checkpoint");
    succeeded(
        &opledger(
            &[
                "checkpoint",
                "--db",
                &db_arg,
                "--key-file",
                &log_key.display().to_string(),
                "--out",
                &checkpoint.display().to_string(),
            ],
            &[],
        ),
        "checkpoint",
    );

    // Another key: the server refuses to start, and says what to do.
    let refused = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["serve", "--config", &harness.config.display().to_string()])
        .env(KEK_ENV, OTHER_KEK)
        .output()
        .expect("runs");
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("does not open the key store") && said.contains("rotate-kek"),
        "{said}"
    );

    // Rotated to the other key, the server starts with it and shows the value.
    let new_kek = dir.join("new.kek");
    std::fs::write(&new_kek, OTHER_KEK).expect("written");
    succeeded(
        &opledger(
            &[
                "subjects",
                "rotate-kek",
                "--db",
                &db_arg,
                "--new-kek-file",
                &new_kek.display().to_string(),
            ],
            &[("OPLEDGER_KEK", KEK)],
        ),
        "rotate-kek",
    );
    let old = opledger(
        &["subjects", "list", "--db", &db_arg],
        &[("OPLEDGER_KEK", KEK)],
    );
    assert!(
        !old.status.success(),
        "the old key no longer opens the key store"
    );
    let server = serve(&harness, OTHER_KEK);
    let (_, shown) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{operation_id}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(shown["args"]["title"], email, "{shown}");
    let (code, _) = server.terminate();
    assert_eq!(code, Some(0));

    // Erased from the command line, the value is gone and the ledger still verifies.
    succeeded(
        &opledger(
            &[
                "subjects",
                "erase",
                &email,
                "--db",
                &db_arg,
                "--reason",
                "request #12",
                "--kek-file",
                &new_kek.display().to_string(),
            ],
            &[],
        ),
        "subjects erase",
    );
    succeeded(
        &opledger(&["verify", "--db", &db_arg], &[]),
        "opledger verify",
    );
    succeeded(
        &opledger(
            &[
                "verify",
                "--db",
                &db_arg,
                "--against",
                &checkpoint.display().to_string(),
                "--verifier-key",
                &verifier_key,
            ],
            &[],
        ),
        "verify --against the checkpoint kept before the erasure",
    );
    assert_eq!(holding(&dir, &email), Vec::<PathBuf>::new());
}

/// The files under `dirs` (recursively) whose bytes hold `needle`.
fn holding_any(dirs: &[PathBuf], needle: &str) -> Vec<PathBuf> {
    dirs.iter().flat_map(|dir| holding(dir, needle)).collect()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

/// The newest checkpoint the server published once it covers `size` events.
async fn checkpoint_covering(server: &Server, size: u64) -> String {
    let started = Instant::now();
    loop {
        let note = reqwest::get(format!("{}/v1/log/checkpoint", server.base))
            .await
            .expect("served")
            .text()
            .await
            .expect("text");
        let covered: u64 = note
            .lines()
            .nth(1)
            .and_then(|line| line.parse().ok())
            .unwrap_or(0);
        if covered >= size {
            return note;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "no checkpoint covers {size}: {note}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erased_persons_address_is_in_no_pg_dump_and_no_file_of_the_postgresql_cluster_and_the_log_still_verifies(
) {
    let cluster = postgres_server::server();
    let database = cluster.database();
    let url = cluster.url(&database);
    let harness = harness_on(Some(url.clone())).await;
    let dir = harness.dir.path().to_path_buf();
    let log_key = dir.join("log.key");
    let generated = succeeded(
        &opledger(
            &[
                "keys",
                "generate",
                "--name",
                "ledger.example.com/pg",
                "--out",
                &log_key.display().to_string(),
            ],
            &[],
        ),
        "keys generate",
    );
    let verifier_key = generated.lines().next().expect("a key").trim().to_owned();
    append_config(
        &harness,
        &format!(
            "\n[log]\nsigning_key_file = \"{}\"\ncheckpoint_every_events = 1\ncheckpoint_every_s = 1\n{}",
            log_key.display(),
            webhook_entry(&echoing_receiver().await)
        ),
    );
    let email = unique_email();
    let hash = sha256_hex(&email);
    let server = serve(&harness, KEK);

    let (_, open, other_id) = record_the_persons_operations(&server, &email).await;
    let open_id = open["operation_id"].as_str().unwrap().to_owned();

    // An auditor keeps a checkpoint of the log as it is before the erasure.
    let kept = dir.join("kept.checkpoint");
    let head = server.log_head().await;
    std::fs::write(&kept, checkpoint_covering(&server, head).await).expect("kept");

    // Before: the database holds the values only sealed — in a dump, in the database's files,
    // in PostgreSQL's write-ahead log — and so does everything else opledger wrote.
    let places = || {
        vec![
            cluster.database_files(&database),
            cluster.data_dir().join("pg_wal"),
            dir.clone(),
        ]
    };
    let dump = cluster.dump_plain(&database);
    assert!(
        !contains(&dump, &email),
        "the address in a dump before erasure"
    );
    assert!(
        !contains(&dump, &hash),
        "its SHA-256 in a dump before erasure"
    );
    assert!(
        contains(&dump, "opledger-sealed:v1:"),
        "the values are stored, sealed"
    );
    assert_eq!(holding_any(&places(), &email), Vec::<PathBuf>::new());
    assert_eq!(holding_any(&places(), &hash), Vec::<PathBuf>::new());

    let erase = format!("/v1/subjects/{email}/erase");
    let (status, erased) = server
        .post(
            &erase,
            OPERATOR_TOKEN,
            &json!({"reason": "GDPR art. 17 request #4712"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{erased}");
    assert_eq!(erased["erased"][0]["operations"], 3, "{erased}");
    let (_, shown) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{open_id}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(shown["args"]["email"], "[erased]", "{shown}");
    let (_, others) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{other_id}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(others["args"]["title"], "Unrelated", "{others}");
    let attempts = failed_attempts(&server).await;
    assert!(
        !attempts.to_string().contains(&email) && attempts.to_string().contains("[erased]"),
        "{attempts}"
    );
    let (code, _) = server.terminate();
    assert_eq!(code, Some(0));

    // After: found nowhere, and the key's row holds no key.
    let dump = cluster.dump_plain(&database);
    assert!(
        !contains(&dump, &email),
        "the address in a dump after erasure"
    );
    assert!(
        !contains(&dump, &hash),
        "its SHA-256 in a dump after erasure"
    );
    assert_eq!(holding_any(&places(), &email), Vec::<PathBuf>::new());
    assert_eq!(holding_any(&places(), &hash), Vec::<PathBuf>::new());
    assert_eq!(
        cluster.sql(
            &database,
            "SELECT count(*) FROM opledger.subject_keys WHERE erased_at IS NOT NULL AND wrapped_key IS NULL AND sealed_name IS NULL"
        ),
        "1"
    );

    // The command line reads the same key tables: the person is listed erased, the other not;
    // a rotated key-encryption key opens them, the old one no longer does.
    let listed = succeeded(
        &opledger(
            &["subjects", "list", "--store", &url, "--json"],
            &[("OPLEDGER_KEK", KEK)],
        ),
        "subjects list --store",
    );
    assert!(
        !listed.contains(&email) && listed.contains("someone.else@example.org"),
        "{listed}"
    );
    let new_kek = dir.join("new.kek");
    std::fs::write(&new_kek, OTHER_KEK).expect("written");
    let rotate = [
        "subjects",
        "rotate-kek",
        "--store",
        &url,
        "--new-kek-file",
        new_kek.to_str().expect("utf-8"),
    ];
    succeeded(
        &opledger(&rotate, &[("OPLEDGER_KEK", KEK)]),
        "rotate-kek --store",
    );
    let old = opledger(
        &["subjects", "list", "--store", &url],
        &[("OPLEDGER_KEK", KEK)],
    );
    assert!(
        !old.status.success(),
        "the old key no longer opens the key tables"
    );
    let listed = succeeded(
        &opledger(
            &["subjects", "list", "--store", &url, "--json"],
            &[("OPLEDGER_KEK", OTHER_KEK)],
        ),
        "subjects list with the new key",
    );
    assert!(listed.contains("someone.else@example.org"), "{listed}");

    // The history is complete and unaltered: the chain and the tree, and the checkpoint kept
    // before the erasure.
    succeeded(
        &opledger(&["verify", "--store", &url], &[]),
        "opledger verify",
    );
    succeeded(
        &opledger(
            &[
                "verify",
                "--store",
                &url,
                "--against",
                &kept.display().to_string(),
                "--verifier-key",
                &verifier_key,
            ],
            &[],
        ),
        "verify --against the checkpoint kept before the erasure",
    );
}

/// Operations recorded and executed by each of the load's clients.
const LOAD_OPERATIONS_PER_CLIENT: usize = 12;
/// Clients recording at once, spread over the two instances.
const LOAD_CLIENTS: usize = 6;

/// One operation the load recorded: who it is about and what its title was.
struct Recorded {
    id: String,
    subject: String,
    title: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_erased_under_load_on_two_instances_is_unreadable_everywhere_and_every_other_operation_is_intact(
) {
    let cluster = postgres_server::server();
    let database = cluster.database();
    let url = cluster.url(&database);
    let harness = harness_on(Some(url.clone())).await;
    let dir = harness.dir.path().to_path_buf();
    let servers: Vec<Server> = (0..2)
        .map(|n| {
            Server::start_with_env(
                &[
                    "serve",
                    "--config",
                    &harness.instance_config(n, &[]).display().to_string(),
                ],
                &dir,
                &[(KEK_ENV, KEK)],
            )
        })
        .collect();
    let email = unique_email();
    let hash = sha256_hex(&email);

    // Clients record and execute on both instances at once, each alternating between the person
    // and others; new subjects meet on both instances at once too. Midway the person is erased.
    // (Futures of one task: the servers' handles stay on it.)
    let recorded_so_far = std::sync::atomic::AtomicUsize::new(0);
    let total = LOAD_CLIENTS * LOAD_OPERATIONS_PER_CLIENT;
    let client = |client: usize| {
        let (servers, email, recorded_so_far) = (&servers, &email, &recorded_so_far);
        async move {
            let mut recorded = Vec::new();
            let mut refused = 0;
            for n in 0..LOAD_OPERATIONS_PER_CLIENT {
                let server = &servers[(client + n) % 2];
                let subject = match n % 2 {
                    0 => email.clone(),
                    _ => format!("other-{}@example.org", n % 4),
                };
                let title = format!("Call {subject} #{client}-{n}");
                let body = json!({"provider": "crm", "account": ACCOUNT, "action": "create_task",
                                  "args": {"title": title}, "subject": subject});
                let (status, answer) = server
                    .post(
                        "/v1/operations?execute=true&wait_ms=50",
                        TENANT_A_TOKEN,
                        &body,
                    )
                    .await;
                match status {
                    StatusCode::CREATED => recorded.push(Recorded {
                        id: answer["operation_id"].as_str().expect("an id").to_owned(),
                        subject,
                        title,
                    }),
                    // Only the person's, and only once they are erased.
                    StatusCode::CONFLICT
                        if answer["error"]["code"] == "subject_erased" && subject == *email =>
                    {
                        refused += 1;
                    }
                    other => panic!("{subject}: {other} {answer}"),
                }
                recorded_so_far.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            (recorded, refused)
        }
    };
    let eraser = async {
        let started = Instant::now();
        while recorded_so_far.load(std::sync::atomic::Ordering::Relaxed) < total / 3 {
            assert!(started.elapsed() < DEADLINE, "the load does not move");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let (status, erased) = servers[0]
            .post(
                &format!("/v1/subjects/{email}/erase"),
                OPERATOR_TOKEN,
                &json!({"reason": "GDPR art. 17 request #4713"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{erased}");
        assert!(
            recorded_so_far.load(std::sync::atomic::Ordering::Relaxed) < total,
            "the erasure came while the load was still recording"
        );
    };
    let (done, ()) = tokio::join!(
        futures_util::future::join_all((0..LOAD_CLIENTS).map(client)),
        eraser
    );
    let mut recorded = Vec::new();
    let mut refused = 0;
    for (mine, not) in done {
        recorded.extend(mine);
        refused += not;
    }
    assert!(
        refused > 0,
        "records of the person after the erasure are refused"
    );

    // Every acknowledged operation is there, on both instances: the others' as recorded and
    // settled, the person's unreadable.
    for operation in &recorded {
        for server in servers.iter() {
            let (status, shown) = server
                .call(
                    Method::GET,
                    &format!("/v1/operations/{}", operation.id),
                    Some(TENANT_A_TOKEN),
                    None,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{shown}");
            let expected = match operation.subject == email {
                true => "[erased]",
                false => operation.title.as_str(),
            };
            assert_eq!(shown["args"]["title"], expected, "{shown}");
        }
        if operation.subject != email {
            servers[0]
                .wait_for_state(TENANT_A_TOKEN, &operation.id, &["succeeded"])
                .await;
        }
    }
    let others = recorded.iter().filter(|op| op.subject != email).count();
    assert_eq!(others, total / 2, "no other operation was refused or lost");
    for server in servers {
        let (code, _) = server.terminate();
        assert_eq!(code, Some(0));
    }

    // None of the person's values is readable anywhere; the log is whole.
    let dump = cluster.dump_plain(&database);
    assert!(!contains(&dump, &email), "the address in a dump");
    assert!(!contains(&dump, &hash), "its SHA-256 in a dump");
    let places = [
        cluster.database_files(&database),
        cluster.data_dir().join("pg_wal"),
        dir.clone(),
    ];
    assert_eq!(holding_any(&places, &email), Vec::<PathBuf>::new());
    assert_eq!(holding_any(&places, &hash), Vec::<PathBuf>::new());
    succeeded(
        &opledger(&["verify", "--store", &url], &[]),
        "opledger verify",
    );
}

#[tokio::test]
async fn serve_without_a_configuration_seals_a_subjects_values_under_the_key_in_opledger_kek() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("default.db");
    let db_text = db.display().to_string();
    let serve_args = ["serve", "--listen", "127.0.0.1:0", "--db", &db_text];

    // Spawned with a deadline: a server that ignored the variable would run on.
    let mut refused = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(serve_args)
        .env("OPLEDGER_KEK", "not a key")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("opledger serve starts");
    let started = Instant::now();
    while refused.try_wait().expect("its status").is_none() {
        if started.elapsed() > DEADLINE {
            let _ = refused.kill();
            panic!("a server given a malformed $OPLEDGER_KEK started instead of refusing");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let refused = refused.wait_with_output().expect("its output");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("$OPLEDGER_KEK"),
        "names the variable: {stderr}"
    );
    assert!(!db.exists(), "a refused start opens nothing");

    // `opledger mcp` says in its start-up line that personal data is on, and with which key
    // (stdin closed: the session ends at once).
    let mcp = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["mcp", "--db", &db_text])
        .env_remove("OPLEDGER_CONFIG")
        .env("OPLEDGER_KEK", KEK)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("opledger mcp runs");
    let said = String::from_utf8_lossy(&mcp.stderr);
    assert!(
        said.contains("personal data on (key") && said.contains("default.db.keys"),
        "{said}"
    );

    let server = Server::start_with_env(&serve_args, dir.path(), &[("OPLEDGER_KEK", KEK)]);
    let email = unique_email();
    let recorded = record(
        &server,
        "demo-tenant-token",
        &email,
        json!({"provider": "crm", "account": "demo", "action": "create_task",
               "args": {"title": "Call back", "email": email}}),
        "?execute=true&wait_ms=5000",
    )
    .await;
    assert_eq!(recorded["state"], "succeeded", "{recorded}");
    let id = recorded["operation_id"].as_str().expect("an id");
    let (_, shown) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{id}"),
            Some("demo-tenant-token"),
            None,
        )
        .await;
    assert_eq!(
        shown["args"]["email"], email,
        "opened with the key: {shown}"
    );
    assert!(
        holding(dir.path(), &email).is_empty(),
        "the address is sealed in every file: {:?}",
        holding(dir.path(), &email)
    );
    let (code, _) = server.terminate();
    assert_eq!(code, Some(0));
}
