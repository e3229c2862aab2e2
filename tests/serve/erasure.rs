//! Erasing a data subject end to end: a real `opledger serve` on a real SQLite ledger with its
//! key store beside it, operations recorded with a person's e-mail address, the person erased,
//! and then every byte of every file opledger wrote searched for the address and its SHA-256.
//! The proofs are checked by the binary (`opledger verify`) and by the offline verifier in
//! Python, on an export made before the erasure and one made after.

use std::path::{Path, PathBuf};
use std::process::Command;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::support::{Harness, Server, ACCOUNT, OPERATOR_TOKEN, TENANT_A_TOKEN, TENANT_B_TOKEN};

const KEK: &str = "3c1f0a9e5b7d2c4e6f8a1b3d5c7e9f0a2b4c6d8e1f3a5b7c9d0e2f4a6b8c1d3e";
const OTHER_KEK: &str = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
const KEK_ENV: &str = "OPLEDGER_TEST_KEK";

/// An address nobody else writes: random words and a number from the clock.
fn unique_email() -> String {
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
    let harness = Harness::new("").await;
    let mut text = std::fs::read_to_string(&harness.config).expect("the configuration");
    text.push_str(&format!("\n[personal_data]\nkek_env = \"{KEK_ENV}\"\n"));
    std::fs::write(&harness.config, text).expect("configuration written");
    harness
}

fn serve(harness: &Harness, kek: &str) -> Server {
    Server::start_with_env(
        &["serve", "--config", &harness.config.display().to_string()],
        harness.dir.path(),
        &[(KEK_ENV, kek)],
    )
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
fn holding(dir: &Path, needle: &str) -> Vec<PathBuf> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erased_persons_address_is_found_nowhere_opledger_wrote_and_every_proof_still_verifies()
{
    let harness = harness().await;
    let dir = harness.dir.path().to_path_buf();
    let db = dir.join("ledger.db");
    let db_arg = db.display().to_string();
    let email = unique_email();
    let hash = sha256_hex(&email);
    let server = serve(&harness, KEK);

    // One sent and confirmed, one waiting for an approval (open), both about the person, and
    // one about somebody else, which the erasure must leave readable.
    let create = |title: String, approval: bool| {
        json!({"provider": "crm", "account": ACCOUNT, "action": "create_task",
               "args": {"title": title, "email": email}, "requires_approval": approval})
    };
    let sent = record(
        &server,
        TENANT_A_TOKEN,
        &email,
        create(format!("Call {email}"), false),
        "?execute=true&wait_ms=5000",
    )
    .await;
    assert_eq!(sent["state"], "succeeded", "{sent}");
    assert!(
        sent["args_hash"]
            .as_str()
            .unwrap()
            .starts_with("hmac-sha256:"),
        "{sent}"
    );
    let open = record(
        &server,
        TENANT_A_TOKEN,
        &email,
        create("Follow up".into(), true),
        "",
    )
    .await;
    let open_id = open["operation_id"].as_str().unwrap().to_owned();
    let other = record(&server, TENANT_A_TOKEN, "someone.else@example.org", json!({"provider": "crm", "account": ACCOUNT, "action": "create_task", "args": {"title": "Unrelated"}}), "").await;
    let other_id = other["operation_id"].as_str().unwrap().to_owned();

    // While the key lives the API shows the values; the files hold them only sealed.
    let (_, shown) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{open_id}"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(shown["args"]["email"], email, "{shown}");
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
    assert_eq!(erased["erased"][0]["operations"], 2, "{erased}");
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
