//! The keyed shape (Stripe-style): `POST /keyed/{account}/tasks` with an `Idempotency-Key`, and
//! `GET /keyed/{account}/requests/{key}` to ask what became of a key.
//!
//! A repeated key with the same body replays the first response, so a retry inside the key's
//! retention names the object the first request created. The lookup is consistent, but only
//! while the provider still remembers the key: after the retention a 404 cannot tell "never
//! arrived" from "forgotten" (see the module docs of [`super`]).

use chrono::{DateTime, Utc};
use opledger_domain::provider::{LookupOutcome, LookupRequest, SendOutcome, SendRequest};
use reqwest::header::{HeaderName, HeaderValue};
use reqwest::Method;
use serde_json::Value;

use super::http::{
    encode_component, object_id, unavailable_from_reply, HttpReply, PreparedRequest,
    IN_FLIGHT_RETRY_AFTER_MS,
};
use super::json_body;

/// The header that carries the operation's key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// `POST /keyed/{account}/tasks` with the operation's key; the body is the arguments.
pub fn create(request: &SendRequest) -> Result<PreparedRequest, SendOutcome> {
    // Keys come from our own random source as `opk_<hex>`. A key that is not visible ASCII can
    // never be sent as it is (a header would carry raw bytes the provider may read differently),
    // so retrying would not help either.
    let key = request.idempotency_key.as_str();
    let key = key
        .bytes()
        .all(|byte| byte.is_ascii_graphic())
        .then(|| HeaderValue::from_str(key).ok())
        .flatten()
        .ok_or_else(|| SendOutcome::Rejected {
            code: "local invalid_idempotency_key".to_owned(),
            message: "the idempotency key holds characters other than visible ASCII, which a header cannot carry faithfully; nothing was sent".to_owned(),
        })?;
    Ok(PreparedRequest {
        method: Method::POST,
        path: format!(
            "/keyed/{}/tasks",
            encode_component(request.account.as_str())
        ),
        headers: vec![(HeaderName::from_static(IDEMPOTENCY_KEY_HEADER), key)],
        body: Some(json_body(request.args.as_map().clone())),
    })
}

/// `GET /keyed/{account}/requests/{key}`.
pub fn find(request: &LookupRequest) -> PreparedRequest {
    PreparedRequest {
        method: Method::GET,
        path: format!(
            "/keyed/{}/requests/{}",
            encode_component(request.account.as_str()),
            encode_component(request.idempotency_key.as_str())
        ),
        headers: Vec::new(),
        body: None,
    }
}

