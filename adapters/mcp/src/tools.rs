//! The tools a tenant sees, and how a call's arguments become an intent.
//!
//! One tool per action of each provider where the tenant owns an account, named
//! `<provider>__<action>` with every character outside `[A-Za-z0-9_]` written as `_`
//! (`crm-plain` → `crm_plain__create_task`), at most 64 characters: the one name valid as it is
//! in every framework (OpenAI's function names, Anthropic's tool names, Gemini's, MCP's), so no
//! framework renames a tool and a name in `GET /v1/actions`, an MCP listing and an adapter is the
//! same text. A call under the name the tool had before (`crm-plain__create_task`) still finds
//! it; only the new name is listed. The input schema is the action's own JSON Schema with opledger's fields
//! added beside the action's properties: `request_id` always, and `account` (an enum of the
//! tenant's accounts, required) only when the tenant has more than one account at the provider —
//! with one account the tool acts in it and its description says which. An action whose input
//! already has a property with one of those names is not offered (a warning names it), since its
//! argument could not be told from opledger's.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::model::{Tool, ToolAnnotations};
use serde_json::{json, Map, Value};
use tracing::warn;

use crate::{reply, ActionTool, PassThroughTool, ToolCall};

/// The `_meta` key a client may send the request id under (reverse-DNS prefix, as the MCP spec
/// asks of keys that are not its own).
pub const META_REQUEST_ID: &str = "dev.opledger/request_id";
/// The optional argument every action tool takes the request id in.
pub const REQUEST_ID_ARG: &str = "request_id";
/// The optional argument naming the data subject a call is about (the person whose values it
/// carries), offered when the server keeps personal data. Not `subject`: that is a common
/// argument of actions themselves (an e-mail's subject line).
pub const SUBJECT_ARG: &str = "data_subject";
/// The `_meta` key a client may send the data subject under (a host that knows whom the
/// conversation is about, without asking the model).
pub const META_SUBJECT: &str = "dev.opledger/subject";
/// The argument naming the account, when the tenant has several at the provider.
pub const ACCOUNT_ARG: &str = "account";
/// The longest request id, in bytes (the source id it becomes is at most 256).
pub const MAX_REQUEST_ID_BYTES: usize = 200;
/// The tool that shows one operation.
pub const STATUS_TOOL: &str = "operation_status";
/// The tool that lists the operations not settled yet.
pub const LIST_TOOL: &str = "list_operations";
/// The longest tool name, in characters: OpenAI's function names allow 64 (`^[a-zA-Z0-9_-]{1,64}$`),
/// MCP 128, so 64 is the length every framework takes as it is.
const MAX_TOOL_NAME_CHARS: usize = 64;
/// Prefixes a request id into the source id namespace, apart from the HTTP API's.
const SOURCE_PREFIX: &str = "mcp:";
/// The states `list_operations` takes: every state an operation is not settled in.
pub(crate) const OPEN_STATES: [&str; 5] = [
    "awaiting_approval",
    "pending",
    "in_flight",
    "unknown",
    "needs_review",
];

/// What the server tells a client about itself at the start of a session.
pub(crate) const INSTRUCTIONS: &str = "opledger records every tool call before it reaches the external system, and answers with where it stands; say to the user only what the answer's text says. Pass a fresh request_id (any unique text, e.g. a UUID) with every new request, and the same request_id when you retry one whose answer you did not get: it finds the same operation instead of doing it twice. When an answer says the outcome is not confirmed yet, do not repeat the call: ask operation_status with its operation_id.";

/// The source id a request id records under: `mcp:` and the request id.
pub fn source_id_of(request_id: &str) -> String {
    format!("{SOURCE_PREFIX}{request_id}")
}

/// Who fills a tool's arguments, which decides how the request is named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    /// An MCP client: the model passes `request_id` (or the client sends it in `_meta`), so the
    /// schema offers it and the description tells the model how to use it.
    Mcp,
    /// An agent framework's tool (`GET /v1/actions`): the framework's own tool-call id is the
    /// request id, so the model never sees one and is never asked to invent one.
    Framework,
}

