//! Bearer tokens: who is calling, and which operations they may see.
//!
//! Tokens are kept as SHA-256 digests, so a lookup's timing says nothing about how much of a
//! guessed token was right, and a memory dump holds no usable token. A tenant sees only its own
//! operations; anything else answers 404 exactly as a missing operation does, so a caller cannot
//! learn that another tenant's operation exists. Review is a separate scope held by operators.

use std::collections::{BTreeMap, BTreeSet};

use axum::http::{header, HeaderMap, StatusCode};
use opledger_domain::ids::TenantId;
use sha2::{Digest, Sha256};

use super::config::Principal;
use super::error::ApiError;

/// The longest `Authorization` header read, in bytes.
const MAX_AUTHORIZATION_BYTES: usize = 1024;

/// Every token the server accepts, by digest.
#[derive(Debug)]
pub struct Tokens {
    by_digest: BTreeMap<[u8; 32], Principal>,
}

impl Tokens {
    /// Keeps the digests of `tokens`.
    pub fn new(tokens: BTreeMap<String, Principal>) -> Self {
        Self {
            by_digest: tokens
                .into_iter()
                .map(|(token, principal)| (digest(&token), principal))
                .collect(),
        }
    }

    /// The tenants that have a token.
    pub fn tenants(&self) -> BTreeSet<&str> {
        self.by_digest
            .values()
            .filter_map(|principal| match principal {
                Principal::Tenant(tenant) => Some(tenant.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Who the request's bearer token belongs to.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<&Principal, ApiError> {
        let token = bearer(headers)?;
        self.by_digest.get(&digest(token)).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "the token is not known to this server; use a token configured under [[tenants]], [[operators]] or [[approvers]]",
            )
        })
    }
}

/// Checks the request carries the token whose digest is `expected` (`/metrics`).
pub fn require_token(headers: &HeaderMap, expected: &[u8; 32]) -> Result<(), ApiError> {
    if digest(bearer(headers)?) == *expected {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this is not the metrics token configured under [metrics]",
        ))
    }
}

/// The bearer token of a request. The scheme is matched in any case (RFC 9110 §11.1: `bearer`
/// is `Bearer`); two `Authorization` headers are refused with 400, since which one a proxy in
/// front and this server each read could differ.
fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let unauthorized =
        |message: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message.to_owned());
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next().ok_or_else(|| {
        unauthorized("no Authorization header; send `Authorization: Bearer <your token>`")
    })?;
    if values.next().is_some() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "duplicate_authorization",
            "the request carries more than one Authorization header; send exactly one, `Authorization: Bearer <your token>`",
        ));
    }
    if value.len() > MAX_AUTHORIZATION_BYTES {
        return Err(unauthorized("the Authorization header is too long"));
    }
    let token = value
        .to_str()
        .ok()
        .and_then(|text| {
            let (scheme, token) = text.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        })
        .map(str::trim)
        .filter(|token| !token.is_empty())
        .ok_or_else(|| unauthorized("the Authorization header must be `Bearer <token>`"))?;
    Ok(token)
}

/// A token's SHA-256 digest, the form tokens are kept and compared in.
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The token behind a request as the ledger records it on a decision: its kind and configured
/// name, beside whatever name the caller wrote.
pub fn principal_of(principal: &Principal) -> opledger_domain::event::Principal {
    use opledger_domain::event::{Principal as Decided, PrincipalKind};
    match principal {
        Principal::Tenant(tenant) => Decided {
            kind: PrincipalKind::TenantToken,
            name: tenant.to_string(),
        },
        Principal::Approver { name, .. } => Decided {
            kind: PrincipalKind::Approver,
            name: name.clone(),
        },
        Principal::Operator { name, .. } => Decided {
            kind: PrincipalKind::Operator,
            name: name.clone(),
        },
    }
}

/// Which tenants' operations a caller may see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every tenant's (an operator with no tenant list).
    All,
    /// These tenants' only.
    Tenants(BTreeSet<TenantId>),
}

impl Scope {
    /// The scope of `principal`.
    pub fn of(principal: &Principal) -> Self {
        match principal {
            Principal::Tenant(tenant) => Self::Tenants(BTreeSet::from([tenant.clone()])),
            Principal::Operator { tenants: None, .. }
            | Principal::Approver { tenants: None, .. } => Self::All,
            Principal::Operator {
                tenants: Some(tenants),
                ..
            }
            | Principal::Approver {
                tenants: Some(tenants),
                ..
            } => Self::Tenants(tenants.clone()),
        }
    }

    /// Whether an operation of `tenant` is visible.
    pub fn allows(&self, tenant: &TenantId) -> bool {
        match self {
            Self::All => true,
            Self::Tenants(tenants) => tenants.contains(tenant),
        }
    }
}

/// The caller must be a tenant (recording and acting on operations is the tenant's business);
/// returns the tenant.
pub fn tenant_of(principal: &Principal) -> Result<&TenantId, ApiError> {
    match principal {
        Principal::Tenant(tenant) => Ok(tenant),
        Principal::Operator { .. } | Principal::Approver { .. } => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "an operator or approver token cannot record or execute operations; use the tenant's token",
        )),
    }
}

/// The caller must be an operator (the review queue and its decisions); returns the operator's
/// name and scope.
pub fn operator_of(principal: &Principal) -> Result<(&str, Scope), ApiError> {
    match principal {
        Principal::Operator { name, .. } => Ok((name, Scope::of(principal))),
        Principal::Tenant(_) | Principal::Approver { .. } => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "the review queue needs an operator token (configured under [[operators]])",
        )),
    }
}

/// The caller must be an operator to use `route` (the webhooks' administration): returns the
/// operator's name and scope, or a 403 naming the route asked for.
pub fn operator_for_route<'p>(
    principal: &'p Principal,
    route: &str,
) -> Result<(&'p str, Scope), ApiError> {
    match principal {
        Principal::Operator { name, .. } => Ok((name, Scope::of(principal))),
        Principal::Tenant(_) | Principal::Approver { .. } => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("{route} needs an operator token (configured under [[operators]])"),
        )),
    }
}

/// The tenants whose approvals only an approver may give: every tenant some approver covers.
pub fn guarded_by_approvers(tokens: &Tokens) -> Scope {
    let mut guarded = BTreeSet::new();
    for principal in tokens.by_digest.values() {
        match principal {
            Principal::Approver { tenants: None, .. } => return Scope::All,
            Principal::Approver {
                tenants: Some(tenants),
                ..
            } => guarded.extend(tenants.iter().cloned()),
            _ => {}
        }
    }
    Scope::Tenants(guarded)
}

/// Who may approve or deny an operation of `tenant`, and under which name: an approver in
/// scope (recorded under their configured name), or — only while no approver covers the
/// tenant — the tenant's own token, naming the person in `approver`.
pub fn approver_for(
    principal: &Principal,
    tenant: &TenantId,
    guarded: &Scope,
    named: Option<String>,
) -> Result<String, ApiError> {
    match principal {
        Principal::Approver { name, .. } => Ok(name.clone()),
        Principal::Tenant(_) if guarded.allows(tenant) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this tenant's approvals need an approver token (configured under [[approvers]]); the tenant's own token cannot approve",
        )),
        Principal::Tenant(_) => named.ok_or_else(|| {
            ApiError::invalid(opledger_domain::error::ValidationError::new(
                "approver",
                "is required: the person who approves or denies",
            ))
        }),
        Principal::Operator { .. } => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "an operator token cannot approve; use an approver token (or the tenant's, while the tenant has no approver)",
        )),
    }
}
