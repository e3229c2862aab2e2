//! How an answer to a send becomes an outcome: the connector's rules first, then the default
//! table in the crate docs. Pure functions of the reply and `now`.
//!
//! Honesty first (design rule 6): `Confirmed` only with the provider's object id, `Rejected` only
//! when the provider proved nothing was applied, `NotSent` only when the provider said it
//! processed nothing; everything else is `Uncertain`.

use chrono::{DateTime, Utc};
use opledger_domain::ids::{ExternalObjectId, ProviderRequestId};
use opledger_domain::provider::SendOutcome;
use reqwest::header::HeaderName;
use serde_json::Value;

use crate::document::{
    Dedup, Document, ErrorRule, IdSource, Means, RateLimit, ResetUnit, ResponseSpec,
};
use crate::http::{
    parse_http_date, shorten, HttpReply, IN_FLIGHT_RETRY_AFTER_MS, MAX_MESSAGE_CHARS,
    MAX_RETRY_AFTER_MS,
};

/// How one action's answers are read: where the error code and message are, the rules checked
/// before the default table, the rate-limit header and the request-id header. Built once per
/// action when the connector is built.
#[derive(Clone, Debug)]
pub struct Reading {
    code_at: String,
    message_at: String,
    /// The action's dedup answers first (in flight, label conflict), then the connector's rules.
    rules: Vec<ErrorRule>,
    rate_limit: RateLimit,
    request_id_header: HeaderName,
}

impl Reading {
    /// The reading of `dedup`'s action in `document`.
    pub fn new(document: &Document, dedup: &Dedup) -> Self {
        let mut rules = Vec::new();
        match dedup {
            Dedup::IdempotencyKey {
                in_flight: Some(answer),
                ..
            } => rules.push(ErrorRule {
                status: answer.status,
                code: answer.code.clone(),
                at: None,
                means: Means::NotSent,
                retry_after_ms: Some(IN_FLIGHT_RETRY_AFTER_MS),
            }),
            Dedup::UniqueLabel {
                conflict: Some(answer),
            } => rules.push(ErrorRule {
                status: answer.status,
                code: answer.code.clone(),
                at: None,
                means: Means::Rejected,
                retry_after_ms: None,
            }),
            _ => {}
        }
        rules.extend(document.errors.rules.iter().cloned());
        Self {
            code_at: document.errors.code_at.clone(),
            message_at: document.errors.message_at.clone(),
            rules,
            rate_limit: document.rate_limit.clone(),
            request_id_header: document.request_id_header.clone(),
        }
    }

    /// The error code at `code_at`, when the body has one.
    pub fn code(&self, reply: &HttpReply) -> Option<String> {
        reply
            .json()
            .as_ref()
            .and_then(|json| text_at(json, &self.code_at))
            .map(|text| shorten(&text, MAX_MESSAGE_CHARS))
    }

    /// `<status> <code>`, or the status alone when the body names no code.
    pub fn status_code(&self, reply: &HttpReply) -> String {
        match self.code(reply) {
            Some(code) => format!("{} {code}", reply.status),
            None => reply.status.to_string(),
        }
    }

    /// The provider's message at `message_at`, or a short piece of the body.
    pub fn message(&self, reply: &HttpReply) -> String {
        reply
            .json()
            .as_ref()
            .and_then(|json| text_at(json, &self.message_at))
            .map_or_else(
                || reply.body_excerpt(),
                |text| shorten(&text, MAX_MESSAGE_CHARS),
            )
    }

    /// The wait before the provider is asked again after `reply`: the wait it asked for
    /// ([`Reading::asked_wait_ms`]), else `fallback` (a rule's `retry_after_ms`); after a 429 at
    /// least the connector's `min_wait_ms`, so a 429 that names no wait is not repeated inside
    /// the window that refused it.
    pub fn wait_ms(
        &self,
        reply: &HttpReply,
        now: DateTime<Utc>,
        fallback: Option<u64>,
    ) -> Option<u64> {
        let asked = self.asked_wait_ms(reply, now).or(fallback);
        if reply.status != 429 {
            return asked;
        }
        let floor = self.rate_limit.min_wait_ms;
        debug_assert!(floor <= MAX_RETRY_AFTER_MS, "checked at load");
        Some(asked.map_or(floor, |asked| asked.max(floor)))
    }

