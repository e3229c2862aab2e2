//! opledger as an MCP server: the tools an agent sees are the configured actions its tenant may
//! use, and every answer is the ledger's state in words the agent may repeat truthfully.
//!
//! MCP clients re-send a side-effecting `tools/call` whenever an answer does not come back, and the
//! protocol has no idempotency key of its own. Here a tool call is an intent: it is recorded
//! before anything is sent, executed in the same call (waiting a bounded time), and answered with
//! the agent's sentence for the state it reached. A retry finds the same operation when it carries
//! the same request id, taken in this order:
//!
//! 1. the request's `_meta` field [`META_REQUEST_ID`] (`dev.opledger/request_id`), for clients
//!    and agent frameworks that can attach one to every delivery of a call;
//! 2. the tool's optional [`REQUEST_ID_ARG`] argument (`request_id`), which every action tool
//!    offers and whose description tells the model to pass a fresh one per request and the same
//!    one when it retries;
//! 3. neither: a new operation.
//!
//! The request id becomes the operation's source id as `mcp:<request id>` (see
//! [`source_id_of`]), so MCP request ids never collide with the HTTP API's source ids or
//! `Idempotency-Key`s. The same request id with other arguments is a tool error and nothing is
//! sent.
//!
//! This crate knows MCP and nothing of the HTTP service: the [`Ledger`] port is what it asks of
//! the server (the tenant's actions, record-and-execute, one operation, the open ones), which
//! `opledger serve` implements over its engine. [`McpServer`] is the handler, [`serve_stdio`] runs
//! it on stdin/stdout for one tenant (`opledger mcp`), [`http_service`] is the Streamable HTTP
//! transport `opledger serve` mounts at `/mcp`, where the route authenticates the bearer token and
//! puts the tenant in the request as a [`Caller`].
//!
//! Files: `tools.rs` the tool list and how a call's arguments are read; `reply.rs` what a call
//! answers.

mod reply;
mod tools;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use opledger_domain::ids::TenantId;
use opledger_domain::in_span::InSpanExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, Value};
use tracing::{info, warn};

pub use self::reply::next_step;
pub use self::tools::{
    actions_for_call, describe, source_id_of, tool_name, tools_named, Audience, Described,
    ACCOUNT_ARG, LIST_TOOL, MAX_REQUEST_ID_BYTES, META_REQUEST_ID, META_SUBJECT, REQUEST_ID_ARG,
    STATUS_TOOL, SUBJECT_ARG,
};
/// The answer of a tool, as a read-only upstream tool's is passed back.
pub use rmcp::model::CallToolResult;

/// How often a waiting tool call tells a client that asked for progress that it still waits, in
/// milliseconds.
pub const PROGRESS_INTERVAL_MS: u64 = 500;
/// The largest MCP request body `/mcp` reads, in bytes: a tool call is arguments, not documents
/// (the HTTP API's default `max_body_bytes`).
pub const MAX_MCP_BODY_BYTES: usize = 256 * 1024;

/// One action a tenant may use, as the ledger describes it: a tool.
#[derive(Clone, Debug, PartialEq)]
pub struct ActionTool {
    /// The provider (connector id).
    pub provider: String,
    /// The action's name at the provider.
    pub action: String,
    /// Its one-line description ("create a task").
    pub description: String,
    /// Whether it destroys or overwrites something.
    pub destructive: bool,
    /// Whether repeating the same request has no further effect at the provider (its contract is
    /// "naturally idempotent"), so a repeat without a request id is harmless too.
    pub repeat_harmless: bool,
    /// The JSON Schema its arguments must satisfy (an object schema).
    pub input: Value,
    /// The tenant's accounts at the provider, at least one.
    pub accounts: Vec<String>,
    /// Whether the server keeps personal data: the tool then takes the data subject a call is
    /// about ([`SUBJECT_ARG`], or `_meta` [`META_SUBJECT`]), as the HTTP API's record takes
    /// `subject`, and the call's values are sealed under that person's key.
    pub takes_subject: bool,
}

/// A tool of an upstream MCP server declared read-only: it changes nothing, so a call passes to
/// the upstream as it is, outside the ledger (nothing is recorded, nothing is deduplicated).
#[derive(Clone, Debug, PartialEq)]
pub struct PassThroughTool {
    /// The provider (the upstream's connector id).
    pub provider: String,
    /// The tool's name at the upstream.
    pub tool: String,
    /// What the upstream says it does.
    pub description: String,
    /// Its input JSON Schema, as the upstream lists it.
    pub input: Value,
}

