//! Numbers in arguments end to end: what a caller writes is what is recorded, hashed, sent to the
//! CRM, read back from the SQLite file after a restart and rebuilt by `replay --verify` — or it
//! is refused with what to send instead. (The rules: `opledger_domain::args`, "Numbers".)

use std::process::{Command, Stdio};

use reqwest::{Method, StatusCode};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::support::{Harness, ACCOUNT, TENANT_A_TOKEN};

/// Arguments written with the numbers that used to change on the way in (3.402823466e+38 was
/// recorded as 3.4028234659999998e+38), spelled as a caller might.
const WRITTEN_ARGS: &str = r#"{"title": "numbers", "x": 3.402823466e+38, "max": 1.7976931348623157e308,
    "tiny": 5e-324, "big": 9007199254740993, "top": 18446744073709551615, "neg_zero": -0,
    "one": 1, "one_float": 1.0, "e": 1E+5}"#;

/// The same arguments as the ledger's canonical JSON: keys sorted, each number in its one
/// spelling (see the args module docs).
const CANONICAL_ARGS: &str = concat!(
    r#"{"big":9007199254740993,"e":100000.0,"max":1.7976931348623157e+308,"neg_zero":-0.0,"#,
    r#""one":1,"one_float":1.0,"tiny":5e-324,"title":"numbers","top":18446744073709551615,"#,
    r#""x":3.402823466e+38}"#
);

fn body(args: &str, source_id: &str) -> Vec<u8> {
    format!(
        r#"{{"provider": "crm", "account": "{ACCOUNT}", "action": "create_task",
            "source_id": "{source_id}", "args": {args}}}"#
    )
    .into_bytes()
}

/// The numbers of `args` as JSON text, by key, sorted.
fn spelled(args: &Value) -> Vec<(String, String)> {
    let mut numbers: Vec<_> = args
        .as_object()
        .expect("args are an object")
        .iter()
        .filter(|(_, value)| value.is_number())
        .map(|(key, value)| (key.clone(), value.to_string()))
        .collect();
    numbers.sort();
    numbers
}

#[track_caller]
fn assert_recorded_as_written(operation: &Value, expected_hash: &str, expected: &Value) {
    assert_eq!(operation["args_hash"], expected_hash, "{operation}");
    assert_eq!(
        spelled(&operation["args"]),
        spelled(expected),
        "{operation}"
    );
}

#[tokio::test]
async fn numbers_are_recorded_sent_read_back_and_replayed_exactly_as_written() {
    let harness = Harness::new("").await;
    let expected: Value = serde_json::from_str(CANONICAL_ARGS).expect("JSON");
    let expected_hash = format!("sha256:{:x}", Sha256::digest(CANONICAL_ARGS.as_bytes()));
    let server = harness.serve();

    // Two calls: record, then execute. The execute used to go to review claiming the arguments
    // to send hash to something other than the recorded hash.
    let (status, recorded) = server
        .call_raw(
            "/v1/operations",
            TENANT_A_TOKEN,
            body(WRITTEN_ARGS, "two-calls"),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    assert_recorded_as_written(&recorded, &expected_hash, &expected);
    let id = recorded["operation_id"].as_str().expect("an id").to_owned();
    let (_, executed) = server.execute(TENANT_A_TOKEN, &id, 5_000).await;
    assert_eq!(executed["state"], "succeeded", "{executed}");

    // One call: record and execute; the CRM must receive the recorded numbers.
    let (status, one_call) = server
        .call_raw(
            "/v1/operations?execute=true&wait_ms=5000",
            TENANT_A_TOKEN,
            body(WRITTEN_ARGS, "one-call"),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{one_call}");
    assert_eq!(one_call["state"], "succeeded", "{one_call}");
    assert_recorded_as_written(&one_call, &expected_hash, &expected);
    let objects = harness.objects().await;
    assert_eq!(objects.len(), 2);
    for object in &objects {
        let sent = Value::Object(object.fields.clone());
        assert_eq!(spelled(&sent), spelled(&expected), "what the CRM received");
    }

    // Read back from the SQLite file by a fresh process.
    let (code, _) = server.terminate();
    assert_eq!(code, Some(0));
    let server = harness.serve();
    for operation in [&id, one_call["operation_id"].as_str().expect("an id")] {
        let (status, read) = server
            .call(
                Method::GET,
                &format!("/v1/operations/{operation}"),
                Some(TENANT_A_TOKEN),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{read}");
        assert_eq!(read["state"], "succeeded", "{read}");
        assert_recorded_as_written(&read, &expected_hash, &expected);
    }
    let (code, _) = server.terminate();
    assert_eq!(code, Some(0));

    // The read models rebuilt from the log are the ones the server kept.
    let dir = harness.dir.path();
    let output = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["replay", "--verify", "--json", "--db"])
        .arg(dir.join("ledger.db"))
        .arg("--views")
        .arg(dir.join("ledger.views"))
        .env_remove("OPLEDGER_DB")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("opledger replay runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "replay --verify: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(&stdout).expect("a JSON report");
    assert_eq!(
        report["differences"].as_array().map(Vec::len),
        Some(0),
        "{stdout}"
    );
}

#[tokio::test]
async fn a_number_the_ledger_would_change_is_refused_with_what_to_send_and_nothing_is_written() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    let head = server.log_head().await;
    for (args, field, hint) in [
        (
            r#"{"title": "t", "crm_id": 123456789012345678901234567890}"#,
            "args.crm_id",
            "as a string",
        ),
        (
            r#"{"title": "t", "lines": [{"amount": 12345678901234567.89}]}"#,
            "args.lines[0].amount",
            "Send 1.2345678901234568e+16 if",
        ),
        (
            r#"{"title": "t", "rate": 1e-400}"#,
            "args.rate",
            "Send 0.0 if",
        ),
    ] {
        let (status, refused) = server
            .call_raw("/v1/operations", TENANT_A_TOKEN, body(args, "refused"))
            .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{args}: {refused}"
        );
        assert_eq!(refused["error"]["code"], "invalid_input", "{refused}");
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{args}: {message}");
        assert!(message.contains(hint), "{args}: {message}");
    }
    assert_eq!(server.log_head().await, head, "nothing was recorded");
}
