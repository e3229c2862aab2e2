//! `opledger verify` against a ledger edited behind its back: a real SQLite file written by the
//! real ledger, then changed with plain SQL, then verified by the real binary.

use std::path::Path;
use std::process::{Command, Output};

use opledger_store::SqliteStore;

#[path = "approved_operations/mod.rs"]
mod approved_operations;

/// Three approved operations (six events) in a fresh ledger file.
async fn write_ledger(db: &Path) -> Vec<String> {
    let store = SqliteStore::open(db).await.expect("opens");
    let streams = approved_operations::record_approved(&store, 3).await;
    store.close().await.expect("closes");
    streams
}

fn verify(db: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["verify", "--db", db.to_str().expect("utf-8")])
        .env_remove("OPLEDGER_DB")
        .output()
        .expect("runs")
}

fn sql(db: &Path, statement: &str) {
    let connection = rusqlite::Connection::open(db).expect("opens the file directly");
    connection
        .execute_batch(statement)
        .expect("the tampering statement runs");
}

fn report(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn an_untouched_ledger_verifies_clean() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ledger.db");
    write_ledger(&db).await;
    let output = verify(&db);
    assert!(output.status.success(), "{}", report(&output));
    assert!(
        report(&output).contains("verified 6 events in 3 streams: no tampering found"),
        "{}",
        report(&output)
    );
}

#[tokio::test]
async fn an_edited_event_is_reported_by_stream_and_version() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ledger.db");
    let streams = write_ledger(&db).await;
    // The second operation's intent: change what it asked for.
    sql(
        &db,
        &format!(
            "UPDATE events SET data = CAST(replace(CAST(data AS TEXT), 'Call client 1', 'Call client X') AS BLOB) \
             WHERE stream = '{}' AND version = 0",
            streams[1]
        ),
    );
    let output = verify(&db);
    assert_eq!(output.status.code(), Some(4), "{}", report(&output));
    let text = report(&output);
    assert!(
        text.contains(&format!("EDITED    {} v0", streams[1])),
        "{text}"
    );
    assert!(text.contains("1 finding(s)"), "{text}");
}

#[tokio::test]
async fn an_event_whose_chain_hash_was_replaced_is_reported_as_edited() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ledger.db");
    let streams = write_ledger(&db).await;
    // Give the first stream's approval the chain hash of another stream's approval: its content
    // still matches its id, but it no longer links to the event before it.
    sql(
        &db,
        &format!(
            "UPDATE events SET metadata = (SELECT metadata FROM events WHERE stream = '{other}' AND version = 1) \
             WHERE stream = '{target}' AND version = 1",
            other = streams[2],
            target = streams[0]
        ),
    );
    let text = report(&verify(&db));
    assert!(
        text.contains(&format!("EDITED    {} v1", streams[0])),
        "{text}"
    );
}

#[tokio::test]
async fn a_removed_event_is_reported_as_a_gap_in_its_stream_and_in_the_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ledger.db");
    let streams = write_ledger(&db).await;
    // Remove the first stream's intent, leaving its approval at version 1 without version 0.
    sql(
        &db,
        &format!(
            "DELETE FROM events WHERE stream = '{}' AND version = 0",
            streams[0]
        ),
    );
    let output = verify(&db);
    assert_eq!(output.status.code(), Some(4));
    let text = report(&output);
    assert!(
        text.contains(&format!("REMOVED   {} v0", streams[0])),
        "{text}"
    );
    assert!(
        text.contains("positions 1..1 are missing from the log"),
        "{text}"
    );
}

#[tokio::test]
async fn reordered_events_are_reported_with_the_version_they_were_written_at() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ledger.db");
    let streams = write_ledger(&db).await;
    let stream = &streams[2];
    sql(
        &db,
        &format!(
            "UPDATE events SET version = 1000 WHERE stream = '{stream}' AND version = 0;
             UPDATE events SET version = 0 WHERE stream = '{stream}' AND version = 1;
             UPDATE events SET version = 1 WHERE stream = '{stream}' AND version = 1000;"
        ),
    );
    let text = report(&verify(&db));
    assert!(text.contains(&format!("REORDERED {stream} v1 @")), "{text}");
    assert!(
        text.contains("this event was written as version 0"),
        "{text}"
    );
    assert!(
        text.contains("this event was written as version 1"),
        "{text}"
    );
}
