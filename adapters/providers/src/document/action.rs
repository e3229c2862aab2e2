//! Reading a connector's actions: the input schema, the request, the response, the dedup contract
//! and the lookup, and the checks that tie them together (every placeholder against the schema
//! and the settings, a unique label that the request really carries, a key lookup for a key that
//! is really sent).

use std::collections::BTreeMap;

use opledger_domain::ids::ActionName;
use reqwest::header::HeaderName;
use reqwest::Method;
use serde_json::Value;

use super::read::{
    header_name, one_line, optional_pointer, pointer, settings_pointer, status, RESERVED_HEADERS,
};
use super::tree::{self, Found, Node, Table};
use super::{
    Action, ConsistentLookup, Dedup, Expect, IdSource, Lookup, LookupBy, RequestSpec, ResponseSpec,
    SearchLookup, StatusMatch, MAX_ACTIONS_PER_CONNECTOR, MAX_KEY_RETENTION_S, MAX_REQUEST_ENTRIES,
    MAX_SCHEMA_BYTES, MAX_SEARCH_LAG_MS,
};
use crate::body::BodyEncoding;
use crate::credentials::Auth;
use crate::error::Findings;
use crate::pointer::{check_any_steps, check_no_any_step};
use crate::template::{check_arg_path, Ref, Template, Tree};

const ACTION_KEYS: &[&str] = &[
    "name",
    "description",
    "destructive",
    "input",
    "request",
    "response",
    "dedup",
    "lookup",
    "subject",
    "personal",
];
const REQUEST_KEYS: &[&str] = &[
    "method",
    "path",
    "query",
    "headers",
    "body_encoding",
    "body_base",
    "body",
];

/// The default idempotency-key header (Stripe's, and the IETF draft's).
pub const DEFAULT_IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// What the templates of one request may name.
#[derive(Clone, Copy)]
pub(super) enum Scope<'a> {
    /// A send: arguments (checked against the schema when it is valid).
    Send { schema: Option<&'a Value> },
    /// A lookup: no arguments.
    Lookup,
}

/// Everything a template check needs.
pub(super) struct Names<'a> {
    pub(super) scope: Scope<'a>,
    pub(super) settings: &'a BTreeMap<String, String>,
}

/// Reads `[probe]`: the read-only request `opledger connectors test` sends to check an account's
/// credentials (a GET: nothing is created); templates may use `{{account}}` and settings.
pub(super) fn probe(
    top: &Table<'_>,
    settings: &BTreeMap<String, String>,
    auth: Option<&Auth>,
    findings: &mut Findings<'_>,
) -> Option<RequestSpec> {
    let table = top.table("probe", findings)?;
    table.only(&["method", "path", "query", "headers"], findings);
    let names = Names {
        scope: Scope::Lookup,
        settings,
    };
    let spec = request_spec(&table, &names, auth, Some(Method::GET), findings)?;
    if spec.method != Method::GET {
        findings.add(
            table.get("method").map(|node| &node.span),
            &table.field("method"),
            format!("is {}; a probe only reads, so it is a GET (nothing may be created when credentials are tested)", spec.method),
        );
        return None;
    }
    Some(spec)
}

/// Reads every `[[actions]]` table; duplicates and limits are findings.
pub(super) fn read_all(
    top: &Table<'_>,
    settings: &BTreeMap<String, String>,
    auth: Option<&Auth>,
    findings: &mut Findings<'_>,
) -> Vec<Action> {
    if !top.has("actions") {
        top.missing(
            "actions",
            "a connector declares at least one [[actions]]",
            findings,
        );
        return Vec::new();
    }
    let tables = top.tables("actions", findings);
    if tables.len() > MAX_ACTIONS_PER_CONNECTOR {
        findings.add(
            None,
            "actions",
            format!(
                "declares {} actions; at most {MAX_ACTIONS_PER_CONNECTOR}",
                tables.len()
            ),
        );
    }
    let mut actions: Vec<Action> = Vec::new();
    for table in &tables {
        let Some(action) = action(table, settings, auth, findings) else {
            continue;
        };
        if actions.iter().any(|earlier| earlier.name == action.name) {
            findings.add(
                table.get("name").map(|node| &node.span),
                &table.field("name"),
                format!(
                    "action `{}` is declared twice; give each action its own name",
                    action.name
                ),
            );
            continue;
        }
        actions.push(action);
    }
    actions
}

