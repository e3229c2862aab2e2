//! OAuth2 for connectors: an account's access token obtained from the API's token endpoint with
//! the client-credentials or the refresh-token grant (RFC 6749 §4.4, §6), cached per account and
//! renewed before it expires and once after a 401.
//!
//! One refresh per expiry: an account's token state sits behind one async lock, and the request
//! to the token endpoint is made while holding it, so a hundred sends that find the token expired
//! (or answered 401 with it) wait for one refresh and all use its result. A 401 names the token
//! generation it was sent with; only a 401 for the current generation refreshes again.
//!
//! A refresh token the provider rotates on use (Zendesk always, Salesforce when the connected app
//! says so) is written to a small file beside the ledger ([`TokenFile`]) before the new access
//! token is used, so a restart does not fall back to the consumed one. The file keys each token by
//! the fingerprint of the refresh token the configuration gave: a new one configured (the account
//! re-authorised) wins over the stored one.
//!
//! It must never log or put into an outcome a client secret, a refresh token or an access token,
//! never write one into the ledger's events, and never send a request with a token it knows is
//! stale. The token endpoint is reached with the connector's own HTTP client (its timeouts, no
//! redirects, no proxies).
//!
//! Why not the `oauth2` crate: the token answers of the APIs served here are not all RFC 6749's
//! (Salesforce's carries no `expires_in`; HubSpot's errors are `{"status":"BAD_REFRESH_TOKEN",
//! "message":…}`, not `{"error":…}`), and the provider's own message must reach the operator in
//! both cases; what remains is one form POST and a JSON read, which the connector's client, its
//! size cap and its transport classification already do.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opledger_domain::ids::{AccountId, CredentialFingerprint};
use reqwest::header::HeaderValue;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::body::{self, BodyEncoding};
use crate::credentials::{fingerprint_of, Secret};
use crate::http::{self, shorten, PreparedRequest, MAX_MESSAGE_CHARS};

/// Longest part of an access token's lifetime given up to renew it early, in milliseconds: a
/// token is renewed once less than this (or half its lifetime, if shorter) is left, so a send
/// never leaves with a token that expires on its way.
pub const EXPIRY_MARGIN_MS: u64 = 60_000;
/// How long an account's operations wait after the token endpoint refused its credentials
/// (`invalid_grant`, `invalid_client`) unless `[auth] refused_wait_ms` says otherwise, in
/// milliseconds. Such a refusal does not clear on its own; the wait keeps the endpoint from being
/// asked again by every operation meanwhile.
pub const DEFAULT_REFUSED_WAIT_MS: u64 = 60_000;
/// How long an account's operations wait after the token endpoint first gave no usable answer
/// (a transport failure, a 5xx, a 429), in milliseconds; the wait doubles with each further one,
/// up to the account's `refused_wait_ms`. Remembered per account, so one request per account is
/// made at each step, not one per operation.
pub const FIRST_UNAVAILABLE_WAIT_MS: u64 = 1_000;
/// Shortest `refused_wait_ms` accepted, in milliseconds.
pub const MIN_REFUSED_WAIT_MS: u64 = 1;
const _: () = assert!(FIRST_UNAVAILABLE_WAIT_MS <= DEFAULT_REFUSED_WAIT_MS);
const _: () = assert!(
    MIN_REFUSED_WAIT_MS <= DEFAULT_REFUSED_WAIT_MS
        && DEFAULT_REFUSED_WAIT_MS <= crate::http::MAX_RETRY_AFTER_MS
);
/// Most scopes one `[auth]` may request.
pub const MAX_SCOPES: usize = 64;
/// Longest access or refresh token accepted from a token endpoint, in bytes (HubSpot asks for
/// room for 300 characters; Salesforce's are about 112).
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;
/// Largest token file read, in bytes.
pub const MAX_TOKEN_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Which OAuth2 grant obtains an account's access token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// `grant_type=client_credentials` (RFC 6749 §4.4): the client alone.
    ClientCredentials,
    /// `grant_type=refresh_token` (RFC 6749 §6): the account's refresh token.
    RefreshToken,
}