/// Reads the answer to [`find`]: completed → found, in progress → in progress (ask again soon), 404
/// `not_found` → not found (authoritative while the key is inside its retention).
pub fn classify_lookup(
    asked: &str,
    reply: &HttpReply,
    request: &LookupRequest,
    now: DateTime<Utc>,
) -> LookupOutcome {
    let note = reply.request_id_note();
    match reply.status {
        200 => {
            let json = reply.json().unwrap_or(Value::Null);
            match json.get("status").and_then(Value::as_str) {
                Some("completed") => match object_id(&json) {
                    Some(external_id) => LookupOutcome::Found {
                        evidence: format!("{asked} → 200 completed, id {external_id}{note}"),
                        external_id,
                        account: request.account.clone(),
                        duplicates: Vec::new(),
                    },
                    None => LookupOutcome::Unavailable {
                        reason: format!("{asked} → 200 completed{note}, but the body names no usable id"),
                        retry_after_ms: reply.retry_after_ms(now),
                    },
                },
                Some("in_progress") => LookupOutcome::InProgress {
                    evidence: format!(
                        "{asked} → 200 in_progress{note}: the first request with this key is still being processed"
                    ),
                    retry_after_ms: Some(
                        reply
                            .retry_after_ms(now)
                            .unwrap_or(IN_FLIGHT_RETRY_AFTER_MS),
                    ),
                },
                _ => LookupOutcome::Unavailable {
                    reason: format!("{asked} → 200{note} with an unexpected body: {}", reply.message()),
                    retry_after_ms: reply.retry_after_ms(now),
                },
            }
        }
        404 if reply.error_parts().0.as_deref() == Some("not_found") => LookupOutcome::NotFound {
            authoritative: true,
            evidence: format!(
                "{asked} → 404 not_found{note}: the provider holds no request with this key (conclusive only inside the key's retention)"
            ),
        },
        _ => unavailable_from_reply(asked, reply, now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{lookup_request, now, send_request};

    #[test]
    fn a_create_posts_the_arguments_with_the_operations_key() {
        let request = send_request("acct 1");
        let prepared = create(&request).expect("a valid key");
        assert_eq!(prepared.method, Method::POST);
        assert_eq!(prepared.path, "/keyed/acct%201/tasks");
        assert_eq!(prepared.headers.len(), 1);
        assert_eq!(prepared.headers[0].0.as_str(), "idempotency-key");
        assert_eq!(prepared.headers[0].1, request.idempotency_key.as_str());
        let body: Value = serde_json::from_slice(&prepared.body.expect("a body")).expect("json");
        assert_eq!(body, Value::Object(request.args.as_map().clone()));
    }

    #[test]
    fn a_key_that_cannot_be_a_header_is_refused_before_sending() {
        let mut request = send_request("acct-1");
        request.idempotency_key =
            opledger_domain::ids::IdempotencyKey::new("clé à molette").expect("a valid domain key");
        assert!(matches!(
            create(&request),
            Err(SendOutcome::Rejected { .. })
        ));
    }

    #[test]
    fn a_completed_key_is_found_in_the_requests_account() {
        let request = lookup_request("acct-1");
        let asked = find(&request).describe();
        let mut reply = HttpReply::new(200, r#"{"status":"completed","id":"731"}"#);
        reply.request_id = Some("req_9".to_owned());
        let LookupOutcome::Found {
            external_id,
            account,
            evidence,
            ..
        } = classify_lookup(&asked, &reply, &request, now())
        else {
            panic!("a completed key is found");
        };
        assert_eq!(external_id.as_str(), "731");
        assert_eq!(account, request.account);
        assert!(
            evidence.contains("GET /keyed/acct-1/requests/opk_"),
            "{evidence}"
        );
        assert!(
            evidence.contains("731") && evidence.contains("req_9"),
            "{evidence}"
        );
    }

    #[test]
    fn a_key_in_progress_is_in_progress_and_asks_for_a_short_wait() {
        let request = lookup_request("acct-1");
        let reply = HttpReply::new(200, r#"{"status":"in_progress"}"#);
        assert!(matches!(
            classify_lookup("GET x", &reply, &request, now()),
            LookupOutcome::InProgress {
                retry_after_ms: Some(IN_FLIGHT_RETRY_AFTER_MS),
                ..
            }
        ));
    }

    #[test]
    fn an_unknown_key_is_authoritatively_not_found_but_other_404s_prove_nothing() {
        let request = lookup_request("acct-1");
        let unknown = HttpReply::new(404, r#"{"error":{"type":"not_found","message":"no"}}"#);
        assert!(matches!(
            classify_lookup("GET x", &unknown, &request, now()),
            LookupOutcome::NotFound {
                authoritative: true,
                ..
            }
        ));
        let routing = HttpReply::new(404, "<html>nginx</html>");
        assert!(matches!(
            classify_lookup("GET x", &routing, &request, now()),
            LookupOutcome::Unavailable { .. }
        ));
    }

    #[test]
    fn errors_and_odd_bodies_make_the_lookup_unavailable() {
        let request = lookup_request("acct-1");
        for reply in [
            HttpReply::new(200, r#"{"status":"completed"}"#),
            HttpReply::new(200, r#"{"status":"exploded"}"#),
            HttpReply::new(500, ""),
            HttpReply::new(429, ""),
        ] {
            assert!(
                matches!(
                    classify_lookup("GET x", &reply, &request, now()),
                    LookupOutcome::Unavailable { .. }
                ),
                "{reply:?}"
            );
        }
    }

    #[test]
    fn a_lookup_refused_for_its_credentials_is_refused_not_unavailable() {
        let request = lookup_request("acct-1");
        for reply in [
            HttpReply::new(401, r#"{"error":{"type":"unauthorized","message":"no"}}"#),
            HttpReply::new(403, r#"{"error":{"type":"forbidden","message":"revoked"}}"#),
        ] {
            assert!(
                matches!(
                    classify_lookup("GET x", &reply, &request, now()),
                    LookupOutcome::Refused { reason } if reason.contains(&reply.status.to_string())
                ),
                "{reply:?}"
            );
        }
    }
}
