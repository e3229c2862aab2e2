//! The HTTP layer every connector shares: the reqwest client, one bounded request/response
//! exchange, and the pure helpers that read what came back (Retry-After, HTTP dates).
//!
//! The network part ([`send`]) only collects facts: either an [`HttpReply`] (status, headers, a
//! size-capped body) or a [`TransportFailure`] that says whether the request can have left this
//! process. Everything that *decides* lives in [`crate::classify`] and [`crate::lookup`] and is a
//! pure function of those facts and `now`, tested without a network. Nothing here may put a
//! secret into a message.

use std::error::Error as _;
use std::time::Duration;

use chrono::{DateTime, Datelike, NaiveDateTime, Utc};
use opledger_domain::in_span::InSpanExt;
use opledger_domain::provider::{LookupOutcome, SendOutcome};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::Method;
use serde_json::Value;

/// Largest response body read, in bytes; a longer body counts as unreadable.
pub const MAX_RESPONSE_BODY_BYTES: usize = 256 * 1024;
/// Longest wait a provider may ask for (Retry-After, a rate-limit reset), in milliseconds; longer
/// asks are capped. The engine owns it: it is the longest pause it schedules on a provider's word.
pub use opledger_domain::engine::MAX_RETRY_AFTER_MS;
/// The wait suggested when the provider says the same key is still being processed and gives
/// no Retry-After, in milliseconds.
pub const IN_FLIGHT_RETRY_AFTER_MS: u64 = 1_000;
/// Longest provider message kept in an outcome, in characters.
pub const MAX_MESSAGE_CHARS: usize = 500;
/// Longest header value kept from a response, in characters.
pub const MAX_HEADER_CHARS: usize = 200;
/// How long an idle pooled connection is kept, in milliseconds. Below the 5 s keep-alive of many
/// servers, so a send rarely goes out on a connection the server is just closing: such a send
/// fails after it was written and can only be classified as uncertain.
pub const POOL_IDLE_TIMEOUT_MS: u64 = 4_000;

/// What the response said: its status, its headers and a size-capped body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpReply {
    /// The status code.
    pub status: u16,
    /// The response headers.
    pub headers: HeaderMap,
    /// The body, at most [`MAX_RESPONSE_BODY_BYTES`].
    pub body: Vec<u8>,
    /// False when the body was longer than the cap and was cut off.
    pub body_complete: bool,
}

