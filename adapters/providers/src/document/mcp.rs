//! Reading an MCP connector document (`transport = "mcp"`): the upstream, the accounts, and each
//! action as an upstream tool with its contract. The format is in [`crate::mcp`]; the checks
//! and their messages follow the REST documents' (every problem, with its line and field).

use std::collections::BTreeSet;

use opledger_domain::ids::AccountId;

use super::action::{action_name, input_schema, required_table, retention, tree_of, Names, Scope};
use super::read::{description, one_line, pointer, provider_id, tenants};
use super::tree::{Found, Table};
use super::{Means, MAX_ACCOUNTS_PER_CONNECTOR, MAX_ACTIONS_PER_CONNECTOR};
use crate::error::Findings;
use crate::mcp::spec::{
    IdRule, McpAccount, McpAction, McpDedup, McpDocument, McpLookup, ResultSpec, TextRule,
    ToolLookup, Upstream, UpstreamLogin, UpstreamOAuth,
};
use crate::mcp::{
    DEFAULT_CALL_TIMEOUT_MS, DEFAULT_RESTART_WAIT_MS, DEFAULT_START_TIMEOUT_MS,
    MAX_ERROR_TEXT_RULES, MAX_READ_ONLY_TOOLS, MAX_RESTART_WAIT_MS, MAX_SESSIONS_PER_UPSTREAM,
    MAX_UPSTREAM_ARGS, MAX_UPSTREAM_TIMEOUT_MS,
};
use crate::template::{Ref, Tree};

const TOP_KEYS: &[&str] = &[
    "id",
    "description",
    "transport",
    "call_timeout_ms",
    "start_timeout_ms",
    "restart_wait_ms",
    "sessions",
    "upstream",
    "accounts",
    "actions",
    "read_only",
    "errors",
];
const ACTION_KEYS: &[&str] = &[
    "name",
    "description",
    "destructive",
    "input",
    "tool",
    "arguments_base",
    "arguments",
    "result",
    "dedup",
    "lookup",
];

/// A label of the right shape, to check that a lookup's pattern compiles once it is filled in.
const SAMPLE_LABEL: &str = "opl-00000000-0000-0000-0000-000000000000";

/// Reads the whole MCP document at `top` (its `transport` already seen to be `"mcp"`).
pub(super) fn document(
    name: &str,
    top: &Table<'_>,
    findings: &mut Findings<'_>,
) -> Option<McpDocument> {
    top.only(TOP_KEYS, findings);
    let id = provider_id(top, findings);
    let description = description(top, findings);
    let call_timeout_ms = timeout(top, "call_timeout_ms", DEFAULT_CALL_TIMEOUT_MS, findings);
    let start_timeout_ms = timeout(top, "start_timeout_ms", DEFAULT_START_TIMEOUT_MS, findings);
    let restart_wait_ms = bounded(
        top,
        "restart_wait_ms",
        (0, MAX_RESTART_WAIT_MS),
        DEFAULT_RESTART_WAIT_MS,
        findings,
    );
    let sessions = bounded(
        top,
        "sessions",
        (1, MAX_SESSIONS_PER_UPSTREAM as u64),
        1,
        findings,
    );
    let upstream = required_table(
        top,
        "upstream",
        "add [upstream] with command = \"…\" (stdio) or url = \"http://…\" (Streamable HTTP)",
        findings,
    )
    .and_then(|table| upstream(&table, findings));
    let accounts = accounts(top, findings);
    let actions = actions(top, findings);
    let read_only = read_only(top, &actions, findings);
    let errors = error_rules(top, findings);
    Some(McpDocument {
        name: name.to_owned(),
        id: id?,
        description: description?,
        upstream: upstream?,
        call_timeout_ms,
        start_timeout_ms,
        restart_wait_ms,
        sessions: usize::try_from(sessions).unwrap_or(1),
        accounts,
        actions,
        read_only,
        errors,
    })
}

fn timeout(top: &Table<'_>, key: &str, default: u64, findings: &mut Findings<'_>) -> u64 {
    bounded(top, key, (1, MAX_UPSTREAM_TIMEOUT_MS), default, findings)
}

