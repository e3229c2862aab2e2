//! The MCP server's view of this service: [`opledger_mcp::Ledger`] over the same engine, read
//! models and limits the HTTP routes use, and the `/mcp` route (Streamable HTTP) with the bearer
//! token as the tenant.
//!
//! A tool call goes through exactly the path of `POST /v1/operations?execute=true`: the same
//! checks of provider, account and arguments, the same one-append record-and-claim, the same
//! bounded wait with the drive going on after it, the same execute places.

// The handlers share the parent module's imports, extractors and helpers.
use super::*;
use opledger_domain::contract::Deduplication;
use opledger_mcp::{ActionTool, Caller, Listed, Outcome, PassThroughTool, Refusal, ToolCall};

use super::operations::{execute_place, record_then_execute, wait_of, RecordBody};

/// Most operations `list_operations` answers with, per state asked.
const MAX_LISTED_PER_STATE: usize = 50;

/// The MCP port over the service's shared state.
pub struct McpLedger(pub(crate) Arc<Shared>);

impl opledger_mcp::Ledger for McpLedger {
    fn actions(&self, tenant: &TenantId) -> Vec<ActionTool> {
        actions_of(&self.0, tenant)
            .into_iter()
            .map(|(action, _)| action)
            .collect()
    }

    fn actions_for_call(&self, tenant: &TenantId, name: &str) -> Vec<ActionTool> {
        let providers = self.0.engine.providers();
        let pairs = providers
            .connectors()
            .flat_map(|connector| {
                connector
                    .actions()
                    .map(|action| (connector.id().as_str(), action.name.as_str()))
            })
            .chain(providers.mcp_connectors().flat_map(|upstream| {
                upstream
                    .actions()
                    .map(|action| (upstream.id().as_str(), action.name.as_str()))
            }));
        let wanted = opledger_mcp::tools_named(pairs, name);
        actions_where(&self.0, tenant, |provider, action| {
            wanted.contains(&opledger_mcp::tool_name(provider, action))
        })
        .into_iter()
        .map(|(action, _)| action)
        .collect()
    }

    fn wait(&self) -> Duration {
        Duration::from_millis(self.0.limits.default_wait_ms)
    }

    async fn call(&self, tenant: &TenantId, call: ToolCall) -> Result<Outcome, Refusal> {
        let shared = &self.0;
        let wait = wait_of(shared, None).map_err(refusal)?;
        let place = execute_place(shared).map_err(refusal)?;
        let body = RecordBody {
            provider: call.provider,
            account: call.account,
            action: call.action,
            args: call.args,
            source_id: call.source_id,
            owner: None,
            requires_approval: false,
            // Named by the call, or where the tool's connector declares it, if anywhere.
            subject: call.subject,
        };
        let recorded = record_then_execute(shared, tenant, body, Some((place, wait)))
            .await
            .map_err(refusal)?;
        if let Some(error) = &recorded.execute_error {
            // The intent is recorded and the workers send it: the answer is where it stands.
            warn!(operation_id = %recorded.operation.operation_id, code = error.code, "a tool call's execute failed after recording");
        }
        let mut outcome = outcome_of(shared, &recorded.operation);
        outcome.created = Some(recorded.created);
        Ok(outcome)
    }

    async fn status(&self, tenant: &TenantId, operation_id: &str) -> Result<Outcome, Refusal> {
        let shared = &self.0;
        let id = super::operation_id(operation_id).map_err(refusal)?;
        let scope = Scope::Tenants([tenant.clone()].into());
        let loaded = visible(shared, &scope, id).await.map_err(refusal)?;
        Ok(outcome_of(shared, &loaded))
    }

