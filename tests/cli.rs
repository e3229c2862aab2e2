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

/// Runs `opledger record` for tenant `acme` at `crm`/`acct-1` with `args`, then `extra` flags.
fn record_with(db: &Path, args: &str, extra: &[&str]) -> Output {
    let mut all = vec![
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
    ];
    all.extend_from_slice(extra);
    opledger(&all)
}

fn record(db: &Path, source_id: &str, args: &str) -> Output {
    record_with(db, args, &["--source-id", source_id, "--requires-approval"])
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
    // The API's operation object: recorded then approved, so version 1, pending.
    assert_eq!(json["state"], "pending", "{json}");
    assert_eq!(json["version"], 1, "{json}");
    assert_eq!(json["operation_id"], operation_id.as_str(), "{json}");
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
fn the_demo_with_trace_export_on_keeps_each_operations_history_in_one_trace() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("demo.db");
    let db = db.to_str().expect("utf-8");
    // Nothing listens on the discard port: export fails and is counted, and the trace context
    // is kept with the events all the same.
    let output = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["demo", "--db", db])
        .env_remove("OPLEDGER_DB")
        .env_remove("RUST_LOG")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
        .output()
        .expect("the opledger binary runs");
    assert!(output.status.success(), "{}", stderr(&output));
    let listed = json_stdout(&opledger(&["ops", "list", "--db", db, "--json"]));
    let operations = listed["operations"].as_array().expect("operations");
    assert_eq!(operations.len(), 3, "{listed}");
    for operation in operations {
        let id = operation["operation_id"].as_str().expect("an id");
        let traced = json_stdout(&opledger(&["trace", "--db", db, id, "--json"]));
        let events = traced["events"].as_array().expect("events");
        let traces: std::collections::BTreeSet<&str> = events
            .iter()
            .map(|event| event["trace_id"].as_str().unwrap_or("none"))
            .collect();
        assert!(events.len() > 2, "{traced}");
        assert_eq!(
            traces.len(),
            1,
            "every event of {id} in its intent's trace: {traces:?}"
        );
        assert!(!traces.contains("none"), "{traces:?}");
    }
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

