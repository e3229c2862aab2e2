//! [`StandAdmin`]: a typed client for the stand's admin API, for tests, the demo and the CLI.
//!
//! It speaks only the admin API, never the provider routes: those are the provider adapters'
//! business, and a test that drives them through this client would test nothing. It must never
//! be pointed at anything but a stand on loopback; it sends no credentials.

use std::time::Duration;

use reqwest::{Method, Url};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use super::wire::{Fault, LoggedRequest, StandObject, StandSettings};

/// How long one admin call may take end to end.
pub const ADMIN_TIMEOUT_MS: u64 = 10_000;
/// How much of an unexpected answer an error keeps.
const MAX_ERROR_BODY_CHARS: usize = 512;

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
pub enum StandAdminError {
    /// The base URL is not an absolute `http://` URL.
    #[error("{base_url:?} is not a stand base URL: {reason}")]
    BaseUrl { base_url: String, reason: String },
    /// The HTTP client could not be built.
    #[error("could not build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    /// The stand did not answer (not running, connection refused, timeout, ...).
    #[error("{method} {path}: no answer from the stand: {source}")]
    Transport {
        method: Method,
        path: String,
        #[source]
        source: reqwest::Error,
    },
    /// The stand answered with an error status.
    #[error("{method} {path}: the stand answered {status}: {body}")]
    Status {
        method: Method,
        path: String,
        status: u16,
        body: String,
    },
    /// The stand answered something this client cannot read.
    #[error("{method} {path}: unreadable answer: {reason}")]
    Decode {
        method: Method,
        path: String,
        reason: String,
    },
}

/// A typed client for one stand's admin API.
#[derive(Clone, Debug)]
pub struct StandAdmin {
    base: Url,
    http: reqwest::Client,
}

#[derive(Deserialize)]
struct Queued {
    queued: u32,
}

#[derive(Deserialize)]
struct Cleared {
    cleared: u64,
}

#[derive(Deserialize)]
struct Now {
    now_ms: u64,
}

#[derive(Deserialize)]
struct Objects {
    objects: Vec<StandObject>,
}

#[derive(Deserialize)]
struct Requests {
    requests: Vec<LoggedRequest>,
}

impl StandAdmin {
    /// A client for the stand at `base_url` (as [`Stand::base_url`](super::Stand::base_url)
    /// gives it).
    pub fn new(base_url: impl Into<String>) -> Result<Self, StandAdminError> {
        let base_url = base_url.into();
        let base = Url::parse(&base_url).map_err(|e| StandAdminError::BaseUrl {
            base_url: base_url.clone(),
            reason: e.to_string(),
        })?;
        if base.scheme() != "http" || base.cannot_be_a_base() {
            return Err(StandAdminError::BaseUrl {
                base_url,
                reason: "the stand speaks plain http".to_owned(),
            });
        }
        let http = reqwest::Client::builder()
            // The stand is on loopback; a proxy from the environment must not sit in between.
            .no_proxy()
            .timeout(Duration::from_millis(ADMIN_TIMEOUT_MS))
            .build()
            .map_err(StandAdminError::Client)?;
        Ok(Self { base, http })
    }

    /// Queues a fault; returns how many requests it will hit.
    pub async fn queue_fault(&self, fault: &Fault) -> Result<u32, StandAdminError> {
        let body = serde_json::to_value(fault).map_err(|e| StandAdminError::Decode {
            method: Method::POST,
            path: "/admin/faults".to_owned(),
            reason: format!("the fault does not serialize: {e}"),
        })?;
        let queued: Queued = self
            .call(Method::POST, &["admin", "faults"], &[], Some(body))
            .await?;
        Ok(queued.queued)
    }

    /// Forgets every queued fault; returns how many uses were left.
    pub async fn clear_faults(&self) -> Result<u64, StandAdminError> {
        let cleared: Cleared = self
            .call(Method::DELETE, &["admin", "faults"], &[], None)
            .await?;
        Ok(cleared.cleared)
    }

