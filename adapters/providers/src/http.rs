//! The HTTP layer all three shapes share: the reqwest client, one bounded request/response
//! exchange, and the pure functions that turn what came back into the port's outcomes.
//!
//! The network part ([`send`]) only collects facts: either an [`HttpReply`] (status, the few
//! headers that matter, a size-capped body) or a [`TransportFailure`] that says whether the
//! request can have left this process. Everything that *decides* — [`classify_send`],
//! [`unavailable_from_reply`], [`parse_retry_after`], [`parse_http_date`] — is a pure function of
//! those facts and `now`, tested without a network. Nothing here may put a token into a message.

use std::error::Error as _;
use std::time::Duration;

use chrono::{DateTime, Datelike, NaiveDateTime, Utc};
use opledger_domain::ids::{ExternalObjectId, ProviderRequestId};
use opledger_domain::provider::{LookupOutcome, SendOutcome};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::Method;
use serde_json::Value;

use super::config::ProviderConfigError;

/// Largest response body read, in bytes; a longer body counts as unreadable.
pub const MAX_RESPONSE_BODY_BYTES: usize = 256 * 1024;
/// Longest wait a provider may ask for (Retry-After), in milliseconds; longer asks are capped.
/// The engine owns it: it is the longest pause it schedules on a provider's word.
pub use opledger_domain::engine::MAX_RETRY_AFTER_MS;
/// The wait suggested when the provider says the same key is still being processed and gives
/// no Retry-After, in milliseconds.
pub const IN_FLIGHT_RETRY_AFTER_MS: u64 = 1_000;
/// Longest provider message kept in an outcome, in characters.
pub const MAX_MESSAGE_CHARS: usize = 500;
/// How long an idle pooled connection is kept, in milliseconds. Below the 5 s keep-alive of many
/// servers, so a send rarely goes out on a connection the server is just closing: such a send
/// fails after it was written and can only be classified as uncertain.
pub const POOL_IDLE_TIMEOUT_MS: u64 = 4_000;

/// What the response said, as far as classification needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpReply {
    /// The status code.
    pub status: u16,
    /// The `Request-Id` header.
    pub request_id: Option<String>,
    /// The `Retry-After` header.
    pub retry_after: Option<String>,
    /// The `Date` header.
    pub date: Option<String>,
    /// Whether the provider said it replayed an earlier response (`Idempotent-Replayed: true`).
    pub replayed: bool,
    /// The body, at most [`MAX_RESPONSE_BODY_BYTES`].
    pub body: Vec<u8>,
    /// False when the body was longer than the cap and was cut off.
    pub body_complete: bool,
}

impl HttpReply {
    /// A reply with only a status and a body; the headers are added by the caller (tests).
    #[cfg(test)]
    pub fn new(status: u16, body: &str) -> Self {
        Self {
            status,
            request_id: None,
            retry_after: None,
            date: None,
            replayed: false,
            body: body.as_bytes().to_vec(),
            body_complete: true,
        }
    }

    /// The body as JSON, when it is complete and valid JSON.
    pub fn json(&self) -> Option<Value> {
        if !self.body_complete {
            return None;
        }
        serde_json::from_slice(&self.body).ok()
    }

    /// `error.type` and `error.message` of the contract's error body, when present.
    pub fn error_parts(&self) -> (Option<String>, Option<String>) {
        let Some(json) = self.json() else {
            return (None, None);
        };
        let error = json.get("error");
        let text = |field: &str| {
            error
                .and_then(|error| error.get(field))
                .and_then(Value::as_str)
                .map(|text| shorten(text, MAX_MESSAGE_CHARS))
        };
        (text("type"), text("message"))
    }

    /// `<status> <error.type>`, or the status alone when the body names no type.
    pub fn code(&self) -> String {
        match self.error_parts().0 {
            Some(kind) => format!("{} {kind}", self.status),
            None => self.status.to_string(),
        }
    }

    /// The provider's message, or a short piece of the body when it has none.
    pub fn message(&self) -> String {
        if let Some(message) = self.error_parts().1 {
            return message;
        }
        let text = String::from_utf8_lossy(&self.body);
        let text = text.trim();
        if text.is_empty() {
            "(no body)".to_owned()
        } else {
            shorten(text, MAX_MESSAGE_CHARS)
        }
    }

