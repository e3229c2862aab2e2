//! The API's one error shape, `{"error": {"code": "...", "message": "..."}}`, and how every error
//! from below maps onto a status code.
//!
//! A refusal by the ledger's rules is a 409 and a problem with the input a 400/422: in both cases
//! nothing was written. A store that failed mid-append is a 503 whose message says the request
//! may be repeated as it is — every write the API offers is idempotent (a source id, the
//! operation's own stream version).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use opledger_domain::app::AppError;
use opledger_domain::decider::Rejection;
use opledger_domain::error::ValidationError;
use opledger_domain::provider::{describe_arg_problems, ArgProblem};
use opledger_domain::store::StoreError;
use opledger_readmodel::ReadModelError;
use serde_json::json;
use tracing::error;

/// An error as the API answers it.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable, machine-readable code.
    pub code: &'static str,
    /// What went wrong and what to do, for a person.
    pub message: String,
    /// For arguments that fail the action's input schema: each failing field's JSON pointer
    /// (inside `args`) and what is wrong with it. Empty otherwise, and then not in the body.
    pub fields: Vec<ArgProblem>,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            fields: Vec::new(),
        }
    }

    /// The same refusal for a request that named itself with the `Idempotency-Key` header: the
    /// key reused for another request is `idempotency_key_reused` (the code clients of other
    /// Stripe-style APIs look for), not the source id it maps onto.
    pub fn for_idempotency_key(self) -> Self {
        if self.code != "source_id_reused" {
            return self;
        }
        let message =
            self.message
                .replacen("source id", "Idempotency-Key (the request's source id)", 1);
        let message = message.replace(
            "a new request needs a new source id",
            "a new request needs a new key",
        );
        Self::new(StatusCode::CONFLICT, "idempotency_key_reused", message)
    }

    /// The call's arguments fail the action's input schema: a 422 naming every failing field
    /// (`args/title: …`), nothing written.
    pub fn invalid_args(problems: &[ArgProblem]) -> Self {
        let mut error = Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            format!(
                "the arguments do not fit the action's input schema: {}; nothing was recorded",
                describe_arg_problems(problems)
            ),
        );
        error.fields = problems.to_vec();
        error
    }

    /// No such operation — also what another tenant's operation looks like, so that existence
    /// does not leak.
    pub fn not_found(what: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} does not exist (or is not yours)"),
        )
    }

    /// The input is wrong; nothing was written.
    pub fn invalid(error: ValidationError) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            error.to_string(),
        )
    }

    /// Something failed inside; logged with its detail.
    pub fn internal(what: &str, detail: impl std::fmt::Display) -> Self {
        error!(%detail, "{what}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("{what}; the server log has the detail"),
        )
    }
}

impl From<ValidationError> for ApiError {
    fn from(error: ValidationError) -> Self {
        Self::invalid(error)
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::AppendOutcomeUnknown { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "outcome_unknown",
                format!("{error}; repeat the same request: it is idempotent"),
            ),
            StoreError::InvalidAppend { .. } => {
                Self::internal("the ledger refused an append", error)
            }
            _ => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                format!("the ledger is unavailable ({error}); try again shortly"),
            ),
        }
    }
}

impl From<AppError> for ApiError {
    fn from(error: AppError) -> Self {
        match error {
            AppError::Invalid(error) => Self::invalid(error),
            AppError::NotFound { operation_id } => {
                Self::not_found(format!("operation {operation_id}"))
            }
            // The decider checks some inputs itself (note lengths): bad input, not a refusal.
            AppError::Rejected {
                rejection: Rejection::Invalid(_),
                ..
            } => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_input",
                error.to_string(),
            ),
            AppError::Rejected {
                rejection: Rejection::DuplicateRiskNotAccepted { .. },
                ..
            } => Self::new(
                StatusCode::CONFLICT,
                "duplicate_risk_not_accepted",
                error.to_string(),
            ),
            AppError::Rejected { .. } => {
                Self::new(StatusCode::CONFLICT, "refused", error.to_string())
            }
            AppError::SourceReused { .. } => {
                Self::new(StatusCode::CONFLICT, "source_id_reused", error.to_string())
            }
            AppError::Moved { .. } => Self::new(StatusCode::CONFLICT, "stale", error.to_string()),
            AppError::Contended { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "contended",
                error.to_string(),
            ),
            AppError::Store(error) => error.into(),
            AppError::Decode(error) => Self::internal("a stored event could not be read", error),
            AppError::PersonalData(opledger_domain::personal::PersonalDataError::Invalid(
                error,
            )) => Self::invalid(error),
            AppError::PersonalData(opledger_domain::personal::PersonalDataError::Erased) => {
                Self::new(StatusCode::CONFLICT, "subject_erased", error.to_string())
            }
            AppError::PersonalData(error) => {
                Self::internal("personal data could not be sealed", error)
            }
        }
    }
}

impl From<ReadModelError> for ApiError {
    fn from(error: ReadModelError) -> Self {
        match error {
            ReadModelError::InvalidQuery { reason } => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", reason)
            }
            ReadModelError::AsOfBeyondLimit { reason } => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "as_of_beyond_limit",
                reason,
            ),
            ReadModelError::Store(error) => error.into(),
            other => Self::internal("the read models failed", other),
        }
    }
}

impl From<crate::render::RenderError> for ApiError {
    fn from(error: crate::render::RenderError) -> Self {
        use crate::render::RenderError;
        match error {
            RenderError::App(error) => error.into(),
            RenderError::Store(error) => error.into(),
            RenderError::ReadModel(error) => error.into(),
            RenderError::Invalid(error) => Self::invalid(error),
            other => Self::internal("the request failed", other),
        }
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(error: axum::extract::rejection::QueryRejection) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            format!("the query string is not understood: {}", error.body_text()),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": {"code": self.code, "message": self.message}});
        if !self.fields.is_empty() {
            let fields: Vec<serde_json::Value> = self
                .fields
                .iter()
                .map(|field| json!({"pointer": format!("/args{}", field.pointer), "message": field.message}))
                .collect();
            body["error"]["fields"] = serde_json::Value::Array(fields);
        }
        let mut response = json_reply(self.status, &body);
        if self.status == StatusCode::UNAUTHORIZED {
            // RFC 9110 §11.6.1: a 401 says which scheme to authenticate with.
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"opledger\""),
            );
        }
        response
    }
}

/// A JSON response with this status.
pub fn json_reply(status: StatusCode, body: &serde_json::Value) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
