//! Claiming a review item before working it, and letting go of it (see `claims.rs` for where
//! claims live and why they are rows beside the log, not events in it).

// The handlers share the parent module's imports, extractors and helpers.
use super::*;

use crate::claims::{Claim, ClaimRefused, DEFAULT_CLAIM_LEASE_S, MAX_CLAIM_LEASE_S};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimBody {
    /// How long the claim lasts, in seconds.
    lease_s: Option<u64>,
}

/// A claim as the API shows it.
pub(super) fn claim_json(claim: &Claim) -> Value {
    json!({"holder": claim.holder, "expires_at": claim.expires_at})
}

/// The refusal of a decision or claim on an item someone else holds, naming them.
pub(super) fn held_error(operation_id: OperationId, claim: &Claim) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "claimed",
        format!(
            "operation {operation_id} is claimed by {} until {}: they are working it; ask them, or wait for the claim to end",
            claim.holder,
            claim.expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
    )
}

/// `POST /v1/review/{id}/claim`: claims (or renews) an item of the review queue for the caller.
pub(super) async fn claim(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    request: Request,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(request.headers())?;
    let (name, scope) = operator_of(principal)?;
    let name = name.to_owned();
    let operation_id = operation_id(&id)?;
    let body: ClaimBody = body(&shared, request).await?;
    let lease_s = body.lease_s.unwrap_or(DEFAULT_CLAIM_LEASE_S);
    if !(1..=MAX_CLAIM_LEASE_S).contains(&lease_s) {
        return Err(ApiError::invalid(ValidationError::new(
            "lease_s",
            format!("must be 1 to {MAX_CLAIM_LEASE_S} seconds; claim again to keep it longer"),
        )));
    }
    let loaded = visible(&shared, &scope, operation_id).await?;
    let state = loaded.state.status.name();
    if state != "unknown" && state != "needs_review" {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_waiting",
            format!("operation {operation_id} is {state}, not waiting for a decision: there is nothing to claim"),
        ));
    }
    match shared
        .claims
        .claim(operation_id, &name, lease_s, Utc::now())
        .await
    {
        Ok(claim) => Ok(json_reply(
            StatusCode::OK,
            &json!({"operation_id": operation_id, "claim": claim_json(&claim)}),
        )),
        Err(ClaimRefused::Held(claim)) => Err(held_error(operation_id, &claim)),
        Err(ClaimRefused::Full) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_claims",
            "as many claims run as the ledger keeps; try again once some have ended",
        )),
        Err(ClaimRefused::Store(error)) => Err(error.into()),
    }
}

/// `POST /v1/review/{id}/release`: ends the caller's claim (someone else's is refused).
pub(super) async fn release(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(&headers)?;
    let (name, scope) = operator_of(principal)?;
    let operation_id = operation_id(&id)?;
    visible(&shared, &scope, operation_id).await?;
    shared
        .claims
        .release(operation_id, name, Utc::now())
        .await?
        .map_err(|claim| held_error(operation_id, &claim))?;
    Ok(json_reply(
        StatusCode::OK,
        &json!({"operation_id": operation_id, "claim": null}),
    ))
}
