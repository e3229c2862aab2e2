//! A person's account at an upstream MCP server (`[upstream.login]`): authorized once with the
//! MCP specification's authorization flow, then used by every session.
//!
//! The protocol is the official SDK's (`rmcp`'s `auth` feature): the upstream's 401 names its
//! protected resource metadata (RFC 9728), which names the authorization server, whose metadata
//! (RFC 8414) names its endpoints; a client id configured beforehand is used, else the client
//! registers itself (RFC 7591); the authorization request carries a PKCE S256 challenge and the
//! `resource` indicator (RFC 8707); the code comes back to a listener on 127.0.0.1. The SDK's
//! client then sends the access token with each request, renews it shortly before it expires,
//! and after a 401 renews it once and sends the request again.
//!
//! What is kept: the SDK's stored credentials (client id, access and refresh tokens, scopes,
//! issuer), sealed with XChaCha20-Poly1305 under a key derived from the server's key-encryption
//! key, in a file of its own beside the ledger ([`SealedLogin`]), written whole, owner-only. The
//! associated data names the provider and the upstream's URL, so a file copied to another
//! connector does not open.
//!
//! It must never write a token in clear: not into the ledger's events (the binding's fingerprint
//! names the upstream, never a token), not into a log line (each token is registered with the
//! scrubber when it is read or granted), not into the file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opledger_subjects::cipher::Key;
use rmcp::transport::auth::{
    AuthClient, AuthError, AuthorizationCallback, AuthorizationManager,
    AuthorizationMetadataSource, AuthorizationRequest, AuthorizationSession, CredentialStore,
    OAuthClientConfig, StoredCredentials,
};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::Mutex;

use super::session::Unready;
use super::spec::UpstreamLogin;

/// The first bytes of a sealed login file, naming its format.
const MAGIC: &[u8] = b"opledger-mcp-login-v1\n";
/// What the server's key-encryption key is narrowed to for sealing logins.
pub const LOGIN_KEY_PURPOSE: &str = "mcp-upstream-login";
/// Largest sealed login file read, in bytes (a token response is a few kilobytes).
const MAX_LOGIN_FILE_BYTES: u64 = 256 * 1024;
/// Largest request the loopback listener reads, in bytes (a redirect's request line and headers).
const MAX_CALLBACK_REQUEST_BYTES: usize = 16 * 1024;
/// How long the loopback listener waits for one connection's request, in milliseconds (a browser
/// may open a connection it never uses).
const CALLBACK_READ_TIMEOUT_MS: u64 = 5_000;
/// The path the authorization server redirects to on the loopback listener.
const CALLBACK_PATH: &str = "/callback";
/// How long an operation waits after the upstream refused its token and no new one could be had,
/// in milliseconds: a person must log in again, which no retry does by itself.
pub const REFUSED_LOGIN_WAIT_MS: u64 = crate::oauth::DEFAULT_REFUSED_WAIT_MS;
/// How long an operation waits after the authorization server could not be asked for a new
/// token, in milliseconds (as a REST account's first wait after no answer).
pub const UNAVAILABLE_TOKEN_WAIT_MS: u64 = crate::oauth::FIRST_UNAVAILABLE_WAIT_MS;
const _: () = assert!(UNAVAILABLE_TOKEN_WAIT_MS <= REFUSED_LOGIN_WAIT_MS);

/// The SDK's credentials, kept sealed in one file.
pub(crate) struct SealedLogin {
    path: PathBuf,
    key: Key,
    /// Binds the file to its connector: the provider id and the upstream's URL.
    aad: Vec<u8>,
    /// How many times credentials were saved (a login, then each renewal).
    saves: AtomicU64,
    /// The credentials last read or written, with the file's version they came from: the SDK
    /// asks for them before every request, and the file is opened again only when it changed
    /// (a person logged in again from another process).
    cache: std::sync::Mutex<Option<(FileVersion, StoredCredentials)>>,
}

/// What tells one version of the file from another without reading it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileVersion {
    modified: Option<std::time::SystemTime>,
    len: u64,
    inode: u64,
}

impl FileVersion {
    fn of(meta: &std::fs::Metadata) -> Self {
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(meta);
        #[cfg(not(unix))]
        let inode = 0;
        Self {
            modified: meta.modified().ok(),
            len: meta.len(),
            inode,
        }
    }
}

