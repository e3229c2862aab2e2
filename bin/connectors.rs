//! `opledger connectors`: check a connector file before a server loads it, list what is loaded
//! (a configuration's connectors, or the presets shipped in the binary), print a preset to copy,
//! and test each account's credentials against the live API with its read-only `[probe]`.
//!
//! `check` reads a document the way `serve` does and reports every problem at once, each with
//! its file, line and field; it needs no credentials (accounts' variables are read only by
//! `serve`, or by `check --env`). Nothing here ever prints a secret: accounts show their
//! credential fingerprint.

use std::path::Path;

use opledger_domain::contract::{Deduplication, LookupSupport, ProviderCapabilities};
use opledger_http_api::config::read_connector_file;
use opledger_providers::document::{Action, Document};
use opledger_providers::{presets, render_all, Connector, Overrides};
use serde_json::{json, Value};

use crate::cli::{
    CliError, ConnectorsArgs, ConnectorsCheckArgs, ConnectorsCommand, ConnectorsImportMcpArgs,
    ConnectorsListArgs, ConnectorsLoginArgs, ConnectorsShowArgs, ConnectorsTestArgs,
};
use crate::read_models::print_json;

/// `opledger connectors …`.
pub async fn run(args: ConnectorsArgs) -> Result<(), CliError> {
    match args.command {
        ConnectorsCommand::Check(args) => check(&args),
        ConnectorsCommand::List(args) => list(&args),
        ConnectorsCommand::Show(args) => show(&args),
        ConnectorsCommand::Test(args) => test(&args).await,
        ConnectorsCommand::ImportMcp(args) => import_mcp(&args).await,
        ConnectorsCommand::Login(args) => login(&args).await,
    }
}

/// `connectors show PRESET`: the preset's document as shipped.
fn show(args: &ConnectorsShowArgs) -> Result<(), CliError> {
    let (_, text) = presets::preset(&args.preset).ok_or_else(|| {
        let known: Vec<&str> = presets::preset_names().collect();
        CliError::NotFound(format!(
            "`{}` is no preset; the presets are: {}",
            args.preset,
            known.join(", ")
        ))
    })?;
    print!("{text}");
    Ok(())
}

/// `connectors test --config F`: each account's probe, what works and what to fix; an error
/// (exit non-zero) when any account fails or nothing matched.
async fn test(args: &ConnectorsTestArgs) -> Result<(), CliError> {
    let config = opledger_http_api::config::load(&args.config)
        .map_err(|error| CliError::Config(error.to_string()))?;
    let mut rows = Vec::new();
    for connector in &config.providers {
        if args
            .connector
            .as_deref()
            .is_some_and(|id| id != connector.id().as_str())
        {
            continue;
        }
        for account in connector.accounts() {
            if args
                .account
                .as_deref()
                .is_some_and(|id| id != account.as_str())
            {
                continue;
            }
            let result = connector.probe(account).await;
            let (works, said) = match result {
                Ok(said) => (true, said),
                Err(said) => (false, said),
            };
            rows.push(json!({
                "connector": connector.id(), "account": account, "works": works, "message": said,
            }));
        }
    }
    if rows.is_empty() {
        return Err(CliError::NotFound(
            "no account matches --connector and --account in this configuration; `opledger connectors list --config F` lists them".to_owned(),
        ));
    }
    let failed = rows.iter().filter(|row| row["works"] == false).count();
    if args.json {
        print_json(&json!({ "accounts": rows }))?;
    } else {
        for row in &rows {
            let verdict = if row["works"] == true {
                "works"
            } else {
                "FAILS"
            };
            println!(
                "{}/{}  {verdict}: {}",
                row["connector"].as_str().unwrap_or_default(),
                row["account"].as_str().unwrap_or_default(),
                row["message"].as_str().unwrap_or_default()
            );
        }
    }
    if failed > 0 {
        return Err(CliError::Other(format!(
            "{failed} of {} account(s) failed their probe; fix what each says and run this again",
            rows.len()
        )));
    }
    Ok(())
}

