//! `opledger ops list | show` (and `status`, the same as `ops show`): operations as the read models
//! list them, and one operation as the ledger itself folds it.
//!
//! `show` reads the operation's own stream, never the read models, so what it prints is never
//! behind the ledger.

use chrono::{DateTime, Utc};
use opledger_domain::app::AppError;
use opledger_domain::error::ValidationError;
use opledger_domain::ids::{AccountId, OperationId, ProviderId, TenantId};
use opledger_projections::operations::{OperationRow, STATE_NAMES};
use opledger_readmodel::{
    OperationCursor, OperationFilter, OperationPage, PastReadModels, PastScope, ReadModelError,
    ReadModelStore,
};
use serde_json::json;

use crate::cli::{CliError, OpsListArgs, StatusArgs};
use crate::intent::{close, open_for_reading, print_state, SqliteLedger};
use crate::read_models::{self, age, check_limit, print_json, print_table};
use opledger_http_api::render::{
    operation_body, operation_json, resolve_as_of, view_as_of, view_of, AsOf, OperationView,
    RenderError,
};

/// The states `--state` accepts: every state but `new`, which no recorded operation is in.
fn listable_states() -> impl Iterator<Item = &'static str> {
    STATE_NAMES.iter().copied().filter(|name| *name != "new")
}

pub async fn list(args: OpsListArgs) -> Result<(), CliError> {
    // Every input is checked before anything is opened, so bad input never creates a file.
    let mut query = ListQuery::from_args(&args)?;
    let ledger = open_for_reading(&args.read_models.store.db).await?;
    let result = match args.as_of {
        Some(as_of) => read_past_page(&ledger, as_of, &mut query).await,
        None => {
            read_page(
                &ledger,
                &args,
                query.filter.clone(),
                query.limit,
                query.after,
            )
            .await
        }
    };
    let closed = close(&ledger).await;
    let page = result?;
    closed?;
    if args.json {
        return print_page_json(&page, query.now);
    }
    print_page_table(&page, query.now);
    Ok(())
}

/// Reads one page of the listing as it was at `as_of`, folded from the ledger's log (the read
/// models hold only now). `query.now` becomes the moment's time, which ages are measured from.
async fn read_past_page(
    ledger: &SqliteLedger,
    as_of: AsOf,
    query: &mut ListQuery,
) -> Result<OperationPage, CliError> {
    let scope = PastScope {
        tenants: query
            .filter
            .tenant
            .clone()
            .map(|tenant| std::collections::BTreeSet::from([tenant])),
        provider: query.filter.provider.clone(),
        account: query.filter.account.clone(),
    };
    let past = PastReadModels::fold(ledger.store(), as_of.moment(), &scope).await?;
    query.now = past.time().unwrap_or(query.now);
    query.filter.older_than = query.older_than.map(|duration| query.now - duration);
    Ok(past.list_operations(&query.filter, query.limit, query.after)?)
}

/// What `ops list` asks the read models for, checked and parsed from its arguments.
struct ListQuery {
    filter: OperationFilter,
    limit: usize,
    after: Option<OperationId>,
    /// `--older-than`, measured back from `now`.
    older_than: Option<chrono::Duration>,
    /// The moment `--older-than` and the printed ages are measured from.
    now: DateTime<Utc>,
}

impl ListQuery {
    /// Checks every argument, in the order they are named in the usage, so the first bad one is
    /// the one reported.
    fn from_args(args: &OpsListArgs) -> Result<Self, CliError> {
        if let Some(state) = &args.state {
            check_state(state)?;
        }
        let tenant = args
            .tenant
            .as_deref()
            .map(|tenant| {
                TenantId::new(tenant)
                    .map_err(|error| ValidationError::new("--tenant", error.message.clone()))
            })
            .transpose()?;
        let older_than = args
            .older_than
            .as_deref()
            .map(|text| opledger_http_api::input::parse_duration("--older-than", text))
            .transpose()?;
        let limit = check_limit(args.limit)?;
        let after = args
            .after
            .as_deref()
            .map(|text| {
                text.parse::<OperationId>()
                    .map_err(|error| ValidationError::new("--after", error.message))
            })
            .transpose()?;
        let now = Utc::now();
        let filter = OperationFilter {
            state: args.state.clone(),
            tenant,
            provider: args
                .provider
                .as_deref()
                .map(|text| {
                    ProviderId::new(text)
                        .map_err(|error| ValidationError::new("--provider", error.message))
                })
                .transpose()?,
            account: args
                .account
                .as_deref()
                .map(|text| {
                    AccountId::new(text)
                        .map_err(|error| ValidationError::new("--account", error.message))
                })
                .transpose()?,
            older_than: older_than.map(|duration| now - duration),
            ..OperationFilter::default()
        };
        Ok(Self {
            filter,
            limit,
            after,
            older_than,
            now,
        })
    }
}