    /// The provider request id as the domain type, when present and valid.
    pub fn provider_request_id(&self) -> Option<ProviderRequestId> {
        self.request_id
            .as_deref()
            .and_then(|id| ProviderRequestId::new(id).ok())
    }

    /// The wait the provider asked for, in milliseconds, capped at [`MAX_RETRY_AFTER_MS`].
    pub fn retry_after_ms(&self, now: DateTime<Utc>) -> Option<u64> {
        let value = self.retry_after.as_deref()?;
        parse_retry_after(value, self.date.as_deref(), now)
    }

    /// ` (Request-Id req_5)` when the provider named the request, else nothing; for evidence.
    pub fn request_id_note(&self) -> String {
        match &self.request_id {
            Some(id) => format!(" (Request-Id {})", shorten(id, 100)),
            None => String::new(),
        }
    }
}

/// How an exchange failed before a complete response was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransportFailure {
    /// No connection was made (or the request could not even be built): nothing left this process.
    NothingSent {
        /// What the transport reported.
        error: String,
    },
    /// The request may have reached the provider: a timeout, a reset or closed connection after
    /// the request may have been written, or a failure reading the response.
    MaybeSent {
        /// What the transport reported.
        error: String,
    },
}

impl TransportFailure {
    /// Sorts a reqwest error. Only a failure to *connect* proves nothing was sent: any other
    /// request error (`is_request()` without `is_connect()`) can come after bytes were written.
    pub fn from_reqwest(error: &reqwest::Error) -> Self {
        let text = error_chain(error);
        if error.is_builder() || error.is_connect() {
            Self::NothingSent { error: text }
        } else {
            Self::MaybeSent { error: text }
        }
    }

    /// The outcome of a send that failed this way.
    pub fn send_outcome(self) -> SendOutcome {
        match self {
            Self::NothingSent { error } => SendOutcome::NotSent {
                reason: format!("no connection was made, nothing was sent: {error}"),
                retry_after_ms: None,
            },
            Self::MaybeSent { error } => SendOutcome::Uncertain {
                error: format!("the request may have reached the provider: {error}"),
                retry_after_ms: None,
            },
        }
    }

    /// The outcome of a lookup that failed this way.
    pub fn lookup_outcome(self, what: &str) -> LookupOutcome {
        let error = match self {
            Self::NothingSent { error } | Self::MaybeSent { error } => error,
        };
        LookupOutcome::Unavailable {
            reason: format!("{what} → no answer: {error}"),
            retry_after_ms: None,
        }
    }
}

/// An error and its causes, joined with `: ` (reqwest's own message hides "connection refused").
fn error_chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    shorten(&text, MAX_MESSAGE_CHARS)
}

/// One request, ready to send: everything but the host and the credentials.
#[derive(Clone, Debug)]
pub struct PreparedRequest {
    /// GET, POST or PUT.
    pub method: Method,
    /// The path and query, starting with `/`, segments already percent-encoded.
    pub path: String,
    /// Extra headers (e.g. `Idempotency-Key`).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The JSON body, if any.
    pub body: Option<Vec<u8>>,
}

