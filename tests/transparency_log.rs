//! The transparency log against a ledger tampered with behind its back: a real SQLite file
//! written by the real ledger, a checkpoint signed by the real binary with a key it generated,
//! the file changed with plain SQL (or replaced by an older copy), then `opledger verify` — on its
//! own and `--against` the checkpoint kept before — run as a process. Each case must be caught,
//! and the first divergence named.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use opledger_domain::chain;
use opledger_domain::checkpoint;
use opledger_domain::ids::{EventId, StreamVersion};
use opledger_domain::merkle;
use opledger_domain::store::{EventStore, LogStart, StreamName};
use opledger_store::SqliteStore;

#[path = "approved_operations/mod.rs"]
mod approved_operations;

/// Records `operations` approved operations (two events each: positions 2n−1 and 2n).
async fn write_operations(db: &Path, operations: usize) -> Vec<String> {
    let store = SqliteStore::open(db).await.expect("opens");
    let streams = approved_operations::record_approved(&store, operations).await;
    store.close().await.expect("closes");
    streams
}

fn opledger(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(args)
        .env_remove("OPLEDGER_DB")
        .env_remove("OPLEDGER_LOG_KEY")
        .env_remove("OPLEDGER_LOG_KEY_FILE")
        .env_remove("OPLEDGER_LOG_VERIFIER_KEY")
        .output()
        .expect("runs")
}