/// `connectors import-mcp`: starts the upstream (or connects), lists its tools, and writes the
/// starting document; nothing is called but `initialize` and `tools/list`.
async fn import_mcp(args: &ConnectorsImportMcpArgs) -> Result<(), CliError> {
    use opledger_providers::mcp::spec::Upstream;
    let upstream = match (&args.command, &args.url) {
        (Some(command), None) => Upstream::Stdio {
            command: command.clone(),
            args: args.args.clone(),
            env_from: Vec::new(),
            cwd: None,
        },
        (None, Some(url)) => Upstream::Http {
            url: url.clone(),
            headers_from: Vec::new(),
            ca_file: args.ca_file.clone(),
            oauth: None,
            login: None,
        },
        _ => {
            return Err(CliError::Other(
                "give --command PROGRAM [-- ARGS…] or --url URL, not both".to_owned(),
            ))
        }
    };
    let timeout = std::time::Duration::from_millis(args.timeout_ms);
    let tools =
        opledger_providers::mcp::list_tools(&upstream, &|name| std::env::var_os(name), timeout)
            .await
            .map_err(CliError::Other)?;
    let text = opledger_providers::mcp::starting_document(&args.id, &upstream, &tools);
    match &args.out {
        Some(path) => std::fs::write(path, &text).map_err(|error| {
            CliError::Other(format!("cannot write {}: {error}", path.display()))
        })?,
        None => print!("{text}"),
    }
    eprintln!(
        "{} tool(s) listed; decide every TO DECIDE, then check the file with `opledger connectors check`",
        tools.len()
    );
    Ok(())
}

/// `connectors login ID --config F`: the MCP authorization flow for a person's account at an
/// upstream; the URL goes to stdout, everything else to stderr; never a token.
async fn login(args: &ConnectorsLoginArgs) -> Result<(), CliError> {
    use std::io::Write as _;
    let config = opledger_http_api::config::load(&args.config)
        .map_err(|error| CliError::Config(error.to_string()))?;
    let upstream = config
        .upstreams
        .iter()
        .find(|upstream| upstream.id().as_str() == args.connector)
        .ok_or_else(|| {
            let known: Vec<&str> = config
                .upstreams
                .iter()
                .filter(|upstream| upstream.takes_login())
                .map(|upstream| upstream.id().as_str())
                .collect();
            CliError::NotFound(format!(
                "no upstream MCP connector `{}` in {}; the ones a person logs in to: {}",
                args.connector,
                args.config.display(),
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ))
        })?;
    let mut show = |url: &str| {
        eprintln!(
            "Open this URL in a browser and approve the access (waiting {} s; Ctrl-C stops):",
            args.timeout_s
        );
        println!("{url}");
        let _ = std::io::stdout().flush();
    };
    let timeout = std::time::Duration::from_secs(args.timeout_s);
    let report = tokio::select! {
        report = upstream.log_in(&mut show, timeout) => report.map_err(CliError::Other)?,
        _ = tokio::signal::ctrl_c() => {
            return Err(CliError::Other("the login was stopped; nothing was stored".to_owned()));
        }
    };
    eprintln!(
        "Logged in to `{}`{}: client {}{}, scopes [{}]{}.",
        args.connector,
        report
            .issuer
            .as_deref()
            .map(|issuer| format!(" at {issuer}"))
            .unwrap_or_default(),
        report.client_id,
        if report.registered {
            " (registered now)"
        } else {
            ""
        },
        report.scopes.join(" "),
        report
            .expires_in_s
            .map(|s| format!(", access token for {s} s"))
            .unwrap_or_default(),
    );
    if report.refresh_token {
        eprintln!(
            "The refresh token is sealed in {}; `serve` reads it at its next session with the upstream.",
            report.file.display()
        );
    } else {
        eprintln!(
            "The authorization server gave no refresh token: the login lasts as long as its access token (sealed in {}).",
            report.file.display()
        );
    }
    Ok(())
}

