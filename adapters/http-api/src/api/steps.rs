//! Steps the caller's own code carries out (a developer's function guarded by the clients'
//! `ledger.step`): record the step's intent, claim an attempt with a lease, report what the
//! function did. The ledger never runs the function; it records every transition through the
//! domain's decider, sweeps a lapsed claim to `unknown` and hands it to a person.
//!
//! A step needs no configuration: its provider and action are names of the caller's own code,
//! bound to the tenant's own fixed account [`STEP_ACCOUNT`]. It must never name a configured
//! connector (a caller's report would otherwise pass for a connector's confirmed answer), and a
//! report is only taken for a step.

// The handlers share the parent module's imports, extractors and helpers.
use super::*;

use opledger_domain::command::{Command, DEFAULT_LEASE_MS, MAX_LEASE_MS, MIN_LEASE_MS};
use opledger_domain::decider::Rejection;
use opledger_domain::ids::WorkerId;

/// The account every step is bound to: a step's function runs with the caller's own
/// credentials, which the ledger never sees.
pub(crate) const STEP_ACCOUNT: &str = "caller";
/// The credential fingerprint every step is recorded with, for the same reason (no real
/// fingerprint has this form: they start with the hash's name).
const STEP_FINGERPRINT: &str = "caller-held";
/// The code a failure with nothing applied is recorded under when the caller names none.
const DEFAULT_FAILURE_CODE: &str = "step_failed";

/// The body of `POST /v1/steps`: what the caller's function is about to do.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepBody {
    provider: String,
    action: String,
    args: Value,
    source_id: Option<String>,
    owner: Option<String>,
}

/// The body of `POST /v1/operations/{id}/claim`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimBody {
    /// How long the claim holds without an outcome, in milliseconds.
    lease_ms: Option<u64>,
    /// The caller's name for its process, recorded with the attempt.
    caller: Option<String>,
    /// The attempt's id, chosen by the caller (a UUID), so a claim whose answer was lost can be
    /// sent again and answered as the same claim; a fresh one when absent.
    attempt_id: Option<String>,
}

/// The body of `POST /v1/operations/{id}/attempts/{attempt_id}/outcome`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OutcomeBody {
    /// `succeeded` or `failed`.
    outcome: String,
    /// With `succeeded`: what the function made (an invoice id, a message id).
    external_id: Option<String>,
    /// With `failed`: whether anything took effect, `no` or `unknown`.
    applied: Option<String>,
    /// With `failed`: a short code for the failure.
    code: Option<String>,
    /// With `failed`: what happened.
    message: Option<String>,
}

/// `POST /v1/steps`: records a step's intent, under the same rules as any intent (a source id or
/// `Idempotency-Key` finds the operation it recorded; reused for another request, refused).
pub(super) async fn record(
    State(shared): State<Arc<Shared>>,
    request: Request,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(request.headers())?;
    let tenant = tenant_of(principal)?.clone();
    let key = super::operations::idempotency_key(request.headers())?;
    let body: StepBody = body(&shared, request).await?;
    let source_id = super::operations::source_of(key.as_deref(), body.source_id)?;
    let provider = ProviderId::new(body.provider.clone())?;
    if shared.engine.providers().ids().any(|id| *id == provider) {
        return Err(ApiError::invalid(ValidationError::new(
            "provider",
            format!("`{provider}` is a connector configured on this server, which the ledger sends itself; a step names a provider of your own code (e.g. `billing`): record a connector's operation with POST /v1/operations"),
        )));
    }
    let request = IntentRequest {
        tenant: tenant.to_string(),
        owner: body.owner,
        provider: body.provider,
        account: STEP_ACCOUNT.to_owned(),
        credential_fingerprint: STEP_FINGERPRINT.to_owned(),
        action: body.action,
        args: body.args,
        source_id,
        requires_approval: false,
    };
    let recorded = shared
        .engine
        .ledger()
        .record_step(request)
        .await
        .map_err(ApiError::from)
        .map_err(|error| match key {
            Some(_) => error.for_idempotency_key(),
            None => error,
        })?;
    shared
        .tenants
        .remember(recorded.operation.operation_id, tenant.clone());
    info!(operation_id = %recorded.operation.operation_id, created = recorded.created, %tenant, "step recorded");
    let status = if recorded.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut view = operation_view(&shared, &recorded.operation);
    view.created = Some(recorded.created);
    Ok(view_reply(status, &view))
}

