//! `@modelcontextprotocol/server-filesystem`, the reference file server (npm): `write_file`
//! writes a whole file, so a repeat has no further effect — the one contract under which the
//! gateway may retry without looking first.

use std::path::Path;

use serde_json::json;

use super::support::{here, python_text, quoted, succeeded_with, Gateway};

fn server() -> String {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_gateway/filesystem");
    let place = super::npm::installed(
        &source,
        "mcp-server-filesystem",
        &["@modelcontextprotocol/server-filesystem/dist/index.js"],
        "@modelcontextprotocol/server-filesystem",
    );
    place
        .join("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js")
        .to_str()
        .expect("a UTF-8 path")
        .to_owned()
}

fn document(root: &str) -> String {
    format!(
        r#"
id = "upstream"
description = "A folder of notes, through the filesystem MCP server"
transport = "mcp"
call_timeout_ms = 5000
start_timeout_ms = 15000
restart_wait_ms = 0
read_only = ["read_text_file", "list_directory"]

[upstream]
command = {python}
args = [{relay}, "node", {server}, {root}]
env_from = {{ OPLEDGER_FAULT_FILE = "TEST_FAULT_FILE" }}

[[accounts]]
id = "main"
tenants = ["acme"]

[[actions]]
name = "write_note"
description = "write a note file"
tool = "write_file"
input = {{ type = "object", required = ["path", "content"], additionalProperties = false, properties.path = {{ type = "string" }}, properties.content = {{ type = "string" }} }}
result = {{ success_pattern = "^Successfully wrote to ", id = "{{{{args.path}}}}" }}
dedup = {{ kind = "naturally_idempotent" }}
lookup = {{ kind = "none" }}
"#,
        python = quoted(&python_text()),
        relay = quoted(&here("relay.py")),
        server = quoted(&server()),
        root = quoted(root),
    )
}

struct Folder {
    gateway: Gateway,
    root: std::path::PathBuf,
}

impl Folder {
    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::create_dir(dir.path().join("notes")).expect("the notes folder");
        // The server compares real paths (a temporary folder may sit behind a symbolic link).
        let root = dir
            .path()
            .join("notes")
            .canonicalize()
            .expect("a real path");
        let text = document(root.to_str().expect("a UTF-8 path"));
        Self {
            gateway: Gateway::start(dir, &text).await,
            root,
        }
    }

    fn note(&self) -> String {
        self.root
            .join("client.md")
            .to_str()
            .expect("UTF-8")
            .to_owned()
    }
}

#[tokio::test]
async fn a_retried_write_leaves_one_file_with_its_content() {
    let folder = Folder::start().await;
    let call = json!({"path": folder.note(), "content": "Call the client tomorrow\n"});
    let first = folder
        .gateway
        .record("write_note", call.clone(), "call-1")
        .await;
    assert_eq!(
        succeeded_with(&folder.gateway.settle(first).await),
        folder.note()
    );
    let again = folder.gateway.record("write_note", call, "call-1").await;
    assert_eq!(again, first);
    folder.gateway.settle(again).await;
    assert_eq!(
        std::fs::read_to_string(folder.note()).expect("the note"),
        "Call the client tomorrow\n"
    );
    assert_eq!(
        std::fs::read_dir(&folder.root).expect("the folder").count(),
        1
    );
}

#[tokio::test]
async fn killed_after_the_write_the_unknown_call_is_retried_and_the_file_is_the_same() {
    let folder = Folder::start().await;
    folder.gateway.arm("kill_after write_file");
    let call = json!({"path": folder.note(), "content": "Call the client tomorrow\n"});
    let operation = folder.gateway.record("write_note", call, "call-1").await;
    assert_eq!(
        succeeded_with(&folder.gateway.settle(operation).await),
        folder.note()
    );
    assert_eq!(folder.gateway.fired(), ["kill_after write_file"]);
    let events = folder.gateway.events(operation).await;
    assert!(events.contains(&"OutcomeUnknown"), "{events:?}");
    assert_eq!(
        events
            .iter()
            .filter(|name| **name == "AttemptStarted")
            .count(),
        2
    );
    assert_eq!(
        std::fs::read_to_string(folder.note()).expect("the note"),
        "Call the client tomorrow\n"
    );
}

#[tokio::test]
async fn killed_before_the_write_the_call_is_retried_and_writes_the_file() {
    let folder = Folder::start().await;
    folder.gateway.arm("kill_before write_file");
    let call = json!({"path": folder.note(), "content": "Call the client tomorrow\n"});
    let operation = folder.gateway.record("write_note", call, "call-1").await;
    assert_eq!(
        succeeded_with(&folder.gateway.settle(operation).await),
        folder.note()
    );
    assert_eq!(folder.gateway.fired(), ["kill_before write_file"]);
    assert_eq!(
        std::fs::read_to_string(folder.note()).expect("the note"),
        "Call the client tomorrow\n"
    );
}