/// One action described as a tool: its name, what the model reads, the arguments it fills.
#[derive(Clone, Debug, PartialEq)]
pub struct Described {
    /// `<provider>__<action>`, only `[A-Za-z0-9_]`, at most 64 characters.
    pub name: String,
    /// What the model reads about the tool.
    pub description: String,
    /// The action's input schema with opledger's fields beside its properties.
    pub input_schema: Map<String, Value>,
    /// Whether a repeat without the same request id is harmless (MCP's `idempotentHint`).
    pub idempotent_hint: bool,
}

/// `action` described as a tool for `audience`, or why it cannot be offered (the MCP server
/// and `GET /v1/actions` both leave such an action out).
pub fn describe(action: &ActionTool, audience: Audience) -> Result<Described, String> {
    let name = tool_name(&action.provider, &action.action);
    if name.chars().count() > MAX_TOOL_NAME_CHARS {
        return Err(format!(
            "the name is longer than {MAX_TOOL_NAME_CHARS} characters"
        ));
    }
    Ok(Described {
        input_schema: input_schema(action, audience)?,
        description: description(action, audience),
        idempotent_hint: action.repeat_harmless,
        name,
    })
}

/// The tenant's tools, and which action (or read-only upstream tool) each stands for.
pub(crate) struct Catalog {
    tools: Vec<Tool>,
    actions: BTreeMap<String, ActionTool>,
    pass_through: BTreeMap<String, PassThroughTool>,
    /// The name each tool had when `-` and `.` were kept (`crm-plain__create_task`) → its name
    /// now, so a client holding an old listing still reaches the tool. Never listed.
    former_names: BTreeMap<String, String>,
}

impl Catalog {
    /// The tools for `actions`, then `pass_through` (read-only upstream tools, named
    /// `<provider>__<tool>` as actions are; one whose name an action or opledger's own tool
    /// has is not offered), plus `operation_status` and `list_operations`.
    pub(crate) fn of(actions: Vec<ActionTool>, pass_through: Vec<PassThroughTool>) -> Self {
        let mut tools = Vec::new();
        let mut by_name = BTreeMap::new();
        let mut former_names = BTreeMap::new();
        for action in actions {
            let name = tool_name(&action.provider, &action.action);
            let former = former_tool_name(&action.provider, &action.action);
            match action_tool(&action) {
                Ok(tool) if !by_name.contains_key(&name) => {
                    tools.push(tool);
                    if former != name {
                        former_names.insert(former, name.clone());
                    }
                    by_name.insert(name, action);
                }
                Ok(_) => {
                    warn!(tool = %name, "two actions make the same tool name; the second is not offered")
                }
                Err(problem) => warn!(tool = %name, %problem, "action not offered as a tool"),
            }
        }
        let mut passed = BTreeMap::new();
        for tool in pass_through {
            let name = tool_name(&tool.provider, &tool.tool);
            let taken = by_name.contains_key(&name)
                || passed.contains_key(&name)
                || name == STATUS_TOOL
                || name == LIST_TOOL;
            match pass_through_tool(&name, &tool) {
                Ok(listed) if !taken => {
                    tools.push(listed);
                    passed.insert(name, tool);
                }
                Ok(_) => {
                    warn!(tool = %name, "a read-only tool has the name of another tool; it is not offered")
                }
                Err(problem) => warn!(tool = %name, %problem, "read-only tool not offered"),
            }
        }
        tools.push(status_tool());
        tools.push(list_tool());
        Self {
            tools,
            actions: by_name,
            pass_through: passed,
            former_names,
        }
    }

    /// Every tool, in order.
    pub(crate) fn tools(self) -> Vec<Tool> {
        self.tools
    }

