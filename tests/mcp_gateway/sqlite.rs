//! `mcp-server-sqlite`, the reference SQLite server: `write_query` with an INSERT makes a row
//! each time it is called, so a repeat is the duplicate the ledger exists to prevent;
//! `read_query` finds a row by its label column.

use opledger_domain::state::Status;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::json;

use super::support::{here, listed, python_text, quoted, server_args, succeeded_with, Gateway};

/// `notes` keeps labels without a constraint (a contract of `none`); `keyed_notes` refuses a
/// second row with one (a `label_argument` contract).
const SCHEMA: &str = "CREATE TABLE notes (id INTEGER PRIMARY KEY, label TEXT, body TEXT);
     CREATE TABLE keyed_notes (id INTEGER PRIMARY KEY, label TEXT UNIQUE, body TEXT);";

fn document(db: &str) -> String {
    format!(
        r#"
id = "upstream"
description = "A notes database, through mcp-server-sqlite"
transport = "mcp"
call_timeout_ms = 5000
start_timeout_ms = 15000
restart_wait_ms = 0
read_only = ["read_query", "list_tables"]

[upstream]
command = {python}
args = [{relay}, {python}, {server}, "--db-path", {db}]
env_from = {{ OPLEDGER_FAULT_FILE = "TEST_FAULT_FILE" }}

[[accounts]]
id = "main"
tenants = ["acme"]

[[errors]]
contains = "UNIQUE constraint failed"
means = "uncertain"

[[actions]]
name = "add_note"
description = "add a note"
tool = "write_query"
input = {{ type = "object", required = ["body"], additionalProperties = false, properties.body = {{ type = "string", pattern = "^[^']*$" }} }}
arguments = {{ query = "INSERT INTO notes (label, body) VALUES ('{{{{label}}}}', '{{{{args.body}}}}')" }}
result = {{ success_pattern = "'affected_rows': 1\\b", id = "{{{{label}}}}" }}
dedup = {{ kind = "none" }}

[actions.lookup]
kind = "tool"
tool = "read_query"
arguments = {{ query = "SELECT label FROM notes WHERE label = '{{{{label}}}}'" }}
found = "'label': '({{{{label}}}})'"
consistent = true

[[actions]]
name = "add_keyed_note"
description = "add a note, at most one per label"
tool = "write_query"
input = {{ type = "object", required = ["body"], additionalProperties = false, properties.body = {{ type = "string", pattern = "^[^']*$" }} }}
arguments = {{ query = "INSERT INTO keyed_notes (label, body) VALUES ('{{{{label}}}}', '{{{{args.body}}}}')" }}
result = {{ success_pattern = "'affected_rows': 1\\b", id = "{{{{label}}}}" }}
dedup = {{ kind = "label_argument", argument = "query" }}

[actions.lookup]
kind = "tool"
tool = "read_query"
arguments = {{ query = "SELECT label FROM keyed_notes WHERE label = '{{{{label}}}}'" }}
found = "'label': '({{{{label}}}})'"
consistent = true
"#,
        python = quoted(&python_text()),
        relay = quoted(&here("relay.py")),
        server = listed(&server_args("mcp_server_sqlite")),
        db = quoted(db),
    )
}

struct Notes {
    gateway: Gateway,
    db: std::path::PathBuf,
}

impl Notes {
    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let db = dir.path().join("notes.db");
        rusqlite::Connection::open(&db)
            .and_then(|connection| connection.execute_batch(SCHEMA))
            .expect("the notes database is made");
        let text = document(db.to_str().expect("a UTF-8 path"));
        Self {
            gateway: Gateway::start(dir, &text).await,
            db,
        }
    }

    /// How many rows of `table` carry `label`.
    fn labelled(&self, table: &str, label: &str) -> usize {
        self.rows(table)
            .iter()
            .filter(|(carried, _)| carried == label)
            .count()
    }

    fn rows(&self, table: &str) -> Vec<(String, String)> {
        let connection = rusqlite::Connection::open(&self.db).expect("the database opens");
        let mut statement = connection
            .prepare(&format!("SELECT label, body FROM {table} ORDER BY id"))
            .expect("a query");
        statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .expect("rows")
            .collect::<Result<_, _>>()
            .expect("rows read")
    }
}

