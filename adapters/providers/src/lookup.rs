//! How an answer to a lookup becomes evidence. Pure functions of the reply and `now`.
//!
//! A consistent lookup (by key, by label) reads the answer against the connector's `found`,
//! `in_progress` and `not_found` shapes. A search counts only results that carry exactly this
//! operation's label (and this account, when the results name one): a task with the same title is
//! somebody's other task. An empty search proves nothing (the index lags, and the first request
//! may still be running), so its "not found" is never authoritative. Several matches are all this
//! operation's: the lowest id is taken as the object, the others are named as duplicates.

use std::cmp::Ordering;

use chrono::{DateTime, Utc};
use opledger_domain::ids::{AccountId, ExternalObjectId};
use opledger_domain::provider::LookupOutcome;
use serde_json::Value;

use crate::classify::{object_id_at, text_at, Reading};
use crate::document::{ConsistentLookup, Expect, LookupBy, Means, SearchLookup};
use crate::http::{HttpReply, IN_FLIGHT_RETRY_AFTER_MS};
use crate::pointer::any_text_is;

/// Most matching ids named in one piece of evidence.
pub const MAX_IDS_IN_EVIDENCE: usize = 10;

/// What is being looked up, for evidence.
#[derive(Clone, Copy, Debug)]
pub struct Asked<'a> {
    /// `GET /path`, as sent.
    pub request: &'a str,
    /// The operation's label.
    pub label: &'a str,
    /// The account looked in.
    pub account: &'a AccountId,
}

fn found(
    external_id: ExternalObjectId,
    account: &AccountId,
    evidence: String,
    duplicates: Vec<ExternalObjectId>,
) -> LookupOutcome {
    LookupOutcome::Found {
        external_id,
        account: account.clone(),
        evidence,
        duplicates,
    }
}

/// Whether the reply is the expected answer: its status and, when given, the value at `at`.
fn matches(expect: &Expect, reply: &HttpReply, json: Option<&Value>) -> bool {
    if reply.status != expect.status {
        return false;
    }
    match (&expect.at, &expect.equals) {
        (Some(at), Some(equals)) => {
            let wanted = match equals {
                Value::String(text) => Some(text.clone()),
                other => Some(other.to_string()),
            };
            json.and_then(|json| text_at(json, at)) == wanted
        }
        _ => true,
    }
}

/// ` completed` — the matched value, for evidence.
fn shown(expect: &Expect) -> String {
    match &expect.equals {
        Some(Value::String(text)) => format!(" {text}"),
        Some(other) => format!(" {other}"),
        None => String::new(),
    }
}

/// A rule of the connector that says this answer processed nothing (a rate limit in disguise):
/// no evidence yet, ask again after the wait.
fn by_rule(
    reading: &Reading,
    asked: &Asked<'_>,
    reply: &HttpReply,
    now: DateTime<Utc>,
) -> Option<LookupOutcome> {
    let rule = reading.rule(reply)?;
    if rule.means == Means::Rejected {
        return None;
    }
    Some(LookupOutcome::Unavailable {
        reason: format!(
            "{} → {}: {}",
            asked.request,
            reading.status_code(reply),
            reading.message(reply)
        ),
        retry_after_ms: reading.wait_ms(reply, now, rule.retry_after_ms),
    })
}