impl Grant {
    /// The `grant_type` value, also the name written in a connector file.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ClientCredentials => "client_credentials",
            Self::RefreshToken => "refresh_token",
        }
    }
}

/// `[auth] kind = "oauth2"`: the grant, the token endpoint and what to ask it for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OAuth2Spec {
    /// The grant.
    pub grant: Grant,
    /// The token endpoint: an `http(s)://` URL, or a path starting with `/` on the base URL's
    /// origin (Salesforce's and Zendesk's live on each customer's own domain).
    pub token_url: String,
    /// Scopes asked for, joined with spaces into `scope` (none: the parameter is left out).
    pub scopes: Vec<String>,
    /// How the token request's body is written: `form` (RFC 6749) or `json` (Zendesk takes both).
    pub body_encoding: BodyEncoding,
    /// How long operations wait after the endpoint refused the credentials, in milliseconds.
    pub refused_wait_ms: u64,
}

impl OAuth2Spec {
    /// The token endpoint's absolute URL for a connector whose base URL is `base_url`.
    pub fn token_url_on(&self, base_url: &str) -> String {
        if !self.token_url.starts_with('/') {
            return self.token_url.clone();
        }
        // The origin: scheme, host and port, without the base URL's path prefix.
        let after_scheme = base_url.find("://").map_or(0, |at| at + 3);
        let origin_end = base_url[after_scheme..]
            .find('/')
            .map_or(base_url.len(), |at| after_scheme + at);
        format!("{}{}", &base_url[..origin_end], self.token_url)
    }
}

/// The secrets of one account's grant, read when the connector is built.
#[derive(Debug)]
pub(crate) struct GrantSecrets {
    pub client_id: Secret,
    pub client_secret: Secret,
    /// The refresh token the configuration gave (the refresh-token grant only).
    pub refresh_token: Option<Secret>,
}

impl GrantSecrets {
    /// The credential fingerprint of the grant for `account`: the token endpoint, the client id,
    /// the account and the configured refresh token's own fingerprint — never an access token,
    /// so a refresh (or a rotation) changes nothing, while another client or a re-authorised
    /// account (a new refresh token configured) does.
    pub fn fingerprint(&self, spec: &OAuth2Spec, account: &AccountId) -> CredentialFingerprint {
        let refresh = self
            .refresh_token
            .as_ref()
            .map_or_else(String::new, |token| token.fingerprint().to_string());
        fingerprint_of(&format!(
            "oauth2\n{}\n{}\n{}\n{account}\n{refresh}",
            spec.grant.as_str(),
            spec.token_url,
            self.client_id.expose(),
        ))
    }
}

/// Why no access token could be had.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenFailure {
    /// The endpoint refused the credentials (a 4xx such as `invalid_grant`, `invalid_client`):
    /// it will not clear until someone fixes them. The provider's own code and message.
    Refused {
        /// What the endpoint said.
        message: String,
    },
    /// No usable answer (a transport failure, a 5xx, a 429, an answer without a token).
    Unavailable {
        /// What happened.
        message: String,
    },
}

/// No access token now: why, and how long the account waits before the endpoint is asked again
/// (the same wait for all its operations).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoToken {
    /// What the endpoint said, or that it did not answer.
    pub failure: TokenFailure,
    /// How long until the account's endpoint is asked again, in milliseconds.
    pub retry_after_ms: u64,
    /// The grant that was asked for, which decides what the user can do about a refusal.
    pub grant: Grant,
}

/// A usable access token: the header value and the generation it belongs to.
#[derive(Clone, Debug)]
pub(crate) struct Token {
    pub value: HeaderValue,
    pub generation: u64,
    /// When it should no longer be used (`None`: until a 401 says so).
    pub renew_at: Option<Instant>,
}