    async fn pass_through_tools(&self, tenant: &TenantId) -> Vec<PassThroughTool> {
        let providers = self.0.engine.providers();
        let mut tools = Vec::new();
        for connector in providers.mcp_connectors() {
            let owned = connector
                .account_owners()
                .any(|(_, owners, _)| owners.contains(tenant));
            if !owned || connector.read_only_tools().is_empty() {
                continue;
            }
            match connector.read_only_listing().await {
                Ok(listed) => tools.extend(listed.into_iter().map(|tool| PassThroughTool {
                    provider: connector.id().to_string(),
                    tool: tool.name,
                    description: tool.description,
                    input: tool.input_schema,
                })),
                Err(reason) => {
                    warn!(provider = %connector.id(), %reason, "the upstream's read-only tools are not listed this time")
                }
            }
        }
        tools
    }

    async fn call_pass_through(
        &self,
        tenant: &TenantId,
        provider: &str,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
    ) -> Result<opledger_mcp::CallToolResult, String> {
        let providers = self.0.engine.providers();
        let connector = ProviderId::new(provider)
            .ok()
            .and_then(|id| providers.mcp(&id))
            .ok_or_else(|| format!("no MCP upstream `{provider}` is configured"))?;
        connector.call_read_only(tenant, tool, arguments).await
    }

    async fn open_operations(
        &self,
        tenant: &TenantId,
        state: Option<String>,
    ) -> Result<Vec<Listed>, Refusal> {
        let shared = &self.0;
        fresh_read_models(shared).await.map_err(refusal)?;
        let states: Vec<String> = match state {
            Some(state) => vec![state],
            None => [
                "awaiting_approval",
                "pending",
                "in_flight",
                "unknown",
                "needs_review",
            ]
            .map(str::to_owned)
            .to_vec(),
        };
        let now = Utc::now();
        let mut listed = Vec::new();
        for state in states {
            let filter = OperationFilter {
                state: Some(state),
                tenant: Some(tenant.clone()),
                ..OperationFilter::default()
            };
            let page = shared
                .read_models
                .call(move |store| store.list_operations(&filter, MAX_LISTED_PER_STATE, None))
                .await
                .map_err(|error| refusal(error.into()))?;
            listed.extend(page.operations.into_iter().map(|row| Listed {
                operation_id: row.operation_id.to_string(),
                state: row.state.to_owned(),
                provider: row.provider.to_string(),
                action: row.action.to_string(),
                account: row.account.to_string(),
                unknown_for_s: row.unknown_since.map(|since| (now - since).num_seconds()),
            }));
        }
        Ok(listed)
    }
}

/// The actions `tenant` may use (those of the providers where it owns an account), each with
/// its provider's deduplication contract: the MCP tools and `GET /v1/actions` both list these.
pub(super) fn actions_of(shared: &Shared, tenant: &TenantId) -> Vec<(ActionTool, Deduplication)> {
    actions_where(shared, tenant, |_, _| true)
}

/// [`actions_of`] for the (provider, action) pairs `keep` keeps, each built only if kept.
fn actions_where(
    shared: &Shared,
    tenant: &TenantId,
    keep: impl Fn(&str, &str) -> bool,
) -> Vec<(ActionTool, Deduplication)> {
    let providers = shared.engine.providers();
    let mut actions = Vec::new();
    for connector in providers.connectors() {
        let accounts: Vec<String> = connector
            .account_owners()
            .filter(|(_, owners, _)| owners.contains(tenant))
            .map(|(account, _, _)| account.to_string())
            .collect();
        if accounts.is_empty() {
            continue;
        }
        for action in connector.actions() {
            if !keep(connector.id().as_str(), action.name.as_str()) {
                continue;
            }
            let deduplication = connector
                .capabilities(&action.name)
                .map_or(Deduplication::None, |c| c.deduplication);
            actions.push((
                ActionTool {
                    provider: connector.id().to_string(),
                    action: action.name.to_string(),
                    description: action.description.clone(),
                    destructive: action.destructive,
                    repeat_harmless: matches!(deduplication, Deduplication::NaturallyIdempotent),
                    input: action.input.clone(),
                    accounts: accounts.clone(),
                    takes_subject: shared.subjects.is_some(),
                },
                deduplication,
            ));
        }
    }
    for upstream in providers.mcp_connectors() {
        let accounts: Vec<String> = upstream
            .account_owners()
            .filter(|(_, owners, _)| owners.contains(tenant))
            .map(|(account, _, _)| account.to_string())
            .collect();
        if accounts.is_empty() {
            continue;
        }
        for action in upstream.actions() {
            if !keep(upstream.id().as_str(), action.name.as_str()) {
                continue;
            }
            let deduplication = action.capabilities().deduplication;
            actions.push((
                ActionTool {
                    provider: upstream.id().to_string(),
                    action: action.name.to_string(),
                    description: action.description.clone(),
                    destructive: action.destructive,
                    repeat_harmless: matches!(deduplication, Deduplication::NaturallyIdempotent),
                    input: action.input.clone(),
                    accounts: accounts.clone(),
                    takes_subject: shared.subjects.is_some(),
                },
                deduplication,
            ));
        }
    }
    actions
}

