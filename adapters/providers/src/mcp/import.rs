//! A starting document for an upstream, written from its `tools/list` (`opledger connectors
//! import-mcp`). It never guesses what only a person can decide: every action's contract, its
//! lookup and how its result names the object are written as `TO DECIDE: …`, which does not load,
//! so the document cannot be used until someone has decided. The server's annotations
//! (`readOnlyHint`, `idempotentHint`, `destructiveHint`) are its own claims: they are shown as
//! comments beside each tool, never taken as a contract.

use std::fmt::Write as _;

use serde_json::Value;

use super::connector::UpstreamTool;
use super::spec::Upstream;
use crate::document::MAX_DESCRIPTION_CHARS;
use crate::http::shorten;

/// The document for the upstream `id`, reached as `upstream`, whose tools are `tools`.
pub fn starting_document(id: &str, upstream: &Upstream, tools: &[UpstreamTool]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Written by `opledger connectors import-mcp` from the upstream's tools/list."
    );
    let _ = writeln!(
        out,
        "# Every `TO DECIDE` is for a person: the document does not load until each is decided."
    );
    let _ = writeln!(
        out,
        "# The annotations shown beside each tool are the server's own claims, not a contract."
    );
    let _ = writeln!(out, "id = {}", quoted(id));
    let _ = writeln!(
        out,
        "description = \"TO DECIDE: one line saying what this upstream is\""
    );
    let _ = writeln!(out, "transport = \"mcp\"");
    let read_only: Vec<&UpstreamTool> = tools
        .iter()
        .filter(|tool| hint(tool, "readOnlyHint") == Some(true))
        .collect();
    if !read_only.is_empty() {
        let names: Vec<String> = read_only.iter().map(|tool| quoted(&tool.name)).collect();
        let _ = writeln!(out, "# Tools the server marks readOnlyHint; pass through only those that really change nothing:");
        let _ = writeln!(out, "# read_only = [{}]", names.join(", "));
    }
    out.push_str("\n[upstream]\n");
    match upstream {
        Upstream::Stdio { command, args, .. } => {
            let _ = writeln!(out, "command = {}", quoted(command));
            let args: Vec<String> = args.iter().map(|arg| quoted(arg)).collect();
            let _ = writeln!(out, "args = [{}]", args.join(", "));
        }
        Upstream::Http { url, ca_file, .. } => {
            let _ = writeln!(out, "url = {}", quoted(url));
            if let Some(path) = ca_file {
                let _ = writeln!(out, "ca_file = {}", quoted(path));
            }
        }
    }
    out.push_str("\n[[accounts]]\nid = \"main\"\ntenants = [\"TO DECIDE: the tenants that may use this upstream\"]\n");
    for tool in tools
        .iter()
        .filter(|tool| hint(tool, "readOnlyHint") != Some(true))
    {
        action(&mut out, tool);
    }
    out
}

fn action(out: &mut String, tool: &UpstreamTool) {
    let hints: Vec<String> = [
        "readOnlyHint",
        "idempotentHint",
        "destructiveHint",
        "openWorldHint",
    ]
    .iter()
    .filter_map(|name| hint(tool, name).map(|value| format!("{name}={value}")))
    .collect();
    out.push_str("\n[[actions]]\n");
    if !hints.is_empty() {
        let _ = writeln!(out, "# the server says: {}", hints.join(" "));
    }
    let _ = writeln!(out, "name = {}", quoted(&snake(&tool.name)));
    let description = tool.description.lines().next().unwrap_or("").trim();
    let description = if description.is_empty() {
        "TO DECIDE: what it does, in one line"
    } else {
        description
    };
    let _ = writeln!(
        out,
        "description = {}",
        quoted(&shorten(description, MAX_DESCRIPTION_CHARS - 1))
    );
    let _ = writeln!(
        out,
        "destructive = {}",
        hint(tool, "destructiveHint").unwrap_or(false)
    );
    let _ = writeln!(out, "tool = {}", quoted(&tool.name));
    let _ = writeln!(out, "input = {}", inline(&tool.input_schema));
    out.push_str("result = { id_pattern = \"TO DECIDE: where the result names the object, or write id_at or id\" }\n");
    out.push_str("dedup = { kind = \"TO DECIDE: idempotency_argument, label_argument, naturally_idempotent or none\" }\n");
    out.push_str("lookup = { kind = \"TO DECIDE: tool (another tool and a pattern holding {{label}}) or none\" }\n");
}