    /// The wait the provider asked for: Retry-After (both forms), else the rate-limit reset
    /// header; capped at [`MAX_RETRY_AFTER_MS`]. Read on every status.
    pub fn asked_wait_ms(&self, reply: &HttpReply, now: DateTime<Utc>) -> Option<u64> {
        reply.retry_after_ms(now).or_else(|| {
            let reset = self.rate_limit.reset.as_ref()?;
            let value = reply.header(reset.header.as_str())?;
            reset_wait_ms(&value, reset.unit, reply.header("date").as_deref(), now)
        })
    }

    /// The first rule that matches the reply.
    pub fn rule(&self, reply: &HttpReply) -> Option<&ErrorRule> {
        let json = reply.json();
        self.rules.iter().find(|rule| {
            rule.status == reply.status
                && rule.code.as_ref().is_none_or(|code| {
                    let at = rule.at.as_deref().unwrap_or(&self.code_at);
                    json.as_ref().and_then(|json| text_at(json, at)).as_deref() == Some(code)
                })
        })
    }

    /// The provider's request id, when the answer names a valid one.
    pub fn request_id(&self, reply: &HttpReply) -> Option<ProviderRequestId> {
        reply
            .header(self.request_id_header.as_str())
            .and_then(|id| ProviderRequestId::new(id).ok())
    }

    /// ` (request-id req_5)` when the provider named the request, else nothing; for evidence.
    pub fn request_id_note(&self, reply: &HttpReply) -> String {
        match reply.header(self.request_id_header.as_str()) {
            Some(id) => format!(" ({} {})", self.request_id_header, shorten(&id, 100)),
            None => String::new(),
        }
    }
}

/// The value at `pointer` as text: a string as it is, a number or boolean as JSON writes it.
pub fn text_at(json: &Value, pointer: &str) -> Option<String> {
    match json.pointer(pointer)? {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(value) => Some(value.to_string()),
        _ => None,
    }
}

/// The object id at `pointer`: a non-empty string, or an integer written as one.
pub fn object_id_at(json: &Value, pointer: &str) -> Option<ExternalObjectId> {
    match json.pointer(pointer)? {
        Value::String(text) => ExternalObjectId::new(text.as_str()).ok(),
        Value::Number(number) if number.is_u64() || number.is_i64() => {
            ExternalObjectId::new(number.to_string()).ok()
        }
        _ => None,
    }
}

/// The last path segment of a `Location`-style header: `https://x/v1/tasks/731?y` → `731`.
pub fn id_from_location(value: &str) -> Option<ExternalObjectId> {
    let path = value.split(['?', '#']).next()?.trim_end_matches('/');
    let segment = path.rsplit('/').next()?;
    ExternalObjectId::new(segment).ok()
}

/// The wait a rate-limit reset header asks for, in milliseconds, capped; a reset in the past is
/// no wait. A Unix reset time is measured against the answer's `Date` when it has one (both are
/// the provider's clock), else against `now`.
pub fn reset_wait_ms(
    value: &str,
    unit: ResetUnit,
    date: Option<&str>,
    now: DateTime<Utc>,
) -> Option<u64> {
    let number: f64 = value
        .trim()
        .parse()
        .ok()
        .filter(|number: &f64| number.is_finite())?;
    let wait_ms = match unit {
        ResetUnit::Seconds => number * 1000.0,
        ResetUnit::Milliseconds => number,
        ResetUnit::UnixSeconds => {
            let reference = date
                .and_then(|date| parse_http_date(date, now))
                .unwrap_or(now);
            (number - reference.timestamp() as f64) * 1000.0
        }
    };
    // `as` saturates for floats: a huge number is "wait very long", capped below.
    Some((wait_ms.max(0.0).ceil() as u64).min(MAX_RETRY_AFTER_MS))
}

