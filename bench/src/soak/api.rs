//! The soak's requests and the three calls it makes to the server: record-and-execute (first
//! delivery and redelivery alike), and read one operation.
//!
//! A request is named by its `uid`: its source id (in the body, or as the `Idempotency-Key`
//! header) and a field of the task it asks for, so the stand's objects can be counted per
//! request whichever shape stored them.

use serde_json::{json, Value};

/// The tenant the soak records as, and its token (at least 16 characters, as serve requires).
pub const TENANT: &str = "soak";
pub const TENANT_TOKEN: &str = "soak-tenant-token-0123456789";
/// The stand's account, and the token it knows it by.
pub const ACCOUNT: &str = "acct-1";
pub const ACCOUNT_TOKEN: &str = "token-acct-1";
/// The task field carrying the request's uid, read back from the stand's objects.
pub const UID_FIELD: &str = "soak_request";
/// How long a record-and-execute call of the burst waits for its outcome, in milliseconds.
pub const BURST_WAIT_MS: u64 = 2_000;
/// How long any call may take before the client gives up on it, in milliseconds: above the
/// burst's wait, so only a dead or stuck server runs into it.
pub const CALL_TIMEOUT_MS: u64 = 15_000;

/// The connectors the soak's requests go to: the stand's keyed shape (Idempotency-Key, looked up
/// by key) and its labelled shape (an upsert by a unique label, looked up by label).
pub const PROVIDERS: [&str; 2] = ["keyed", "labelled"];

/// One request of a burst, as its client would deliver it again.
#[derive(Clone, Debug)]
pub struct Request {
    pub uid: String,
    pub provider: &'static str,
    /// Named by the `Idempotency-Key` header instead of the body's `source_id`.
    pub by_header: bool,
}

impl Request {
    /// The body, the same at every delivery.
    pub fn body(&self) -> Value {
        let mut body = json!({
            "provider": self.provider,
            "account": ACCOUNT,
            "action": "create_task",
            // Every request asks for a task of its own: identical arguments from different
            // deliveries would be flagged as possible duplicate intents, not the traffic here.
            "args": {"title": format!("soak task {}", self.uid), UID_FIELD: self.uid},
        });
        if !self.by_header {
            body["source_id"] = json!(self.uid);
        }
        body
    }
}

/// What a record-and-execute call was answered.
#[derive(Clone, Debug)]
pub enum Answer {
    /// 2xx with an operation id: the server acknowledged the request.
    Acked(Acked),
    /// No answer (the connection closed: the kill), or a body without an operation id; why,
    /// for a failure's message.
    Unanswered(String),
    /// An answer that is not 2xx.
    Refused { status: u16, text: String },
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Acked(acked) => write!(f, "operation {} ({})", acked.operation_id, acked.state),
            Answer::Unanswered(why) => write!(f, "no answer: {why}"),
            Answer::Refused { status, text } => write!(f, "{status}: {text}"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Acked {
    pub operation_id: String,
    /// 201: this delivery recorded it; 200: an earlier one had.
    pub created: bool,
    /// The `Idempotent-Replayed: true` header.
    pub replayed: bool,
    /// The operation's state when the call answered.
    pub state: String,
}

/// An operation as `GET /v1/operations/{id}` shows it; the fields the checks read.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct OperationView {
    pub operation_id: String,
    pub state: String,
    pub external_id: Option<String>,
}

impl OperationView {
    /// Terminal, or waiting for a person: nothing more happens to it on its own.
    pub fn settled(&self) -> bool {
        matches!(
            self.state.as_str(),
            "succeeded" | "rejected" | "denied" | "abandoned" | "needs_review"
        )
    }
}

/// One server's API, as the soak's clients call it.
#[derive(Clone)]
pub struct Api {
    pub client: reqwest::Client,
    pub base: String,
}

impl Api {
    /// `POST /v1/operations?execute=true&wait_ms=…` for `request`.
    pub async fn record(&self, request: &Request, wait_ms: u64) -> Answer {
        let mut call = self
            .client
            .post(format!(
                "{}/v1/operations?execute=true&wait_ms={wait_ms}",
                self.base
            ))
            .bearer_auth(TENANT_TOKEN)
            .header("content-type", "application/json")
            .body(request.body().to_string());
        if request.by_header {
            call = call.header("Idempotency-Key", &request.uid);
        }
        let response = match call.send().await {
            Ok(response) => response,
            Err(error) => return Answer::Unanswered(error.to_string()),
        };
        let status = response.status();
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|value| value == "true");
        let text = match response.text().await {
            Ok(text) => text,
            Err(error) => return Answer::Unanswered(format!("reading the answer: {error}")),
        };
        if !status.is_success() {
            return Answer::Refused {
                status: status.as_u16(),
                text,
            };
        }
        match serde_json::from_str::<OperationView>(&text) {
            Ok(view) => Answer::Acked(Acked {
                operation_id: view.operation_id,
                created: status == reqwest::StatusCode::CREATED,
                replayed,
                state: view.state,
            }),
            Err(error) => Answer::Unanswered(format!("{status} without an operation ({error})")),
        }
    }

    /// `GET /v1/operations/{id}`: `Ok(None)` when the server says it does not exist.
    pub async fn operation(&self, operation_id: &str) -> Result<Option<OperationView>, String> {
        let response = self
            .client
            .get(format!("{}/v1/operations/{operation_id}", self.base))
            .bearer_auth(TENANT_TOKEN)
            .send()
            .await
            .map_err(|error| format!("GET {operation_id}: {error}"))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let text = response
            .text()
            .await
            .map_err(|error| format!("GET {operation_id}: reading the answer: {error}"))?;
        if !status.is_success() {
            return Err(format!("GET {operation_id} answered {status}: {text}"));
        }
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|error| format!("GET {operation_id}: not an operation ({error}): {text}"))
    }
}
