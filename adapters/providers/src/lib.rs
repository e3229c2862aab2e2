//! HTTP provider adapters: the domain's [`Providers`] port over reqwest, for the three CRM API
//! shapes whose wire contract this crate owns and writes out in [`contract`].
//!
//! [`Providers`]: opledger_domain::provider::Providers
//!
//! | shape | create | dedup promise | lookup |
//! |---|---|---|---|
//! | [`Shape::Keyed`] (Stripe) | `POST /keyed/{account}/tasks` + `Idempotency-Key` | `IdempotencyKey { retention_s, safety_margin_s }` | `GET /keyed/{account}/requests/{key}`, consistent |
//! | [`Shape::Labelled`] (Salesforce External ID) | `PUT /labelled/{account}/tasks/by-label/{label}` | `UniqueLabel` | `GET` the same path, consistent |
//! | [`Shape::Plain`] (HubSpot, Kommo, Bitrix24) | `POST /plain/{account}/tasks` + `opledger_label` field | `None` | `GET /plain/{account}/tasks/search?label=`, lags `search_lag_ms` |
//!
//! Only the action `create_task` is supported; another action is refused before anything is sent.
//!
//! # How a send is classified
//!
//! The adapter must be honest (design rule 6): `Confirmed` only with the provider's object id,
//! `Rejected` only when the provider proved nothing was applied, `NotSent` only when provably
//! nothing left this process or the provider said it processed nothing; everything else is
//! `Uncertain`, which the ledger stores as `unknown` and reconciles before any retry.
//!
//! | what happened | outcome | why |
//! |---|---|---|
//! | 2xx with an `id` (string or integer) | `Confirmed { external_id, provider_request_id: Request-Id }` | the provider named the object (for a replayed key or an existing label: the first one) |
//! | 2xx without a usable `id`, or a body over 256 KiB | `Uncertain` | applied, but the object cannot be named |
//! | 400 (incl. `idempotency_key_reused`), 401, 403, 404, 405, 409 `label_conflict`, 413, 415, 422 | `Rejected { code: "<status> <error.type>", message }` | definitive refusal, nothing applied |
//! | 409 `idempotency_in_flight` | `NotSent`, Retry-After or 1 s | this request was not processed; the earlier one with the key still runs |
//! | 429 | `NotSent`, Retry-After | refused before processing |
//! | 5xx | `Uncertain`, Retry-After if given | may have been applied before it failed |
//! | any other status (1xx, 3xx, other 4xx, other 409) | `Uncertain` | no documented meaning, so no proof |
//! | connect failure (refused, unreachable, DNS, TLS handshake, connect timeout) | `NotSent` | no connection, no bytes sent |
//! | whole-request timeout, reset or closed connection, any other request error | `Uncertain` | the request may have been written |
//! | the status arrived but the body broke off | `Uncertain` | without the body (the id, the error type) nothing is proven |
//! | unknown provider or account (before sending) | `NotSent` | nothing was sent |
//! | unsupported action, idempotency key that is no valid header | `Rejected { code: "local …" }` | can never be sent; retrying would not help |
//!
//! Retry-After is read in both forms: delta-seconds, or an HTTP date measured from the
//! response's `Date` header (else from now); every wait is capped at
//! [`http::MAX_RETRY_AFTER_MS`] (10 minutes).
//!
//! # How a lookup is classified
//!
//! | shape | answer | outcome |
//! |---|---|---|
//! | keyed | 200 `completed` with an id | `Found` in the request's account |
//! | keyed | 200 `in_progress` | `InProgress`, look again in 1 s (or Retry-After) |
//! | keyed | 404 `not_found` | `NotFound { authoritative: true }` — but see below |
//! | labelled | 200 with an id | `Found` |
//! | labelled | 404 `not_found` | `NotFound { authoritative: true }` |
//! | plain | results with exactly this `opledger_label` and this `account` | `Found`, the lowest id; further matches are named as duplicates in the evidence |
//! | plain | no such result (titles never count) | `NotFound { authoritative: false }` |
//! | any | 401, 403 | `Refused`: the credentials are wrong or revoked, which does not clear on its own |
//! | any | transport error, 429, 5xx, other status, malformed body | `Unavailable`, Retry-After if given |
//!
//! A keyed 404 is only conclusive while the provider still remembers the key: after
//! `key_retention_s` a forgotten key answers 404 too. The lookup request does not say when the
//! key was first sent, so the adapter cannot tell; the evidence says so. The domain's retry
//! contract (`check_retry_contract`) already refuses to retry a key past its retention minus the
//! safety margin, so such a "not found" leads to a person, not to a second task.
//!
//! # Limits and transport
//!
//! Response bodies are read up to [`http::MAX_RESPONSE_BODY_BYTES`]; timeouts come from the
//! configuration (1 ms..=120 s); at most [`MAX_IN_FLIGHT_PER_PROVIDER`] requests run at once per
//! provider, and one that cannot start within the request timeout is `NotSent`. Redirects are
//! never followed and proxies from the environment are ignored (a proxy turns "could not connect"
//! into a 502, which would hide a provably unsent request). HTTPS uses rustls with the `ring`
//! provider and the operating system's root certificates (no aws-lc-sys, no cmake); HTTP/1.1 only.
//!
//! Tokens are read from environment variables when a provider is built and kept only in memory
//! (as a sensitive header value, and as text to scrub outcomes with); they are never logged, never put into an outcome (outcome texts are
//! scrubbed of the token as a last guard) and appear in `Debug` output as `[redacted]`. The
//! credential fingerprint is `sha256:` and 16 hex digits of the token's SHA-256.