/// An operation as a tool answers it, with the sentence the HTTP API answers with.
fn outcome_of(shared: &Shared, loaded: &LoadedOperation) -> Outcome {
    let view = operation_view(shared, loaded);
    Outcome {
        operation_id: loaded.operation_id.to_string(),
        state: view.state.to_owned(),
        message: view.message,
        external_id: view.external_id.map(ToString::to_string),
        created: None,
    }
}

/// An API error as a tool's refusal: the same message, sorted by what the agent can do about it.
fn refusal(error: ApiError) -> Refusal {
    match error.code {
        "source_id_reused" => Refusal::Reused(
            error
                .message
                .replacen("source id `mcp:", "request_id `", 1)
                .replace(
                    "a new request needs a new source id",
                    "a new request needs a new request_id; nothing was sent",
                ),
        ),
        "not_found" => Refusal::NotFound(error.message),
        _ if error.status.is_client_error() && error.status != StatusCode::CONFLICT => {
            Refusal::Invalid(error.message)
        }
        _ => Refusal::Unavailable(error.message),
    }
}

/// `/mcp`: the MCP Streamable HTTP transport, behind the bearer token. A tenant token is the
/// tenant; any other (an operator's, an approver's) is refused, since tools act for a tenant.
pub(crate) fn route(shared: Arc<Shared>) -> Router<Arc<Shared>> {
    let service =
        opledger_mcp::http_service(Arc::new(McpLedger(Arc::clone(&shared))), mcp_stop(&shared));
    Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(shared, authenticate))
}

/// A cancellation token cancelled when the server starts shutting down, so open MCP streams end.
fn mcp_stop(shared: &Shared) -> opledger_mcp::CancellationToken {
    let token = opledger_mcp::CancellationToken::new();
    let cancel = token.clone();
    let mut shutdown = shared.shutdown.clone();
    tokio::spawn(async move {
        let _ = shutdown.wait_for(|stopping| *stopping).await;
        cancel.cancel();
    });
    token
}

/// Puts the calling tenant in the request, or answers 401/403 as the API does. A browser's
/// request from a foreign origin is refused first (403), as the MCP Streamable HTTP transport
/// requires against DNS rebinding: a page on `http://evil.example` whose name was made to resolve
/// to 127.0.0.1 must not reach a local server.
async fn authenticate(
    State(shared): State<Arc<Shared>>,
    mut request: Request,
    next: axum::middleware::Next,
) -> Response {
    if let Err(error) = origin_allowed(request.headers(), &shared.mcp_allowed_origins) {
        return error.into_response();
    }
    let tenant = match shared
        .tokens
        .authenticate(request.headers())
        .and_then(tenant_of)
    {
        Ok(tenant) => tenant.clone(),
        Err(error) => return error.into_response(),
    };
    request.extensions_mut().insert(Caller(tenant));
    let request = match checked_tool_call(request).await {
        Ok(request) => request,
        Err(refusal) => return refusal,
    };
    next.run(request).await
}

