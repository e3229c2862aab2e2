//! `opledger record | approve | deny | status`: the first application commands, on the embedded
//! SQLite ledger.

use std::path::Path;

use opledger_adapters::system::{RandomIds, SystemClock};
use opledger_adapters::SqliteStore;
use opledger_domain::app::{IntentRequest, Ledger, LoadedOperation};
use opledger_domain::args::ArgsHash;
use opledger_domain::codec;
use opledger_domain::error::ValidationError;
use opledger_domain::ids::{ActorId, OperationId, StreamVersion};
use opledger_domain::store::{EventStore, StreamName, MAX_READ_BATCH};

use crate::cli::{CliError, DecisionArgs, DenyArgs, RecordArgs, StatusArgs};

/// The ledger over the embedded store with the real clock and randomness.
pub type SqliteLedger = Ledger<SqliteStore, SystemClock, RandomIds>;

/// Closes the ledger's store, waiting until every acknowledged append is committed.
pub async fn close(ledger: &SqliteLedger) -> Result<(), CliError> {
    Ok(ledger.store().clone().close().await?)
}

/// Opens a ledger file that must already exist: reading or deciding on a ledger that was never
/// written is a mistaken path, not a reason to create an empty file.
pub async fn open_existing_ledger(path: &Path) -> Result<SqliteLedger, CliError> {
    if !path.exists() {
        return Err(CliError::Other(format!(
            "no ledger at {}; pass --db (or set OPLEDGER_DB) to the file `opledger record` wrote",
            path.display()
        )));
    }
    open_ledger(path).await
}

/// Opens (or creates) the ledger file.
pub async fn open_ledger(path: &Path) -> Result<SqliteLedger, CliError> {
    let store = SqliteStore::open(path).await?;
    Ok(Ledger::new(store, SystemClock, RandomIds))
}

pub async fn record(args: RecordArgs) -> Result<(), CliError> {
    // Parse before opening anything, so bad input never creates a file.
    let json: serde_json::Value = serde_json::from_str(&args.args).map_err(|error| {
        ValidationError::new(
            "args",
            format!(
                "is not valid JSON ({error}); pass an object such as '{{\"title\": \"Call\"}}'"
            ),
        )
    })?;
    let request = IntentRequest {
        tenant: args.tenant,
        owner: args.owner,
        provider: args.provider,
        account: args.account,
        credential_fingerprint: args.credential_fingerprint,
        action: args.action,
        args: json,
        source_id: args.source_id,
        requires_approval: args.requires_approval,
    };
    let _ = request.clone().validate()?;
    let ledger = open_ledger(&args.store.db).await?;
    let recorded = ledger.record_intent(request).await;
    let closed = close(&ledger).await;
    let recorded = recorded?;
    closed?;
    let intent = recorded.intent();
    println!("operation_id    {}", intent.operation_id);
    println!("idempotency_key {}", intent.idempotency_key);
    println!("args_hash       {}", intent.args_hash);
    println!("state           {}", recorded.operation.state.status.name());
    println!(
        "new             {}",
        if recorded.created {
            "yes"
        } else {
            "no (redelivery of an existing source id)"
        }
    );
    Ok(())
}

pub async fn approve(args: DecisionArgs) -> Result<(), CliError> {
    let (operation_id, approver, args_hash) = parse_decision(&args)?;
    let ledger = open_existing_ledger(&args.store.db).await?;
    let result = ledger.approve(operation_id, approver, args_hash).await;
    let closed = close(&ledger).await;
    print_state(&result?);
    closed?;
    Ok(())
}

pub async fn deny(args: DenyArgs) -> Result<(), CliError> {
    let (operation_id, approver, args_hash) = parse_decision(&args.decision)?;
    let ledger = open_existing_ledger(&args.decision.store.db).await?;
    let result = ledger
        .deny(operation_id, approver, args_hash, args.reason)
        .await;
    let closed = close(&ledger).await;
    print_state(&result?);
    closed?;
    Ok(())
}

pub async fn status(args: StatusArgs) -> Result<(), CliError> {
    let operation_id: OperationId = args.operation_id.parse()?;
    let ledger = open_existing_ledger(&args.store.db).await?;
    let result = show(&ledger, operation_id, args.json).await;
    let closed = close(&ledger).await;
    result?;
    closed
}

async fn show(
    ledger: &SqliteLedger,
    operation_id: OperationId,
    json: bool,
) -> Result<(), CliError> {
    let loaded = ledger.get(operation_id).await?;
    let stream = StreamName::for_operation(operation_id);
    let mut history = Vec::new();
    let mut from = StreamVersion::FIRST;
    loop {
        let batch = ledger
            .store()
            .read_stream(&stream, from, MAX_READ_BATCH)
            .await?;
        let full = batch.len() == MAX_READ_BATCH;
        for recorded in &batch {
            let data: serde_json::Value =
                serde_json::from_slice(&recorded.data).map_err(|error| {
                    CliError::Other(format!("event {} is not JSON: {error}", recorded.version))
                })?;
            codec::decode(recorded).map_err(opledger_domain::app::AppError::from)?;
            history.push((
                recorded.version,
                recorded.position,
                recorded.event_type.clone(),
                data,
            ));
            from = recorded.version.next();
        }
        if !full {
            break;
        }
    }
    if json {
        let events: Vec<_> = history
            .iter()
            .map(|(version, position, event_type, data)| {
                serde_json::json!({"version": version, "position": position, "type": event_type, "data": data})
            })
            .collect();
        let out = serde_json::json!({"operation_id": operation_id, "state": loaded.state, "version": loaded.version, "events": events});
        println!(
            "{}",
            serde_json::to_string_pretty(&out)
                .map_err(|error| CliError::Other(error.to_string()))?
        );
        return Ok(());
    }
    print_state(&loaded);
    println!("history:");
    for (version, position, event_type, data) in history {
        let at = data
            .get("at")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("?");
        println!("  v{version:<3} @{position:<8} {at}  {event_type}");
    }
    Ok(())
}

fn parse_decision(args: &DecisionArgs) -> Result<(OperationId, ActorId, ArgsHash), CliError> {
    Ok((
        args.operation_id.parse()?,
        ActorId::new(args.approver.clone())?,
        ArgsHash::parse(&args.args_hash)?,
    ))
}

fn print_state(loaded: &LoadedOperation) {
    let state = &loaded.state;
    println!("operation_id    {}", loaded.operation_id);
    println!("state           {}", state.status.name());
    if let Some(intent) = &state.intent {
        println!("tenant          {}", intent.tenant);
        println!(
            "provider        {} / account {}",
            intent.provider, intent.account
        );
        println!("action          {}", intent.action);
        println!("args            {}", intent.args.canonical_json());
        println!("args_hash       {}", intent.args_hash);
        println!("idempotency_key {}", intent.idempotency_key);
    }
    if let Some(external_id) = state.external_id() {
        println!("external_id     {external_id}");
    }
    println!("attempts        {}", state.attempts);
    if let Some(error) = &state.last_error {
        println!("last_error      {error}");
    }
}
