//! The transparency log checked by a tlog implementation nobody here wrote: Go's
//! `golang.org/x/mod/sumdb/note` and `golang.org/x/mod/sumdb/tlog` (Debian's
//! `golang-golang-x-mod-dev`, installed with `golang-go` when missing). A real `opledger serve`
//! publishes checkpoints while operations are recorded and executed against the CRM stand; an
//! auditor keeps an early checkpoint, exports the ledger, and the Go program in `tlog_go/`
//! (written from the book's page, not from opledger's code) opens both checkpoints with the
//! verifier key, reads the tiles through `tlog.TileHashReader`, checks the consistency proof with
//! `tlog.CheckTree` and every event's inclusion proof with `tlog.CheckRecord`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use crate::python::python_venv::run;
use crate::support::{Harness, Server, DEADLINE, TENANT_A_TOKEN, TENANT_B_TOKEN};

/// Where Debian's `golang-golang-x-mod-dev` puts the packages (a GOPATH tree).
const GOPATH: &str = "/usr/share/gocode";

/// Installs Go and `golang.org/x/mod` from Debian when missing (about 15 s). Fails the test when
/// it cannot: an interoperability test that skips proves nothing. It waits while another test
/// installs its tools.
fn ensure_go() {
    let tlog = Path::new(GOPATH).join("src/golang.org/x/mod/sumdb/tlog");
    crate::postgres_server::apt::install(
        &["golang-go", "golang-golang-x-mod-dev"],
        "Go with golang.org/x/mod",
        || tlog.exists() && Path::new("/usr/bin/go").exists(),
    )
    .unwrap_or_else(|error| panic!("this test needs Go: {error}"));
}

/// Builds the Go checker once per test process, in GOPATH mode over Debian's packages (no module
/// download: the network reaches no Go proxy).
fn go_checker() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            ensure_go();
            let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
            // Built aside and renamed into place, so test processes running at once never run
            // a half-written binary, and runs do not pile binaries up.
            let binary = tmp.join("tlog-go-check");
            let building = tmp.join(format!("tlog-go-check.building-{}", std::process::id()));
            run(
                Command::new("go")
                    .args(["build", "-o"])
                    .arg(&building)
                    .arg(".")
                    .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/serve/tlog_go"))
                    .env("GO111MODULE", "off")
                    .env("GOPATH", GOPATH)
                    .env("GOCACHE", tmp.join("go-build-cache"))
                    .env("GOFLAGS", ""),
                "building the Go tlog checker",
            );
            std::fs::rename(&building, &binary).expect("the Go checker is put in place");
            binary
        })
        .clone()
}

fn opledger(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(args)
        .env_remove("OPLEDGER_DB")
        .env_remove("OPLEDGER_LOG_KEY")
        .env_remove("OPLEDGER_LOG_KEY_FILE")
        .output()
        .expect("opledger runs")
}

