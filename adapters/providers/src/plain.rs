//! The plain shape (HubSpot tasks, Kommo, Bitrix24): `POST /plain/{account}/tasks` always creates,
//! with the operation's label in the custom field `opledger_label`; `GET
//! /plain/{account}/tasks/search?label=…` searches a lagging index.
//!
//! Nothing deduplicates here, so only the search can tell what became of an operation, and only
//! a result carrying exactly this operation's label in exactly this account counts: a task with
//! the same title is somebody's other task. An empty search proves nothing (the index lags, and
//! the first request may still be running), so "not found" is never authoritative.

use std::cmp::Ordering;

use chrono::{DateTime, Utc};
use opledger_domain::ids::ExternalObjectId;
use opledger_domain::provider::{LookupOutcome, LookupRequest, SendRequest};
use reqwest::Method;
use serde_json::Value;

use super::http::{
    encode_component, object_id, unavailable_from_reply, HttpReply, PreparedRequest,
};
use super::json_body;

/// The custom field that carries the operation's label.
pub const LABEL_FIELD: &str = "opledger_label";
/// Most matching ids named in one piece of evidence.
pub const MAX_IDS_IN_EVIDENCE: usize = 10;

/// `POST /plain/{account}/tasks`; the body is the arguments plus `opledger_label`.
///
/// The label field belongs to the adapter: a value the arguments bring under that name is
/// overwritten, since a caller-chosen label could make another operation's task look like ours.
pub fn create(request: &SendRequest) -> PreparedRequest {
    let mut fields = request.args.as_map().clone();
    fields.insert(LABEL_FIELD.to_owned(), Value::String(request.label.clone()));
    PreparedRequest {
        method: Method::POST,
        path: format!(
            "/plain/{}/tasks",
            encode_component(request.account.as_str())
        ),
        headers: Vec::new(),
        body: Some(json_body(fields)),
    }
}

/// `GET /plain/{account}/tasks/search?label={label}`.
pub fn find(request: &LookupRequest) -> PreparedRequest {
    PreparedRequest {
        method: Method::GET,
        path: format!(
            "/plain/{}/tasks/search?label={}",
            encode_component(request.account.as_str()),
            encode_component(&request.label)
        ),
        headers: Vec::new(),
        body: None,
    }
}

/// Reads the answer to [`find`]. Only results whose `opledger_label` equals the operation's label
/// and whose `account` equals the request's account count; the lowest matching id is the
/// operation's object, and any others are duplicates named in the evidence.
pub fn classify_lookup(
    asked: &str,
    reply: &HttpReply,
    request: &LookupRequest,
    lag_ms: u64,
    now: DateTime<Utc>,
) -> LookupOutcome {
    if reply.status != 200 {
        return unavailable_from_reply(asked, reply, now);
    }
    let note = reply.request_id_note();
    let json = reply.json();
    let Some(results) = json
        .as_ref()
        .and_then(|json| json.get("results"))
        .and_then(Value::as_array)
    else {
        return LookupOutcome::Unavailable {
            reason: format!("{asked} → 200{note} without a `results` list"),
            retry_after_ms: reply.retry_after_ms(now),
        };
    };
    let mut matching: Vec<ExternalObjectId> = results
        .iter()
        .filter(|result| {
            result.get(LABEL_FIELD).and_then(Value::as_str) == Some(request.label.as_str())
                && result.get("account").and_then(Value::as_str) == Some(request.account.as_str())
        })
        .filter_map(object_id)
        .collect();
    matching.sort_by(|a, b| id_order(a.as_str(), b.as_str()));
    matching.dedup();
    let total = results.len();
    let ignored = total - matching.len();
    let ignored_note = if ignored == 0 {
        String::new()
    } else {
        format!(" ({ignored} other result(s) ignored: another label or account)")
    };
    let Some(first) = matching.first().cloned() else {
        return LookupOutcome::NotFound {
            authoritative: false,
            evidence: format!(
                "{asked} → {total} result(s), none with this label in account {}{ignored_note}{note}; the index may lag by up to {lag_ms} ms, so this proves nothing",
                request.account
            ),
        };
    };
    let listed: Vec<&str> = matching
        .iter()
        .take(MAX_IDS_IN_EVIDENCE)
        .map(ExternalObjectId::as_str)
        .collect();
    let evidence = if matching.len() == 1 {
        format!("{asked} → 1 result: {first}{ignored_note}{note}")
    } else {
        format!(
            "{asked} → {} results carry this label: {}{}; {first} is the earliest, the others are DUPLICATES{ignored_note}{note}",
            matching.len(),
            listed.join(", "),
            if matching.len() > MAX_IDS_IN_EVIDENCE { ", …" } else { "" },
        )
    };
    LookupOutcome::Found {
        duplicates: matching[1..].to_vec(),
        external_id: first,
        account: request.account.clone(),
        evidence,
    }
}