/// Refuses a `--state` that is not one of [`listable_states`], naming those that are.
fn check_state(state: &str) -> Result<(), CliError> {
    if listable_states().any(|name| name == state) {
        return Ok(());
    }
    Err(ValidationError::new(
        "--state",
        format!(
            "`{state}` is not a state; use one of {}",
            listable_states().collect::<Vec<_>>().join(", ")
        ),
    )
    .into())
}

/// Reads one page from the read models, caught up with the ledger first.
async fn read_page(
    ledger: &SqliteLedger,
    args: &OpsListArgs,
    filter: OperationFilter,
    limit: usize,
    after: Option<OperationId>,
) -> Result<OperationPage, CliError> {
    let read_models = read_models::open_caught_up(
        ledger.store(),
        &read_models::read_models_path(&args.read_models),
        args.json,
    )
    .await?;
    Ok(read_models
        .call(move |store| {
            let cursor = cursor_after(store, after)?;
            store.list_operations(&filter, limit, cursor.as_ref())
        })
        .await?)
}

/// The cursor `--after` names: the named operation's place in the listing order.
fn cursor_after(
    store: &ReadModelStore,
    after: Option<OperationId>,
) -> Result<Option<OperationCursor>, ReadModelError> {
    let Some(operation_id) = after else {
        return Ok(None);
    };
    match store.operation(operation_id)? {
        Some(row) => Ok(Some(OperationCursor {
            created_at: row.created_at,
            operation_id,
        })),
        None => Err(ReadModelError::InvalidQuery {
            reason: format!(
                "--after {operation_id} names no operation of this ledger; pass the id printed as the next page's start"
            ),
        }),
    }
}

/// Prints a page as JSON: the rows, whether more match, and where the next page starts.
fn print_page_json(page: &OperationPage, now: DateTime<Utc>) -> Result<(), CliError> {
    let rows: Vec<_> = page
        .operations
        .iter()
        .map(|row| operation_json(row, now))
        .collect();
    let next = page.next.as_ref().map(|cursor| cursor.operation_id);
    print_json(&json!({"operations": rows, "more": next.is_some(), "next": next}))
}

/// Prints a page as a table, then how many rows it held and where the next page starts.
fn print_page_table(page: &OperationPage, now: DateTime<Utc>) {
    let rows: Vec<Vec<String>> = page
        .operations
        .iter()
        .map(|row| table_row(row, now))
        .collect();
    print_table(
        &[
            "OPERATION",
            "TENANT",
            "ACCOUNT",
            "ACTION",
            "STATE",
            "ATTEMPTS",
            "EXTERNAL_ID",
            "CREATED",
            "UPDATED",
            "AGE",
        ],
        &rows,
    );
    match &page.next {
        Some(cursor) => println!(
            "{} operation(s); more match: next page with --after {}",
            page.operations.len(),
            cursor.operation_id
        ),
        None => println!("{} operation(s)", page.operations.len()),
    }
}

/// One operation as a table row, in the order of the table's headings.
fn table_row(row: &OperationRow, now: DateTime<Utc>) -> Vec<String> {
    vec![
        row.operation_id.to_string(),
        row.tenant.to_string(),
        row.account.to_string(),
        row.action.to_string(),
        row.state.to_owned(),
        row.attempts.to_string(),
        row.external_id
            .as_ref()
            .map_or_else(|| "-".to_owned(), ToString::to_string),
        read_models::time(row.created_at),
        read_models::time(row.updated_at),
        age(now, row.created_at),
    ]
}