/// `POST /v1/operations/{id}/claim`: the caller claims the step's next attempt. Only the holder
/// of a live claim may run the function; a second claimer is told who holds it until when, or
/// what state the step is in.
pub(super) async fn claim(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    request: Request,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(request.headers())?;
    let scope = Scope::of(principal);
    tenant_of(principal)?;
    let operation_id = operation_id(&id)?;
    let body: ClaimBody = body(&shared, request).await?;
    let lease_ms = body.lease_ms.unwrap_or(DEFAULT_LEASE_MS);
    if !(MIN_LEASE_MS..=MAX_LEASE_MS).contains(&lease_ms) {
        return Err(ApiError::invalid(ValidationError::new(
            "lease_ms",
            format!("is {lease_ms}; it must be {MIN_LEASE_MS} to {MAX_LEASE_MS} milliseconds: longer than the function runs, short enough that a crash reaches a person soon"),
        )));
    }
    let caller = WorkerId::new(format!(
        "caller:{}",
        body.caller.as_deref().unwrap_or("unnamed")
    ))
    .map_err(|error| field("caller", error))?;
    let attempt_id = body
        .attempt_id
        .map(|text| {
            text.parse::<AttemptId>().map_err(|error| {
                ApiError::invalid(ValidationError::new("attempt_id", error.message))
            })
        })
        .transpose()?;
    visible(&shared, &scope, operation_id).await?;
    let claimed = match shared
        .engine
        .claim_step(operation_id, attempt_id, caller, lease_ms)
        .await
    {
        Ok(claimed) => claimed,
        Err(AppError::Rejected {
            rejection: Rejection::NotAllowed { .. },
            ..
        }) => return Err(not_claimable(&shared, operation_id).await),
        Err(error) => return Err(error.into()),
    };
    let state = &claimed.state;
    let (Some(attempt), Some(intent)) = (state.current_attempt.as_ref(), state.intent.as_ref())
    else {
        return Err(ApiError::internal(
            "a claimed step shows no attempt",
            format!("operation {operation_id} is {}", state.status.name()),
        ));
    };
    info!(%operation_id, attempt_id = %attempt.attempt_id, "step claimed");
    let body = json!({
        "attempt_id": attempt.attempt_id,
        "attempt_number": attempt.number,
        "idempotency_key": intent.idempotency_key,
        "lease_deadline": attempt.lease_deadline,
        "operation": operation_view(&shared, &claimed),
    });
    Ok(json_reply(StatusCode::OK, &body))
}

/// Why a step cannot be claimed now, read from where it stands: a live claim names its holder
/// and its end; anything else names the state, whose sentence says what to do.
async fn not_claimable(shared: &Shared, operation_id: OperationId) -> ApiError {
    let loaded = match shared.engine.ledger().get(operation_id).await {
        Ok(loaded) => loaded,
        Err(error) => return error.into(),
    };
    let state = &loaded.state;
    match (&state.status, state.current_attempt.as_ref()) {
        (Status::InFlight, Some(attempt)) => ApiError::new(
            StatusCode::CONFLICT,
            "claimed",
            format!(
                "step {operation_id} is in_flight: attempt {} is claimed by {} until {}; do not run the function now: wait for its outcome, or for the claim to run out (then the step is unknown and a person decides)",
                attempt.attempt_id,
                attempt.worker,
                attempt.lease_deadline.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            ),
        ),
        (status, _) => ApiError::new(
            StatusCode::CONFLICT,
            "refused",
            format!(
                "step {operation_id} is {}, so there is nothing to claim: {}",
                status.name(),
                operation_view(shared, &loaded).message
            ),
        ),
    }
}