    /// The action a tool name stands for, by its name or the name it had before.
    pub(crate) fn action(&self, name: &str) -> Option<&ActionTool> {
        self.actions.get(name).or_else(|| {
            self.former_names
                .get(name)
                .and_then(|current| self.actions.get(current))
        })
    }

    /// The read-only upstream tool listed as `name`.
    pub(crate) fn pass_through(&self, name: &str) -> Option<&PassThroughTool> {
        self.pass_through.get(name)
    }
}

/// The MCP tool for a read-only upstream tool: its own description and input schema, marked as
/// passed through outside the ledger.
fn pass_through_tool(name: &str, tool: &PassThroughTool) -> Result<Tool, String> {
    if name.chars().count() > MAX_TOOL_NAME_CHARS {
        return Err(format!(
            "the name is longer than {MAX_TOOL_NAME_CHARS} characters"
        ));
    }
    let Some(schema) = tool.input.as_object() else {
        return Err("its input schema is not an object schema".to_owned());
    };
    let what = tool.description.trim();
    let description = format!(
        "{what}{}Read-only, at {}: passed to it as it is, not recorded in the ledger.",
        if what.is_empty() { "" } else { "\n" },
        tool.provider
    );
    let annotations = ToolAnnotations::new()
        .read_only(true)
        .destructive(false)
        .idempotent(true)
        .open_world(true);
    Ok(Tool::new(name.to_owned(), description, Arc::new(schema.clone())).annotate(annotations))
}

/// The actions a call of tool `name` needs, of all a tenant has: those named `name` now or
/// before, and those sharing a current name with them (see [`tools_named`]), so a call does
/// not build every tool's schemas (0.32 ms a call for forty actions). A catalogue of them
/// answers [`Catalog::action`] for `name` exactly as the whole catalogue would.
pub fn actions_for_call(actions: Vec<ActionTool>, name: &str) -> Vec<ActionTool> {
    let wanted = tools_named(
        actions
            .iter()
            .map(|action| (action.provider.as_str(), action.action.as_str())),
        name,
    );
    actions
        .into_iter()
        .filter(|action| wanted.contains(&tool_name(&action.provider, &action.action)))
        .collect()
}

/// The current tool names a call of tool `name` must see the actions of, among the (provider,
/// action) pairs of a catalogue: those named `name` now or before. Whether an action is offered
/// depends on the actions before it with the same current name (the first keeps it), so each
/// one comes with all of those: [`Catalog::action`] then answers for `name` as the whole
/// catalogue would.
pub fn tools_named<'a>(
    actions: impl Iterator<Item = (&'a str, &'a str)>,
    name: &str,
) -> std::collections::HashSet<String> {
    actions
        .filter(|(provider, action)| {
            tool_name(provider, action) == name || former_tool_name(provider, action) == name
        })
        .map(|(provider, action)| tool_name(provider, action))
        .collect()
}

