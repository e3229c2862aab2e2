//! Connectors: external REST APIs described as data, behind the domain's [`Providers`] port.
//!
//! [`Providers`]: opledger_domain::provider::Providers
//!
//! A *connector* is a TOML document that declares one API: where it is, how it authenticates,
//! which accounts may be used by which tenants, and its actions — each with an input JSON Schema,
//! the request it sends, where the object id is in the answer, and the provider's two promises
//! that decide what the ledger may do after an unclear outcome (deduplication and lookup). The
//! format, with a complete example, is in [`document`]; templates are in [`template`]. Every
//! connector, the CRM stand's three shapes included ([`presets`]), runs through the same code:
//!
//! ```text
//! text ──document::parse──▶ Document ──Connector::build(+ Overrides, env)──▶ Connector ──▶ HttpProviders (the port)
//! ```
//!
//! Loading checks everything and reports every problem with its file, line and field
//! ([`ConnectorError`]); building reads the credentials from the environment, once.
//!
//! # How a send is classified
//!
//! The adapter must be honest (design rule 6): `Confirmed` only with the provider's object id,
//! `Rejected` only when the provider proved nothing was applied, `NotSent` only when provably
//! nothing left this process or the provider said it processed nothing; everything else is
//! `Uncertain`, which the ledger stores as `unknown` and reconciles before any retry.
//!
//! The action's dedup answers (an idempotency key `in_flight`, a unique label `conflict`) and the
//! connector's `[[errors.rules]]` are checked first, in that order; then this table:
//!
//! | what happened | outcome | why |
//! |---|---|---|
//! | a success status (`response.success`, default any 2xx) with an id at `response.id` (string or integer), or in the last segment of `response.id_header` | `Confirmed { external_id, provider_request_id }` | the provider named the object (for a replayed key or an existing label: the first one) |
//! | such a status without a usable id, a body over 256 KiB, or a 2xx not listed as success | `Uncertain` | applied, but the object cannot be named |
//! | 400, 401, 403, 404, 405, 413, 415, 422 | `Rejected { code: "<status> <code at errors.code_at>", message }` | definitive refusal, nothing applied |
//! | the key's `in_flight` answer (stand: 409 `idempotency_in_flight`) | `NotSent`, the wait or 1 s | this request was not processed; the earlier one with the key still runs |
//! | the label's `conflict` answer (stand: 409 `label_conflict`) | `Rejected` | the label holds another object; nothing applied |
//! | a rule with `means = "not_sent" \| "rejected" \| "uncertain"` | that outcome, the wait or the rule's `retry_after_ms` | the connector's documentation says so |
//! | 429 | `NotSent`, the wait, never less than the connector's `min_wait_ms` (default 1 s) | refused before processing; the window that refused it must pass first |
//! | 5xx | `Uncertain`, the wait if given | may have been applied before it failed |
//! | any other status (1xx, 3xx, other 4xx, a 409 no contract explains) | `Uncertain` | no documented meaning, so no proof |
//! | connect failure (refused, unreachable, DNS, TLS handshake, connect timeout) | `NotSent` | no connection, no bytes sent |
//! | whole-request timeout, reset or closed connection, any other request error | `Uncertain` | the request may have been written |
//! | the status arrived but the body broke off | `Uncertain` | without the body (the id, the error code) nothing is proven |
//! | unknown provider or account, or a tenant that does not own the account (before sending) | `NotSent` | nothing was sent |
//! | an action the connector does not have, or a request that cannot be built from the arguments (a missing path argument, a key no header can carry, a form body that is no object) | `Rejected { code: "local …" }` | can never be sent; retrying would not help |
//!
//! "The wait" is read on every status, 5xx included: `Retry-After` in both forms (delta-seconds,
//! or an HTTP date measured from the response's `Date` header, else from now), else the
//! connector's `[rate_limit]` reset header, else a matching rule's `retry_after_ms`; every wait
//! is capped at [`http::MAX_RETRY_AFTER_MS`] (10 minutes). After a 429 the wait is at least the
//! connector's `[rate_limit] min_wait_ms` (default
//! [`document::DEFAULT_RATE_LIMIT_MIN_WAIT_MS`], 1 s), also when the answer names none: rate
//! limits are counted in windows of a second or more, and a 429 repeated after the engine's
//! backoff alone (tens of milliseconds in a test configuration) is refused again. The same holds
//! for a lookup's 429.
//!
//! # How a lookup is classified
//!
//! | lookup | answer | outcome |
//! |---|---|---|
//! | `by_key`, `by_label` | the `in_progress` answer | `InProgress`, look again after the wait or 1 s |
//! | `by_key`, `by_label` | the `found` answer with an id at `id` | `Found` in the request's account |
//! | `by_key`, `by_label` | the `not_found` answer | `NotFound { authoritative: true }` — but see below |
//! | `search` | results whose `label_at` equals the operation's label exactly (and `account_at`, if declared, the account) | `Found`, the lowest id (numeric order for decimal ids); the others in `duplicates` and the evidence |
//! | `search` | no such result (titles never count) | `NotFound { authoritative: false }` |
//! | any | a rule that means `not_sent` or `uncertain` | `Unavailable`, the wait |
//! | any | 401, 403 | `Refused`: the credentials are wrong or revoked, which does not clear on its own |
//! | any | transport error, 429, 5xx, other status, malformed body | `Unavailable`, the wait |
//!
//! A `by_key` "not found" is only conclusive while the provider still remembers the key: after
//! `retention_s` a forgotten key answers the same. The lookup request does not say when the key
//! was first sent, so the adapter cannot tell; the evidence says so. The domain's retry contract
//! (`check_retry_contract`) already refuses to retry a key past its retention minus the safety
//! margin, so such a "not found" leads to a person, not to a second task.
//!
//! # Limits and transport
//!
//! Response bodies are read up to [`http::MAX_RESPONSE_BODY_BYTES`]; timeouts come from the
//! document or the overrides (1 ms..=120 s); at most [`MAX_IN_FLIGHT_PER_PROVIDER`] requests run
//! at once per connector, and one that cannot start within the request timeout is `NotSent`.
//! Redirects are never followed and proxies from the environment are ignored (a proxy turns
//! "could not connect" into a 502, which would hide a provably unsent request). HTTPS uses rustls
//! with the `ring` provider and the operating system's root certificates; HTTP/1.1 only.
//!
//! Secrets are read from environment variables when a connector is built and kept only in memory
//! (as a sensitive header value, and as text to scrub outcomes with); they are never logged,
//! never put into an outcome (outcome texts are scrubbed of them as a last guard) and appear in
//! `Debug` output as `[redacted]`. The credential fingerprint is `sha256:` and 16 hex digits of
//! the secret's SHA-256 (for basic auth, of `username:password`; for OAuth2, of the grant: token
//! endpoint, client id, account and the configured refresh token, never the access token).
//!
//! # OAuth2 and request budgets
//!
//! With `[auth] kind = "oauth2"` ([`oauth`]) each account's access token comes from the API's
//! token endpoint, renewed before it expires; a request answered 401 is sent once more with a
//! renewed token, which the table above allows: a 401 is a refusal with nothing applied. No token
//! to be had makes a send `NotSent` (a lookup `Unavailable`) naming the account and what to fix.
//! `[rate_limit] requests_per_s` and `burst` ([`budget`]) pace each account's sends and lookups
//! before they are made; a slot further away than the request timeout makes the call `NotSent`
//! (`Unavailable`) with that wait, so the operation waits in the ledger, not in a worker.