impl SealedLogin {
    pub fn new(path: PathBuf, key: Key, provider: &str, url: &str) -> Self {
        Self {
            path,
            key,
            aad: format!("opledger mcp login\n{provider}\n{url}").into_bytes(),
            saves: AtomicU64::new(0),
            cache: std::sync::Mutex::new(None),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn saves(&self) -> u64 {
        self.saves.load(Ordering::Relaxed)
    }

    fn read(&self) -> Result<Option<StoredCredentials>, String> {
        let shown = self.path.display();
        let version = match std::fs::metadata(&self.path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(format!("{shown}: {error}")),
            Ok(meta) if meta.len() > MAX_LOGIN_FILE_BYTES => {
                return Err(format!(
                    "{shown} is {} bytes; a login file is at most {MAX_LOGIN_FILE_BYTES}",
                    meta.len()
                ))
            }
            Ok(meta) => FileVersion::of(&meta),
        };
        if let Ok(cache) = self.cache.lock() {
            if let Some((cached, credentials)) = &*cache {
                if *cached == version {
                    return Ok(Some(credentials.clone()));
                }
            }
        }
        let bytes = std::fs::read(&self.path).map_err(|error| format!("{shown}: {error}"))?;
        let sealed = bytes
            .strip_prefix(MAGIC)
            .ok_or_else(|| format!("{shown} is no sealed login file"))?;
        let plain = self.key.open(sealed, &self.aad).ok_or_else(|| {
            format!("{shown} does not open with this server's key-encryption key for this upstream (another key, or another connector's file); log in again")
        })?;
        let credentials: StoredCredentials = serde_json::from_slice(&plain)
            .map_err(|error| format!("{shown} holds no login ({error}); log in again"))?;
        register_tokens(&credentials);
        self.remember(version, &credentials);
        Ok(Some(credentials))
    }

    fn remember(&self, version: FileVersion, credentials: &StoredCredentials) {
        if let Ok(mut cache) = self.cache.lock() {
            *cache = Some((version, credentials.clone()));
        }
    }

    fn write(&self, credentials: &StoredCredentials) -> Result<(), String> {
        register_tokens(credentials);
        let plain = zeroize::Zeroizing::new(
            serde_json::to_vec(credentials).map_err(|error| error.to_string())?,
        );
        let sealed = self
            .key
            .seal(&plain, &self.aad)
            .map_err(|error| format!("no random bytes to seal the login with: {error}"))?;
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&sealed);
        let temporary = self.path.with_extension("tmp");
        crate::oauth::write_private(&temporary, &bytes)
            .and_then(|()| std::fs::rename(&temporary, &self.path))
            .map_err(|error| format!("{}: {error}", self.path.display()))?;
        if let Ok(meta) = std::fs::metadata(&self.path) {
            self.remember(FileVersion::of(&meta), credentials);
        }
        self.saves.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Hands each token in `credentials` to the scrubber, so no log line or outcome shows it.
fn register_tokens(credentials: &StoredCredentials) {
    let Ok(Value::Object(fields)) = serde_json::to_value(&credentials.token_response) else {
        return;
    };
    for name in ["access_token", "refresh_token", "id_token"] {
        if let Some(Value::String(token)) = fields.get(name) {
            opledger_domain::redact::register(token);
        }
    }
}

/// What the SDK's manager is given: the sealed file, shared with the connector.
struct Store(Arc<SealedLogin>);

#[async_trait::async_trait]
impl CredentialStore for Store {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        self.0.read().map_err(AuthError::CredentialStoreError)
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        self.0
            .write(&credentials)
            .map_err(AuthError::CredentialStoreError)
    }

    async fn clear(&self) -> Result<(), AuthError> {
        match std::fs::remove_file(&self.0.path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(
                AuthError::CredentialStoreError(format!("{}: {error}", self.0.path.display())),
            ),
            _ => Ok(()),
        }
    }
}

/// One connector's login: how it is asked for, where it is kept, and the SDK's client that
/// sends its tokens (made at the first session, again after the upstream refused a token).
pub(crate) struct Login {
    url: String,
    spec: UpstreamLogin,
    client_id: Option<String>,
    client_secret: Option<String>,
    http: reqwest013::Client,
    /// The sealed file and the provider id it is kept for, once the configuration placed it.
    store: OnceLock<(Arc<SealedLogin>, String)>,
    client: Mutex<Option<AuthClient<reqwest013::Client>>>,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("url", &self.url)
            .field("file", &self.file())
            .finish_non_exhaustive()
    }
}

/// What a finished login says (never a token).
#[derive(Clone, Debug)]
pub struct LoginReport {
    /// The file the login is sealed in.
    pub file: PathBuf,
    /// The client id used (configured, or registered now).
    pub client_id: String,
    /// Whether the client registered itself now (RFC 7591).
    pub registered: bool,
    /// The authorization server's issuer, when its metadata names one.
    pub issuer: Option<String>,
    /// The scopes granted.
    pub scopes: Vec<String>,
    /// Whether a refresh token was granted (without one the login lasts as long as the access
    /// token).
    pub refresh_token: bool,
    /// The access token's lifetime, in seconds, when the server gave one.
    pub expires_in_s: Option<u64>,
}

impl Login {
    pub fn new(
        url: &str,
        spec: &UpstreamLogin,
        client_id: Option<String>,
        client_secret: Option<String>,
        http: reqwest013::Client,
    ) -> Self {
        if let Some(secret) = &client_secret {
            opledger_domain::redact::register(secret);
        }
        Self {
            url: url.to_owned(),
            spec: spec.clone(),
            client_id,
            client_secret,
            http,
            store: OnceLock::new(),
            client: Mutex::new(None),
        }
    }

