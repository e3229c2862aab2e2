//! `GET /v1/actions`: the configured actions the caller's tenant token may use, each described as
//! a tool, so an agent framework builds its tools from the server and a new action needs no code.
//!
//! The descriptions and schemas are the MCP server's own ([`opledger_mcp::describe`]), for an
//! audience that names each request with the framework's tool-call id: the schema has no
//! `request_id`, and the description does not ask the model for one. An action the MCP server
//! would not offer (a clashing property name, too long a name) is left out here too, with the
//! same warning, so the two lists never disagree.

// The handlers share the parent module's imports, extractors and helpers.
use super::*;
use opledger_domain::contract::Deduplication;
use opledger_mcp::Audience;

use super::mcp::actions_of;

/// One action as a tool, as the document's `Action` schema describes it.
#[derive(Serialize)]
struct ActionView {
    name: String,
    provider: String,
    action: String,
    accounts: Vec<String>,
    description: String,
    input_schema: serde_json::Map<String, Value>,
    deduplication: &'static str,
    idempotent_hint: bool,
    destructive: bool,
}

/// The document's `Deduplication` enum: how the provider deduplicates a repeated request.
pub(crate) const DEDUPLICATIONS: [&str; 4] = [
    "idempotency_key",
    "unique_label",
    "naturally_idempotent",
    "none",
];

pub(super) fn deduplication_name(deduplication: Deduplication) -> &'static str {
    match deduplication {
        Deduplication::IdempotencyKey { .. } => DEDUPLICATIONS[0],
        Deduplication::UniqueLabel => DEDUPLICATIONS[1],
        Deduplication::NaturallyIdempotent => DEDUPLICATIONS[2],
        Deduplication::None => DEDUPLICATIONS[3],
    }
}

pub(super) async fn list(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(&headers)?;
    let tenant = tenant_of(principal)?;
    let mut actions = Vec::new();
    for (action, deduplication) in actions_of(&shared, tenant) {
        match opledger_mcp::describe(&action, Audience::Framework) {
            Ok(described) => actions.push(ActionView {
                name: described.name,
                provider: action.provider,
                action: action.action,
                accounts: action.accounts,
                description: described.description,
                input_schema: described.input_schema,
                deduplication: deduplication_name(deduplication),
                idempotent_hint: described.idempotent_hint,
                destructive: action.destructive,
            }),
            Err(problem) => {
                warn!(provider = %action.provider, action = %action.action, %problem, "action not offered as a tool")
            }
        }
    }
    Ok(json_reply(StatusCode::OK, &json!({"actions": actions})))
}
