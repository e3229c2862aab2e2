//! The CRM stand's wire contract: its three API shapes, written out.
//!
//! This crate owns it: the three stand connectors (`connectors/crm-stand-*.toml`, the
//! [`crate::presets`]) describe it as data, and the CRM stand (the `opledger-crm-stand` crate, a
//! test and demo tool) implements it, importing [`Shape`] from here. A change to the contract
//! starts here; the connector files, the stand and its tests follow. Nothing on the client side
//! branches on [`Shape`]: it is the stand's name for a shape, nothing more.
//!
//! ```text
//! Everything JSON. Accounts are path segments. Every provider request carries
//! `Authorization: Bearer <token>`; the stand knows each account's token (configured at start;
//! default accounts `acct-1` token `token-acct-1`, `acct-2` token `token-acct-2`). Wrong/missing
//! token → 401 `{"error":{"type":"unauthorized","message":"..."}}`, nothing applied.
//! Errors are always `{"error":{"type": "<snake_case>", "message": "<text>"}}`.
//! A task's fields are whatever JSON object the client sends (the operation's args), plus the
//! shape-specific key/label. Task ids are decimal strings from one counter shared by all accounts
//! and shapes, starting at "731" (a nod to the article). Every provider response carries a
//! `Request-Id: req_<n>` header.
//!
//! ## 1. keyed (Stripe-style Idempotency-Key)
//! - `POST /keyed/{account}/tasks`, header `Idempotency-Key: <key>` (required; missing → 400
//!   `idempotency_key_missing`), body = task fields (JSON object; otherwise 422 `invalid_body`).
//!   - new key → create; 201 `{"id":"731"}`.
//!   - same key, same body, first request completed → replay: the first response again (same
//!     status, same id), plus header `Idempotent-Replayed: true`; nothing created.
//!   - same key, first request still in flight (being processed / its response held) → 409
//!     `{"error":{"type":"idempotency_in_flight",...}}`; nothing created.
//!   - same key, different body → 400 `{"error":{"type":"idempotency_key_reused",...}}`;
//!     nothing created.
//!   - keys are forgotten `key_retention_s` after first use (stand clock); a forgotten key is new
//!     again (so a late retry creates a second task — the danger the ledger must avoid).
//! - `GET /keyed/{account}/requests/{key}` → 200 `{"status":"completed","id":"731"}` |
//!   200 `{"status":"in_progress"}` | 404 `{"error":{"type":"not_found"}}` (unknown or forgotten
//!   key). Consistent.
//!
//! ## 2. labelled (unique external label enforced atomically: Salesforce External ID shape)
//! - `PUT /labelled/{account}/tasks/by-label/{label}`, body = task fields.
//!   - label unused in this account → create; 201 `{"id":"732","created":true}`.
//!   - label used, same body → 200 `{"id":"732","created":false}` (nothing created).
//!   - label used, different body → 409 `{"error":{"type":"label_conflict",...}}` (nothing
//!     created).
//! - `GET /labelled/{account}/tasks/by-label/{label}` → 200 `{"id":"732"}` | 404 not_found.
//!   Consistent.
//!
//! ## 3. plain (lookup-only: HubSpot tasks / Kommo / Bitrix24 shape)
//! - `POST /plain/{account}/tasks`, body = task fields including `"opledger_label": "<label>"`
//!   (a custom field; the stand does not enforce uniqueness). Always creates; 201 `{"id":"733"}`.
//! - `GET /plain/{account}/tasks/search?label=<label>` →
//!   200 `{"results":[{"id":"733","opledger_label":"...","account":"acct-1"}]}`.
//!   The search index lags: a task becomes visible in search only `search_lag_ms` (stand clock)
//!   after it was created. Never 404 for an empty result: `{"results":[]}`.
//!
//! ## Rate limits and faults (driven by the admin API)
//! A fault is queued with a matcher (shape, account, optional method GET/POST/PUT) and a count;
//! each matching provider request consumes one, FIFO. Kinds:
//! - `drop_request`: do not apply; the client observes a transport failure (the connection is
//!   closed or reset without a complete response) — or, if the implementation holds the request
//!   instead, the client's timeout. Either way no object exists.
//! - `drop_response`: apply (commit the task), then the client observes a transport failure
//!   (connection closed/reset without a complete response).
//! - `late_response` `{"delay_ms": N}`: apply, hold the response for N ms (longer than the client
//!   timeout), then send it (if the client is still there). While held, a keyed request with the
//!   same key is "in flight" (409).
//! - `error_after_commit` `{"status": 500|502|503, "retry_after_s": N?}`: apply, then answer
//!   that status with `{"error":{"type":"internal",...}}` (and `Retry-After: N` when given).
//! - `error_before_commit` `{"status": 500|502|503}`: do not apply; answer that status.
//! - `rate_limit` `{"retry_after_s": N}` or `{"retry_after_http_date": true, "retry_after_s": N}`:
//!   answer 429 with `Retry-After: N` (seconds) or an HTTP date N s ahead (stand clock); not
//!   applied.
//!
//! ## Admin API (no auth; loopback test tool)
//! - `POST /admin/faults` `{"shape":"keyed"|"labelled"|"plain"|null, "account":null|"acct-1",
//!   "method":null|"POST", "kind":"drop_response", "times":1, ...kind params}` → 201
//!   `{"queued":N}`.
//! - `DELETE /admin/faults` → clears.
//! - `POST /admin/clock/advance` `{"ms": N}` → 200 `{"now_ms": ...}` (stand clock; retention and
//!   lag use it; it starts at real time and only moves forward).
//! - `PUT /admin/config` `{"key_retention_s": N?, "search_lag_ms": N?}` → 200 current config.
//!   Defaults: key_retention_s 86400, search_lag_ms 2000.
//! - `PUT /admin/accounts/{account}` `{"token":"..."}` → add/replace an account's token.
//! - `GET /admin/objects?account=acct-1&shape=plain` → 200 `{"objects":[{"id","shape",
//!   "account","key"|null,"label"|null,"fields":{...},"created_at_ms"}]}` (all accounts if no
//!   filter).
//! - `GET /admin/requests` → 200 `{"requests":[{"n","method","path","account","key","label",
//!   "outcome":"applied"|"replayed"|"refused"|"fault:<kind>"}]}` — every provider request
//!   received, in order.
//! - `POST /admin/reset` → forget objects, keys, faults, request log (config and tokens stay).
//! - `GET /healthz` → 200.
//! ```

