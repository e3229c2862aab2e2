//! `opledger export` and the offline verifier (clients/verify-export/verify_export.py, Python's
//! standard library only): a real SQLite ledger written by the real ledger, exported by the real
//! binary, checked by a program that is not opledger. The verifier's own tests (on a committed
//! export, tampered in every way) run here too, so CI runs them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use opledger_domain::app::{IntentRequest, Ledger};
use opledger_domain::ids::ActorId;
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_store::SqliteStore;
use serde_json::Value;

mod python_venv;

/// pyarrow, for reading Parquet exports as an auditor's tools would.
const PARQUET_REQUIREMENTS: [&str; 1] = ["pyarrow>=14"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn verifier() -> PathBuf {
    repo().join("clients/verify-export/verify_export.py")
}

/// Six operations, alternately of tenants acme and globex, each recorded then approved (two
/// events a stream, interleaved in the log).
async fn write_ledger(db: &Path) {
    let store = SqliteStore::open(db).await.expect("opens");
    let ledger = Ledger::new(store.clone(), SystemClock, RandomIds);
    let mut recorded = Vec::new();
    for n in 0..6 {
        let operation = ledger
            .record_intent(IntentRequest {
                tenant: if n % 2 == 0 { "acme" } else { "globex" }.into(),
                owner: None,
                provider: "crm".into(),
                account: "acct-1".into(),
                credential_fingerprint: "fp-1".into(),
                action: "create_task".into(),
                args: serde_json::json!({"title": format!("Call client {n}")}),
                source_id: None,
                requires_approval: true,
            })
            .await
            .expect("recorded");
        recorded.push(operation.intent().clone());
    }
    for intent in recorded {
        ledger
            .approve(
                intent.operation_id,
                ActorId::new("boss").expect("valid"),
                intent.args_hash.clone(),
            )
            .await
            .expect("approved");
    }
    store.close().await.expect("closes");
}

fn export(db: &Path, out: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["export", "--db"])
        .arg(db)
        .arg("--out")
        .arg(out)
        .args(extra)
        .env_remove("OPLEDGER_DB")
        .output()
        .expect("runs")
}

fn verify_offline(file: &Path) -> Output {
    verify_offline_with(Path::new("python3"), file)
}

fn verify_offline_with(python: &Path, file: &Path) -> Output {
    Command::new(python)
        .arg(verifier())
        .arg(file)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 runs (install python3)")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The event lines of an export.
fn events(file: &Path) -> Vec<Value> {
    std::fs::read_to_string(file)
        .expect("the export exists")
        .lines()
        .skip(1)
        .map(|line| serde_json::from_str::<Value>(line).expect("each line is JSON"))
        .filter(|line| line.get("end").is_none())
        .collect()
}

async fn ledger() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("ledger.db");
    write_ledger(&db).await;
    (dir, db)
}

#[tokio::test]
async fn a_whole_export_verifies_offline_with_every_link_and_id_recomputed() {
    let (dir, db) = ledger().await;
    let out = dir.path().join("all.ndjson");
    let exported = export(&db, &out, &[]);
    assert!(exported.status.success(), "{}", text(&exported));
    assert!(text(&exported).contains("exported 12 event(s), positions 1–12"));
    let lines = events(&out);
    assert_eq!(lines.len(), 12);
    let positions: Vec<u64> = lines
        .iter()
        .map(|l| l["position"].as_u64().unwrap())
        .collect();
    assert_eq!(positions, (1..=12).collect::<Vec<_>>());
    let verified = verify_offline(&out);
    assert!(verified.status.success(), "{}", text(&verified));
    assert!(text(&verified).contains("OK: 12 event(s) of 6 stream(s)"));
}