pub mod body;
pub mod budget;
pub mod classify;
pub mod connector;
pub mod contract;
pub mod credentials;
pub mod document;
pub mod error;
pub mod http;
pub mod lookup;
pub mod mcp;
pub mod oauth;
pub mod pointer;
pub mod presets;
pub mod registry;
pub mod template;

pub use connector::{Connector, Overrides, MAX_IN_FLIGHT_PER_PROVIDER};
pub use contract::Shape;
pub use credentials::{Auth, Credentials, Secret, SecretSource};
pub use document::{parse, AccountSpec, Document};
pub use error::{render_all, ConnectorError};
pub use registry::HttpProviders;

/// Requests, documents and a fixed time for the unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    use chrono::{DateTime, TimeZone, Utc};
    use opledger_domain::args::ArgsSnapshot;
    use opledger_domain::ids::{
        AccountId, ActionName, AttemptId, IdempotencyKey, OperationId, ProviderId, TenantId,
    };
    use opledger_domain::provider::{operation_label, LookupRequest, SendRequest};
    use uuid::Uuid;

    use crate::document::{parse, Document};

    pub fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0)
            .single()
            .expect("a valid test time")
    }

    fn preset(name: &str) -> Document {
        let (file, text) = crate::presets::preset(name).expect("a preset");
        parse(file, text).expect("the presets are valid")
    }

    pub fn keyed_document() -> Document {
        preset("crm-stand-keyed")
    }

    pub fn labelled_document() -> Document {
        preset("crm-stand-labelled")
    }

    pub fn plain_document() -> Document {
        preset("crm-stand-plain")
    }

    fn operation() -> OperationId {
        OperationId::from_uuid(Uuid::from_u128(0x6f1c_2a3e_0b1d_4c5e_9f00_1122_3344_5566))
    }

    pub fn send_request(provider: &str, account: &str) -> SendRequest {
        SendRequest {
            operation_id: operation(),
            attempt_id: AttemptId::from_uuid(Uuid::from_u128(7)),
            tenant: TenantId::new("acme").expect("valid"),
            provider: ProviderId::new(provider).expect("valid"),
            account: AccountId::new(account).expect("valid"),
            action: ActionName::new("create_task").expect("valid"),
            args: ArgsSnapshot::new(
                serde_json::json!({"title": "Call the client", "due": "tomorrow"}),
            )
            .expect("valid args"),
            idempotency_key: IdempotencyKey::new("opk_0123456789abcdef0123456789abcdef")
                .expect("valid"),
            label: operation_label(operation()),
        }
    }

    pub fn lookup_request(provider: &str, account: &str) -> LookupRequest {
        let send = send_request(provider, account);
        LookupRequest {
            operation_id: send.operation_id,
            tenant: send.tenant,
            provider: send.provider,
            account: send.account,
            action: send.action,
            idempotency_key: send.idempotency_key,
            label: send.label,
        }
    }
}