/// Reads the answer to a consistent lookup.
pub fn classify_consistent(
    spec: &ConsistentLookup,
    reading: &Reading,
    asked: &Asked<'_>,
    reply: &HttpReply,
    now: DateTime<Utc>,
) -> LookupOutcome {
    if let Some(outcome) = by_rule(reading, asked, reply, now) {
        return outcome;
    }
    let json = reply.json();
    let note = reading.request_id_note(reply);
    let request = asked.request;
    if let Some(in_progress) = spec
        .in_progress
        .as_ref()
        .filter(|expect| matches(expect, reply, json.as_ref()))
    {
        return LookupOutcome::InProgress {
            evidence: format!(
                "{request} → {}{}{note}: the first request is still being processed",
                reply.status,
                shown(in_progress)
            ),
            retry_after_ms: reading.wait_ms(reply, now, Some(IN_FLIGHT_RETRY_AFTER_MS)),
        };
    }
    if matches(&spec.found, reply, json.as_ref()) {
        return found_answer(spec, reading, asked, reply, json.as_ref(), now);
    }
    if matches(&spec.not_found, reply, json.as_ref()) {
        let what = match spec.by {
            LookupBy::Key => "request with this key (conclusive only inside the key's retention)",
            LookupBy::Label => "object with this label in the account",
        };
        return LookupOutcome::NotFound {
            authoritative: true,
            evidence: format!(
                "{request} → {}{}{note}: the provider holds no {what}",
                reply.status,
                shown(&spec.not_found)
            ),
        };
    }
    if reply.status == spec.found.status {
        return LookupOutcome::Unavailable {
            reason: format!(
                "{request} → {}{note} with an unexpected body: {}",
                reply.status,
                reading.message(reply)
            ),
            retry_after_ms: reading.wait_ms(reply, now, None),
        };
    }
    unavailable_from_reply(reading, request, reply, now)
}

/// A `found` answer: found with its id, or unavailable when it names none.
fn found_answer(
    spec: &ConsistentLookup,
    reading: &Reading,
    asked: &Asked<'_>,
    reply: &HttpReply,
    json: Option<&Value>,
    now: DateTime<Utc>,
) -> LookupOutcome {
    let note = reading.request_id_note(reply);
    match json.and_then(|json| object_id_at(json, &spec.id)) {
        Some(external_id) => found(
            external_id.clone(),
            asked.account,
            format!(
                "{} → {}{}, id {external_id}{note}",
                asked.request,
                reply.status,
                shown(&spec.found)
            ),
            Vec::new(),
        ),
        None => LookupOutcome::Unavailable {
            reason: format!(
                "{} → {}{note}, but nothing usable at `{}` names the object",
                asked.request, reply.status, spec.id
            ),
            retry_after_ms: reading.wait_ms(reply, now, None),
        },
    }
}

/// Reads the answer to a search.
pub fn classify_search(
    spec: &SearchLookup,
    reading: &Reading,
    asked: &Asked<'_>,
    reply: &HttpReply,
    now: DateTime<Utc>,
) -> LookupOutcome {
    if let Some(outcome) = by_rule(reading, asked, reply, now) {
        return outcome;
    }
    if reply.status != spec.status {
        return unavailable_from_reply(reading, asked.request, reply, now);
    }
    let note = reading.request_id_note(reply);
    let json = reply.json();
    let Some(results) = json
        .as_ref()
        .and_then(|json| json.pointer(&spec.results))
        .and_then(Value::as_array)
    else {
        return LookupOutcome::Unavailable {
            reason: format!(
                "{} → {}{note} without a results array at `{}`",
                asked.request, reply.status, spec.results
            ),
            retry_after_ms: reading.wait_ms(reply, now, None),
        };
    };
    let matching = matching_ids(spec, asked, results);
    let ignored = results.len() - matching.len();
    let ignored_note = if ignored == 0 {
        String::new()
    } else {
        format!(" ({ignored} other result(s) ignored: another label or account)")
    };
    if matching.is_empty() {
        return LookupOutcome::NotFound {
            authoritative: false,
            evidence: format!(
                "{} → {} result(s), none with this label in account {}{ignored_note}{note}; the index may lag by up to {} ms, so this proves nothing",
                asked.request,
                results.len(),
                asked.account,
                spec.lag_ms
            ),
        };
    }
    let mut matching = matching;
    let first = matching.remove(0);
    let evidence = if matching.is_empty() {
        format!("{} → 1 result: {first}{ignored_note}{note}", asked.request)
    } else {
        let listed: Vec<&str> = std::iter::once(&first)
            .chain(&matching)
            .take(MAX_IDS_IN_EVIDENCE)
            .map(ExternalObjectId::as_str)
            .collect();
        format!(
            "{} → {} results carry this label: {}{}; {first} is the earliest, the others are DUPLICATES{ignored_note}{note}",
            asked.request,
            matching.len() + 1,
            listed.join(", "),
            if matching.len() + 1 > MAX_IDS_IN_EVIDENCE { ", …" } else { "" },
        )
    };
    found(first, asked.account, evidence, matching)
}

