//! The current line of the official MCP Python SDK (`mcp` 2.x) as an agent's client of the
//! gateway of the book's page. The other tests' Python environment holds the 1.x line, which the
//! reference servers require; an agent written today gets 2.x, whose client checks every answer
//! against the tool's `outputSchema` and raises when it does not conform. Over Streamable HTTP,
//! with the tenant's token: the commit called twice with one request id answers the same
//! operation, checked by that client both times, and the repository holds one commit.

use std::process::Command;

use serde_json::Value;

use super::book::Page;
use super::python::python_venv::{python_with, run};

/// The current SDK line, in an environment of its own.
const REQUIREMENTS: &[&str] = &["mcp>=2.3,<3"];

/// The agent: lists the tools, calls the commit twice with one request id, and prints what it
/// saw as JSON. `call_tool` raises when an answer does not conform to the tool's `outputSchema`.
const AGENT: &str = r#"
import asyncio
import json
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main(url, token):
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = await session.list_tools()
                commit = next(tool for tool in tools.tools if tool.name == "git__commit")
                call = {"message": "Add the client call", "request_id": "current-sdk-1"}
                answers = [await session.call_tool(commit.name, call) for _ in range(2)]
                print(json.dumps({
                    "output_schema": commit.output_schema,
                    "answers": [
                        {"is_error": answer.is_error, "structured": answer.structured_content}
                        for answer in answers
                    ],
                }))


asyncio.run(main(sys.argv[1], sys.argv[2]))
"#;

#[test]
fn the_current_python_sdks_client_checks_the_gateways_answers_and_a_repeated_commit_makes_one_commit(
) {
    let python = python_with("mcp-client-current", REQUIREMENTS);
    let page = Page::start();
    let script = page.dir.path().join("current_agent.py");
    std::fs::write(&script, AGENT).expect("the agent's script");

    let printed = run(
        Command::new(&python)
            .arg(&script)
            .arg(format!("http://127.0.0.1:{}/mcp", page.port))
            .arg("acme-secret-token")
            .current_dir(page.dir.path()),
        "the agent on the current SDK",
    );
    let json = printed
        .lines()
        .find(|line| line.starts_with('{'))
        .unwrap_or_else(|| panic!("the agent prints its JSON:\n{printed}"));
    let seen: Value = serde_json::from_str(json).expect("the agent's JSON");

    assert!(
        seen["output_schema"]["properties"]["state"].is_object(),
        "the tool declares the answer's shape, which the client checked: {seen:#}"
    );
    let answers = seen["answers"].as_array().expect("two answers");
    for answer in answers {
        assert_eq!(answer["is_error"], false, "{seen:#}");
        assert_eq!(answer["structured"]["state"], "succeeded", "{seen:#}");
    }
    assert_eq!(answers[0]["structured"]["created"], true, "{seen:#}");
    assert_eq!(answers[1]["structured"]["created"], false, "{seen:#}");
    let hash = answers[0]["structured"]["external_id"]
        .as_str()
        .expect("the commit's hash");
    assert_eq!(
        answers[1]["structured"]["external_id"], hash,
        "the repeat found the same operation"
    );
    let commits = page.commits();
    assert_eq!(commits.lines().count(), 1, "one commit:\n{commits}");
    assert!(commits.starts_with(hash), "{commits}");
}