fn action(
    table: &Table<'_>,
    settings: &BTreeMap<String, String>,
    auth: Option<&Auth>,
    findings: &mut Findings<'_>,
) -> Option<Action> {
    table.only(ACTION_KEYS, findings);
    let name = action_name(table, findings);
    let description = table
        .required_string(
            "description",
            "write one line saying what it does, e.g. description = \"create a task\"",
            findings,
        )
        .and_then(|found| one_line(&found, findings).then(|| found.value.to_owned()));
    let destructive = table.boolean("destructive", findings).unwrap_or(false);
    let (input, schema_ok) = input_schema(table, findings);
    let send = Names {
        scope: Scope::Send {
            schema: schema_ok.then_some(&input).and_then(Option::as_ref),
        },
        settings,
    };
    let request = required_table(
        table,
        "request",
        "add [actions.request] with method and path",
        findings,
    )
    .and_then(|request| {
        request.only(REQUEST_KEYS, findings);
        request_spec(&request, &send, auth, None, findings)
    });
    let response = required_table(
        table,
        "response",
        "add [actions.response] with id = \"/id\" (or id_header = \"location\")",
        findings,
    )
    .and_then(|response| response_spec(&response, findings));
    let dedup = required_table(table, "dedup", "add [actions.dedup] with kind = \"idempotency_key\", \"unique_label\", \"naturally_idempotent\" or \"none\"", findings)
        .and_then(|dedup| dedup_spec(&dedup, findings));
    let lookup_names = Names {
        scope: Scope::Lookup,
        settings,
    };
    let lookup = required_table(
        table,
        "lookup",
        "add [actions.lookup] with kind = \"by_key\", \"by_label\", \"search\" or \"none\"",
        findings,
    )
    .and_then(|lookup| lookup_spec(&lookup, &lookup_names, auth, findings));
    let subject = table
        .string("subject", findings)
        .and_then(|found| pointer_ok(&found, findings).then(|| found.value.to_owned()));
    let personal = table
        .strings("personal", findings)
        .unwrap_or_default()
        .into_iter()
        .filter(|found| pointer_ok(found, findings))
        .map(|found| found.value.to_owned())
        .collect();
    let action = Action {
        subject,
        personal,
        name: name?,
        description: description?,
        destructive,
        input: input?,
        request: request?,
        response: response?,
        dedup: dedup?,
        lookup: lookup?,
    };
    contract_checks(table, &action, findings);
    Some(action)
}

/// Whether a declared `subject` or `personal` entry is a JSON pointer into the arguments.
fn pointer_ok(found: &super::tree::Found<'_, &str>, findings: &mut Findings<'_>) -> bool {
    if found.value.starts_with('/') {
        return true;
    }
    findings.add(
        Some(found.span),
        &found.field,
        format!(
            "`{}` is not a JSON pointer into the arguments; write it as \"/email\" (RFC 6901)",
            found.value
        ),
    );
    false
}

pub(super) fn required_table<'n>(
    table: &Table<'n>,
    key: &str,
    hint: &str,
    findings: &mut Findings<'_>,
) -> Option<Table<'n>> {
    if !table.has(key) {
        table.missing(key, hint, findings);
        return None;
    }
    table.table(key, findings)
}

pub(super) fn action_name(table: &Table<'_>, findings: &mut Findings<'_>) -> Option<ActionName> {
    let found = table.required_string(
        "name",
        "write the action's name, e.g. name = \"create_task\"",
        findings,
    )?;
    let snake = found
        .value
        .bytes()
        .next()
        .is_some_and(|byte| byte.is_ascii_lowercase())
        && found
            .value
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_');
    if !snake {
        findings.add(
            Some(found.span),
            &found.field,
            format!("`{}` is not snake_case; write lower-case letters, digits and `_`, e.g. \"create_task\"", found.value),
        );
        return None;
    }
    ActionName::new(found.value)
        .map_err(|error| findings.add(Some(found.span), &found.field, error.message))
        .ok()
}

