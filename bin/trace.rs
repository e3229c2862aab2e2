//! `opledger trace <id>`: from any id an incident names — an operation id, an attempt id, the
//! external system's object id or the delivery's source id — to the operation and its whole
//! chain: intent, attempts, responses, reconciliations, decisions, and any duplicates.
//!
//! The read models resolve the id (they index every id); the chain itself is read from the
//! operation's own stream, so it is complete even if the read models were behind.

use opledger_domain::error::ValidationError;
use opledger_domain::event::{LateResponse, OperationEvent, ReconciliationResult, ReviewDecision};
use opledger_domain::ids::{OperationId, TenantId};
use opledger_domain::sentence::agent_sentence;
use opledger_readmodel::{DuplicatesReport, ReadModels, MAX_QUERY_ROWS};
use serde_json::json;
use uuid::Uuid;

use crate::cli::{CliError, TraceArgs};
use crate::intent::{close, open_for_reading, print_state, SqliteLedger};
use crate::read_models::{self, print_json};
use opledger_http_api::render::{view_of, OperationView};

/// Most operations one traced id may list; the best match is shown in full, the rest by id.
const MAX_TRACE_MATCHES: usize = 10;

/// Which link of the chain an id matched.
struct Link {
    /// `operation_id`, `attempt_id`, `external_id` or `source_id`.
    kind: &'static str,
    /// Where in the chain, in a phrase.
    detail: String,
}

pub async fn run(args: TraceArgs) -> Result<(), CliError> {
    let id = args.id.trim().to_owned();
    if id.is_empty() {
        return Err(ValidationError::new(
            "id",
            "is empty; pass an operation, attempt, external object or source id",
        )
        .into());
    }
    let tenant = args
        .tenant
        .as_deref()
        .map(|tenant| {
            TenantId::new(tenant)
                .map_err(|error| ValidationError::new("--tenant", error.message.clone()))
        })
        .transpose()?;
    let ledger = open_for_reading(&args.read_models.store.db).await?;
    let result = trace(&ledger, &args, &id, tenant).await;
    let closed = close(&ledger).await;
    result?;
    closed
}

async fn trace(
    ledger: &SqliteLedger,
    args: &TraceArgs,
    id: &str,
    tenant: Option<TenantId>,
) -> Result<(), CliError> {
    let read_models = read_models::open_caught_up(
        ledger.store(),
        &read_models::read_models_path(&args.read_models),
        args.json,
    )
    .await?;
    let candidates = candidates(&read_models, id, tenant).await?;
    let Some((&operation_id, others)) = candidates.split_first() else {
        return Err(nothing_matches(id, args.tenant.as_deref()));
    };
    let OperationView {
        loaded,
        history,
        events,
        lines,
    } = view_of(ledger.store(), operation_id).await?;
    let link = matched_link(id, operation_id, &history);
    // Filtered by operation in the read models, so old duplicates are found as well as new ones.
    let report = read_models
        .call(move |store| store.duplicates_of(operation_id, MAX_QUERY_ROWS))
        .await?;
    let duplicates = duplicates_of(&report, operation_id);
    let sentence = agent_sentence(&loaded.state);
    if args.json {
        return print_json(&json!({
            "query": id,
            "matched": {"link": link.kind, "detail": link.detail},
            "operation_id": operation_id,
            "state": loaded.state,
            "sentence": sentence,
            "events": events,
            "timeline": lines,
            "duplicates": duplicates,
            "other_matches": others,
        }));
    }
    println!("matched         {} ({})", link.kind, link.detail);
    print_other_matches(others);
    print_state(&loaded);
    println!("sentence        {sentence}");
    println!("chain:");
    for line in &lines {
        println!("  {line}");
    }
    print_duplicates(&duplicates);
    Ok(())
}

/// The operations `id` names, best match first, at most [`MAX_TRACE_MATCHES`].
async fn candidates(
    read_models: &ReadModels,
    id: &str,
    tenant: Option<TenantId>,
) -> Result<Vec<OperationId>, CliError> {
    let query = id.to_owned();
    // The tenant is filtered in the read models' query, before the limit, so other tenants'
    // operations naming the same id cannot crowd out this tenant's.
    Ok(read_models
        .call(move |store| match tenant {
            None => store.trace_candidates(&query, MAX_TRACE_MATCHES),
            Some(tenant) => store.trace_candidates_of(&query, &[tenant], MAX_TRACE_MATCHES),
        })
        .await?)
}

/// The error for an id nothing matches, with the kinds of id `trace` takes.
fn nothing_matches(id: &str, tenant: Option<&str>) -> CliError {
    let of_tenant = tenant
        .map(|tenant| format!(" for tenant `{tenant}`"))
        .unwrap_or_default();
    CliError::NotFound(format!(
        "nothing in the ledger matches `{id}`{of_tenant}; trace takes an operation id, an attempt id, \
         the external system's object id or the source (tool-call/message) id as recorded — \
         check for a typo, or the --db it was recorded in"
    ))
}

/// Names the other operations the same id matched, if any.
fn print_other_matches(others: &[OperationId]) {
    if others.is_empty() {
        return;
    }
    let listed: Vec<String> = others.iter().map(ToString::to_string).collect();
    println!(
        "also matched    {} (the same id names other operations; trace each by its operation id)",
        listed.join(" ")
    );
}

