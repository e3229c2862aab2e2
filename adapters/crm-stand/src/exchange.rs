//! The path every provider request takes, whatever its shape: number it, check the account and
//! token, check the request, consume a matching fault, apply the shape's rules, log it, and turn
//! the result into an HTTP response with its `Request-Id` — or into a dropped connection or a
//! held answer, as the fault says.
//!
//! The decision is made in one critical section (`StandState::decide`); only carrying it out
//! (holding a late answer, closing a connection) happens outside the lock. This module must
//! never apply a request that was refused, nor consume a fault for a request that was refused
//! before its shape's rules ran.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header::{AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use tokio::sync::oneshot;
use tracing::Instrument;

use super::clock::http_date_after;
use super::server::{stopped, ConnectionHandle};
use super::state::{
    Applied, KeyTicket, Outcome, Reply, Shared, StandState, MAX_BODY_BYTES, MAX_LABEL_BYTES,
};
use super::wire::{FaultKind, LoggedRequest, Shape};

/// The header that numbers every provider response.
pub(super) const REQUEST_ID: HeaderName = HeaderName::from_static("request-id");
/// The header that marks a keyed replay.
pub(super) const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Who asked what: everything about a provider request that the log and the span show.
#[derive(Debug)]
pub(super) struct Call {
    pub(super) shape: Shape,
    pub(super) method: Method,
    pub(super) path: String,
    /// `None` when the account segment of the path could not be decoded.
    pub(super) account: Option<String>,
    pub(super) bearer: Option<String>,
    pub(super) key: Option<String>,
    pub(super) label: Option<String>,
    pub(super) traceparent: Option<String>,
}

impl Call {
    pub(super) fn new(
        shape: Shape,
        method: Method,
        uri: &Uri,
        headers: &HeaderMap,
        account: Option<String>,
    ) -> Self {
        Self {
            shape,
            method,
            path: uri.path().to_owned(),
            account,
            bearer: bearer_token(headers),
            key: None,
            label: None,
            traceparent: headers
                .get("traceparent")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned),
        }
    }
}

/// What a well-formed provider request asks for.
#[derive(Debug)]
pub(super) enum Op {
    KeyedCreate {
        key: String,
        fields: Map<String, Value>,
    },
    KeyedStatus {
        key: String,
    },
    LabelledPut {
        label: String,
        fields: Map<String, Value>,
    },
    LabelledGet {
        label: String,
    },
    PlainCreate {
        label: Option<String>,
        fields: Map<String, Value>,
    },
    PlainSearch {
        label: String,
    },
}

/// How the decision is carried out.
#[derive(Debug)]
enum Disposition {
    Respond(Reply),
    /// Close the connection without a response.
    Drop,
    /// Answer `reply` after `delay`, completing `ticket` (if any) at that moment.
    Late {
        delay: Duration,
        reply: Reply,
        ticket: Option<KeyTicket>,
    },
}

/// Runs one provider request. `op` is `Err` when the request is malformed; it is still numbered,
/// authenticated and logged first, so a 401 wins over a 422.
pub(super) async fn run(
    shared: Arc<Shared>,
    call: Call,
    op: Result<Op, Reply>,
    connection: Option<ConnectionHandle>,
) -> Response {
    let span = tracing::info_span!(
        "stand.request",
        request_id = tracing::field::Empty,
        shape = call.shape.as_str(),
        method = %call.method,
        account = call.account.as_deref(),
        key = call.key.as_deref(),
        label = call.label.as_deref(),
    );
    async move {
        let (n, outcome, disposition) = shared.lock().decide(&call, op);
        tracing::Span::current().record("request_id", format!("req_{n}"));
        match disposition {
            Disposition::Respond(reply) => {
                tracing::info!(
                    status = reply.status.as_u16(),
                    outcome = %outcome.render(),
                    "answered"
                );
                with_request_id(reply.into_response(), n)
            }
            Disposition::Drop => {
                tracing::info!(
                    outcome = %outcome.render(),
                    "closing the connection without a response"
                );
                drop_connection(connection).await
            }
            Disposition::Late {
                delay,
                reply,
                ticket,
            } => {
                tracing::info!(
                    delay_ms = delay.as_millis(),
                    outcome = %outcome.render(),
                    "holding the response"
                );
                let reply = hold(&shared, delay, reply, ticket).await;
                tracing::info!(status = reply.status.as_u16(), "released the held response");
                with_request_id(reply.into_response(), n)
            }
        }
    }
    .instrument(span)
    .await
}