impl PreparedRequest {
    /// `GET /path`, for evidence and logs.
    pub fn describe(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// Builds the client one provider uses: its timeouts, no redirects, no proxies.
///
/// Redirects are off because a redirected POST may be replayed elsewhere; proxies from the
/// environment are ignored because a proxy answers 502 for a host it could not reach, hiding a
/// provably unsent request behind an uncertain one.
pub fn build_client(
    request_timeout_ms: u64,
    connect_timeout_ms: u64,
) -> Result<reqwest::Client, ProviderConfigError> {
    reqwest::Client::builder()
        .timeout(Duration::from_millis(request_timeout_ms))
        .connect_timeout(Duration::from_millis(connect_timeout_ms))
        .pool_idle_timeout(Duration::from_millis(POOL_IDLE_TIMEOUT_MS))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .user_agent(concat!("opledger/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|error| ProviderConfigError::Client {
            reason: error_chain(&error),
        })
}

/// Sends one request and reads the response, its body capped at [`MAX_RESPONSE_BODY_BYTES`].
pub async fn send(
    client: &reqwest::Client,
    base_url: &str,
    authorization: &HeaderValue,
    request: &PreparedRequest,
) -> Result<HttpReply, TransportFailure> {
    let url = format!("{base_url}{}", request.path);
    let mut builder = client
        .request(request.method.clone(), url)
        .header(AUTHORIZATION, authorization.clone())
        .header(reqwest::header::ACCEPT, "application/json");
    for (name, value) in &request.headers {
        builder = builder.header(name, value);
    }
    if let Some(body) = &request.body {
        builder = builder
            .header(CONTENT_TYPE, "application/json")
            .body(body.clone());
    }
    let mut response = builder
        .send()
        .await
        .map_err(|error| TransportFailure::from_reqwest(&error))?;
    let status = response.status().as_u16();
    let headers = response.headers();
    let mut reply = HttpReply {
        status,
        request_id: header_text(headers, "request-id"),
        retry_after: header_text(headers, "retry-after"),
        date: header_text(headers, "date"),
        replayed: header_text(headers, "idempotent-replayed")
            .is_some_and(|value| value.eq_ignore_ascii_case("true")),
        body: Vec::new(),
        body_complete: true,
    };
    let announced_too_long = response
        .content_length()
        .is_some_and(|length| length > MAX_RESPONSE_BODY_BYTES as u64);
    if announced_too_long {
        reply.body_complete = false;
        return Ok(reply);
    }
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if reply.body.len() + chunk.len() > MAX_RESPONSE_BODY_BYTES {
                    let room = MAX_RESPONSE_BODY_BYTES - reply.body.len();
                    reply.body.extend_from_slice(&chunk[..room]);
                    reply.body_complete = false;
                    return Ok(reply);
                }
                reply.body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(reply),
            Err(error) => {
                return Err(TransportFailure::MaybeSent {
                    error: format!(
                        "the response (status {status}) broke off while its body was read: {}",
                        error_chain(&error)
                    ),
                })
            }
        }
    }
}

fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(|value| shorten(value.trim(), 200))
}

/// Classifies the response to a create (every shape answers creates the same way).
///
/// | response | outcome |
/// |---|---|
/// | 2xx with an `id` | `Confirmed` (the `Request-Id` header becomes the provider request id) |
/// | 2xx without a usable `id`, or a body over the cap | `Uncertain` |
/// | 400, 401, 403, 404, 405, 413, 415, 422, 409 `label_conflict` | `Rejected` `<status> <type>` |
/// | 409 `idempotency_in_flight` | `NotSent`, Retry-After or [`IN_FLIGHT_RETRY_AFTER_MS`] |
/// | 429 | `NotSent`, Retry-After |
/// | 5xx | `Uncertain`, Retry-After |
/// | anything else (1xx, 3xx, other 4xx, other 409) | `Uncertain` |
pub fn classify_send(reply: &HttpReply, now: DateTime<Utc>) -> SendOutcome {
    let status = reply.status;
    let retry_after_ms = reply.retry_after_ms(now);
    match status {
        200..=299 => match reply.json().as_ref().and_then(object_id) {
            Some(external_id) => SendOutcome::Confirmed {
                external_id,
                provider_request_id: reply.provider_request_id(),
            },
            None => SendOutcome::Uncertain {
                error: format!(
                    "the provider answered {status}{} but its body names no usable `id`: the request was probably applied, but the object cannot be named",
                    reply.request_id_note()
                ),
                retry_after_ms,
            },
        },
        400 | 401 | 403 | 404 | 405 | 413 | 415 | 422 => SendOutcome::Rejected {
            code: reply.code(),
            message: reply.message(),
        },
        409 => match reply.error_parts().0.as_deref() {
            Some("idempotency_in_flight") => SendOutcome::NotSent {
                reason: format!(
                    "409 idempotency_in_flight: an earlier request with this key is still being processed; this one was not: {}",
                    reply.message()
                ),
                retry_after_ms: Some(retry_after_ms.unwrap_or(IN_FLIGHT_RETRY_AFTER_MS)),
            },
            Some("label_conflict") => SendOutcome::Rejected {
                code: reply.code(),
                message: reply.message(),
            },
            _ => SendOutcome::Uncertain {
                error: format!(
                    "unexpected conflict {}: {}",
                    reply.code(),
                    reply.message()
                ),
                retry_after_ms,
            },
        },
        429 => SendOutcome::NotSent {
            reason: format!("rate limited ({}): {}", reply.code(), reply.message()),
            retry_after_ms,
        },
        500..=599 => SendOutcome::Uncertain {
            error: format!(
                "the provider failed with {}{}; the request may have been applied: {}",
                reply.code(),
                reply.request_id_note(),
                reply.message()
            ),
            retry_after_ms,
        },
        _ => SendOutcome::Uncertain {
            error: format!(
                "unexpected status {}{}; the request may have been applied: {}",
                reply.code(),
                reply.request_id_note(),
                reply.message()
            ),
            retry_after_ms,
        },
    }
}

