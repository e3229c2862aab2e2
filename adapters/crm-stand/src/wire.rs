//! The admin API's JSON types, shared by the stand (which answers with them) and by
//! [`StandAdmin`](super::StandAdmin) (which reads them), so the two cannot drift apart.
//!
//! These types describe the wire and nothing else: no rules live here.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The three API shapes the stand serves: the providers crate owns them, with the wire contract.
pub use opledger_providers::Shape;

/// The HTTP method a fault can be restricted to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum FaultMethod {
    Get,
    Post,
    Put,
}

impl FaultMethod {
    /// Whether a request with this HTTP method matches.
    pub fn matches(self, method: &axum::http::Method) -> bool {
        match self {
            FaultMethod::Get => method == axum::http::Method::GET,
            FaultMethod::Post => method == axum::http::Method::POST,
            FaultMethod::Put => method == axum::http::Method::PUT,
        }
    }
}

/// What a fault does to the request that consumes it. See the module docs of
/// [`stand`](super) for what a client observes for each kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    /// Not applied; the connection is closed without a response.
    DropRequest,
    /// Applied; then the connection is closed without a response.
    DropResponse,
    /// Applied; the response is held for `delay_ms` of real time.
    LateResponse { delay_ms: u64 },
    /// Applied; then `status` (500, 502 or 503) with error type `internal`, and
    /// `Retry-After: retry_after_s` when given (a provider asking for a pause while it recovers).
    ErrorAfterCommit {
        status: u16,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_s: Option<u64>,
    },
    /// Not applied; `status` (500, 502 or 503) with error type `internal`.
    ErrorBeforeCommit { status: u16 },
    /// Not applied; 429 with `Retry-After` as seconds, or as an HTTP date that many seconds
    /// ahead on the stand clock.
    RateLimit {
        retry_after_s: u64,
        #[serde(default)]
        retry_after_http_date: bool,
    },
}

impl FaultKind {
    /// The kind's name on the wire, as in the request log's `fault:<kind>` outcome.
    pub fn name(&self) -> &'static str {
        match self {
            FaultKind::DropRequest => "drop_request",
            FaultKind::DropResponse => "drop_response",
            FaultKind::LateResponse { .. } => "late_response",
            FaultKind::ErrorAfterCommit { .. } => "error_after_commit",
            FaultKind::ErrorBeforeCommit { .. } => "error_before_commit",
            FaultKind::RateLimit { .. } => "rate_limit",
        }
    }
}

/// A fault to queue: which provider requests it matches (`None` matches any), what it does, and
/// how many matching requests it hits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    #[serde(default)]
    pub shape: Option<Shape>,
    #[serde(default)]
    pub account: Option<String>,
    #[serde(default)]
    pub method: Option<FaultMethod>,
    #[serde(flatten)]
    pub kind: FaultKind,
    #[serde(default = "one")]
    pub times: u32,
}

fn one() -> u32 {
    1
}

impl Fault {
    /// A fault of `kind` that hits the next provider request of any shape, account and method.
    pub fn new(kind: FaultKind) -> Self {
        Self {
            shape: None,
            account: None,
            method: None,
            kind,
            times: 1,
        }
    }

    /// Restricts the fault to one shape.
    pub fn shape(mut self, shape: Shape) -> Self {
        self.shape = Some(shape);
        self
    }

    /// Restricts the fault to one account.
    pub fn account(mut self, account: impl Into<String>) -> Self {
        self.account = Some(account.into());
        self
    }

    /// Restricts the fault to one HTTP method.
    pub fn method(mut self, method: FaultMethod) -> Self {
        self.method = Some(method);
        self
    }

    /// Makes the fault hit `times` matching requests instead of one.
    pub fn times(mut self, times: u32) -> Self {
        self.times = times;
        self
    }
}

/// A task as the admin API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StandObject {
    pub id: String,
    pub shape: Shape,
    pub account: String,
    /// The `Idempotency-Key` it was created with (keyed only).
    pub key: Option<String>,
    /// Its label: the path label (labelled) or the `opledger_label` field (plain).
    pub label: Option<String>,
    /// The JSON object the client sent.
    pub fields: Map<String, Value>,
    /// When it was created, on the stand clock (milliseconds since the Unix epoch).
    pub created_at_ms: u64,
}

/// One provider request as the request log shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedRequest {
    /// The request's number, as in its `Request-Id: req_<n>`.
    pub n: u64,
    pub method: String,
    pub path: String,
    /// `None` only when the path's account segment could not be decoded.
    pub account: Option<String>,
    pub key: Option<String>,
    pub label: Option<String>,
    /// `applied`, `replayed`, `refused` or `fault:<kind>`.
    pub outcome: String,
    /// The W3C `traceparent` the request carried, so a test sees the trace a CRM would join.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// The settings `PUT /admin/config` changes and answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StandSettings {
    pub key_retention_s: u64,
    pub search_lag_ms: u64,
}