fn bounded(
    top: &Table<'_>,
    key: &str,
    (low, high): (u64, u64),
    default: u64,
    findings: &mut Findings<'_>,
) -> u64 {
    match top.unsigned(key, findings) {
        Some(found) if (low..=high).contains(&found.value) => found.value,
        Some(found) => {
            findings.add(
                Some(found.span),
                &found.field,
                format!("is {}; write {low} to {high}", found.value),
            );
            default
        }
        None => default,
    }
}

fn upstream(table: &Table<'_>, findings: &mut Findings<'_>) -> Option<Upstream> {
    match (table.has("command"), table.has("url")) {
        (true, false) => {
            table.only(&["command", "args", "env_from", "cwd"], findings);
            let command = table.string("command", findings).and_then(|found| {
                if found.value.trim().is_empty() {
                    findings.add(Some(found.span), &found.field, "is empty; write the program that starts the MCP server, e.g. command = \"uvx\"");
                    return None;
                }
                Some(found.value.to_owned())
            });
            let args: Vec<String> = table
                .strings("args", findings)
                .unwrap_or_default()
                .iter()
                .map(|found| found.value.to_owned())
                .collect();
            if args.len() > MAX_UPSTREAM_ARGS {
                findings.add(
                    table.get("args").map(|node| &node.span),
                    &table.field("args"),
                    format!(
                        "lists {} arguments; at most {MAX_UPSTREAM_ARGS}",
                        args.len()
                    ),
                );
            }
            let env_from = variables(table, "env_from", findings);
            let cwd = table
                .string("cwd", findings)
                .map(|found| found.value.to_owned());
            Some(Upstream::Stdio {
                command: command?,
                args,
                env_from,
                cwd,
            })
        }
        (false, true) => {
            table.only(
                &["url", "headers_from", "ca_file", "oauth", "login"],
                findings,
            );
            let url = table.string("url", findings).and_then(|found| {
                let value = found.value;
                if !(value.starts_with("http://") || value.starts_with("https://")) {
                    findings.add(Some(found.span), &found.field, format!("`{value}` is no http:// or https:// URL; write the upstream's MCP endpoint, e.g. url = \"http://127.0.0.1:8000/mcp\""));
                    return None;
                }
                Some(value.to_owned())
            });
            let headers_from = variables(table, "headers_from", findings);
            let ca_file = table.string("ca_file", findings).and_then(|found| {
                if url.as_deref().is_some_and(|url| url.starts_with("http://")) {
                    findings.add(Some(found.span), &found.field, "trusts a CA for an https:// URL, and the url is http://; remove ca_file or write the upstream's https:// URL".to_owned());
                    return None;
                }
                Some(found.value.to_owned())
            });
            let oauth = table
                .table("oauth", findings)
                .and_then(|oauth| upstream_oauth(&oauth, &headers_from, findings));
            let login = table
                .table("login", findings)
                .and_then(|login| upstream_login(&login, &headers_from, oauth.is_some(), findings));
            Some(Upstream::Http {
                url: url?,
                headers_from,
                ca_file,
                oauth,
                login,
            })
        }
        (both, _) => {
            findings.add(
                Some(table.span()),
                table.path(),
                if both {
                    "names both command and url; an upstream is a child process (command) or an HTTP endpoint (url), not both"
                } else {
                    "names neither command nor url; write command = \"…\" (stdio) or url = \"http://…\" (Streamable HTTP)"
                },
            );
            None
        }
    }
}

/// A table of `NAME = "ENV_VARIABLE"`: values are read from the environment when the connector
/// is built, never written in the file.
fn variables(table: &Table<'_>, key: &str, findings: &mut Findings<'_>) -> Vec<(String, String)> {
    let Some(inner) = table.table(key, findings) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (name, _) in inner.entries() {
        if let Some(found) = inner.string(name, findings) {
            let valid = !found.value.is_empty()
                && found
                    .value
                    .bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_');
            if valid {
                out.push((name.clone(), found.value.to_owned()));
            } else {
                findings.add(Some(found.span), &found.field, format!("`{}` is no environment variable name; write the variable the value is read from (the value itself never goes in this file)", found.value));
            }
        }
    }
    out
}

