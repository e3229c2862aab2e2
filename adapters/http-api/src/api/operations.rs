//! Acting on one operation: record an intent, show it and its history, approve or deny it,
//! execute it and wait for its outcome.

// The handlers share the parent module's imports, extractors and helpers.
use super::*;
use tokio::sync::OwnedSemaphorePermit;

use crate::render::{view_as_of, AsOf};

/// While another worker's attempt is in flight, an execute call looks for its outcome after this
/// pause, doubling up to [`IN_FLIGHT_POLL_MAX`]: a send usually ends within milliseconds.
const IN_FLIGHT_POLL_MIN: Duration = Duration::from_millis(1);
const IN_FLIGHT_POLL_MAX: Duration = Duration::from_millis(20);

/// The request header a client names one request with (Stripe's convention), and the answer's
/// header that says the answer is the operation an earlier request with the key recorded.
const IDEMPOTENCY_KEY: &str = "idempotency-key";
const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// What a record call asks for (the body of `POST /v1/operations`; the MCP tools build it too).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordBody {
    pub(crate) provider: String,
    pub(crate) account: String,
    pub(crate) action: String,
    pub(crate) args: Value,
    pub(crate) source_id: Option<String>,
    pub(crate) owner: Option<String>,
    #[serde(default)]
    pub(crate) requires_approval: bool,
    /// The data subject (the person the arguments are about): their values are sealed under
    /// their own key, so they can be erased later. Never stored in clear.
    #[serde(default)]
    pub(crate) subject: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalBody {
    /// Who decides; required with a tenant token, taken from the token for an approver.
    approver: Option<String>,
    args_hash: String,
    /// Why, when denying.
    reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RecordQuery {
    /// `true`: execute it right away, as `POST …/execute` would, and answer where it stands.
    execute: Option<String>,
    /// With `execute=true`: how long to wait for the outcome.
    wait_ms: Option<String>,
}

/// What a record call did: the operation as it stands when the call answers, whether this call
/// created it, and why executing it failed after it was recorded (with `execute=true`).
pub(crate) struct Recorded {
    pub(crate) operation: LoadedOperation,
    pub(crate) created: bool,
    pub(crate) execute_error: Option<ApiError>,
}

pub(super) async fn record(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<RecordQuery>, axum::extract::rejection::QueryRejection>,
    request: Request,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(request.headers())?;
    let tenant = tenant_of(principal)?.clone();
    let Query(query) = query?;
    let (execute_now, wait) = execute_and_wait(&shared, &query)?;
    let key = idempotency_key(request.headers())?;
    let place = if execute_now {
        Some((execute_place(&shared)?, wait))
    } else {
        None
    };
    let mut body: RecordBody = body(&shared, request).await?;
    body.source_id = source_of(key.as_deref(), body.source_id.take())?;
    let recorded = record_then_execute(&shared, &tenant, body, place)
        .await
        // With the header the client named its request by the key, so the refusal names it so.
        .map_err(|error| match key {
            Some(_) => error.for_idempotency_key(),
            None => error,
        })?;
    let status = if recorded.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut view = operation_view(&shared, &recorded.operation);
    view.created = Some(recorded.created);
    view.execute_error = recorded
        .execute_error
        .map(|error| json!({"code": error.code, "message": error.message}));
    let mut reply = view_reply(status, &view);
    if key.is_some() && !recorded.created {
        reply.headers_mut().insert(
            IDEMPOTENT_REPLAYED,
            axum::http::HeaderValue::from_static("true"),
        );
    }
    Ok(reply)
}

/// The `Idempotency-Key` header, if sent: one visible-ASCII value (checked as a source id when
/// the intent is recorded).
pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let invalid = |message: &str| {
        ApiError::invalid(ValidationError::new("Idempotency-Key", message.to_owned()))
    };
    if values.next().is_some() {
        return Err(invalid("is sent more than once; send one key per request"));
    }
    let key = value
        .to_str()
        .map_err(|_| invalid("must be visible ASCII text, e.g. a UUID"))?;
    Ok(Some(key.to_owned()))
}