/// A tool call as an intent to record and execute.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The provider.
    pub provider: String,
    /// The account it acts in.
    pub account: String,
    /// The action.
    pub action: String,
    /// The action's arguments (opledger's own fields taken out).
    pub args: Value,
    /// The source id a retry finds the operation by (see [`source_id_of`]).
    pub source_id: Option<String>,
    /// The data subject the call is about, when the tool takes one and it was given.
    pub subject: Option<String>,
}

/// Where one operation stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The operation.
    pub operation_id: String,
    /// Its state, one of the API's state names (`succeeded`, `unknown`, …).
    pub state: String,
    /// The agent's sentence for that state.
    pub message: String,
    /// The object the provider confirmed, if it did.
    pub external_id: Option<String>,
    /// For a tool call: whether this call recorded it (else a retry found it).
    pub created: Option<bool>,
}

/// An operation that is not settled yet, as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The operation.
    pub operation_id: String,
    /// Its state.
    pub state: String,
    /// The provider.
    pub provider: String,
    /// The action.
    pub action: String,
    /// The account.
    pub account: String,
    /// How long it has been unknown, in seconds, if it is.
    pub unknown_for_s: Option<i64>,
}

/// Why the ledger refused a call before anything was sent. Each message says what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The input is wrong (arguments off the schema, an account the tenant does not own).
    #[error("{0}")]
    Invalid(String),
    /// The request id already named another request.
    #[error("{0}")]
    Reused(String),
    /// No such operation for this tenant.
    #[error("{0}")]
    NotFound(String),
    /// The server is busy or its store unavailable; the same call may be repeated as it is.
    #[error("{0}")]
    Unavailable(String),
}

/// What the MCP server asks of the ledger. Every method acts for one tenant and sees only its
/// operations.
pub trait Ledger: Send + Sync + 'static {
    /// The actions `tenant` may use: those of the providers where it owns an account.
    fn actions(&self, tenant: &TenantId) -> Vec<ActionTool>;

    /// The actions of [`Ledger::actions`] a call of tool `name` needs (see
    /// [`actions_for_call`]): a port that can tell them apart before building each one answers
    /// with those only, so a call costs the same however many tools a server has.
    fn actions_for_call(&self, tenant: &TenantId, name: &str) -> Vec<ActionTool> {
        actions_for_call(self.actions(tenant), name)
    }

    /// How long a tool call waits for the outcome before answering where the operation stands.
    fn wait(&self) -> Duration;

    /// Records `call` as `tenant`'s intent and executes it, waiting at most [`Ledger::wait`]. A
    /// send, once started, is recorded whatever becomes of the future.
    fn call(
        &self,
        tenant: &TenantId,
        call: ToolCall,
    ) -> impl Future<Output = Result<Outcome, Refusal>> + Send;

    /// Where `tenant`'s operation `operation_id` stands.
    fn status(
        &self,
        tenant: &TenantId,
        operation_id: &str,
    ) -> impl Future<Output = Result<Outcome, Refusal>> + Send;

    /// The read-only tools of the upstream MCP servers where `tenant` owns an account. An
    /// upstream that cannot list them now is left out of this answer (the server logs why).
    fn pass_through_tools(
        &self,
        tenant: &TenantId,
    ) -> impl Future<Output = Vec<PassThroughTool>> + Send;

    /// Calls `tool`, declared read-only at `provider`, for `tenant` with `arguments`: the
    /// upstream's own answer, or why it was not called or did not answer.
    fn call_pass_through(
        &self,
        tenant: &TenantId,
        provider: &str,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> impl Future<Output = Result<CallToolResult, String>> + Send;

    /// `tenant`'s operations that are not settled, in `state` or in any open state.
    fn open_operations(
        &self,
        tenant: &TenantId,
        state: Option<String>,
    ) -> impl Future<Output = Result<Vec<Listed>, Refusal>> + Send;
}

/// The tenant an HTTP request was authenticated as: the `/mcp` route puts it in the request's
/// extensions, and the handler reads it from the request parts rmcp hands every call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller(pub TenantId);

/// The MCP handler: the tools of one tenant (stdio) or of each request's [`Caller`] (HTTP).
pub struct McpServer<L> {
    ledger: Arc<L>,
    tenant: Option<TenantId>,
}

impl<L> Clone for McpServer<L> {
    fn clone(&self) -> Self {
        Self {
            ledger: Arc::clone(&self.ledger),
            tenant: self.tenant.clone(),
        }
    }
}

impl<L: Ledger> McpServer<L> {
    /// Serves `tenant`, whoever connects (stdio: the process was started for it).
    pub fn for_tenant(ledger: Arc<L>, tenant: TenantId) -> Self {
        Self {
            ledger,
            tenant: Some(tenant),
        }
    }