/// Classifies the answer to a send (see the table in the crate docs).
pub fn classify_send(
    reading: &Reading,
    response: &ResponseSpec,
    reply: &HttpReply,
    now: DateTime<Utc>,
) -> SendOutcome {
    if let Some(rule) = reading.rule(reply) {
        let wait = reading.wait_ms(reply, now, rule.retry_after_ms);
        return by_rule(reading, rule, reply, wait);
    }
    let wait = reading.wait_ms(reply, now, None);
    let status = reply.status;
    let note = reading.request_id_note(reply);
    match status {
        200..=299 => success(reading, response, reply, wait),
        400 | 401 | 403 | 404 | 405 | 413 | 415 | 422 => SendOutcome::Rejected {
            code: reading.status_code(reply),
            message: reading.message(reply),
        },
        429 => SendOutcome::NotSent {
            reason: format!(
                "rate limited ({}): {}",
                reading.status_code(reply),
                reading.message(reply)
            ),
            retry_after_ms: wait,
        },
        500..=599 => SendOutcome::Uncertain {
            error: format!(
                "the provider failed with {}{note}; the request may have been applied: {}",
                reading.status_code(reply),
                reading.message(reply)
            ),
            retry_after_ms: wait,
        },
        _ => SendOutcome::Uncertain {
            error: format!(
                "unexpected status {}{note}; the request may have been applied: {}",
                reading.status_code(reply),
                reading.message(reply)
            ),
            retry_after_ms: wait,
        },
    }
}

fn by_rule(
    reading: &Reading,
    rule: &ErrorRule,
    reply: &HttpReply,
    wait: Option<u64>,
) -> SendOutcome {
    let code = reading.status_code(reply);
    let message = reading.message(reply);
    match rule.means {
        Means::NotSent => SendOutcome::NotSent {
            reason: format!(
                "{code}: the provider says it processed nothing of this request: {message}"
            ),
            retry_after_ms: wait,
        },
        Means::Rejected => SendOutcome::Rejected { code, message },
        Means::Uncertain => SendOutcome::Uncertain {
            error: format!(
                "{code}{}: the request may have been applied: {message}",
                reading.request_id_note(reply)
            ),
            retry_after_ms: wait,
        },
    }
}

