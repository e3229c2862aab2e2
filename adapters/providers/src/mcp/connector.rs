//! The runnable MCP connector: a checked [`McpDocument`] with its environment read, its actions'
//! schemas compiled and its sessions ready to start. It answers the same calls a REST connector
//! does (bind, check the arguments, send, look up), classifying every answer by the table in
//! [`crate::mcp`].

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fmt;
use std::time::Duration;

use opledger_domain::contract::ProviderCapabilities;
use opledger_domain::ids::{
    AccountId, ActionName, CredentialFingerprint, ExternalObjectId, ProviderId, TenantId,
};
use opledger_domain::provider::{
    ArgProblem, Binding, LookupOutcome, LookupRequest, SendOutcome, SendRequest, Unbound,
};
use rmcp::model::{CallToolRequestParams, CallToolResult, ErrorCode};
use rmcp::service::ServiceError;
use serde_json::{Map, Value};
use tokio::sync::Semaphore;

use super::session::{self, Launch, Sessions, Unready};
use super::spec::{IdRule, McpAction, McpDedup, McpDocument, McpLookup, Upstream};
use super::{MAX_CALLS_IN_FLIGHT_PER_UPSTREAM, MAX_RESULT_TEXT_CHARS};
use crate::body::merge;
use crate::connector::{in_lookup_span, in_send_span, MAX_ARG_PROBLEMS};
use crate::credentials::fingerprint_of;
use crate::document::{fill_pattern, Means};
use crate::error::ConnectorError;
use crate::http::{shorten, MAX_MESSAGE_CHARS};
use crate::template::Context;

/// The least time a call is given once a session is at hand: a session started near the end of
/// the call's deadline still gets its request out and a moment for the answer.
const MIN_CALL_MS: Duration = Duration::from_millis(100);

/// One action, ready: its spec and its compiled schema.
struct Compiled {
    action: McpAction,
    validator: jsonschema::Validator,
    capabilities: ProviderCapabilities,
}

/// An MCP connector ready to call its upstream: see the module docs.
pub struct McpConnector {
    id: ProviderId,
    name: String,
    description: String,
    accounts: BTreeMap<AccountId, BTreeSet<TenantId>>,
    fingerprint: CredentialFingerprint,
    actions: Vec<Compiled>,
    read_only: Vec<String>,
    /// The read-only tools as the upstream's `tools/list` describes them, asked at the first
    /// listing and kept: an upstream's tools are fixed for the life of its process.
    read_only_listed: tokio::sync::OnceCell<Vec<UpstreamTool>>,
    rules: Vec<super::spec::TextRule>,
    sessions: Sessions,
    call_timeout: Duration,
    start_timeout: Duration,
    permits: Semaphore,
    /// Every secret read for the upstream, to scrub from what its answers echo.
    secrets: Vec<String>,
}

impl fmt::Debug for McpConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpConnector")
            .field("id", &self.id)
            .field("sessions", &self.sessions)
            .finish_non_exhaustive()
    }
}

/// One tool of an upstream as its `tools/list` shows it (for `opledger connectors import-mcp`).
#[derive(Clone, Debug, PartialEq)]
pub struct UpstreamTool {
    /// Its name.
    pub name: String,
    /// What it says it does.
    pub description: String,
    /// Its input JSON Schema.
    pub input_schema: Value,
    /// Its annotations (`readOnlyHint`, `idempotentHint`, `destructiveHint`, …), as sent.
    pub annotations: Value,
}