/// The ids of the results that carry exactly this operation's label (and account, when the
/// results name one), lowest first, each once.
fn matching_ids(
    spec: &SearchLookup,
    asked: &Asked<'_>,
    results: &[Value],
) -> Vec<ExternalObjectId> {
    let ours = |result: &&Value| {
        any_text_is(result, &spec.label_at, asked.label)
            && spec
                .account_at
                .as_ref()
                .is_none_or(|at| any_text_is(result, at, asked.account.as_str()))
    };
    let mut matching: Vec<ExternalObjectId> = results
        .iter()
        .filter(ours)
        .filter_map(|result| object_id_at(result, &spec.id))
        .collect();
    matching.sort_by(|a, b| id_order(a.as_str(), b.as_str()));
    matching.dedup();
    matching
}

/// The lookup outcome for any answer a lookup does not expect: `Refused` for 401 and 403 (wrong
/// or revoked credentials do not clear on their own, so asking again cannot help), `Unavailable`
/// for everything else (429, 5xx, other statuses: a later lookup may answer).
pub fn unavailable_from_reply(
    reading: &Reading,
    request: &str,
    reply: &HttpReply,
    now: DateTime<Utc>,
) -> LookupOutcome {
    let code = reading.status_code(reply);
    let note = reading.request_id_note(reply);
    if matches!(reply.status, 401 | 403) {
        return LookupOutcome::Refused {
            reason: format!(
                "{request} was refused with {code}{note}: {}",
                reading.message(reply)
            ),
        };
    }
    let reason = match reply.status {
        429 => format!("{request} was rate limited ({code})"),
        500..=599 => format!(
            "{request} failed with {code}{note}: {}",
            reading.message(reply)
        ),
        _ => format!(
            "{request} got an unexpected {code}{note}: {}",
            reading.message(reply)
        ),
    };
    LookupOutcome::Unavailable {
        reason,
        retry_after_ms: reading.wait_ms(reply, now, None),
    }
}