    /// Moves the stand clock forward by `ms`; returns the stand clock's new time. `0` reads it.
    pub async fn advance_clock_ms(&self, ms: u64) -> Result<u64, StandAdminError> {
        let now: Now = self
            .call(
                Method::POST,
                &["admin", "clock", "advance"],
                &[],
                Some(json!({ "ms": ms })),
            )
            .await?;
        Ok(now.now_ms)
    }

    /// Changes the settings given (`None` keeps one); returns the settings now in force.
    pub async fn set_config(
        &self,
        key_retention_s: Option<u64>,
        search_lag_ms: Option<u64>,
    ) -> Result<StandSettings, StandAdminError> {
        let mut patch = serde_json::Map::new();
        if let Some(key_retention_s) = key_retention_s {
            patch.insert("key_retention_s".to_owned(), json!(key_retention_s));
        }
        if let Some(search_lag_ms) = search_lag_ms {
            patch.insert("search_lag_ms".to_owned(), json!(search_lag_ms));
        }
        self.call(
            Method::PUT,
            &["admin", "config"],
            &[],
            Some(Value::Object(patch)),
        )
        .await
    }

    /// Adds an account, or replaces its token.
    pub async fn set_account_token(
        &self,
        account: &str,
        token: &str,
    ) -> Result<(), StandAdminError> {
        let _: Value = self
            .call(
                Method::PUT,
                &["admin", "accounts", account],
                &[],
                Some(json!({ "token": token })),
            )
            .await?;
        Ok(())
    }

    /// Every task, in id order; only `account`'s when given.
    pub async fn objects(
        &self,
        account: Option<&str>,
    ) -> Result<Vec<StandObject>, StandAdminError> {
        let query: Vec<(&str, &str)> = account.map(|a| ("account", a)).into_iter().collect();
        let objects: Objects = self
            .call(Method::GET, &["admin", "objects"], &query, None)
            .await?;
        Ok(objects.objects)
    }

    /// Every provider request the stand received (up to its log's bound), oldest first.
    pub async fn requests(&self) -> Result<Vec<LoggedRequest>, StandAdminError> {
        let requests: Requests = self
            .call(Method::GET, &["admin", "requests"], &[], None)
            .await?;
        Ok(requests.requests)
    }

    /// Forgets objects, keys, faults and the request log; ids restart at 731.
    pub async fn reset(&self) -> Result<(), StandAdminError> {
        let _: Value = self
            .call(Method::POST, &["admin", "reset"], &[], None)
            .await?;
        Ok(())
    }

    /// `GET /healthz`: whether the stand answers.
    pub async fn health(&self) -> Result<(), StandAdminError> {
        let _: Value = self.call(Method::GET, &["healthz"], &[], None).await?;
        Ok(())
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, &str)],
        body: Option<Value>,
    ) -> Result<T, StandAdminError> {
        let mut url = self.base.clone();
        {
            let Ok(mut path) = url.path_segments_mut() else {
                // `new` refused every URL that cannot be a base.
                return Err(StandAdminError::BaseUrl {
                    base_url: self.base.to_string(),
                    reason: "cannot be a base".to_owned(),
                });
            };
            // Segments are escaped one by one, so an account name cannot add a path segment.
            path.pop_if_empty().extend(segments);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let path = url.path().to_owned();
        let mut request = self.http.request(method.clone(), url);
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        let transport = |source| StandAdminError::Transport {
            method: method.clone(),
            path: path.clone(),
            source,
        };
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(transport)?;
        if !status.is_success() {
            return Err(StandAdminError::Status {
                method,
                path,
                status: status.as_u16(),
                body: String::from_utf8_lossy(&bytes)
                    .chars()
                    .take(MAX_ERROR_BODY_CHARS)
                    .collect(),
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| StandAdminError::Decode {
            method,
            path,
            reason: e.to_string(),
        })
    }
}
