//! The MCP Inspector's CLI (`@modelcontextprotocol/inspector`, npm), an MCP client nobody here
//! wrote, pointed at the gateway of the book's page instead of at `mcp-server-git`: it lists the
//! gateway's tools, calls the commit twice with one request id and gets one commit, and reads the
//! log through the read-only tool, which the ledger does not record.

use std::path::Path;

use serde_json::Value;

use super::book::Page;

const TOKEN_HEADER: &str = "Authorization: Bearer acme-secret-token";

fn inspector() -> String {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_gateway/inspector");
    let place = super::npm::installed(
        &source,
        "mcp-inspector",
        &[
            ".bin/mcp-inspector",
            "@modelcontextprotocol/inspector-cli/build/cli.js",
        ],
        "@modelcontextprotocol/inspector",
    );
    place
        .join("node_modules/.bin/mcp-inspector")
        .to_str()
        .expect("a UTF-8 path")
        .to_owned()
}

/// Runs the Inspector's CLI against the page's `/mcp` with `method` and `more` flags; its JSON.
fn inspect(page: &Page, inspector: &str, method: &str, more: &[&str]) -> Value {
    let url = format!("http://127.0.0.1:{}/mcp", page.port);
    let mut flags = vec![
        "--cli",
        url.as_str(),
        "--transport",
        "http",
        "--header",
        TOKEN_HEADER,
        "--method",
        method,
    ];
    flags.extend_from_slice(more);
    let quoted: Vec<String> = flags
        .iter()
        .map(|flag| format!("'{}'", flag.replace('\'', r"'\''")))
        .collect();
    let printed = page.run(
        &format!("mcp-inspector {method}"),
        &format!("'{inspector}' {}", quoted.join(" ")),
    );
    let json = &printed[printed.find('{').unwrap_or(0)..];
    serde_json::from_str(json)
        .unwrap_or_else(|error| panic!("the Inspector prints JSON ({error}):\n{printed}"))
}

#[test]
fn the_inspector_cli_lists_the_gateways_tools_and_a_repeated_commit_makes_one_commit() {
    let inspector = inspector();
    let page = Page::start();

    let listed = inspect(&page, &inspector, "tools/list", &[]);
    let tools = listed["tools"].as_array().expect("a tool list");
    let named = |name: &str| {
        tools
            .iter()
            .find(|tool| tool["name"] == name)
            .unwrap_or_else(|| panic!("no tool {name} in {listed:#}"))
    };
    assert_eq!(named("git__commit")["annotations"]["readOnlyHint"], false);
    assert_eq!(named("git__git_log")["annotations"]["readOnlyHint"], true);
    assert!(
        tools
            .iter()
            .all(|tool| tool["name"] != "git__git_commit" && tool["name"] != "git__git_reset"),
        "a tool neither an action nor declared read-only is never listed: {listed:#}"
    );

    let commit = [
        "--tool-name",
        "git__commit",
        "--tool-arg",
        "message=Add the client call",
        "--tool-arg",
        "request_id=inspector-1",
    ];
    let first = inspect(&page, &inspector, "tools/call", &commit);
    let again = inspect(&page, &inspector, "tools/call", &commit);
    assert_eq!(
        first["structuredContent"]["state"], "succeeded",
        "{first:#}"
    );
    assert_eq!(first["structuredContent"]["created"], true, "{first:#}");
    assert_eq!(again["structuredContent"]["created"], false, "{again:#}");
    assert_eq!(
        again["structuredContent"]["external_id"], first["structuredContent"]["external_id"],
        "the repeat found the same operation"
    );
    let hash = first["structuredContent"]["external_id"]
        .as_str()
        .expect("the commit's hash")
        .to_owned();
    let commits = page.commits();
    assert_eq!(commits.lines().count(), 1, "one commit:\n{commits}");
    assert!(commits.starts_with(&hash), "{commits}");

    let log = inspect(
        &page,
        &inspector,
        "tools/call",
        &[
            "--tool-name",
            "git__git_log",
            "--tool-arg",
            "repo_path=repo",
            "--tool-arg",
            "max_count=1",
        ],
    );
    assert!(
        log["content"][0]["text"]
            .as_str()
            .is_some_and(|text| text.contains(&hash)),
        "the read-only tool answers with the upstream's log: {log:#}"
    );
    let operations = page.run("ops list", "opledger ops list --db opledger.db");
    assert!(
        operations.contains("\n1 operation(s)"),
        "the ledger holds the commit and nothing for the read-only call:\n{operations}"
    );
}