/// The input schema as JSON, and whether it is a valid 2020-12 schema of an object (only then
/// are placeholders checked against it, so one schema error does not become ten).
pub(super) fn input_schema(
    table: &Table<'_>,
    findings: &mut Findings<'_>,
) -> (Option<Value>, bool) {
    let Some(node) = table.get("input") else {
        table.missing(
            "input",
            "add [actions.input], the JSON Schema of the arguments, e.g. type = \"object\"",
            findings,
        );
        return (None, false);
    };
    let field = table.field("input");
    if !matches!(node.value, tree::Value::Table(_)) {
        findings.add(
            Some(&node.span),
            &field,
            format!("must be a table (a JSON Schema), not {}", node.value.kind()),
        );
        return (None, false);
    }
    let schema = tree::to_json(node);
    let size = serde_json::to_vec(&schema).map_or(usize::MAX, |bytes| bytes.len());
    if size > MAX_SCHEMA_BYTES {
        findings.add(
            Some(&node.span),
            &field,
            format!("is {size} bytes as JSON; a schema is at most {MAX_SCHEMA_BYTES} bytes"),
        );
        return (Some(schema), false);
    }
    let before = findings.len();
    for error in jsonschema::draft202012::meta::validator().iter_errors(&schema) {
        let at = error.instance_path().as_str().to_owned();
        let place = node_at(node, &at).unwrap_or(node);
        findings.add(
            Some(&place.span),
            &dotted(&field, &at),
            format!("is not valid JSON Schema 2020-12: {error}"),
        );
    }
    if findings.len() == before {
        if let Err(error) = jsonschema::draft202012::new(&schema) {
            findings.add(
                Some(&node.span),
                &field,
                format!("cannot be compiled: {error}"),
            );
        }
    }
    if findings.len() == before && schema.get("type").and_then(Value::as_str) != Some("object") {
        findings.add(
            Some(&node.span),
            &field,
            "must describe an object (arguments are always a JSON object); write type = \"object\"",
        );
    }
    let valid = findings.len() == before;
    (Some(schema), valid)
}

/// The node a JSON pointer names below `node`, when it exists.
fn node_at<'n>(node: &'n Node, pointer: &str) -> Option<&'n Node> {
    let mut current = node;
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        current = match &current.value {
            tree::Value::Table(entries) => &entries.iter().find(|(key, _)| *key == token)?.1,
            tree::Value::Array(items) => items.get(token.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(current)
}

/// `field` and a pointer below it as a dotted path: `input` + `/properties/a` → `input.properties.a`.
fn dotted(field: &str, pointer: &str) -> String {
    let mut out = field.to_owned();
    for token in pointer.split('/').skip(1) {
        out.push('.');
        out.push_str(token);
    }
    out
}

/// Reads the request keys of `table` (an `[actions.request]`, or a lookup's own table).
fn request_spec(
    table: &Table<'_>,
    names: &Names<'_>,
    auth: Option<&Auth>,
    default_method: Option<Method>,
    findings: &mut Findings<'_>,
) -> Option<RequestSpec> {
    let method = method(table, default_method, findings);
    let path = table
        .required_string(
            "path",
            "write the path below base_url, e.g. path = \"/tasks\"",
            findings,
        )
        .and_then(|found| {
            let template = template(&found, names, Place::Path, findings)?;
            check_path_literals(&found, &template, findings).then_some(template)
        });
    let query = entries(table, "query", names, findings, |name, _| {
        (!name.is_empty())
            .then(|| name.to_owned())
            .ok_or_else(|| "a query parameter needs a name".to_owned())
    });
    let headers = entries(table, "headers", names, findings, |name, _| {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("`{name}` is not an HTTP header name"))?;
        let auth_header = match auth {
            Some(Auth::Header { header, .. }) => Some(header.as_str()),
            _ => None,
        };
        if RESERVED_HEADERS.contains(&header.as_str()) || auth_header == Some(header.as_str()) {
            return Err(format!("`{name}` is set by the connector itself (credentials from [auth], the content type from body_encoding); remove it"));
        }
        Ok(header)
    });
    let (encoding, body_base_args, body) = body(table, names, findings);
    Some(RequestSpec {
        method: method?,
        path: path?,
        query: query?,
        headers: headers?,
        encoding,
        body_base_args,
        body,
    })
}

/// The request's method; `default` when it is not written (lookups default to GET, an action's
/// request must say).
fn method(
    table: &Table<'_>,
    default: Option<Method>,
    findings: &mut Findings<'_>,
) -> Option<Method> {
    let Some(found) = table.string("method", findings) else {
        if table.has("method") {
            return None;
        }
        if default.is_none() {
            table.missing(
                "method",
                "write method = \"GET\", \"POST\", \"PUT\", \"PATCH\" or \"DELETE\"",
                findings,
            );
        }
        return default;
    };
    match found.value {
        "GET" => Some(Method::GET),
        "POST" => Some(Method::POST),
        "PUT" => Some(Method::PUT),
        "PATCH" => Some(Method::PATCH),
        "DELETE" => Some(Method::DELETE),
        other => {
            findings.add(
                Some(found.span),
                &found.field,
                format!("`{other}` is not a method a connector sends; write GET, POST, PUT, PATCH or DELETE (upper case)"),
            );
            None
        }
    }
}

