//! `opledger review list | show | resolve`: the operations waiting for a person, the evidence
//! gathered about each, and the person's decision.
//!
//! A decision is a command decided by the ledger like any other (`ResolveReview`), never a write
//! to the read models; this command sends nothing to a provider — a retry is carried out by the
//! workers.

use chrono::{DateTime, Utc};
use opledger_domain::command::{Command, MAX_NOTE_BYTES};
use opledger_domain::error::ValidationError;
use opledger_domain::event::{OperationEvent, ReconciliationResult, ReviewDecision};
use opledger_domain::ids::{ActorId, ExternalObjectId, OperationId};
use opledger_domain::sentence::agent_sentence;
use opledger_readmodel::ReviewItem;
use serde_json::json;

use crate::cli::{CliError, ReviewListArgs, ReviewResolveArgs, StatusArgs};
use crate::intent::{close, open_existing_ledger, open_for_reading, print_state};
use crate::read_models::{self, age, check_limit, print_json, print_table};
use opledger_http_api::render::{review_detail_json, review_item_json, view_of};

pub async fn list(args: ReviewListArgs) -> Result<(), CliError> {
    let limit = check_limit(args.limit)?;
    let ledger = open_for_reading(&args.read_models.store.db).await?;
    let result = async {
        let read_models = read_models::open_caught_up(
            ledger.store(),
            &read_models::read_models_path(&args.read_models),
            args.json,
        )
        .await?;
        let queue = read_models
            .call(move |store| store.review_queue(limit))
            .await?;
        // For --json, each row carries its operation's detail (arguments, binding, every
        // attempt and lookup) as the API's queue does: one stream read per row, bounded by
        // --limit.
        let mut details = Vec::new();
        if args.json {
            for item in &queue {
                let view = view_of(ledger.store(), item.operation_id).await?;
                details.push(review_detail_json(&view.history));
            }
        }
        Ok::<_, CliError>((queue, details))
    }
    .await;
    let closed = close(&ledger).await;
    let (queue, details) = result?;
    closed?;
    let now = Utc::now();
    if args.json {
        let rows: Vec<_> = queue
            .iter()
            .zip(details)
            .map(|(item, detail)| {
                let mut row = review_item_json(item, now);
                row["detail"] = detail;
                row
            })
            .collect();
        return print_json(&json!({ "queue": rows }));
    }
    let rows: Vec<Vec<String>> = queue.iter().map(|item| queue_row(item, now)).collect();
    print_table(
        &[
            "OPERATION",
            "STATE",
            "AGE",
            "TENANT",
            "ACCOUNT",
            "ATTEMPTS",
            "LOOKUPS",
            "REASON",
            "EVIDENCE",
        ],
        &rows,
    );
    println!("{} operation(s) unresolved", queue.len());
    Ok(())
}

/// One queued operation as a table row: a person's review, if any, else the last error and
/// lookup, as the reason and evidence.
fn queue_row(item: &ReviewItem, now: DateTime<Utc>) -> Vec<String> {
    let reason = item
        .review
        .as_ref()
        .map(|review| review.reason.clone())
        .or_else(|| item.last_error.clone())
        .unwrap_or_else(|| "-".into());
    let evidence = item
        .review
        .as_ref()
        .map(|review| review.evidence.clone())
        .or_else(|| {
            item.last_lookup
                .as_ref()
                .map(|lookup| format!("{}: {}", lookup.result, lookup.evidence))
        })
        .unwrap_or_else(|| "-".into());
    vec![
        item.operation_id.to_string(),
        item.state.to_owned(),
        age(now, item.since),
        item.tenant.to_string(),
        item.account.to_string(),
        item.attempts.to_string(),
        item.lookups.to_string(),
        reason,
        evidence,
    ]
}

pub async fn show(args: StatusArgs) -> Result<(), CliError> {
    let operation_id: OperationId = args.operation_id.parse()?;
    let ledger = open_for_reading(&args.store.db).await?;
    let result = async {
        let view = view_of(ledger.store(), operation_id).await?;
        Ok::<_, CliError>((view.loaded, view.history, view.events, view.lines))
    }
    .await;
    let closed = close(&ledger).await;
    let (loaded, history, events, lines) = result?;
    closed?;
    let evidence = evidence_of(&history);
    let sentence = agent_sentence(&loaded.state);
    let state = loaded.state.status.name();
    if args.json {
        return print_json(&json!({
            "operation_id": operation_id,
            "in_review": state == "needs_review",
            "state": loaded.state,
            "sentence": sentence,
            "evidence": evidence,
            "events": events,
            "timeline": lines,
        }));
    }
    print_state(&loaded);
    println!("sentence        {sentence}");
    match state {
        "needs_review" => {}
        // A person may decide an unknown operation too, when the provider stays down.
        "unknown" => println!(
            "note            unknown: the lookups go on, and a person may decide it now (`opledger review resolve`)"
        ),
        _ => println!("note            not waiting for a person (state {state}); nothing to resolve"),
    }
    println!("evidence:");
    if evidence.is_empty() {
        println!("  none recorded");
    }
    for line in &evidence {
        println!("  {line}");
    }
    println!("timeline:");
    for line in &lines {
        println!("  {line}");
    }
    Ok(())
}