#[derive(Debug, Default)]
struct State {
    access: Option<Access>,
    /// The refresh token in use (the configured one, or the last rotated one).
    refresh_token: Option<Secret>,
    generation: u64,
    /// The endpoint refused the credentials or gave no usable answer: until when nobody asks
    /// again, and what happened.
    blocked: Option<(Instant, TokenFailure)>,
    /// Answers without a token in a row, for the account's backoff.
    failures: u32,
}

#[derive(Debug)]
struct Access {
    value: HeaderValue,
    /// When to stop using it (its expiry less the margin); `None`: until a 401 says so
    /// (Salesforce gives no lifetime: the org's session timeout decides).
    renew_at: Option<Instant>,
}

/// Where an account's rotated refresh token is kept: the file and the entry's key.
#[derive(Clone, Debug)]
pub(crate) struct Place {
    pub file: Arc<TokenFile>,
    pub key: String,
}

/// One account's OAuth2 grant and token cache.
#[derive(Debug)]
pub(crate) struct OAuthAccount {
    spec: OAuth2Spec,
    grant: GrantSecrets,
    account: Option<AccountId>,
    place: Option<Place>,
    state: tokio::sync::Mutex<State>,
    /// The tokens in use, to scrub outcomes with (read without waiting for `state`).
    live: Mutex<Vec<String>>,
    refreshes: AtomicU64,
}

impl OAuthAccount {
    pub fn new(spec: OAuth2Spec, grant: GrantSecrets) -> Self {
        let state = State {
            refresh_token: grant.refresh_token.clone(),
            ..State::default()
        };
        Self {
            spec,
            grant,
            account: None,
            place: None,
            state: tokio::sync::Mutex::new(state),
            live: Mutex::default(),
            refreshes: AtomicU64::new(0),
        }
    }

    /// Names the account and where its rotated refresh token is kept, taking a stored one that
    /// was rotated from the configured refresh token; returns the grant's fingerprint.
    pub fn place(
        &mut self,
        account: &AccountId,
        place: Option<Place>,
    ) -> Result<CredentialFingerprint, String> {
        self.account = Some(account.clone());
        if let (Some(place), Some(configured)) = (&place, &self.grant.refresh_token) {
            let seed = configured.fingerprint().to_string();
            if let Some(stored) = place.file.get(&place.key, &seed)? {
                opledger_domain::redact::register(stored.expose());
                self.state.get_mut().refresh_token = Some(stored);
            }
        }
        self.place = place;
        Ok(self.grant.fingerprint(&self.spec, account))
    }

    /// How many times the token endpoint was asked (for tests and metrics).
    pub fn refreshes(&self) -> u64 {
        self.refreshes.load(Ordering::Relaxed)
    }

    /// The secrets an outcome must never show.
    pub fn live_secrets(&self) -> Vec<String> {
        let mut secrets = self
            .live
            .lock()
            .map(|live| live.clone())
            .unwrap_or_default();
        secrets.push(self.grant.client_secret.expose().to_owned());
        secrets
    }

    fn account_name(&self) -> String {
        self.account
            .as_ref()
            .map_or_else(|| "?".to_owned(), ToString::to_string)
    }

    /// Whether a usable access token is at hand without asking the endpoint or waiting for a
    /// renewal another caller is making.
    pub fn has_token_now(&self) -> bool {
        let Ok(state) = self.state.try_lock() else {
            return false;
        };
        let now = Instant::now();
        state
            .access
            .as_ref()
            .is_some_and(|access| access.renew_at.is_none_or(|at| now < at))
    }