/// The source id a record call asks under. The `Idempotency-Key` header *is* the source id (the
/// same tenant-scoped namespace, so `Idempotency-Key: K` and `"source_id": "K"` name one
/// request); sending both with different values is refused, since one of them would be ignored.
pub(super) fn source_of(
    key: Option<&str>,
    source_id: Option<String>,
) -> Result<Option<String>, ApiError> {
    match (key, source_id) {
        (Some(key), Some(source_id)) if key != source_id => {
            Err(ApiError::invalid(ValidationError::new(
                "source_id",
                "differs from the Idempotency-Key header; both name the request (the key is the source id): send one of them, or both with the same value",
            )))
        }
        (Some(key), _) => Ok(Some(key.to_owned())),
        (None, source_id) => Ok(source_id),
    }
}

/// Records the intent `body` asks for as `tenant`; with a place (and a wait), executes it in the
/// same call and answers where it stands when it settles or the wait ends.
pub(crate) async fn record_then_execute(
    shared: &Arc<Shared>,
    tenant: &TenantId,
    body: RecordBody,
    place: Option<(OwnedSemaphorePermit, Duration)>,
) -> Result<Recorded, ApiError> {
    let personal = personal_of_body(shared, tenant, &body)?;
    let request = intent_request(shared, tenant, body).await?;
    // Recording validates every field before it appends, so a bad field writes nothing.
    let (recorded, driven) = match place {
        None => (
            shared
                .engine
                .ledger()
                .record_personal_then(request, personal, |_| None)
                .await?,
            None,
        ),
        Some((place, wait)) => {
            let started = Instant::now();
            // The intent and the claim of its first attempt are one append, made durable before
            // anything is sent: the rule holds, and the call saves the caller a round trip and
            // the server a write. Spawned, so a caller who hangs up cannot cancel a send
            // half-way.
            let engine = Arc::clone(&shared.engine);
            let (recorded, claimed) = tokio::spawn(boxed(async move {
                engine.record_personal_and_claim(request, personal).await
            }))
            .await
            .map_err(|error| ApiError::internal("recording the intent failed", error))??;
            (
                recorded,
                Some((claimed, wait.saturating_sub(started.elapsed()), place)),
            )
        }
    };
    shared
        .tenants
        .remember(recorded.operation.operation_id, tenant.clone());
    let operation_id = recorded.operation.operation_id;
    info!(%operation_id, created = recorded.created, %tenant, "intent recorded");
    let (operation, execute_error) = match driven {
        Some((claimed, wait, place)) => {
            execute_recorded(shared, recorded.operation.clone(), claimed, wait, place).await
        }
        None => (recorded.operation, None),
    };
    Ok(Recorded {
        operation,
        created: recorded.created,
        execute_error,
    })
}

/// The personal data of a record call: its `subject`, or the one its action declares.
fn personal_of_body(
    shared: &Shared,
    tenant: &TenantId,
    body: &RecordBody,
) -> Result<Option<opledger_domain::personal::Personal>, ApiError> {
    let declared = match (
        opledger_domain::ids::ProviderId::new(body.provider.clone()),
        opledger_domain::ids::ActionName::new(body.action.clone()),
    ) {
        (Ok(provider), Ok(action)) => shared
            .engine
            .providers()
            .personal_fields(&provider, &action),
        // A bad name is refused, naming its field, when the intent is validated.
        _ => None,
    };
    let personal =
        crate::personal::personal_of(shared, tenant, body.subject.clone(), declared, &body.args);
    if let Some(personal) = &personal {
        personal.check()?;
    }
    Ok(personal)
}

/// `execute` and `wait_ms` of a record call: `wait_ms` is only taken with `execute=true`.
fn execute_and_wait(shared: &Shared, query: &RecordQuery) -> Result<(bool, Duration), ApiError> {
    let execute_now = match query.execute.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::invalid(ValidationError::new(
                "execute",
                format!("`{other}` must be true or false"),
            )))
        }
    };
    let wait = match (execute_now, query.wait_ms.as_deref()) {
        (false, Some(_)) => {
            return Err(ApiError::invalid(ValidationError::new(
                "wait_ms",
                "is only taken with execute=true",
            )))
        }
        (_, wait_ms) => wait_of(shared, wait_ms)?,
    };
    Ok((execute_now, wait))
}

