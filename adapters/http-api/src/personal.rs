//! Personal data in the service: the key store opened at start, the data subject of a record
//! call, the operator's erasure routes, and the one place every JSON answer passes through on its
//! way out, where sealed values are opened (or shown as `[erased]`).
//!
//! Nothing here holds a value in clear for longer than one answer: the log, the read models and
//! the journals keep tokens, and only an answer being written is opened.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use opledger_domain::event::{Principal as EventPrincipal, PrincipalKind};
use opledger_domain::ids::TenantId;
use opledger_domain::personal::{self, Personal, PersonalData, PersonalFields, SEALED_PREFIX};
use opledger_subjects::{key_store_path, Subjects};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::operator_for_route;
use crate::config::personal::{PersonalFieldsMode, TenantPrivacy};
use crate::config::{ServeConfig, StoreUrl};
use crate::error::{json_reply, ApiError};
use crate::{ServeError, Shared};

/// The key store, when configured, and each tenant's privacy settings.
pub(crate) type KeyStore = (Option<Arc<Subjects>>, BTreeMap<TenantId, TenantPrivacy>);

/// The key store `config` names, opened with its key-encryption key (a wrong key stops the
/// start with what to do), and each tenant's privacy settings. A PostgreSQL ledger keeps its
/// keys in its own database (`opledger.subject_keys`), shared by every instance on it; a SQLite
/// ledger in a file beside it.
pub(crate) fn open_key_store(
    config: &ServeConfig,
    store: &crate::ServeStore,
) -> Result<KeyStore, ServeError> {
    let Some(settings) = &config.personal_data else {
        return Ok((None, BTreeMap::new()));
    };
    if let crate::ServeStore::Postgres(postgres) = store {
        if let Some(path) = &settings.key_store {
            return Err(ServeError::Config(format!(
                "personal_data.key_store = {}: a PostgreSQL ledger keeps its subjects' keys in its own database (table opledger.subject_keys), shared by every instance on it; remove key_store",
                path.display()
            )));
        }
        let open = |postgres: &opledger_store::PostgresStore| {
            Ok::<_, String>(Box::new(postgres.key_table().map_err(|e| e.to_string())?)
                as Box<dyn opledger_subjects::table::KeyTable>)
        };
        let (writer, reader) = open(postgres)
            .and_then(|writer| Ok((writer, open(postgres)?)))
            .map_err(ServeError::Config)?;
        let subjects = Subjects::with_tables(writer, Some(reader), settings.kek.clone())
            .map_err(|error| ServeError::Config(error.to_string()))?;
        tracing::info!(key_store = "opledger.subject_keys", kek_id = %settings.kek.id(), "personal data: key store open");
        return Ok((Some(Arc::new(subjects)), settings.tenants.clone()));
    }
    let path = match (&settings.key_store, &config.store) {
        (Some(path), _) => path.clone(),
        (None, StoreUrl::Sqlite(ledger)) => key_store_path(ledger),
        (None, _) => {
            return Err(ServeError::Config(
                "personal_data.key_store: name the key store's file (a SQLite file on durable storage, backed up apart from the ledger) when the ledger is not a SQLite file".into(),
            ))
        }
    };
    let subjects = Subjects::open(Some(&path), settings.kek.clone())
        .map_err(|error| ServeError::Config(error.to_string()))?;
    tracing::info!(key_store = %path.display(), kek_id = %settings.kek.id(), "personal data: key store open");
    Ok((Some(Arc::new(subjects)), settings.tenants.clone()))
}

