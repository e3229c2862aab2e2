//! One delivery attempt over HTTP: the signed request, and what its answer means.
//!
//! The client never follows a redirect (a 3xx is a failed attempt: only configured URLs are
//! requested), reads at most [`MAX_RESPONSE_BODY_BYTES`] of an answer (kept for the attempt log),
//! gives up after the endpoint's request timeout ([`DEFAULT_REQUEST_TIMEOUT_MS`] by default), and resolves names through a resolver that drops
//! private and link-local addresses unless the endpoint allows them (see `endpoint.rs`), so a
//! public name that resolves to 10.0.0.1 or 169.254.169.254 is not reached.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};

use crate::endpoint::{is_private, Endpoint};
use crate::schedule::parse_retry_after;
use crate::signing::signature_header;
use crate::WebhookError;

/// The longest one attempt may take, from connecting to the end of the answer, in milliseconds,
/// unless the endpoint says otherwise (Svix's figure: a receiver that needs longer should answer
/// first and work after).
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 15_000;
/// The shortest request timeout an endpoint may set, in milliseconds.
pub const MIN_REQUEST_TIMEOUT_MS: u64 = 100;
/// The longest request timeout an endpoint may set, in milliseconds.
pub const MAX_REQUEST_TIMEOUT_MS: u64 = 60_000;
/// The longest connecting may take, in milliseconds (less when the request timeout is shorter).
pub const CONNECT_TIMEOUT_MS: u64 = 5_000;
const _: () = assert!(MIN_REQUEST_TIMEOUT_MS <= DEFAULT_REQUEST_TIMEOUT_MS);
const _: () = assert!(DEFAULT_REQUEST_TIMEOUT_MS <= MAX_REQUEST_TIMEOUT_MS);
/// Most bytes of an answer read (the rest is dropped with the connection), for the attempt log.
pub const MAX_RESPONSE_BODY_BYTES: usize = 4_096;
const _: () = assert!(CONNECT_TIMEOUT_MS <= DEFAULT_REQUEST_TIMEOUT_MS);

/// What one attempt came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A 2xx: the receiver has it.
    Delivered {
        /// The status.
        status: u16,
    },
    /// 410 Gone: the receiver asks never to be sent anything again.
    Gone,
    /// Anything else: retried.
    Failed {
        /// The status, when there was an answer.
        status: Option<u16>,
        /// What went wrong, in a sentence.
        error: String,
        /// When the receiver asked to be retried (`Retry-After`).
        retry_after: Option<Duration>,
    },
}

/// One attempt's answer and how long it took.
pub struct Attempted {
    /// What it came to.
    pub answer: Answer,
    /// How long it took.
    pub duration: Duration,
}

/// The HTTP client of one endpoint.
pub fn client_for(endpoint: &Endpoint) -> Result<reqwest::Client, WebhookError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_millis(endpoint.request_timeout_ms))
        .connect_timeout(Duration::from_millis(
            CONNECT_TIMEOUT_MS.min(endpoint.request_timeout_ms),
        ))
        .dns_resolver(std::sync::Arc::new(GuardedResolver {
            allow_private_network: endpoint.allow_private_network,
        }))
        // Never through a proxy from the environment (`HTTPS_PROXY`, …): the proxy would
        // resolve the endpoint's name itself, past the guard above, and a private address
        // the configuration does not allow would be reached all the same.
        .no_proxy()
        .build()
        .map_err(|error| WebhookError::Client {
            reason: error.to_string(),
        })
}

/// Sends `body` to the endpoint, signed now, as the delivery `webhook_id`.
pub async fn attempt(
    client: &reqwest::Client,
    endpoint: &Endpoint,
    webhook_id: &str,
    body: &[u8],
    traceparent: Option<&str>,
) -> Attempted {
    let timestamp = chrono::Utc::now().timestamp();
    let signature = signature_header(&endpoint.secrets, webhook_id, timestamp, body);
    let started = Instant::now();
    let sent = match request(
        endpoint,
        webhook_id,
        timestamp,
        signature,
        body,
        traceparent,
    ) {
        Ok(request) => client.execute(request).await,
        Err(error) => {
            return Attempted {
                answer: Answer::Failed {
                    status: None,
                    error: format!("failed: the request could not be built: {error}"),
                    retry_after: None,
                },
                duration: started.elapsed(),
            }
        }
    };
    let answer = match sent {
        Ok(response) => answer_of(response).await,
        Err(error) => Answer::Failed {
            status: None,
            error: transport_error(&error),
            retry_after: None,
        },
    };
    Attempted {
        answer,
        duration: started.elapsed(),
    }
}