/// What automation learned before it handed over: every unclear outcome, lookup and hand-over.
fn evidence_of(history: &[OperationEvent]) -> Vec<String> {
    history
        .iter()
        .filter_map(|event| match event {
            OperationEvent::OutcomeUnknown(e) => Some(format!(
                "{}  no outcome: {}",
                read_models::time(e.at),
                e.error
            )),
            OperationEvent::LeaseExpired(e) => Some(format!(
                "{}  lease of {} ran out",
                read_models::time(e.at),
                e.attempt_id
            )),
            OperationEvent::ReconciliationRecorded(e) => {
                let result = match &e.result {
                    ReconciliationResult::Found {
                        external_id,
                        account,
                    } => format!("found {external_id} in {account}"),
                    ReconciliationResult::NotFound {
                        authoritative: true,
                    } => "not found (authoritative)".into(),
                    ReconciliationResult::NotFound {
                        authoritative: false,
                    } => "not found (search may lag)".into(),
                    ReconciliationResult::Inconclusive { reason } => {
                        format!("inconclusive: {reason}")
                    }
                };
                Some(format!(
                    "{}  lookup {result}: {}",
                    read_models::time(e.at),
                    e.evidence
                ))
            }
            OperationEvent::ReviewRequired(e) => Some(format!(
                "{}  handed to a person: {} — {}",
                read_models::time(e.at),
                e.reason,
                e.evidence
            )),
            _ => None,
        })
        .collect()
}

pub async fn resolve(args: ReviewResolveArgs) -> Result<(), CliError> {
    let operation_id: OperationId = args.operation_id.parse()?;
    let reviewer = ActorId::new(args.reviewer.clone())
        .map_err(|error| ValidationError::new("--reviewer", error.message))?;
    let decision = match (&args.confirm, args.retry, args.abandon) {
        (Some(external_id), false, false) => ReviewDecision::ConfirmSucceeded {
            external_id: ExternalObjectId::new(external_id.clone())
                .map_err(|error| ValidationError::new("--confirm", error.message))?,
        },
        (None, true, false) => ReviewDecision::Retry,
        (None, false, true) => ReviewDecision::Abandon,
        // clap's argument group makes exactly one required; this keeps the rule here as well.
        _ => {
            return Err(ValidationError::new(
                "--retry/--confirm/--abandon",
                "pass exactly one of --retry, --confirm EXTERNAL_ID or --abandon",
            )
            .into())
        }
    };
    let note = args.note.trim().to_owned();
    if note.is_empty() || note.len() > MAX_NOTE_BYTES {
        return Err(ValidationError::new(
            "--note",
            format!("must say why, in 1 to {MAX_NOTE_BYTES} bytes"),
        )
        .into());
    }
    let ledger = open_existing_ledger(&args.store.db).await?;
    let command = Command::ResolveReview {
        // No token here: the decision is the file's owner's, named by the account running this.
        principal: Some(opledger_domain::event::Principal {
            kind: opledger_domain::event::PrincipalKind::Local,
            name: local_account(),
        }),
        accept_duplicate_risk: args.accept_duplicate_risk,
        // No provider configuration here: the contract is unknown, so a retry of an operation
        // that may have been applied needs the risk accepted.
        capabilities: None,
        reviewer,
        decision: decision.clone(),
        note,
    };
    let result = ledger.execute(operation_id, &command).await;
    let closed = close(&ledger).await;
    let loaded = result?;
    closed?;
    let what = match &decision {
        ReviewDecision::Retry => "retry: the operation is pending again under the same key. \
             The workers (in-process workers or the service) send it; this command has no \
             provider configuration and sends nothing."
            .to_owned(),
        ReviewDecision::ConfirmSucceeded { external_id } => {
            format!("confirmed: the operation succeeded with object {external_id}.")
        }
        ReviewDecision::Abandon => "abandoned: the operation will never be sent again.".into(),
    };
    if args.json {
        return print_json(&json!({
            "operation_id": operation_id,
            "recorded": "ReviewResolved",
            "state": loaded.state.status.name(),
            "version": loaded.version,
            "message": what,
            "sentence": agent_sentence(&loaded.state),
        }));
    }
    println!("recorded        ReviewResolved ({what})");
    print_state(&loaded);
    println!("sentence        {}", agent_sentence(&loaded.state));
    Ok(())
}

/// The operating system account running this command: `$USER` (or `$LOGNAME`), else its uid.
fn local_account() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .map(|name| name.trim().to_owned())
        .find(|name| !name.is_empty() && name.len() <= 64)
        .unwrap_or_else(|| format!("uid {}", rustix::process::getuid().as_raw()))
}