impl StandState {
    /// Decides everything about one provider request, and logs it.
    fn decide(&mut self, call: &Call, op: Result<Op, Reply>) -> (u64, Outcome, Disposition) {
        let n = self.log.next_n();
        let now_ms = self.clock.now_ms();
        let (outcome, disposition) = self.decide_unlogged(call, op, now_ms);
        self.log.push(LoggedRequest {
            n,
            method: call.method.to_string(),
            path: call.path.clone(),
            account: call.account.clone(),
            key: call.key.clone(),
            label: call.label.clone(),
            outcome: outcome.render(),
            traceparent: call.traceparent.clone(),
        });
        (n, outcome, disposition)
    }

    fn decide_unlogged(
        &mut self,
        call: &Call,
        op: Result<Op, Reply>,
        now_ms: u64,
    ) -> (Outcome, Disposition) {
        let account = match self.authorize(call) {
            Ok(account) => account,
            Err(reply) => return (Outcome::Refused, Disposition::Respond(reply)),
        };
        let op = match op {
            Ok(op) => op,
            Err(reply) => return (Outcome::Refused, Disposition::Respond(reply)),
        };
        let Some(fault) = self.faults.take(call.shape, account, &call.method) else {
            let applied = self.apply(account, op, now_ms);
            self.complete(applied.ticket.as_ref());
            return (applied.outcome, Disposition::Respond(applied.reply));
        };
        let outcome = Outcome::Fault(fault.name());
        let disposition = match fault {
            FaultKind::DropRequest => Disposition::Drop,
            FaultKind::ErrorBeforeCommit { status } => Disposition::Respond(internal(status)),
            FaultKind::RateLimit {
                retry_after_s,
                retry_after_http_date,
            } => Disposition::Respond(rate_limited(now_ms, retry_after_s, retry_after_http_date)),
            FaultKind::DropResponse => {
                let applied = self.apply(account, op, now_ms);
                self.complete(applied.ticket.as_ref());
                Disposition::Drop
            }
            FaultKind::ErrorAfterCommit {
                status,
                retry_after_s,
            } => {
                // The key is completed with the real answer, not the injected 5xx: the error
                // happened after the provider's commit, so a retry with the key replays the task.
                let applied = self.apply(account, op, now_ms);
                self.complete(applied.ticket.as_ref());
                Disposition::Respond(Reply {
                    retry_after: retry_after_s.map(|seconds| seconds.to_string()),
                    ..internal(status)
                })
            }
            FaultKind::LateResponse { delay_ms } => {
                let applied = self.apply(account, op, now_ms);
                Disposition::Late {
                    delay: Duration::from_millis(delay_ms),
                    reply: applied.reply,
                    ticket: applied.ticket,
                }
            }
        };
        (outcome, disposition)
    }

    /// The account the request may act for: it exists and the bearer token is its token.
    fn authorize<'c>(&self, call: &'c Call) -> Result<&'c str, Reply> {
        let Some(account) = call.account.as_deref() else {
            return Err(Reply::error(
                StatusCode::BAD_REQUEST,
                "invalid_path",
                "the account segment of the path is not valid UTF-8",
            ));
        };
        let Some(token) = self.accounts.get(account) else {
            return Err(Reply::error(
                StatusCode::NOT_FOUND,
                "account_not_found",
                format!("no account {account:?}"),
            ));
        };
        match call.bearer.as_deref() {
            Some(bearer) if bearer == token => Ok(account),
            Some(_) => Err(Reply::error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                format!("the bearer token is not account {account:?}'s token"),
            )),
            None => Err(Reply::error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing Authorization: Bearer <token>",
            )),
        }
    }

    /// Applies a well-formed, authorized request through its shape's rules.
    fn apply(&mut self, account: &str, op: Op, now_ms: u64) -> Applied {
        let retention_ms = self.key_retention_ms();
        let lag_ms = self.settings.search_lag_ms;
        match op {
            Op::KeyedCreate { key, fields } => {
                self.crm
                    .keyed_create(account, &key, fields, now_ms, retention_ms)
            }
            Op::KeyedStatus { key } => self.crm.keyed_status(account, &key, now_ms, retention_ms),
            Op::LabelledPut { label, fields } => {
                self.crm.labelled_put(account, &label, fields, now_ms)
            }
            Op::LabelledGet { label } => self.crm.labelled_get(account, &label),
            Op::PlainCreate { label, fields } => {
                self.crm
                    .plain_create(account, label.as_deref(), fields, now_ms)
            }
            Op::PlainSearch { label } => self.crm.plain_search(account, &label, now_ms, lag_ms),
        }
    }

    fn complete(&mut self, ticket: Option<&KeyTicket>) {
        if let Some(ticket) = ticket {
            self.crm.complete_key(ticket);
        }
    }
}