/// `connectors check FILE…`: every file read whole; exit 2 when any has a problem.
fn check(args: &ConnectorsCheckArgs) -> Result<(), CliError> {
    let mut problems = Vec::new();
    let mut checked = Vec::new();
    for path in &args.files {
        // An upstream MCP server's document is checked whole too (its variables are read only
        // when it is built).
        if let Some(upstream) = mcp_document_of(path) {
            match upstream {
                Ok(document) => checked.push(json!({
                    "file": document.name,
                    "id": document.id.to_string(),
                    "transport": "mcp",
                    "actions": document.actions.iter().map(|action| action.name.to_string()).collect::<Vec<_>>(),
                })),
                Err(errors) => problems.extend(errors),
            }
            continue;
        }
        match document_of(path) {
            Ok(document) => {
                if args.env {
                    // Built as `serve` builds it: the credentials read from the environment.
                    if let Err(errors) = Connector::build(&document, Overrides::default()) {
                        problems.extend(errors);
                        continue;
                    }
                }
                checked.push(document_json(&document));
            }
            Err(errors) => problems.extend(errors),
        }
    }
    if !problems.is_empty() {
        return Err(CliError::Config(format!(
            "{} problem(s):\n{}",
            problems.len(),
            render_all(&problems)
        )));
    }
    if args.json {
        return print_json(&json!({ "connectors": checked }));
    }
    for document in &checked {
        print_document(document);
    }
    println!("{} connector file(s) valid", checked.len());
    Ok(())
}

/// `connectors list`: a configuration's connectors (built as `serve` builds them), else the
/// presets.
fn list(args: &ConnectorsListArgs) -> Result<(), CliError> {
    let rows: Vec<Value> = match &args.config {
        Some(path) => opledger_http_api::config::load(path)
            .map_err(|error| CliError::Config(error.to_string()))?
            .providers
            .iter()
            .map(connector_json)
            .collect(),
        None => presets::preset_names()
            .map(|name| {
                let (file, text) = presets::preset(name).expect("a listed preset exists");
                let document = opledger_providers::parse(file, text)
                    .expect("the presets shipped are valid documents");
                let mut row = document_json(&document);
                row["preset"] = json!(name);
                row
            })
            .collect(),
    };
    if args.json {
        return print_json(&json!({ "connectors": rows }));
    }
    for row in &rows {
        print_document(row);
    }
    let what = if args.config.is_some() {
        "connector(s) configured"
    } else {
        "preset(s); use one with preset = \"NAME\" under [[connectors]]"
    };
    println!("{} {what}", rows.len());
    Ok(())
}

/// The file's MCP document (or its problems), when it is one (`transport = "mcp"`).
#[allow(clippy::type_complexity)]
fn mcp_document_of(
    path: &Path,
) -> Option<Result<opledger_providers::mcp::McpDocument, Vec<opledger_providers::ConnectorError>>> {
    let text = read_connector_file(path).ok()?;
    match opledger_providers::document::parse_any(&path.display().to_string(), &text) {
        Ok(opledger_providers::document::AnyDocument::Mcp(document)) => Some(Ok(*document)),
        Ok(opledger_providers::document::AnyDocument::Rest(_)) => None,
        Err(errors) => {
            let mcp = text.lines().any(|line| {
                let line = line.split('#').next().unwrap_or("").replace(' ', "");
                line == "transport=\"mcp\""
            });
            mcp.then_some(Err(errors))
        }
    }
}

fn document_of(path: &Path) -> Result<Document, Vec<opledger_providers::ConnectorError>> {
    let text = read_connector_file(path).map_err(|message| {
        vec![opledger_providers::ConnectorError {
            file: path.display().to_string(),
            line: None,
            field: "file".to_owned(),
            message,
        }]
    })?;
    opledger_providers::parse(&path.display().to_string(), &text)
}