/// The lookup outcome for any response a lookup does not expect: `Refused` for 401 and 403
/// (wrong or revoked credentials do not clear on their own, so asking again cannot help),
/// `Unavailable` for everything else (429, 5xx, other statuses: a later lookup may answer).
pub fn unavailable_from_reply(what: &str, reply: &HttpReply, now: DateTime<Utc>) -> LookupOutcome {
    if matches!(reply.status, 401 | 403) {
        return LookupOutcome::Refused {
            reason: format!(
                "{what} was refused with {}{}: {}",
                reply.code(),
                reply.request_id_note(),
                reply.message()
            ),
        };
    }
    let reason = match reply.status {
        429 => format!("{what} was rate limited ({})", reply.code()),
        500..=599 => format!(
            "{what} failed with {}{}: {}",
            reply.code(),
            reply.request_id_note(),
            reply.message()
        ),
        _ => format!(
            "{what} got an unexpected {}{}: {}",
            reply.code(),
            reply.request_id_note(),
            reply.message()
        ),
    };
    LookupOutcome::Unavailable {
        reason,
        retry_after_ms: reply.retry_after_ms(now),
    }
}

/// The `id` of a JSON object: a string, or an integer written as one (some CRMs send numbers).
pub fn object_id(json: &Value) -> Option<ExternalObjectId> {
    match json.get("id")? {
        Value::String(text) => ExternalObjectId::new(text.as_str()).ok(),
        Value::Number(number) if number.is_u64() || number.is_i64() => {
            ExternalObjectId::new(number.to_string()).ok()
        }
        _ => None,
    }
}

/// Parses a Retry-After value (RFC 9110 §10.2.3) into milliseconds from now, capped at
/// [`MAX_RETRY_AFTER_MS`].
///
/// Delta-seconds are taken as they are. An HTTP date is measured from the response's `Date`
/// header when it has a valid one (both come from the provider's clock, so skew between the
/// clocks cancels out), else from `now`. A date in the past means "now" (0); anything
/// unparseable means no advice (`None`).
pub fn parse_retry_after(value: &str, date: Option<&str>, now: DateTime<Utc>) -> Option<u64> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|byte| byte.is_ascii_digit()) {
        // A long run of digits overflows u64; it is still "wait very long".
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(seconds.saturating_mul(1000).min(MAX_RETRY_AFTER_MS));
    }
    let until = parse_http_date(value, now)?;
    let reference = date
        .and_then(|date| parse_http_date(date, now))
        .unwrap_or(now);
    let wait_ms = (until - reference).num_milliseconds().max(0);
    Some(u64::try_from(wait_ms).unwrap_or(0).min(MAX_RETRY_AFTER_MS))
}

/// Parses an HTTP date in any of the three forms RFC 9110 §5.6.7 requires a recipient to accept:
/// IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the obsolete RFC 850 form
/// (`Sunday, 06-Nov-94 08:49:37 GMT`) and asctime (`Sun Nov  6 08:49:37 1994`). `now` settles
/// the century of an RFC 850 two-digit year.
pub fn parse_http_date(text: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let text = text.trim();
    if let Ok(parsed) = NaiveDateTime::parse_from_str(text, "%a, %d %b %Y %H:%M:%S GMT") {
        return Some(parsed.and_utc());
    }
    if let Some(parsed) = parse_rfc850(text, now) {
        return Some(parsed);
    }
    NaiveDateTime::parse_from_str(text, "%a %b %e %H:%M:%S %Y")
        .ok()
        .map(|parsed| parsed.and_utc())
}