    /// Names where the login is kept: `file`, sealed under `key`, for provider `provider`.
    /// Placed once; a second place is ignored.
    pub fn place(&self, provider: &str, file: PathBuf, key: Key) {
        let sealed = SealedLogin::new(file, key, provider, &self.url);
        let _ = self.store.set((Arc::new(sealed), provider.to_owned()));
    }

    pub fn file(&self) -> Option<&Path> {
        self.store.get().map(|(store, _)| store.path())
    }

    /// The provider id the login is kept for (empty until placed).
    pub fn provider(&self) -> &str {
        self.store
            .get()
            .map_or("", |(_, provider)| provider.as_str())
    }

    /// How many times the login's credentials were saved (the login, then each renewal).
    pub fn saves(&self) -> u64 {
        self.store.get().map_or(0, |(store, _)| store.saves())
    }

    /// The sealed file and the provider id, or what to configure.
    fn store(&self) -> Result<(Arc<SealedLogin>, &str), String> {
        self.store
            .get()
            .map(|(store, provider)| (Arc::clone(store), provider.as_str()))
            .ok_or_else(|| {
                "the upstream acts for a person's login, kept sealed under the server's key-encryption key, and no key is configured; set OPLEDGER_KEK or [personal_data] kek_file / kek_env".to_owned()
            })
    }

    /// The SDK's client carrying the login's tokens, made from the sealed file when none is at
    /// hand. Nothing is sent without one.
    pub async fn client(&self) -> Result<AuthClient<reqwest013::Client>, Unready> {
        let unready = |reason: String| Unready {
            reason,
            retry_after_ms: Some(REFUSED_LOGIN_WAIT_MS),
        };
        let mut held = self.client.lock().await;
        if let Some(client) = &*held {
            return Ok(client.clone());
        }
        let (store, provider) = self.store().map_err(unready)?;
        let again = format!("run `opledger connectors login {provider}`");
        match store.read() {
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err(unready(format!(
                    "no one has logged in to the upstream `{provider}` yet; {again}"
                )))
            }
            Err(error) => return Err(unready(error)),
        }
        let mut manager = AuthorizationManager::new(self.url.as_str())
            .await
            .map_err(|error| unready(format!("the upstream's URL: {error}")))?;
        manager.set_credential_store(Store(Arc::clone(&store)));
        let ready = manager
            .initialize_from_store()
            .await
            .map_err(|error| Unready {
                reason: format!(
                    "the upstream's authorization server could not be reached: {error}"
                ),
                retry_after_ms: None,
            })?;
        if !ready {
            return Err(unready(format!(
                "the upstream's authorization server changed since the login; {again}"
            )));
        }
        if let Some(id) = &self.client_id {
            let mut config = OAuthClientConfig::new(id.clone(), self.redirect_uri(0));
            if let Some(secret) = &self.client_secret {
                config = config.with_client_secret(secret.clone());
            }
            manager
                .configure_client(config)
                .map_err(|error| unready(format!("the configured client: {error}")))?;
        }
        let client = AuthClient::new(self.http.clone(), manager);
        *held = Some(client.clone());
        Ok(client)
    }

