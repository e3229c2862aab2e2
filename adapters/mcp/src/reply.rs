//! What a tool call answers: the agent's sentence as the text, the state as `structuredContent`
//! (described by the tool's `outputSchema`), and `isError` only when the call was refused — by
//! the provider (`rejected`), by an approver (`denied`), or by opledger before anything was
//! recorded. An outcome that is not known yet is no error: the text says it is not confirmed,
//! not to repeat the call, and to ask `operation_status` with the operation's id.

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{json, Map, Value};

use crate::tools::{object, OPEN_STATES, STATUS_TOOL};
use crate::{Listed, Outcome, Refusal};

/// The `state` of a call refused before anything was recorded.
const NOT_RECORDED: &str = "not_recorded";

/// What the agent should do next, for an operation in `state` with `operation_id`.
pub fn next_step(state: &str, operation_id: &str) -> String {
    match state {
        "succeeded" => "Done: tell the user the object was created; do not call again for this request.".to_owned(),
        "rejected" => "Refused by the system: tell the user why; call again only with changed arguments and a new request_id.".to_owned(),
        "denied" => "Denied by an approver: nothing was sent; tell the user.".to_owned(),
        "abandoned" => "Cancelled after review: nothing more will be sent; tell the user.".to_owned(),
        "awaiting_approval" => format!("Waiting for a person's approval; nothing was sent. Ask {STATUS_TOOL} with operation_id {operation_id} later."),
        "needs_review" => format!("A person is checking what happened. Do not repeat the call; ask {STATUS_TOOL} with operation_id {operation_id} later."),
        NOT_RECORDED => "Nothing was recorded or sent: fix what the message says, then call again.".to_owned(),
        // pending, in_flight, unknown
        _ => format!("Not confirmed yet: do not repeat the call; ask {STATUS_TOOL} with operation_id {operation_id}."),
    }
}

/// The answer for an operation.
pub(crate) fn outcome_result(outcome: &Outcome) -> CallToolResult {
    let next = next_step(&outcome.state, &outcome.operation_id);
    let mut structured = json!({
        "operation_id": outcome.operation_id,
        "state": outcome.state,
        "external_id": outcome.external_id,
        "message": outcome.message,
        "next_step": next,
    });
    if let Some(created) = outcome.created {
        structured["created"] = json!(created);
    }
    let text = format!("{}\n{next}", outcome.message);
    let refused = matches!(outcome.state.as_str(), "rejected" | "denied");
    result(text, structured, refused)
}

/// The answer for a call opledger refused before recording anything.
pub(crate) fn refusal_result(refusal: &Refusal) -> CallToolResult {
    let message = refusal.to_string();
    let next = match refusal {
        Refusal::Unavailable(_) => {
            "Nothing was changed: call again shortly with the same arguments and request_id."
                .to_owned()
        }
        _ => next_step(NOT_RECORDED, ""),
    };
    let structured = json!({
        "operation_id": null,
        "state": NOT_RECORDED,
        "external_id": null,
        "message": message,
        "next_step": next,
    });
    result(format!("{message}\n{next}"), structured, true)
}

/// The answer for a read-only upstream tool that was not called or did not answer. Nothing was
/// recorded, and a read-only tool changed nothing, so calling it again is safe.
pub(crate) fn pass_through_failed(provider: &str, tool: &str, reason: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!(
        "The read-only tool `{tool}` of {provider} did not answer: {reason}\nIt changes nothing, so it may be called again."
    ))])
}

/// The answer of `list_operations`.
pub(crate) fn listed_result(listed: &[Listed]) -> CallToolResult {
    let rows: Vec<Value> = listed
        .iter()
        .map(|row| {
            json!({
                "operation_id": row.operation_id,
                "state": row.state,
                "provider": row.provider,
                "action": row.action,
                "account": row.account,
                "unknown_for_s": row.unknown_for_s,
            })
        })
        .collect();
    let text = if listed.is_empty() {
        "No operations are waiting: everything recorded has settled.".to_owned()
    } else {
        let lines: Vec<String> = listed
            .iter()
            .map(|row| {
                format!(
                    "{} {} at {} ({}): {}",
                    row.operation_id, row.action, row.provider, row.account, row.state
                )
            })
            .collect();
        format!(
            "{} operation(s) not settled yet:\n{}",
            listed.len(),
            lines.join("\n")
        )
    };
    result(text, json!({ "operations": rows }), false)
}

fn result(text: String, structured: Value, is_error: bool) -> CallToolResult {
    let mut result = if is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    result.structured_content = Some(structured);
    result
}

/// The `outputSchema` of the action tools and `operation_status`.
pub(crate) fn outcome_schema() -> Map<String, Value> {
    let mut states: Vec<&str> = vec!["denied", "succeeded", "rejected", "abandoned", NOT_RECORDED];
    states.extend(OPEN_STATES);
    object(json!({
        "type": "object",
        "required": ["operation_id", "state", "external_id", "message", "next_step"],
        "properties": {
            "operation_id": {"type": ["string", "null"], "description": "The operation; null when nothing was recorded."},
            "state": {"type": "string", "enum": states},
            "external_id": {"type": ["string", "null"], "description": "The object the system confirmed, once it did."},
            "message": {"type": "string", "description": "What to tell the user: the ledger's sentence for the state."},
            "next_step": {"type": "string"},
            "created": {"type": "boolean", "description": "Whether this call recorded the operation (false: a retry found it)."},
        },
    }))
}

/// The `outputSchema` of `list_operations`.
pub(crate) fn listed_schema() -> Map<String, Value> {
    object(json!({
        "type": "object",
        "required": ["operations"],
        "properties": {
            "operations": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["operation_id", "state", "provider", "action", "account"],
                    "properties": {
                        "operation_id": {"type": "string"},
                        "state": {"type": "string", "enum": OPEN_STATES},
                        "provider": {"type": "string"},
                        "action": {"type": "string"},
                        "account": {"type": "string"},
                        "unknown_for_s": {"type": ["integer", "null"]},
                    },
                },
            },
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(state: &str) -> Outcome {
        Outcome {
            operation_id: "op-1".into(),
            state: state.into(),
            message: "The system has not confirmed the request yet.".into(),
            external_id: None,
            created: Some(true),
        }
    }

    #[test]
    fn an_unknown_outcome_is_no_error_and_says_not_to_repeat_but_to_ask_with_the_id() {
        let result = outcome_result(&outcome("unknown"));
        assert_eq!(result.is_error, Some(false));
        let text = &result.content[0].as_text().expect("text").text;
        assert!(text.contains("Not confirmed yet"), "{text}");
        assert!(text.contains("do not repeat"), "{text}");
        assert!(
            text.contains("operation_status with operation_id op-1"),
            "{text}"
        );
    }

    #[test]
    fn only_a_refusal_is_an_error() {
        for state in [
            "succeeded",
            "in_flight",
            "needs_review",
            "awaiting_approval",
        ] {
            assert_eq!(
                outcome_result(&outcome(state)).is_error,
                Some(false),
                "{state}"
            );
        }
        for state in ["rejected", "denied"] {
            assert_eq!(
                outcome_result(&outcome(state)).is_error,
                Some(true),
                "{state}"
            );
        }
        let refused = refusal_result(&Refusal::Reused("another request".into()));
        assert_eq!(refused.is_error, Some(true));
        assert_eq!(
            refused.structured_content.expect("structured")["state"],
            NOT_RECORDED
        );
    }
}