impl HttpReply {
    /// A reply with a status and a body and no headers (tests add them with [`HttpReply::with_header`]).
    pub fn new(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: HeaderMap::new(),
            body: body.as_bytes().to_vec(),
            body_complete: true,
        }
    }

    /// The same reply with one more header (tests).
    pub fn with_header(mut self, name: &'static str, value: &str) -> Self {
        if let Ok(value) = HeaderValue::from_str(value) {
            self.headers.append(HeaderName::from_static(name), value);
        }
        self
    }

    /// A header's value as text (trimmed, at most [`MAX_HEADER_CHARS`]), when present and text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(|value| shorten(value.trim(), MAX_HEADER_CHARS))
    }

    /// The body as JSON, when it is complete and valid JSON.
    pub fn json(&self) -> Option<Value> {
        if !self.body_complete {
            return None;
        }
        serde_json::from_slice(&self.body).ok()
    }

    /// A short piece of the body for a message: its text, or `(no body)`.
    pub fn body_excerpt(&self) -> String {
        let text = String::from_utf8_lossy(&self.body);
        let text = text.trim();
        if text.is_empty() {
            "(no body)".to_owned()
        } else {
            shorten(text, MAX_MESSAGE_CHARS)
        }
    }

    /// The wait the provider asked for with `Retry-After`, in milliseconds, capped at
    /// [`MAX_RETRY_AFTER_MS`].
    pub fn retry_after_ms(&self, now: DateTime<Utc>) -> Option<u64> {
        let value = self.header("retry-after")?;
        parse_retry_after(&value, self.header("date").as_deref(), now)
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
    /// The method.
    pub method: Method,
    /// The path and query, starting with `/`, every value already percent-encoded.
    pub path: String,
    /// Headers the connector adds (the idempotency key, templated headers).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body and its content type, if any.
    pub body: Option<(Vec<u8>, &'static str)>,
    /// The path as the request's span shows it, when `path` carries the operation's idempotency
    /// key (a lookup by key): the key written `{key}` instead. Spans never carry keys.
    pub shown_path: Option<String>,
}

impl PreparedRequest {
    /// `GET /path`, for evidence and logs.
    pub fn describe(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// Builds the client one connector uses: its timeouts, no redirects, no proxies.
///
/// Redirects are off because a redirected POST may be replayed elsewhere; proxies from the
/// environment are ignored because a proxy answers 502 for a host it could not reach, hiding a
/// provably unsent request behind an uncertain one.
pub fn build_client(
    request_timeout_ms: u64,
    connect_timeout_ms: u64,
) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .timeout(Duration::from_millis(request_timeout_ms))
        .connect_timeout(Duration::from_millis(connect_timeout_ms))
        .pool_idle_timeout(Duration::from_millis(POOL_IDLE_TIMEOUT_MS))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .user_agent(concat!("opledger/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|error| {
            format!(
                "the HTTP client could not be built: {}",
                error_chain(&error)
            )
        })
}

/// Sends one request with the credential header `auth` and reads the response, its body capped
/// at [`MAX_RESPONSE_BODY_BYTES`].
pub async fn send(
    client: &reqwest::Client,
    base_url: &str,
    auth: (&HeaderName, &HeaderValue),
    request: &PreparedRequest,
) -> Result<HttpReply, TransportFailure> {
    let url = format!("{base_url}{}", request.path);
    let shown = request
        .shown_path
        .as_ref()
        .map(|shown| format!("{base_url}{shown}"));
    send_shown(client, &url, shown.as_deref(), Some(auth), request).await
}

/// Sends `request` to `url` (its path is already in it), with the credential header `auth` if
/// any (an OAuth2 token request authenticates in its body).
pub async fn send_to(
    client: &reqwest::Client,
    url: &str,
    auth: Option<(&HeaderName, &HeaderValue)>,
    request: &PreparedRequest,
) -> Result<HttpReply, TransportFailure> {
    send_shown(client, url, None, auth, request).await
}

/// [`send_to`], its span showing `shown` (the URL with the key written `{key}`) when given.
async fn send_shown(
    client: &reqwest::Client,
    url: &str,
    shown: Option<&str>,
    auth: Option<(&HeaderName, &HeaderValue)>,
    request: &PreparedRequest,
) -> Result<HttpReply, TransportFailure> {
    // Parsed once, here: the span takes its `server.address` and `server.port` from it and
    // reqwest takes it as it is (a `&str` would be parsed again, IDNA and all, ~1 µs a request).
    // One that does not parse goes to reqwest as text, to fail there as it always has.
    let parsed = reqwest::Url::parse(url).ok();
    let span = client_span(
        request.method.as_str(),
        shown.unwrap_or(url),
        parsed.as_ref(),
    );
    let mut builder = match parsed {
        Some(parsed) => client.request(request.method.clone(), parsed),
        None => client.request(request.method.clone(), url),
    }
    .header(reqwest::header::ACCEPT, "application/json");
    if let Some((name, value)) = auth {
        builder = builder.header(name, value.clone());
    }
    for (name, value) in &request.headers {
        builder = builder.header(name, value);
    }
    if let Some((body, content_type)) = &request.body {
        builder = builder
            .header(CONTENT_TYPE, *content_type)
            .body(body.clone());
    }
    // The provider's own tracing (where it has any) joins the caller's trace through it.
    if let Some(traceparent) = opledger_domain::trace_context::traceparent_of(&span) {
        builder = builder.header("traceparent", traceparent);
    }
    let response = builder
        .send()
        .in_span(span.clone())
        .await
        .map_err(|error| failed(&span, TransportFailure::from_reqwest(&error)))?;
    span.record("http.response.status_code", response.status().as_u16());
    read_reply(response)
        .in_span(span.clone())
        .await
        .map_err(|failure| failed(&span, failure))
}

/// Records on `span` how the request failed (`error.type`, by the classification's two kinds).
fn failed(span: &tracing::Span, failure: TransportFailure) -> TransportFailure {
    let kind = match &failure {
        TransportFailure::NothingSent { .. } => "nothing_sent",
        TransportFailure::MaybeSent { .. } => "maybe_sent",
    };
    span.record("error.type", kind);
    // The HTTP client conventions: a request that got no answer is a failed span.
    span.record("otel.status_code", "ERROR");
    failure
}

/// The span of one request to a provider, with OpenTelemetry's HTTP client conventions. The
/// URL is recorded without its query, where an API may want a key; headers (the credential, the
/// idempotency key) and bodies (the arguments) never are. `parsed` is `url` parsed, if it parses.
fn client_span(method: &str, url: &str, parsed: Option<&reqwest::Url>) -> tracing::Span {
    let span = tracing::info_span!(
        "provider_http",
        otel.name = method,
        otel.kind = "client",
        http.request.method = method,
        server.address = tracing::field::Empty,
        server.port = tracing::field::Empty,
        url.full = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    if !span.is_disabled() {
        let without_query = url.split(['?', '#']).next().unwrap_or_default();
        span.record("url.full", without_query);
        // The host and port are the same with the query as without it.
        if let Some(url) = parsed {
            if let Some(host) = url.host_str() {
                span.record("server.address", host);
            }
            if let Some(port) = url.port_or_known_default() {
                span.record("server.port", port);
            }
        }
    }
    span
}

/// Reads the status, headers and at most [`MAX_RESPONSE_BODY_BYTES`] of the body.
async fn read_reply(mut response: reqwest::Response) -> Result<HttpReply, TransportFailure> {
    let status = response.status().as_u16();
    let mut reply = HttpReply {
        status,
        headers: response.headers().clone(),
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

    #[test]
    fn a_reply_reads_retry_after_against_its_own_date_header() {
        let provider_now = plus_seconds(now(), 3600);
        let reply = HttpReply::new(429, "")
            .with_header("retry-after", &imf(plus_seconds(provider_now, 45)))
            .with_header("date", &imf(provider_now));
        assert_eq!(reply.retry_after_ms(now()), Some(45_000));
        assert_eq!(HttpReply::new(429, "").retry_after_ms(now()), None);
        let long = "x".repeat(2 * MAX_HEADER_CHARS);
        let reply = HttpReply::new(200, "").with_header("x-long", &long);
        assert_eq!(
            reply.header("x-long").map(|text| text.chars().count()),
            Some(MAX_HEADER_CHARS + 1)
        );
    }

    #[test]
    fn a_body_excerpt_is_short_or_says_there_is_none() {
        assert_eq!(HttpReply::new(500, "  ").body_excerpt(), "(no body)");
        let long = "y".repeat(2 * MAX_MESSAGE_CHARS);
        assert_eq!(
            HttpReply::new(500, &long).body_excerpt().chars().count(),
            MAX_MESSAGE_CHARS + 1
        );
        let mut cut = HttpReply::new(200, r#"{"id":"1"}"#);
        cut.body_complete = false;
        assert_eq!(cut.json(), None);
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
    fn path_components_are_percent_encoded() {
        assert_eq!(encode_component("acct-1"), "acct-1");
        assert_eq!(encode_component("opl-6f1c.x_y~z"), "opl-6f1c.x_y~z");
        assert_eq!(encode_component("a/b c?d#e%"), "a%2Fb%20c%3Fd%23e%25");
        assert_eq!(encode_component("ü"), "%C3%BC");
    }
}