/// A document as `check` and the preset listing show it.
fn document_json(document: &Document) -> Value {
    json!({
        "id": document.id,
        "file": document.name,
        "description": document.description,
        "base_url": document.base_url,
        "actions": document
            .actions
            .iter()
            .map(|action| action_json(action, Some(action.capabilities())))
            .collect::<Vec<_>>(),
        "accounts": document.accounts.iter().map(|account| json!({
            "id": account.id,
            "tenants": account.tenants,
        })).collect::<Vec<_>>(),
    })
}

/// A built connector as `list --config` shows it: its accounts with owners and fingerprints.
fn connector_json(connector: &Connector) -> Value {
    json!({
        "id": connector.id(),
        "file": connector.document_name(),
        "description": connector.description(),
        "actions": connector
            .actions()
            .map(|action| action_json(action, connector.capabilities(&action.name)))
            .collect::<Vec<_>>(),
        "accounts": connector.account_owners().map(|(id, tenants, fingerprint)| json!({
            "id": id,
            "tenants": tenants,
            "credential_fingerprint": fingerprint,
        })).collect::<Vec<_>>(),
    })
}

fn action_json(action: &Action, capabilities: Option<ProviderCapabilities>) -> Value {
    let mut row = json!({
        "name": action.name,
        "description": action.description,
        "destructive": action.destructive,
    });
    if let Some(capabilities) = capabilities {
        row["contract"] = json!(contract_words(&capabilities));
    }
    row
}

/// What the ledger may do after an unclear outcome of an action with this contract, in words.
fn contract_words(capabilities: &ProviderCapabilities) -> String {
    let dedup = match capabilities.deduplication {
        Deduplication::IdempotencyKey {
            retention_s,
            safety_margin_s,
        } => format!(
            "idempotency key kept {retention_s} s (retried within {} s)",
            retention_s.saturating_sub(safety_margin_s)
        ),
        Deduplication::UniqueLabel => "unique label".to_owned(),
        Deduplication::NaturallyIdempotent => "naturally idempotent".to_owned(),
        Deduplication::None => "no deduplication".to_owned(),
    };
    let lookup = match capabilities.lookup {
        LookupSupport::None => "no lookup".to_owned(),
        LookupSupport::Consistent => "consistent lookup".to_owned(),
        LookupSupport::EventuallyConsistent { lag_ms } => {
            format!("search lagging up to {lag_ms} ms")
        }
    };
    // The ledger always looks up before it retries (design rule 8), where it can.
    let after_unknown = match (capabilities.deduplication, capabilities.lookup) {
        (Deduplication::None, LookupSupport::None) => "a person decides",
        (Deduplication::None, _) => "a lookup, else a person",
        (Deduplication::IdempotencyKey { .. }, LookupSupport::None) => {
            "a retry with the same key inside the retention, else a person"
        }
        (Deduplication::IdempotencyKey { .. }, _) => {
            "a lookup, then a retry with the same key inside the retention"
        }
        (_, LookupSupport::None) => "a safe retry",
        _ => "a lookup, then a safe retry",
    };
    format!("{dedup}; {lookup}; after an unclear outcome: {after_unknown}")
}

fn print_document(row: &Value) {
    let text = |value: &Value| value.as_str().unwrap_or("").to_owned();
    println!(
        "{}  ({})  {}",
        text(&row["id"]),
        text(&row["file"]),
        text(&row["description"])
    );
    for action in row["actions"].as_array().into_iter().flatten() {
        let contract = action["contract"]
            .as_str()
            .map(|c| format!("  [{c}]"))
            .unwrap_or_default();
        println!(
            "  action  {:<24} {}{contract}",
            text(&action["name"]),
            text(&action["description"])
        );
    }
    for account in row["accounts"].as_array().into_iter().flatten() {
        let owners: Vec<String> = account["tenants"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        let fingerprint = account["credential_fingerprint"]
            .as_str()
            .map(|f| format!("  {f}"))
            .unwrap_or_default();
        println!(
            "  account {:<24} tenants: {}{fingerprint}",
            text(&account["id"]),
            owners.join(", ")
        );
    }
}