pub mod config;
pub mod contract;
pub mod http;
pub mod keyed;
pub mod labelled;
pub mod plain;
pub mod registry;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::time::Duration;

use chrono::Utc;
use opledger_domain::contract::ProviderCapabilities;
use opledger_domain::ids::{AccountId, CredentialFingerprint, ProviderId};
use opledger_domain::provider::{LookupOutcome, LookupRequest, SendOutcome, SendRequest};
use reqwest::header::HeaderValue;
use serde_json::{Map, Value};
use tokio::sync::Semaphore;
use tracing::{field, Instrument, Span};

pub use config::{
    AccountConfig, ApiToken, HttpProviderConfig, ProviderConfigError, Shape, TokenSource,
};
pub use registry::HttpProviders;

/// The one action the CRM shapes support.
pub const CREATE_TASK_ACTION: &str = "create_task";
/// Most requests one provider runs at once.
pub const MAX_IN_FLIGHT_PER_PROVIDER: usize = 64;

/// One account's credentials, ready to send. Its `Debug` shows only the fingerprint.
struct Credential {
    token: ApiToken,
    authorization: HeaderValue,
    fingerprint: CredentialFingerprint,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// One configured HTTP provider: a shape, a base URL, a client and the accounts it may act in.
#[derive(Debug)]
pub struct HttpProvider {
    id: ProviderId,
    shape: Shape,
    base_url: String,
    client: reqwest::Client,
    accounts: BTreeMap<AccountId, Credential>,
    capabilities: ProviderCapabilities,
    search_lag_ms: u64,
    request_timeout: Duration,
    permits: Semaphore,
}

impl HttpProvider {
    /// Checks `config`, reads each account's token from its environment variable (or takes the
    /// one given directly) and builds the client. Fails with an error naming what is wrong (for a
    /// missing token: the variable), never showing a token.
    pub fn new(id: ProviderId, config: &HttpProviderConfig) -> Result<Self, ProviderConfigError> {
        Self::with_env(id, config, &|name| std::env::var_os(name))
    }