#[tokio::test]
async fn an_export_to_a_time_read_off_a_line_holds_that_line() {
    let (dir, db) = ledger().await;
    let all = dir.path().join("all.ndjson");
    assert!(export(&db, &all, &[]).status.success());
    let lines = events(&all);
    // An event's time is written to the millisecond; the event itself carries more digits. A
    // bound is compared at the precision it is written in, so the line it was read off is in.
    let time = lines[5]["time"].as_str().expect("each event has its time");
    let to = dir.path().join("to-time.ndjson");
    let exported = export(&db, &to, &["--to", time]);
    assert!(exported.status.success(), "{}", text(&exported));
    let sliced = events(&to);
    let through = lines
        .iter()
        .rposition(|l| l["time"].as_str().unwrap() <= time)
        .unwrap();
    assert_eq!(sliced, lines[..=through].to_vec());
}

#[tokio::test]
async fn an_export_for_a_tenant_with_no_event_in_the_slice_writes_nothing_and_names_the_tenants() {
    let (dir, db) = ledger().await;
    let out = dir.path().join("nosuch.ndjson");
    let refused = export(&db, &out, &["--tenant", "nosuch"]);
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused));
    assert!(
        text(&refused).contains("no event of tenant `nosuch`")
            && text(&refused).contains("operations of acme, globex"),
        "{}",
        text(&refused)
    );
    assert!(!out.exists(), "no empty file is left to pass for evidence");
}

#[tokio::test]
async fn a_tenants_export_holds_only_its_operations_and_still_verifies() {
    let (dir, db) = ledger().await;
    let out = dir.path().join("globex.ndjson");
    let exported = export(&db, &out, &["--tenant", "globex"]);
    assert!(exported.status.success(), "{}", text(&exported));
    let lines = events(&out);
    assert_eq!(lines.len(), 6, "three operations of two events each");
    for line in &lines {
        let data: Value = serde_json::from_str(line["data"].as_str().unwrap()).unwrap();
        if line["type"] == "IntentRecorded" {
            assert_eq!(data["tenant"], "globex");
        }
    }
    let verified = verify_offline(&out);
    assert!(verified.status.success(), "{}", text(&verified));
}

#[tokio::test]
async fn a_slice_from_a_position_or_a_time_starts_there_and_verifies_on_its_anchors() {
    let (dir, db) = ledger().await;
    let all = dir.path().join("all.ndjson");
    assert!(export(&db, &all, &[]).status.success());
    let lines = events(&all);

    let by_position = dir.path().join("from-8.ndjson");
    let exported = export(&db, &by_position, &["--from", "8", "--to", "10"]);
    assert!(exported.status.success(), "{}", text(&exported));
    let sliced = events(&by_position);
    assert_eq!(sliced, lines[7..10].to_vec());
    // Approvals, whose links before them are outside the slice: carried as previous_chain.
    assert!(sliced.iter().all(|l| l["previous_chain"].is_string()));
    let verified = verify_offline(&by_position);
    assert!(verified.status.success(), "{}", text(&verified));

    let time = lines[6]["time"].as_str().expect("each event has its time");
    let by_time = dir.path().join("from-time.ndjson");
    let exported = export(&db, &by_time, &["--from", time]);
    assert!(exported.status.success(), "{}", text(&exported));
    let sliced = events(&by_time);
    let first_at_or_after = lines
        .iter()
        .position(|l| l["time"].as_str().unwrap() >= time)
        .unwrap();
    assert_eq!(sliced, lines[first_at_or_after..].to_vec());
    let verified = verify_offline(&by_time);
    assert!(verified.status.success(), "{}", text(&verified));
}

#[tokio::test]
async fn an_event_edited_in_the_ledger_is_named_by_the_offline_verifier() {
    let (dir, db) = ledger().await;
    let connection = rusqlite::Connection::open(&db).expect("opens the file directly");
    connection
        .execute_batch(
            "UPDATE events SET data = CAST(replace(CAST(data AS TEXT), 'Call client 3', 'Call client X') AS BLOB)",
        )
        .expect("the tampering statement runs");
    drop(connection);
    let out = dir.path().join("tampered.ndjson");
    let exported = export(&db, &out, &[]);
    assert!(
        exported.status.success(),
        "an export shows what is stored: {}",
        text(&exported)
    );
    let edited = events(&out)
        .into_iter()
        .find(|l| l["data"].as_str().unwrap().contains("Call client X"))
        .expect("the edited event is exported as stored");
    let verified = verify_offline(&out);
    assert_eq!(verified.status.code(), Some(1), "{}", text(&verified));
    let report = text(&verified);
    assert!(
        report.contains(&format!(
            "EDITED (line {}, position {}",
            edited["position"].as_u64().unwrap() + 1,
            edited["position"]
        )),
        "{report}"
    );
}