/// `ops show` and `status`: the operation as the API shows it, in the same words.
pub async fn show(args: StatusArgs) -> Result<(), CliError> {
    let operation_id: OperationId = args.operation_id.parse()?;
    // The connectors are read first, so a bad configuration opens nothing.
    let descriptions = Descriptions::load(args.config.as_deref())?;
    let ledger = open_for_reading(&args.store.db).await?;
    let result = match args.as_of {
        None => print_operation_with(&ledger, operation_id, args.json, &descriptions).await,
        Some(as_of) => {
            print_operation_as_of(&ledger, operation_id, as_of, args.json, &descriptions).await
        }
    };
    let closed = close(&ledger).await;
    result?;
    closed
}

/// The actions' configured descriptions, which the agent's sentence is worded in.
pub struct Descriptions(opledger_providers::HttpProviders);

impl Descriptions {
    /// The connectors of the configuration at `config`, or the embedded default's.
    pub fn load(config: Option<&std::path::Path>) -> Result<Self, CliError> {
        let connectors = match config {
            Some(config) => {
                opledger_http_api::config::load(config)
                    .map_err(|error| CliError::Config(error.to_string()))?
                    .providers
            }
            // Nothing is sent from here: the address only has to be one.
            None => crate::serve::embedded_providers("http://127.0.0.1:9".to_owned())?,
        };
        opledger_providers::HttpProviders::new(connectors)
            .map(Self)
            .map_err(|error| CliError::Config(error.to_string()))
    }

    fn of(&self, state: &opledger_domain::state::OperationState) -> Option<String> {
        use opledger_domain::provider::Providers as _;
        let intent = state.intent.as_ref()?;
        self.0.action_description(&intent.provider, &intent.action)
    }
}

/// Prints an operation's state, the agent's sentence and its timeline (or, as JSON, the API's
/// operation object), the sentence in the actions' configured words.
async fn print_operation_with(
    ledger: &SqliteLedger,
    operation_id: OperationId,
    json: bool,
    descriptions: &Descriptions,
) -> Result<(), CliError> {
    let view = view_of(ledger.store(), operation_id).await?;
    print_view(view, json, descriptions, None)
}

/// Prints an operation as it stood at `as_of`, checked and resolved to a position of the log as
/// the API does (not found if it was not recorded yet then).
async fn print_operation_as_of(
    ledger: &SqliteLedger,
    operation_id: OperationId,
    as_of: AsOf,
    json: bool,
    descriptions: &Descriptions,
) -> Result<(), CliError> {
    let store = ledger.store();
    let position = resolve_as_of(store, as_of, Utc::now()).await?;
    let view = view_as_of(store, operation_id, as_of)
        .await
        .map_err(|error| match error {
            RenderError::App(AppError::NotFound { .. }) => CliError::NotFound(format!(
                "operation {operation_id} was not in the ledger at {} (log position {position})",
                as_of_words(as_of)
            )),
            other => other.into(),
        })?;
    print_view(view, json, descriptions, Some(position))
}

fn as_of_words(as_of: AsOf) -> String {
    match as_of {
        AsOf::Position(position) => format!("position {position}"),
        AsOf::Time(time) => time.to_rfc3339(),
    }
}

fn print_view(
    view: OperationView,
    json: bool,
    descriptions: &Descriptions,
    as_of_position: Option<u64>,
) -> Result<(), CliError> {
    let OperationView { loaded, lines, .. } = view;
    let description = descriptions.of(&loaded.state);
    let body = operation_body(&loaded, description.as_deref());
    if json {
        let mut object = serde_json::to_value(&body)
            .map_err(|error| CliError::Other(format!("cannot write the operation: {error}")))?;
        if let Some(position) = as_of_position {
            object["as_of_position"] = json!(position);
        }
        return print_json(&object);
    }
    print_state(&loaded);
    if let Some(position) = as_of_position {
        println!("as_of_position  {position}");
    }
    println!("sentence        {}", body.message);
    println!("timeline:");
    for line in &lines {
        println!("  {line}");
    }
    Ok(())
}