    /// Makes sure the login's access token is good for a request about to be sent, renewing it
    /// now if it is about to expire: a renewal that fails here stops the request before it is
    /// written, and one that hangs is cut by the caller's deadline, again before anything was
    /// written (the SDK's client would otherwise renew inside the send, where a hang could not be
    /// told from a lost answer).
    pub async fn fresh_token(&self) -> Result<(), Refusal> {
        let client = self
            .client()
            .await
            .map_err(|unready| Refusal::LogInAgain(unready.reason))?;
        match client.get_access_token().await {
            Ok(_) => Ok(()),
            Err(AuthError::AuthorizationRequired | AuthError::TokenRefreshRejected(_)) => {
                Err(Refusal::LogInAgain(
                    "the login's token expired and could not be renewed".to_owned(),
                ))
            }
            Err(other) => Err(Refusal::Unavailable(format!(
                "no new token for the upstream: {other}"
            ))),
        }
    }

    /// Drops the client, so the next session reads the sealed file again (after a refusal: a
    /// person may have logged in again meanwhile).
    pub async fn forget(&self) {
        *self.client.lock().await = None;
    }

    fn redirect_uri(&self, port: u16) -> String {
        format!(
            "http://127.0.0.1:{}{CALLBACK_PATH}",
            self.spec.redirect_port.unwrap_or(port)
        )
    }

    /// The whole authorization flow, once: discovery, registration (when no client id is
    /// configured), the URL handed to `show` for the person to open, the code received on
    /// 127.0.0.1 within `timeout`, exchanged, and the credentials sealed.
    pub async fn log_in(
        &self,
        show: &mut (dyn FnMut(&str) + Send),
        timeout: Duration,
    ) -> Result<LoginReport, String> {
        let (store, _) = self.store()?;
        let port = self.spec.redirect_port.unwrap_or(0);
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(|error| {
                format!("the loopback listener for the redirect cannot listen on 127.0.0.1:{port}: {error}")
            })?;
        let port = listener
            .local_addr()
            .map_err(|error| error.to_string())?
            .port();
        let redirect_uri = self.redirect_uri(port);
        let (mut manager, issuer) = self.discover().await?;
        manager.set_credential_store(Store(Arc::clone(&store)));
        let mut request =
            AuthorizationRequest::new(redirect_uri.clone()).with_client_name("opledger");
        if !self.spec.scopes.is_empty() {
            request = request.with_scopes(self.spec.scopes.iter().cloned());
        }
        if let Some(id) = &self.client_id {
            request = request.with_preregistered_client(id.clone());
            if let Some(secret) = &self.client_secret {
                request = request.with_client_secret(secret.clone());
            }
        }
        let session = AuthorizationSession::new(manager, request)
            .await
            .map_err(|(_, error)| {
                format!("the authorization request could not be made: {error}")
            })?;
        show(&session.auth_url);
        let callback = tokio::time::timeout(timeout, receive_callback(&listener, port))
            .await
            .map_err(|_| {
                format!(
                    "no answer reached {redirect_uri} within {} s; nothing was stored (run the login again and open the URL it prints)",
                    timeout.as_secs()
                )
            })??;
        // Single-use and worthless without the verifier, but the SDK logs it at debug level.
        opledger_domain::redact::register(&callback.code);
        let granted = session
            .handle_callback_with_issuer(
                &callback.code,
                &callback.csrf_token,
                callback.issuer.as_deref(),
            )
            .await
            .map_err(|error| {
                format!("the authorization server did not exchange the code: {error}; nothing was stored")
            })?;
        let stored = store
            .read()?
            .ok_or("the login was exchanged but not stored")?;
        let fields = serde_json::to_value(&granted).unwrap_or(Value::Null);
        Ok(LoginReport {
            file: store.path().to_path_buf(),
            registered: self.client_id.is_none(),
            client_id: stored.client_id,
            issuer,
            scopes: stored.granted_scopes,
            refresh_token: fields.get("refresh_token").is_some_and(Value::is_string),
            expires_in_s: fields.get("expires_in").and_then(Value::as_u64),
        })
    }

