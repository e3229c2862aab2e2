//! The labelled shape (Salesforce External ID upsert): `PUT /labelled/{account}/tasks/by-label/{label}`
//! creates the task or answers with the one that already holds the label, and
//! `GET` on the same path looks it up.
//!
//! The provider enforces the label's uniqueness atomically, so a retry can never make a second
//! object, and a 404 from the lookup is conclusive forever (labels do not expire).

use chrono::{DateTime, Utc};
use opledger_domain::provider::{LookupOutcome, LookupRequest, SendRequest};
use reqwest::Method;

use super::http::{
    encode_component, object_id, unavailable_from_reply, HttpReply, PreparedRequest,
};
use super::json_body;

fn by_label_path(account: &str, label: &str) -> String {
    format!(
        "/labelled/{}/tasks/by-label/{}",
        encode_component(account),
        encode_component(label)
    )
}

/// `PUT /labelled/{account}/tasks/by-label/{label}`; the body is the arguments.
pub fn create(request: &SendRequest) -> PreparedRequest {
    PreparedRequest {
        method: Method::PUT,
        path: by_label_path(request.account.as_str(), &request.label),
        headers: Vec::new(),
        body: Some(json_body(request.args.as_map().clone())),
    }
}

/// `GET /labelled/{account}/tasks/by-label/{label}`.
pub fn find(request: &LookupRequest) -> PreparedRequest {
    PreparedRequest {
        method: Method::GET,
        path: by_label_path(request.account.as_str(), &request.label),
        headers: Vec::new(),
        body: None,
    }
}

/// Reads the answer to [`find`]: 200 with an id → found, 404 `not_found` → authoritatively not found.
pub fn classify_lookup(
    asked: &str,
    reply: &HttpReply,
    request: &LookupRequest,
    now: DateTime<Utc>,
) -> LookupOutcome {
    let note = reply.request_id_note();
    match reply.status {
        200 => match reply.json().as_ref().and_then(object_id) {
            Some(external_id) => LookupOutcome::Found {
                evidence: format!("{asked} → 200, id {external_id}{note}"),
                external_id,
                account: request.account.clone(),
                duplicates: Vec::new(),
            },
            None => LookupOutcome::Unavailable {
                reason: format!("{asked} → 200{note}, but the body names no usable id"),
                retry_after_ms: reply.retry_after_ms(now),
            },
        },
        404 if reply.error_parts().0.as_deref() == Some("not_found") => LookupOutcome::NotFound {
            authoritative: true,
            evidence: format!(
                "{asked} → 404 not_found{note}: no task holds this label in the account"
            ),
        },
        _ => unavailable_from_reply(asked, reply, now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{lookup_request, now, send_request};
    use serde_json::Value;

    #[test]
    fn a_create_puts_the_arguments_under_the_operation_label() {
        let request = send_request("acct-1");
        let prepared = create(&request);
        assert_eq!(prepared.method, Method::PUT);
        assert_eq!(
            prepared.path,
            format!("/labelled/acct-1/tasks/by-label/{}", request.label)
        );
        assert!(prepared.headers.is_empty());
        let body: Value = serde_json::from_slice(&prepared.body.expect("a body")).expect("json");
        assert_eq!(body, Value::Object(request.args.as_map().clone()));
    }

    #[test]
    fn a_label_that_holds_a_task_is_found_and_a_missing_one_is_conclusively_absent() {
        let request = lookup_request("acct-1");
        let asked = find(&request).describe();
        assert!(matches!(
            classify_lookup(&asked, &HttpReply::new(200, r#"{"id":"732"}"#), &request, now()),
            LookupOutcome::Found { external_id, account, .. }
                if external_id.as_str() == "732" && account == request.account
        ));
        let missing = HttpReply::new(404, r#"{"error":{"type":"not_found","message":"none"}}"#);
        assert!(matches!(
            classify_lookup(&asked, &missing, &request, now()),
            LookupOutcome::NotFound {
                authoritative: true,
                ..
            }
        ));
    }

    #[test]
    fn errors_make_the_lookup_unavailable() {
        let request = lookup_request("acct-1");
        for reply in [
            HttpReply::new(200, "{}"),
            HttpReply::new(404, ""),
            HttpReply::new(502, ""),
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
}