fn hint(tool: &UpstreamTool, name: &str) -> Option<bool> {
    tool.annotations.get(name).and_then(Value::as_bool)
}

/// An action name from a tool name: lower case, `_` for anything else, starting with a letter.
fn snake(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|char| {
            if char.is_ascii_alphanumeric() {
                char.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if !out.starts_with(|char: char| char.is_ascii_lowercase()) {
        out.insert_str(0, "tool_");
    }
    out
}

fn quoted(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

/// A JSON value as a TOML inline value (`null`s are left out: TOML has none).
fn inline(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let entries: Vec<String> = map
                .iter()
                .filter(|(_, value)| !value.is_null())
                .map(|(key, value)| format!("{} = {}", quoted(key), inline(value)))
                .collect();
            format!("{{ {} }}", entries.join(", "))
        }
        Value::Array(items) => {
            let items: Vec<String> = items
                .iter()
                .filter(|item| !item.is_null())
                .map(inline)
                .collect();
            format!("[{}]", items.join(", "))
        }
        Value::String(text) => quoted(text),
        Value::Null => "\"\"".to_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::parse_any;
    use serde_json::json;

    fn git_commit() -> UpstreamTool {
        UpstreamTool {
            name: "git_commit".to_owned(),
            description: "Records changes to the repository".to_owned(),
            input_schema: json!({"type": "object", "required": ["repo_path", "message"], "properties": {"repo_path": {"type": "string"}, "message": {"type": "string", "default": null}}}),
            annotations: json!({"readOnlyHint": false, "idempotentHint": false, "destructiveHint": false}),
        }
    }

    fn git_log() -> UpstreamTool {
        UpstreamTool {
            name: "git_log".to_owned(),
            description: "Shows the commit logs".to_owned(),
            input_schema: json!({"type": "object"}),
            annotations: json!({"readOnlyHint": true}),
        }
    }

    #[test]
    fn the_starting_document_marks_every_decision_and_does_not_load_until_they_are_made() {
        let upstream = Upstream::Stdio {
            command: "mcp-server-git".to_owned(),
            args: vec!["--repository".to_owned(), "repo".to_owned()],
            env_from: Vec::new(),
            cwd: None,
        };
        let text = starting_document("git", &upstream, &[git_commit(), git_log()]);
        assert!(text.contains("# read_only = [\"git_log\"]"), "{text}");
        assert!(
            text.contains(
                "# the server says: readOnlyHint=false idempotentHint=false destructiveHint=false"
            ),
            "{text}"
        );
        let errors = parse_any("git.toml", &text).expect_err("undecided");
        let fields: Vec<&str> = errors.iter().map(|error| error.field.as_str()).collect();
        for undecided in [
            "actions[0].result",
            "actions[0].dedup.kind",
            "actions[0].lookup.kind",
        ] {
            assert!(
                fields.iter().any(|field| field.starts_with(undecided)),
                "{undecided} in {fields:?}"
            );
        }
        let decided = text
            .replace(
                "TO DECIDE: one line saying what this upstream is",
                "A repository",
            )
            .replace("TO DECIDE: the tenants that may use this upstream", "acme")
            .replace(
                "TO DECIDE: where the result names the object, or write id_at or id",
                "hash ([0-9a-f]{40})",
            )
            .replace(
                "TO DECIDE: idempotency_argument, label_argument, naturally_idempotent or none",
                "none",
            )
            .replace(
                "TO DECIDE: tool (another tool and a pattern holding {{label}}) or none",
                "none",
            );
        parse_any("git.toml", &decided)
            .unwrap_or_else(|errors| panic!("{}", crate::render_all(&errors)));
    }
}