/// The personal data of a record call by `tenant`: the subject it names (`subject` in the body,
/// or the value at the action's declared `subject` pointer), and which values the tenant seals.
/// No subject: `None`, and nothing is sealed.
pub(crate) fn personal_of(
    shared: &Shared,
    tenant: &TenantId,
    subject: Option<String>,
    declared: Option<(Option<String>, Vec<String>)>,
    args: &Value,
) -> Option<Personal> {
    let (subject_pointer, personal_pointers) = declared.unwrap_or_default();
    let subject = subject.or_else(|| {
        let pointer = subject_pointer?;
        match args.pointer(&pointer)? {
            Value::String(text) => Some(text.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        }
    })?;
    let mode = shared
        .privacy
        .get(tenant)
        .map(|privacy| privacy.fields)
        .unwrap_or_default();
    let fields = match mode {
        // With nothing declared, every value is sealed: a connector that forgot to declare its
        // personal fields must not let them through in clear.
        PersonalFieldsMode::Declared if !personal_pointers.is_empty() => {
            PersonalFields::Declared(personal_pointers)
        }
        _ => PersonalFields::All,
    };
    Some(Personal { subject, fields })
}

/// Opens the sealed values in a JSON answer on its way out: each shows its value while its
/// subject's key lives, `[erased]` after. Answers without a token (nearly all) pass untouched.
pub(crate) async fn open_sealed_answers(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(request).await;
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"));
    if !json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return ApiError::internal(
            "an answer could not be read back to open its personal values",
            "",
        )
        .into_response();
    };
    if !contains(&bytes, SEALED_PREFIX.as_bytes()) {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    }
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return ApiError::internal("an answer with personal values is not UTF-8 JSON", "")
            .into_response();
    };
    let Some(opened) = personal::open_in_json(port(&shared), text) else {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(opened))
}

/// The port to open values with, when personal data is configured.
pub(crate) fn port(shared: &Shared) -> Option<&dyn PersonalData> {
    shared
        .subjects
        .as_deref()
        .map(|subjects| subjects as &dyn PersonalData)
}

/// Whether `haystack` holds `needle` (the token prefix, in every JSON answer that leaves).
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EraseBody {
    /// Why, in the operator's words: a request's reference, never the person's data.
    reason: String,
    /// Only this tenant's subject of that name (default: every tenant's).
    tenant: Option<String>,
}

/// `POST /v1/subjects/{subject}/erase` (operator token): destroys the subject's key, records a
/// `SubjectErased` event per tenant, and sends the subject's open operations to a person.
pub(crate) async fn erase(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path(subject): axum::extract::Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let (name, scope) = operator_for_route(
        shared.tokens.authenticate(request.headers())?,
        "POST /v1/subjects/{subject}/erase",
    )?;
    let name = name.to_owned();
    let subjects = configured(&shared)?;
    let body: EraseBody = crate::api::body_of::<EraseBody>(&shared, request).await?;
    personal::check_subject(&subject)?;
    if body.reason.trim().is_empty() {
        return Err(ApiError::invalid(
            opledger_domain::error::ValidationError::new(
                "reason",
                "is empty; say why (the request's reference, e.g. \"GDPR art. 17 request #4711\"), without the person's data",
            ),
        ));
    }
    let tenant = body.tenant.map(TenantId::new).transpose()?;
    if let Some(tenant) = &tenant {
        if !scope.allows(tenant) {
            return Err(ApiError::not_found(format!(
                "data subject in tenant `{tenant}`"
            )));
        }
    }
    let by = EventPrincipal {
        kind: PrincipalKind::Operator,
        name,
    };
    let erasures = erase_subject(
        &shared,
        subjects,
        &subject,
        tenant.as_ref(),
        &scope,
        by,
        &body.reason,
    )
    .await?;
    Ok(json_reply(StatusCode::OK, &json!({ "erased": erasures })))
}