fn printed(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The served checkpoint once it covers at least `size` events.
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
            .unwrap_or_else(|| panic!("a checkpoint's second line is its size: {note}"));
        if covered >= size {
            return note;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "no checkpoint covering {size} events was published; the newest:\n{note}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The last event position of an NDJSON export.
fn last_position(export: &Path) -> u64 {
    let text = std::fs::read_to_string(export).expect("the export");
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|line| line["position"].as_u64())
        .max()
        .expect("the export has events")
}

fn go_check(url: &str, verifier_key: &str, kept: &Path, export: &Path) -> Output {
    Command::new(go_checker())
        .args(["-url", url, "-vkey", verifier_key, "-kept"])
        .arg(kept)
        .arg("-export")
        .arg(export)
        .output()
        .expect("the Go checker runs")
}

#[tokio::test]
async fn go_sumdb_tlog_verifies_the_served_checkpoints_tiles_and_proofs_and_refuses_an_edited_event(
) {
    // Built first: on a fresh machine this installs Go, which the rest need not wait behind.
    let checker = tokio::task::spawn_blocking(go_checker);
    let harness = Harness::new("").await;
    let key = harness.dir.path().join("log.key");
    let generated = opledger(&[
        "keys",
        "generate",
        "--name",
        "ledger.example.com/acme",
        "--out",
        key.to_str().expect("utf-8"),
    ]);
    assert!(generated.status.success(), "{}", printed(&generated));
    let verifier_key = String::from_utf8_lossy(&generated.stdout).trim().to_owned();
    let log_section = format!(
        "[log]\nsigning_key_file = \"{}\"\ncheckpoint_every_events = 1\ncheckpoint_every_s = 1\n\n[metrics]",
        key.display()
    );
    let config = harness.instance_config(0, &[("[metrics]", &log_section)]);
    let server = harness.serve_with(&config);

    // An early checkpoint, kept by the auditor on their own machine.
    server
        .record_for_approval(TENANT_A_TOKEN, "Call the client")
        .await;
    server
        .record_for_approval(TENANT_B_TOKEN, "Send the contract")
        .await;
    let kept = harness.dir.path().join("kept.checkpoint");
    std::fs::write(&kept, checkpoint_covering(&server, 2).await).expect("kept");

    // The log grows: more intents, and one executed against the CRM (its attempt and outcome).
    for title in ["Book the room", "Order lunch"] {
        server.record_for_approval(TENANT_A_TOKEN, title).await;
    }
    let (status, recorded) = server
        .record(TENANT_A_TOKEN, "crm", "Call back", None)
        .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{recorded}");
    let operation = recorded["operation_id"].as_str().expect("an id").to_owned();
    server.execute(TENANT_A_TOKEN, &operation, 5_000).await;
    server
        .wait_for_state(TENANT_A_TOKEN, &operation, &["succeeded"])
        .await;

    let export = harness.dir.path().join("ledger.ndjson");
    let ledger = harness.dir.path().join("ledger.db");
    // Cut at a checkpoint of the log as it is now (the newest the server published may be older).
    let exported = opledger(&[
        "export",
        "--db",
        ledger.to_str().expect("utf-8"),
        "--key-file",
        key.to_str().expect("utf-8"),
        "--out",
        export.to_str().expect("utf-8"),
    ]);
    assert!(exported.status.success(), "{}", printed(&exported));
    let head = last_position(&export);
    checkpoint_covering(&server, head).await;
    checker.await.expect("the Go checker is built");

    let checked = go_check(&server.base, &verifier_key, &kept, &export);
    assert!(checked.status.success(), "{}", printed(&checked));
    let summary = printed(&checked);
    assert!(
        summary.contains("signed by ledger.example.com/acme")
            && summary.contains(&format!("{head} events included")),
        "{summary}"
    );

    // The project's own offline verifier agrees, and holds the served checkpoint to the kept
    // one with the served consistency proof, without an export.
    let python_verifier =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/verify-export/verify_export.py");
    let verified = Command::new("python3")
        .arg(&python_verifier)
        .arg(&export)
        .args(["--verifier-key", &verifier_key, "--kept"])
        .arg(&kept)
        .output()
        .expect("python3 runs");
    assert!(verified.status.success(), "{}", printed(&verified));
    let latest = harness.dir.path().join("latest.checkpoint");
    let note = checkpoint_covering(&server, head).await;
    std::fs::write(&latest, &note).expect("written");
    let size = note.lines().nth(1).expect("a size").to_owned();
    let kept_size = std::fs::read_to_string(&kept).expect("kept");
    let kept_size = kept_size.lines().nth(1).expect("a size");
    let proof = reqwest::get(format!(
        "{}/v1/log/proof/consistency?from={kept_size}&to={size}",
        server.base
    ))
    .await
    .expect("served")
    .text()
    .await
    .expect("text");
    let proof_file = harness.dir.path().join("consistency.json");
    std::fs::write(&proof_file, proof).expect("written");
    let extended = Command::new("python3")
        .arg(&python_verifier)
        .args(["--verifier-key", &verifier_key, "--kept"])
        .arg(&kept)
        .arg("--checkpoint")
        .arg(&latest)
        .arg("--consistency-proof")
        .arg(&proof_file)
        .output()
        .expect("python3 runs");
    assert!(extended.status.success(), "{}", printed(&extended));
    assert!(
        printed(&extended).contains(&format!(
            "the checkpoint of {size} events extends the kept one of {kept_size}"
        )),
        "{}",
        printed(&extended)
    );

    // One byte of one event's data changed in the export: Go's CheckRecord refuses its proof.
    let text = std::fs::read_to_string(&export).expect("the export");
    let edited = harness.dir.path().join("edited.ndjson");
    assert!(text.contains("Book the room"));
    std::fs::write(&edited, text.replacen("Book the room", "Book the roof", 1)).expect("written");
    let refused = go_check(&server.base, &verifier_key, &kept, &edited);
    assert_eq!(refused.status.code(), Some(1), "{}", printed(&refused));
    assert!(
        printed(&refused).contains("is not in the checkpoint of"),
        "{}",
        printed(&refused)
    );

    // A kept checkpoint whose size was edited no longer opens with the verifier key.
    let note = std::fs::read_to_string(&kept).expect("kept");
    let size = note.lines().nth(1).expect("a size").to_owned();
    let forged = harness.dir.path().join("forged.checkpoint");
    std::fs::write(&forged, note.replacen(&format!("\n{size}\n"), "\n1\n", 1)).expect("written");
    let refused = go_check(&server.base, &verifier_key, &forged, &export);
    assert_eq!(refused.status.code(), Some(1), "{}", printed(&refused));
    assert!(
        printed(&refused).contains("does not open with the verifier key"),
        "{}",
        printed(&refused)
    );
}

#[tokio::test]
async fn an_as_of_answer_with_proof_names_each_folded_event_with_its_inclusion_proof() {
    use base64::Engine as _;
    use opledger_domain::{checkpoint, merkle};
    let harness = Harness::new("").await;
    let key = harness.dir.path().join("log.key");
    let generated = opledger(&[
        "keys",
        "generate",
        "--name",
        "ledger.example.com/acme",
        "--out",
        key.to_str().expect("utf-8"),
    ]);
    let verifier_key = String::from_utf8_lossy(&generated.stdout).trim().to_owned();
    let server = Server::start_with_env(
        &["serve", "--config", &harness.config.display().to_string()],
        harness.dir.path(),
        &[("OPLEDGER_LOG_KEY_FILE", key.to_str().expect("utf-8"))],
    );
    let (status, recorded) = server
        .record(TENANT_A_TOKEN, "crm", "Call back", None)
        .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{recorded}");
    let operation = recorded["operation_id"].as_str().expect("an id").to_owned();
    server.execute(TENANT_A_TOKEN, &operation, 5_000).await;
    server
        .wait_for_state(TENANT_A_TOKEN, &operation, &["succeeded"])
        .await;

    // As of the intent's own position: one event folded, proved.
    let path = format!("/v1/operations/{operation}?as_of=1&proof=true");
    let (status, answer) = server
        .call(reqwest::Method::GET, &path, Some(TENANT_A_TOKEN), None)
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{answer}");
    assert_eq!(answer["as_of_position"], 1);
    let proof = &answer["proof"];
    let opened = checkpoint::open(proof["checkpoint"].as_str().expect("a note"), &verifier_key)
        .expect("signed by the log's key");
    assert_eq!(proof["tree_size"].as_u64(), Some(opened.head.size));
    assert_eq!(
        opened.tenants.map(|tenants| tenants.size),
        Some(1),
        "the served checkpoint signs the tenants' map (one tenant so far)"
    );
    let events = proof["events"].as_array().expect("events");
    assert_eq!(events.len(), 1, "{answer}");
    assert_eq!(events[0]["position"], 1);
    let first_checkpoint = proof["checkpoint"].as_str().expect("a note").to_owned();

    // As of now: every event of the succeeded operation, each leaf in the signed tree.
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let path = format!("/v1/operations/{operation}?as_of={now}&proof=true");
    let (status, answer) = server
        .call(reqwest::Method::GET, &path, Some(TENANT_A_TOKEN), None)
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{answer}");
    assert_eq!(answer["state"], "succeeded", "{answer}");
    let proof = &answer["proof"];
    let opened = checkpoint::open(proof["checkpoint"].as_str().expect("a note"), &verifier_key)
        .expect("signed by the log's key");
    let events = proof["events"].as_array().expect("events");
    assert!(events.len() >= 3, "intent, attempt, outcome: {answer}");
    for (version, event) in events.iter().enumerate() {
        assert_eq!(event["version"].as_u64(), Some(version as u64));
        let leaf = base64::engine::general_purpose::STANDARD
            .decode(event["leaf"].as_str().expect("a leaf"))
            .expect("base64");
        assert!(leaf.starts_with(merkle::LEAF_TAG));
        // RFC 6962's leaf hash, computed here: SHA-256 of a zero byte and the leaf.
        use sha2::Digest as _;
        let leaf_hash = merkle::Hash(
            sha2::Sha256::new()
                .chain_update([0])
                .chain_update(&leaf)
                .finalize()
                .into(),
        );
        assert_eq!(
            event["leaf_hash"].as_str(),
            Some(leaf_hash.to_string().as_str())
        );
        let hashes: Vec<merkle::Hash> = event["inclusion_proof"]
            .as_array()
            .expect("a proof")
            .iter()
            .map(|hash| merkle::parse_hash(hash.as_str().expect("text")).expect("a hash"))
            .collect();
        let index = event["leaf_index"].as_u64().expect("an index");
        merkle::check_inclusion(&hashes, opened.head, index, leaf_hash).expect("included");
    }

    // The project's offline verifier (not opledger) checks the answer on its own: the
    // checkpoint's signature, each leaf and proof, the versions' links and ids, and that the
    // answer's checkpoint extends one the auditor kept earlier (the first answer's).
    let kept = harness.dir.path().join("kept.checkpoint");
    std::fs::write(&kept, first_checkpoint).expect("kept");
    let answer_file = harness.dir.path().join("answer.json");
    std::fs::write(&answer_file, answer.to_string()).expect("written");
    let kept_size = checkpoint::open(
        &std::fs::read_to_string(&kept).expect("kept"),
        &verifier_key,
    )
    .expect("signed")
    .head
    .size;
    let consistency = reqwest::get(format!(
        "{}/v1/log/proof/consistency?from={kept_size}&to={}",
        server.base, opened.head.size
    ))
    .await
    .expect("served")
    .text()
    .await
    .expect("text");
    let consistency_file = harness.dir.path().join("consistency.json");
    std::fs::write(&consistency_file, consistency).expect("written");
    let python_verifier =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/verify-export/verify_export.py");
    let check = |answer: &Path| {
        Command::new("python3")
            .arg(&python_verifier)
            .arg("--answer")
            .arg(answer)
            .args(["--verifier-key", &verifier_key, "--kept"])
            .arg(&kept)
            .arg("--consistency-proof")
            .arg(&consistency_file)
            .output()
            .expect("python3 runs")
    };
    let verified = check(&answer_file);
    assert!(verified.status.success(), "{}", printed(&verified));
    assert!(
        printed(&verified).contains(&format!("{} event(s) proved", events.len()))
            && printed(&verified).contains("state succeeded")
            && printed(&verified).contains("it extends the kept checkpoint"),
        "{}",
        printed(&verified)
    );
    // One bit of one event's leaf changed (its stored metadata): the verifier names the event.
    let mut edited = answer.clone();
    let leaf = edited["proof"]["events"][1]["leaf"]
        .as_str()
        .expect("a leaf")
        .to_owned();
    let mut bytes = base64::engine::general_purpose::STANDARD
        .decode(&leaf)
        .expect("base64");
    let last = bytes.len() - 3;
    bytes[last] ^= 1;
    edited["proof"]["events"][1]["leaf"] =
        serde_json::json!(base64::engine::general_purpose::STANDARD.encode(&bytes));
    std::fs::write(&answer_file, edited.to_string()).expect("written");
    let refused = check(&answer_file);
    assert_eq!(refused.status.code(), Some(1), "{}", printed(&refused));
    assert!(
        printed(&refused).contains("NOT PROVED: version 1"),
        "{}",
        printed(&refused)
    );

    // A proof of an answer that names no moment is refused, saying what to add.
    let path = format!("/v1/operations/{operation}?proof=true");
    let (status, answer) = server
        .call(reqwest::Method::GET, &path, Some(TENANT_A_TOKEN), None)
        .await;
    assert_eq!(
        status,
        reqwest::StatusCode::UNPROCESSABLE_ENTITY,
        "{answer}"
    );
    assert!(answer.to_string().contains("give as_of too"), "{answer}");
}