/// The signed POST of one attempt, put together directly: `RequestBuilder` parsed the three
/// header names from text and formatted the timestamp into a `String` at every attempt.
fn request(
    endpoint: &Endpoint,
    webhook_id: &str,
    timestamp: i64,
    signature: String,
    body: &[u8],
    traceparent: Option<&str>,
) -> Result<reqwest::Request, reqwest::header::InvalidHeaderValue> {
    let mut request = reqwest::Request::new(reqwest::Method::POST, endpoint.url.clone());
    let headers = request.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(USER_AGENT, HeaderValue::from_static("opledger-webhooks/1"));
    headers.insert(WEBHOOK_ID, HeaderValue::from_str(webhook_id)?);
    headers.insert(WEBHOOK_TIMESTAMP, HeaderValue::from(timestamp));
    headers.insert(WEBHOOK_SIGNATURE, HeaderValue::try_from(signature)?);
    // The delivery's own span, in the operation's trace: a receiver that traces joins it.
    if let Some(traceparent) = traceparent {
        headers.insert(TRACEPARENT, HeaderValue::from_str(traceparent)?);
    }
    *request.body_mut() = Some(body.to_vec().into());
    Ok(request)
}

const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
const WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
const WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

async fn answer_of(mut response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    if response.status().is_success() {
        return Answer::Delivered { status };
    }
    if status == 410 {
        return Answer::Gone;
    }
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| parse_retry_after(value, chrono::Utc::now()));
    let mut body = Vec::new();
    while body.len() < MAX_RESPONSE_BODY_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(MAX_RESPONSE_BODY_BYTES);
    let text = String::from_utf8_lossy(&body);
    let why = if response.status().is_redirection() {
        " (redirects are not followed; configure the final URL)"
    } else {
        ""
    };
    Answer::Failed {
        status: Some(status),
        error: format!("answered {status}{why}: {}", text.trim()),
        retry_after,
    }
}

fn transport_error(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    // reqwest's own message is generic; the innermost cause says what happened.
    let mut cause: &dyn std::error::Error = error;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    format!("{kind}: {cause}")
}

/// The addresses `host` resolved to that a delivery may reach: all of them when the endpoint
/// allows private networks; otherwise the public ones, and loopback for `localhost` (loopback
/// written as such, which the configuration check admits). None left is an error that says why.
fn admitted(
    host: &str,
    resolved: impl Iterator<Item = SocketAddr>,
    allow_private_network: bool,
) -> Result<Vec<SocketAddr>, Box<dyn std::error::Error + Send + Sync>> {
    let loopback_name = host.eq_ignore_ascii_case("localhost");
    let found: Vec<SocketAddr> = resolved
        .filter(|address| {
            allow_private_network
                || !is_private(address.ip())
                || (loopback_name && address.ip().is_loopback())
        })
        .collect();
    if found.is_empty() {
        return Err(format!(
            "`{host}` resolves only to private or link-local addresses, which are refused (SSRF) unless the endpoint says allow_private_network = true"
        )
        .into());
    }
    Ok(found)
}

/// Resolves names, then drops private and link-local addresses unless the endpoint allows them.
struct GuardedResolver {
    allow_private_network: bool,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private_network = self.allow_private_network;
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let resolved = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let found = admitted(&host, resolved, allow_private_network)?;
            let addresses: Addrs = Box::new(found.into_iter());
            Ok(addresses)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addresses(list: &[&str]) -> std::vec::IntoIter<SocketAddr> {
        list.iter()
            .map(|ip| SocketAddr::new(ip.parse().expect("an address"), 443))
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn a_public_name_resolving_to_private_addresses_is_refused_unless_allowed() {
        let metadata = addresses(&["169.254.169.254", "10.0.0.7"]);
        let refused = admitted("hooks.example.com", metadata.clone(), false).expect_err("refused");
        assert!(
            refused.to_string().contains("allow_private_network"),
            "{refused}"
        );
        assert_eq!(
            admitted("hooks.example.com", metadata, true)
                .expect("allowed")
                .len(),
            2
        );
        let rebinding = addresses(&["127.0.0.1"]);
        assert!(admitted("hooks.example.com", rebinding.clone(), false).is_err());
        assert!(admitted("localhost", rebinding, false).is_ok());
    }

    #[test]
    fn only_the_public_addresses_of_a_mixed_answer_are_kept() {
        let mixed = addresses(&["10.0.0.7", "93.184.215.14"]);
        let kept = admitted("hooks.example.com", mixed, false).expect("one is public");
        assert_eq!(
            kept,
            vec![SocketAddr::new("93.184.215.14".parse().expect("ip"), 443)]
        );
    }
}