fn accounts(top: &Table<'_>, findings: &mut Findings<'_>) -> Vec<McpAccount> {
    let tables = top.tables("accounts", findings);
    if tables.len() > MAX_ACCOUNTS_PER_CONNECTOR {
        findings.add(
            None,
            "accounts",
            format!(
                "lists {} accounts; at most {MAX_ACCOUNTS_PER_CONNECTOR}",
                tables.len()
            ),
        );
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for table in tables.iter().take(MAX_ACCOUNTS_PER_CONNECTOR) {
        table.only(&["id", "tenants"], findings);
        let id = table
            .required_string("id", "write the account's id, e.g. id = \"main\"", findings)
            .and_then(|found| {
                AccountId::new(found.value)
                    .map_err(|error| findings.add(Some(found.span), &found.field, error.message))
                    .ok()
                    .map(|id| (id, found))
            });
        let owners = tenants(table, findings);
        if let (Some((id, found)), Some(owners)) = (id, owners) {
            if !seen.insert(id.clone()) {
                findings.add(
                    Some(found.span),
                    &found.field,
                    format!("account `{id}` is listed twice"),
                );
                continue;
            }
            out.push(McpAccount {
                id,
                tenants: owners,
            });
        }
    }
    out
}

fn actions(top: &Table<'_>, findings: &mut Findings<'_>) -> Vec<McpAction> {
    let tables = top.tables("actions", findings);
    if tables.len() > MAX_ACTIONS_PER_CONNECTOR {
        findings.add(
            None,
            "actions",
            format!(
                "lists {} actions; at most {MAX_ACTIONS_PER_CONNECTOR}",
                tables.len()
            ),
        );
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for table in tables.iter().take(MAX_ACTIONS_PER_CONNECTOR) {
        if let Some(action) = action(table, findings) {
            if !seen.insert(action.name.clone()) {
                findings.add(
                    table.get("name").map(|node| &node.span),
                    &table.field("name"),
                    format!("action `{}` is declared twice", action.name),
                );
                continue;
            }
            out.push(action);
        }
    }
    out
}

fn action(table: &Table<'_>, findings: &mut Findings<'_>) -> Option<McpAction> {
    table.only(ACTION_KEYS, findings);
    let name = action_name(table, findings);
    let description = table
        .required_string(
            "description",
            "write one line saying what it does, e.g. description = \"commit the staged changes\"",
            findings,
        )
        .and_then(|found| one_line(&found, findings).then(|| found.value.to_owned()));
    let destructive = table.boolean("destructive", findings).unwrap_or(false);
    let (input, schema_ok) = input_schema(table, findings);
    let settings = std::collections::BTreeMap::new();
    let send = Names {
        scope: Scope::Send {
            schema: schema_ok.then_some(&input).and_then(Option::as_ref),
        },
        settings: &settings,
    };
    let tool = tool_name(table, "tool", findings);
    let arguments_base_args = arguments_base(table, findings);
    let arguments = table
        .get("arguments")
        .and_then(|node| tree_of(node, &table.field("arguments"), &send, findings));
    let result = required_table(
        table,
        "result",
        "add [actions.result] with id_at = \"/pointer\", id_pattern = \"…(id)…\" or id = \"{{label}}\"",
        findings,
    )
    .and_then(|result| result_spec(&result, &send, findings));
    let dedup = required_table(
        table,
        "dedup",
        "add [actions.dedup] with kind = \"idempotency_argument\", \"label_argument\", \"naturally_idempotent\" or \"none\"",
        findings,
    )
    .and_then(|dedup| dedup_spec(&dedup, arguments.as_ref(), findings));
    let lookup = required_table(
        table,
        "lookup",
        "add [actions.lookup] with kind = \"tool\" (another tool and a pattern over its result) or \"none\"",
        findings,
    )
    .and_then(|lookup| lookup_spec(&lookup, &settings, findings));
    Some(McpAction {
        name: name?,
        description: description?,
        destructive,
        input: input?,
        tool: tool?,
        arguments_base_args,
        arguments,
        result: result?,
        dedup: dedup?,
        lookup: lookup?,
    })
}

fn tool_name(table: &Table<'_>, key: &str, findings: &mut Findings<'_>) -> Option<String> {
    let found = table.required_string(
        key,
        "write the upstream tool's name as its tools/list shows it, e.g. tool = \"git_commit\"",
        findings,
    )?;
    if found.value.is_empty() || found.value.len() > 128 {
        findings.add(
            Some(found.span),
            &found.field,
            "must be an upstream tool's name (1 to 128 characters)",
        );
        return None;
    }
    Some(found.value.to_owned())
}

fn arguments_base(table: &Table<'_>, findings: &mut Findings<'_>) -> bool {
    match table.string("arguments_base", findings) {
        None => !table.has("arguments"),
        Some(found) if found.value == "args" => true,
        Some(found) if found.value == "none" => false,
        Some(found) => {
            findings.add(Some(found.span), &found.field, format!("`{}` is no arguments base; write \"args\" (start from the call's arguments) or \"none\"", found.value));
            false
        }
    }
}

fn result_spec(
    table: &Table<'_>,
    names: &Names<'_>,
    findings: &mut Findings<'_>,
) -> Option<ResultSpec> {
    table.only(&["success_pattern", "id_at", "id_pattern", "id"], findings);
    let success_pattern = table
        .string("success_pattern", findings)
        .and_then(|found| compile(&found, 0, findings));
    let given: Vec<&str> = ["id_at", "id_pattern", "id"]
        .into_iter()
        .filter(|key| table.has(key))
        .collect();
    if given.len() != 1 {
        findings.add(
            Some(table.span()),
            table.path(),
            format!("names {} ways to read the object's id ({}); write exactly one of id_at = \"/pointer\", id_pattern = \"…(id)…\" or id = \"{{{{label}}}}\"", given.len(), given.join(", ")),
        );
        return None;
    }
    let id = match given[0] {
        "id_at" => IdRule::At(pointer(&table.string("id_at", findings)?, findings)?),
        "id_pattern" => IdRule::Pattern(compile(
            &table.string("id_pattern", findings)?,
            1,
            findings,
        )?),
        _ => {
            let found = table.string("id", findings)?;
            let template =
                super::action::template(&found, names, super::action::Place::Value, findings)?;
            if template.refs().next().is_none() {
                findings.add(Some(found.span), &found.field, "names no placeholder, so every call would name the same object; write {{label}} or an argument such as {{args.path}}");
                return None;
            }
            IdRule::Template(template)
        }
    };
    Some(ResultSpec {
        success_pattern,
        id,
    })
}

/// Compiles a pattern; `groups` is the least number of capture groups it must have.
fn compile(
    found: &Found<'_, &str>,
    groups: usize,
    findings: &mut Findings<'_>,
) -> Option<regex::Regex> {
    match regex::Regex::new(found.value) {
        Ok(pattern) if pattern.captures_len() > groups => Some(pattern),
        Ok(_) => {
            findings.add(
                Some(found.span),
                &found.field,
                "has no capture group; put the id in parentheses, e.g. \"hash ([0-9a-f]+)\"",
            );
            None
        }
        Err(error) => {
            findings.add(
                Some(found.span),
                &found.field,
                format!("is no valid pattern: {error}"),
            );
            None
        }
    }
}

fn dedup_spec(
    table: &Table<'_>,
    arguments: Option<&Tree>,
    findings: &mut Findings<'_>,
) -> Option<McpDedup> {
    let kind = table.required_string(
        "kind",
        "write kind = \"idempotency_argument\", \"label_argument\", \"naturally_idempotent\" or \"none\"",
        findings,
    )?;
    match kind.value {
        "idempotency_argument" => {
            table.only(
                &["kind", "argument", "retention_s", "safety_margin_s"],
                findings,
            );
            let argument = carried(table, arguments, &Ref::Key, findings);
            let (retention_s, safety_margin_s) = retention(table, findings);
            Some(McpDedup::IdempotencyArgument {
                argument: argument?,
                retention_s: retention_s?,
                safety_margin_s: safety_margin_s?,
            })
        }
        "label_argument" => {
            table.only(&["kind", "argument"], findings);
            Some(McpDedup::LabelArgument {
                argument: carried(table, arguments, &Ref::Label, findings)?,
            })
        }
        "naturally_idempotent" => {
            table.only(&["kind"], findings);
            Some(McpDedup::NaturallyIdempotent)
        }
        "none" => {
            table.only(&["kind"], findings);
            Some(McpDedup::None)
        }
        other => {
            findings.add(Some(kind.span), &kind.field, format!("`{other}` is no dedup kind; write \"idempotency_argument\", \"label_argument\", \"naturally_idempotent\" or \"none\""));
            None
        }
    }
}

/// The tool argument a dedup contract names: when `[actions.arguments]` writes it, it must carry
/// `wanted` (the key or the label), or the upstream would never see it.
fn carried(
    table: &Table<'_>,
    arguments: Option<&Tree>,
    wanted: &Ref,
    findings: &mut Findings<'_>,
) -> Option<String> {
    let found = table.required_string(
        "argument",
        &format!(
            "write the tool argument that carries {wanted}, e.g. argument = \"idempotency_key\""
        ),
        findings,
    )?;
    if let Some(Tree::Object(entries)) = arguments {
        let written = entries.iter().find(|(key, _)| key.source() == found.value);
        if let Some((_, value)) = written {
            let carries = value
                .templates()
                .iter()
                .any(|(_, template)| template.uses(wanted));
            if !carries {
                findings.add(Some(found.span), &found.field, format!("names `{}`, but [actions.arguments] writes it without {wanted}; put {wanted} in it, or leave it out of the arguments (it is then set to {wanted})", found.value));
                return None;
            }
        }
    }
    Some(found.value.to_owned())
}

fn lookup_spec(
    table: &Table<'_>,
    settings: &std::collections::BTreeMap<String, String>,
    findings: &mut Findings<'_>,
) -> Option<McpLookup> {
    let kind = table.required_string(
        "kind",
        "write kind = \"tool\" (another tool and a pattern over its result) or \"none\"",
        findings,
    )?;
    match kind.value {
        "none" => {
            table.only(&["kind"], findings);
            Some(McpLookup::None)
        }
        "tool" => {
            table.only(
                &["kind", "tool", "arguments", "found", "consistent", "lag_ms"],
                findings,
            );
            let names = Names {
                scope: Scope::Lookup,
                settings,
            };
            let tool = tool_name(table, "tool", findings);
            let arguments = table
                .get("arguments")
                .and_then(|node| tree_of(node, &table.field("arguments"), &names, findings));
            let found = table
                .required_string("found", "write a pattern over the tool's result that holds {{label}} and puts the object's id in a capture group", findings)
                .and_then(|found| found_pattern(&found, findings));
            let consistent = table.boolean("consistent", findings).unwrap_or(false);
            let lag_ms = match table.unsigned("lag_ms", findings) {
                Some(found) if consistent && found.value > 0 => {
                    findings.add(Some(found.span), &found.field, "is given for a consistent lookup; a consistent read has no lag (write consistent = false, or leave lag_ms out)");
                    0
                }
                Some(found) => found.value,
                None if consistent => 0,
                None => {
                    table.missing("lag_ms", "a lookup that is not consistent says how long a change may take to show, in milliseconds, e.g. lag_ms = 2000", findings);
                    0
                }
            };
            Some(McpLookup::Tool(ToolLookup {
                tool: tool?,
                arguments,
                found: found?,
                consistent,
                lag_ms,
            }))
        }
        other => {
            findings.add(
                Some(kind.span),
                &kind.field,
                format!("`{other}` is no lookup kind; write \"tool\" or \"none\""),
            );
            None
        }
    }
}

/// A lookup's pattern must name the operation (`{{label}}` or `{{key}}`: a matching title is no
/// evidence) and, filled in, compile with a capture group for the id.
fn found_pattern(found: &Found<'_, &str>, findings: &mut Findings<'_>) -> Option<String> {
    if !found.value.contains("{{label}}") && !found.value.contains("{{key}}") {
        findings.add(Some(found.span), &found.field, "holds neither {{label}} nor {{key}}; a result is this operation's only when it carries the operation's own label or key (a matching title is no evidence)");
        return None;
    }
    let filled = fill_pattern(found.value, SAMPLE_LABEL, "opk_0123456789abcdef", "account");
    let sample = Found {
        value: filled.as_str(),
        span: found.span,
        field: found.field.clone(),
    };
    compile(&sample, 1, findings)?;
    Some(found.value.to_owned())
}

/// A lookup pattern with its placeholders replaced by the operation's values, escaped.
pub(crate) fn fill_pattern(pattern: &str, label: &str, key: &str, account: &str) -> String {
    pattern
        .replace("{{label}}", &regex::escape(label))
        .replace("{{key}}", &regex::escape(key))
        .replace("{{account}}", &regex::escape(account))
}

/// `[upstream.oauth]`: the client-credentials grant's token endpoint, scopes and the variables
/// holding the client's id and secret.
fn upstream_oauth(
    table: &Table<'_>,
    headers_from: &[(String, String)],
    findings: &mut Findings<'_>,
) -> Option<UpstreamOAuth> {
    table.only(
        &["token_url", "scopes", "client_id_env", "client_secret_env"],
        findings,
    );
    let token_url = table
        .required_string("token_url", "token_url = \"https://auth.example.com/oauth/token\"", findings)
        .and_then(|found| {
        if found.value.starts_with("http://") || found.value.starts_with("https://") {
            Some(found.value.to_owned())
        } else {
            findings.add(Some(found.span), &found.field, format!("`{}` is no http:// or https:// URL; write the authorization server's token endpoint", found.value));
            None
        }
        });
    let client_id_env = table.required_string(
        "client_id_env",
        "client_id_env = \"VARIABLE\" (the environment variable holding the client id)",
        findings,
    );
    let client_secret_env = table.required_string(
        "client_secret_env",
        "client_secret_env = \"VARIABLE\" (the environment variable holding the client secret)",
        findings,
    );
    let scopes = table
        .strings("scopes", findings)
        .map(|found| found.iter().map(|scope| scope.value.to_owned()).collect())
        .unwrap_or_default();
    if headers_from
        .iter()
        .any(|(header, _)| header.eq_ignore_ascii_case("authorization"))
    {
        findings.add(
            Some(table.span()),
            table.path(),
            "an access token from [upstream.oauth] is sent as Authorization, and headers_from sends one too; keep one of them".to_owned(),
        );
        return None;
    }
    Some(UpstreamOAuth {
        token_url: token_url?,
        scopes,
        client_id_env: client_id_env?.value.to_owned(),
        client_secret_env: client_secret_env?.value.to_owned(),
    })
}

/// `[upstream.login]`: a person's account, authorized with `opledger connectors login`.
fn upstream_login(
    table: &Table<'_>,
    headers_from: &[(String, String)],
    with_oauth: bool,
    findings: &mut Findings<'_>,
) -> Option<UpstreamLogin> {
    table.only(
        &[
            "scopes",
            "client_id_env",
            "client_secret_env",
            "redirect_port",
        ],
        findings,
    );
    if with_oauth {
        findings.add(
            Some(table.span()),
            table.path(),
            "is given with [upstream.oauth]; an upstream is reached as one identity: a person's account (login) or the client's own (oauth), not both".to_owned(),
        );
        return None;
    }
    if headers_from
        .iter()
        .any(|(header, _)| header.eq_ignore_ascii_case("authorization"))
    {
        findings.add(
            Some(table.span()),
            table.path(),
            "the login's access token is sent as Authorization, and headers_from sends one too; keep one of them".to_owned(),
        );
        return None;
    }
    let client_id_env = table
        .string("client_id_env", findings)
        .map(|found| found.value.to_owned());
    let client_secret_env = table.string("client_secret_env", findings);
    if let (Some(found), None) = (&client_secret_env, &client_id_env) {
        findings.add(
            Some(found.span),
            &found.field,
            "names a client secret without client_id_env; a client registered beforehand gives both, a client that registers itself neither".to_owned(),
        );
        return None;
    }
    let redirect_port = match table.unsigned("redirect_port", findings) {
        Some(found) => match u16::try_from(found.value) {
            Ok(port) if port > 0 => Some(port),
            _ => {
                findings.add(
                    Some(found.span),
                    &found.field,
                    format!("is {}; a TCP port is 1 to 65535", found.value),
                );
                return None;
            }
        },
        None => None,
    };
    let scopes = table
        .strings("scopes", findings)
        .map(|found| found.iter().map(|scope| scope.value.to_owned()).collect())
        .unwrap_or_default();
    Some(UpstreamLogin {
        scopes,
        client_id_env,
        client_secret_env: client_secret_env.map(|found| found.value.to_owned()),
        redirect_port,
    })
}

fn read_only(top: &Table<'_>, actions: &[McpAction], findings: &mut Findings<'_>) -> Vec<String> {
    let Some(items) = top.strings("read_only", findings) else {
        return Vec::new();
    };
    if items.len() > MAX_READ_ONLY_TOOLS {
        findings.add(
            top.get("read_only").map(|node| &node.span),
            "read_only",
            format!("lists {} tools; at most {MAX_READ_ONLY_TOOLS}", items.len()),
        );
    }
    let mut out = Vec::new();
    for found in items.iter().take(MAX_READ_ONLY_TOOLS) {
        if actions.iter().any(|action| action.tool == found.value) {
            findings.add(Some(found.span), &found.field, format!("`{}` is also an action's tool; a tool that changes something goes through the ledger, so it is not read-only", found.value));
            continue;
        }
        out.push(found.value.to_owned());
    }
    out
}

fn error_rules(top: &Table<'_>, findings: &mut Findings<'_>) -> Vec<TextRule> {
    let tables = top.tables("errors", findings);
    if tables.len() > MAX_ERROR_TEXT_RULES {
        findings.add(
            None,
            "errors",
            format!(
                "lists {} rules; at most {MAX_ERROR_TEXT_RULES}",
                tables.len()
            ),
        );
    }
    let mut out = Vec::new();
    for table in tables.iter().take(MAX_ERROR_TEXT_RULES) {
        table.only(&["contains", "means"], findings);
        let contains = table
            .required_string(
                "contains",
                "write the text the error holds, e.g. contains = \"UNIQUE constraint failed\"",
                findings,
            )
            .and_then(|found| {
                if found.value.is_empty() {
                    findings.add(
                        Some(found.span),
                        &found.field,
                        "is empty; it would match every error",
                    );
                    return None;
                }
                Some(found.value.to_owned())
            });
        let means = table
            .required_string("means", "write means = \"uncertain\", \"rejected\" or \"not_sent\"", findings)
            .and_then(|found| match found.value {
                "uncertain" => Some(Means::Uncertain),
                "rejected" => Some(Means::Rejected),
                "not_sent" => Some(Means::NotSent),
                other => {
                    findings.add(Some(found.span), &found.field, format!("`{other}` is no meaning; write \"uncertain\" (it may have been applied), \"rejected\" (the upstream proved nothing was applied) or \"not_sent\""));
                    None
                }
            });
        if let (Some(contains), Some(means)) = (contains, means) {
            out.push(TextRule { contains, means });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::document::{parse_any, AnyDocument};
    use crate::error::ConnectorError;

    const GOOD: &str = r#"
id = "git"
description = "A git repository"
transport = "mcp"

[upstream]
command = "mcp-server-git"

[[accounts]]
id = "main"
tenants = ["acme"]

[[actions]]
name = "commit"
description = "commit the staged changes"
tool = "git_commit"
input = { type = "object", required = ["message"], properties.message = { type = "string" } }
arguments = { repo_path = "/repo", message = "{{args.message}} [{{label}}]" }
result = { id_pattern = "hash ([0-9a-f]{40})" }
dedup = { kind = "none" }

[actions.lookup]
kind = "tool"
tool = "git_log"
arguments = { repo_path = "/repo", max_count = 100 }
found = "Commit: ([0-9a-f]{40})\nAuthor: [^\n]*\nDate: [^\n]*\nMessage: [^\n]*\\[{{label}}\\]"
consistent = true
"#;

    fn errors(text: &str) -> Vec<ConnectorError> {
        parse_any("git.toml", text).expect_err("a document with problems")
    }

    #[test]
    fn a_git_upstream_loads_with_its_contract_and_lookup() {
        let Ok(AnyDocument::Mcp(document)) = parse_any("git.toml", GOOD) else {
            panic!("an MCP document: {:?}", parse_any("git.toml", GOOD));
        };
        let action = document.action("commit").expect("the action");
        assert_eq!(action.tool, "git_commit");
        assert_eq!(
            action.capabilities().deduplication,
            opledger_domain::contract::Deduplication::None
        );
        assert_eq!(
            action.capabilities().lookup,
            opledger_domain::contract::LookupSupport::Consistent
        );
    }

    #[test]
    fn a_lookup_that_does_not_name_the_operation_is_refused_at_its_line() {
        let text = GOOD.replace("\\\\[{{label}}\\\\]", "fix typo");
        let errors = errors(&text);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "actions[0].lookup.found");
        assert_eq!(errors[0].line, Some(26));
        assert!(errors[0].message.contains("{{label}}"), "{}", errors[0]);
    }

    #[test]
    fn a_label_contract_whose_argument_does_not_carry_the_label_is_refused() {
        let text = GOOD.replace(
            "dedup = { kind = \"none\" }",
            "dedup = { kind = \"label_argument\", argument = \"repo_path\" }",
        );
        let errors = errors(&text);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "actions[0].dedup.argument");
        assert!(errors[0].message.contains("{{label}}"), "{}", errors[0]);
    }

    #[test]
    fn every_problem_is_named_with_its_field() {
        let text = GOOD
            .replace(
                "command = \"mcp-server-git\"",
                "command = \"x\"\nurl = \"ftp://x\"",
            )
            .replace(
                "tool = \"git_commit\"",
                "tool = \"git_commit\"\nretries = 3",
            )
            .replace("transport = \"mcp\"", "transport = \"mcp\"\nsessions = 99");
        let fields: Vec<String> = errors(&text).into_iter().map(|error| error.field).collect();
        assert_eq!(fields, ["sessions", "upstream", "actions[0].retries"]);
    }

    #[test]
    fn a_ca_file_is_for_an_https_upstream_and_one_that_cannot_be_read_is_named_at_build() {
        let plain = GOOD.replace(
            "command = \"mcp-server-git\"",
            "url = \"http://127.0.0.1:1/mcp\"\nca_file = \"ca.pem\"",
        );
        let refused = errors(&plain);
        assert_eq!(refused[0].field, "upstream.ca_file");
        assert!(
            refused[0].message.contains("https://"),
            "{}",
            refused[0].message
        );

        let missing = GOOD.replace(
            "command = \"mcp-server-git\"",
            "url = \"https://127.0.0.1:1/mcp\"\nca_file = \"/nonexistent/ca.pem\"",
        );
        let Ok(AnyDocument::Mcp(document)) = parse_any("git.toml", &missing) else {
            panic!("the document itself is well formed");
        };
        let built = crate::mcp::McpConnector::build(&document, None, &[], &|_| None)
            .expect_err("the CA file cannot be read");
        assert_eq!(built[0].field, "upstream.ca_file");
        assert!(
            built[0].message.contains("/nonexistent/ca.pem") && built[0].message.contains("PEM"),
            "{}",
            built[0].message
        );
    }

    #[test]
    fn a_login_is_read_with_its_client_and_port_and_its_conflicts_are_named() {
        let http = |login: &str| {
            GOOD.replace(
                "command = \"mcp-server-git\"",
                &format!("url = \"https://mcp.example.com/mcp\"\n\n[upstream.login]\n{login}"),
            )
        };
        let Ok(AnyDocument::Mcp(document)) = parse_any(
            "git.toml",
            &http("scopes = [\"repo\"]\nclient_id_env = \"GIT_CLIENT_ID\"\nredirect_port = 8976"),
        ) else {
            panic!("a login document loads");
        };
        let crate::mcp::spec::Upstream::Http { login, .. } = &document.upstream else {
            panic!("an HTTP upstream");
        };
        assert_eq!(
            login.as_ref(),
            Some(&crate::mcp::spec::UpstreamLogin {
                scopes: vec!["repo".to_owned()],
                client_id_env: Some("GIT_CLIENT_ID".to_owned()),
                client_secret_env: None,
                redirect_port: Some(8976),
            })
        );
        let cases = [
            (
                "client_secret_env = \"S\"",
                "upstream.login.client_secret_env",
                "client_id_env",
            ),
            (
                "redirect_port = 70000",
                "upstream.login.redirect_port",
                "1 to 65535",
            ),
            ("prompt = true", "upstream.login.prompt", "prompt"),
        ];
        for (login, field, said) in cases {
            let refused = errors(&http(login));
            assert_eq!(refused[0].field, field, "{refused:?}");
            assert!(refused[0].message.contains(said), "{}", refused[0].message);
        }
        let both = GOOD.replace(
            "command = \"mcp-server-git\"",
            "url = \"https://mcp.example.com/mcp\"\n\n[upstream.oauth]\ntoken_url = \"https://a.example.com/token\"\nclient_id_env = \"I\"\nclient_secret_env = \"S\"\n\n[upstream.login]",
        );
        let refused = errors(&both);
        assert_eq!(refused[0].field, "upstream.login", "{refused:?}");
        assert!(
            refused[0].message.contains("not both"),
            "{}",
            refused[0].message
        );
    }

    #[test]
    fn a_rest_document_is_not_read_as_an_upstream_and_an_unknown_transport_is_named() {
        let errors = errors(&GOOD.replace("transport = \"mcp\"", "transport = \"grpc\""));
        assert_eq!(errors[0].field, "transport");
        let rest = crate::document::parse("git.toml", GOOD).expect_err("not a REST document");
        assert_eq!(rest[0].field, "transport");
    }
}