fn success(
    reading: &Reading,
    response: &ResponseSpec,
    reply: &HttpReply,
    wait: Option<u64>,
) -> SendOutcome {
    let status = reply.status;
    let note = reading.request_id_note(reply);
    if response
        .success
        .as_ref()
        .is_some_and(|listed| !listed.contains(&status))
    {
        return SendOutcome::Uncertain {
            error: format!("the provider answered {status}{note}, which this action does not count as success; the request may have been applied"),
            retry_after_ms: wait,
        };
    }
    let id = match &response.id {
        IdSource::Pointer(pointer) => reply
            .json()
            .as_ref()
            .and_then(|json| object_id_at(json, pointer)),
        IdSource::Header(header) => reply
            .header(header.as_str())
            .as_deref()
            .and_then(id_from_location),
    };
    match id {
        Some(external_id) => SendOutcome::Confirmed {
            external_id,
            provider_request_id: reading.request_id(reply),
        },
        None => SendOutcome::Uncertain {
            error: format!(
                "the provider answered {status}{note} but names no usable id ({}): the request was probably applied, but the object cannot be named",
                match &response.id {
                    IdSource::Pointer(pointer) => format!("nothing usable at `{pointer}`"),
                    IdSource::Header(header) => format!("no usable `{header}` header"),
                }
            ),
            retry_after_ms: wait,
        },
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::document::{ErrorSpec, ResetHeader, StatusMatch};
    use crate::test_support::{keyed_document, now};
    use chrono::TimeDelta;

    fn plus_seconds(seconds: i64) -> DateTime<Utc> {
        now() + TimeDelta::seconds(seconds)
    }

    fn imf(time: DateTime<Utc>) -> String {
        time.format("%a, %d %b %Y %H:%M:%S GMT").to_string()
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

    fn response() -> ResponseSpec {
        ResponseSpec {
            success: None,
            id: IdSource::Pointer("/id".to_owned()),
        }
    }

    /// The reading of the stand's keyed connector: in flight is NotSent, no other rules.
    fn reading() -> Reading {
        let document = keyed_document();
        Reading::new(&document, &document.actions[0].dedup)
    }

    fn classify(reply: &HttpReply) -> SendOutcome {
        classify_send(&reading(), &response(), reply, now())
    }

    #[test]
    fn a_2xx_with_an_id_is_confirmed_with_the_request_id() {
        let created = HttpReply::new(201, r#"{"id":"731"}"#).with_header("request-id", "req_1");
        assert_eq!(
            classify(&created),
            SendOutcome::Confirmed {
                external_id: ExternalObjectId::new("731").expect("valid"),
                provider_request_id: Some(ProviderRequestId::new("req_1").expect("valid")),
            }
        );
        assert!(matches!(
            classify(&HttpReply::new(201, r#"{"id":733}"#)),
            SendOutcome::Confirmed { external_id, provider_request_id: None } if external_id.as_str() == "733"
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
                    classify(&HttpReply::new(201, body)),
                    SendOutcome::Uncertain { .. }
                ),
                "{body}"
            );
        }
        let mut cut = HttpReply::new(201, r#"{"id":"731"}"#);
        cut.body_complete = false;
        assert!(matches!(classify(&cut), SendOutcome::Uncertain { .. }));
    }

    #[test]
    fn a_2xx_outside_the_success_list_is_uncertain() {
        let listed = ResponseSpec {
            success: Some(vec![201]),
            id: IdSource::Pointer("/id".to_owned()),
        };
        let outcome = classify_send(
            &reading(),
            &listed,
            &HttpReply::new(202, r#"{"id":"1"}"#),
            now(),
        );
        assert!(
            matches!(outcome, SendOutcome::Uncertain { .. }),
            "{outcome:?}"
        );
    }

    #[test]
    fn an_id_can_come_from_the_location_header_of_an_empty_answer() {
        let by_header = ResponseSpec {
            success: None,
            id: IdSource::Header(HeaderName::from_static("location")),
        };
        let reply =
            HttpReply::new(201, "").with_header("location", "https://api.example/v1/tasks/731?x=1");
        assert!(matches!(
            classify_send(&reading(), &by_header, &reply, now()),
            SendOutcome::Confirmed { external_id, .. } if external_id.as_str() == "731"
        ));
        assert!(matches!(
            classify_send(&reading(), &by_header, &HttpReply::new(204, ""), now()),
            SendOutcome::Uncertain { .. }
        ));
        assert_eq!(
            id_from_location("/tasks/9/").map(|id| id.as_str().to_owned()),
            Some("9".to_owned())
        );
    }

    #[test]
    fn definitive_client_errors_are_rejections_with_status_and_code() {
        for (status, kind) in [
            (400, "idempotency_key_reused"),
            (401, "unauthorized"),
            (403, "forbidden"),
            (404, "not_found"),
            (413, "payload_too_large"),
            (422, "invalid_body"),
        ] {
            assert_eq!(
                classify(&HttpReply::new(status, &error_body(kind))),
                rejected(&format!("{status} {kind}"))
            );
        }
        assert_eq!(
            classify(&HttpReply::new(401, "")),
            SendOutcome::Rejected {
                code: "401".to_owned(),
                message: "(no body)".to_owned()
            }
        );
    }

    #[test]
    fn a_key_still_in_flight_is_not_sent_with_a_short_wait() {
        let in_flight = HttpReply::new(409, &error_body("idempotency_in_flight"));
        assert!(matches!(
            classify(&in_flight),
            SendOutcome::NotSent { retry_after_ms: Some(IN_FLIGHT_RETRY_AFTER_MS), reason } if reason.contains("idempotency_in_flight")
        ));
        let with_header = in_flight.with_header("retry-after", "3");
        assert!(matches!(
            classify(&with_header),
            SendOutcome::NotSent {
                retry_after_ms: Some(3000),
                ..
            }
        ));
    }

    #[test]
    fn a_conflict_no_contract_explains_is_uncertain() {
        // The keyed contract names no label conflict: a 409 of that kind proves nothing here.
        for body in [error_body("label_conflict"), String::new()] {
            assert!(
                matches!(
                    classify(&HttpReply::new(409, &body)),
                    SendOutcome::Uncertain { .. }
                ),
                "{body}"
            );
        }
        let mut document = keyed_document();
        document.actions[0].dedup = Dedup::UniqueLabel {
            conflict: Some(StatusMatch {
                status: 409,
                code: Some("label_conflict".to_owned()),
            }),
        };
        let labelled = Reading::new(&document, &document.actions[0].dedup);
        assert_eq!(
            classify_send(
                &labelled,
                &response(),
                &HttpReply::new(409, &error_body("label_conflict")),
                now()
            ),
            rejected("409 label_conflict")
        );
    }

    #[test]
    fn a_rate_limit_is_not_sent_with_the_asked_wait_in_both_forms() {
        let seconds =
            HttpReply::new(429, &error_body("rate_limited")).with_header("retry-after", "30");
        assert!(matches!(
            classify(&seconds),
            SendOutcome::NotSent {
                retry_after_ms: Some(30_000),
                ..
            }
        ));
        // The date form is measured from the response's own Date header: the provider's clock
        // may be an hour off ours, and the wait is still 45 s.
        let date = HttpReply::new(429, "")
            .with_header("retry-after", &imf(plus_seconds(3645)))
            .with_header("date", &imf(plus_seconds(3600)));
        assert!(matches!(
            classify(&date),
            SendOutcome::NotSent {
                retry_after_ms: Some(45_000),
                ..
            }
        ));
    }

    #[test]
    fn a_rate_limit_that_names_no_wait_is_not_repeated_for_a_second_by_default() {
        // HubSpot's 429: no Retry-After, no reset header. Without a floor the engine's backoff
        // base (tens of milliseconds in a test configuration) decided the wait, inside the
        // window that had just refused the request.
        assert_eq!(reading().rate_limit.min_wait_ms, 1_000);
        for body in ["", r#"{"errorType":"RATE_LIMIT","policyName":"SECONDLY"}"#] {
            assert!(
                matches!(
                    classify(&HttpReply::new(429, body)),
                    SendOutcome::NotSent {
                        retry_after_ms: Some(1_000),
                        ..
                    }
                ),
                "{body}"
            );
        }
        // A shorter wait the answer names is raised to the floor; a longer one is kept.
        for (asked, waited) in [("0", 1_000), ("2", 2_000)] {
            let limited = HttpReply::new(429, "").with_header("retry-after", asked);
            assert!(matches!(
                classify(&limited),
                SendOutcome::NotSent { retry_after_ms: Some(wait), .. } if wait == waited
            ));
        }
        // Other statuses keep what they asked for, nothing when they ask nothing.
        assert!(matches!(
            classify(&HttpReply::new(503, "")),
            SendOutcome::Uncertain {
                retry_after_ms: None,
                ..
            }
        ));
    }

    #[test]
    fn a_connector_declares_the_least_wait_after_a_rate_limit() {
        let declared = |min_wait_ms| {
            with_rules(
                Vec::new(),
                RateLimit {
                    reset: None,
                    min_wait_ms,
                    ..RateLimit::default()
                },
            )
        };
        let limited = HttpReply::new(429, "");
        for min_wait_ms in [250, 2_000, 10_000] {
            assert!(matches!(
                classify_send(&declared(min_wait_ms), &response(), &limited, now()),
                SendOutcome::NotSent { retry_after_ms: Some(wait), .. } if wait == min_wait_ms
            ));
        }
        // A rule's own wait stands in for an answer that names none, still above the floor.
        let policy = |policy: &str, retry_after_ms| ErrorRule {
            status: 429,
            code: Some(policy.to_owned()),
            at: Some("/policyName".to_owned()),
            means: Means::NotSent,
            retry_after_ms,
        };
        let mut rules = declared(1_000);
        rules.rules = vec![
            policy("TEN_SECONDLY_ROLLING", Some(10_000)),
            policy("NONE", Some(10)),
        ];
        let rolling = HttpReply::new(429, r#"{"policyName":"TEN_SECONDLY_ROLLING"}"#);
        assert!(matches!(
            classify_send(&rules, &response(), &rolling, now()),
            SendOutcome::NotSent {
                retry_after_ms: Some(10_000),
                ..
            }
        ));
        let short = HttpReply::new(429, r#"{"policyName":"NONE"}"#);
        assert!(matches!(
            classify_send(&rules, &response(), &short, now()),
            SendOutcome::NotSent {
                retry_after_ms: Some(1_000),
                ..
            }
        ));
    }

    #[test]
    fn server_errors_are_uncertain_and_keep_the_asked_wait() {
        for status in [500, 502, 503, 504] {
            let failed = HttpReply::new(status, &error_body("internal"));
            assert!(matches!(
                classify(&failed),
                SendOutcome::Uncertain {
                    retry_after_ms: None,
                    ..
                }
            ));
            let failed = failed.with_header("retry-after", "7");
            assert!(matches!(
                classify(&failed),
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
                    classify(&HttpReply::new(status, "")),
                    SendOutcome::Uncertain { .. }
                ),
                "{status}"
            );
        }
    }

    fn with_rules(rules: Vec<ErrorRule>, rate_limit: RateLimit) -> Reading {
        let mut document = keyed_document();
        document.errors = ErrorSpec {
            code_at: "/errors/0/code".to_owned(),
            message_at: "/errors/0/detail".to_owned(),
            rules,
        };
        document.rate_limit = rate_limit;
        Reading::new(&document, &Dedup::None)
    }

    #[test]
    fn connector_rules_come_before_the_default_table() {
        let reading = with_rules(
            vec![
                ErrorRule {
                    status: 403,
                    code: Some("RATE_LIMITED".to_owned()),
                    at: None,
                    means: Means::NotSent,
                    retry_after_ms: Some(30_000),
                },
                ErrorRule {
                    status: 409,
                    code: Some("DUPLICATE".to_owned()),
                    at: Some("/kind".to_owned()),
                    means: Means::Rejected,
                    retry_after_ms: None,
                },
                ErrorRule {
                    status: 500,
                    code: None,
                    at: None,
                    means: Means::NotSent,
                    retry_after_ms: None,
                },
            ],
            RateLimit::default(),
        );
        let limited = HttpReply::new(
            403,
            r#"{"errors":[{"code":"RATE_LIMITED","detail":"slow down"}]}"#,
        );
        assert_eq!(
            classify_send(&reading, &response(), &limited, now()),
            SendOutcome::NotSent {
                reason: "403 RATE_LIMITED: the provider says it processed nothing of this request: slow down".to_owned(),
                retry_after_ms: Some(30_000),
            }
        );
        // Another 403 still follows the default table.
        let forbidden = HttpReply::new(403, r#"{"errors":[{"code":"FORBIDDEN","detail":"no"}]}"#);
        assert!(
            matches!(classify_send(&reading, &response(), &forbidden, now()), SendOutcome::Rejected { code, .. } if code == "403 FORBIDDEN")
        );
        let duplicate = HttpReply::new(409, r#"{"kind":"DUPLICATE"}"#);
        assert!(matches!(
            classify_send(&reading, &response(), &duplicate, now()),
            SendOutcome::Rejected { .. }
        ));
        let failed = HttpReply::new(500, "").with_header("retry-after", "2");
        assert!(matches!(
            classify_send(&reading, &response(), &failed, now()),
            SendOutcome::NotSent {
                retry_after_ms: Some(2000),
                ..
            }
        ));
    }

    #[test]
    fn a_reset_header_gives_the_wait_on_any_status_when_retry_after_is_absent() {
        let reading = |unit| {
            with_rules(
                Vec::new(),
                RateLimit {
                    reset: Some(ResetHeader {
                        header: HeaderName::from_static("x-ratelimit-reset"),
                        unit,
                    }),
                    min_wait_ms: 1_000,
                    ..RateLimit::default()
                },
            )
        };
        let unix = (now().timestamp() + 20).to_string();
        let failed = HttpReply::new(503, "").with_header("x-ratelimit-reset", &unix);
        assert!(matches!(
            classify_send(
                &reading(ResetUnit::UnixSeconds),
                &response(),
                &failed,
                now()
            ),
            SendOutcome::Uncertain {
                retry_after_ms: Some(20_000),
                ..
            }
        ));
        let limited = HttpReply::new(429, "").with_header("x-ratelimit-reset", "1.5");
        assert!(matches!(
            classify_send(&reading(ResetUnit::Seconds), &response(), &limited, now()),
            SendOutcome::NotSent {
                retry_after_ms: Some(1500),
                ..
            }
        ));
        let both = limited.with_header("retry-after", "9");
        assert!(matches!(
            classify_send(&reading(ResetUnit::Seconds), &response(), &both, now()),
            SendOutcome::NotSent {
                retry_after_ms: Some(9000),
                ..
            }
        ));
        assert_eq!(
            reset_wait_ms("250", ResetUnit::Milliseconds, None, now()),
            Some(250)
        );
        assert_eq!(
            reset_wait_ms("1", ResetUnit::UnixSeconds, None, now()),
            Some(0)
        );
        assert_eq!(
            reset_wait_ms("1e300", ResetUnit::Seconds, None, now()),
            Some(MAX_RETRY_AFTER_MS)
        );
        assert_eq!(reset_wait_ms("soon", ResetUnit::Seconds, None, now()), None);
    }

    #[test]
    fn provider_messages_are_kept_short() {
        let long = "x".repeat(2 * MAX_MESSAGE_CHARS);
        let failed = HttpReply::new(
            422,
            &format!(r#"{{"error":{{"type":"invalid_body","message":"{long}"}}}}"#),
        );
        let SendOutcome::Rejected { message, .. } = classify(&failed) else {
            panic!("a 422 is a rejection");
        };
        assert_eq!(message.chars().count(), MAX_MESSAGE_CHARS + 1);
    }
}