/// Erases `subject` (in `tenant`, or every tenant `scope` allows): for each of its keys, the
/// `SubjectErased` event is appended first (so the log says so even if the process dies next),
/// then the key destroyed, then its open operations sent to a person. Run again, it completes
/// what a crash left undone and records nothing twice.
pub(crate) async fn erase_subject(
    shared: &Shared,
    subjects: &Subjects,
    subject: &str,
    tenant: Option<&TenantId>,
    scope: &crate::auth::Scope,
    by: EventPrincipal,
    reason: &str,
) -> Result<Vec<Value>, ApiError> {
    let found = subjects.show(subject).map_err(|_| {
        ApiError::not_found("data subject (subjects are named exactly as they were recorded)")
    })?;
    let mut answers = Vec::new();
    for summary in found {
        let summary_tenant = TenantId::new(summary.tenant.clone())?;
        if tenant.is_some_and(|t| *t != summary_tenant) || !scope.allows(&summary_tenant) {
            continue;
        }
        let erasure = erase_key(shared, subjects, &summary.key_id, &by, reason).await?;
        answers.push(erasure);
    }
    if answers.is_empty() {
        return Err(ApiError::not_found(
            "data subject (subjects are named exactly as they were recorded)",
        ));
    }
    Ok(answers)
}

/// Erases one key (see [`opledger_subjects::erase_key`]); the retention worker's erasure too.
pub(crate) async fn erase_key(
    shared: &Shared,
    subjects: &Subjects,
    key_id: &str,
    by: &EventPrincipal,
    reason: &str,
) -> Result<Value, ApiError> {
    let report =
        opledger_subjects::erase_key(shared.engine.ledger(), subjects, key_id, by.clone(), reason)
            .await
            .map_err(|error| match error {
                opledger_subjects::EraseError::Store(error) => ApiError::from(error),
                other => ApiError::internal("the erasure failed", other),
            })?;
    Ok(serde_json::to_value(report).expect("plain data always serializes"))
}

fn configured(shared: &Shared) -> Result<&Subjects, ApiError> {
    shared.subjects.as_deref().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "personal_data_off",
            "this server keeps no personal data: configure [personal_data] with a key-encryption key",
        )
    })
}

fn key_store_error(error: opledger_subjects::SubjectsError) -> ApiError {
    ApiError::internal("the key store failed", error)
}

/// `GET /v1/subjects` (operator token): every subject in the operator's tenants, names only of
/// those not erased, never a key.
pub(crate) async fn list(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (_, scope) = operator_for_route(shared.tokens.authenticate(&headers)?, "GET /v1/subjects")?;
    let subjects = configured(&shared)?;
    let listed: Vec<_> = subjects
        .list()
        .map_err(key_store_error)?
        .into_iter()
        .filter(|summary| {
            TenantId::new(summary.tenant.clone()).is_ok_and(|tenant| scope.allows(&tenant))
        })
        .collect();
    Ok(json_reply(StatusCode::OK, &json!({ "subjects": listed })))
}

/// `GET /v1/subjects/{subject}` (operator token).
pub(crate) async fn show(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path(subject): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (_, scope) = operator_for_route(
        shared.tokens.authenticate(&headers)?,
        "GET /v1/subjects/{subject}",
    )?;
    let subjects = configured(&shared)?;
    let found: Vec<_> = subjects
        .show(&subject)
        .map_err(|_| ApiError::not_found("data subject"))?
        .into_iter()
        .filter(|summary| {
            TenantId::new(summary.tenant.clone()).is_ok_and(|tenant| scope.allows(&tenant))
        })
        .collect();
    if found.is_empty() {
        return Err(ApiError::not_found("data subject"));
    }
    Ok(json_reply(StatusCode::OK, &json!({ "subjects": found })))
}

/// How often the retention worker looks for subjects kept longer than their tenant's
/// `retention_days`, in seconds. Retention is counted in days: an hour late is within the rule's
/// own granularity, and a sweep reads every live subject's operations.
pub const RETENTION_SWEEP_EVERY_S: u64 = 3_600;

/// The name the retention worker erases under (`erased_by` of its `SubjectErased` events).
pub const RETENTION_ERASER: &str = "retention";