/// Prints the duplicates' sentences, or `none`.
fn print_duplicates(duplicates: &[serde_json::Value]) {
    let texts: Vec<String> = duplicates
        .iter()
        .filter_map(|value| value.get("text").and_then(|text| text.as_str()))
        .map(str::to_owned)
        .collect();
    if texts.is_empty() {
        println!("duplicates      none");
    } else {
        println!("duplicates:");
        for text in texts {
            println!("  {text}");
        }
    }
}

/// Finds which link of the operation's chain `id` names.
fn matched_link(id: &str, operation_id: OperationId, history: &[OperationEvent]) -> Link {
    let canonical = Uuid::parse_str(id).map(|uuid| uuid.hyphenated().to_string());
    let is_uuid = |value: String| canonical.as_ref().is_ok_and(|c| *c == value);
    if is_uuid(operation_id.to_string()) {
        return Link {
            kind: "operation_id",
            detail: "the operation itself".into(),
        };
    }
    for event in history {
        let found = match event {
            OperationEvent::AttemptStarted(e) if is_uuid(e.attempt_id.to_string()) => Some(Link {
                kind: "attempt_id",
                detail: format!("attempt #{} by {}", e.attempt_number, e.worker),
            }),
            OperationEvent::IntentRecorded(e)
                if e.source_id.as_ref().is_some_and(|s| s.as_str() == id) =>
            {
                Some(Link {
                    kind: "source_id",
                    detail: format!(
                        "the delivery that recorded the intent (tenant {})",
                        e.tenant
                    ),
                })
            }
            _ => external_id_named(event)
                .filter(|(external, _)| external == id)
                .map(|(_, how)| Link {
                    kind: "external_id",
                    detail: how,
                }),
        };
        if let Some(link) = found {
            return link;
        }
    }
    Link {
        kind: "index",
        detail: "found through the read models' id index".into(),
    }
}

/// The external object id an event names, and how.
fn external_id_named(event: &OperationEvent) -> Option<(String, String)> {
    match event {
        OperationEvent::AttemptSucceeded(e) => Some((
            e.external_id.to_string(),
            "the object the provider confirmed".into(),
        )),
        OperationEvent::ReconciliationRecorded(e) => match &e.result {
            ReconciliationResult::Found { external_id, .. } => {
                Some((external_id.to_string(), "found by a lookup".into()))
            }
            _ => None,
        },
        OperationEvent::ReviewResolved(e) => match &e.decision {
            ReviewDecision::ConfirmSucceeded { external_id } => Some((
                external_id.to_string(),
                match &e.principal {
                    Some(principal) => format!(
                        "confirmed by reviewer {} ({})",
                        e.reviewer,
                        principal.phrase()
                    ),
                    None => format!("confirmed by reviewer {}", e.reviewer),
                },
            )),
            _ => None,
        },
        OperationEvent::LateResponseReceived(e) => match &e.response {
            LateResponse::Succeeded { external_id, .. } => {
                Some((external_id.to_string(), "named by a late response".into()))
            }
            LateResponse::Rejected { .. } => None,
        },
        OperationEvent::DuplicateDetected(e) => Some((
            e.duplicate_external_id.to_string(),
            format!("a duplicate of {}", e.confirmed_external_id),
        )),
        _ => None,
    }
}

/// The duplicates that involve `operation_id`, as JSON values with a readable `text`.
fn duplicates_of(report: &DuplicatesReport, operation_id: OperationId) -> Vec<serde_json::Value> {
    let mut found = Vec::new();
    for detected in report
        .detected
        .iter()
        .filter(|d| d.operation_id == operation_id)
    {
        found.push(json!({
            "kind": "detected",
            "position": detected.position,
            "confirmed_external_id": detected.confirmed_external_id,
            "duplicate_external_id": detected.duplicate_external_id,
            "found_by": detected.found_by,
            "text": format!(
                "@{} object {} duplicates the confirmed {} ({})",
                detected.position,
                detected.duplicate_external_id,
                detected.confirmed_external_id,
                detected.found_by
            ),
        }));
    }
    for shared in report
        .shared_external_ids
        .iter()
        .filter(|s| s.operations.iter().any(|(op, _)| *op == operation_id))
    {
        let others: Vec<String> = shared
            .operations
            .iter()
            .map(|(op, role)| format!("{op} ({})", role.name()))
            .collect();
        found.push(json!({
            "kind": "shared_external_id",
            "external_id": shared.external_id,
            "operations": others,
            "text": format!(
                "object {} at {}/{} is named by {}",
                shared.external_id,
                shared.provider,
                shared.account,
                others.join(", ")
            ),
        }));
    }
    for pair in report
        .possible_intents
        .iter()
        .filter(|p| p.operation_id == operation_id || p.earlier_operation_id == operation_id)
    {
        found.push(json!({
            "kind": "possible_duplicate_intent",
            "operation_id": pair.operation_id,
            "earlier_operation_id": pair.earlier_operation_id,
            "gap_ms": pair.gap_ms,
            "text": format!(
                "intent {} looks like {} recorded {} ms earlier (same request, another delivery)",
                pair.operation_id, pair.earlier_operation_id, pair.gap_ms
            ),
        }));
    }
    found
}