    /// A usable access token. `stale` is the generation a 401 answered: that one is renewed
    /// (unless another caller already did). Waits for a refresh another caller is making.
    pub async fn authorize(
        &self,
        client: &reqwest::Client,
        base_url: &str,
        stale: Option<u64>,
    ) -> Result<Token, NoToken> {
        let mut state = self.state.lock().await;
        let now = Instant::now();
        if let Some(access) = &state.access {
            let expired = access.renew_at.is_some_and(|at| now >= at);
            if !expired && stale != Some(state.generation) {
                return Ok(Token {
                    value: access.value.clone(),
                    generation: state.generation,
                    renew_at: access.renew_at,
                });
            }
        }
        if let Some((until, failure)) = &state.blocked {
            if now < *until {
                return Err(NoToken {
                    failure: failure.clone(),
                    retry_after_ms: millis(*until - now),
                    grant: self.spec.grant,
                });
            }
        }
        state.access = None;
        self.refreshes.fetch_add(1, Ordering::Relaxed);
        let answer = self.request(client, base_url, &state).await;
        match answer {
            Ok(granted) => self.take(&mut state, granted).map_err(|failure| NoToken {
                failure,
                retry_after_ms: FIRST_UNAVAILABLE_WAIT_MS,
                grant: self.spec.grant,
            }),
            Err(failure) => {
                state.failures = state.failures.saturating_add(1);
                let wait_ms = self.wait_after(&failure, state.failures);
                state.blocked = Some((
                    Instant::now() + Duration::from_millis(wait_ms),
                    failure.clone(),
                ));
                match &failure {
                    TokenFailure::Refused { message } => {
                        tracing::warn!(account = %self.account_name(), reason = %message, wait_ms, "the token endpoint refused the account's credentials")
                    }
                    TokenFailure::Unavailable { message } => {
                        tracing::warn!(account = %self.account_name(), reason = %message, wait_ms, "the token endpoint gave no token")
                    }
                }
                Err(NoToken {
                    failure,
                    retry_after_ms: wait_ms,
                    grant: self.spec.grant,
                })
            }
        }
    }

    /// How long the account waits after its `failures`th answer without a token in a row: a
    /// refusal does not clear on its own, so its wait is the configured one from the start; an
    /// endpoint that did not answer may be back soon, so that wait starts short and doubles.
    fn wait_after(&self, failure: &TokenFailure, failures: u32) -> u64 {
        let longest = self.spec.refused_wait_ms;
        match failure {
            TokenFailure::Refused { .. } => longest,
            TokenFailure::Unavailable { .. } => FIRST_UNAVAILABLE_WAIT_MS
                .saturating_mul(1_u64 << failures.saturating_sub(1).min(20))
                .min(longest),
        }
    }

    /// Keeps a granted token (a rotated refresh token durably first) and hands it out.
    fn take(&self, state: &mut State, granted: Granted) -> Result<Token, TokenFailure> {
        for secret in [Some(&granted.access_token), granted.refresh_token.as_ref()]
            .into_iter()
            .flatten()
        {
            opledger_domain::redact::register(secret.expose());
        }
        if let Some(rotated) = granted.refresh_token {
            let changed = state
                .refresh_token
                .as_ref()
                .is_none_or(|current| current.expose() != rotated.expose());
            if changed {
                self.keep_rotated(&rotated);
                state.refresh_token = Some(rotated);
            }
        }
        let renew_at = granted.expires_in_ms.map(|lifetime| {
            let margin = EXPIRY_MARGIN_MS.min(lifetime / 2);
            Instant::now() + Duration::from_millis(lifetime - margin)
        });
        let mut value = HeaderValue::from_str(&format!("Bearer {}", granted.access_token.expose()))
            .map_err(|_| TokenFailure::Unavailable {
                message: "the token endpoint answered an access token a header cannot carry"
                    .to_owned(),
            })?;
        value.set_sensitive(true);
        state.generation += 1;
        state.blocked = None;
        state.failures = 0;
        state.access = Some(Access {
            value: value.clone(),
            renew_at,
        });
        if let Ok(mut live) = self.live.lock() {
            *live = [Some(&granted.access_token), state.refresh_token.as_ref()]
                .into_iter()
                .flatten()
                .map(|secret| secret.expose().to_owned())
                .collect();
        }
        tracing::info!(account = %self.account_name(), generation = state.generation, "access token renewed");
        Ok(Token {
            value,
            generation: state.generation,
            renew_at,
        })
    }