/// The `--db` line of `opledger <command> --help`.
fn db_help(command: &[&str]) -> String {
    let mut args = command.to_vec();
    args.push("--help");
    let output = opledger(&args);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let start = text
        .find("--db <DB>")
        .unwrap_or_else(|| panic!("{command:?} has no --db:\n{text}"));
    // Up to the next option: the help of --db, however clap wrapped it.
    let rest = &text[start..];
    let end = rest[1..].find("\n  -").map_or(rest.len(), |at| at + 1);
    rest[..end].split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn db_help_promises_a_new_file_only_where_one_is_created() {
    let record = db_help(&["record"]);
    assert!(record.contains("created if missing"), "{record}");
    for command in [
        &["status"][..],
        &["ops", "list"],
        &["ops", "show"],
        &["trace"],
        &["review", "list"],
        &["review", "show"],
        &["tail"],
        &["replay"],
        &["approve"],
        &["deny"],
        &["review", "resolve"],
    ] {
        let help = db_help(command);
        assert!(!help.contains("created if missing"), "{command:?}: {help}");
        assert!(help.contains("must exist"), "{command:?}: {help}");
    }
}

#[test]
fn a_file_that_is_not_a_database_is_named_not_a_ledger_with_what_to_do_and_left_as_it_is() {
    let dir = tempfile::tempdir().expect("temp dir");
    let notes = dir.path().join("notes.db");
    std::fs::write(&notes, "a shopping list, not a ledger\n").expect("written");
    let path = notes.to_str().expect("utf-8");
    let read = opledger(&[
        "status",
        "--db",
        path,
        "6f1c2a3e-0b1d-4c5e-9f00-112233445566",
    ]);
    assert_eq!(read.status.code(), Some(1));
    let message = stderr(&read);
    assert!(message.contains("is not an SQLite database"), "{message}");
    assert!(message.contains("not an opledger ledger"), "{message}");
    assert!(message.contains("pass --db"), "{message}");
    assert!(!message.contains("corrupt"), "{message}");
    let write = record(&notes, "toolcall-1", r#"{"title": "Call the client"}"#);
    assert_eq!(write.status.code(), Some(1));
    assert!(
        stderr(&write).contains("a path that does not exist yet to start a new ledger"),
        "{}",
        stderr(&write)
    );
    assert_eq!(
        std::fs::read_to_string(&notes).expect("still readable"),
        "a shopping list, not a ledger\n"
    );
}

#[test]
fn a_missing_directory_is_named_as_the_problem_by_reads_and_by_record() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing_dir = dir.path().join("no-such-dir");
    let db = missing_dir.join("ledger.db");
    let write = record(&db, "toolcall-1", r#"{"title": "Call the client"}"#);
    assert_eq!(write.status.code(), Some(1));
    let message = stderr(&write);
    assert!(
        message.contains(&format!(
            "the directory {} does not exist",
            missing_dir.display()
        )),
        "{message}"
    );
    assert!(
        !message.contains("unable to open database file"),
        "{message}"
    );
    let read = opledger(&["ops", "list", "--db", db.to_str().expect("utf-8")]);
    assert_eq!(read.status.code(), Some(1));
    assert!(
        stderr(&read).contains("does not exist"),
        "{}",
        stderr(&read)
    );
    assert!(!missing_dir.exists(), "nothing is created");
}

#[test]
fn another_programs_sqlite_file_on_a_read_is_called_not_an_opledger_ledger_and_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let foreign = dir.path().join("crm.db");
    let connection = rusqlite::Connection::open(&foreign).expect("an SQLite file");
    connection
        .execute_batch("CREATE TABLE contacts (name TEXT); INSERT INTO contacts VALUES ('Anna');")
        .expect("another program's table");
    drop(connection);
    let before = std::fs::read(&foreign).expect("readable");
    let output = opledger(&[
        "status",
        "--db",
        foreign.to_str().expect("utf-8"),
        "6f1c2a3e-0b1d-4c5e-9f00-112233445566",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let message = stderr(&output);
    assert!(message.contains("not an opledger ledger"), "{message}");
    assert!(!message.contains("refusing to write"), "{message}");
    assert!(message.contains("pass --db"), "{message}");
    assert_eq!(std::fs::read(&foreign).expect("readable"), before);
}

/// Records an intent that needs no approval (so it is pending at once).
fn record_pending(db: &Path) -> String {
    let output = record_with(db, r#"{"title": "Call the client"}"#, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    field(&output, "operation_id")
}

#[test]
fn refusals_name_the_command_in_the_words_users_type_not_internal_names() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ledger.db");
    let db_arg = db.to_str().expect("utf-8");
    let operation_id = record_pending(&db);
    let shown = opledger(&["status", "--db", db_arg, &operation_id]);
    let args_hash = field(&shown, "args_hash");
    let denied = opledger(&[
        "deny",
        "--db",
        db_arg,
        &operation_id,
        "--approver",
        "boss",
        "--args-hash",
        &args_hash,
        "--reason",
        "no",
    ]);
    assert_eq!(denied.status.code(), Some(3));
    assert!(
        stderr(&denied).contains("cannot deny an operation that is pending"),
        "{}",
        stderr(&denied)
    );
    let resolved = opledger(&[
        "review",
        "resolve",
        "--db",
        db_arg,
        &operation_id,
        "--reviewer",
        "anna",
        "--abandon",
        "--note",
        "not needed",
    ]);
    assert_eq!(resolved.status.code(), Some(3));
    let message = stderr(&resolved);
    assert!(
        message.contains("cannot resolve the review of"),
        "{message}"
    );
    for output in [&denied, &resolved] {
        for internal in ["deny_approval", "resolve_review"] {
            assert!(!stderr(output).contains(internal), "{}", stderr(output));
        }
    }
}

/// The one JSON object a `--json` command printed on stdout.
fn json_stdout(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("stdout is not JSON ({error}): {}", stdout(output)))
}

#[test]
fn with_json_an_error_is_a_json_object_on_stdout_and_the_exit_code_is_unchanged() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ledger.db");
    let db_arg = db.to_str().expect("utf-8");
    let missing = opledger(&[
        "status",
        "--db",
        db_arg,
        "--json",
        "6f1c2a3e-0b1d-4c5e-9f00-112233445566",
    ]);
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(json_stdout(&missing)["error"]["code"], "no_ledger");
    record_pending(&db);
    let cases: [(&[&str], i32, &str); 4] = [
        (
            &["status", "--json", "6f1c2a3e-0b1d-4c5e-9f00-112233445566"],
            3,
            "not_found",
        ),
        (&["status", "--json", "not-a-uuid"], 2, "invalid_input"),
        (
            &["ops", "list", "--json", "--state", "sleeping"],
            2,
            "invalid_input",
        ),
        (&["trace", "--json", "task-404"], 3, "not_found"),
    ];
    for (args, code, name) in cases {
        let mut all = args.to_vec();
        all.extend(["--db", db_arg]);
        let output = opledger(&all);
        assert_eq!(
            output.status.code(),
            Some(code),
            "{args:?}: {}",
            stderr(&output)
        );
        let json = json_stdout(&output);
        assert_eq!(json["error"]["code"], name, "{args:?}: {json}");
        let message = json["error"]["message"].as_str().expect("a message");
        assert!(!message.is_empty());
        assert!(
            stderr(&output).contains(message),
            "the same words on stderr"
        );
    }
    // An argument clap refuses is JSON too, with clap's exit code.
    let unparsed = opledger(&["status", "--json", "--db", db_arg]);
    assert_eq!(unparsed.status.code(), Some(2));
    let json = json_stdout(&unparsed);
    assert_eq!(json["error"]["code"], "invalid_input");
    assert!(
        json["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("<OPERATION_ID>")),
        "{json}"
    );
}

#[test]
fn record_with_json_prints_the_recorded_operation_as_json() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ledger.db");
    let redeliverable = || {
        record_with(
            &db,
            r#"{"title": "Call the client"}"#,
            &["--source-id", "toolcall-1", "--json"],
        )
    };
    let first = redeliverable();
    assert!(first.status.success(), "{}", stderr(&first));
    let first = json_stdout(&first);
    assert_eq!(first["created"], true);
    assert_eq!(first["state"], "pending");
    assert!(first["args_hash"]
        .as_str()
        .is_some_and(|hash| hash.starts_with("sha256:")));
    assert!(first["idempotency_key"].is_string());
    assert!(first["sentence"].is_string());
    let again = json_stdout(&redeliverable());
    assert_eq!(again["operation_id"], first["operation_id"], "a redelivery");
    assert_eq!(again["created"], false);
}

/// `opledger ops list` of a ledger holding one pending operation, with `RUST_LOG` set to
/// `rust_log`, `args` after the command's own, and no `NO_COLOR`.
fn ops_list_with_rust_log(rust_log: &str, args: &[&str]) -> Output {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ledger.db");
    record_pending(&db);
    Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["ops", "list", "--db", db.to_str().expect("utf-8")])
        .args(args)
        .env_remove("OPLEDGER_DB")
        .env_remove("NO_COLOR")
        .env("RUST_LOG", rust_log)
        .output()
        .expect("runs")
}