fn parse_rfc850(text: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let (weekday, rest) = text.split_once(", ")?;
    let (date, time) = rest.split_once(' ')?;
    let mut parts = date.split('-');
    let (day, month, year) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || year.len() != 2 {
        return None;
    }
    let two_digits: i32 = year.parse().ok()?;
    // RFC 9110: a two-digit year more than 50 years in the future is the most recent past year
    // with the same last two digits.
    let this_year = now.year();
    let mut full_year = this_year - this_year.rem_euclid(100) + two_digits;
    if full_year > this_year + 50 {
        full_year -= 100;
    }
    let rebuilt = format!("{weekday}, {day} {month} {full_year} {time}");
    NaiveDateTime::parse_from_str(&rebuilt, "%A, %d %b %Y %H:%M:%S GMT")
        .ok()
        .map(|parsed| parsed.and_utc())
}

/// Percent-encodes a path segment or query value: everything but RFC 3986 unreserved characters.
pub fn encode_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// At most `limit` characters of `text`, with `…` when cut.
pub fn shorten(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeDelta, TimeZone};

    fn plus_seconds(now: DateTime<Utc>, seconds: i64) -> DateTime<Utc> {
        now + TimeDelta::seconds(seconds)
    }

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0)
            .single()
            .expect("a valid test time")
    }

    fn imf(time: DateTime<Utc>) -> String {
        time.format("%a, %d %b %Y %H:%M:%S GMT").to_string()
    }

    fn reply(status: u16, body: &str) -> HttpReply {
        HttpReply::new(status, body)
    }

    fn error_body(kind: &str) -> String {
        format!(r#"{{"error":{{"type":"{kind}","message":"told by the provider"}}}}"#)
    }

    fn rejected(code: &str) -> SendOutcome {
        SendOutcome::Rejected {
            code: code.to_owned(),
            message: "told by the provider".to_owned(),
        }
    }

    #[test]
    fn a_2xx_with_an_id_is_confirmed_with_the_request_id() {
        let mut created = reply(201, r#"{"id":"731"}"#);
        created.request_id = Some("req_1".to_owned());
        assert_eq!(
            classify_send(&created, now()),
            SendOutcome::Confirmed {
                external_id: ExternalObjectId::new("731").expect("valid"),
                provider_request_id: Some(ProviderRequestId::new("req_1").expect("valid")),
            }
        );
        let existing = reply(200, r#"{"id":"732","created":false}"#);
        assert!(matches!(
            classify_send(&existing, now()),
            SendOutcome::Confirmed { external_id, provider_request_id: None } if external_id.as_str() == "732"
        ));
        let numeric = reply(201, r#"{"id":733}"#);
        assert!(matches!(
            classify_send(&numeric, now()),
            SendOutcome::Confirmed { external_id, .. } if external_id.as_str() == "733"
        ));
    }

    #[test]
    fn a_2xx_that_names_no_object_is_uncertain_not_confirmed() {
        for body in [
            "",
            "{}",
            r#"{"id":""}"#,
            r#"{"id":null}"#,
            r#"{"id":1.5}"#,
            "not json",
        ] {
            assert!(
                matches!(
                    classify_send(&reply(201, body), now()),
                    SendOutcome::Uncertain { .. }
                ),
                "{body}"
            );
        }
        let mut cut = reply(201, r#"{"id":"731"}"#);
        cut.body_complete = false;
        assert!(matches!(
            classify_send(&cut, now()),
            SendOutcome::Uncertain { .. }
        ));
    }

    #[test]
    fn definitive_client_errors_are_rejections_with_status_and_type() {
        for (status, kind) in [
            (400, "idempotency_key_reused"),
            (400, "idempotency_key_missing"),
            (401, "unauthorized"),
            (403, "forbidden"),
            (404, "not_found"),
            (409, "label_conflict"),
            (413, "payload_too_large"),
            (422, "invalid_body"),
        ] {
            assert_eq!(
                classify_send(&reply(status, &error_body(kind)), now()),
                rejected(&format!("{status} {kind}"))
            );
        }
        assert_eq!(
            classify_send(&reply(401, ""), now()),
            SendOutcome::Rejected {
                code: "401".to_owned(),
                message: "(no body)".to_owned()
            }
        );
    }

    #[test]
    fn a_key_still_in_flight_is_not_sent_with_a_short_wait() {
        let in_flight = reply(409, &error_body("idempotency_in_flight"));
        assert!(matches!(
            classify_send(&in_flight, now()),
            SendOutcome::NotSent {
                retry_after_ms: Some(IN_FLIGHT_RETRY_AFTER_MS),
                ..
            }
        ));
        let mut with_header = in_flight;
        with_header.retry_after = Some("3".to_owned());
        assert!(matches!(
            classify_send(&with_header, now()),
            SendOutcome::NotSent {
                retry_after_ms: Some(3000),
                ..
            }
        ));
    }

    #[test]
    fn an_unknown_conflict_is_uncertain() {
        assert!(matches!(
            classify_send(&reply(409, &error_body("something_else")), now()),
            SendOutcome::Uncertain { .. }
        ));
        assert!(matches!(
            classify_send(&reply(409, ""), now()),
            SendOutcome::Uncertain { .. }
        ));
    }

    #[test]
    fn a_rate_limit_is_not_sent_with_the_asked_wait_in_both_forms() {
        let mut seconds = reply(429, &error_body("rate_limited"));
        seconds.retry_after = Some("30".to_owned());
        assert!(matches!(
            classify_send(&seconds, now()),
            SendOutcome::NotSent {
                retry_after_ms: Some(30_000),
                ..
            }
        ));

        // The date form is measured from the response's own Date header: the provider's clock
        // may be an hour off ours, and the wait is still 45 s.
        let provider_now = plus_seconds(now(), 3600);
        let mut date = reply(429, &error_body("rate_limited"));
        date.retry_after = Some(imf(plus_seconds(provider_now, 45)));
        date.date = Some(imf(provider_now));
        assert!(matches!(
            classify_send(&date, now()),
            SendOutcome::NotSent {
                retry_after_ms: Some(45_000),
                ..
            }
        ));

        let mut no_header = reply(429, "");
        no_header.retry_after = None;
        assert!(matches!(
            classify_send(&no_header, now()),
            SendOutcome::NotSent {
                retry_after_ms: None,
                ..
            }
        ));
    }

    #[test]
    fn server_errors_are_uncertain_and_keep_the_asked_wait() {
        for status in [500, 502, 503, 504] {
            let mut failed = reply(status, &error_body("internal"));
            assert!(matches!(
                classify_send(&failed, now()),
                SendOutcome::Uncertain {
                    retry_after_ms: None,
                    ..
                }
            ));
            failed.retry_after = Some("7".to_owned());
            assert!(matches!(
                classify_send(&failed, now()),
                SendOutcome::Uncertain {
                    retry_after_ms: Some(7000),
                    ..
                }
            ));
        }
    }

    #[test]
    fn unexpected_statuses_are_uncertain() {
        for status in [100, 302, 307, 402, 408, 410, 418, 451] {
            assert!(
                matches!(
                    classify_send(&reply(status, ""), now()),
                    SendOutcome::Uncertain { .. }
                ),
                "{status}"
            );
        }
    }

    #[test]
    fn retry_after_seconds_are_capped_and_garbage_is_ignored() {
        assert_eq!(parse_retry_after("0", None, now()), Some(0));
        assert_eq!(parse_retry_after(" 12 ", None, now()), Some(12_000));
        assert_eq!(
            parse_retry_after("601", None, now()),
            Some(MAX_RETRY_AFTER_MS)
        );
        assert_eq!(
            parse_retry_after("99999999999999999999999", None, now()),
            Some(MAX_RETRY_AFTER_MS)
        );
        for garbage in ["", "-5", "1.5", "soon", "12s"] {
            assert_eq!(parse_retry_after(garbage, None, now()), None, "{garbage}");
        }
    }

    #[test]
    fn a_retry_after_date_is_measured_from_the_date_header_else_from_now() {
        let later = imf(plus_seconds(now(), 90));
        assert_eq!(parse_retry_after(&later, None, now()), Some(90_000));
        let date = imf(plus_seconds(now(), 60));
        assert_eq!(parse_retry_after(&later, Some(&date), now()), Some(30_000));
        // An unreadable Date header falls back to now.
        assert_eq!(
            parse_retry_after(&later, Some("yesterday"), now()),
            Some(90_000)
        );
        // A date in the past means "now"; one far ahead is capped.
        let past = imf(plus_seconds(now(), -90));
        assert_eq!(parse_retry_after(&past, None, now()), Some(0));
        let far = imf(plus_seconds(now(), 86_400));
        assert_eq!(
            parse_retry_after(&far, None, now()),
            Some(MAX_RETRY_AFTER_MS)
        );
    }

    #[test]
    fn http_dates_parse_in_all_three_forms() {
        let expected = Utc
            .with_ymd_and_hms(1994, 11, 6, 8, 49, 37)
            .single()
            .expect("valid");
        for text in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(parse_http_date(text, now()), Some(expected), "{text}");
        }
        for garbage in [
            "",
            "Sun, 06 Nov 1994 08:49:37",
            "06 Nov 1994",
            "Sun, 32 Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(parse_http_date(garbage, now()), None, "{garbage}");
        }
    }

    #[test]
    fn an_rfc850_year_more_than_fifty_years_ahead_belongs_to_the_last_century() {
        let parsed = parse_http_date("Friday, 01-Mar-30 00:00:00 GMT", now()).expect("parses");
        assert_eq!(parsed.year(), 2030);
        let parsed = parse_http_date("Saturday, 01-Mar-80 00:00:00 GMT", now()).expect("parses");
        assert_eq!(parsed.year(), 1980);
    }

    #[test]
    fn transport_failures_map_to_not_sent_or_uncertain() {
        let nothing = TransportFailure::NothingSent {
            error: "connection refused".to_owned(),
        };
        assert!(matches!(
            nothing.clone().send_outcome(),
            SendOutcome::NotSent {
                retry_after_ms: None,
                ..
            }
        ));
        assert!(matches!(
            nothing.lookup_outcome("GET /x"),
            LookupOutcome::Unavailable { .. }
        ));
        let maybe = TransportFailure::MaybeSent {
            error: "operation timed out".to_owned(),
        };
        assert!(matches!(
            maybe.send_outcome(),
            SendOutcome::Uncertain {
                retry_after_ms: None,
                ..
            }
        ));
    }

    #[test]
    fn lookups_that_meet_errors_are_unavailable_with_the_asked_wait() {
        let mut limited = reply(429, "");
        limited.retry_after = Some("5".to_owned());
        assert!(matches!(
            unavailable_from_reply("GET /x", &limited, now()),
            LookupOutcome::Unavailable {
                retry_after_ms: Some(5000),
                ..
            }
        ));
        assert!(matches!(
            unavailable_from_reply("GET /x", &reply(503, ""), now()),
            LookupOutcome::Unavailable {
                retry_after_ms: None,
                ..
            }
        ));
    }

    #[test]
    fn lookups_refused_for_their_credentials_are_refused() {
        for status in [401, 403] {
            assert!(
                matches!(
                    unavailable_from_reply("GET /x", &reply(status, ""), now()),
                    LookupOutcome::Refused { reason } if reason.contains("GET /x")
                ),
                "{status}"
            );
        }
    }

    #[test]
    fn provider_messages_are_kept_short() {
        let long = "x".repeat(2 * MAX_MESSAGE_CHARS);
        let failed = reply(
            422,
            &format!(r#"{{"error":{{"type":"invalid_body","message":"{long}"}}}}"#),
        );
        let SendOutcome::Rejected { message, .. } = classify_send(&failed, now()) else {
            panic!("a 422 is a rejection");
        };
        assert_eq!(message.chars().count(), MAX_MESSAGE_CHARS + 1);
    }

    #[test]
    fn path_components_are_percent_encoded() {
        assert_eq!(encode_component("acct-1"), "acct-1");
        assert_eq!(encode_component("opl-6f1c.x_y~z"), "opl-6f1c.x_y~z");
        assert_eq!(encode_component("a/b c?d#e%"), "a%2Fb%20c%3Fd%23e%25");
        assert_eq!(encode_component("ü"), "%C3%BC");
    }
}