    /// Writes a rotated refresh token to the token file. The provider has already consumed the
    /// old one, so a failure here cannot be undone: it is logged (never the token) and the new
    /// one is used from memory; a restart would then need the account re-authorised.
    fn keep_rotated(&self, rotated: &Secret) {
        let (Some(place), Some(configured)) = (&self.place, &self.grant.refresh_token) else {
            tracing::warn!(account = %self.account_name(), "the provider rotated the refresh token and no token file is configured; a restart will need the account re-authorised");
            return;
        };
        let seed = configured.fingerprint().to_string();
        if let Err(error) = place.file.put(&place.key, &seed, rotated) {
            tracing::error!(account = %self.account_name(), %error, "the rotated refresh token could not be written to the token file");
        }
    }

    /// Asks the token endpoint once.
    async fn request(
        &self,
        client: &reqwest::Client,
        base_url: &str,
        state: &State,
    ) -> Result<Granted, TokenFailure> {
        let mut form = Map::new();
        form.insert("grant_type".into(), self.spec.grant.as_str().into());
        if let (Grant::RefreshToken, Some(token)) = (self.spec.grant, &state.refresh_token) {
            form.insert("refresh_token".into(), token.expose().into());
        }
        form.insert("client_id".into(), self.grant.client_id.expose().into());
        form.insert(
            "client_secret".into(),
            self.grant.client_secret.expose().into(),
        );
        if !self.spec.scopes.is_empty() {
            form.insert("scope".into(), self.spec.scopes.join(" ").into());
        }
        let encoding = self.spec.body_encoding;
        let bytes = body::encode(encoding, &Value::Object(form))
            .ok()
            .flatten()
            .unwrap_or_default();
        let url = self.spec.token_url_on(base_url);
        let request = PreparedRequest {
            method: reqwest::Method::POST,
            path: String::new(),
            headers: Vec::new(),
            body: encoding.content_type().map(|kind| (bytes, kind)),
            shown_path: None,
        };
        let reply = http::send_to(client, &url, None, &request)
            .await
            .map_err(|failure| TokenFailure::Unavailable {
                message: match failure {
                    http::TransportFailure::NothingSent { error }
                    | http::TransportFailure::MaybeSent { error } => {
                        format!("the token endpoint {url} did not answer: {error}")
                    }
                },
            })?;
        read_answer(reply.status, &reply.body, reply.body_complete)
    }
}

/// A duration in whole milliseconds, at least 1 (a wait of 0 would be asked again at once).
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// What a token endpoint granted.
#[derive(Debug)]
pub(crate) struct Granted {
    access_token: Secret,
    expires_in_ms: Option<u64>,
    refresh_token: Option<Secret>,
}

/// Reads a token endpoint's answer: RFC 6749 §5.1 on success (`expires_in` as a number or a
/// numeric string, optional), and the provider's own code and message on failure, whether it is
/// RFC 6749's `{"error","error_description"}` or HubSpot's `{"status","message"}`.
pub(crate) fn read_answer(
    status: u16,
    body: &[u8],
    complete: bool,
) -> Result<Granted, TokenFailure> {
    let json: Option<Value> = complete
        .then(|| serde_json::from_slice(body).ok())
        .flatten();
    if (200..300).contains(&status) {
        return granted(json.as_ref()).map_err(|message| TokenFailure::Unavailable {
            message: format!(
                "the token endpoint answered {status} without a usable token: {message}"
            ),
        });
    }
    let said = json.as_ref().map_or_else(
        || shorten(String::from_utf8_lossy(body).trim(), MAX_MESSAGE_CHARS),
        provider_message,
    );
    // The provider's words may echo what it was sent (a form with the client secret and the
    // refresh token): scrubbed here, before the message reaches a log line or an outcome.
    let message = opledger_domain::redact::scrub_owned(format!(
        "the token endpoint answered {status}: {said}"
    ));
    // RFC 6749 §5.2 answers 400 (401 for a failed client authentication); a 403 is the same
    // refusal in other words. Those do not clear on their own. Anything else may.
    if matches!(status, 400 | 401 | 403) {
        Err(TokenFailure::Refused { message })
    } else {
        Err(TokenFailure::Unavailable { message })
    }
}