#[test]
fn logs_written_to_a_pipe_or_file_carry_no_colour_codes() {
    let output = ops_list_with_rust_log("debug", &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let logs = stderr(&output);
    assert!(logs.contains("DEBUG"), "debug logs are written: {logs}");
    assert!(!logs.contains('\u{1b}'), "no ANSI escape in: {logs:?}");
}

#[test]
fn a_rust_log_that_is_not_a_log_filter_stops_the_command_and_says_why() {
    let output = ops_list_with_rust_log("opledger=loud", &[]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let message = stderr(&output);
    assert!(
        message.contains("RUST_LOG=`opledger=loud` is not a log filter")
            && message.contains("unset RUST_LOG"),
        "{message}"
    );
    assert!(
        output.stdout.is_empty(),
        "nothing listed: {:?}",
        output.stdout
    );
}

#[test]
fn an_empty_rust_log_leaves_the_verbosity_to_dash_v() {
    let output = ops_list_with_rust_log("", &["-vv"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let logs = stderr(&output);
    assert!(
        logs.contains("DEBUG"),
        "-vv's debug logs are written: {logs}"
    );
}

#[test]
fn connectors_check_reports_every_problem_of_a_file_with_its_line_and_field() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("crm.toml");
    let text = r#"id = "my-crm"
description = "A CRM"
base_url = "ftp://crm.example"

[auth]
kind = "bearer"

[[actions]]
name = "create_task"
description = "create a task"

[actions.input]
type = "object"
properties.title = { type = "string" }

[actions.request]
method = "BREW"
path = "/tasks/{{args.titel}}"

[actions.response]
success = [201]
id = "/id"

[actions.dedup]
kind = "none"

[actions.lookup]
kind = "none"
"#;
    std::fs::write(&file, text).expect("written");
    let output = opledger(&["connectors", "check", &file.display().to_string()]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let at = |line: usize, field: &str| format!("{}:{line}: {field}: ", file.display());
    assert!(stderr.contains(&at(3, "base_url")), "{stderr}");
    assert!(
        stderr.contains(&at(17, "actions[0].request.method")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&at(18, "actions[0].request.path")),
        "{stderr}"
    );
    assert!(
        stderr.contains("names `titel`, which the input schema does not define"),
        "{stderr}"
    );

    let good = text
        .replace("ftp://", "https://")
        .replace("BREW", "POST")
        .replace("{{args.titel}}", "{{args.title}}")
        .replace(
            "type = \"object\"\n",
            "type = \"object\"\nrequired = [\"title\"]\n",
        );
    std::fs::write(&file, good).expect("written");
    let output = opledger(&["connectors", "check", &file.display().to_string()]);
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("1 connector file(s) valid"));
}

#[test]
fn connectors_show_prints_a_preset_to_copy_and_names_the_presets_for_an_unknown_one() {
    let output = opledger(&["connectors", "show", "salesforce-oauth2"]);
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("kind = \"oauth2\"") && text.contains("[probe]"),
        "{text}"
    );
    // What it prints is a document that loads as it is.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("salesforce.toml");
    std::fs::write(&file, text.as_bytes()).expect("written");
    let checked = opledger(&["connectors", "check", &file.display().to_string()]);
    assert!(checked.status.success(), "{checked:?}");
    let unknown = opledger(&["connectors", "show", "zoho"]);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("salesforce-oauth2"));
}

#[test]
fn connectors_list_names_the_presets_and_a_configurations_accounts_with_their_owners() {
    let output = opledger(&["connectors", "list", "--json"]);
    assert!(output.status.success(), "{output:?}");
    let listed: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    let presets: Vec<&str> = listed["connectors"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|row| row["preset"].as_str())
        .collect();
    assert_eq!(
        presets,
        [
            "attio",
            "crm-stand-keyed",
            "crm-stand-labelled",
            "crm-stand-plain",
            "hubspot",
            "hubspot-oauth2",
            "pipedrive",
            "salesforce",
            "salesforce-oauth2",
            "stripe",
            "zendesk",
            "zendesk-oauth2"
        ]
    );
    // Each preset action says what the ledger does after an unclear outcome, from its contract.
    let contract_of = |preset: &str, action: &str| -> String {
        listed["connectors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|row| row["preset"] == preset)
            .flat_map(|row| row["actions"].as_array().cloned().unwrap_or_default())
            .find(|row| row["name"] == action)
            .and_then(|row| row["contract"].as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    assert!(contract_of("pipedrive", "create_activity").ends_with("a person decides"));
    assert!(contract_of("salesforce", "upsert_case").starts_with("unique label"));
    assert!(contract_of("stripe", "create_customer").contains("retry with the same key"));

    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        r#"
[[tenants]]
id = "acme"
token = "acme-0123456789abcdef"

[[connectors]]
id = "crm"
preset = "crm-stand-labelled"
base_url = "http://127.0.0.1:9"

[[connectors.accounts]]
id = "acct-1"
tenants = ["acme"]
token_env = "OPLEDGER_TEST_CRM_TOKEN"
"#,
    )
    .expect("written");
    let output = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["connectors", "list", "--json", "--config"])
        .arg(&config)
        .env("OPLEDGER_TEST_CRM_TOKEN", "crm-secret-value")
        .output()
        .expect("runs");
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        !stdout.contains("crm-secret-value"),
        "never the secret: {stdout}"
    );
    let listed: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    let connector = &listed["connectors"][0];
    assert_eq!(connector["id"], "crm");
    assert_eq!(connector["accounts"][0]["tenants"][0], "acme");
    assert!(connector["accounts"][0]["credential_fingerprint"]
        .as_str()
        .is_some_and(|f| f.starts_with("sha256:")));
    assert!(
        connector["actions"][0]["contract"]
            .as_str()
            .is_some_and(|c| c.starts_with("unique label")),
        "{connector}"
    );
}

#[test]
fn the_books_connector_example_is_a_valid_connector() {
    let readme = include_str!("../docs/src/agents/connectors.md");
    let start = readme
        .find("# connectors/tasks-api.toml")
        .expect("the connectors page shows the example connector");
    let end = start
        + readme[start..]
            .find("```")
            .expect("the example's block ends");
    let document = opledger_providers::parse("tasks-api.toml", &readme[start..end])
        .unwrap_or_else(|errors| panic!("{}", opledger_providers::render_all(&errors)));
    assert_eq!(document.actions[0].description, "create a task");
}

#[test]
fn record_with_a_configuration_checks_the_intent_as_the_api_does_and_writes_nothing_when_it_fails()
{
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        r#"
[[tenants]]
id = "acme"
token = "acme-0123456789abcdef"

[[tenants]]
id = "globex"
token = "globex-0123456789abcdef"

[[connectors]]
id = "crm"
preset = "crm-stand-plain"
base_url = "http://127.0.0.1:9"

[[connectors.accounts]]
id = "acct-1"
tenants = ["acme"]
token = "crm-token"
"#,
    )
    .expect("written");
    let db = dir.path().join("ledger.db");
    let record = |tenant: &str, args: &str| {
        opledger(&[
            "record",
            "--db",
            &db.display().to_string(),
            "--config",
            &config.display().to_string(),
            "--tenant",
            tenant,
            "--provider",
            "crm",
            "--account",
            "acct-1",
            "--action",
            "create_task",
            "--args",
            args,
            "--json",
        ])
    };
    let wrong_types = record("acme", r#"{"title": 7, "due": []}"#);
    assert_eq!(wrong_types.status.code(), Some(2), "{wrong_types:?}");
    let said = stdout(&wrong_types);
    assert!(
        said.contains("args/title") && said.contains("args/due"),
        "{said}"
    );
    let not_owned = record("globex", r#"{"title": "Call"}"#);
    assert_eq!(not_owned.status.code(), Some(2), "{not_owned:?}");
    assert!(
        stdout(&not_owned).contains("that this tenant may use"),
        "{not_owned:?}"
    );
    assert!(!db.exists(), "a refused intent creates no ledger");

    let recorded = record("acme", r#"{"title": "Call"}"#);
    assert!(recorded.status.success(), "{recorded:?}");
    let json: serde_json::Value = serde_json::from_slice(&recorded.stdout).expect("json");
    let id = json["operation_id"].as_str().expect("an id");
    // The stored events (`ops show --json` is the API's operation object, which carries no
    // fingerprint).
    let shown = opledger(&["trace", id, "--db", &db.display().to_string(), "--json"]);
    use sha2::Digest;
    let digest = sha2::Sha256::digest(b"crm-token");
    let hex: String = digest
        .iter()
        .take(8)
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("json");
    assert_eq!(
        shown["events"][0]["data"]["credential_fingerprint"],
        format!("sha256:{hex}"),
        "bound to the configured account's credentials"
    );
}

#[test]
fn a_simulation_of_no_seeds_or_of_operations_beyond_the_limit_is_refused_with_the_flag_named() {
    for (args, flag) in [
        (["sim", "--seeds", "0"], "--seeds"),
        (["sim", "--ops", "0"], "--ops"),
        (["sim", "--ops", "10001"], "--ops"),
    ] {
        let output = opledger(&args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(flag),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stdout(&output).is_empty(),
            "{args:?} ran: {}",
            stdout(&output)
        );
    }
}

#[test]
fn a_short_simulation_ends_with_its_summary_line_and_exits_zero() {
    let output = opledger(&["sim", "--seeds", "3", "--ops", "5"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let summary = stdout(&output);
    assert!(
        summary
            .lines()
            .any(|line| line.starts_with("sim: seeds=3 ops=15 failed=0 faults=")),
        "{summary}"
    );
}

#[test]
fn bench_http_with_a_webhook_reports_every_operation_delivered_once_per_level() {
    let output = opledger(&[
        "bench",
        "http",
        "--webhook",
        "--one-call",
        "--operations",
        "20",
        "--concurrency",
        "1,4",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let delivered: Vec<String> = stdout(&output)
        .lines()
        .filter(|line| line.starts_with("bench=http-webhook "))
        .filter_map(|line| {
            line.split_whitespace()
                .find_map(|field| field.strip_prefix("delivered=").map(str::to_owned))
        })
        .collect();
    assert_eq!(delivered, ["20", "20"], "{}", stdout(&output));
}

#[test]
fn bench_http_refuses_a_webhook_for_a_server_it_did_not_start() {
    let output = opledger(&[
        "bench",
        "http",
        "--webhook",
        "--url",
        "http://127.0.0.1:9",
        "--token",
        "some-tenant-token",
    ]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("--webhook"), "{}", stderr(&output));
}