impl McpConnector {
    /// Builds the connector `document` describes, registered under `id` (default: the
    /// document's), with `accounts` beside the document's, reading the variables it names from
    /// `env`. Every problem is reported; nothing is started yet.
    pub fn build(
        document: &McpDocument,
        id: Option<ProviderId>,
        accounts: &[super::spec::McpAccount],
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<Self, Vec<ConnectorError>> {
        let errors = std::cell::RefCell::new(Vec::new());
        let problem = |field: String, message: String| {
            errors.borrow_mut().push(ConnectorError {
                file: document.name.clone(),
                line: None,
                field,
                message,
            });
        };
        let secrets = std::cell::RefCell::new(Vec::new());
        let read = |what: &str, name: &str, variable: &str| -> Option<OsString> {
            match env(variable) {
                Some(value) => {
                    secrets
                        .borrow_mut()
                        .push(value.to_string_lossy().into_owned());
                    Some(value)
                }
                None => {
                    problem(
                        format!("upstream.{what}.{name}"),
                        format!("reads the environment variable `{variable}`, which is not set; set it where opledger runs"),
                    );
                    None
                }
            }
        };
        let launch = match &document.upstream {
            Upstream::Stdio {
                command,
                args,
                env_from,
                cwd,
            } => Launch::Stdio {
                command: command.clone(),
                args: args.clone(),
                env: env_from
                    .iter()
                    .filter_map(|(name, variable)| {
                        read("env_from", name, variable).map(|value| (name.clone(), value))
                    })
                    .collect(),
                cwd: cwd.clone(),
            },
            Upstream::Http {
                url,
                headers_from,
                ca_file,
                oauth,
                login,
            } => {
                let client = session::http_client(ca_file.as_deref()).unwrap_or_else(|reason| {
                    problem("upstream.ca_file".to_owned(), reason);
                    reqwest013::Client::new()
                });
                Launch::Http {
                login: login.as_ref().map(|login| {
                    let text = |value: OsString| value.to_string_lossy().into_owned();
                    let id = login
                        .client_id_env
                        .as_ref()
                        .and_then(|variable| read("login", "client_id_env", variable).map(text));
                    let secret = login
                        .client_secret_env
                        .as_ref()
                        .and_then(|variable| read("login", "client_secret_env", variable).map(text));
                    std::sync::Arc::new(super::login::Login::new(url, login, id, secret, client.clone()))
                }),
                client,
                oauth: oauth.as_ref().and_then(|oauth| {
                    let id = read("oauth", "client_id_env", &oauth.client_id_env);
                    let secret = read("oauth", "client_secret_env", &oauth.client_secret_env);
                    let token_client = crate::http::build_client(
                        document.call_timeout_ms,
                        document.start_timeout_ms,
                    )
                    .map_err(|reason| problem("upstream.oauth".to_owned(), reason))
                    .ok()?;
                    Some(session::TokenSource::new(
                        oauth,
                        id?.to_string_lossy().into_owned(),
                        secret?.to_string_lossy().into_owned(),
                        token_client,
                    ))
                }),
                url: url.clone(),
                headers: headers_from
                    .iter()
                    .filter_map(|(name, variable)| {
                        let value = read("headers_from", name, variable)?;
                        let header = http::HeaderName::try_from(name.as_str());
                        let value = http::HeaderValue::try_from(value.to_string_lossy().as_ref());
                        match (header, value) {
                            (Ok(header), Ok(mut value)) => {
                                value.set_sensitive(true);
                                Some((header, value))
                            }
                            _ => {
                                problem(format!("upstream.headers_from.{name}"), format!("`{name}` with the value of `{variable}` is no valid HTTP header"));
                                None
                            }
                        }
                    })
                    .collect(),
            }
            }
        };
        let mut owners: BTreeMap<AccountId, BTreeSet<TenantId>> = BTreeMap::new();
        for account in document.accounts.iter().chain(accounts) {
            if owners.contains_key(&account.id) {
                problem(
                    "accounts".to_owned(),
                    format!("account `{}` is given twice", account.id),
                );
                continue;
            }
            owners.insert(
                account.id.clone(),
                account.tenants.iter().cloned().collect(),
            );
        }
        let mut actions = Vec::with_capacity(document.actions.len());
        for (index, action) in document.actions.iter().enumerate() {
            match jsonschema::draft202012::new(&action.input) {
                Ok(validator) => actions.push(Compiled {
                    capabilities: action.capabilities(),
                    action: action.clone(),
                    validator,
                }),
                Err(error) => problem(format!("actions[{index}].input"), error.to_string()),
            }
        }
        let errors = errors.into_inner();
        if !errors.is_empty() {
            return Err(errors);
        }
        let secrets = secrets.into_inner();
        // The binding's fingerprint: what the upstream is and the secrets it is reached with, so
        // a changed command, URL or token is seen before the next send.
        let identity = format!("{:?}|{}", launch, secrets.join("\u{1f}"));
        Ok(Self {
            id: id.unwrap_or_else(|| document.id.clone()),
            name: document.name.clone(),
            description: document.description.clone(),
            accounts: owners,
            fingerprint: fingerprint_of(&identity),
            actions,
            read_only: document.read_only.clone(),
            read_only_listed: tokio::sync::OnceCell::new(),
            rules: document.errors.clone(),
            sessions: Sessions::new(
                launch,
                document.sessions,
                Duration::from_millis(document.start_timeout_ms),
                Duration::from_millis(document.restart_wait_ms),
            ),
            call_timeout: Duration::from_millis(document.call_timeout_ms),
            start_timeout: Duration::from_millis(document.start_timeout_ms),
            permits: Semaphore::new(MAX_CALLS_IN_FLIGHT_PER_UPSTREAM),
            secrets: secrets
                .into_iter()
                .filter(|secret| secret.len() >= 4)
                .collect(),
        })
    }

    /// Whether the upstream acts for a person's login (`[upstream.login]`).
    pub fn takes_login(&self) -> bool {
        self.sessions.login().is_some()
    }

    /// Names where the person's login is kept: `file`, sealed under `key` (the server's
    /// key-encryption key narrowed to [`super::LOGIN_KEY_PURPOSE`]). Nothing for an upstream
    /// without `[upstream.login]`.
    pub fn place_login(&self, file: std::path::PathBuf, key: opledger_subjects::cipher::Key) {
        if let Some(login) = self.sessions.login() {
            login.place(self.id.as_str(), file, key);
        }
    }

    /// The file the person's login is sealed in, once placed.
    pub fn login_file(&self) -> Option<std::path::PathBuf> {
        self.sessions
            .login()
            .and_then(|login| login.file().map(std::path::Path::to_path_buf))
    }

    /// How many times the login's credentials were sealed (the login, then each renewal;
    /// `None`: the upstream takes no login).
    pub fn login_saves(&self) -> Option<u64> {
        self.sessions.login().map(|login| login.saves())
    }

    /// Logs a person in to the upstream (see [`super::login`]): `show` is handed the URL to
    /// open; the redirect is awaited on 127.0.0.1 for at most `timeout`.
    pub async fn log_in(
        &self,
        show: &mut (dyn FnMut(&str) + Send),
        timeout: Duration,
    ) -> Result<super::LoginReport, String> {
        let login = self.sessions.login().ok_or_else(|| {
            format!("the upstream `{}` has no [upstream.login]; a person logs in only to an upstream whose document asks for it", self.id)
        })?;
        let report = login.log_in(show, timeout).await?;
        // Sessions started with the former login's client read the new one at their next start.
        login.forget().await;
        Ok(report)
    }

    /// The provider id it is registered under.
    pub fn id(&self) -> &ProviderId {
        &self.id
    }

    /// The name of the document it was built from.
    pub fn document_name(&self) -> &str {
        &self.name
    }

    /// What the upstream is, in one line.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Every action, in the order declared.
    pub fn actions(&self) -> impl Iterator<Item = &McpAction> {
        self.actions.iter().map(|compiled| &compiled.action)
    }

    /// The action called `name`.
    pub fn action(&self, name: &ActionName) -> Option<&McpAction> {
        self.compiled(name).map(|compiled| &compiled.action)
    }

    /// How many times the upstream's OAuth2 token endpoint was asked (`None`: it takes no
    /// token).
    pub fn token_requests(&self) -> Option<u64> {
        self.sessions.token_requests()
    }

    /// The upstream tools declared read-only (passed through without the ledger).
    pub fn read_only_tools(&self) -> &[String] {
        &self.read_only
    }

    /// Each account with the tenants that own it and the upstream's fingerprint.
    pub fn account_owners(
        &self,
    ) -> impl Iterator<Item = (&AccountId, &BTreeSet<TenantId>, &CredentialFingerprint)> {
        self.accounts
            .iter()
            .map(|(id, tenants)| (id, tenants, &self.fingerprint))
    }

    /// What the ledger is promised for `action`.
    pub fn capabilities(&self, action: &ActionName) -> Option<ProviderCapabilities> {
        self.compiled(action).map(|compiled| compiled.capabilities)
    }

    /// How many sessions were started so far, restarts included.
    pub fn session_starts(&self) -> u64 {
        self.sessions.starts()
    }

    fn compiled(&self, name: &ActionName) -> Option<&Compiled> {
        self.actions
            .iter()
            .find(|compiled| compiled.action.name == *name)
    }

    fn action_names(&self) -> Vec<String> {
        self.actions
            .iter()
            .map(|compiled| compiled.action.name.as_str().to_owned())
            .collect()
    }

    /// The longest one send can take, in milliseconds: starting a session, then waiting for a
    /// call slot and the call, within the call timeout.
    pub fn longest_send_ms(&self) -> u64 {
        let total = self.call_timeout + self.start_timeout + MIN_CALL_MS;
        u64::try_from(total.as_millis()).unwrap_or(u64::MAX / 2)
    }

    /// What `tenant` acting in `account` through `action` is bound to.
    pub fn bind(
        &self,
        tenant: &TenantId,
        account: &AccountId,
        action: &ActionName,
    ) -> Result<Binding, Unbound> {
        let compiled = self.compiled(action).ok_or_else(|| Unbound::Action {
            provider: self.id.clone(),
            action: action.clone(),
            known: self.action_names(),
        })?;
        self.owned(tenant, account)?;
        Ok(Binding {
            capabilities: compiled.capabilities,
            credential_fingerprint: self.fingerprint.clone(),
            earlier_fingerprints: Vec::new(),
        })
    }

    fn owned(&self, tenant: &TenantId, account: &AccountId) -> Result<(), Unbound> {
        let owners = self.accounts.get(account).ok_or_else(|| Unbound::Account {
            provider: self.id.clone(),
            account: account.clone(),
        })?;
        if owners.contains(tenant) {
            Ok(())
        } else {
            Err(Unbound::NotOwned {
                provider: self.id.clone(),
                account: account.clone(),
                tenant: tenant.clone(),
            })
        }
    }

    fn check_call(
        &self,
        provider: &ProviderId,
        tenant: &TenantId,
        account: &AccountId,
    ) -> Result<(), String> {
        if *provider != self.id {
            return Err(format!(
                "the call is for provider `{provider}`, not `{}`",
                self.id
            ));
        }
        self.owned(tenant, account)
            .map_err(|unbound| unbound.to_string())
    }

    /// Checks a call's arguments against the action's input schema.
    pub fn check_args(&self, action: &ActionName, args: &Value) -> Result<(), Vec<ArgProblem>> {
        let Some(compiled) = self.compiled(action) else {
            return Err(vec![ArgProblem {
                pointer: String::new(),
                message: format!(
                    "provider `{}` has no action `{action}`; its actions are: {}",
                    self.id,
                    self.action_names().join(", ")
                ),
            }]);
        };
        let problems: Vec<ArgProblem> = compiled
            .validator
            .iter_errors(args)
            .take(MAX_ARG_PROBLEMS)
            .map(|error| ArgProblem {
                pointer: error.instance_path().as_str().to_owned(),
                message: shorten(&error.to_string(), MAX_MESSAGE_CHARS),
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// Carries out one attempt: one `tools/call`, classified.
    pub async fn execute(&self, request: &SendRequest) -> SendOutcome {
        in_send_span(&self.id, request, self.execute_unlogged(request)).await
    }

    async fn execute_unlogged(&self, request: &SendRequest) -> SendOutcome {
        if let Err(reason) = self.check_call(&request.provider, &request.tenant, &request.account) {
            return SendOutcome::NotSent {
                reason: format!("{reason}; nothing was sent"),
                retry_after_ms: None,
            };
        }
        let Some(compiled) = self.compiled(&request.action) else {
            return SendOutcome::Rejected {
                code: "local unsupported_action".to_owned(),
                message: format!(
                    "provider `{}` has no action `{}` (its actions: {}); nothing was sent",
                    self.id,
                    request.action,
                    self.action_names().join(", ")
                ),
            };
        };
        let action = &compiled.action;
        let args = request.args.as_map();
        let operation_id = request.operation_id.to_string();
        let settings = BTreeMap::new();
        let context = Context {
            args: Some(args),
            key: request.idempotency_key.as_str(),
            label: &request.label,
            account: request.account.as_str(),
            operation_id: &operation_id,
            settings: &settings,
        };
        let arguments = tool_arguments(action, args, &context);
        let answer = match self.call(&action.tool, arguments).await {
            Ok(answer) => answer,
            Err(failure) => return failure.into_send(),
        };
        self.classify_send(action, &context, answer)
    }

    /// One `tools/call` on a live session, within the call timeout.
    async fn call(&self, tool: &str, arguments: Map<String, Value>) -> Result<Answer, Failure> {
        // Waiting for a call slot and the call itself share one deadline, so a send takes at
        // most the start timeout and the call timeout (`longest_send_ms`).
        let deadline = tokio::time::Instant::now() + self.call_timeout;
        let Ok(_permit) = tokio::time::timeout_at(deadline, self.permits.acquire()).await else {
            return Err(Failure::NotSent(Unready {
                reason: format!(
                    "{MAX_CALLS_IN_FLIGHT_PER_UPSTREAM} calls to the upstream were out for {} ms",
                    self.call_timeout.as_millis()
                ),
                retry_after_ms: None,
            }));
        };
        let (index, session) = self.sessions.get().await.map_err(Failure::NotSent)?;
        if let Some(login) = self.sessions.login() {
            let fresh = tokio::time::timeout_at(deadline, login.fresh_token()).await;
            let refusal = match fresh {
                Ok(Ok(())) => None,
                Ok(Err(refusal)) => Some(refusal),
                Err(_) => Some(super::login::Refusal::Unavailable(format!(
                    "the authorization server did not renew the login's token within {} ms (call_timeout_ms)",
                    self.call_timeout.as_millis()
                ))),
            };
            if let Some(refusal) = refusal {
                login.forget().await;
                return Err(self.refused(refusal));
            }
        }
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let deadline = deadline.max(tokio::time::Instant::now() + MIN_CALL_MS);
        match tokio::time::timeout_at(deadline, session.peer().call_tool(params)).await {
            Err(_) => Err(Failure::Unclear(format!(
                "the upstream did not answer tools/call `{tool}` within {} ms (call_timeout_ms)",
                self.call_timeout.as_millis()
            ))),
            Ok(Ok(result)) => Ok(Answer::Result(result)),
            Ok(Err(ServiceError::McpError(error))) => Ok(Answer::Protocol {
                code: error.code,
                message: error.message.into_owned(),
            }),
            Ok(Err(error)) => {
                if let Some(refusal) = super::login::refused_for_authorization(&error) {
                    // A refused token is refused before anything runs (the upstream answered
                    // 401), and a token that could not be had stopped the request before it was
                    // written: either way nothing was done. The next session reads the sealed
                    // login again, in case a person logged in meanwhile.
                    self.sessions.discard(index, &session).await;
                    if let Some(login) = self.sessions.login() {
                        login.forget().await;
                    }
                    return Err(self.refused(refusal));
                }
                // The session broke with the call out: the upstream may have done it before it
                // died. The next call starts another session.
                self.sessions.discard(index, &session).await;
                Err(Failure::Unclear(format!(
                    "the session with the upstream broke during tools/call `{tool}`: {error}"
                )))
            }
        }
    }

    /// A call stopped for its login, never written: what to do about it and how long to wait.
    fn refused(&self, refusal: super::login::Refusal) -> Failure {
        let (reason, retry_after_ms) = match refusal {
            super::login::Refusal::LogInAgain(said) => (
                format!("{said}; run `opledger connectors login {}` again", self.id),
                super::login::REFUSED_LOGIN_WAIT_MS,
            ),
            super::login::Refusal::Unavailable(said) => {
                (said, super::login::UNAVAILABLE_TOKEN_WAIT_MS)
            }
        };
        Failure::NotSent(Unready {
            reason,
            retry_after_ms: Some(retry_after_ms),
        })
    }

    fn classify_send(
        &self,
        action: &McpAction,
        context: &Context<'_>,
        answer: Answer,
    ) -> SendOutcome {
        let (is_error, text, result) = match answer {
            Answer::Protocol { code, message } => {
                let message = self.scrub(message);
                if let Some(means) = self.rule_for(&message) {
                    return by_rule(means, format!("mcp {}", code.0), message);
                }
                return if code == ErrorCode::METHOD_NOT_FOUND || code == ErrorCode::INVALID_PARAMS {
                    SendOutcome::Rejected {
                        code: format!("mcp {}", code.0),
                        message: shorten(&message, MAX_MESSAGE_CHARS),
                    }
                } else {
                    SendOutcome::Uncertain {
                        error: format!(
                            "the upstream answered JSON-RPC error {}: {}",
                            code.0,
                            shorten(&message, MAX_MESSAGE_CHARS)
                        ),
                        retry_after_ms: None,
                    }
                };
            }
            Answer::Result(result) => {
                let text = self.scrub(result_text(&result));
                (result.is_error == Some(true), text, result)
            }
        };
        if is_error {
            if let Some(means) = self.rule_for(&text) {
                return by_rule(means, "mcp tool_error".to_owned(), text);
            }
            return SendOutcome::Uncertain {
                error: format!(
                    "tool `{}` reported an error, which proves nothing about what it did: {}",
                    action.tool,
                    shorten(&text, MAX_MESSAGE_CHARS)
                ),
                retry_after_ms: None,
            };
        }
        let unnamed = |why: &str| SendOutcome::Uncertain {
            error: format!(
                "tool `{}` answered, but {why}: {}",
                action.tool,
                shorten(&text, MAX_MESSAGE_CHARS)
            ),
            retry_after_ms: None,
        };
        if let Some(pattern) = &action.result.success_pattern {
            if !pattern.is_match(&text) {
                // Some servers answer a failure as an ordinary result ("Database error: …").
                if let Some(means) = self.rule_for(&text) {
                    return by_rule(means, "mcp tool_error".to_owned(), text);
                }
                return unnamed("its result does not say it was done (success_pattern)");
            }
        }
        let id = match &action.result.id {
            IdRule::At(pointer) => structured(&result, &text)
                .iter()
                .find_map(|value| value.pointer(pointer).and_then(id_text)),
            IdRule::Pattern(pattern) => pattern
                .captures(&text)
                .and_then(|captures| captures.get(1))
                .map(|found| found.as_str().to_owned()),
            IdRule::Template(template) => template.render_text(context),
        };
        match id.map(ExternalObjectId::new) {
            Some(Ok(external_id)) => SendOutcome::Confirmed {
                external_id,
                provider_request_id: None,
            },
            _ => unnamed("its result names no object"),
        }
    }

    fn rule_for(&self, text: &str) -> Option<Means> {
        self.rules
            .iter()
            .find(|rule| text.contains(&rule.contains))
            .map(|rule| rule.means)
    }

    fn scrub(&self, mut text: String) -> String {
        for secret in &self.secrets {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), "[redacted]");
            }
        }
        text
    }

    /// Looks an operation up with the action's lookup tool.
    pub async fn lookup(&self, request: &LookupRequest) -> LookupOutcome {
        in_lookup_span(&self.id, request, self.lookup_unlogged(request)).await
    }

    async fn lookup_unlogged(&self, request: &LookupRequest) -> LookupOutcome {
        let unavailable = |reason: String| LookupOutcome::Unavailable {
            reason,
            retry_after_ms: None,
        };
        if let Err(reason) = self.check_call(&request.provider, &request.tenant, &request.account) {
            return unavailable(reason);
        }
        let Some(compiled) = self.compiled(&request.action) else {
            return unavailable(format!(
                "provider `{}` has no action `{}`",
                self.id, request.action
            ));
        };
        let McpLookup::Tool(lookup) = &compiled.action.lookup else {
            return unavailable(format!(
                "action `{}` of provider `{}` declares no lookup; only a person can tell what became of the operation",
                request.action, self.id
            ));
        };
        let operation_id = request.operation_id.to_string();
        let settings = BTreeMap::new();
        let context = Context {
            args: None,
            key: request.idempotency_key.as_str(),
            label: &request.label,
            account: request.account.as_str(),
            operation_id: &operation_id,
            settings: &settings,
        };
        let arguments = match lookup
            .arguments
            .as_ref()
            .and_then(|tree| tree.render(&context))
        {
            Some(Value::Object(map)) => map,
            _ => Map::new(),
        };
        let text = match self.call(&lookup.tool, arguments).await {
            Err(Failure::NotSent(unready)) => {
                return LookupOutcome::Unavailable {
                    reason: unready.reason,
                    retry_after_ms: unready.retry_after_ms,
                }
            }
            Err(Failure::Unclear(reason)) => return unavailable(reason),
            Ok(Answer::Protocol { code, message }) => {
                return unavailable(format!(
                    "the lookup tool `{}` answered JSON-RPC error {}: {}",
                    lookup.tool,
                    code.0,
                    shorten(&self.scrub(message), MAX_MESSAGE_CHARS)
                ))
            }
            Ok(Answer::Result(result)) if result.is_error == Some(true) => {
                return unavailable(format!(
                    "the lookup tool `{}` reported an error: {}",
                    lookup.tool,
                    shorten(&self.scrub(result_text(&result)), MAX_MESSAGE_CHARS)
                ))
            }
            Ok(Answer::Result(result)) => self.scrub(result_text(&result)),
        };
        let filled = fill_pattern(
            &lookup.found,
            &request.label,
            request.idempotency_key.as_str(),
            request.account.as_str(),
        );
        let pattern = match regex::Regex::new(&filled) {
            Ok(pattern) => pattern,
            Err(error) => {
                return unavailable(format!(
                    "the lookup's pattern does not compile for this operation: {error}"
                ))
            }
        };
        let mut ids: Vec<ExternalObjectId> = Vec::new();
        for captures in pattern.captures_iter(&text) {
            if let Some(Ok(id)) = captures
                .get(1)
                .map(|found| ExternalObjectId::new(found.as_str()))
            {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        let evidence = format!(
            "tool `{}` answered: {}",
            lookup.tool,
            shorten(&text, MAX_RESULT_TEXT_CHARS)
        );
        let mut ids = ids.into_iter();
        match ids.next() {
            Some(external_id) => LookupOutcome::Found {
                external_id,
                account: request.account.clone(),
                duplicates: ids.collect(),
                evidence,
            },
            None => LookupOutcome::NotFound {
                authoritative: lookup.consistent,
                evidence,
            },
        }
    }

    /// The tools declared read-only, each with the description and input schema the upstream
    /// lists for it (a declared tool the upstream does not have is left out, with a warning).
    /// The first call asks the upstream within `call_timeout_ms`; a failure is not kept, so the
    /// next listing asks again.
    pub async fn read_only_listing(&self) -> Result<Vec<UpstreamTool>, String> {
        if self.read_only.is_empty() {
            return Ok(Vec::new());
        }
        let listed = self
            .read_only_listed
            .get_or_try_init(|| async {
                let (index, session) = self
                    .sessions
                    .get()
                    .await
                    .map_err(|unready| unready.reason)?;
                let tools =
                    match tokio::time::timeout(self.call_timeout, session.peer().list_all_tools())
                        .await
                    {
                        Ok(Ok(tools)) => tools,
                        Ok(Err(error)) => {
                            self.sessions.discard(index, &session).await;
                            return Err(format!("the upstream did not list its tools: {error}"));
                        }
                        Err(_) => {
                            return Err(format!(
                                "the upstream did not list its tools within {} ms (call_timeout_ms)",
                                self.call_timeout.as_millis()
                            ))
                        }
                    };
                let tools: Vec<UpstreamTool> = tools
                    .into_iter()
                    .map(upstream_tool)
                    .filter(|tool| self.read_only.contains(&tool.name))
                    .collect();
                for declared in &self.read_only {
                    if !tools.iter().any(|tool| &tool.name == declared) {
                        tracing::warn!(provider = %self.id, tool = %declared, "a tool declared read-only is not among the upstream's tools; it is not offered");
                    }
                }
                Ok(tools)
            })
            .await?;
        Ok(listed.clone())
    }

    /// Calls a tool declared read-only, outside the ledger (it changes nothing): for `tenant`,
    /// which must own one of the connector's accounts. Any other tool is refused without a call.
    pub async fn call_read_only(
        &self,
        tenant: &TenantId,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<CallToolResult, String> {
        if !self.accounts.values().any(|owners| owners.contains(tenant)) {
            return Err(format!(
                "tenant `{tenant}` owns no account of provider `{}`",
                self.id
            ));
        }
        if !self.read_only.iter().any(|name| name == tool) {
            return Err(format!(
                "tool `{tool}` of provider `{}` is neither an action nor declared read-only, so it is not called (the tools it passes through: {})",
                self.id,
                self.read_only.join(", ")
            ));
        }
        match self.call(tool, arguments).await {
            Ok(Answer::Result(result)) => Ok(result),
            Ok(Answer::Protocol { code, message }) => Err(format!(
                "the upstream answered JSON-RPC error {}: {}",
                code.0,
                self.scrub(message)
            )),
            Err(Failure::NotSent(unready)) => Err(unready.reason),
            Err(Failure::Unclear(reason)) => Err(reason),
        }
    }
}

/// The arguments a call sends: the call's own (when the action starts from them), the action's
/// `arguments` over them, and the contract's argument set to the key or the label if not written.
fn tool_arguments(
    action: &McpAction,
    args: &Map<String, Value>,
    context: &Context<'_>,
) -> Map<String, Value> {
    let base = if action.arguments_base_args {
        Value::Object(args.clone())
    } else {
        Value::Object(Map::new())
    };
    let over = action
        .arguments
        .as_ref()
        .and_then(|tree| tree.render(context))
        .unwrap_or(Value::Object(Map::new()));
    let Value::Object(mut merged) = merge(base, over) else {
        return Map::new();
    };
    match &action.dedup {
        McpDedup::IdempotencyArgument { argument, .. } if !merged.contains_key(argument) => {
            merged.insert(argument.clone(), Value::String(context.key.to_owned()));
        }
        McpDedup::LabelArgument { argument } if !merged.contains_key(argument) => {
            merged.insert(argument.clone(), Value::String(context.label.to_owned()));
        }
        _ => {}
    }
    merged
}

/// What came back from a call that was written.
enum Answer {
    /// A tool result (an error result included).
    Result(CallToolResult),
    /// A JSON-RPC error instead of a result.
    Protocol { code: ErrorCode, message: String },
}

/// A call that got no answer.
enum Failure {
    /// It was never written.
    NotSent(Unready),
    /// It was written; what became of it is unclear.
    Unclear(String),
}

impl Failure {
    fn into_send(self) -> SendOutcome {
        match self {
            Self::NotSent(unready) => SendOutcome::NotSent {
                reason: format!("{}; nothing was sent", unready.reason),
                retry_after_ms: unready.retry_after_ms,
            },
            Self::Unclear(error) => SendOutcome::Uncertain {
                error,
                retry_after_ms: None,
            },
        }
    }
}

fn by_rule(means: Means, code: String, text: String) -> SendOutcome {
    let message = shorten(&text, MAX_MESSAGE_CHARS);
    match means {
        Means::Rejected => SendOutcome::Rejected { code, message },
        Means::NotSent => SendOutcome::NotSent {
            reason: format!("the upstream said it did nothing: {message}"),
            retry_after_ms: None,
        },
        Means::Uncertain => SendOutcome::Uncertain {
            error: format!("the upstream answered {code}: {message}"),
            retry_after_ms: None,
        },
    }
}

/// Every text block of a result, one per line.
fn result_text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|text| text.text.as_str()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The result as JSON, in the order a pointer is tried: its structured content, then its text
/// if that is JSON (SDKs wrap a tool's returned text as `{"result": "…"}` structured content, so
/// the text may be where the object is).
fn structured(result: &CallToolResult, text: &str) -> Vec<Value> {
    result
        .structured_content
        .iter()
        .cloned()
        .chain(serde_json::from_str(text).ok())
        .collect()
}

/// An id as text: a string as it is, an integer written out.
fn id_text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) if !text.is_empty() => Some(text.clone()),
        Value::Number(number) if number.is_i64() || number.is_u64() => Some(number.to_string()),
        _ => None,
    }
}

/// Lists an upstream's tools: starts a session as `document` describes (variables from `env`),
/// asks `tools/list` (every page), and closes it.
pub async fn list_tools(
    upstream: &Upstream,
    env: &dyn Fn(&str) -> Option<OsString>,
    timeout: Duration,
) -> Result<Vec<UpstreamTool>, String> {
    let document = McpDocument {
        name: "import".to_owned(),
        id: ProviderId::new("import").expect("a valid provider id"),
        description: String::new(),
        upstream: upstream.clone(),
        call_timeout_ms: 1,
        start_timeout_ms: 1,
        restart_wait_ms: 0,
        sessions: 1,
        accounts: Vec::new(),
        actions: Vec::new(),
        read_only: Vec::new(),
        errors: Vec::new(),
    };
    let connector = McpConnector::build(&document, None, &[], env)
        .map_err(|errors| crate::error::render_all(&errors))?;
    let (session, _) = session::start(&connector.sessions.launch_for_listing(), timeout)
        .await
        .map_err(|unready| unready.reason)?;
    let listed = tokio::time::timeout(timeout, session.peer().list_all_tools()).await;
    let _ = session.cancel().await;
    let tools = match listed {
        Ok(Ok(tools)) => tools,
        Ok(Err(error)) => return Err(format!("the upstream did not list its tools: {error}")),
        Err(_) => {
            return Err(format!(
                "the upstream did not list its tools within {} ms",
                timeout.as_millis()
            ))
        }
    };
    Ok(tools.into_iter().map(upstream_tool).collect())
}

/// A tool as `tools/list` describes it.
fn upstream_tool(tool: rmcp::model::Tool) -> UpstreamTool {
    UpstreamTool {
        name: tool.name.to_string(),
        description: tool
            .description
            .map(|text| text.to_string())
            .unwrap_or_default(),
        input_schema: Value::Object((*tool.input_schema).clone()),
        annotations: tool
            .annotations
            .map(|annotations| serde_json::to_value(annotations).unwrap_or(Value::Null))
            .unwrap_or(Value::Null),
    }
}