/// Starts the retention worker when some tenant sets `retention_days`: every
/// [`RETENTION_SWEEP_EVERY_S`] it erases the subjects whose operations all settled longer ago,
/// each erasure an event. It stops with the server.
pub(crate) fn spawn_retention(
    shared: &Arc<Shared>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    shared.subjects.as_ref()?;
    if !shared.privacy.values().any(|p| p.retention_days.is_some()) {
        return None;
    }
    let shared = Arc::clone(shared);
    Some(tokio::spawn(async move {
        loop {
            match retention_sweep(&shared, chrono::Utc::now()).await {
                Ok(0) => {}
                Ok(erased) => tracing::info!(erased, "retention: subjects erased"),
                Err(error) => {
                    tracing::warn!(code = error.code, message = %error.message, "retention sweep failed; trying again at the next")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_secs(RETENTION_SWEEP_EVERY_S)) => {}
                _ = stopping.changed() => return,
            }
        }
    }))
}

/// One sweep at `now`: erases every live subject of a tenant with `retention_days` whose
/// operations are all settled (terminal), the last of them longer ago than that. Returns how
/// many were erased.
pub(crate) async fn retention_sweep(
    shared: &Shared,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<usize, ApiError> {
    let Some(subjects) = shared.subjects.as_deref() else {
        return Ok(0);
    };
    let by = EventPrincipal {
        kind: PrincipalKind::Operator,
        name: RETENTION_ERASER.to_owned(),
    };
    let mut erased = 0;
    for summary in subjects.list().map_err(key_store_error)? {
        let Ok(tenant) = TenantId::new(summary.tenant.clone()) else {
            continue;
        };
        let Some(days) = shared.privacy.get(&tenant).and_then(|p| p.retention_days) else {
            continue;
        };
        if summary.erased_at.is_some() {
            continue;
        }
        let cutoff = now - chrono::Duration::days(i64::from(days));
        let mut settled = Vec::with_capacity(summary.operations.len());
        for operation in &summary.operations {
            let loaded = shared.engine.ledger().load(*operation).await?;
            settled.push(Settled {
                terminal: loaded.version.is_none() || loaded.state.status.is_terminal(),
                at: loaded.state.updated_at,
            });
        }
        let recorded_at = chrono::DateTime::parse_from_rfc3339(&summary.last_recorded_at)
            .map(|at| at.with_timezone(&chrono::Utc))
            .ok();
        if kept_too_long(&settled, recorded_at, cutoff) {
            let reason = format!("retention: personal data of tenant {tenant} is kept {days} days after its operations settle");
            erase_key(shared, subjects, &summary.key_id, &by, &reason).await?;
            erased += 1;
        }
    }
    Ok(erased)
}

/// One operation of a subject, as retention sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settled {
    /// Its state is terminal (or it was never appended).
    pub terminal: bool,
    /// Its last event's time.
    pub at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Whether a subject is kept past `cutoff`: every operation settled before it, and nothing
/// recorded under the subject since.
pub(crate) fn kept_too_long(
    operations: &[Settled],
    last_recorded_at: Option<chrono::DateTime<chrono::Utc>>,
    cutoff: chrono::DateTime<chrono::Utc>,
) -> bool {
    last_recorded_at.is_some_and(|at| at < cutoff)
        && operations
            .iter()
            .all(|operation| operation.terminal && operation.at.is_none_or(|at| at < cutoff))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Duration, TimeZone, Utc};

    #[test]
    fn a_subject_is_erased_by_retention_only_when_every_operation_settled_before_the_cutoff() {
        let cutoff = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let old = Some(cutoff - Duration::days(3));
        let new = Some(cutoff + Duration::hours(1));
        let settled = |terminal, at| Settled { terminal, at };
        assert!(kept_too_long(
            &[settled(true, old), settled(true, old)],
            old,
            cutoff
        ));
        assert!(
            !kept_too_long(&[settled(true, old), settled(false, old)], old, cutoff),
            "one still open"
        );
        assert!(
            !kept_too_long(&[settled(true, old), settled(true, new)], old, cutoff),
            "one settled since"
        );
        assert!(
            !kept_too_long(&[settled(true, old)], new, cutoff),
            "recorded again since"
        );
        assert!(
            kept_too_long(&[], old, cutoff),
            "a key with no operation left behind"
        );
    }
}