/// A `tools/call` whose `arguments` the MCP SDK would misread is answered here with JSON-RPC's
/// invalid params (-32602), naming what is wrong: `arguments` that are no object (the SDK
/// answers "method not found" for it), and an object holding one key twice at any depth (the SDK
/// keeps the last, silently). Any other request passes on with its body unchanged.
async fn checked_tool_call(request: Request) -> Result<Request, Response> {
    if request.method() != axum::http::Method::POST {
        return Ok(request);
    }
    let (parts, body) = request.into_parts();
    // A longer body is cut here and refused by the SDK's own limit, as before.
    let bytes = axum::body::to_bytes(body, opledger_mcp::MAX_MCP_BODY_BYTES + 1)
        .await
        .unwrap_or_default();
    let message: Option<serde_json::Value> = serde_json::from_slice(&bytes).ok();
    let call = message
        .as_ref()
        .filter(|message| message["method"] == "tools/call");
    if let Some(call) = call {
        let arguments = &call["params"]["arguments"];
        let problem = if !(arguments.is_object() || arguments.is_null()) {
            Some("`params.arguments` must be an object of the tool's arguments".to_owned())
        } else {
            opledger_domain::args::check_json(&bytes, "")
                .err()
                .map(|error| error.to_string())
        };
        if let Some(problem) = problem {
            let answer = serde_json::json!({
                "jsonrpc": "2.0",
                "id": call["id"],
                "error": {"code": -32602, "message": format!("invalid params: {problem}")},
            });
            return Err(crate::error::json_reply(StatusCode::OK, &answer));
        }
    }
    Ok(Request::from_parts(parts, axum::body::Body::from(bytes)))
}

/// Whether `/mcp` answers a request with these headers: one without `Origin` (no browser sent
/// it: an agent's own client), or one whose `Origin` is a loopback origin (`localhost`,
/// `127.0.0.0/8`, `[::1]`) or listed in `[mcp] allowed_origins`. Anything else, `null` and
/// several `Origin` headers included, is refused with 403 naming the origin and the setting.
pub(crate) fn origin_allowed(headers: &HeaderMap, allowed: &[String]) -> Result<(), ApiError> {
    let mut origins = headers.get_all(axum::http::header::ORIGIN).iter();
    let Some(origin) = origins.next() else {
        return Ok(());
    };
    let refused = |shown: &str| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "origin_not_allowed",
            format!(
                "/mcp does not answer pages from origin `{shown}`; list it under [mcp] allowed_origins if that page is yours (loopback origins are always allowed)"
            ),
        )
    };
    if origins.next().is_some() {
        return Err(refused("(several Origin headers)"));
    }
    let text = origin.to_str().map_err(|_| refused("(not text)"))?;
    let lower = text.trim().to_ascii_lowercase();
    if is_loopback_origin(&lower) || allowed.contains(&lower) {
        Ok(())
    } else {
        Err(refused(&opledger_providers::http::shorten(text, 100)))
    }
}

/// Whether `origin` (lower case) is `http(s)://` a loopback host, with any port.
fn is_loopback_origin(origin: &str) -> bool {
    let Some(authority) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    if authority.contains(['/', '@', '?', '#']) {
        return false;
    }
    let host = match authority.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_origin(origins: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for origin in origins {
            headers.append(
                axum::http::header::ORIGIN,
                origin.parse().expect("a header value"),
            );
        }
        headers
    }

    #[test]
    fn loopback_and_listed_origins_are_answered_and_others_refused() {
        let allowed = vec!["https://agent.example.com".to_owned()];
        for origin in [
            "http://localhost:3000",
            "http://127.0.0.1:8080",
            "https://[::1]:1",
            "HTTPS://Agent.Example.com",
        ] {
            assert!(
                origin_allowed(&with_origin(&[origin]), &allowed).is_ok(),
                "{origin}"
            );
        }
        assert!(origin_allowed(&HeaderMap::new(), &allowed).is_ok());
        for origins in [
            &["http://evil.example"][..],
            &["null"],
            &["http://localhost.evil.example"],
            &["http://127.0.0.1.evil.example"],
            &["http://localhost@evil.example"],
            &["https://agent.example.com:444"],
            &["http://localhost", "http://evil.example"],
        ] {
            assert!(
                origin_allowed(&with_origin(origins), &allowed).is_err(),
                "{origins:?}"
            );
        }
    }
}