/// `POST /v1/operations/{id}/attempts/{attempt_id}/outcome`: what the caller's function did.
/// A report for the live attempt settles it; a report after the claim ran out is a late answer
/// (a success settles the unknown step; a different result after a success is a duplicate).
pub(super) async fn outcome(
    State(shared): State<Arc<Shared>>,
    AttemptPath(id, attempt): AttemptPath,
    request: Request,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(request.headers())?;
    let scope = Scope::of(principal);
    tenant_of(principal)?;
    let operation_id = operation_id(&id)?;
    let attempt_id = attempt
        .parse::<AttemptId>()
        .map_err(|error| ApiError::invalid(ValidationError::new("attempt_id", error.message)))?;
    let body: OutcomeBody = body(&shared, request).await?;
    let command = outcome_command(attempt_id, body)?;
    visible(&shared, &scope, operation_id).await?;
    let engine = Arc::clone(&shared.engine);
    // Spawned, so a caller who hangs up cannot cancel the record half-way.
    let report = tokio::spawn(super::operations::boxed(async move {
        engine.report_step(operation_id, &command).await
    }))
    .await
    .map_err(|error| ApiError::internal("recording a step's outcome failed", error))??;
    info!(%operation_id, %attempt_id, state = report.state().status.name(), "step outcome recorded");
    Ok(view_reply(
        StatusCode::OK,
        &operation_view(&shared, &report.operation),
    ))
}

/// The command a report asks for, every field checked first.
fn outcome_command(attempt_id: AttemptId, body: OutcomeBody) -> Result<Command, ApiError> {
    let only_with_failed = |name: &'static str| {
        ApiError::invalid(ValidationError::new(
            name,
            "is only taken with outcome `failed`",
        ))
    };
    match body.outcome.as_str() {
        "succeeded" => {
            for (name, given) in [
                ("applied", body.applied.is_some()),
                ("code", body.code.is_some()),
                ("message", body.message.is_some()),
            ] {
                if given {
                    return Err(only_with_failed(name));
                }
            }
            let external_id = body.external_id.ok_or_else(|| {
                ApiError::invalid(ValidationError::new(
                    "external_id",
                    "is required with outcome `succeeded`: what the function made (an invoice id, a message id), so `done` names something checkable",
                ))
            })?;
            Ok(Command::RecordSuccess {
                attempt_id,
                external_id: ExternalObjectId::new(external_id)
                    .map_err(|error| field("external_id", error))?,
                provider_request_id: None,
            })
        }
        "failed" => {
            if body.external_id.is_some() {
                return Err(ApiError::invalid(ValidationError::new(
                    "external_id",
                    "is only taken with outcome `succeeded`",
                )));
            }
            let message = body
                .message
                .unwrap_or_else(|| "the caller's function failed".to_owned());
            match body.applied.as_deref() {
                Some("no") => Ok(Command::RecordRejection {
                    attempt_id,
                    code: body.code.unwrap_or_else(|| DEFAULT_FAILURE_CODE.to_owned()),
                    message,
                }),
                Some("unknown") => Ok(Command::RecordUnknown {
                    attempt_id,
                    error: match body.code {
                        Some(code) => format!("the caller reported {code}: {message}"),
                        None => format!("the caller reported: {message}"),
                    },
                    check_not_before: None,
                }),
                Some(other) => Err(ApiError::invalid(ValidationError::new(
                    "applied",
                    format!("`{other}` is not an answer; use `no` (nothing took effect) or `unknown` (it may have)"),
                ))),
                None => Err(ApiError::invalid(ValidationError::new(
                    "applied",
                    "is required with outcome `failed`: `no` when nothing took effect, `unknown` when it may have (a timeout, a lost answer)",
                ))),
            }
        }
        other => Err(ApiError::invalid(ValidationError::new(
            "outcome",
            format!("`{other}` is not an outcome; use `succeeded` or `failed`"),
        ))),
    }
}

/// The `{id}` and `{attempt_id}` of the outcome route, with a JSON error when the path cannot be
/// decoded.
pub(super) struct AttemptPath(String, String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for AttemptPath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match Path::<(String, String)>::from_request_parts(parts, state).await {
            Ok(Path((id, attempt))) => Ok(Self(id, attempt)),
            Err(rejection) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_path",
                format!("the path is not understood: {}", rejection.body_text()),
            )),
        }
    }
}