fn granted(json: Option<&Value>) -> Result<Granted, String> {
    let object = json
        .and_then(Value::as_object)
        .ok_or("the body is no JSON object")?;
    let token = |key: &str| -> Result<Option<Secret>, String> {
        match object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text))
                if !text.is_empty()
                    && text.len() <= MAX_TOKEN_BYTES
                    && text.bytes().all(|byte| byte.is_ascii_graphic()) =>
            {
                Ok(Some(Secret::new(text.clone())))
            }
            Some(_) => Err(format!(
                "`{key}` is no token of visible ASCII up to {MAX_TOKEN_BYTES} bytes"
            )),
        }
    };
    let access_token = token("access_token")?.ok_or("it has no `access_token`")?;
    if let Some(kind) = object.get("token_type").and_then(Value::as_str) {
        if !kind.eq_ignore_ascii_case("bearer") {
            return Err(format!(
                "the token type is `{}`, not bearer",
                shorten(kind, 40)
            ));
        }
    }
    let expires_in_ms = match object.get("expires_in") {
        None | Some(Value::Null) => None,
        Some(Value::Number(number)) => number.as_u64(),
        Some(Value::String(text)) => text.trim().parse::<u64>().ok(),
        Some(_) => None,
    }
    .map(|seconds| seconds.saturating_mul(1000));
    Ok(Granted {
        access_token,
        expires_in_ms,
        refresh_token: token("refresh_token")?,
    })
}

/// `code: message` from an error body, whichever of the common shapes it has.
fn provider_message(json: &Value) -> String {
    let text = |key: &str| json.get(key).and_then(Value::as_str);
    let code = text("error")
        .or_else(|| text("status"))
        .or_else(|| text("errorCode"));
    let message = text("error_description").or_else(|| text("message"));
    let said = match (code, message) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(one), None) | (None, Some(one)) => one.to_owned(),
        (None, None) => json.to_string(),
    };
    shorten(&said, MAX_MESSAGE_CHARS)
}

/// The file rotated refresh tokens are kept in, beside the ledger: JSON, written whole to a
/// temporary file and renamed over the old one, readable by its owner only.
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
    /// Serialises writers in this process (each read-modify-write is whole).
    lock: Mutex<()>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
struct Stored {
    /// `provider/account` → the entry.
    tokens: BTreeMap<String, StoredToken>,
}

#[derive(Debug, Deserialize, Serialize)]
struct StoredToken {
    /// The fingerprint of the configured refresh token this one was rotated from.
    seed: String,
    refresh_token: String,
}

