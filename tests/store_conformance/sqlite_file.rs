//! What only a store on disk can promise, checked on real SQLite files: the data survives a
//! restart, a file the store refuses is left as it was, and every append acknowledged before a
//! SIGKILL is there afterwards, whole.
//!
//! The SIGKILL check runs a real child process: this test binary re-executes itself to run the
//! ignored test [`sigkill_child_appends_until_killed`], which appends until it is killed.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use opledger_domain::ids::{EventId, GlobalPosition, StreamVersion};
use opledger_domain::store::{
    EventData, EventStore, ExpectedVersion, StoreError, StreamName, Subscription,
};
use opledger_store::SqliteStore;
use tempfile::TempDir;
use uuid::Uuid;

use crate::support::*;

/// The file a fresh store gets in `dir`.
fn db_path(dir: &TempDir) -> PathBuf {
    dir.path().join("events.db")
}

/// The WAL file SQLite keeps beside `db`.
fn wal_path(db: &Path) -> PathBuf {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_close_and_reopen() {
    let dir = TempDir::new().expect("temp dir");
    let path = db_path(&dir);
    let store = SqliteStore::open(&path).await.expect("open");
    let mut last = BTreeMap::new();
    for (n, name) in ["a", "b", "a", "c", "a", "b"].into_iter().enumerate() {
        let name = stream(name);
        let expected = ExpectedVersion::from_last(last.get(&name).copied());
        let outcome = store
            .append(&name, expected, events(n as u128 * 10, n % 3 + 1))
            .await
            .expect("append");
        last.insert(name, outcome.next_expected);
    }
    let before = read_whole_log(&store).await;
    let head = store.head_position().await.expect("head");
    store.close().await.expect("close");

    let reopened = SqliteStore::open(&path).await.expect("reopen");
    assert_eq!(
        read_whole_log(&reopened).await,
        before,
        "positions, versions and payloads are identical"
    );
    assert_eq!(reopened.head_position().await.expect("head"), head);
    let a = stream("a");
    let refused = reopened
        .append(&a, ExpectedVersion::NoStream, vec![event(999)])
        .await;
    assert!(
        matches!(
            refused,
            Err(StoreError::VersionConflict {
                actual: Some(_),
                ..
            })
        ),
        "{refused:?}"
    );
    let next = reopened
        .append(&a, ExpectedVersion::Exact(last[&a]), vec![event(1000)])
        .await
        .expect("append after reopening");
    assert_eq!(next.next_expected, last[&a].next());
    assert!(
        Some(next.position) > head,
        "positions go on after the last stored one"
    );
    reopened.close().await.expect("close");
}

#[tokio::test]
async fn a_file_with_a_newer_schema_version_is_refused_and_left_unmodified() {
    let dir = TempDir::new().expect("temp dir");
    let path = db_path(&dir);
    let store = SqliteStore::open(&path).await.expect("open");
    store
        .append(&stream("s"), ExpectedVersion::NoStream, vec![event(1)])
        .await
        .expect("append");
    store.close().await.expect("close");
    assert!(
        !wal_path(&path).exists(),
        "closing checkpointed everything into the main file"
    );

    // The SQLite file format keeps `PRAGMA user_version` at offset 60 of the header, as a
    // big-endian 32-bit integer; writing it there is what a newer opledger's migration would do.
    let mut bytes = std::fs::read(&path).expect("read the file");
    bytes[60..64].copy_from_slice(&99_i32.to_be_bytes());
    std::fs::write(&path, &bytes).expect("write the file");

    let refused = SqliteStore::open(&path)
        .await
        .expect_err("a newer schema is refused");
    assert_eq!(
        refused,
        StoreError::IncompatibleSchema {
            found: 99,
            supported: 1
        }
    );
    assert_eq!(
        std::fs::read(&path).expect("read the file"),
        bytes,
        "the file is left unmodified"
    );
}

#[tokio::test]
async fn a_file_that_is_not_a_database_gives_an_error_not_a_panic() {
    let dir = TempDir::new().expect("temp dir");
    let path = db_path(&dir);
    let garbage: Vec<u8> = b"this is not an SQLite database\n"
        .iter()
        .copied()
        .cycle()
        .take(8192)
        .collect();
    std::fs::write(&path, &garbage).expect("write the file");

    let refused = SqliteStore::open(&path)
        .await
        .expect_err("garbage is refused");
    assert!(
        matches!(&refused, StoreError::Corrupt { reason } if reason.contains("not a database")),
        "unexpected error: {refused:?}"
    );
    assert_eq!(
        std::fs::read(&path).expect("read the file"),
        garbage,
        "the file is left unmodified"
    );
}

#[tokio::test]
async fn a_file_in_a_missing_directory_gives_unavailable() {
    let dir = TempDir::new().expect("temp dir");
    let refused = SqliteStore::open(dir.path().join("missing").join("events.db"))
        .await
        .expect_err("no directory");
    assert!(
        matches!(refused, StoreError::Unavailable { .. }),
        "unexpected error: {refused:?}"
    );
}

/// The environment variable that carries the database path to the SIGKILL child; without it
/// the child's entry test does nothing.
const CHILD_DB_ENV: &str = "OPLEDGER_TEST_SIGKILL_CHILD_DB";
/// The child's entry test, as libtest names it.
const CHILD_TEST: &str = "sqlite_file::sigkill_child_appends_until_killed";
/// Concurrent appending tasks in the child, so group commit batches several appends.
const CHILD_WRITERS: u128 = 8;
/// Appends per stream before a child writer starts a new stream.
const CHILD_APPENDS_PER_STREAM: u64 = 20;
/// Acknowledgements the parent waits for before killing the child.
const ACKS_BEFORE_KILL: usize = 300;
/// How long the parent waits for them before failing.
const ACK_DEADLINE: Duration = Duration::from_secs(60);

/// One acknowledged append, as the child reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ack {
    stream: String,
    version: u64,
    position: u64,
}