    /// [`HttpProvider::new`] with the environment given as a function (tests).
    pub(crate) fn with_env(
        id: ProviderId,
        config: &HttpProviderConfig,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<Self, ProviderConfigError> {
        let base_url = config.validate()?;
        let mut accounts = BTreeMap::new();
        for account in &config.accounts {
            let token = config::resolve_token(account, env)?;
            let mut authorization = HeaderValue::from_str(&format!("Bearer {}", token.expose()))
                .map_err(|_| ProviderConfigError::InvalidToken {
                    account: account.account.clone(),
                })?;
            // Marks the value so the HTTP stack never writes it into its own debug output.
            authorization.set_sensitive(true);
            let fingerprint = token.fingerprint();
            accounts.insert(
                account.account.clone(),
                Credential {
                    token,
                    authorization,
                    fingerprint,
                },
            );
        }
        let client = http::build_client(config.request_timeout_ms, config.connect_timeout_ms)?;
        Ok(Self {
            id,
            shape: config.shape,
            base_url,
            client,
            accounts,
            capabilities: config.capabilities(),
            search_lag_ms: config.search_lag_ms,
            request_timeout: Duration::from_millis(config.request_timeout_ms),
            permits: Semaphore::new(MAX_IN_FLIGHT_PER_PROVIDER),
        })
    }

    /// The provider's id.
    pub fn id(&self) -> &ProviderId {
        &self.id
    }

    /// The API shape it speaks.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// What it can promise.
    pub fn capabilities(&self) -> ProviderCapabilities {
        self.capabilities
    }

    /// The longest one send can take, in milliseconds: waiting up to the request timeout for a
    /// free request slot, then up to the request timeout for the request itself.
    pub fn longest_send_ms(&self) -> u64 {
        u64::try_from(self.request_timeout.as_millis())
            .unwrap_or(u64::MAX / 2)
            .saturating_mul(2)
    }

    /// The fingerprint of `account`'s token; `None` when the account is not configured.
    pub fn credential_fingerprint(&self, account: &AccountId) -> Option<CredentialFingerprint> {
        self.accounts
            .get(account)
            .map(|credential| credential.fingerprint.clone())
    }

    /// Carries out one attempt and classifies it (see the table in the module docs).
    pub async fn execute(&self, request: &SendRequest) -> SendOutcome {
        let span = tracing::info_span!(
            "provider.execute",
            operation_id = %request.operation_id,
            attempt_id = %request.attempt_id,
            provider = %self.id,
            account = %request.account,
            shape = self.shape.as_str(),
            external_id = field::Empty,
        );
        async {
            let outcome = self.execute_unlogged(request).await;
            log_send(&outcome);
            outcome
        }
        .instrument(span)
        .await
    }

    /// The credential for a call routed to this provider and `account`, or why there is none
    /// (nothing is sent then).
    fn credential_for(
        &self,
        provider: &ProviderId,
        account: &AccountId,
    ) -> Result<&Credential, String> {
        if *provider != self.id {
            return Err(format!(
                "the call is for provider `{provider}`, not `{}`",
                self.id
            ));
        }
        self.accounts.get(account).ok_or_else(|| {
            format!(
                "account `{account}` is not configured at provider `{}`",
                self.id
            )
        })
    }

    async fn execute_unlogged(&self, request: &SendRequest) -> SendOutcome {
        let credential = match self.credential_for(&request.provider, &request.account) {
            Ok(credential) => credential,
            Err(reason) => {
                return SendOutcome::NotSent {
                    reason,
                    retry_after_ms: None,
                }
            }
        };
        if request.action.as_str() != CREATE_TASK_ACTION {
            return SendOutcome::Rejected {
                code: "local unsupported_action".to_owned(),
                message: format!(
                    "provider `{}` supports only `{CREATE_TASK_ACTION}`, not `{}`; nothing was sent",
                    self.id, request.action
                ),
            };
        }
        let prepared = match self.shape {
            Shape::Keyed => match keyed::create(request) {
                Ok(prepared) => prepared,
                Err(outcome) => return outcome,
            },
            Shape::Labelled => labelled::create(request),
            Shape::Plain => plain::create(request),
        };
        let Ok(Ok(_permit)) =
            tokio::time::timeout(self.request_timeout, self.permits.acquire()).await
        else {
            return SendOutcome::NotSent {
                reason: format!(
                    "{MAX_IN_FLIGHT_PER_PROVIDER} requests to provider `{}` were already running for the whole request timeout; nothing was sent",
                    self.id
                ),
                retry_after_ms: None,
            };
        };
        let outcome = match http::send(
            &self.client,
            &self.base_url,
            &credential.authorization,
            &prepared,
        )
        .await
        {
            Ok(reply) => {
                tracing::debug!(
                    request = %prepared.describe(),
                    status = reply.status,
                    replayed = reply.replayed,
                    request_id = reply.request_id.as_deref().unwrap_or(""),
                    "provider answered"
                );
                http::classify_send(&reply, Utc::now())
            }
            Err(failure) => failure.send_outcome(),
        };
        scrub_send(outcome, credential.token.expose())
    }

    /// Looks the operation up (see the table in the module docs).
    pub async fn lookup(&self, request: &LookupRequest) -> LookupOutcome {
        let span = tracing::info_span!(
            "provider.lookup",
            operation_id = %request.operation_id,
            provider = %self.id,
            account = %request.account,
            shape = self.shape.as_str(),
            external_id = field::Empty,
        );
        async {
            let outcome = self.lookup_unlogged(request).await;
            log_lookup(&outcome);
            outcome
        }
        .instrument(span)
        .await
    }

    async fn lookup_unlogged(&self, request: &LookupRequest) -> LookupOutcome {
        let credential = match self.credential_for(&request.provider, &request.account) {
            Ok(credential) => credential,
            Err(reason) => {
                return LookupOutcome::Unavailable {
                    reason,
                    retry_after_ms: None,
                }
            }
        };
        let prepared = match self.shape {
            Shape::Keyed => keyed::find(request),
            Shape::Labelled => labelled::find(request),
            Shape::Plain => plain::find(request),
        };
        let asked = prepared.describe();
        let Ok(Ok(_permit)) =
            tokio::time::timeout(self.request_timeout, self.permits.acquire()).await
        else {
            return LookupOutcome::Unavailable {
                reason: format!(
                    "{MAX_IN_FLIGHT_PER_PROVIDER} requests to provider `{}` were already running for the whole request timeout",
                    self.id
                ),
                retry_after_ms: None,
            };
        };
        let outcome = match http::send(
            &self.client,
            &self.base_url,
            &credential.authorization,
            &prepared,
        )
        .await
        {
            Ok(reply) => {
                let now = Utc::now();
                match self.shape {
                    Shape::Keyed => keyed::classify_lookup(&asked, &reply, request, now),
                    Shape::Labelled => labelled::classify_lookup(&asked, &reply, request, now),
                    Shape::Plain => {
                        plain::classify_lookup(&asked, &reply, request, self.search_lag_ms, now)
                    }
                }
            }
            Err(failure) => failure.lookup_outcome(&asked),
        };
        scrub_lookup(outcome, credential.token.expose())
    }
}

/// The JSON text of a body object. Serialising a map of JSON values cannot fail: its keys are
/// strings and its values are already JSON.
pub(crate) fn json_body(fields: Map<String, Value>) -> Vec<u8> {
    serde_json::to_vec(&Value::Object(fields)).expect("a JSON object always serialises")
}

fn log_send(outcome: &SendOutcome) {
    match outcome {
        SendOutcome::Confirmed {
            external_id,
            provider_request_id,
        } => {
            Span::current().record("external_id", field::display(external_id));
            tracing::info!(
                outcome = "confirmed",
                provider_request_id = provider_request_id.as_ref().map(|id| id.as_str()),
                "provider confirmed the object"
            );
        }
        SendOutcome::Rejected { code, message } => {
            tracing::info!(outcome = "rejected", code = %code, message = %message, "provider refused");
        }
        SendOutcome::Uncertain {
            error,
            retry_after_ms,
        } => {
            tracing::warn!(outcome = "uncertain", error = %error, retry_after_ms = retry_after_ms, "the send may or may not have been applied");
        }
        SendOutcome::NotSent {
            reason,
            retry_after_ms,
        } => {
            tracing::info!(outcome = "not_sent", reason = %reason, retry_after_ms = retry_after_ms, "nothing was applied");
        }
    }
}

fn log_lookup(outcome: &LookupOutcome) {
    match outcome {
        LookupOutcome::Found {
            external_id,
            evidence,
            ..
        } => {
            Span::current().record("external_id", field::display(external_id));
            tracing::info!(outcome = "found", evidence = %evidence, "lookup found the object");
        }
        LookupOutcome::NotFound {
            authoritative,
            evidence,
        } => {
            tracing::info!(outcome = "not_found", authoritative, evidence = %evidence, "lookup found nothing");
        }
        LookupOutcome::InProgress {
            evidence,
            retry_after_ms,
        } => {
            tracing::info!(outcome = "in_progress", evidence = %evidence, retry_after_ms = retry_after_ms, "the provider still processes the first request");
        }
        LookupOutcome::Refused { reason } => {
            tracing::warn!(outcome = "refused", reason = %reason, "lookup refused for its credentials");
        }
        LookupOutcome::Unavailable {
            reason,
            retry_after_ms,
        } => {
            tracing::warn!(outcome = "unavailable", reason = %reason, retry_after_ms = retry_after_ms, "lookup gave no answer");
        }
    }
}

/// Replaces the token wherever a provider echoed it back; the last guard before an outcome
/// leaves the adapter.
fn scrub(text: String, token: &str) -> String {
    if !token.is_empty() && text.contains(token) {
        text.replace(token, "[redacted]")
    } else {
        text
    }
}

fn scrub_send(outcome: SendOutcome, token: &str) -> SendOutcome {
    match outcome {
        SendOutcome::Rejected { code, message } => SendOutcome::Rejected {
            code: scrub(code, token),
            message: scrub(message, token),
        },
        SendOutcome::Uncertain {
            error,
            retry_after_ms,
        } => SendOutcome::Uncertain {
            error: scrub(error, token),
            retry_after_ms,
        },
        SendOutcome::NotSent {
            reason,
            retry_after_ms,
        } => SendOutcome::NotSent {
            reason: scrub(reason, token),
            retry_after_ms,
        },
        confirmed @ SendOutcome::Confirmed { .. } => confirmed,
    }
}

fn scrub_lookup(outcome: LookupOutcome, token: &str) -> LookupOutcome {
    match outcome {
        LookupOutcome::Found {
            external_id,
            account,
            duplicates,
            evidence,
        } => LookupOutcome::Found {
            external_id,
            account,
            duplicates,
            evidence: scrub(evidence, token),
        },
        LookupOutcome::NotFound {
            authoritative,
            evidence,
        } => LookupOutcome::NotFound {
            authoritative,
            evidence: scrub(evidence, token),
        },
        LookupOutcome::InProgress {
            evidence,
            retry_after_ms,
        } => LookupOutcome::InProgress {
            evidence: scrub(evidence, token),
            retry_after_ms,
        },
        LookupOutcome::Refused { reason } => LookupOutcome::Refused {
            reason: scrub(reason, token),
        },
        LookupOutcome::Unavailable {
            reason,
            retry_after_ms,
        } => LookupOutcome::Unavailable {
            reason: scrub(reason, token),
            retry_after_ms,
        },
    }
}

/// Requests and a fixed time for the unit tests of every shape.
#[cfg(test)]
pub(crate) mod test_support {
    use chrono::{DateTime, TimeZone, Utc};
    use opledger_domain::args::ArgsSnapshot;
    use opledger_domain::ids::{
        AccountId, ActionName, AttemptId, IdempotencyKey, OperationId, ProviderId, TenantId,
    };
    use opledger_domain::provider::{operation_label, LookupRequest, SendRequest};
    use uuid::Uuid;

