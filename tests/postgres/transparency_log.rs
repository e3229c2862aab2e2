//! The transparency log on PostgreSQL, against a ledger tampered with behind its back: real
//! operations written through the real store, `opledger serve` on the database signing a
//! checkpoint with a key `opledger keys generate` made, an auditor keeping that checkpoint and a
//! witness its state; then the database changed with plain SQL (or restored from an older
//! pg_dump), and `opledger verify --store … --against` the kept checkpoint run as a process: each
//! case is caught and the first divergence named.
//!
//! An attacker who also covers the tracks — removes the tree's rows and the kept checkpoints so
//! the service builds its tree again from the changed log and signs it — is caught by the witness,
//! which holds the service to the checkpoint it kept.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use opledger_domain::chain;
use opledger_domain::checkpoint;
use opledger_domain::ids::{EventId, StreamVersion};
use opledger_domain::merkle::{self, TreeHead};
use opledger_domain::store::{EventStore, StreamName};

use crate::postgres_server::server;
use crate::{connect, within};

/// Records `operations` approved operations (two events each: positions 2n−1 and 2n).
async fn write_operations(url: &str, operations: usize) -> Vec<String> {
    let store = connect(url).await;
    let streams = crate::approved_operations::record_approved(&store, operations).await;
    store.close().await.expect("closes");
    streams
}