/// Decimal ids in numeric order (shorter first, since ids carry no leading zeros), then any other
/// ids in text order.
pub fn id_order(a: &str, b: &str) -> Ordering {
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
    use crate::document::{Document, Lookup};
    use crate::test_support::{keyed_document, labelled_document, now, plain_document};
    use serde_json::json;

    fn account() -> AccountId {
        AccountId::new("acct-1").expect("valid")
    }

    const LABEL: &str = "opl-6f1c";

    fn consistent(document: &Document, reply: &HttpReply) -> LookupOutcome {
        let action = &document.actions[0];
        let Lookup::Consistent(spec) = &action.lookup else {
            panic!("a consistent lookup");
        };
        let reading = Reading::new(document, &action.dedup);
        let account = account();
        let asked = Asked {
            request: "GET /x",
            label: LABEL,
            account: &account,
        };
        classify_consistent(spec, &reading, &asked, reply, now())
    }

    fn search(reply: &HttpReply) -> LookupOutcome {
        let document = plain_document();
        let action = &document.actions[0];
        let Lookup::Search(spec) = &action.lookup else {
            panic!("a search");
        };
        let reading = Reading::new(&document, &action.dedup);
        let account = account();
        let asked = Asked {
            request: "GET /s",
            label: LABEL,
            account: &account,
        };
        classify_search(spec, &reading, &asked, reply, now())
    }

    fn search_reply(results: Value) -> HttpReply {
        HttpReply::new(200, &json!({ "results": results }).to_string())
    }

    #[test]
    fn a_completed_key_is_found_in_the_requests_account_and_in_progress_asks_for_a_wait() {
        let reply = HttpReply::new(200, r#"{"status":"completed","id":"731"}"#)
            .with_header("request-id", "req_9");
        let LookupOutcome::Found {
            external_id,
            account: found_in,
            evidence,
            duplicates,
        } = consistent(&keyed_document(), &reply)
        else {
            panic!("a completed key is found");
        };
        assert_eq!(
            (external_id.as_str(), found_in, duplicates.len()),
            ("731", account(), 0)
        );
        assert!(
            evidence.starts_with("GET /x → 200 completed, id 731") && evidence.contains("req_9"),
            "{evidence}"
        );
        assert!(matches!(
            consistent(&keyed_document(), &HttpReply::new(200, r#"{"status":"in_progress"}"#)),
            LookupOutcome::InProgress { retry_after_ms: Some(IN_FLIGHT_RETRY_AFTER_MS), evidence } if evidence.contains("in_progress")
        ));
    }

    #[test]
    fn only_the_declared_not_found_is_authoritative() {
        for document in [keyed_document(), labelled_document()] {
            let unknown = HttpReply::new(404, r#"{"error":{"type":"not_found","message":"no"}}"#);
            assert!(matches!(
                consistent(&document, &unknown),
                LookupOutcome::NotFound {
                    authoritative: true,
                    ..
                }
            ));
            let routing = HttpReply::new(404, "<html>nginx</html>");
            assert!(matches!(
                consistent(&document, &routing),
                LookupOutcome::Unavailable { .. }
            ));
        }
        assert!(matches!(
            consistent(&labelled_document(), &HttpReply::new(200, r#"{"id":"732"}"#)),
            LookupOutcome::Found { external_id, .. } if external_id.as_str() == "732"
        ));
    }

    #[test]
    fn errors_and_odd_bodies_make_a_consistent_lookup_unavailable_and_credentials_refused() {
        for reply in [
            HttpReply::new(200, r#"{"status":"completed"}"#),
            HttpReply::new(200, r#"{"status":"exploded"}"#),
            HttpReply::new(500, ""),
            HttpReply::new(429, "").with_header("retry-after", "5"),
        ] {
            assert!(
                matches!(
                    consistent(&keyed_document(), &reply),
                    LookupOutcome::Unavailable { .. }
                ),
                "{reply:?}"
            );
        }
        assert!(matches!(
            consistent(
                &keyed_document(),
                &HttpReply::new(429, "").with_header("retry-after", "5")
            ),
            LookupOutcome::Unavailable {
                retry_after_ms: Some(5000),
                ..
            }
        ));
        for status in [401, 403] {
            assert!(matches!(
                consistent(&labelled_document(), &HttpReply::new(status, "")),
                LookupOutcome::Refused { reason } if reason.contains("GET /x") && reason.contains(&status.to_string())
            ));
        }
    }

    #[test]
    fn only_the_exact_label_in_the_same_account_is_search_evidence() {
        let outcome = search(&search_reply(json!([
            {"id": "731", "opledger_label": format!("{LABEL}-other"), "account": "acct-1", "title": "Call the client"},
            {"id": "732", "opledger_label": LABEL, "account": "acct-2"},
            {"id": "733", "title": "Call the client", "account": "acct-1"},
            {"id": "734", "opledger_label": LABEL.to_uppercase(), "account": "acct-1"},
        ])));
        let LookupOutcome::NotFound {
            authoritative,
            evidence,
        } = outcome
        else {
            panic!("no result matches: {outcome:?}");
        };
        assert!(!authoritative, "an empty search proves nothing");
        assert!(evidence.contains("4 other result(s) ignored"), "{evidence}");
        assert!(matches!(
            search(&search_reply(json!([]))),
            LookupOutcome::NotFound {
                authoritative: false,
                ..
            }
        ));
    }

    fn pipedrive_search(items: Value) -> LookupOutcome {
        let (file, text) = crate::presets::preset("pipedrive").expect("the preset");
        let document = crate::document::parse(file, text).expect("the preset is valid");
        let action = document.action("create_deal").expect("a deal action");
        let Lookup::Search(spec) = &action.lookup else {
            panic!("a search");
        };
        let reading = Reading::new(&document, &action.dedup);
        let account = account();
        let asked = Asked {
            request: "GET /api/v2/deals/search",
            label: LABEL,
            account: &account,
        };
        let reply = HttpReply::new(
            200,
            &json!({"success": true, "data": {"items": items}}).to_string(),
        );
        classify_search(spec, &reading, &asked, &reply, now())
    }

    #[test]
    fn pipedrives_deal_search_finds_the_label_at_any_position_of_a_hits_custom_fields() {
        // The order of a hit's `custom_fields` is not documented: the label may come after the
        // deal's other text fields. With `label_at = "/item/custom_fields/0"` this is not found.
        for listed in [
            json!(["north-east", "web form", LABEL]),
            json!(["north-east", LABEL]),
            json!([LABEL, "web form"]),
        ] {
            let outcome = pipedrive_search(json!([
                {"result_score": 1.0, "item": {"id": 41, "type": "deal", "custom_fields": listed}}
            ]));
            assert!(
                matches!(&outcome, LookupOutcome::Found { external_id, .. } if external_id.as_str() == "41"),
                "{listed}: {outcome:?}"
            );
        }
        let elsewhere = pipedrive_search(json!([
            {"result_score": 1.0, "item": {"id": 41, "title": LABEL, "custom_fields": [format!("{LABEL}-other"), "x"]}}
        ]));
        assert!(
            matches!(
                elsewhere,
                LookupOutcome::NotFound {
                    authoritative: false,
                    ..
                }
            ),
            "a title or a longer value is no evidence: {elsewhere:?}"
        );
    }

    #[test]
    fn one_match_is_found_with_a_short_evidence_line() {
        assert_eq!(
            search(&search_reply(
                json!([{"id": "733", "opledger_label": LABEL, "account": "acct-1"}])
            )),
            LookupOutcome::Found {
                external_id: ExternalObjectId::new("733").expect("valid"),
                account: account(),
                evidence: "GET /s → 1 result: 733".to_owned(),
                duplicates: Vec::new(),
            }
        );
    }

    #[test]
    fn with_duplicates_the_lowest_id_wins_and_the_others_are_named() {
        let outcome = search(&search_reply(json!([
            {"id": "1000", "opledger_label": LABEL, "account": "acct-1"},
            {"id": "999", "opledger_label": LABEL, "account": "acct-1"},
            {"id": 998, "opledger_label": LABEL, "account": "acct-1"},
        ])));
        let LookupOutcome::Found {
            external_id,
            evidence,
            duplicates,
            ..
        } = outcome
        else {
            panic!("found");
        };
        assert_eq!(external_id.as_str(), "998");
        let duplicates: Vec<&str> = duplicates.iter().map(ExternalObjectId::as_str).collect();
        assert_eq!(duplicates, vec!["999", "1000"]);
        assert!(
            evidence.contains("998, 999, 1000") && evidence.contains("DUPLICATES"),
            "{evidence}"
        );
    }

    #[test]
    fn a_malformed_or_failed_search_is_unavailable() {
        for reply in [
            HttpReply::new(200, "{}"),
            HttpReply::new(200, "[]"),
            HttpReply::new(503, ""),
            HttpReply::new(404, r#"{"error":{"type":"not_found","message":"?"}}"#),
        ] {
            assert!(
                matches!(search(&reply), LookupOutcome::Unavailable { .. }),
                "{reply:?}"
            );
        }
    }

    #[test]
    fn a_rate_limited_lookup_is_not_asked_again_sooner_than_the_least_wait() {
        // HubSpot's search answers 429 with no wait named; the lookup waits its window too.
        assert!(matches!(
            search(&HttpReply::new(429, "")),
            LookupOutcome::Unavailable {
                retry_after_ms: Some(1_000),
                ..
            }
        ));
        assert!(matches!(
            search(&HttpReply::new(429, "").with_header("retry-after", "4")),
            LookupOutcome::Unavailable {
                retry_after_ms: Some(4_000),
                ..
            }
        ));
        assert!(matches!(
            search(&HttpReply::new(503, "")),
            LookupOutcome::Unavailable {
                retry_after_ms: None,
                ..
            }
        ));
    }

    #[test]
    fn decimal_ids_sort_numerically_before_other_ids() {
        let mut ids = vec!["b", "1000", "999", "a", "73"];
        ids.sort_by(|a, b| id_order(a, b));
        assert_eq!(ids, vec!["73", "999", "1000", "a", "b"]);
    }
}