#[test]
fn the_offline_verifiers_own_tests_pass() {
    let output = Command::new("python3")
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(repo().join("clients/verify-export/tests"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 runs (install python3)");
    let printed = text(&output);
    assert!(output.status.success(), "{printed}");
    assert!(printed.contains("\nOK"), "{printed}");
    assert!(!printed.contains("skipped"), "a test skipped: {printed}");
}

#[tokio::test]
async fn bad_bounds_and_paths_are_refused_and_leave_no_file() {
    let (dir, db) = ledger().await;
    let out = dir.path().join("never.ndjson");
    for (extra, says) in [
        (
            &["--from", "yesterday"][..],
            "neither a position nor an RFC 3339 time",
        ),
        (&["--from", "0"][..], "positions start at 1"),
        (&["--from", "10", "--to", "5"][..], "comes after --to"),
        (&["--tenant", ""][..], "--tenant"),
    ] {
        let refused = export(&db, &out, extra);
        assert_eq!(
            refused.status.code(),
            Some(2),
            "{extra:?}: {}",
            text(&refused)
        );
        assert!(
            text(&refused).contains(says),
            "{extra:?}: {}",
            text(&refused)
        );
    }
    let missing_dir = dir.path().join("nowhere").join("out.ndjson");
    let refused = export(&db, &missing_dir, &[]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("does not exist; create it first"));
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("ndjson"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Reads a Parquet export with pyarrow and prints its rows as the NDJSON export's lines (data and
/// metadata as text), or, with a row number, rewrites that row's data (its title) keeping the
/// file's metadata: an auditor's tool, and a forger's.
const PARQUET_SCRIPT: &str = r#"
import json, sys
import pyarrow as pa, pyarrow.parquet as pq
table = pq.read_table(sys.argv[1])
if len(sys.argv) == 2:
    for row in table.to_pylist():
        row["time"] = row["time"].isoformat(timespec="milliseconds").replace("+00:00", "Z")
        row["data"] = row["data"].decode()
        row["metadata"] = row["metadata"].decode()
        # Absent in NDJSON when empty (an export without proofs, an event that is no context).
        for name in ("context", "inclusion_proof"):
            if row[name] is None:
                del row[name]
        print(json.dumps(row))
else:
    index = int(sys.argv[2])
    data = table.column("data").to_pylist()
    data[index] = data[index].replace(b"Call client", b"Call clinet")
    forged = table.set_column(table.schema.get_field_index("data"), table.schema.field("data"), pa.array(data, pa.binary()))
    pq.write_table(forged.replace_schema_metadata(table.schema.metadata), sys.argv[1])
"#;

#[tokio::test]
async fn a_parquet_export_holds_the_ndjson_rows_verifies_offline_and_a_forged_cell_is_named() {
    let python = tokio::task::spawn_blocking(|| {
        python_venv::python_with("export-parquet-venv", &PARQUET_REQUIREMENTS)
    })
    .await
    .expect("the virtual environment is made");
    let (dir, db) = ledger().await;
    let ndjson = dir.path().join("all.ndjson");
    let parquet = dir.path().join("all.parquet");
    assert!(export(&db, &ndjson, &[]).status.success());
    let exported = export(&db, &parquet, &["--format", "parquet"]);
    assert!(exported.status.success(), "{}", text(&exported));

    let read = python_venv::run(
        Command::new(&python)
            .args(["-c", PARQUET_SCRIPT])
            .arg(&parquet),
        "reading the Parquet export with pyarrow",
    );
    let rows: Vec<Value> = read
        .lines()
        .map(|line| serde_json::from_str(line).expect("a row as JSON"))
        .collect();
    assert_eq!(rows, events(&ndjson), "the same rows in both formats");

    let verified = verify_offline_with(&python, &parquet);
    assert!(verified.status.success(), "{}", text(&verified));
    assert!(text(&verified).contains("OK: 12 event(s) of 6 stream(s)"));

    python_venv::run(
        Command::new(&python)
            .args(["-c", PARQUET_SCRIPT])
            .arg(&parquet)
            .arg("4"),
        "forging a cell of the Parquet export",
    );
    let verified = verify_offline_with(&python, &parquet);
    assert_eq!(verified.status.code(), Some(1), "{}", text(&verified));
    assert!(
        text(&verified).contains("EDITED (row 5, position 5"),
        "{}",
        text(&verified)
    );
}

fn ops_show(db: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["ops", "show", "--db"])
        .arg(db)
        .args(extra)
        .env_remove("OPLEDGER_DB")
        .output()
        .expect("runs")
}

#[tokio::test]
async fn ops_show_as_of_a_moment_shows_the_operation_as_it_stood_then() {
    let (_dir, db) = ledger().await;
    let connection = rusqlite::Connection::open(&db).expect("opens the file directly");
    let stream: String = connection
        .query_row("SELECT stream FROM events WHERE position = 1", [], |row| {
            row.get(0)
        })
        .expect("the first event's stream");
    drop(connection);
    let id = stream.trim_start_matches("operation-");
    let shown = |extra: &[&str]| -> Value {
        let output = ops_show(&db, &[&[id, "--json"], extra].concat());
        assert!(output.status.success(), "{extra:?}: {}", text(&output));
        serde_json::from_slice(&output.stdout).expect("JSON")
    };
    let now = shown(&[]);
    assert_eq!(now["version"], 1, "recorded, then approved: {now}");
    let recorded = shown(&["--as-of", "1"]);
    assert_eq!(recorded["version"], 0);
    assert_eq!(
        recorded["as_of_position"], 1,
        "the answer names the position: {recorded}"
    );
    assert_ne!(recorded["state"], now["state"]);
    // Approvals were written at positions 7–12, the first operation's at 7.
    assert_eq!(shown(&["--as-of", "6"])["state"], recorded["state"]);
    assert_eq!(shown(&["--as-of", "7"])["state"], now["state"]);
    let time = now["updated_at"].as_str().expect("the approval's time");
    let at_approval = shown(&["--as-of", time]);
    assert_eq!(at_approval["version"], 1);
    // Positions 8 on may share the approval's millisecond.
    assert!(
        at_approval["as_of_position"].as_u64() >= Some(7),
        "{at_approval}"
    );
    // The sentence in the action's configured words, as the API says it.
    assert!(
        recorded["message"].as_str().is_some_and(
            |message| message.contains("the request to create a task in account acct-1")
        ),
        "{recorded}"
    );

    let past_the_head = ops_show(&db, &[id, "--as-of", "13"]);
    assert_eq!(
        past_the_head.status.code(),
        Some(2),
        "{}",
        text(&past_the_head)
    );
    assert!(
        text(&past_the_head).contains("past the log's newest position 12"),
        "{}",
        text(&past_the_head)
    );
    let future = ops_show(&db, &[id, "--as-of", "2999-01-01T00:00:00Z"]);
    assert_eq!(future.status.code(), Some(2), "{}", text(&future));
    assert!(
        text(&future).contains("later than now"),
        "{}",
        text(&future)
    );

    let before = ops_show(&db, &[id, "--as-of", "2000-01-01T00:00:00Z"]);
    assert_eq!(before.status.code(), Some(3), "{}", text(&before));
    assert!(text(&before).contains("was not in the ledger at"));
    let bad = ops_show(&db, &[id, "--as-of", "soon"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(text(&bad).contains("neither a position nor an RFC 3339 time"));
}

/// A ledger of two tenants, a key made by `opledger keys generate`, and its verifier key.
async fn signed_ledger() -> (tempfile::TempDir, PathBuf, PathBuf, String) {
    let (dir, db) = ledger().await;
    let key = dir.path().join("log.key");
    let generated = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args([
            "keys",
            "generate",
            "--name",
            "ledger.example.com/audit",
            "--out",
        ])
        .arg(&key)
        .output()
        .expect("runs");
    assert!(generated.status.success(), "{}", text(&generated));
    let verifier_key = String::from_utf8_lossy(&generated.stdout).trim().to_owned();
    (dir, db, key, verifier_key)
}

fn verify_with_key(python: &Path, file: &Path, verifier_key: &str, extra: &[&str]) -> Output {
    Command::new(python)
        .arg(verifier())
        .arg(file)
        .args(["--verifier-key", verifier_key])
        .args(extra)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 runs (install python3)")
}

#[tokio::test]
async fn exports_cut_at_a_signed_checkpoint_prove_themselves_whole_sliced_and_per_tenant() {
    let (dir, db, key, verifier_key) = signed_ledger().await;
    let key_flag = ["--key-file", key.to_str().expect("utf-8")];
    let cases: [(&str, &[&str], &str); 3] = [
        ("whole", &[], "the leaves make its root"),
        (
            "slice",
            &["--from", "3", "--to", "10"],
            "every event's inclusion proof holds",
        ),
        (
            "tenant",
            &["--tenant", "acme"],
            "every event's inclusion proof holds; the tenant's events make the tenant's tree the checkpoint signs (none left out)",
        ),
    ];
    for (name, bounds, proved) in cases {
        let out = dir.path().join(format!("{name}.ndjson"));
        let exported = export(&db, &out, &[&key_flag[..], bounds].concat());
        assert!(exported.status.success(), "{}", text(&exported));
        assert!(
            text(&exported).contains("with the proofs against the checkpoint of tree size 12"),
            "{}",
            text(&exported)
        );
        let verified = verify_with_key(Path::new("python3"), &out, &verifier_key, &[]);
        assert!(verified.status.success(), "{name}: {}", text(&verified));
        let report = text(&verified);
        assert!(
            report.contains(proved)
                && report.contains("against the checkpoint of 12 events")
                && report.contains("signed by ledger.example.com/audit"),
            "{name}: {report}"
        );
    }
    // The slice names the events just outside its ends, with their proofs, as context.
    let slice = events(&dir.path().join("slice.ndjson"));
    let contexts: Vec<(&str, u64)> = slice
        .iter()
        .filter_map(|l| Some((l["context"].as_str()?, l["position"].as_u64()?)))
        .collect();
    assert_eq!(contexts, vec![("before", 2), ("after", 11)]);

    // Another log's key does not open the export's checkpoint.
    let other = dir.path().join("other.key");
    let generated = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args([
            "keys",
            "generate",
            "--name",
            "ledger.example.com/audit",
            "--out",
        ])
        .arg(&other)
        .output()
        .expect("runs");
    let other_key = String::from_utf8_lossy(&generated.stdout).trim().to_owned();
    let refused = verify_with_key(
        Path::new("python3"),
        &dir.path().join("whole.ndjson"),
        &other_key,
        &[],
    );
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(
        text(&refused).contains(
            "its checkpoint is refused: the checkpoint is not signed by the verifier key"
        ),
        "{}",
        text(&refused)
    );
}

#[tokio::test]
async fn a_kept_checkpoint_is_extended_by_a_later_whole_export_and_a_rolled_back_ledger_is_named() {
    let (dir, db, key, verifier_key) = signed_ledger().await;
    let older = dir.path().join("older.db");
    std::fs::copy(&db, &older).expect("an older copy");
    write_ledger(&db).await;
    let kept_export = dir.path().join("kept.ndjson");
    let key_flag = ["--key-file", key.to_str().expect("utf-8")];
    assert!(export(&db, &kept_export, &key_flag).status.success());
    let header: Value = serde_json::from_str(
        std::fs::read_to_string(&kept_export)
            .expect("the export")
            .lines()
            .next()
            .expect("a header"),
    )
    .expect("JSON");
    let kept = dir.path().join("kept.checkpoint");
    std::fs::write(&kept, header["checkpoint"].as_str().expect("a checkpoint")).expect("kept");

    write_ledger(&db).await;
    let later = dir.path().join("later.ndjson");
    assert!(export(&db, &later, &key_flag).status.success());
    let kept_flag = ["--kept", kept.to_str().expect("utf-8")];
    let verified = verify_with_key(Path::new("python3"), &later, &verifier_key, &kept_flag);
    assert!(verified.status.success(), "{}", text(&verified));
    assert!(
        text(&verified).contains("it extends the kept checkpoint of 24 events"),
        "{}",
        text(&verified)
    );

    // The ledger rolled back to its older copy, exported with the same key: the log shrank.
    let rolled_back = dir.path().join("rolled-back.ndjson");
    assert!(export(&older, &rolled_back, &key_flag).status.success());
    let refused = verify_with_key(
        Path::new("python3"),
        &rolled_back,
        &verifier_key,
        &kept_flag,
    );
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(
        text(&refused).contains(
            "ROLLED BACK (line 1): the kept checkpoint covers 24 events, the export's only 12"
        ),
        "{}",
        text(&refused)
    );
}

#[tokio::test]
async fn every_tampering_of_a_proved_export_is_named_by_the_verifier_in_ndjson_and_parquet() {
    let python = tokio::task::spawn_blocking(|| {
        python_venv::python_with("export-parquet-venv", &PARQUET_REQUIREMENTS)
    });
    let (dir, db, key, verifier_key) = signed_ledger().await;
    let key_flag = ["--key-file", key.to_str().expect("utf-8")];
    let kinds: [(&str, &[&str]); 5] = [
        ("whole", &[]),
        ("slice", &["--from", "3", "--to", "10"]),
        ("tenant", &["--tenant", "acme"]),
        (
            "tenant-slice",
            &["--tenant", "acme", "--from", "2", "--to", "10"],
        ),
        // Another tenant's intents with their proofs, for slipping one in.
        ("foreign", &["--from", "1", "--to", "6"]),
    ];
    let mut files = Vec::new();
    for format in ["ndjson", "parquet"] {
        for (name, bounds) in kinds {
            let out = dir.path().join(format!("{name}.{format}"));
            let exported = export(
                &db,
                &out,
                &[&key_flag[..], bounds, &["--format", format]].concat(),
            );
            assert!(exported.status.success(), "{}", text(&exported));
            files.push(out);
        }
    }
    let python = python.await.expect("the virtual environment is made");
    let tampered = Command::new(python)
        .arg(repo().join("clients/verify-export/tests/tamper_exports.py"))
        .arg(&verifier_key)
        .args(&files)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("TMPDIR", dir.path())
        .output()
        .expect("runs");
    let report = text(&tampered);
    assert!(tampered.status.success(), "{report}");
    assert!(report.contains("0 missed"), "{report}");
}

#[tokio::test]
async fn an_export_signed_with_a_key_carries_that_keys_checkpoint_though_another_of_its_size_is_kept(
) {
    let (dir, db, key, _) = signed_ledger().await;
    let (_other_dir, _, other_key, other_verifier_key) = signed_ledger().await;
    let first = dir.path().join("first.ndjson");
    let exported = export(&db, &first, &["--key-file", key.to_str().expect("utf-8")]);
    assert!(exported.status.success(), "{}", text(&exported));
    // The same tree size, signed by another key: the ledger already keeps a checkpoint of it.
    let second = dir.path().join("second.ndjson");
    let exported = export(
        &db,
        &second,
        &["--key-file", other_key.to_str().expect("utf-8")],
    );
    assert!(exported.status.success(), "{}", text(&exported));
    let verified = verify_with_key(Path::new("python3"), &second, &other_verifier_key, &[]);
    assert!(verified.status.success(), "{}", text(&verified));
}

/// The export's lines without the event lines `drop` picks, its closing line made to match, as
/// someone covering their tracks would; the tenant tree's proofs are kept (they cannot be forged).
fn without_events(export: &Path, drop: impl Fn(&Value) -> bool) -> PathBuf {
    let text = std::fs::read_to_string(export).expect("the export");
    let mut lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON"))
        .collect();
    lines.retain(|line| {
        line.get("position").is_none() || line.get("context").is_some() || !drop(line)
    });
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

/// A slice asked for: its name, its bounds, the positions exported, and the context lines given
/// (kind, position).
type SliceCase = (
    &'static str,
    &'static [&'static str],
    &'static [u64],
    &'static [(&'static str, u64)],
);

#[tokio::test]
async fn a_slice_of_a_tenant_proves_none_of_its_events_between_its_ends_left_out_and_a_cut_one_is_named(
) {
    // Acme's events are at positions 1, 3, 5 (intents) and 7, 9, 11 (approvals).
    let (dir, db, key, verifier_key) = signed_ledger().await;
    let key_flag = ["--key-file", key.to_str().expect("utf-8")];
    let cases: [SliceCase; 3] = [
        (
            "middle",
            &["--from", "4", "--to", "8"],
            &[5, 7],
            &[("tenant_before", 3), ("intent", 1), ("tenant_after", 9)],
        ),
        ("start", &["--to", "4"], &[1, 3], &[("tenant_after", 5)]),
        (
            "end",
            &["--from", "8"],
            &[9, 11],
            &[("tenant_before", 7), ("intent", 3), ("intent", 5)],
        ),
    ];
    for (name, bounds, exported, contexts) in cases {
        let out = dir.path().join(format!("acme-{name}.ndjson"));
        let done = export(
            &db,
            &out,
            &[&key_flag[..], &["--tenant", "acme"], bounds].concat(),
        );
        assert!(done.status.success(), "{name}: {}", text(&done));
        let lines = events(&out);
        let positions: Vec<u64> = lines
            .iter()
            .filter(|line| line.get("context").is_none())
            .filter_map(|line| line["position"].as_u64())
            .collect();
        assert_eq!(positions, exported, "{name}");
        let given: Vec<(&str, u64)> = lines
            .iter()
            .filter_map(|l| Some((l["context"].as_str()?, l["position"].as_u64()?)))
            .collect();
        assert_eq!(given, contexts, "{name}");
        let verified = verify_with_key(Path::new("python3"), &out, &verifier_key, &[]);
        assert!(
            verified.status.success(),
            "{name}: {}\n{}",
            text(&verified),
            std::fs::read_to_string(&out).unwrap_or_default()
        );
        assert!(
            text(&verified).contains("none of the tenant's events between them left out"),
            "{name}: {}",
            text(&verified)
        );

        // Its last event cut off, the closing line rewritten: each event left still holds, but
        // the tenant's tree does not.
        let last = *exported.last().expect("an event");
        let cut = without_events(&out, |line| line["position"] == last);
        let refused = verify_with_key(Path::new("python3"), &cut, &verifier_key, &[]);
        assert_eq!(refused.status.code(), Some(1), "{name}: {}", text(&refused));
        assert!(
            text(&refused).contains("INCOMPLETE"),
            "{name}: {}",
            text(&refused)
        );
    }

    // Bounded by times read off the middle slice's own events: the edges are proved by their
    // times, which lie outside the bounds.
    let middle = events(&dir.path().join("acme-middle.ndjson"));
    let time_at = |position: u64| -> String {
        middle
            .iter()
            .find(|line| line["position"] == position)
            .and_then(|line| line["time"].as_str())
            .expect("a time")
            .to_owned()
    };
    let (from, to) = (time_at(5), time_at(7));
    let out = dir.path().join("acme-times.ndjson");
    let done = export(
        &db,
        &out,
        &[
            &key_flag[..],
            &["--tenant", "acme", "--from", &from, "--to", &to],
        ]
        .concat(),
    );
    assert!(done.status.success(), "{}", text(&done));
    let verified = verify_with_key(Path::new("python3"), &out, &verifier_key, &[]);
    assert!(
        verified.status.success()
            && text(&verified).contains("none of the tenant's events between them left out"),
        "{}",
        text(&verified)
    );
}
