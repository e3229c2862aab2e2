//! `opledger record | approve | deny`: the first application commands, on the embedded SQLite
//! ledger (`status` is `ops show`, in ops.rs).

use std::path::Path;

use opledger_domain::app::{IntentRequest, Ledger, LoadedOperation};
use opledger_domain::args::ArgsHash;
use opledger_domain::error::ValidationError;
use opledger_domain::ids::{ActorId, OperationId};
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_store::SqliteStore;

use crate::cli::{CliError, DecisionArgs, DenyArgs, RecordArgs};
use crate::ledger_file::{self, Access};

/// The ledger over the embedded store with the real clock and randomness.
pub type SqliteLedger = Ledger<SqliteStore, SystemClock, RandomIds>;

/// Closes the ledger's store, waiting until every acknowledged append is committed.
pub async fn close(ledger: &SqliteLedger) -> Result<(), CliError> {
    Ok(ledger.store().clone().close().await?)
}

/// Opens a ledger file that must already exist, to record a decision in it: deciding on a ledger
/// that was never written is a mistaken path, not a reason to create an empty file.
pub async fn open_existing_ledger(path: &Path) -> Result<SqliteLedger, CliError> {
    open_checked(path, Access::Decide).await
}

/// Opens a ledger file that must already exist, to read it; nothing is created.
pub async fn open_for_reading(path: &Path) -> Result<SqliteLedger, CliError> {
    open_checked(path, Access::Read).await
}

/// Opens (or creates) the ledger file.
pub async fn open_ledger(path: &Path) -> Result<SqliteLedger, CliError> {
    open_checked(path, Access::Create).await
}

async fn open_checked(path: &Path, access: Access) -> Result<SqliteLedger, CliError> {
    ledger_file::check(path, access)?;
    let store = SqliteStore::open(path).await.map_err(|error| {
        match ledger_file::next_step(&error, access) {
            Some(next) => CliError::Unopenable { error, next },
            None => CliError::Store(error),
        }
    })?;
    Ok(Ledger::new(store, SystemClock, RandomIds))
}

/// The fingerprint `record --config` binds the intent to, after the checks the API makes: the
/// connector and action exist, the tenant owns the account, the arguments fit the action's
/// input schema (every failing field named). A fingerprint also given must be that one.
fn configured_fingerprint(
    config: &Path,
    args: &RecordArgs,
    json: &serde_json::Value,
) -> Result<String, CliError> {
    use opledger_domain::ids::{AccountId, ActionName, ProviderId, TenantId};
    use opledger_domain::provider::{describe_arg_problems, BindingQuery, Providers};

    let loaded = opledger_http_api::config::load(config)
        .map_err(|error| CliError::Config(error.to_string()))?;
    let mut providers = opledger_providers::HttpProviders::new(loaded.providers)
        .map_err(|error| CliError::Config(error.to_string()))?;
    for upstream in loaded.upstreams {
        providers
            .insert_mcp(upstream)
            .map_err(|error| CliError::Config(error.to_string()))?;
    }
    let field = |name: &str, error: ValidationError| ValidationError::new(name, error.message);
    let tenant = TenantId::new(args.tenant.clone()).map_err(|e| field("--tenant", e))?;
    let provider = ProviderId::new(args.provider.clone()).map_err(|e| field("--provider", e))?;
    let account = AccountId::new(args.account.clone()).map_err(|e| field("--account", e))?;
    let action = ActionName::new(args.action.clone()).map_err(|e| field("--action", e))?;
    let bound = providers
        .bind(&BindingQuery {
            tenant: &tenant,
            provider: &provider,
            account: &account,
            action: &action,
        })
        .map_err(|unbound| {
            ValidationError::new(format!("--{}", unbound.field()), unbound.to_string())
        })?;
    providers
        .check_args(&provider, &action, json)
        .map_err(|problems| {
            ValidationError::new(
                "--args",
                format!(
                    "do not fit the action's input schema: {}",
                    describe_arg_problems(&problems)
                ),
            )
        })?;
    let fingerprint = bound.credential_fingerprint.to_string();
    match &args.credential_fingerprint {
        Some(given) if *given != fingerprint => Err(ValidationError::new(
            "--credential-fingerprint",
            format!("is `{given}`, but the configured account's credentials are `{fingerprint}`; leave it out with --config"),
        )
        .into()),
        _ => Ok(fingerprint),
    }
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
    opledger_domain::args::check_json(args.args.as_bytes(), "args")?;
    let credential_fingerprint = match &args.config {
        Some(config) => configured_fingerprint(config, &args, &json)?,
        None => args.credential_fingerprint.clone().unwrap_or_default(),
    };
    let request = IntentRequest {
        tenant: args.tenant,
        owner: args.owner,
        provider: args.provider,
        account: args.account,
        credential_fingerprint,
        action: args.action,
        args: json,
        source_id: args.source_id,
        requires_approval: args.requires_approval,
    };
    let _ = request.clone().validate()?;
    let personal = match &args.subject {
        Some(subject) => {
            let personal = opledger_domain::personal::Personal {
                subject: subject.clone(),
                fields: opledger_domain::personal::PersonalFields::All,
            };
            personal.check()?;
            Some(personal)
        }
        None => None,
    };
    let mut ledger = open_ledger(&args.store.db).await?;
    if personal.is_some() {
        let subjects =
            crate::subjects::open_subjects(&args.store.db, None, args.kek_file.as_deref())?;
        ledger = ledger.with_personal_data(std::sync::Arc::new(subjects));
    }
    let recorded = ledger
        .record_personal_then(request, personal, |_| None)
        .await;
    let closed = close(&ledger).await;
    let recorded = recorded?;
    closed?;
    let intent = recorded.intent();
    if args.json {
        return crate::read_models::print_json(&serde_json::json!({
            "operation_id": intent.operation_id,
            "idempotency_key": intent.idempotency_key,
            "args_hash": intent.args_hash,
            "state": recorded.operation.state.status.name(),
            "created": recorded.created,
            "sentence": opledger_domain::sentence::agent_sentence(&recorded.operation.state),
        }));
    }
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

fn parse_decision(args: &DecisionArgs) -> Result<(OperationId, ActorId, ArgsHash), CliError> {
    Ok((
        args.operation_id.parse()?,
        ActorId::new(args.approver.clone())?,
        ArgsHash::parse(&args.args_hash)?,
    ))
}

/// Prints an operation's state, one field a line.
pub fn print_state(loaded: &LoadedOperation) {
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