/// The tool name of `action` at `provider`: `<provider>__<action>`, with every character outside
/// `[A-Za-z0-9_]` as `_`.
pub fn tool_name(provider: &str, action: &str) -> String {
    format!("{provider}__{action}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The name a tool had when `-` and `.` were kept as they are.
fn former_tool_name(provider: &str, action: &str) -> String {
    format!("{provider}__{action}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The MCP tool for one action, or why it cannot be offered.
fn action_tool(action: &ActionTool) -> Result<Tool, String> {
    let described = describe(action, Audience::Mcp)?;
    let annotations = ToolAnnotations::new()
        .read_only(false)
        .destructive(action.destructive)
        // A repeat without the same request_id is a new operation, so only a provider that
        // ignores repeats makes it harmless.
        .idempotent(described.idempotent_hint)
        .open_world(true);
    Ok(Tool::new(
        described.name,
        described.description,
        Arc::new(described.input_schema),
    )
    .with_raw_output_schema(Arc::new(reply::outcome_schema()))
    .annotate(annotations))
}

/// What the model reads about an action tool.
fn description(action: &ActionTool, audience: Audience) -> String {
    let what = capitalized(action.description.trim().trim_end_matches('.'));
    let account = match action.accounts.as_slice() {
        [only] => format!("in account `{only}` at {}", action.provider),
        _ => format!(
            "at {}, in the account named by `{ACCOUNT_ARG}`",
            action.provider
        ),
    };
    let recorded = "The call is recorded before it is sent and answers where it stands; tell the user only what the answer says.";
    match audience {
        Audience::Mcp => format!(
            "{what} {account}. {recorded} Pass a fresh `{REQUEST_ID_ARG}` with every new request and the same `{REQUEST_ID_ARG}` when you retry one, so a retry finds the same operation instead of doing it twice. If the answer says it is not confirmed yet, do not repeat the call: ask `{STATUS_TOOL}` with its operation_id."
        ),
        // The framework names the request with its tool-call id, and its tools have no
        // `operation_status` beside them: the answer itself says how to follow it up.
        Audience::Framework => format!(
            "{what} {account}. {recorded} If the answer says it is not confirmed yet, do not repeat the call."
        ),
    }
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

/// The action's input schema with opledger's fields beside its properties.
fn input_schema(action: &ActionTool, audience: Audience) -> Result<Map<String, Value>, String> {
    let Some(schema) = action.input.as_object() else {
        return Err("its input schema is not an object schema".to_owned());
    };
    let mut schema = schema.clone();
    schema.insert("type".to_owned(), json!("object"));
    let properties = schema
        .entry("properties")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or("its input schema's `properties` is not an object")?;
    let mut ours = Vec::new();
    if audience == Audience::Mcp {
        ours.push(REQUEST_ID_ARG);
    }
    if action.accounts.len() > 1 {
        ours.push(ACCOUNT_ARG);
    }
    let takes_subject = audience == Audience::Mcp && action.takes_subject;
    if takes_subject {
        ours.push(SUBJECT_ARG);
    }
    if let Some(taken) = ours.iter().find(|name| properties.contains_key(**name)) {
        return Err(format!(
            "its input already has a property `{taken}`, which opledger's tools reserve"
        ));
    }
    if audience == Audience::Mcp {
        properties.insert(
            REQUEST_ID_ARG.to_owned(),
            json!({
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_REQUEST_ID_BYTES,
                "description": "Names this request: fresh for every new request, the same when retrying it (a retry then finds the same operation). Also accepted as _meta \"dev.opledger/request_id\".",
            }),
        );
    }
    if takes_subject {
        properties.insert(
            SUBJECT_ARG.to_owned(),
            json!({
                "type": "string",
                "minLength": 1,
                "maxLength": opledger_domain::personal::MAX_SUBJECT_BYTES,
                "description": "The person this request is about, if it carries personal data (their e-mail address or customer id, the same for every request about them): their values are then stored so that they can be erased on request. Also accepted as _meta \"dev.opledger/subject\".",
            }),
        );
    }
    if action.accounts.len() > 1 {
        properties.insert(
            ACCOUNT_ARG.to_owned(),
            json!({"type": "string", "enum": action.accounts, "description": "The account to act in."}),
        );
        let required = schema.entry("required").or_insert_with(|| json!([]));
        if let Some(required) = required.as_array_mut() {
            required.push(json!(ACCOUNT_ARG));
        }
    }
    Ok(schema)
}

/// The intent a call of `action`'s tool asks for: opledger's fields taken out of the arguments,
/// the request id from `_meta` (if sent) or the `request_id` argument.
pub(crate) fn read_call(
    action: &ActionTool,
    mut arguments: Map<String, Value>,
    meta: Option<&Value>,
    meta_subject: Option<&Value>,
) -> Result<ToolCall, String> {
    let subject = match action.takes_subject {
        true => subject_of(arguments.remove(SUBJECT_ARG), meta_subject)?,
        false => None,
    };
    let argument = arguments
        .remove(REQUEST_ID_ARG)
        .map(|value| request_id(REQUEST_ID_ARG, value))
        .transpose()?;
    let from_meta = meta
        .map(|value| request_id(META_REQUEST_ID, value.clone()))
        .transpose()?;
    let request_id = match (from_meta, argument) {
        (Some(meta), Some(argument)) if meta != argument => {
            return Err(format!(
                "`{REQUEST_ID_ARG}` ({argument}) and _meta `{META_REQUEST_ID}` ({meta}) differ; both name the request: send one, or the same in both. Nothing was recorded."
            ))
        }
        (Some(meta), _) => Some(meta),
        (None, argument) => argument,
    };
    let account = match (action.accounts.as_slice(), arguments.remove(ACCOUNT_ARG)) {
        ([only], None) => only.clone(),
        (accounts, Some(Value::String(named))) if accounts.contains(&named) => named,
        (accounts, named) => {
            return Err(format!(
                "`{ACCOUNT_ARG}` must be one of {} (got {}); nothing was recorded",
                accounts.join(", "),
                named.map_or_else(|| "nothing".to_owned(), |value| value.to_string())
            ))
        }
    };
    Ok(ToolCall {
        provider: action.provider.clone(),
        account,
        action: action.action.clone(),
        args: Value::Object(arguments),
        source_id: request_id.as_deref().map(source_id_of),
        subject,
    })
}

/// The data subject from the argument or `_meta` (the same in both when both are sent).
fn subject_of(argument: Option<Value>, meta: Option<&Value>) -> Result<Option<String>, String> {
    let text = |field: &str, value: Value| {
        match value {
        Value::String(text) if !text.trim().is_empty() => Ok(text),
        Value::Null => Err(format!("`{field}` is null; leave it out when the request is about nobody; nothing was recorded")),
        other => Err(format!(
            "`{field}` must be text naming the person (got {other}); nothing was recorded"
        )),
    }
    };
    let argument = argument.map(|value| text(SUBJECT_ARG, value)).transpose()?;
    let from_meta = meta
        .map(|value| text(META_SUBJECT, value.clone()))
        .transpose()?;
    match (from_meta, argument) {
        (Some(meta), Some(argument)) if meta != argument => Err(format!(
            "`{SUBJECT_ARG}` and _meta `{META_SUBJECT}` name different people; send one, or the same in both. Nothing was recorded."
        )),
        (Some(meta), _) => Ok(Some(meta)),
        (None, argument) => Ok(argument),
    }
}

/// A request id: text of 1..=[`MAX_REQUEST_ID_BYTES`] bytes.
fn request_id(field: &str, value: Value) -> Result<String, String> {
    match value {
        Value::String(text) if !text.trim().is_empty() && text.len() <= MAX_REQUEST_ID_BYTES => {
            Ok(text)
        }
        other => Err(format!(
            "`{field}` must be text of 1 to {MAX_REQUEST_ID_BYTES} bytes (got {other}); nothing was recorded"
        )),
    }
}

/// `operation_status`'s `operation_id`.
pub(crate) fn read_operation_id(arguments: &Map<String, Value>) -> Result<String, String> {
    match arguments.get("operation_id") {
        Some(Value::String(id)) => Ok(id.clone()),
        _ => Err("`operation_id` is required: the id a tool call answered with".to_owned()),
    }
}

/// `list_operations`' optional `state`.
pub(crate) fn read_state(arguments: &Map<String, Value>) -> Result<Option<String>, String> {
    match arguments.get("state") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(state)) if OPEN_STATES.contains(&state.as_str()) => {
            Ok(Some(state.clone()))
        }
        Some(other) => Err(format!(
            "`state` must be one of {} (got {other})",
            OPEN_STATES.join(", ")
        )),
    }
}

fn status_tool() -> Tool {
    let schema = json!({
        "type": "object",
        "required": ["operation_id"],
        "properties": {"operation_id": {"type": "string", "description": "The operation_id a tool call answered with."}},
    });
    Tool::new(
        STATUS_TOOL,
        "Where an operation stands now (succeeded with the object's id, refused, not confirmed yet, with a person), and what to tell the user. Ask this instead of repeating a call whose outcome is not confirmed.",
        Arc::new(object(schema)),
    )
    .with_raw_output_schema(Arc::new(reply::outcome_schema()))
    .annotate(read_only())
}

fn list_tool() -> Tool {
    let schema = json!({
        "type": "object",
        "properties": {"state": {"type": "string", "enum": OPEN_STATES, "description": "Only operations in this state; all open ones without it."}},
    });
    Tool::new(
        LIST_TOOL,
        "This tenant's operations that are not settled yet: waiting for approval, pending, being sent, not confirmed (unknown), or with a person.",
        Arc::new(object(schema)),
    )
    .with_raw_output_schema(Arc::new(reply::listed_schema()))
    .annotate(read_only())
}

fn read_only() -> ToolAnnotations {
    ToolAnnotations::new()
        .read_only(true)
        .destructive(false)
        .idempotent(true)
        .open_world(false)
}

/// A `json!` object as a map.
pub(crate) fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create_task(accounts: &[&str]) -> ActionTool {
        ActionTool {
            provider: "crm".into(),
            action: "create_task".into(),
            description: "create a task".into(),
            destructive: false,
            repeat_harmless: false,
            input: json!({"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}),
            accounts: accounts.iter().map(|a| (*a).to_owned()).collect(),
            takes_subject: false,
        }
    }

    #[test]
    fn one_account_needs_no_account_argument_and_several_need_one_of_them() {
        let one = input_schema(&create_task(&["acct-1"]), Audience::Mcp).expect("a schema");
        assert!(one["properties"].get(ACCOUNT_ARG).is_none());
        assert!(one["properties"].get(REQUEST_ID_ARG).is_some());
        let two =
            input_schema(&create_task(&["acct-1", "acct-2"]), Audience::Mcp).expect("a schema");
        assert_eq!(
            two["properties"][ACCOUNT_ARG]["enum"],
            json!(["acct-1", "acct-2"])
        );
        assert_eq!(two["required"], json!(["title", ACCOUNT_ARG]));
    }

    #[test]
    fn a_calls_catalogue_finds_the_same_action_for_any_name_as_the_whole_catalogue() {
        let mut actions = Vec::new();
        for (provider, action) in [
            ("crm", "create_task"),
            ("crm-plain.v2", "create_task"),
            // Its current name is the one above's: the first keeps it.
            ("crm_plain_v2", "create_task"),
            // Its current name is the former name of the second.
            ("crm-plain.v2", "create.task"),
            ("billing", "charge"),
        ] {
            let mut tool = create_task(&["acct-1"]);
            tool.provider = provider.into();
            tool.action = action.into();
            tool.description = format!("{provider} {action}");
            actions.push(tool);
        }
        // Every name the whole catalogue lists (`tools` consumes a catalogue), former names and
        // a name nobody has.
        let mut names: Vec<String> = Catalog::of(actions.clone(), Vec::new())
            .tools()
            .into_iter()
            .map(|t| t.name.into())
            .collect();
        names.extend(
            [
                "crm-plain.v2__create_task",
                "crm-plain.v2__create.task",
                "nobody__nothing",
            ]
            .map(String::from),
        );
        let whole = Catalog::of(actions.clone(), Vec::new());
        for name in &names {
            let for_call = Catalog::of(actions_for_call(actions.clone(), name), Vec::new());
            assert_eq!(
                for_call.action(name).map(|a| &a.description),
                whole.action(name).map(|a| &a.description),
                "{name}"
            );
        }
        assert!(whole.action("billing__charge").is_some());
    }

    #[test]
    fn tool_names_are_valid_in_every_framework_as_they_are_and_former_names_still_resolve() {
        let mut plain = create_task(&["acct-1"]);
        plain.provider = "crm-plain.v2".into();
        let catalog = Catalog::of(vec![plain], Vec::new());
        assert!(catalog.action("crm_plain_v2__create_task").is_some());
        assert!(
            catalog.action("crm-plain.v2__create_task").is_some(),
            "a client holding the former name still reaches the tool"
        );
        let names: Vec<String> = catalog.tools().into_iter().map(|t| t.name.into()).collect();
        assert_eq!(names, ["crm_plain_v2__create_task", STATUS_TOOL, LIST_TOOL]);
        for name in &names {
            assert!(
                (1..=64).contains(&name.len())
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{name} matches ^[A-Za-z0-9_]{{1,64}}$"
            );
        }
    }

    #[test]
    fn read_only_upstream_tools_are_listed_as_read_only_and_never_take_an_actions_name() {
        let query = PassThroughTool {
            provider: "db".into(),
            tool: "read_query".into(),
            description: "Run a SELECT".into(),
            input: json!({"type": "object", "properties": {"query": {"type": "string"}}}),
        };
        let shadowing = PassThroughTool {
            tool: "create_task".into(),
            provider: "crm".into(),
            ..query.clone()
        };
        let catalog = Catalog::of(vec![create_task(&["acct-1"])], vec![query, shadowing]);
        assert_eq!(
            catalog
                .pass_through("db__read_query")
                .map(|t| t.tool.as_str()),
            Some("read_query")
        );
        assert!(
            catalog.pass_through("crm__create_task").is_none(),
            "the action keeps its name; the read-only tool under it is not offered"
        );
        let tools = catalog.tools();
        let listed = tools
            .iter()
            .find(|tool| tool.name == "db__read_query")
            .expect("listed");
        let hints = listed.annotations.clone().expect("annotations");
        assert_eq!(hints.read_only_hint, Some(true));
        assert!(listed
            .description
            .as_deref()
            .is_some_and(|text| text.contains("not recorded in the ledger")));
        assert_eq!(
            tools.len(),
            4,
            "the action, the read-only tool, status and list"
        );
    }

    #[test]
    fn a_tool_name_longer_than_64_characters_is_not_offered_and_says_why() {
        let mut long = create_task(&["acct-1"]);
        long.provider = "p".repeat(60);
        let refused = describe(&long, Audience::Framework).expect_err("too long");
        assert!(refused.contains("64"), "{refused}");
    }

    #[test]
    fn an_action_with_a_request_id_property_of_its_own_is_not_offered() {
        let mut action = create_task(&["acct-1"]);
        action.input["properties"][REQUEST_ID_ARG] = json!({"type": "string"});
        let catalog = Catalog::of(vec![action], Vec::new());
        assert!(catalog.action("crm__create_task").is_none());
        let names: Vec<String> = catalog.tools().into_iter().map(|t| t.name.into()).collect();
        assert_eq!(names, [STATUS_TOOL, LIST_TOOL]);
    }

    #[test]
    fn the_request_id_is_taken_out_of_the_arguments_and_prefixed() {
        let arguments = object(json!({"title": "Call", "request_id": "r-1"}));
        let call = read_call(&create_task(&["acct-1"]), arguments, None, None).expect("a call");
        assert_eq!(call.source_id.as_deref(), Some("mcp:r-1"));
        assert_eq!(call.args, json!({"title": "Call"}));
        assert_eq!(call.account, "acct-1");
    }

    #[test]
    fn meta_and_argument_naming_different_requests_are_refused() {
        let arguments = object(json!({"title": "Call", "request_id": "r-1"}));
        let refused = read_call(
            &create_task(&["acct-1"]),
            arguments,
            Some(&json!("r-2")),
            None,
        )
        .expect_err("refused");
        assert!(refused.contains("differ"), "{refused}");
        let same = object(json!({"title": "Call", "request_id": "r-1"}));
        let call =
            read_call(&create_task(&["acct-1"]), same, Some(&json!("r-1")), None).expect("a call");
        assert_eq!(call.source_id.as_deref(), Some("mcp:r-1"));
    }

    #[test]
    fn an_account_the_tenant_does_not_have_is_refused() {
        let arguments = object(json!({"title": "Call", "account": "acct-9"}));
        let refused = read_call(&create_task(&["acct-1", "acct-2"]), arguments, None, None)
            .expect_err("refused");
        assert!(refused.contains("acct-1, acct-2"), "{refused}");
    }

    #[test]
    fn only_a_naturally_idempotent_action_is_marked_idempotent() {
        let mut action = create_task(&["acct-1"]);
        let tool = action_tool(&action).expect("a tool");
        let hints = tool.annotations.expect("annotations");
        assert_eq!(hints.idempotent_hint, Some(false));
        assert_eq!(hints.read_only_hint, Some(false));
        action.repeat_harmless = true;
        action.destructive = true;
        let hints = action_tool(&action)
            .expect("a tool")
            .annotations
            .expect("annotations");
        assert_eq!(hints.idempotent_hint, Some(true));
        assert_eq!(hints.destructive_hint, Some(true));
    }

    #[test]
    fn a_framework_tool_takes_no_request_id_argument_and_is_not_told_to_invent_one() {
        let described =
            describe(&create_task(&["acct-1", "acct-2"]), Audience::Framework).expect("described");
        assert_eq!(described.name, "crm__create_task");
        assert!(described.input_schema["properties"]
            .get(REQUEST_ID_ARG)
            .is_none());
        assert!(described.input_schema["properties"]
            .get(ACCOUNT_ARG)
            .is_some());
        assert!(!described.description.contains(REQUEST_ID_ARG));
        assert!(described.description.starts_with("Create a task at crm"));
        // An action with its own `request_id` property can be a framework tool: the framework
        // never puts opledger's request id among the model's arguments.
        let mut own = create_task(&["acct-1"]);
        own.input["properties"][REQUEST_ID_ARG] = json!({"type": "string"});
        assert!(describe(&own, Audience::Framework).is_ok());
        assert!(describe(&own, Audience::Mcp).is_err());
    }

    #[test]
    fn a_tool_of_a_server_keeping_personal_data_takes_the_data_subject_from_its_argument_or_meta() {
        let mut action = create_task(&["acct-1"]);
        let plain = input_schema(&action, Audience::Mcp).expect("a schema");
        assert!(plain["properties"].get(SUBJECT_ARG).is_none());
        action.takes_subject = true;
        let schema = input_schema(&action, Audience::Mcp).expect("a schema");
        assert!(schema["properties"].get(SUBJECT_ARG).is_some());
        let framework = input_schema(&action, Audience::Framework).expect("a schema");
        assert!(framework["properties"].get(SUBJECT_ARG).is_none());

        let arguments = object(json!({"title": "Call", SUBJECT_ARG: "ada@example.org"}));
        let call = read_call(&action, arguments, None, None).expect("a call");
        assert_eq!(call.subject.as_deref(), Some("ada@example.org"));
        assert_eq!(
            call.args,
            json!({"title": "Call"}),
            "not an argument of the action"
        );
        let from_meta = read_call(
            &action,
            object(json!({"title": "Call"})),
            None,
            Some(&json!("ada@example.org")),
        )
        .expect("a call");
        assert_eq!(from_meta.subject.as_deref(), Some("ada@example.org"));
        let differ = read_call(
            &action,
            object(json!({"title": "Call", SUBJECT_ARG: "bob@example.org"})),
            None,
            Some(&json!("ada@example.org")),
        )
        .expect_err("refused");
        assert!(differ.contains("different people"), "{differ}");
        let number = read_call(
            &action,
            object(json!({"title": "Call", SUBJECT_ARG: 7})),
            None,
            None,
        )
        .expect_err("refused");
        assert!(number.contains(SUBJECT_ARG), "{number}");
    }
}