    /// Serves the [`Caller`] each request carries (HTTP).
    pub fn per_request(ledger: Arc<L>) -> Self {
        Self {
            ledger,
            tenant: None,
        }
    }

    /// Whom a request acts for.
    fn tenant(&self, context: &RequestContext<RoleServer>) -> Result<TenantId, McpError> {
        if let Some(tenant) = &self.tenant {
            return Ok(tenant.clone());
        }
        context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>())
            .map(|caller| caller.0.clone())
            // The route refuses a request without a tenant token, so this is a wiring fault.
            .ok_or_else(|| McpError::internal_error("the request carries no tenant", None))
    }

    /// Records and executes one action call, telling a client that asked how long it has waited,
    /// until the ledger answers or the client cancels.
    async fn call_action(
        &self,
        tenant: TenantId,
        call: ToolCall,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let ledger = Arc::clone(&self.ledger);
        let wait = ledger.wait();
        let what = format!("{} at {}", call.action, call.provider);
        // Spawned: a cancelled request (or a client that hangs up) stops the wait, never the
        // recording nor a send half-way; the ledger records the outcome either way.
        let mut task = tokio::spawn(
            async move { ledger.call(&tenant, call).await }.in_span(tracing::Span::current()),
        );
        let progress = context.meta.get_progress_token();
        let started = Instant::now();
        let every = Duration::from_millis(PROGRESS_INTERVAL_MS);
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tokio::select! {
                joined = &mut task => {
                    let answered = joined.map_err(|error| {
                        McpError::internal_error(format!("the tool call failed: {error}"), None)
                    })?;
                    return Ok(match answered {
                        Ok(outcome) => reply::outcome_result(&outcome),
                        Err(refusal) => reply::refusal_result(&refusal),
                    });
                }
                () = context.ct.cancelled() => {
                    info!("the client cancelled a tool call: its wait ends, its send (if any) goes on");
                    return Err(McpError::internal_error("cancelled by the client", None));
                }
                _ = ticks.tick(), if progress.is_some() => {
                    let Some(token) = progress.clone() else { continue };
                    let waited_ms = started.elapsed().as_millis() as f64;
                    let notice = ProgressNotificationParam::new(token, waited_ms)
                        .with_total(wait.as_millis() as f64)
                        .with_message(format!("waiting for {what} to confirm"));
                    if let Err(error) = context.peer.notify_progress(notice).await {
                        warn!(%error, "a progress notification could not be sent");
                    }
                }
            }
        }
    }
}