fn path(path: &Path) -> &str {
    path.to_str().expect("utf-8")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn both(output: &Output) -> String {
    format!(
        "{}{}",
        stdout(output),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A signing key made by `opledger keys generate` in `dir`, and the verifier key it printed.
fn generate_key(dir: &Path) -> (PathBuf, String) {
    let key = dir.join("log.key");
    let generated = opledger(&[
        "keys",
        "generate",
        "--name",
        "ledger.example.com/acme",
        "--out",
        path(&key),
    ]);
    assert!(generated.status.success(), "{}", both(&generated));
    let verifier_key = stdout(&generated).trim().to_owned();
    (key, verifier_key)
}

/// A ledger of three operations (six events), a key made by `opledger keys generate`, and a
/// checkpoint of the six signed by `opledger checkpoint` and kept in a file outside the ledger.
struct Audited {
    _dir: tempfile::TempDir,
    db: PathBuf,
    checkpoint: PathBuf,
    key: PathBuf,
    verifier_key: String,
    streams: Vec<String>,
}

impl Audited {
    async fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("ledger.db");
        let streams = write_operations(&db, 3).await;
        let (key, verifier_key) = generate_key(dir.path());
        let checkpoint = dir.path().join("kept.checkpoint");
        let signed = opledger(&[
            "checkpoint",
            "--db",
            path(&db),
            "--key-file",
            path(&key),
            "--out",
            path(&checkpoint),
        ]);
        assert!(signed.status.success(), "{}", both(&signed));
        Self {
            _dir: dir,
            db,
            checkpoint,
            key,
            verifier_key,
            streams,
        }
    }

    fn sql(&self, statement: &str) {
        let connection = rusqlite::Connection::open(&self.db).expect("opens the file directly");
        connection
            .execute_batch(statement)
            .expect("the tampering statement runs");
    }

    fn verify(&self) -> Output {
        opledger(&["verify", "--db", path(&self.db)])
    }

    fn verify_against(&self) -> Output {
        opledger(&[
            "verify",
            "--db",
            path(&self.db),
            "--against",
            path(&self.checkpoint),
            "--verifier-key",
            &self.verifier_key,
        ])
    }
}

#[track_caller]
fn assert_tampered(output: &Output, expected: &str) {
    assert_eq!(output.status.code(), Some(4), "{}", both(output));
    assert!(
        stdout(output).contains(expected),
        "expected `{expected}` in:\n{}",
        both(output)
    );
}

#[tokio::test]
async fn a_kept_checkpoint_of_an_untouched_ledger_verifies_and_opens_with_the_printed_key() {
    let audited = Audited::new().await;
    let note = std::fs::read_to_string(&audited.checkpoint).expect("kept");
    let opened = checkpoint::open(&note, &audited.verifier_key).expect("signed by the key");
    assert_eq!(opened.origin, "ledger.example.com/acme");
    assert_eq!(opened.head.size, 6);
    let output = audited.verify_against();
    assert!(output.status.success(), "{}", both(&output));
    assert!(
        stdout(&output).contains("no tampering found"),
        "{}",
        both(&output)
    );
    // The key never went into the ledger.
    let key = std::fs::read_to_string(&audited.key).expect("the key file");
    let ledger = std::fs::read(&audited.db).expect("the ledger file");
    // `PRIVATE+KEY+<name>+<hash>+<base64>`: the base64 may itself hold a '+', so the fields are
    // counted from the front (the last '+' would leave a tail of a few characters, which a
    // ledger of any size holds by chance).
    let secret = key.trim().splitn(5, '+').nth(4).expect("the key's base64");
    assert!(secret.len() > 40, "the whole key: {secret}");
    assert!(!ledger
        .windows(secret.len())
        .any(|window| window == secret.as_bytes()));
}

#[tokio::test]
async fn deleting_the_newest_events_is_caught_from_the_file_and_named_a_removed_tail() {
    let audited = Audited::new().await;
    audited.sql("DELETE FROM events WHERE position > 4");
    assert_tampered(&audited.verify(), "positions 5..6 were removed");
    assert_tampered(
        &audited.verify(),
        &format!("REMOVED   {} v0", audited.streams[2]),
    );
    assert_tampered(
        &audited.verify_against(),
        "first divergence from the checkpoint of 6 events, a removed tail: the log holds only 4 of them",
    );
}

#[tokio::test]
async fn deleting_an_event_in_the_middle_is_named_at_its_position() {
    let audited = Audited::new().await;
    audited.sql("DELETE FROM events WHERE position = 3");
    assert_tampered(
        &audited.verify_against(),
        "a removed event: position 3, which the checkpoint covers, is missing from the log",
    );
}

#[tokio::test]
async fn an_event_rewritten_with_its_link_and_id_recomputed_is_blamed_on_itself_not_the_next() {
    let audited = Audited::new().await;
    let stream = &audited.streams[1];
    // The second operation's intent, as the store holds it.
    let store = SqliteStore::open(&audited.db).await.expect("opens");
    let events = store
        .read_stream(
            &StreamName::new(stream.clone()).expect("valid"),
            StreamVersion::FIRST,
            10,
        )
        .await
        .expect("reads");
    store.close().await.expect("closes");
    let intent = &events[0];
    let data = String::from_utf8(intent.data.clone())
        .expect("JSON")
        .replace("Call client 1", "Call client X");
    // Everything an attacker with the file can recompute: the id (same time, same scheme) and
    // the chain link (the intent is the stream's first event).
    let millis = u64::from_be_bytes({
        let mut bytes = [0_u8; 8];
        bytes[2..].copy_from_slice(&intent.event_id.as_uuid().as_bytes()[..6]);
        bytes
    });
    let at = chrono::DateTime::from_timestamp_millis(millis as i64).expect("a time");
    let operation = intent.stream.operation_id().expect("an operation stream");
    let id = EventId::for_operation_event(
        operation,
        intent.version,
        at,
        &intent.event_type,
        data.as_bytes(),
    );
    assert!(id.matches(
        operation,
        intent.version,
        &intent.event_type,
        data.as_bytes()
    ));
    let link = chain::link(None, intent.version, &intent.event_type, data.as_bytes());
    audited.sql(&format!(
        "UPDATE events SET data = CAST('{}' AS BLOB), event_id = X'{}', \
         metadata = CAST('{{\"schema_version\":1,\"chain\":\"{link}\"}}' AS BLOB) WHERE position = {}",
        data.replace('\'', "''"),
        id.as_uuid().simple(),
        intent.position,
    ));
    let output = audited.verify();
    assert_tampered(
        &output,
        &format!(
            "EDITED    {stream} v0 @{}: its bytes are not the ones the log's tree recorded",
            intent.position
        ),
    );
    assert!(
        !stdout(&output).contains(&format!("{stream} v1")),
        "the next event is not blamed:\n{}",
        both(&output)
    );
    assert!(
        stdout(&output).contains("1 finding(s)"),
        "{}",
        both(&output)
    );
    assert_tampered(
        &audited.verify_against(),
        &format!(
            "DIVERGED  {stream} v0 @{}: first divergence from the checkpoint of 6 events, a rewritten event",
            intent.position
        ),
    );
}

#[tokio::test]
async fn two_events_swapped_in_the_log_are_named_a_reordering() {
    let audited = Audited::new().await;
    audited.sql(
        "UPDATE events SET position = 1000 WHERE position = 2;
         UPDATE events SET position = 2 WHERE position = 3;
         UPDATE events SET position = 3 WHERE position = 1000;",
    );
    let output = audited.verify();
    assert_tampered(
        &output,
        &format!(
            "REORDERED {} v1 @3: the log's tree recorded this event at position 2",
            audited.streams[0]
        ),
    );
    assert_tampered(
        &audited.verify_against(),
        "@2: first divergence from the checkpoint of 6 events, a reordering",
    );
}

#[tokio::test]
async fn an_event_inserted_behind_the_ledgers_back_is_named_as_inserted() {
    let audited = Audited::new().await;
    audited.sql(&format!(
        "INSERT INTO events (stream_id, version, stream, event_id, event_type, data, metadata) \
         SELECT stream_id, 2, stream, randomblob(16), event_type, data, metadata FROM events WHERE position = 2;
         UPDATE streams SET last_version = 2 WHERE name = '{}'",
        audited.streams[0]
    ));
    assert_tampered(
        &audited.verify(),
        "INSERTED  @7: the log's tree recorded 6 events, but the log goes on to position 7",
    );
}

#[tokio::test]
async fn a_ledger_rolled_back_to_an_older_copy_verifies_on_its_own_but_not_against_the_checkpoint()
{
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ledger.db");
    write_operations(&db, 2).await;
    let older = dir.path().join("older.db");
    std::fs::copy(&db, &older).expect("an older copy");
    write_operations(&db, 2).await;
    let (key, verifier_key) = generate_key(dir.path());
    let kept = dir.path().join("kept.checkpoint");
    let signed = opledger(&[
        "checkpoint",
        "--db",
        path(&db),
        "--key-file",
        path(&key),
        "--out",
        path(&kept),
    ]);
    assert!(signed.status.success(), "{}", both(&signed));
    std::fs::copy(&older, &db).expect("rolled back");

    let alone = opledger(&["verify", "--db", path(&db)]);
    assert!(
        alone.status.success(),
        "a consistent older copy: {}",
        both(&alone)
    );
    let against = opledger(&[
        "verify",
        "--db",
        path(&db),
        "--against",
        path(&kept),
        "--verifier-key",
        &verifier_key,
    ]);
    assert_tampered(
        &against,
        "first divergence from the checkpoint of 8 events, a removed tail: the log holds only 4 of them",
    );
}

#[tokio::test]
async fn a_checkpoint_not_signed_by_the_verifier_key_is_refused_before_anything_is_read() {
    let audited = Audited::new().await;
    let note = std::fs::read_to_string(&audited.checkpoint).expect("kept");
    std::fs::write(&audited.checkpoint, note.replacen("\n6\n", "\n5\n", 1)).expect("edited");
    let output = audited.verify_against();
    assert_eq!(output.status.code(), Some(2), "{}", both(&output));
    assert!(
        both(&output)
            .contains("is refused: the checkpoint is not signed by `ledger.example.com/acme`"),
        "{}",
        both(&output)
    );
}

#[tokio::test]
async fn prove_gives_inclusion_proofs_that_check_against_the_kept_checkpoint() {
    let audited = Audited::new().await;
    let operation = audited.streams[1]
        .trim_start_matches("operation-")
        .to_owned();
    let output = opledger(&["prove", "--db", path(&audited.db), &operation]);
    assert!(output.status.success(), "{}", both(&output));
    let proof: serde_json::Value = serde_json::from_str(&stdout(&output)).expect("JSON");
    let opened = checkpoint::open(
        proof["checkpoint"].as_str().expect("the checkpoint"),
        &audited.verifier_key,
    )
    .expect("signed");
    let events = proof["events"].as_array().expect("events");
    assert_eq!(events.len(), 2);
    let store = SqliteStore::open(&audited.db).await.expect("opens");
    let log = store
        .read_all(LogStart::Beginning, 10)
        .await
        .expect("reads");
    store.close().await.expect("closes");
    for event in events {
        let index = event["leaf_index"].as_u64().expect("an index");
        let hashes: Vec<merkle::Hash> = event["inclusion_proof"]
            .as_array()
            .expect("a proof")
            .iter()
            .map(|hash| merkle::parse_hash(hash.as_str().expect("text")).expect("a hash"))
            .collect();
        let leaf = merkle::leaf_hash(&log[index as usize].view());
        assert_eq!(event["leaf_hash"].as_str(), Some(leaf.to_string().as_str()));
        merkle::check_inclusion(&hashes, opened.head, index, leaf).expect("included");
    }
}

/// `opledger serve` on the ledger, with the signing key from the environment, on a free port;
/// killed when dropped.
struct Served {
    child: std::process::Child,
    url: String,
}

impl Served {
    fn start(db: &Path, key: &Path) -> Self {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_opledger"))
            .args(["serve", "--db", path(db), "--listen", "127.0.0.1:0"])
            .env_remove("OPLEDGER_DB")
            .env_remove("OPLEDGER_CONFIG")
            .env_remove("OPLEDGER_LOG_KEY")
            .env("OPLEDGER_LOG_KEY_FILE", key)
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(db.with_extension("serve.log")).expect("a log file"))
            .spawn()
            .expect("serve starts");
        let stdout = child.stdout.take().expect("piped");
        let mut lines = std::io::BufReader::new(stdout).lines();
        let url = loop {
            let Some(Ok(line)) = lines.next() else {
                panic!(
                    "serve stopped before listening: {}",
                    std::fs::read_to_string(db.with_extension("serve.log")).unwrap_or_default()
                );
            };
            if let Some(rest) = line.strip_prefix("opledger serve: listening on ") {
                break rest.split_whitespace().next().expect("a URL").to_owned();
            }
        };
        // The rest of its output is not read; keep the pipe drained so it never blocks.
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, url }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn witness(url: &str, state: &Path, verifier_key: &str) -> Output {
    opledger(&[
        "witness",
        "--url",
        url,
        "--state",
        path(state),
        "--verifier-key",
        verifier_key,
    ])
}

#[tokio::test]
async fn a_witness_follows_the_served_log_and_fails_when_it_is_rolled_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ledger.db");
    write_operations(&db, 2).await;
    let older = dir.path().join("older.db");
    std::fs::copy(&db, &older).expect("an older copy");
    write_operations(&db, 1).await;
    let (key, verifier_key) = generate_key(dir.path());
    let state = dir.path().join("witness.checkpoint");

    let served = Served::start(&db, &key);
    let first = witness(&served.url, &state, &verifier_key);
    assert!(first.status.success(), "{}", both(&first));
    assert!(
        stdout(&first).contains("at tree size 6")
            && stdout(&first).contains("kept as the first checkpoint"),
        "{}",
        both(&first)
    );
    // The served hash tile of the leaves is the leaves the log holds.
    let tile = reqwest::get(format!("{}/v1/log/tile/0/000.p/6", served.url))
        .await
        .expect("served")
        .bytes()
        .await
        .expect("read");
    let store = SqliteStore::open(&db)
        .await
        .expect("opens beside the server");
    let log = store
        .read_all(LogStart::Beginning, 10)
        .await
        .expect("reads");
    store.close().await.expect("closes");
    let leaves: Vec<u8> = log
        .iter()
        .flat_map(|event| merkle::leaf_hash(&event.view()).0)
        .collect();
    assert_eq!(tile.as_ref(), leaves.as_slice());
    drop(served);

    // The whole database rolled back to the older copy; the server (which holds the key) signs
    // the smaller tree without complaint, and the witness refuses it.
    std::fs::copy(&older, &db).expect("rolled back");
    let _ = std::fs::remove_file(db.with_extension("db-wal"));
    // As whoever restores a copy does: the read models of the newer log go too.
    std::fs::remove_file(db.with_extension("db.views")).expect("the read models");
    let served = Served::start(&db, &key);
    let second = witness(&served.url, &state, &verifier_key);
    assert_eq!(second.status.code(), Some(4), "{}", both(&second));
    assert!(
        both(&second)
            .contains("the log shrank: the served checkpoint has 4 leaves, the kept one 6"),
        "{}",
        both(&second)
    );
}

#[tokio::test]
async fn verify_against_a_checkpoint_a_named_witness_did_not_cosign_refuses_it() {
    use base64::Engine as _;
    use sha2::Digest as _;
    let audited = Audited::new().await;
    // A witness's tlog-cosignature/v1 verifier key: its name, the key id
    // SHA-256(name ‖ "\n" ‖ 0x04 ‖ public key)[:4], and base64(0x04 ‖ public key).
    let name = "witness.example.org";
    let mut public = vec![4_u8];
    public.extend_from_slice(ed25519_public_key_of_seed().as_slice());
    let id = sha2::Sha256::new()
        .chain_update(name.as_bytes())
        .chain_update(b"\n")
        .chain_update(&public)
        .finalize();
    let witness_key = format!(
        "{name}+{}+{}",
        hex_of(&id[..4]),
        base64::engine::general_purpose::STANDARD.encode(&public)
    );
    let output = opledger(&[
        "verify",
        "--db",
        path(&audited.db),
        "--against",
        path(&audited.checkpoint),
        "--verifier-key",
        &audited.verifier_key,
        "--witness-key",
        &witness_key,
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", both(&output));
    assert!(
        both(&output).contains("the witness's cosignature is missing"),
        "{}",
        both(&output)
    );
}

/// The Ed25519 public key of the RFC 8032 test vector 1 (any valid point serves).
fn ed25519_public_key_of_seed() -> Vec<u8> {
    (0..32)
        .map(|i| {
            u8::from_str_radix(
                &"d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
                    [2 * i..2 * i + 2],
                16,
            )
            .expect("hex")
        })
        .collect()
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[tokio::test]
async fn a_forged_tenant_tree_is_named_by_verify_and_a_checkpoint_signed_over_it_is_caught() {
    let audited = Audited::new().await;
    let note = std::fs::read_to_string(&audited.checkpoint).expect("kept");
    let kept = checkpoint::open(&note, &audited.verifier_key).expect("signed by the key");
    let tenants = kept.tenants.expect("the checkpoint signs the tenants' map");
    assert_eq!(tenants.size, 1, "one tenant, acme");

    // The tenant's stored tree replaced by another of the same shape.
    audited.sql(
        "UPDATE tenant_trees SET frontier = randomblob(length(frontier)) WHERE tenant = 'acme'",
    );
    assert_tampered(
        &audited.verify(),
        "the ledger's stored tree of tenant `acme` (6 leaves) is not the tree of the tenant's events in the log (6 leaves)",
    );

    // A checkpoint signed over the forged tree: held against the log, and refused by an export.
    let forged = audited.checkpoint.with_file_name("forged.checkpoint");
    let signed = opledger(&[
        "checkpoint",
        "--db",
        path(&audited.db),
        "--key-file",
        path(&audited.key),
        "--out",
        path(&forged),
    ]);
    assert!(signed.status.success(), "{}", both(&signed));
    let against = opledger(&[
        "verify",
        "--db",
        path(&audited.db),
        "--against",
        path(&forged),
        "--verifier-key",
        &audited.verifier_key,
    ]);
    assert_tampered(
        &against,
        "the checkpoint of 6 events signs a tenants' map of 1 tenants that the log's events do not make",
    );
    let export = opledger(&[
        "export",
        "--db",
        path(&audited.db),
        "--key-file",
        path(&audited.key),
        "--tenant",
        "acme",
        "--out",
        path(&audited.checkpoint.with_file_name("acme.ndjson")),
    ]);
    assert!(!export.status.success(), "{}", both(&export));
    assert!(
        both(&export)
            .contains("signs a tenants' map (1 tenants) that the log's events do not make"),
        "{}",
        both(&export)
    );
}