/// Decimal ids in numeric order (shorter first, since ids carry no leading zeros), then any other
/// ids in text order.
fn id_order(a: &str, b: &str) -> Ordering {
    let decimal = |id: &str| id.bytes().all(|byte| byte.is_ascii_digit());
    match (decimal(a), decimal(b)) {
        (true, true) => a.len().cmp(&b.len()).then_with(|| a.cmp(b)),
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => a.cmp(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{lookup_request, now, send_request};
    use serde_json::json;

    fn search_reply(results: Value) -> HttpReply {
        HttpReply::new(200, &json!({ "results": results }).to_string())
    }

    #[test]
    fn a_create_adds_the_label_to_the_arguments_and_overrides_a_forged_one() {
        let mut request = send_request("acct-1");
        request.args = opledger_domain::args::ArgsSnapshot::new(
            json!({"title": "Call the client", "opledger_label": "opl-someone-else"}),
        )
        .expect("valid args");
        let prepared = create(&request);
        assert_eq!(prepared.method, Method::POST);
        assert_eq!(prepared.path, "/plain/acct-1/tasks");
        let body: Value = serde_json::from_slice(&prepared.body.expect("a body")).expect("json");
        assert_eq!(
            body,
            json!({"title": "Call the client", "opledger_label": request.label})
        );
    }

    #[test]
    fn the_search_path_encodes_the_label_as_a_query_value() {
        let mut request = lookup_request("acct-1");
        request.label = "opl-a&b=c".to_owned();
        assert_eq!(
            find(&request).path,
            "/plain/acct-1/tasks/search?label=opl-a%26b%3Dc"
        );
    }

    #[test]
    fn only_the_exact_label_in_the_same_account_is_evidence() {
        let request = lookup_request("acct-1");
        let label = request.label.clone();
        let reply = search_reply(json!([
            {"id": "731", "opledger_label": format!("{label}-other"), "account": "acct-1", "title": "Call the client"},
            {"id": "732", "opledger_label": label, "account": "acct-2"},
            {"id": "733", "title": "Call the client", "account": "acct-1"},
            {"id": "734", "opledger_label": label.to_uppercase(), "account": "acct-1"},
        ]));
        let outcome = classify_lookup("GET /s", &reply, &request, 2000, now());
        let LookupOutcome::NotFound {
            authoritative,
            evidence,
        } = outcome
        else {
            panic!("no result matches: {outcome:?}");
        };
        assert!(!authoritative, "an empty search proves nothing");
        assert!(evidence.contains("4 other result(s) ignored"), "{evidence}");
    }

    #[test]
    fn an_empty_search_is_not_authoritative() {
        let request = lookup_request("acct-1");
        assert!(matches!(
            classify_lookup("GET /s", &search_reply(json!([])), &request, 2000, now()),
            LookupOutcome::NotFound {
                authoritative: false,
                ..
            }
        ));
    }

    #[test]
    fn one_match_is_found_with_a_short_evidence_line() {
        let request = lookup_request("acct-1");
        let reply = search_reply(json!([
            {"id": "733", "opledger_label": request.label, "account": "acct-1"},
        ]));
        assert_eq!(
            classify_lookup(
                "GET /plain/acct-1/tasks/search?label=x",
                &reply,
                &request,
                2000,
                now()
            ),
            LookupOutcome::Found {
                duplicates: Vec::new(),
                external_id: ExternalObjectId::new("733").expect("valid"),
                account: request.account.clone(),
                evidence: "GET /plain/acct-1/tasks/search?label=x → 1 result: 733".to_owned(),
            }
        );
    }

    #[test]
    fn with_duplicates_the_lowest_id_wins_and_the_others_are_named() {
        let request = lookup_request("acct-1");
        let reply = search_reply(json!([
            {"id": "1000", "opledger_label": request.label, "account": "acct-1"},
            {"id": "999", "opledger_label": request.label, "account": "acct-1"},
            {"id": 998, "opledger_label": request.label, "account": "acct-1"},
        ]));
        let LookupOutcome::Found {
            external_id,
            evidence,
            ..
        } = classify_lookup("GET /s", &reply, &request, 2000, now())
        else {
            panic!("found");
        };
        assert_eq!(external_id.as_str(), "998");
        assert!(evidence.contains("998, 999, 1000"), "{evidence}");
        assert!(evidence.contains("DUPLICATES"), "{evidence}");
    }

    #[test]
    fn a_malformed_or_failed_search_is_unavailable() {
        let request = lookup_request("acct-1");
        for reply in [
            HttpReply::new(200, "{}"),
            HttpReply::new(200, "[]"),
            HttpReply::new(503, ""),
            HttpReply::new(404, r#"{"error":{"type":"not_found","message":"?"}}"#),
        ] {
            assert!(
                matches!(
                    classify_lookup("GET /s", &reply, &request, 2000, now()),
                    LookupOutcome::Unavailable { .. }
                ),
                "{reply:?}"
            );
        }
    }

    #[test]
    fn decimal_ids_sort_numerically_before_other_ids() {
        let mut ids = vec!["b", "1000", "999", "a", "73"];
        ids.sort_by(|a, b| id_order(a, b));
        assert_eq!(ids, vec!["73", "999", "1000", "a", "b"]);
    }
}