fn parse_ack(line: &str) -> Option<Ack> {
    // libtest may print its own text before the first line the child writes, so look for the
    // marker anywhere in the line.
    let ack = &line[line.find("acked ")? + "acked ".len()..];
    let mut fields = ack.split_whitespace();
    let ack = Ack {
        stream: fields.next()?.to_owned(),
        version: fields.next()?.parse().ok()?,
        position: fields.next()?.parse().ok()?,
    };
    fields.next().is_none().then_some(ack)
}

/// The id of the child's event at `version` of `writer`'s stream number `generation`.
fn child_event_id(writer: u128, generation: u128, version: u64) -> EventId {
    EventId::from_uuid(Uuid::from_u128(
        (writer << 96) | (generation << 64) | u128::from(version),
    ))
}

/// Kills the child when the parent test ends, however it ends.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "entry point of the SIGKILL child; run by sqlite_file::acknowledged_appends_survive_a_sigkill_of_the_writing_process"]
async fn sigkill_child_appends_until_killed() {
    let Some(path) = std::env::var_os(CHILD_DB_ENV) else {
        return;
    };
    let store = SqliteStore::open(PathBuf::from(path))
        .await
        .expect("the child opens the store");
    let writers: Vec<_> = (0..CHILD_WRITERS)
        .map(|writer| tokio::spawn(append_until_killed(store.clone(), writer)))
        .collect();
    for writer in writers {
        writer.await.expect("a child writer failed");
    }
}

async fn append_until_killed(store: SqliteStore, writer: u128) {
    for generation in 0.. {
        let name = stream(&format!("child-{writer}-{generation}"));
        let mut expected = ExpectedVersion::NoStream;
        for append in 0..CHILD_APPENDS_PER_STREAM {
            let first = expected.first_new_version().value();
            let count = append % 3 + 1;
            let events = (first..first + count)
                .map(|version| EventData {
                    event_id: child_event_id(writer, generation, version),
                    event_type: "ChildAppended".into(),
                    data: serde_json::json!({
                        "stream": name.as_str(),
                        "version": version,
                        "append_first": first,
                        "append_count": count,
                        "padding": "x".repeat(256),
                    })
                    .to_string()
                    .into_bytes(),
                    metadata: br#"{"schema":1}"#.to_vec(),
                })
                .collect();
            let outcome = store
                .append(&name, expected, events)
                .await
                .expect("a child append");
            let mut stdout = std::io::stdout().lock();
            writeln!(
                stdout,
                "acked {name} {} {}",
                outcome.next_expected, outcome.position
            )
            .expect("write an ack");
            stdout.flush().expect("flush an ack");
            expected = ExpectedVersion::Exact(outcome.next_expected);
        }
    }
}