/// The intent a record call asks for, bound to the credentials configured now; a redelivery
/// whose provider or account is no longer configured takes the fingerprint it was recorded
/// with (its binding is checked again at its next send), and only a new intent needs them.
async fn intent_request(
    shared: &Shared,
    tenant: &TenantId,
    body: RecordBody,
) -> Result<IntentRequest, ApiError> {
    let fingerprint = configured_fingerprint(shared, tenant, &body);
    let mut request = IntentRequest {
        tenant: tenant.to_string(),
        owner: body.owner,
        provider: body.provider,
        account: body.account,
        credential_fingerprint: fingerprint
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        action: body.action,
        args: body.args,
        source_id: body.source_id,
        requires_approval: body.requires_approval,
    };
    if let Err(not_configured) = fingerprint {
        // A redelivery answers the operation it recorded whatever the configuration says now
        // (the provider or account removed): its binding is checked again at its next send.
        // Only a new intent needs them configured.
        let found = shared
            .engine
            .ledger()
            .find_redelivery(&request)
            .await?
            .ok_or(not_configured)?;
        request.credential_fingerprint = found.intent().credential_fingerprint.to_string();
    }
    Ok(request)
}

/// Drives an operation recorded with the claim of its first attempt, until it settles or `wait`
/// ends. Whatever happens in the drive (even a panic) is answered as an execute error of an
/// operation that is recorded.
async fn execute_recorded(
    shared: &Shared,
    recorded: LoadedOperation,
    claimed: Option<AttemptId>,
    wait: Duration,
    place: OwnedSemaphorePermit,
) -> (LoadedOperation, Option<ApiError>) {
    let operation_id = recorded.operation_id;
    // Debug, so not exported: inside the request's span and around the claim and send, which
    // carry the operation id, it only cost every traced call one more span (docs/src/performance.md).
    let span = tracing::debug_span!("execute", %operation_id, wait_ms = wait.as_millis() as u64);
    // The first drive sends the attempt just claimed.
    let start = Start::Claimed(Box::new(recorded.clone()), claimed);
    match drive_until(shared, start, wait, place).in_span(span).await {
        Ok(operation) => (operation, None),
        // The intent is recorded, so the answer is its success with the operation as recorded
        // (the workers send it): an error here would invite a client to record it again, and
        // without a source id that is a second operation.
        Err(error) => {
            warn!(%operation_id, code = error.code, message = %error.message, "recorded, but executing it in the same call failed");
            (recorded, Some(error))
        }
    }
}

/// The fingerprint of the credentials configured now for the intent's account, or the 422
/// naming what this server does not have (the provider, the action, the account) or what the
/// tenant may not use (another tenant's account); then the arguments against the action's
/// input schema, every failing field named. Nothing is recorded when any of it fails.
fn configured_fingerprint(
    shared: &Shared,
    tenant: &TenantId,
    body: &RecordBody,
) -> Result<opledger_domain::ids::CredentialFingerprint, ApiError> {
    let provider = opledger_domain::ids::ProviderId::new(body.provider.clone())?;
    let account = opledger_domain::ids::AccountId::new(body.account.clone())?;
    let action = opledger_domain::ids::ActionName::new(body.action.clone())?;
    let providers = shared.engine.providers();
    let query = BindingQuery {
        tenant,
        provider: &provider,
        account: &account,
        action: &action,
    };
    let bound = providers.bind(&query).map_err(|unbound| {
        ApiError::invalid(ValidationError::new(unbound.field(), unbound.to_string()))
    })?;
    providers
        .check_args(&provider, &action, &body.args)
        .map_err(|problems| ApiError::invalid_args(&problems))?;
    Ok(bound.credential_fingerprint)
}