    pub fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0)
            .single()
            .expect("a valid test time")
    }

    fn operation() -> OperationId {
        OperationId::from_uuid(Uuid::from_u128(0x6f1c_2a3e_0b1d_4c5e_9f00_1122_3344_5566))
    }

    pub fn send_request(account: &str) -> SendRequest {
        SendRequest {
            operation_id: operation(),
            attempt_id: AttemptId::from_uuid(Uuid::from_u128(7)),
            tenant: TenantId::new("acme").expect("valid"),
            provider: ProviderId::new("crm").expect("valid"),
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

    pub fn lookup_request(account: &str) -> LookupRequest {
        let send = send_request(account);
        LookupRequest {
            operation_id: send.operation_id,
            tenant: send.tenant,
            action: send.action,
            provider: send.provider,
            account: send.account,
            idempotency_key: send.idempotency_key,
            label: send.label,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{lookup_request, send_request};
    use super::*;

    fn config(shape: Shape) -> HttpProviderConfig {
        // Port 9 (discard) on loopback: nothing listens there in tests that reach the network.
        HttpProviderConfig::new(
            shape,
            "http://127.0.0.1:9",
            vec![AccountConfig::from_env(
                AccountId::new("acct-1").expect("valid"),
                "OPLEDGER_TEST_TOKEN",
            )],
        )
    }

    fn provider(shape: Shape) -> HttpProvider {
        HttpProvider::with_env(
            ProviderId::new("crm").expect("valid"),
            &config(shape),
            &|name| (name == "OPLEDGER_TEST_TOKEN").then(|| OsString::from("s3cret-value")),
        )
        .expect("a valid provider")
    }

    #[test]
    fn a_provider_reads_its_token_from_the_environment_and_shows_only_the_fingerprint() {
        let provider = provider(Shape::Keyed);
        let account = AccountId::new("acct-1").expect("valid");
        assert_eq!(
            provider.credential_fingerprint(&account),
            Some(ApiToken::new("s3cret-value").fingerprint())
        );
        assert_eq!(
            provider.credential_fingerprint(&AccountId::new("acct-2").expect("valid")),
            None
        );
        let debug = format!("{provider:?}");
        assert!(!debug.contains("s3cret-value"), "{debug}");
    }

    #[test]
    fn a_provider_without_its_token_variable_is_not_built() {
        let error = HttpProvider::with_env(
            ProviderId::new("crm").expect("valid"),
            &config(Shape::Plain),
            &|_| None,
        )
        .expect_err("no token");
        assert!(error.to_string().contains("OPLEDGER_TEST_TOKEN"), "{error}");
    }

    #[tokio::test]
    async fn an_unconfigured_account_is_not_sent_and_not_looked_up() {
        let provider = provider(Shape::Labelled);
        assert!(matches!(
            provider.execute(&send_request("acct-9")).await,
            SendOutcome::NotSent { reason, .. } if reason.contains("acct-9")
        ));
        assert!(matches!(
            provider.lookup(&lookup_request("acct-9")).await,
            LookupOutcome::Unavailable { .. }
        ));
    }

    #[tokio::test]
    async fn an_unsupported_action_is_refused_before_sending() {
        let provider = provider(Shape::Plain);
        let mut request = send_request("acct-1");
        request.action = opledger_domain::ids::ActionName::new("delete_everything").expect("valid");
        assert!(matches!(
            provider.execute(&request).await,
            SendOutcome::Rejected { code, .. } if code == "local unsupported_action"
        ));
    }

    #[test]
    fn an_echoed_token_never_leaves_the_adapter() {
        let outcome = scrub_send(
            SendOutcome::Rejected {
                code: "401 unauthorized".to_owned(),
                message: "token s3cret-value is not valid".to_owned(),
            },
            "s3cret-value",
        );
        assert_eq!(
            outcome,
            SendOutcome::Rejected {
                code: "401 unauthorized".to_owned(),
                message: "token [redacted] is not valid".to_owned(),
            }
        );
        let outcome = scrub_lookup(
            LookupOutcome::Unavailable {
                reason: "s3cret-value".to_owned(),
                retry_after_ms: None,
            },
            "s3cret-value",
        );
        assert!(
            matches!(outcome, LookupOutcome::Unavailable { reason, .. } if reason == "[redacted]")
        );
    }
}