impl TokenFile {
    /// The token file at `path` (created at the first rotation).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            lock: Mutex::new(()),
        }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn read(&self) -> Result<Stored, String> {
        match std::fs::metadata(&self.path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Stored::default())
            }
            Err(error) => return Err(format!("{}: {error}", self.path.display())),
            Ok(meta) if meta.len() > MAX_TOKEN_FILE_BYTES => {
                return Err(format!(
                    "{} is {} bytes; a token file is at most {MAX_TOKEN_FILE_BYTES}",
                    self.path.display(),
                    meta.len()
                ))
            }
            Ok(_) => {}
        }
        let text = std::fs::read(&self.path)
            .map_err(|error| format!("{}: {error}", self.path.display()))?;
        serde_json::from_slice(&text).map_err(|error| {
            format!(
                "{} is not a token file ({error}); move it away to start from the configured refresh tokens",
                self.path.display()
            )
        })
    }

    /// The refresh token kept for `key` if it was rotated from the one fingerprinted `seed`.
    fn get(&self, key: &str, seed: &str) -> Result<Option<Secret>, String> {
        let _guard = self
            .lock
            .lock()
            .map_err(|_| "the token file lock is poisoned")?;
        let stored = self.read()?;
        Ok(stored
            .tokens
            .get(key)
            .filter(|entry| entry.seed == seed)
            .map(|entry| Secret::new(entry.refresh_token.clone())))
    }

    /// Keeps `token` for `key`, rotated from the refresh token fingerprinted `seed`.
    fn put(&self, key: &str, seed: &str, token: &Secret) -> Result<(), String> {
        let _guard = self
            .lock
            .lock()
            .map_err(|_| "the token file lock is poisoned")?;
        let mut stored = self.read()?;
        stored.tokens.insert(
            key.to_owned(),
            StoredToken {
                seed: seed.to_owned(),
                refresh_token: token.expose().to_owned(),
            },
        );
        let text = serde_json::to_vec_pretty(&stored).expect("strings always serialize");
        let temporary = self.path.with_extension("tmp");
        write_private(&temporary, &text)
            .and_then(|()| std::fs::rename(&temporary, &self.path))
            .map_err(|error| format!("{}: {error}", self.path.display()))
    }
}