/// Where a template is used, for what its placeholders may name.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// A path: a placeholder is one segment and cannot be left out.
    Path,
    /// A query value, header value, body leaf or key: absent values are left out.
    Value,
}

/// Parses and checks one template; every problem is a finding at its place.
pub(super) fn template(
    found: &Found<'_, &str>,
    names: &Names<'_>,
    place: Place,
    findings: &mut Findings<'_>,
) -> Option<Template> {
    let template = Template::parse(found.value)
        .map_err(|message| findings.add(Some(found.span), &found.field, message))
        .ok()?;
    let mut valid = true;
    for reference in template.refs() {
        if let Err(message) = check_ref(reference, names, place) {
            findings.add(
                Some(found.span),
                &found.field,
                format!("`{reference}` {message}"),
            );
            valid = false;
        }
    }
    valid.then_some(template)
}

fn check_ref(reference: &Ref, names: &Names<'_>, place: Place) -> Result<(), String> {
    match reference {
        Ref::Setting(name) if !names.settings.contains_key(name) => {
            let declared: Vec<&str> = names.settings.keys().map(String::as_str).collect();
            Err(format!(
                "names no setting; declare `{name}` under [settings] (declared: {})",
                if declared.is_empty() { "none".to_owned() } else { declared.join(", ") }
            ))
        }
        Ref::Args(_) if matches!(names.scope, Scope::Lookup) => Err(
            "cannot be used here: a lookup carries no arguments; use {{key}}, {{label}}, {{account}}, {{operation_id}} or {{settings.…}}".to_owned(),
        ),
        Ref::Args(path) if path.is_empty() && place == Place::Path => {
            Err("is the whole arguments object and cannot be a path segment".to_owned())
        }
        Ref::Args(path) => match names.scope {
            Scope::Send { schema: Some(schema) } => {
                let required = check_arg_path(path, schema)?;
                if place == Place::Path && !required {
                    return Err("is optional, but a path segment cannot be left out; list it in input.required (and every object above it), or move it to the query or body".to_owned());
                }
                Ok(())
            }
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Characters a path may hold outside placeholders (RFC 3986 `pchar` and `/`), and `%XX`.
fn check_path_literals(
    found: &Found<'_, &str>,
    template: &Template,
    findings: &mut Findings<'_>,
) -> bool {
    if !found.value.starts_with('/') {
        findings.add(
            Some(found.span),
            &found.field,
            format!("`{}` must start with `/`", found.value),
        );
        return false;
    }
    for literal in template.literal_parts() {
        if let Some(bad) = first_unsafe_path_char(literal) {
            let hint = if bad == '?' {
                "; put query parameters in query = { name = \"…\" }"
            } else {
                "; percent-encode it, or pass it through a placeholder"
            };
            findings.add(
                Some(found.span),
                &found.field,
                format!("holds `{bad}`, which a path cannot carry as it is{hint}"),
            );
            return false;
        }
    }
    true
}

fn first_unsafe_path_char(literal: &str) -> Option<char> {
    let mut chars = literal.chars();
    while let Some(char) = chars.next() {
        if char == '%' {
            let escape: String = chars.by_ref().take(2).collect();
            if escape.len() != 2 || !escape.chars().all(|digit| digit.is_ascii_hexdigit()) {
                return Some('%');
            }
        } else if !(char.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@/".contains(char)) {
            return Some(char);
        }
    }
    None
}

/// A table of named templates (`query`, `headers`), each name checked by `name`.
fn entries<T>(
    table: &Table<'_>,
    key: &str,
    names: &Names<'_>,
    findings: &mut Findings<'_>,
    name: impl Fn(&str, &Found<'_, &str>) -> Result<T, String>,
) -> Option<Vec<(T, Template)>> {
    let Some(sub) = table.table(key, findings) else {
        return (!table.has(key)).then(Vec::new);
    };
    if sub.entries().len() > MAX_REQUEST_ENTRIES {
        findings.add(
            Some(sub.span()),
            sub.path(),
            format!(
                "lists {}; at most {MAX_REQUEST_ENTRIES}",
                sub.entries().len()
            ),
        );
        return None;
    }
    let mut out = Vec::new();
    let mut valid = true;
    for (entry, _) in sub.entries() {
        let Some(found) = sub.string(entry, findings) else {
            valid = false;
            continue;
        };
        let checked = name(entry, &found)
            .map_err(|message| findings.add(Some(found.span), &found.field, message));
        let parsed = template(&found, names, Place::Value, findings);
        match (checked, parsed) {
            (Ok(checked), Some(parsed)) => out.push((checked, parsed)),
            _ => valid = false,
        }
    }
    valid.then_some(out)
}

/// `body_encoding`, `body_base` and `body`, checked together.
fn body(
    table: &Table<'_>,
    names: &Names<'_>,
    findings: &mut Findings<'_>,
) -> (BodyEncoding, bool, Option<Tree>) {
    let encoding = match table.string("body_encoding", findings) {
        None => BodyEncoding::Json,
        Some(found) => match found.value {
            "json" => BodyEncoding::Json,
            "form" => BodyEncoding::Form,
            "none" => BodyEncoding::None,
            other => {
                findings.add(
                    Some(found.span),
                    &found.field,
                    format!("`{other}` is no body encoding; write \"json\", \"form\" or \"none\""),
                );
                BodyEncoding::Json
            }
        },
    };
    let base = table.string("body_base", findings).is_some_and(|found| {
        if found.value != "args" {
            findings.add(
                Some(found.span),
                &found.field,
                format!(
                    "`{}` is no body base; the one base is \"args\" (or leave it out)",
                    found.value
                ),
            );
            return false;
        }
        if matches!(names.scope, Scope::Lookup) {
            findings.add(
                Some(found.span),
                &found.field,
                "a lookup carries no arguments, so its body cannot start from them",
            );
            return false;
        }
        true
    });
    let body = table
        .get("body")
        .and_then(|node| tree_of(node, &table.field("body"), names, findings));
    if encoding == BodyEncoding::None && (base || table.has("body")) {
        findings.add(
            table.get("body_encoding").map(|node| &node.span),
            &table.field("body_encoding"),
            "is \"none\", but a body is written (body or body_base); remove them or write \"json\" or \"form\"",
        );
    }
    let must_be_object = base || encoding == BodyEncoding::Form;
    if let (Some(tree), true) = (&body, must_be_object) {
        if !tree.may_be_object() {
            findings.add(
                table.get("body").map(|node| &node.span),
                &table.field("body"),
                "must be a table here (it is merged over the arguments, or sent as form fields)",
            );
        }
    }
    (encoding, base, body)
}

/// A body value as a template tree; each leaf's problems at its own line.
pub(super) fn tree_of(
    node: &Node,
    field: &str,
    names: &Names<'_>,
    findings: &mut Findings<'_>,
) -> Option<Tree> {
    match &node.value {
        tree::Value::String(text) => {
            let found = Found {
                value: text.as_str(),
                span: &node.span,
                field: field.to_owned(),
            };
            template(&found, names, Place::Value, findings).map(Tree::Template)
        }
        tree::Value::Array(items) => {
            let trees: Vec<Option<Tree>> = items
                .iter()
                .enumerate()
                .map(|(index, item)| tree_of(item, &format!("{field}[{index}]"), names, findings))
                .collect();
            trees
                .into_iter()
                .collect::<Option<Vec<_>>>()
                .map(Tree::Array)
        }
        tree::Value::Table(entries) => {
            let mut out = Vec::with_capacity(entries.len());
            let mut valid = true;
            for (key, value) in entries {
                let below = format!("{field}.{key}");
                let key_found = Found {
                    value: key.as_str(),
                    span: &value.span,
                    field: below.clone(),
                };
                let key = template(&key_found, names, Place::Value, findings);
                match (key, tree_of(value, &below, names, findings)) {
                    (Some(key), Some(value)) => out.push((key, value)),
                    _ => valid = false,
                }
            }
            valid.then_some(Tree::Object(out))
        }
        _ => Some(Tree::Literal(tree::to_json(node))),
    }
}

fn response_spec(table: &Table<'_>, findings: &mut Findings<'_>) -> Option<ResponseSpec> {
    table.only(&["success", "id", "id_header"], findings);
    let success = table.unsigneds("success", findings).map(|statuses| {
        let mut out = Vec::new();
        for found in statuses {
            match u16::try_from(found.value) {
                Ok(status) if (200..=299).contains(&status) => out.push(status),
                _ => findings.add(Some(found.span), &found.field, format!("is {}; success statuses are 2xx (other answers are classified by the error table)", found.value)),
            }
        }
        out
    });
    if success.as_ref().is_some_and(Vec::is_empty) {
        findings.add(
            table.get("success").map(|node| &node.span),
            &table.field("success"),
            "is empty; list the 2xx statuses that mean success, or leave it out for any 2xx",
        );
    }
    let id = match (
        table.string("id", findings),
        table.string("id_header", findings),
    ) {
        (Some(found), None) => pointer(&found, findings).map(IdSource::Pointer),
        (None, Some(found)) => header_name(&found, findings).map(IdSource::Header),
        (Some(_), Some(found)) => {
            findings.add(Some(found.span), &table.field("id"), "write id (a JSON pointer into the body) or id_header (a header like \"location\"), not both");
            None
        }
        (None, None) => {
            if !table.has("id") && !table.has("id_header") {
                table.missing("id", "write id = \"/id\" (a JSON pointer into the body), or id_header = \"location\" for answers without a body", findings);
            }
            None
        }
    };
    Some(ResponseSpec { success, id: id? })
}

fn status_match(
    table: &Table<'_>,
    key: &str,
    findings: &mut Findings<'_>,
) -> Option<Option<StatusMatch>> {
    let Some(sub) = table.table(key, findings) else {
        return (!table.has(key)).then_some(None);
    };
    sub.only(&["status", "code"], findings);
    if !sub.has("status") {
        sub.missing(
            "status",
            "write the HTTP status, e.g. status = 409",
            findings,
        );
    }
    let status = status(&sub, "status", findings)?;
    let code = sub
        .string("code", findings)
        .map(|found| found.value.to_owned());
    Some(Some(StatusMatch { status, code }))
}

fn dedup_spec(table: &Table<'_>, findings: &mut Findings<'_>) -> Option<Dedup> {
    let kind = table.required_string(
        "kind",
        "write kind = \"idempotency_key\", \"unique_label\", \"naturally_idempotent\" or \"none\"",
        findings,
    )?;
    match kind.value {
        "idempotency_key" => {
            table.only(
                &[
                    "kind",
                    "header",
                    "retention_s",
                    "safety_margin_s",
                    "in_flight",
                ],
                findings,
            );
            let header = match table.string("header", findings) {
                Some(found) => header_name(&found, findings),
                None => Some(HeaderName::from_static(DEFAULT_IDEMPOTENCY_HEADER)),
            };
            let (retention_s, safety_margin_s) = retention(table, findings);
            let in_flight = status_match(table, "in_flight", findings);
            Some(Dedup::IdempotencyKey {
                header: header?,
                retention_s: retention_s?,
                safety_margin_s: safety_margin_s?,
                in_flight: in_flight?,
            })
        }
        "unique_label" => {
            table.only(&["kind", "conflict"], findings);
            Some(Dedup::UniqueLabel {
                conflict: status_match(table, "conflict", findings)?,
            })
        }
        "naturally_idempotent" | "none" => {
            table.only(&["kind"], findings);
            Some(if kind.value == "none" {
                Dedup::None
            } else {
                Dedup::NaturallyIdempotent
            })
        }
        other => {
            findings.add(Some(kind.span), &kind.field, format!("`{other}` is no dedup kind; write \"idempotency_key\", \"unique_label\", \"naturally_idempotent\" or \"none\""));
            None
        }
    }
}

pub(super) fn retention(
    table: &Table<'_>,
    findings: &mut Findings<'_>,
) -> (Option<u64>, Option<u64>) {
    for key in ["retention_s", "safety_margin_s"] {
        if !table.has(key) {
            let hint = if key == "retention_s" {
                "write how long the provider remembers a key, in seconds, as its documentation says (Stripe: retention_s = 86400)"
            } else {
                "write how much of the retention a retry never uses, in seconds (queueing and delivery time), e.g. safety_margin_s = 3600"
            };
            table.missing(key, hint, findings);
        }
    }
    let retention = table.unsigned("retention_s", findings);
    let margin = table.unsigned("safety_margin_s", findings);
    let retention_s = retention.as_ref().and_then(|found| {
        if (1..=MAX_KEY_RETENTION_S).contains(&found.value) {
            Some(found.value)
        } else {
            findings.add(
                Some(found.span),
                &found.field,
                format!(
                    "is {}; write 1 to {MAX_KEY_RETENTION_S} seconds (a year)",
                    found.value
                ),
            );
            None
        }
    });
    let margin_s = margin.as_ref().and_then(|found| match retention_s {
        Some(retention_s) if found.value >= retention_s => {
            findings.add(Some(found.span), &found.field, format!("({}) must be smaller than retention_s ({retention_s}), or no retry would ever be safe", found.value));
            None
        }
        _ => Some(found.value),
    });
    (retention_s, margin_s)
}

fn lookup_spec(
    table: &Table<'_>,
    names: &Names<'_>,
    auth: Option<&Auth>,
    findings: &mut Findings<'_>,
) -> Option<Lookup> {
    let kind = table.required_string(
        "kind",
        "write kind = \"by_key\", \"by_label\", \"search\" or \"none\"",
        findings,
    )?;
    let mut known = REQUEST_KEYS.to_vec();
    known.push("kind");
    match kind.value {
        "none" => {
            table.only(&["kind"], findings);
            Some(Lookup::None)
        }
        "by_key" | "by_label" => {
            known.extend_from_slice(&["found", "in_progress", "not_found", "id"]);
            table.only(&known, findings);
            let by = if kind.value == "by_key" {
                LookupBy::Key
            } else {
                LookupBy::Label
            };
            consistent(table, names, auth, by, findings).map(Lookup::Consistent)
        }
        "search" => {
            known.extend_from_slice(&[
                "status",
                "results",
                "id",
                "label_at",
                "account_at",
                "lag_ms",
            ]);
            table.only(&known, findings);
            search(table, names, auth, findings).map(Lookup::Search)
        }
        other => {
            findings.add(Some(kind.span), &kind.field, format!("`{other}` is no lookup kind; write \"by_key\", \"by_label\", \"search\" or \"none\""));
            None
        }
    }
}

fn consistent(
    table: &Table<'_>,
    names: &Names<'_>,
    auth: Option<&Auth>,
    by: LookupBy,
    findings: &mut Findings<'_>,
) -> Option<ConsistentLookup> {
    let request = request_spec(table, names, auth, Some(Method::GET), findings);
    let found = match table.has("found") {
        true => expect(table, "found", findings),
        false => Some(Expect {
            status: 200,
            at: None,
            equals: None,
        }),
    };
    let in_progress = match table.has("in_progress") {
        true => expect(table, "in_progress", findings).map(Some),
        false => Some(None),
    };
    if !table.has("not_found") {
        table.missing("not_found", "write the answer that proves there is no such object, e.g. not_found = { status = 404, at = \"/error/type\", equals = \"not_found\" }", findings);
    }
    let not_found = expect(table, "not_found", findings);
    let id = match table.string("id", findings) {
        Some(found) => pointer(&found, findings),
        None => (!table.has("id")).then(|| "/id".to_owned()),
    };
    Some(ConsistentLookup {
        by,
        request: request?,
        found: found?,
        in_progress: in_progress?,
        not_found: not_found?,
        id: id?,
    })
}

fn search(
    table: &Table<'_>,
    names: &Names<'_>,
    auth: Option<&Auth>,
    findings: &mut Findings<'_>,
) -> Option<SearchLookup> {
    let request = request_spec(table, names, auth, Some(Method::GET), findings);
    let status = match table.has("status") {
        true => status(table, "status", findings),
        false => Some(200),
    };
    // A search's pointers may name settings: where a result carries the label depends on the
    // property the user created for it (HubSpot: `/properties/<the property's name>`).
    let settings = names.settings;
    // `results` and `id` name one value each; `label_at` and `account_at` may say "any element
    // of this array" with a `*` step (see [`crate::pointer`]).
    let one_value = |found: Found<'_, &str>, findings: &mut Findings<'_>| {
        let text = settings_pointer(&found, settings, findings)?;
        check_no_any_step(&text)
            .map_err(|message| findings.add(Some(found.span), &found.field, message))
            .ok()
            .map(|()| text)
    };
    let any_element = |found: Found<'_, &str>, findings: &mut Findings<'_>| {
        let text = settings_pointer(&found, settings, findings)?;
        check_any_steps(&text)
            .map_err(|message| findings.add(Some(found.span), &found.field, message))
            .ok()
            .map(|()| text)
    };
    let results = table
        .required_string(
            "results",
            "write where the results array is, e.g. results = \"/results\"",
            findings,
        )
        .and_then(|found| one_value(found, findings));
    let label_at = table
        .required_string(
            "label_at",
            "a search result counts only when it carries the operation's label; write where it is, e.g. label_at = \"/opledger_label\", or label_at = \"/custom_fields/*\" for any element of an array (a title is never evidence)",
            findings,
        )
        .and_then(|found| any_element(found, findings));
    let id = match table.string("id", findings) {
        Some(found) => one_value(found, findings),
        None => (!table.has("id")).then(|| "/id".to_owned()),
    };
    let account_at = table
        .string("account_at", findings)
        .and_then(|found| any_element(found, findings));
    if !table.has("lag_ms") {
        table.missing("lag_ms", "write how long the search index may lag behind a create, in milliseconds, e.g. lag_ms = 2000", findings);
    }
    let lag_ms = table.unsigned("lag_ms", findings).and_then(|found| {
        if found.value > MAX_SEARCH_LAG_MS {
            findings.add(
                Some(found.span),
                &found.field,
                format!(
                    "is {}; the longest lag accepted is {MAX_SEARCH_LAG_MS} ms (a day)",
                    found.value
                ),
            );
            return None;
        }
        Some(found.value)
    });
    Some(SearchLookup {
        request: request?,
        status: status?,
        results: results?,
        id: id?,
        label_at: label_at?,
        account_at,
        lag_ms: lag_ms?,
    })
}

fn expect(table: &Table<'_>, key: &str, findings: &mut Findings<'_>) -> Option<Expect> {
    let sub = table.table(key, findings)?;
    sub.only(&["status", "at", "equals"], findings);
    if !sub.has("status") {
        sub.missing(
            "status",
            "write the HTTP status of this answer, e.g. status = 200",
            findings,
        );
    }
    let status = status(&sub, "status", findings);
    let at = optional_pointer(&sub, "at", findings);
    let equals = sub.get("equals").and_then(|node| match &node.value {
        tree::Value::String(_) | tree::Value::Integer(_) | tree::Value::Boolean(_) => {
            Some(tree::to_json(node))
        }
        other => {
            findings.add(
                Some(&node.span),
                &sub.field("equals"),
                format!("must be a string, integer or boolean, not {}", other.kind()),
            );
            None
        }
    });
    if sub.has("at") != sub.has("equals") {
        findings.add(
            Some(sub.span()),
            sub.path(),
            "write both at (a JSON pointer) and equals (the value there), or neither",
        );
        return None;
    }
    Some(Expect {
        status: status?,
        at,
        equals,
    })
}

/// Whether any template of the request (path, query, headers, body) names `wanted`.
pub(crate) fn request_uses(request: &RequestSpec, wanted: &Ref) -> bool {
    request.path.uses(wanted)
        || request
            .query
            .iter()
            .any(|(_, template)| template.uses(wanted))
        || request
            .headers
            .iter()
            .any(|(_, template)| template.uses(wanted))
        || request.body.as_ref().is_some_and(|body| {
            body.templates()
                .iter()
                .any(|(_, template)| template.uses(wanted))
        })
}

/// The checks that tie an action's parts together.
fn contract_checks(table: &Table<'_>, action: &Action, findings: &mut Findings<'_>) {
    let at = |key: &str| table.get(key).map(|node| &node.span);
    match &action.dedup {
        Dedup::UniqueLabel { .. } if !request_uses(&action.request, &Ref::Label) => findings.add(
            at("dedup"),
            &table.field("dedup.kind"),
            "is \"unique_label\", but the request never sends {{label}}; put it where the provider enforces uniqueness (e.g. path = \"/tasks/by-label/{{label}}\")",
        ),
        Dedup::IdempotencyKey { header, .. }
            if action.request.headers.iter().any(|(name, _)| name == header) => findings.add(
            at("request"),
            &table.field("request.headers"),
            format!("sets `{header}`, which the idempotency_key contract sends itself with {{{{key}}}}; remove it"),
        ),
        _ => {}
    }
    if let Lookup::Consistent(lookup) = &action.lookup {
        let (wanted, what) = match lookup.by {
            LookupBy::Key => (Ref::Key, "by_key"),
            LookupBy::Label => (Ref::Label, "by_label"),
        };
        if !request_uses(&lookup.request, &wanted) {
            findings.add(at("lookup"), &table.field("lookup"), format!("is {what}, but its request never sends {wanted}; put it in the path, e.g. path = \"/requests/{wanted}\""));
        }
        let key_sent = matches!(action.dedup, Dedup::IdempotencyKey { .. })
            || request_uses(&action.request, &Ref::Key);
        if lookup.by == LookupBy::Key && !key_sent {
            findings.add(at("lookup"), &table.field("lookup.kind"), "is by_key, but the action never sends {{key}} (no idempotency_key dedup, no {{key}} in the request), so there is nothing to look up by");
        }
    }
    if let Lookup::Search(_) = &action.lookup {
        if !request_uses(&action.request, &Ref::Label) {
            findings.add(at("lookup"), &table.field("lookup.kind"), "is search, but the request never sends {{label}}, so no result can carry it; add the label to the body (e.g. opledger_label = \"{{label}}\")");
        }
    }
}