use std::fmt;
use std::str::FromStr;

/// Which of the three CRM API shapes the stand serves a path under.
///
/// On the wire (the stand's admin API) a shape is its snake_case name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// Creates carry an `Idempotency-Key`; the provider replays the first response (Stripe).
    Keyed,
    /// Creates are upserts by a unique external label (Salesforce External ID).
    Labelled,
    /// Plain creates with a custom label field and a lagging search (HubSpot, Kommo, Bitrix24).
    Plain,
}

impl Shape {
    /// Every shape, in the contract's order.
    pub const ALL: [Shape; 3] = [Shape::Keyed, Shape::Labelled, Shape::Plain];

    /// The shape's name, as used in the stand's paths: `keyed`, `labelled` or `plain`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Keyed => "keyed",
            Self::Labelled => "labelled",
            Self::Plain => "plain",
        }
    }

    /// The name of the preset connector that speaks this shape (`crm-stand-keyed`, …).
    pub const fn preset(self) -> &'static str {
        match self {
            Self::Keyed => "crm-stand-keyed",
            Self::Labelled => "crm-stand-labelled",
            Self::Plain => "crm-stand-plain",
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A shape name that is none of the three.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown stand shape `{value}`; expected keyed, labelled or plain")]
pub struct UnknownShape {
    /// What was given.
    pub value: String,
}

impl FromStr for Shape {
    type Err = UnknownShape;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "keyed" => Ok(Self::Keyed),
            "labelled" => Ok(Self::Labelled),
            "plain" => Ok(Self::Plain),
            other => Err(UnknownShape {
                value: other.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_from_their_names_and_name_their_presets() {
        for shape in Shape::ALL {
            assert_eq!(shape.as_str().parse::<Shape>(), Ok(shape));
            assert!(crate::presets::preset(shape.preset()).is_some(), "{shape}");
        }
        assert!("rest".parse::<Shape>().is_err());
    }
}