/// Writes `bytes` to a new file only its owner can read, and syncs it to disk.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(token_url: &str) -> OAuth2Spec {
        OAuth2Spec {
            grant: Grant::RefreshToken,
            token_url: token_url.to_owned(),
            scopes: Vec::new(),
            body_encoding: BodyEncoding::Form,
            refused_wait_ms: DEFAULT_REFUSED_WAIT_MS,
        }
    }

    fn secrets(client: &str, refresh: &str) -> GrantSecrets {
        GrantSecrets {
            client_id: Secret::new(client),
            client_secret: Secret::new("s3cret"),
            refresh_token: Some(Secret::new(refresh)),
        }
    }

    #[test]
    fn an_account_waits_the_configured_time_after_a_refusal_and_a_doubling_one_after_no_answer() {
        let account = OAuthAccount::new(spec("/token"), secrets("client-1", "refresh-1"));
        let refused = TokenFailure::Refused {
            message: "invalid_grant".to_owned(),
        };
        let silent = TokenFailure::Unavailable {
            message: "connection refused".to_owned(),
        };
        assert_eq!(account.wait_after(&refused, 1), DEFAULT_REFUSED_WAIT_MS);
        assert_eq!(account.wait_after(&refused, 9), DEFAULT_REFUSED_WAIT_MS);
        let waits: Vec<u64> = (1..=8).map(|n| account.wait_after(&silent, n)).collect();
        assert_eq!(
            waits,
            vec![1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000]
        );
        assert_eq!(
            account.wait_after(&silent, u32::MAX),
            DEFAULT_REFUSED_WAIT_MS
        );
    }

    #[test]
    fn a_relative_token_url_lives_on_the_base_urls_origin() {
        let relative = spec("/services/oauth2/token");
        assert_eq!(
            relative.token_url_on("https://acme.my.salesforce.com/api/v2"),
            "https://acme.my.salesforce.com/services/oauth2/token"
        );
        assert_eq!(
            relative.token_url_on("http://127.0.0.1:8080"),
            "http://127.0.0.1:8080/services/oauth2/token"
        );
        let absolute = spec("https://login.salesforce.com/services/oauth2/token");
        assert_eq!(
            absolute.token_url_on("http://127.0.0.1:8080"),
            "https://login.salesforce.com/services/oauth2/token"
        );
    }

    #[test]
    fn the_fingerprint_names_the_grant_and_changes_with_the_client_or_the_refresh_token() {
        let account = AccountId::new("main").expect("valid");
        let spec = spec("/token");
        let first = secrets("client-1", "refresh-1").fingerprint(&spec, &account);
        assert_eq!(
            first,
            secrets("client-1", "refresh-1").fingerprint(&spec, &account)
        );
        assert_ne!(
            first,
            secrets("client-2", "refresh-1").fingerprint(&spec, &account)
        );
        assert_ne!(
            first,
            secrets("client-1", "refresh-2").fingerprint(&spec, &account)
        );
        let other = AccountId::new("other").expect("valid");
        assert_ne!(
            first,
            secrets("client-1", "refresh-1").fingerprint(&spec, &other)
        );
    }

    #[test]
    fn a_token_answer_is_read_with_or_without_a_lifetime() {
        let salesforce = br#"{"access_token":"00Dx!AQ4","instance_url":"https://x","token_type":"Bearer","issued_at":"1"}"#;
        let granted = read_answer(200, salesforce, true).expect("granted");
        assert_eq!(granted.expires_in_ms, None);
        assert!(granted.refresh_token.is_none());
        let zendesk = br#"{"access_token":"a1","refresh_token":"r2","token_type":"bearer","expires_in":"1800"}"#;
        let granted = read_answer(200, zendesk, true).expect("granted");
        assert_eq!(granted.expires_in_ms, Some(1_800_000));
        assert_eq!(
            granted.refresh_token.map(|t| t.expose().to_owned()),
            Some("r2".to_owned())
        );
        assert!(matches!(
            read_answer(200, br#"{"token_type":"bearer"}"#, true),
            Err(TokenFailure::Unavailable { message }) if message.contains("access_token")
        ));
        assert!(matches!(
            read_answer(200, br#"{"access_token":"a b"}"#, true),
            Err(TokenFailure::Unavailable { .. })
        ));
    }

    #[test]
    fn a_refusal_carries_the_providers_own_code_and_message() {
        let rfc =
            br#"{"error":"invalid_grant","error_description":"expired access/refresh token"}"#;
        assert_eq!(
            read_answer(400, rfc, true).err(),
            Some(TokenFailure::Refused {
                message:
                    "the token endpoint answered 400: invalid_grant: expired access/refresh token"
                        .to_owned()
            })
        );
        let hubspot =
            br#"{"status":"BAD_REFRESH_TOKEN","message":"missing or invalid refresh token"}"#;
        assert!(matches!(
            read_answer(400, hubspot, true),
            Err(TokenFailure::Refused { message }) if message.ends_with("BAD_REFRESH_TOKEN: missing or invalid refresh token")
        ));
        assert!(matches!(
            read_answer(503, b"down", true),
            Err(TokenFailure::Unavailable { message }) if message.contains("down")
        ));
    }

    #[test]
    fn a_token_file_keeps_a_rotated_token_for_its_seed_only() {
        let dir = std::env::temp_dir().join(format!("opledger-token-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = TokenFile::new(dir.join("tokens.json"));
        assert_eq!(file.get("zendesk/main", "seed-1").expect("readable"), None);
        file.put("zendesk/main", "seed-1", &Secret::new("rotated-2"))
            .expect("written");
        let again = TokenFile::new(dir.join("tokens.json"));
        assert_eq!(
            again
                .get("zendesk/main", "seed-1")
                .expect("readable")
                .map(|t| t.expose().to_owned()),
            Some("rotated-2".to_owned())
        );
        // Another configured refresh token (the account re-authorised) is not overruled.
        assert_eq!(again.get("zendesk/main", "seed-9").expect("readable"), None);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(file.path())
                .expect("exists")
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "only its owner may read it");
        }
        std::fs::remove_dir_all(&dir).expect("cleaned up");
    }
}