impl<L: Ledger> ServerHandler for McpServer<L> {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("opledger", env!("CARGO_PKG_VERSION")))
            .with_instructions(tools::INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tenant = self.tenant(&context)?;
        let catalog = tools::Catalog::of(
            self.ledger.actions(&tenant),
            self.ledger.pass_through_tools(&tenant).await,
        );
        Ok(ListToolsResult::with_all_items(catalog.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let tenant = self.tenant(&context)?;
        let arguments = request.arguments.unwrap_or_default();
        let span = tracing::info_span!("tool_call", tool = %request.name, %tenant);
        // W3C trace context in `_meta` (as MCP clients that trace send it; over HTTP the
        // request's headers already did the same): the tool call's work joins the agent's trace.
        let trace_meta = |name: &str| {
            request
                .meta
                .as_ref()
                .and_then(|meta| meta.get(name))
                .or_else(|| context.meta.get(name))
                .and_then(|value| value.as_str())
        };
        if let Some(traceparent) = trace_meta("traceparent") {
            opledger_domain::trace_context::set_remote_parent(
                &span,
                traceparent,
                trace_meta("tracestate"),
            );
        }
        let result = match request.name.as_ref() {
            STATUS_TOOL => self.status(&tenant, &arguments).in_span(span).await,
            LIST_TOOL => self.list(&tenant, &arguments).in_span(span).await,
            name => {
                let catalog =
                    tools::Catalog::of(self.ledger.actions_for_call(&tenant, name), Vec::new());
                let Some(action) = catalog.action(name) else {
                    // Not an action: perhaps a read-only tool of an upstream. Asked only now, so
                    // an upstream that cannot list its tools never delays an action's call.
                    return self
                        .pass_through(&tenant, name, arguments)
                        .in_span(span)
                        .await
                        .map(Into::into);
                };
                let meta = request
                    .meta
                    .as_ref()
                    .and_then(|meta| meta.get(META_REQUEST_ID))
                    .or_else(|| context.meta.get(META_REQUEST_ID));
                let meta_subject = request
                    .meta
                    .as_ref()
                    .and_then(|meta| meta.get(META_SUBJECT))
                    .or_else(|| context.meta.get(META_SUBJECT));
                match tools::read_call(action, arguments, meta, meta_subject) {
                    Ok(call) => {
                        self.call_action(tenant, call, &context)
                            .in_span(span)
                            .await?
                    }
                    Err(problem) => reply::refusal_result(&Refusal::Invalid(problem)),
                }
            }
        };
        Ok(result.into())
    }
}

impl<L: Ledger> McpServer<L> {
    /// Calls the read-only upstream tool listed as `name`, or refuses a name no tool has.
    async fn pass_through(
        &self,
        tenant: &TenantId,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<CallToolResult, McpError> {
        let catalog = tools::Catalog::of(
            self.ledger.actions(tenant),
            self.ledger.pass_through_tools(tenant).await,
        );
        let Some(tool) = catalog.pass_through(name) else {
            return Err(McpError::invalid_params(
                format!("no tool `{name}` for this tenant; tools/list names them"),
                None,
            ));
        };
        info!(provider = %tool.provider, tool = %tool.tool, "a read-only tool passes to its upstream, outside the ledger");
        Ok(
            match self
                .ledger
                .call_pass_through(tenant, &tool.provider, &tool.tool, arguments)
                .await
            {
                Ok(result) => result,
                Err(reason) => reply::pass_through_failed(&tool.provider, &tool.tool, &reason),
            },
        )
    }

    async fn status(&self, tenant: &TenantId, arguments: &Map<String, Value>) -> CallToolResult {
        let answered = match tools::read_operation_id(arguments) {
            Ok(operation_id) => self.ledger.status(tenant, &operation_id).await,
            Err(problem) => Err(Refusal::Invalid(problem)),
        };
        match answered {
            Ok(outcome) => reply::outcome_result(&outcome),
            Err(refusal) => reply::refusal_result(&refusal),
        }
    }

    async fn list(&self, tenant: &TenantId, arguments: &Map<String, Value>) -> CallToolResult {
        let answered = match tools::read_state(arguments) {
            Ok(state) => self.ledger.open_operations(tenant, state).await,
            Err(problem) => Err(Refusal::Invalid(problem)),
        };
        match answered {
            Ok(listed) => reply::listed_result(&listed),
            Err(refusal) => reply::refusal_result(&refusal),
        }
    }
}

/// Why the stdio server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum McpServeError {
    /// The MCP session could not start (the client spoke something else) or broke.
    #[error("the MCP session failed: {0}")]
    Session(String),
}

/// Serves `server` on stdin and stdout until the client closes them or `until` resolves.
/// Stdout carries the protocol only; logs go to stderr.
pub async fn serve_stdio<L: Ledger>(
    server: McpServer<L>,
    until: impl Future<Output = ()> + Send,
) -> Result<(), McpServeError> {
    let running = server
        .serve(rmcp::transport::io::stdio_pipes())
        .await
        .map_err(|error| McpServeError::Session(error.to_string()))?;
    let cancel = running.cancellation_token();
    tokio::select! {
        ended = running.waiting() => {
            ended.map_err(|error| McpServeError::Session(error.to_string()))?;
        }
        () = until => cancel.cancel(),
    }
    Ok(())
}

/// The Streamable HTTP transport for `opledger serve`'s `/mcp` route: stateless (every POST is
/// answered on its own), so no session outlives a request and any instance can answer any call.
/// A call answered without a notification first is one JSON body; one that sends progress
/// notifications answers on an event stream. `stop` ends open streams at shutdown. The route in
/// front of it authenticates and puts the [`Caller`] in the request.
pub fn http_service<L: Ledger>(
    ledger: Arc<L>,
    stop: tokio_util::sync::CancellationToken,
) -> StreamableHttpService<McpServer<L>, NeverSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        // A plain JSON answer where the spec allows one: an event stream for a single message
        // costs the client an SSE parser and the server a stream task for nothing.
        .with_json_response(true)
        .with_cancellation_token(stop)
        .with_max_request_body_bytes(MAX_MCP_BODY_BYTES)
        // Every request needs the tenant's bearer token, which a page rebinding a host name to
        // the server cannot have; the loopback-only Host check would refuse a server that was
        // configured to listen beyond loopback.
        .disable_allowed_hosts();
    StreamableHttpService::new(
        move || Ok(McpServer::per_request(Arc::clone(&ledger))),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// The cancellation token [`http_service`] takes (re-exported, so callers need not name
/// `tokio-util`).
pub use tokio_util::sync::CancellationToken;