fn opledger(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(args)
        .env_remove("OPLEDGER_DB")
        .env_remove("OPLEDGER_CONFIG")
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

#[track_caller]
fn assert_caught(output: &Output, expected: &str) {
    assert_eq!(output.status.code(), Some(4), "{}", both(output));
    assert!(
        both(output).contains(expected),
        "expected `{expected}` in:\n{}",
        both(output)
    );
}

/// `opledger serve` on the database, signing with the key from the environment, on a free port,
/// with read models of its own (a copy restored elsewhere has none), a checkpoint signed for
/// every event, and its workers leaving the recorded operations alone (so the log is only what
/// the test wrote), its store given as a `[store]` table with a small pool; killed when dropped.
struct Served {
    child: std::process::Child,
    url: String,
}

impl Served {
    fn start(dir: &Path, store_url: &str, key: &Path, run: usize) -> Self {
        use std::io::BufRead;
        let config = dir.join(format!("serve-{run}.toml"));
        let read_models = dir.join(format!("read-models-{run}.db"));
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\nread_models = \"{}\"\n\n[store]\nurl = \"{store_url}\"\npool_size = 2\n\n[log]\ncheckpoint_every_events = 1\n\n[engine]\nworker_send_delay_ms = 600000\n",
                read_models.display()
            ),
        )
        .expect("the configuration is written");
        let log = dir.join(format!("serve-{run}.log"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_opledger"))
            .args(["serve", "--config", path(&config)])
            .env_remove("OPLEDGER_DB")
            .env_remove("OPLEDGER_CONFIG")
            .env_remove("OPLEDGER_LOG_KEY")
            .env("OPLEDGER_LOG_KEY_FILE", key)
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("a log file"))
            .spawn()
            .expect("serve starts");
        let stdout = child.stdout.take().expect("piped");
        let mut lines = std::io::BufReader::new(stdout).lines();
        let url = loop {
            let Some(Ok(line)) = lines.next() else {
                panic!(
                    "serve stopped before listening: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            };
            if let Some(rest) = line.strip_prefix("opledger serve: listening on ") {
                break rest.split_whitespace().next().expect("a URL").to_owned();
            }
        };
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, url }
    }

    async fn get(&self, route: &str) -> String {
        let answer = reqwest::get(format!("{}{route}", self.url))
            .await
            .expect("served");
        assert!(answer.status().is_success(), "{route}: {}", answer.status());
        answer.text().await.expect("read")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A PostgreSQL ledger of `operations` operations, its signing key, the checkpoint the service
/// signed over it kept in a file outside the database, and a witness that accepted it.
struct Audited {
    dir: tempfile::TempDir,
    database: String,
    url: String,
    key: PathBuf,
    verifier_key: String,
    checkpoint: PathBuf,
    witness_state: PathBuf,
    streams: Vec<String>,
    serves: std::cell::Cell<usize>,
}

impl Audited {
    async fn new(operations: usize) -> Self {
        let database = server().database();
        let url = server().url(&database);
        let streams = write_operations(&url, operations).await;
        Self::keeping_a_checkpoint(database, url, streams).await
    }

    async fn keeping_a_checkpoint(database: String, url: String, streams: Vec<String>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let key = dir.path().join("log.key");
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
        let audited = Self {
            checkpoint: dir.path().join("kept.checkpoint"),
            witness_state: dir.path().join("witness.checkpoint"),
            dir,
            database,
            url,
            key,
            verifier_key,
            streams,
            serves: std::cell::Cell::new(0),
        };
        let served = audited.serve();
        let note = served.get("/v1/log/checkpoint").await;
        std::fs::write(&audited.checkpoint, &note).expect("kept outside the ledger");
        let first = audited.witness(&served);
        assert!(first.status.success(), "{}", both(&first));
        audited
    }

    fn serve(&self) -> Served {
        let run = self.serves.get();
        self.serves.set(run + 1);
        Served::start(self.dir.path(), &self.url, &self.key, run)
    }

    fn sql(&self, statement: &str) {
        server().sql(&self.database, statement);
    }

    fn verify(&self) -> Output {
        opledger(&["verify", "--store", &self.url])
    }

    fn verify_against(&self) -> Output {
        opledger(&[
            "verify",
            "--store",
            &self.url,
            "--against",
            path(&self.checkpoint),
            "--verifier-key",
            &self.verifier_key,
        ])
    }

    fn witness(&self, served: &Served) -> Output {
        opledger(&[
            "witness",
            "--url",
            &served.url,
            "--state",
            path(&self.witness_state),
            "--verifier-key",
            &self.verifier_key,
        ])
    }

    /// What an attacker with the database does so that `verify` on its own finds nothing: the
    /// tree's rows and the kept checkpoints removed, so the service builds the tree again from
    /// the log as it now is and signs that. The witness, run as from cron, is then what fails.
    fn covered_up_and_witnessed(&self) -> Output {
        self.sql(
            "DELETE FROM opledger.log_tree; DELETE FROM opledger.log_checkpoints; \
             UPDATE opledger.log_head SET tree_size = 0, tree_frontier = '\\x'",
        );
        let served = self.serve();
        self.witness(&served)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_checkpoint_of_an_untouched_postgres_ledger_verifies_and_its_proofs_check() {
    let audited = Audited::new(3).await;
    let note = std::fs::read_to_string(&audited.checkpoint).expect("kept");
    let opened = checkpoint::open(&note, &audited.verifier_key).expect("signed by the key");
    assert_eq!(opened.head.size, 6);
    let output = audited.verify_against();
    assert!(output.status.success(), "{}", both(&output));
    assert!(
        stdout(&output).contains("no tampering found"),
        "{}",
        both(&output)
    );

    // The service on PostgreSQL proves an event's inclusion from its stored tree, and the proof
    // checks against the kept checkpoint with the leaf computed from the event as stored.
    let served = audited.serve();
    let answer = served
        .get("/v1/log/proof/inclusion?position=3&size=6")
        .await;
    let answer: serde_json::Value = serde_json::from_str(&answer).expect("JSON");
    let proof: Vec<merkle::Hash> = answer["inclusion_proof"]
        .as_array()
        .expect("a proof")
        .iter()
        .map(|hash| merkle::parse_hash(hash.as_str().expect("text")).expect("a hash"))
        .collect();
    let store = connect(&audited.url).await;
    let event = store
        .read_all(
            opledger_domain::store::LogStart::After(opledger_domain::ids::GlobalPosition::new(2)),
            1,
        )
        .await
        .expect("reads")
        .remove(0);
    store.close().await.expect("closes");
    let head = TreeHead {
        size: opened.head.size,
        root: opened.head.root,
    };
    merkle::check_inclusion(&proof, head, 2, merkle::leaf_hash(&event.view()))
        .expect("the event at position 3 is leaf 2 of the kept checkpoint");
    // More operations later, signed as they come: the witness finds that the served tree
    // extends the kept one.
    write_operations(&audited.url, 1).await;
    within("a checkpoint of the grown log", async {
        loop {
            let note = served.get("/v1/log/checkpoint").await;
            let opened = checkpoint::open(&note, &audited.verifier_key).expect("signed");
            if opened.head.size == 8 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    let later = audited.witness(&served);
    assert!(later.status.success(), "{}", both(&later));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_newest_events_is_named_a_removed_tail_and_the_witness_fails() {
    let audited = Audited::new(3).await;
    // The head row moved back too, so that the service starts on what is left.
    audited.sql(
        "DELETE FROM opledger.events WHERE position > 4; \
         UPDATE opledger.log_head SET last_position = 4",
    );
    assert_caught(&audited.verify(), "positions 5..6 were removed");
    assert_caught(
        &audited.verify_against(),
        "first divergence from the checkpoint of 6 events, a removed tail: the log holds only 4 of them",
    );
    assert_caught(
        &audited.covered_up_and_witnessed(),
        "the log shrank: the served checkpoint has 4 leaves, the kept one 6",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_event_in_the_middle_is_named_at_its_position_and_the_witness_fails() {
    let audited = Audited::new(3).await;
    // The second operation's approval, its last event: what is left still folds.
    audited.sql("DELETE FROM opledger.events WHERE position = 4");
    assert_caught(
        &audited.verify_against(),
        "a removed event: position 4, which the checkpoint covers, is missing from the log",
    );
    // The tree built again stops at the gap.
    assert_caught(
        &audited.covered_up_and_witnessed(),
        "the log shrank: the served checkpoint has 3 leaves, the kept one 6",
    );
}

/// What an attacker with the database can recompute for a stream's first event (`intent`) whose
/// data it rewrote to `data`: the event id (same time, same scheme) and the chain link.
fn forged_identity(
    intent: &opledger_domain::store::RecordedEvent,
    data: &str,
) -> (EventId, String) {
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
    let link = chain::link(None, intent.version, &intent.event_type, data.as_bytes());
    (id, link.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_rewritten_with_its_link_and_id_recomputed_is_named_and_the_witness_fails() {
    let audited = Audited::new(3).await;
    let stream = &audited.streams[1];
    let store = connect(&audited.url).await;
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
    // Everything an attacker with the database can recompute: the id (same time, same scheme)
    // and the chain link (the intent is the stream's first event).
    let (id, link) = forged_identity(intent, &data);
    audited.sql(&format!(
        "UPDATE opledger.events SET data = convert_to('{}', 'UTF8'), event_id = '{}', \
         metadata = convert_to('{{\"schema_version\":1,\"chain\":\"{link}\"}}', 'UTF8') \
         WHERE position = {}",
        data.replace('\'', "''"),
        id.as_uuid(),
        intent.position,
    ));
    let output = audited.verify();
    assert_caught(
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
    assert_caught(
        &audited.verify_against(),
        &format!(
            "DIVERGED  {stream} v0 @{}: first divergence from the checkpoint of 6 events, a rewritten event",
            intent.position
        ),
    );
    assert_caught(
        &audited.covered_up_and_witnessed(),
        "two different roots for tree size 6: the history was rewritten",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_events_swapped_in_the_log_are_named_a_reordering_and_the_witness_fails() {
    let audited = Audited::new(3).await;
    audited.sql(
        "UPDATE opledger.events SET position = 1000 WHERE position = 2;
         UPDATE opledger.events SET position = 2 WHERE position = 3;
         UPDATE opledger.events SET position = 3 WHERE position = 1000;",
    );
    assert_caught(
        &audited.verify(),
        &format!(
            "REORDERED {} v1 @3: the log's tree recorded this event at position 2",
            audited.streams[0]
        ),
    );
    assert_caught(
        &audited.verify_against(),
        "@2: first divergence from the checkpoint of 6 events, a reordering",
    );
    assert_caught(
        &audited.covered_up_and_witnessed(),
        "two different roots for tree size 6: the history was rewritten",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_inserted_in_the_middle_is_named_at_its_position_and_the_witness_fails() {
    let audited = Audited::new(3).await;
    // A copy of the first operation's approval slipped in at position 3 as its version 2, the
    // later events moved one place on, the head moved to match.
    audited.sql(&format!(
        "UPDATE opledger.events SET position = position + 1000 WHERE position > 2;
         UPDATE opledger.events SET position = position - 999 WHERE position > 1000;
         INSERT INTO opledger.events \
             (position, stream_id, version, stream, event_id, event_type, data, metadata) \
         SELECT 3, stream_id, 2, stream, md5(random()::text)::uuid, event_type, data, metadata \
         FROM opledger.events WHERE position = 2;
         UPDATE opledger.streams SET last_version = 2 WHERE name = '{}';
         UPDATE opledger.log_head SET last_position = 7;",
        audited.streams[0]
    ));
    assert_caught(
        &audited.verify_against(),
        "@3: first divergence from the checkpoint of 6 events",
    );
    assert_caught(
        &audited.covered_up_and_witnessed(),
        "the served tree of 7 leaves does not extend the kept one of 6",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restored_from_an_older_dump_verifies_on_its_own_but_not_against_the_checkpoint()
{
    let database = server().database();
    let url = server().url(&database);
    let mut streams = write_operations(&url, 2).await;
    let older = server().dump(&database);
    streams.extend(write_operations(&url, 2).await);
    let audited = Audited::keeping_a_checkpoint(database, url, streams).await;

    server().restore(&audited.database, &older);
    let alone = audited.verify();
    assert!(
        alone.status.success(),
        "a consistent older copy: {}",
        both(&alone)
    );
    assert_caught(
        &audited.verify_against(),
        "first divergence from the checkpoint of 8 events, a removed tail: the log holds only 4 of them",
    );
    // The older copy holds no checkpoint of the newer log: the service signs the tree it has.
    let served = audited.serve();
    assert_caught(
        &audited.witness(&served),
        "the log shrank: the served checkpoint has 4 leaves, the kept one 8",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_are_refused_while_the_tree_is_behind_its_log_saying_to_run_verify() {
    use opledger_domain::store::{ExpectedVersion, StoreError};
    let database = server().database();
    let store = connect(&server().url(&database)).await;
    store
        .append(
            &crate::stream("first"),
            ExpectedVersion::NoStream,
            vec![crate::event(1)],
        )
        .await
        .expect("appended");
    // An event added behind the ledger's back, the head moved to match: the tree never saw it.
    server().sql(
        &database,
        "INSERT INTO opledger.events \
             (position, stream_id, version, stream, event_id, event_type, data, metadata) \
         SELECT 2, stream_id, 1, stream, md5(random()::text)::uuid, event_type, data, metadata \
         FROM opledger.events WHERE position = 1;
         UPDATE opledger.streams SET last_version = 1;
         UPDATE opledger.log_head SET last_position = 2;",
    );
    let refused = store
        .append(
            &crate::stream("second"),
            ExpectedVersion::NoStream,
            vec![crate::event(2)],
        )
        .await
        .expect_err("the tree is not grown over an event it did not see appended");
    assert!(
        matches!(refused, StoreError::Corrupt { .. })
            && refused.to_string().contains("the log's tree has 1 leaves")
            && refused.to_string().contains("run `opledger verify`"),
        "{refused}"
    );
    assert_eq!(
        server().sql(&database, "SELECT count(*) FROM opledger.events"),
        "2",
        "nothing was written"
    );
    store.close().await.expect("closes");
}

// ----- the tenants' trees on PostgreSQL --------------------------------------------------------

/// Four approved operations of tenants acme and globex in turn: acme at positions 1, 2, 5, 6,
/// globex at 3, 4, 7, 8.
async fn two_tenants() -> Audited {
    let database = server().database();
    let url = server().url(&database);
    let store = connect(&url).await;
    let streams =
        crate::approved_operations::record_approved_of(&store, &["acme", "globex"], 4).await;
    store.close().await.expect("closes");
    Audited::keeping_a_checkpoint(database, url, streams).await
}

/// The offline verifier (`clients/verify-export`) on `file`, with the log's verifier key.
fn verify_export(file: &Path, verifier_key: &str) -> Output {
    Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/verify-export/verify_export.py"))
        .arg(file)
        .args(["--verifier-key", verifier_key])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 runs (install python3)")
}

/// The export's lines rewritten without the event lines (and context lines) `drop` picks, its
/// closing line made to match, as someone covering their tracks would.
fn without(export: &Path, drop: impl Fn(&serde_json::Value) -> bool) -> PathBuf {
    let text = std::fs::read_to_string(export).expect("the export");
    let mut lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON"))
        .collect();
    lines.retain(|line| line.get("end").is_some() || line.get("position").is_none() || !drop(line));
    let positions: Vec<u64> = lines
        .iter()
        .filter(|line| line.get("position").is_some() && line.get("context").is_none())
        .map(|line| line["position"].as_u64().expect("a position"))
        .collect();
    let end = lines.last_mut().expect("a closing line");
    end["end"]["events"] = positions.len().into();
    end["end"]["first_position"] = positions.first().copied().into();
    end["end"]["last_position"] = positions.last().copied().into();
    let cut = export.with_extension("cut.ndjson");
    let text: Vec<String> = lines.iter().map(ToString::to_string).collect();
    std::fs::write(&cut, text.join("\n") + "\n").expect("written");
    cut
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_checkpoint_signs_every_tenants_tree_and_a_tenant_export_from_postgres_proves_itself_complete(
) {
    let audited = two_tenants().await;
    let note = std::fs::read_to_string(&audited.checkpoint).expect("kept");
    let opened = checkpoint::open(&note, &audited.verifier_key).expect("signed by the key");
    assert_eq!(opened.head.size, 8);
    let tenants = opened
        .tenants
        .expect("the checkpoint signs the tenants' map");
    assert_eq!(tenants.size, 2, "acme and globex");
    // The trees the database keeps are the ones the log's events make.
    let verified = audited.verify_against();
    assert!(verified.status.success(), "{}", both(&verified));

    // A tenant's export, cut at the checkpoint the service kept, proves none of its events left
    // out, by a verifier that is not opledger.
    let out = audited.dir.path().join("acme.ndjson");
    let exported = opledger(&[
        "export",
        "--store",
        &audited.url,
        "--tenant",
        "acme",
        "--out",
        path(&out),
    ]);
    assert!(exported.status.success(), "{}", both(&exported));
    let checked = verify_export(&out, &audited.verifier_key);
    assert!(checked.status.success(), "{}", both(&checked));
    assert!(
        stdout(&checked).contains("against the checkpoint of 8 events")
            && stdout(&checked).contains("(none left out)"),
        "{}",
        both(&checked)
    );

    // A slice of it proves none of acme's events between its ends left out.
    let slice = audited.dir.path().join("acme-slice.ndjson");
    let exported = opledger(&[
        "export",
        "--store",
        &audited.url,
        "--tenant",
        "acme",
        "--from",
        "2",
        "--to",
        "5",
        "--out",
        path(&slice),
    ]);
    assert!(exported.status.success(), "{}", both(&exported));
    let checked = verify_export(&slice, &audited.verifier_key);
    assert!(
        checked.status.success()
            && stdout(&checked).contains("none of the tenant's events between them left out"),
        "{}",
        both(&checked)
    );

    // Its newest event cut off, or an operation dropped whole, the closing line made to match:
    // each event left still proves its inclusion, but the tenant's tree is not the signed one.
    let cut = without(&out, |line| line["position"] == 6);
    let dropped = without(&out, |line| line["stream"] == audited.streams[2].as_str());
    for tampered in [cut, dropped] {
        let checked = verify_export(&tampered, &audited.verifier_key);
        assert_eq!(checked.status.code(), Some(1), "{}", both(&checked));
        assert!(
            stdout(&checked).contains("INCOMPLETE")
                && stdout(&checked)
                    .contains("do not make the tree the checkpoint signs for tenant 'acme'"),
            "{}",
            both(&checked)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_tenants_newest_event_is_caught_against_the_kept_checkpoint_and_its_export_refused(
) {
    let audited = two_tenants().await;
    // Acme's newest event, in the middle of the log: globex's last operation follows it.
    audited.sql("DELETE FROM opledger.events WHERE position = 6");
    assert_caught(
        &audited.verify_against(),
        "a removed event: position 6, which the checkpoint covers, is missing from the log",
    );
    let out = audited.dir.path().join("acme.ndjson");
    let refused = opledger(&[
        "export",
        "--store",
        &audited.url,
        "--tenant",
        "acme",
        "--out",
        path(&out),
    ]);
    assert!(!refused.status.success(), "{}", both(&refused));
    assert!(!out.exists(), "no export is written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_rewritten_into_another_tenants_history_is_named_and_caught_against_the_kept_checkpoint(
) {
    let audited = two_tenants().await;
    // Globex's first intent (position 3) rewritten to name acme, its id and link recomputed, as
    // someone with the database would do to move an operation from one tenant's history to
    // another's.
    let stream = &audited.streams[1];
    let store = connect(&audited.url).await;
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
        .replace("\"tenant\":\"globex\"", "\"tenant\":\"acme\"");
    assert_ne!(
        data.as_bytes(),
        intent.data.as_slice(),
        "the tenant is named in the intent"
    );
    let (id, link) = forged_identity(intent, &data);
    audited.sql(&format!(
        "UPDATE opledger.events SET data = convert_to('{}', 'UTF8'), event_id = '{}', \
         metadata = convert_to('{{\"schema_version\":1,\"chain\":\"{link}\"}}', 'UTF8') \
         WHERE position = 3; UPDATE opledger.streams SET tenant = 'acme' WHERE name = '{stream}'",
        data.replace('\'', "''"),
        id.as_uuid(),
    ));
    let alone = audited.verify();
    assert_caught(
        &alone,
        &format!("EDITED    {stream} v0 @3: its bytes are not the ones the log's tree recorded"),
    );
    // Both tenants' stored trees are named: the log now gives the operation to acme.
    for named in [
        "the ledger's stored tree of tenant `acme` (4 leaves) is not the tree of the tenant's events in the log (6 leaves)",
        "the ledger's stored tree of tenant `globex` (4 leaves) is not the tree of the tenant's events in the log (2 leaves)",
    ] {
        assert_caught(&alone, named);
    }
    let against = audited.verify_against();
    assert_caught(
        &against,
        &format!(
            "DIVERGED  {stream} v0 @3: first divergence from the checkpoint of 8 events, a rewritten event"
        ),
    );
    assert_caught(
        &against,
        "the checkpoint of 8 events signs a tenants' map of 2 tenants that the log's events do not make",
    );
}