/// The injected 5xx. Statuses were checked when the fault was queued.
fn internal(status: u16) -> Reply {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    Reply::error(status, "internal", "injected server error")
}

fn rate_limited(now_ms: u64, retry_after_s: u64, as_http_date: bool) -> Reply {
    let seconds = retry_after_s.to_string();
    let retry_after = if as_http_date {
        // Out of chrono's range only for absurd clocks; seconds are then the honest answer.
        http_date_after(now_ms, retry_after_s).unwrap_or(seconds)
    } else {
        seconds
    };
    Reply {
        retry_after: Some(retry_after),
        ..Reply::error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!("rate limited; retry after {retry_after_s} s"),
        )
    }
}

/// Holds `reply` for `delay`, then completes the key and releases it.
///
/// The wait runs in its own task so that the key is completed when the delay ends even if the
/// client gave up and the connection (with this handler) is gone. A shutting-down stand
/// releases held answers at once, so shutdown stays prompt.
async fn hold(
    shared: &Arc<Shared>,
    delay: Duration,
    reply: Reply,
    ticket: Option<KeyTicket>,
) -> Reply {
    let (release, released) = oneshot::channel();
    let waiter = Arc::clone(shared);
    let mut shutdown = shared.shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stopped(&mut shutdown) => {}
        }
        if let Some(ticket) = ticket {
            waiter.lock().crm.complete_key(&ticket);
        }
        // The client may be gone; the contract sends the answer only "if the client is still
        // there", so a closed channel is not an error.
        let _ = release.send(reply);
    });
    released.await.unwrap_or_else(|_| {
        Reply::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the held response was lost",
        )
    })
}

/// Orders the connection closed and never answers: the client sees the connection end without a
/// single byte of a response.
async fn drop_connection(connection: Option<ConnectionHandle>) -> Response {
    match connection {
        Some(connection) => {
            connection.close();
            // The connection's task drops this future together with the connection.
            std::future::pending::<Response>().await
        }
        None => Reply::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "this request did not come through the stand's own accept loop, so it cannot be dropped",
        )
        .into_response(),
    }
}

fn with_request_id(mut response: Response, n: u64) -> Response {
    if let Ok(value) = HeaderValue::try_from(format!("req_{n}")) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    response
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            self.body.to_string(),
        )
            .into_response();
        let headers = response.headers_mut();
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The refused body may still be on its way; the connection cannot be reused.
            headers.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        if self.replayed {
            headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        }
        if let Some(retry_after) = self.retry_after {
            if let Ok(value) = HeaderValue::try_from(retry_after) {
                headers.insert(RETRY_AFTER, value);
            }
        }
        response
    }
}

/// The token of `Authorization: Bearer <token>`; the scheme is case-insensitive (RFC 9110).
fn bearer_token(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
}

/// A request body of at most [`MAX_BODY_BYTES`], or the reply that refuses it.
///
/// A body whose `Content-Length` announces more is refused before a byte of it is read; one
/// without a length (chunked) is read up to the limit. The refusal is a value, not a rejection,
/// so a provider request with a bad body is still numbered, authenticated and logged.
#[derive(Debug)]
pub(super) struct LimitedBody(pub(super) Result<Bytes, Reply>);

impl<S: Send + Sync> FromRequest<S> for LimitedBody {
    type Rejection = Infallible;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let announced = request
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        if announced.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
            return Ok(Self(Err(too_large())));
        }
        let body = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    too_large()
                } else {
                    Reply::error(
                        StatusCode::BAD_REQUEST,
                        "body_unreadable",
                        rejection.body_text(),
                    )
                }
            });
        Ok(Self(body))
    }
}

fn too_large() -> Reply {
    Reply::error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("the body is larger than {MAX_BODY_BYTES} bytes"),
    )
}

/// The body as task fields: a JSON object.
pub(super) fn task_fields(body: LimitedBody) -> Result<Map<String, Value>, Reply> {
    let bytes = body.0?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(Reply::error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            "the body must be a JSON object",
        )),
        Err(e) => Err(Reply::error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            format!("the body is not JSON: {e}"),
        )),
    }
}

/// A label is not empty and has at most [`MAX_LABEL_BYTES`].
pub(super) fn check_label(label: &str) -> Result<(), Reply> {
    if label.is_empty() || label.len() > MAX_LABEL_BYTES {
        return Err(Reply::error(
            StatusCode::BAD_REQUEST,
            "invalid_label",
            format!("a label has 1 to {MAX_LABEL_BYTES} bytes"),
        ));
    }
    Ok(())
}
