//! The `opledger` binary end to end: real process, real SQLite file, real exit codes.

use std::path::Path;
use std::process::{Command, Output};

fn opledger(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(args)
        .env_remove("OPLEDGER_DB")
        .env_remove("RUST_LOG")
        .output()
        .expect("the opledger binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn field(output: &Output, name: &str) -> String {
    stdout(output)
        .lines()
        .find_map(|line| line.strip_prefix(name).map(|rest| rest.trim().to_owned()))
        .unwrap_or_else(|| panic!("no `{name}` line in:\n{}", stdout(output)))
}

fn record(db: &Path, source_id: &str, args: &str) -> Output {
    opledger(&[
        "record",
        "--db",
        db.to_str().expect("utf-8 path"),
        "--tenant",
        "acme",
        "--provider",
        "crm",
        "--account",
        "acct-1",
        "--credential-fingerprint",
        "fp-1",
        "--action",
        "create_task",
        "--args",
        args,
        "--source-id",
        source_id,
        "--requires-approval",
    ])
}

#[test]
fn record_redeliver_approve_and_show_through_the_command_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ledger.db");
    let db_arg = db.to_str().expect("utf-8 path");

    let first = record(&db, "toolcall-1", r#"{"title": "Call the client"}"#);
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(field(&first, "new"), "yes");
    assert_eq!(field(&first, "state"), "awaiting_approval");
    let operation_id = field(&first, "operation_id");
    let args_hash = field(&first, "args_hash");

    let again = record(&db, "toolcall-1", r#"{"title": "Call the client"}"#);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(field(&again, "operation_id"), operation_id);
    assert!(field(&again, "new").starts_with("no"));

    let wrong_hash = format!("sha256:{}", "0".repeat(64));
    let refused = opledger(&[
        "approve",
        "--db",
        db_arg,
        &operation_id,
        "--approver",
        "boss",
        "--args-hash",
        &wrong_hash,
    ]);
    assert_eq!(
        refused.status.code(),
        Some(3),
        "a refusal by the rules exits 3"
    );
    assert!(stderr(&refused).contains("froze"), "{}", stderr(&refused));

    let approved = opledger(&[
        "approve",
        "--db",
        db_arg,
        &operation_id,
        "--approver",
        "boss",
        "--args-hash",
        &args_hash,
    ]);
    assert!(approved.status.success(), "{}", stderr(&approved));
    assert_eq!(field(&approved, "state"), "pending");

    let shown = opledger(&["status", "--db", db_arg, &operation_id, "--json"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let json: serde_json::Value =
        serde_json::from_slice(&shown.stdout).expect("status --json prints JSON");
    let types: Vec<&str> = json["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["type"].as_str())
        .collect();
    assert_eq!(types, ["IntentRecorded", "ApprovalGranted"]);
    assert_eq!(json["state"]["status"]["status"], "pending");
}

#[test]
fn bad_input_exits_two_names_the_field_and_creates_no_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ledger.db");
    for (args, field) in [("[1, 2]", "args"), ("{not json", "args")] {
        let output = record(&db, "toolcall-1", args);
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        assert!(
            stderr(&output).contains(&format!("invalid `{field}`")),
            "{}",
            stderr(&output)
        );
    }
    let bad_id = opledger(&["status", "--db", db.to_str().expect("utf-8"), "not-a-uuid"]);
    assert_eq!(bad_id.status.code(), Some(2));
    assert!(
        stderr(&bad_id).contains("operation_id"),
        "{}",
        stderr(&bad_id)
    );
    assert!(
        !db.exists(),
        "refused input must not create the ledger file"
    );
}

#[test]
fn reading_a_ledger_that_does_not_exist_says_so_instead_of_creating_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("missing.db");
    let output = opledger(&[
        "status",
        "--db",
        db.to_str().expect("utf-8"),
        "6f1c2a3e-0b1d-4c5e-9f00-112233445566",
    ]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("no ledger at"),
        "{}",
        stderr(&output)
    );
    assert!(!db.exists());
}

#[test]
fn the_demo_plays_the_article_against_the_stand_and_counts_no_duplicates() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("demo.db");
    let output = opledger(&["demo", "--db", db.to_str().expect("utf-8")]);
    let text = stdout(&output);
    assert!(output.status.success(), "{text}\n{}", stderr(&output));
    assert_eq!(
        text.lines().last(),
        Some("demo: scenarios=3 passed=3 duplicates=0"),
        "{text}"
    );
    assert_eq!(text.matches("the CRM holds 1 task(s)").count(), 2, "{text}");
    assert!(text.contains("the CRM holds 0 task(s)"), "{text}");
    assert!(text.contains("a person is checking"), "{text}");
    assert!(db.exists());
}

#[test]
fn help_explains_every_command() {
    let output = opledger(&["--help"]);
    assert!(output.status.success());
    let text = stdout(&output);
    for command in [
        "demo", "bench", "record", "approve", "deny", "status", "stand",
    ] {
        assert!(text.contains(command), "--help lacks {command}:\n{text}");
    }
}

#[test]
fn a_reader_that_closes_the_pipe_early_stops_the_command_quietly_not_with_a_panic() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ledger.db");
    for n in 0..3 {
        let output = record(
            &db,
            &format!("toolcall-{n}"),
            r#"{"title": "Call the client"}"#,
        );
        assert!(output.status.success(), "{}", stderr(&output));
    }
    // Like `opledger ops list | head -0`: the reader is gone before the first line is written.
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let output = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["ops", "list", "--db", db.to_str().expect("utf-8")])
        .env_remove("OPLEDGER_DB")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("runs");
    assert!(!stderr(&output).contains("panicked"), "{}", stderr(&output));
    assert_eq!(output.status.code(), Some(141));
}