    /// The SDK's manager with the upstream's authorization server found: from the protected
    /// resource metadata its 401 names, else from the well-known addresses; and its issuer.
    async fn discover(&self) -> Result<(AuthorizationManager, Option<String>), String> {
        let mut manager = AuthorizationManager::new(self.url.as_str())
            .await
            .map_err(|error| format!("the upstream's URL: {error}"))?;
        let challenge = self.challenge().await?;
        let resolution = manager
            .resolve_metadata_from_challenge(challenge.as_deref())
            .await
            .map_err(|error| {
                format!("the upstream's authorization server was not found: {error}")
            })?;
        if resolution.source == AuthorizationMetadataSource::LegacyEndpointFallback {
            return Err(format!("the upstream {} publishes no protected resource metadata (RFC 9728) and no authorization server metadata (RFC 8414); it cannot be logged in to this way", self.url));
        }
        let issuer = resolution.metadata.issuer.clone();
        manager.set_metadata(resolution.metadata);
        Ok((manager, issuer))
    }

    /// The upstream's `WWW-Authenticate` challenge to an unauthenticated `initialize` (`None`:
    /// it asked for none, and discovery starts from the well-known addresses).
    async fn challenge(&self) -> Result<Option<String>, String> {
        let initialize = serde_json::json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "opledger", "version": env!("CARGO_PKG_VERSION")}},
        });
        let answer = self
            .http
            .post(&self.url)
            .header(http::header::ACCEPT, "application/json, text/event-stream")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(initialize.to_string())
            .send()
            .await
            .map_err(|error| format!("the upstream {} did not answer: {error}", self.url))?;
        if answer.status() != http::StatusCode::UNAUTHORIZED {
            return Ok(None);
        }
        Ok(answer
            .headers()
            .get(http::header::WWW_AUTHENTICATE)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned))
    }
}

/// Waits on the loopback listener for the authorization server's redirect, answering each
/// request with a short page; other paths and broken requests are answered and skipped.
async fn receive_callback(
    listener: &tokio::net::TcpListener,
    port: u16,
) -> Result<AuthorizationCallback, String> {
    loop {
        let (mut stream, _) = listener
            .accept()
            .await
            .map_err(|error| format!("the loopback listener failed: {error}"))?;
        let read = tokio::time::timeout(
            Duration::from_millis(CALLBACK_READ_TIMEOUT_MS),
            read_request_target(&mut stream),
        )
        .await;
        let Ok(Some(target)) = read else {
            continue;
        };
        let url = format!("http://127.0.0.1:{port}{target}");
        let parsed = url::Url::parse(&url).ok();
        let on_path = parsed
            .as_ref()
            .is_some_and(|url| url.path() == CALLBACK_PATH);
        if !on_path {
            answer(&mut stream, "404 Not Found", "Not the login's redirect.").await;
            continue;
        }
        let query = |name: &str| {
            parsed.as_ref().and_then(|url| {
                url.query_pairs()
                    .find(|(key, _)| key == name)
                    .map(|(_, value)| value.into_owned())
            })
        };
        if let Some(error) = query("error") {
            answer(
                &mut stream,
                "200 OK",
                "The login was refused; see the terminal.",
            )
            .await;
            let said = query("error_description").map_or_else(String::new, |d| format!(": {d}"));
            return Err(format!(
                "the authorization server refused the login: {error}{said}; nothing was stored"
            ));
        }
        match AuthorizationCallback::from_redirect_url(&url) {
            Ok(callback) => {
                answer(
                    &mut stream,
                    "200 OK",
                    "Logged in. You may close this tab and return to the terminal.",
                )
                .await;
                return Ok(callback);
            }
            Err(_) => {
                answer(
                    &mut stream,
                    "400 Bad Request",
                    "The redirect carries no code and state.",
                )
                .await;
            }
        }
    }
}

/// The request target of one HTTP/1.1 request (`/callback?code=…`), or `None` when none came.
async fn read_request_target(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0_u8; 1024];
    while !buffer.windows(4).any(|window| window == b"\r\n\r\n") {
        if buffer.len() >= MAX_CALLBACK_REQUEST_BYTES {
            return None;
        }
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
    let text = std::str::from_utf8(&buffer).ok()?;
    let mut words = text.lines().next()?.split(' ');
    match (words.next(), words.next()) {
        (Some("GET"), Some(target)) if target.starts_with('/') => Some(target.to_owned()),
        _ => None,
    }
}