#[test]
fn acknowledged_appends_survive_a_sigkill_of_the_writing_process() {
    let dir = TempDir::new().expect("temp dir");
    let path = db_path(&dir);
    let stderr_path = dir.path().join("child.stderr");
    let child_stderr = || std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let mut child = ChildGuard(
        Command::new(std::env::current_exe().expect("the test binary's path"))
            .args(["--ignored", "--exact", CHILD_TEST, "--nocapture"])
            .env(CHILD_DB_ENV, &path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr_path).expect("create the child's stderr file"))
            .spawn()
            .expect("start the child"),
    );

    // A thread reads the child's stdout, so the wait below can have a deadline.
    let stdout = child.0.stdout.take().expect("the child's stdout is piped");
    let (lines, received) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + ACK_DEADLINE;
    let mut acks = Vec::new();
    while acks.len() < ACKS_BEFORE_KILL {
        match received.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => acks.extend(parse_ack(&line)),
            Err(RecvTimeoutError::Timeout) => panic!(
                "the child acknowledged only {} appends within {ACK_DEADLINE:?}; its stderr:\n{}",
                acks.len(),
                child_stderr()
            ),
            Err(RecvTimeoutError::Disconnected) => {
                panic!(
                    "the child stopped after {} acknowledgements; its stderr:\n{}",
                    acks.len(),
                    child_stderr()
                )
            }
        }
    }

    // `Child::kill` sends SIGKILL on Unix: no destructor, no flush, no close runs in the child.
    child.0.kill().expect("SIGKILL the child");
    child.0.wait().expect("reap the child");
    reader.join().expect("the stdout reader");
    acks.extend(received.try_iter().filter_map(|line| parse_ack(&line)));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(check_after_sigkill(&path, &acks));
}

async fn check_after_sigkill(path: &Path, acks: &[Ack]) {
    let store = SqliteStore::open(path)
        .await
        .expect("reopen after the SIGKILL");
    let log = read_whole_log(&store).await;
    assert_strictly_increasing(&log);

    // Nothing is torn: every stream's versions are contiguous from 0, every payload parses and
    // names its own place, and every append the payload names is there whole.
    let mut streams: BTreeMap<&StreamName, Vec<StreamVersion>> = BTreeMap::new();
    for event in &log {
        streams
            .entry(&event.stream)
            .or_default()
            .push(event.version);
        let payload: serde_json::Value =
            serde_json::from_slice(&event.data).unwrap_or_else(|error| {
                panic!(
                    "the payload at position {} does not parse: {error}",
                    event.position
                )
            });
        assert_eq!(
            payload["stream"],
            event.stream.as_str(),
            "payload at position {}",
            event.position
        );
        assert_eq!(
            payload["version"],
            event.version.value(),
            "payload at position {}",
            event.position
        );
        assert_eq!(
            event.metadata, br#"{"schema":1}"#,
            "metadata at position {}",
            event.position
        );
    }
    let last_version = |name: &StreamName| streams[name].last().map(|version| version.value());
    for (name, versions) in &streams {
        let contiguous: Vec<StreamVersion> =
            (0..versions.len() as u64).map(StreamVersion::new).collect();
        assert_eq!(
            versions, &contiguous,
            "the versions of {name} are contiguous from 0"
        );
    }
    for event in &log {
        let payload: serde_json::Value =
            serde_json::from_slice(&event.data).expect("checked above");
        let first = payload["append_first"].as_u64().expect("append_first");
        let count = payload["append_count"].as_u64().expect("append_count");
        assert!(
            last_version(&event.stream) >= Some(first + count - 1),
            "the append of {} versions {first}..{} is whole",
            event.stream,
            first + count
        );
    }

    // Every acknowledged append is there, where the child was told it landed.
    let stored: BTreeMap<(&str, u64), GlobalPosition> = log
        .iter()
        .map(|event| {
            (
                (event.stream.as_str(), event.version.value()),
                event.position,
            )
        })
        .collect();
    for ack in acks {
        assert_eq!(
            stored.get(&(ack.stream.as_str(), ack.version)),
            Some(&GlobalPosition::new(ack.position)),
            "acknowledged append {ack:?} is stored"
        );
    }
    assert!(acks.len() >= ACKS_BEFORE_KILL);
    store.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_sees_commits_made_by_another_store_on_the_same_file() {
    let dir = TempDir::new().expect("temp dir");
    let path = db_path(&dir);
    let follower = SqliteStore::open(&path)
        .await
        .expect("open the following store");
    let mut subscription = follower
        .subscribe_all(opledger_domain::store::LogStart::Beginning)
        .await
        .expect("subscribe");
    // Another opener of the file, as another process would be: its commits do not notify the
    // follower's subscription, which must still find them.
    let writer = SqliteStore::open(&path)
        .await
        .expect("open the writing store");
    let outcome = writer
        .append(
            &stream("elsewhere"),
            ExpectedVersion::NoStream,
            events(500, 2),
        )
        .await
        .expect("append");
    let mut seen = Vec::new();
    for _ in 0..2 {
        let event = tokio::time::timeout(Duration::from_secs(10), subscription.next())
            .await
            .expect("the subscription found the other store's commit in time")
            .expect("next event");
        seen.push(event.position);
    }
    assert_eq!(seen.last().copied(), Some(outcome.position));
    writer.close().await.expect("close the writer");
    follower.close().await.expect("close the follower");
}
