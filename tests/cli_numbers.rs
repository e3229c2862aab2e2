//! `opledger record --args` keeps every number as written, or refuses it with what to send
//! (the rules: `opledger_domain::args`, "Numbers"). Its own file, beside `tests/cli.rs`.

use std::path::Path;
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

fn record(db: &Path, args: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["record", "--db"])
        .arg(db)
        .args([
            "--tenant",
            "acme",
            "--provider",
            "crm",
            "--account",
            "acct-1",
        ])
        .args([
            "--credential-fingerprint",
            "fp-1",
            "--action",
            "create_task",
        ])
        .args(["--args", args])
        .env_remove("OPLEDGER_DB")
        .env_remove("RUST_LOG")
        .output()
        .expect("the opledger binary runs")
}

fn line(output: &Output, name: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .find_map(|line| line.strip_prefix(name).map(|rest| rest.trim().to_owned()))
        .unwrap_or_else(|| panic!("no `{name}` line in:\n{stdout}"))
}

#[test]
fn record_keeps_the_numbers_of_args_as_written_and_refuses_one_it_would_change() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ledger.db");

    let refused = record(&db, r#"{"crm_id": 123456789012345678901234567890}"#);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("invalid `args.crm_id`"), "{stderr}");
    assert!(stderr.contains("as a string"), "{stderr}");
    assert!(!db.exists(), "a refused record creates no ledger file");

    let recorded = record(&db, r#"{"x": 3.402823466e+38, "n": 1E+5, "z": -0}"#);
    assert!(
        recorded.status.success(),
        "{}",
        String::from_utf8_lossy(&recorded.stderr)
    );
    let canonical = r#"{"n":100000.0,"x":3.402823466e+38,"z":-0.0}"#;
    let expected = format!("sha256:{:x}", Sha256::digest(canonical.as_bytes()));
    assert_eq!(line(&recorded, "args_hash"), expected);

    let operation_id = line(&recorded, "operation_id");
    let shown = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["status", "--json", "--db"])
        .arg(&db)
        .arg(&operation_id)
        .env_remove("OPLEDGER_DB")
        .output()
        .expect("the opledger binary runs");
    assert!(shown.status.success());
    let json: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("JSON");
    let args = &json["args"];
    assert_eq!(args["x"].to_string(), "3.402823466e+38", "{json}");
    assert_eq!(args["n"].to_string(), "100000.0", "{json}");
    assert_eq!(args["z"].to_string(), "-0.0", "{json}");
    assert_eq!(json["args_hash"], expected.as_str());
}