#[tokio::test]
async fn an_insert_repeated_at_the_server_makes_two_rows_and_a_retried_call_through_the_gateway_one(
) {
    let notes = Notes::start().await;
    let direct = direct_client(&notes.db).await;
    for _ in 0..2 {
        let answer = direct
            .call_tool(
                CallToolRequestParams::new("write_query").with_arguments(
                    json!({"query": "INSERT INTO notes (label, body) VALUES ('by-hand', 'Call the client')"})
                        .as_object()
                        .expect("an object")
                        .clone(),
                ),
            )
            .await
            .expect("the server answers");
        assert_ne!(answer.is_error, Some(true), "{answer:?}");
    }
    direct.cancel().await.expect("the direct session ends");
    assert_eq!(notes.rows("notes").len(), 2, "the server itself duplicates");

    let call = json!({"body": "Call the client"});
    let first = notes
        .gateway
        .record("add_note", call.clone(), "call-1")
        .await;
    let label = succeeded_with(&notes.gateway.settle(first).await);
    let again = notes.gateway.record("add_note", call, "call-1").await;
    assert_eq!(again, first, "the agent's retry finds the same operation");
    assert_eq!(succeeded_with(&notes.gateway.settle(again).await), label);
    assert_eq!(
        notes.labelled("notes", &label),
        1,
        "one row for the operation: {:?}",
        notes.rows("notes")
    );
}

#[tokio::test]
async fn killed_after_the_insert_the_call_is_unknown_and_the_lookup_finds_the_row() {
    let notes = Notes::start().await;
    notes.gateway.arm("kill_after write_query");
    let operation = notes
        .gateway
        .record("add_note", json!({"body": "Call the client"}), "call-1")
        .await;
    let label = succeeded_with(&notes.gateway.settle(operation).await);
    assert_eq!(notes.gateway.fired(), ["kill_after write_query"]);
    assert_eq!(
        notes.labelled("notes", &label),
        1,
        "{:?}",
        notes.rows("notes")
    );
    let events = notes.gateway.events(operation).await;
    assert_eq!(
        events,
        [
            "IntentRecorded",
            "AttemptStarted",
            "OutcomeUnknown",
            "LookupClaimed",
            "ReconciliationRecorded"
        ],
        "one attempt, then the lookup's evidence"
    );
    assert_eq!(
        notes.gateway.connector().session_starts(),
        2,
        "restarted for the lookup"
    );
}

#[tokio::test]
async fn killed_before_the_insert_a_label_contract_retries_and_makes_one_row() {
    let notes = Notes::start().await;
    notes.gateway.arm("kill_before write_query");
    let operation = notes
        .gateway
        .record(
            "add_keyed_note",
            json!({"body": "Call the client"}),
            "call-1",
        )
        .await;
    let label = succeeded_with(&notes.gateway.settle(operation).await);
    assert_eq!(notes.gateway.fired(), ["kill_before write_query"]);
    assert_eq!(notes.labelled("keyed_notes", &label), 1);
    let attempts = notes
        .gateway
        .events(operation)
        .await
        .into_iter()
        .filter(|name| *name == "AttemptStarted")
        .count();
    assert_eq!(attempts, 2, "looked up, found nothing, retried once");
}

#[tokio::test]
async fn killed_before_the_insert_with_no_contract_goes_to_a_person_and_nothing_is_repeated() {
    let notes = Notes::start().await;
    notes.gateway.arm("kill_before write_query");
    let operation = notes
        .gateway
        .record("add_note", json!({"body": "Call the client"}), "call-1")
        .await;
    let state = notes.gateway.settle(operation).await;
    assert_eq!(state.status, Status::NeedsReview, "{state:?}");
    assert_eq!(notes.rows("notes"), [], "never sent again");
    let attempts = notes
        .gateway
        .events(operation)
        .await
        .into_iter()
        .filter(|name| *name == "AttemptStarted")
        .count();
    assert_eq!(attempts, 1);
}

/// A session straight to the server, without the gateway (as an agent without opledger has).
async fn direct_client(
    db: &std::path::Path,
) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    let mut command = tokio::process::Command::new(python_text());
    command
        .args(server_args("mcp_server_sqlite"))
        .arg("--db-path")
        .arg(db);
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the server starts");
    ().serve(transport).await.expect("the session starts")
}