/// The wait of an execute call: `wait_ms` if given (checked against the limit), else the default.
pub(crate) fn wait_of(shared: &Shared, wait_ms: Option<&str>) -> Result<Duration, ApiError> {
    let wait_ms = match wait_ms {
        None => shared.limits.default_wait_ms,
        Some(text) => text
            .parse::<u64>()
            .ok()
            .filter(|wait| *wait <= shared.limits.max_wait_ms)
            .ok_or_else(|| {
                ApiError::invalid(ValidationError::new(
                    "wait_ms",
                    format!(
                        "`{text}` must be a whole number of milliseconds from 0 to {}",
                        shared.limits.max_wait_ms
                    ),
                ))
            })?,
    };
    Ok(Duration::from_millis(wait_ms))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ShowQuery {
    /// The operation as it stood at this global position or RFC 3339 time.
    as_of: Option<String>,
    /// With `as_of`: also the proof of the answer (`show` only): the checkpoint and the inclusion
    /// proof of each event folded.
    #[serde(default)]
    proof: bool,
}

pub(super) async fn show(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    query: Result<Query<ShowQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let scope = Scope::of(shared.tokens.authenticate(&headers)?);
    let operation_id = operation_id(&id)?;
    let Query(query) = query?;
    let Some(as_of) = query.as_of else {
        if query.proof {
            return Err(ApiError::invalid(ValidationError::new(
                "proof",
                "proves an answer as of a moment; give as_of too (a position or an RFC 3339 time)"
                    .to_owned(),
            )));
        }
        let loaded = visible(&shared, &scope, operation_id).await?;
        return Ok(view_reply(
            StatusCode::OK,
            &operation_view(&shared, &loaded),
        ));
    };
    let (view, position) = view_at(&shared, operation_id, &as_of).await?;
    // The tenant never changes, so the check on the moment's intent is the same as now's.
    view_visible(&scope, &view, operation_id)?;
    let mut body = serde_json::to_value(operation_view(&shared, &view.loaded))
        .map_err(|error| ApiError::internal("an operation could not be written as JSON", error))?;
    body["as_of_position"] = json!(position);
    if query.proof {
        body["proof"] =
            super::log::operation_proof(&shared, operation_id, view.loaded.version).await?;
    }
    Ok(json_reply(StatusCode::OK, &body))
}

/// An operation as it stood at the moment `as_of` names (checked against the log first), and
/// the log position the moment resolved to, which the answer names.
pub(super) async fn view_at(
    shared: &Shared,
    operation_id: OperationId,
    as_of: &str,
) -> Result<(crate::render::OperationView, u64), ApiError> {
    let store = shared.engine.ledger().store();
    let (as_of, position) = resolved_as_of(shared, as_of).await?;
    let view = view_as_of(store, operation_id, as_of)
        .await
        .map_err(ApiError::from)?;
    Ok((view, position))
}

/// `as_of` parsed, checked against the log (not past its head, not later than now) and the log
/// position it stands for (see [`crate::render::resolve_as_of`]), which the answer names.
pub(super) async fn resolved_as_of(shared: &Shared, as_of: &str) -> Result<(AsOf, u64), ApiError> {
    let as_of = AsOf::parse(as_of)
        .map_err(|problem| ApiError::invalid(ValidationError::new("as_of", problem)))?;
    let position = crate::render::resolve_as_of(shared.engine.ledger().store(), as_of, Utc::now())
        .await
        .map_err(ApiError::from)?;
    Ok((as_of, position))
}

/// A view read for the caller passes only if its tenant is in the caller's scope; anything else
/// is the same 404 as a missing operation, so another tenant's ids cannot be told apart.
fn view_visible(
    scope: &Scope,
    view: &crate::render::OperationView,
    operation_id: OperationId,
) -> Result<(), ApiError> {
    let tenant = view
        .loaded
        .state
        .intent
        .as_ref()
        .map(|intent| &intent.tenant);
    if tenant.is_some_and(|tenant| scope.allows(tenant)) {
        Ok(())
    } else {
        Err(ApiError::not_found(format!("operation {operation_id}")))
    }
}

pub(super) async fn history(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    query: Result<Query<ShowQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let scope = Scope::of(shared.tokens.authenticate(&headers)?);
    let operation_id = operation_id(&id)?;
    let Query(query) = query?;
    // Checked on the same read that is returned, so the answer cannot leak another tenant's.
    let (view, position) = match query.as_of.as_deref() {
        Some(as_of) => {
            let (view, position) = view_at(&shared, operation_id, as_of).await?;
            (view, Some(position))
        }
        None => (
            view_of(shared.engine.ledger().store(), operation_id)
                .await
                .map_err(ApiError::from)?,
            None,
        ),
    };
    view_visible(&scope, &view, operation_id)?;
    let mut body = json!({
        "operation_id": operation_id,
        "state": view.loaded.state.status.name(),
        "version": view.loaded.version,
        "events": view.events,
        "timeline": view.lines,
    });
    if let Some(position) = position {
        body["as_of_position"] = json!(position);
    }
    Ok(json_reply(StatusCode::OK, &body))
}

pub(super) async fn approve(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    request: Request,
) -> Result<Response, ApiError> {
    approval(&shared, &id, request, Approval::Grant).await
}

pub(super) async fn deny(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    request: Request,
) -> Result<Response, ApiError> {
    approval(&shared, &id, request, Approval::Deny).await
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Approval {
    Grant,
    Deny,
}

/// Approves or denies exactly the recorded snapshot (named by its hash), as the approver the
/// token stands for (see [`approver_for`]).
async fn approval(
    shared: &Shared,
    id: &str,
    request: Request,
    kind: Approval,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(request.headers())?;
    let scope = Scope::of(principal);
    let operation_id = operation_id(id)?;
    let body: ApprovalBody = body(shared, request).await?;
    let args_hash = ArgsHash::parse(&body.args_hash).map_err(|e| field("args_hash", e))?;
    let reason = match (kind, body.reason) {
        (Approval::Deny, Some(reason)) => Some(reason),
        (Approval::Deny, None) => {
            return Err(ApiError::invalid(ValidationError::new(
                "reason",
                "is required to deny: say why, in a sentence",
            )))
        }
        (Approval::Grant, Some(_)) => {
            return Err(ApiError::invalid(ValidationError::new(
                "reason",
                "is only taken when denying",
            )))
        }
        (Approval::Grant, None) => None,
    };
    let tenant = check_visible(shared, &scope, operation_id).await?;
    let name = approver_for(principal, &tenant, &shared.approval_guard, body.approver)?;
    let approver = ActorId::new(name).map_err(|e| field("approver", e))?;
    let decided_by = Some(principal_of(principal));
    let ledger = shared.engine.ledger();
    let loaded = match reason {
        Some(reason) => {
            ledger
                .deny_as(operation_id, approver, decided_by, args_hash, reason)
                .await?
        }
        None => {
            ledger
                .approve_as(operation_id, approver, decided_by, args_hash)
                .await?
        }
    };
    Ok(view_reply(StatusCode::OK, &operation_view(shared, &loaded)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExecuteQuery {
    wait_ms: Option<String>,
}

pub(super) async fn execute(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    query: Result<Query<ExecuteQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(&headers)?;
    let scope = Scope::of(principal);
    tenant_of(principal)?;
    let operation_id = operation_id(&id)?;
    let Query(query) = query?;
    let wait = wait_of(&shared, query.wait_ms.as_deref())?;
    check_visible(&shared, &scope, operation_id).await?;
    let place = execute_place(&shared)?;
    // Debug like the one-call path's: the request's own span carries the operation id and the
    // link to the intent's trace (the drive continues from it), so an exported `execute` inside
    // it would only cost every call one more span (docs/src/performance.md).
    tracing::Span::current().record("operation_id", tracing::field::display(operation_id));
    let span = tracing::debug_span!("execute", %operation_id, wait_ms = wait.as_millis() as u64);
    let loaded = drive_until(&shared, Start::Read(operation_id), wait, place)
        .in_span(span)
        .await?;
    Ok(view_reply(
        StatusCode::OK,
        &operation_view(&shared, &loaded),
    ))
}

/// A place for one execute call, taken before anything is written, so a full server refuses
/// with nothing recorded (the request can be repeated as it is).
pub(crate) fn execute_place(shared: &Shared) -> Result<OwnedSemaphorePermit, ApiError> {
    Arc::clone(&shared.executes)
        .try_acquire_owned()
        .map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_executes",
                format!(
                    "{} execute calls are in progress, the configured limit; try again shortly",
                    shared.limits.max_concurrent_executes
                ),
            )
        })
}

/// Where a drive starts: from the operation's stream, or from the state this request just wrote
/// (with the attempt it claimed in the same append, if it did).
enum Start {
    Read(OperationId),
    Claimed(Box<LoadedOperation>, Option<AttemptId>),
}

/// Drives the operation until it settles, needs a person, or the wait runs out — whichever comes
/// first. `wait` is an upper bound: at the deadline the answer is where the operation stands then
/// (in flight while a send hangs), and the drive goes on in its own task, so an outcome the
/// provider gives later is still recorded (by this drive, or by the lease and the reconciler).
async fn drive_until(
    shared: &Shared,
    start: Start,
    wait: Duration,
    place: OwnedSemaphorePermit,
) -> Result<LoadedOperation, ApiError> {
    let deadline = tokio::time::Instant::now() + wait;
    // Shared with every drive this call starts, so the place is given back only when the call has
    // answered *and* its drives have ended: sends in progress stay bounded by the execute limit
    // even when their callers stopped waiting.
    let place = Arc::new(place);
    let mut in_flight_pause = IN_FLIGHT_POLL_MIN;
    let (operation_id, mut held) = match start {
        Start::Read(operation_id) => (operation_id, None),
        Start::Claimed(loaded, claimed) => (loaded.operation_id, Some((*loaded, claimed))),
    };
    let mut shutdown = shared.shutdown.clone();
    loop {
        // Spawned, so neither the deadline nor a caller who hangs up can cancel a send half-way:
        // the drive always records what the provider answered.
        let engine = Arc::clone(&shared.engine);
        let first = held.take();
        let drive_place = Arc::clone(&place);
        let drive = tokio::spawn(boxed(async move {
            let _place = drive_place;
            match first {
                Some((loaded, claimed)) => engine.drive_recorded(loaded, claimed).await,
                None => engine.drive(operation_id).await,
            }
        }));
        let ended = tokio::select! {
            // A drive that has ended wins over a deadline that passed at the same moment.
            biased;
            joined = drive => Some(joined),
            // The wait is over (or the server is going down) with the drive still running.
            () = tokio::time::sleep_until(deadline) => None,
            _ = shutdown.wait_for(|stopping| *stopping) => None,
        };
        let Some(joined) = ended else {
            // Answered with the state as recorded now; the drive records its outcome when it
            // comes.
            return still_driving(shared, operation_id).await;
        };
        let report = joined.map_err(|error| ApiError::internal("a drive failed", error))??;
        let state = report.state();
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(report.operation);
        }
        let pause = match (&state.status, state.next_work()) {
            // Another worker is sending it: look for its outcome soon.
            (Status::InFlight, _) => {
                let pause = in_flight_pause;
                in_flight_pause = (in_flight_pause * 2).min(IN_FLIGHT_POLL_MAX);
                pause
            }
            (Status::Pending | Status::Unknown, Some((due_at, _))) => (due_at - Utc::now())
                .to_std()
                .unwrap_or(Duration::ZERO)
                .max(Duration::from_millis(1)),
            // Settled, awaiting approval, or with a person: nothing more will happen by waiting.
            _ => return Ok(report.operation),
        };
        let remaining = deadline - now;
        if pause >= remaining {
            return Ok(report.operation);
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            // A server going down answers with where the operation stands now.
            _ = shutdown.wait_for(|stopping| *stopping) => return Ok(report.operation),
        }
    }
}

/// Where an operation stands while a drive of it is still running: read from its stream, so the
/// answer shows what is recorded (the claim of the attempt in flight, at least).
async fn still_driving(
    shared: &Shared,
    operation_id: OperationId,
) -> Result<LoadedOperation, ApiError> {
    Ok(shared.engine.ledger().get(operation_id).await?)
}

/// `future` on the heap, for `tokio::spawn`. An engine future is several kilobytes (every await
/// of a drive down to the store's and the provider's is inlined into it), and tokio moves a
/// spawned future into its task cell and its output back out by value: callgrind counted ~100 KB
/// of `memcpy` per operation for the two spawns of a record-and-execute call. A box moves as a
/// pointer. The task carries the request's span, so the work it does is in the caller's trace
/// (an [`InSpan`](opledger_domain::in_span::InSpan): the finished drive is dropped inside its
/// last poll, not by entering the span once more).
pub(crate) fn boxed<F: std::future::Future>(
    future: F,
) -> std::pin::Pin<Box<opledger_domain::in_span::InSpan<F>>> {
    Box::pin(future.in_span(tracing::Span::current()))
}