async fn answer(stream: &mut tokio::net::TcpStream, status: &str, said: &str) {
    let body = format!("<!doctype html><title>opledger</title><p>{said}</p>\n");
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Why a request on a session was stopped for its login; either way it was not carried out.
pub(crate) enum Refusal {
    /// The upstream refused the token (a 401 is a refusal before anything runs) and no new one
    /// could be had, or the authorization server refused the refresh token: a person must log
    /// in again.
    LogInAgain(String),
    /// The authorization server could not be asked for a new token (no answer, a 5xx): the
    /// request was stopped before it was written, and may be sent later.
    Unavailable(String),
}

/// Whether `error` (a failed request on a session) is the login's, and which kind.
pub(crate) fn refused_for_authorization(error: &rmcp::service::ServiceError) -> Option<Refusal> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(inner) = cause {
        if let Some(auth) = inner.downcast_ref::<AuthError>() {
            return Some(match auth {
                AuthError::TokenRefreshRejected(said) => Refusal::LogInAgain(format!(
                    "the authorization server refused the refresh token: {said}"
                )),
                AuthError::AuthorizationRequired => Refusal::LogInAgain(
                    "the upstream refused the token and it could not be renewed".to_owned(),
                ),
                other => Refusal::Unavailable(format!("no new token for the upstream: {other}")),
            });
        }
        cause = inner.source();
    }
    if error.is_authorization_required() || error.auth_challenge().is_some() {
        return Some(Refusal::LogInAgain(
            "the upstream refused the token and it could not be renewed".to_owned(),
        ));
    }
    None
}

/// Whether a session could not start because the login's token was refused (or none could be
/// had): the `initialize` request was answered 401, or stopped before it was written.
pub(crate) fn refused_at_start(error: &rmcp::service::ClientInitializeError) -> bool {
    if error.auth_challenge().is_some() || error.is_authorization_required() {
        return true;
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(inner) = cause {
        if inner.is::<AuthError>() {
            return true;
        }
        cause = inner.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials() -> StoredCredentials {
        let response: rmcp::transport::auth::OAuthTokenResponse =
            serde_json::from_value(serde_json::json!({
                "access_token": "access-a1b2c3d4e5", "token_type": "Bearer",
                "expires_in": 3600, "refresh_token": "refresh-f6g7h8i9j0",
            }))
            .expect("a token response");
        StoredCredentials::new(
            "client-1".to_owned(),
            Some(response),
            vec!["records".to_owned()],
            Some(1),
        )
    }

    #[test]
    fn a_login_is_sealed_opens_with_its_key_for_its_connector_only_and_holds_no_token_in_clear() {
        let dir = std::env::temp_dir().join(format!("opledger-mcp-login-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a folder");
        let path = dir.join("opledger-mcp-login-notes.sealed");
        let key = Key::from_bytes([7; 32]);
        let sealed = SealedLogin::new(
            path.clone(),
            key.clone(),
            "notes",
            "https://mcp.example.com/mcp",
        );
        assert!(sealed.read().expect("no file yet is no login").is_none());
        sealed.write(&credentials()).expect("sealed");
        let bytes = std::fs::read(&path).expect("written");
        for token in ["access-a1b2c3d4e5", "refresh-f6g7h8i9j0", "client-1"] {
            assert!(
                !bytes
                    .windows(token.len())
                    .any(|window| window == token.as_bytes()),
                "`{token}` is in clear"
            );
        }
        let opened = sealed.read().expect("opens").expect("a login");
        assert_eq!(opened.client_id, "client-1");
        let response = serde_json::to_value(&opened.token_response).expect("JSON");
        assert_eq!(response["refresh_token"], "refresh-f6g7h8i9j0");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path)
                .expect("exists")
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "only its owner may read it");
        }
        // A login written by another process (a person logged in again) is read at once.
        let again = SealedLogin::new(
            path.clone(),
            key.clone(),
            "notes",
            "https://mcp.example.com/mcp",
        );
        let mut newer = credentials();
        newer.client_id = "client-2".to_owned();
        again.write(&newer).expect("sealed again");
        assert_eq!(
            sealed.read().expect("opens").expect("a login").client_id,
            "client-2"
        );
        let other_key = SealedLogin::new(
            path.clone(),
            Key::from_bytes([8; 32]),
            "notes",
            "https://mcp.example.com/mcp",
        );
        let other_connector = SealedLogin::new(
            path.clone(),
            key.clone(),
            "crm",
            "https://mcp.example.com/mcp",
        );
        let other_url = SealedLogin::new(path, key, "notes", "https://elsewhere.example.com/mcp");
        for wrong in [other_key, other_connector, other_url] {
            let refused = wrong.read().expect_err("does not open");
            assert!(refused.contains("log in again"), "{refused}");
        }
        std::fs::remove_dir_all(&dir).expect("cleaned up");
    }
}
