//! The sessions one MCP connector keeps to its upstream: started when first needed, shared by
//! every call (each session multiplexes), started again after it closed — never sooner than the
//! restart wait after its last start.
//!
//! A session that cannot be had is reported as such ([`Unready`]): the call was never written,
//! which is the one case a call is provably not sent.

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use tokio::sync::Mutex;

/// A live session with the upstream.
pub(crate) type Session = RunningService<RoleClient, ()>;

/// How a session is started, with every value read from the environment already in hand.
#[derive(Clone)]
pub(crate) enum Launch {
    Stdio {
        command: String,
        args: Vec<String>,
        env: Vec<(String, OsString)>,
        cwd: Option<String>,
    },
    Http {
        url: String,
        headers: Vec<(http::HeaderName, http::HeaderValue)>,
        /// Made once per connector: it keeps the connections and the trusted roots.
        client: reqwest013::Client,
        /// Where a session's access token comes from, when the upstream takes one.
        oauth: Option<Arc<TokenSource>>,
        /// A person's login, whose tokens the SDK's client sends and renews.
        login: Option<Arc<super::login::Login>>,
    },
}

/// An upstream's OAuth2 access token, obtained with the client-credentials grant and kept for
/// all its sessions (one request to the token endpoint per renewal, whatever the sessions). A
/// session is started with the token of the moment and started again once it is due for renewal,
/// since the SDK's transport sends the headers it was made with.
pub(crate) struct TokenSource {
    account: crate::oauth::OAuthAccount,
    client: reqwest::Client,
    token_url: String,
}

impl TokenSource {
    pub fn new(
        spec: &super::spec::UpstreamOAuth,
        client_id: String,
        client_secret: String,
        client: reqwest::Client,
    ) -> Arc<Self> {
        opledger_domain::redact::register(&client_secret);
        let oauth = crate::oauth::OAuth2Spec {
            grant: crate::oauth::Grant::ClientCredentials,
            token_url: spec.token_url.clone(),
            scopes: spec.scopes.clone(),
            body_encoding: crate::body::BodyEncoding::Form,
            refused_wait_ms: crate::oauth::DEFAULT_REFUSED_WAIT_MS,
        };
        let grant = crate::oauth::GrantSecrets {
            client_id: crate::credentials::Secret::new(client_id),
            client_secret: crate::credentials::Secret::new(client_secret),
            refresh_token: None,
        };
        Arc::new(Self {
            account: crate::oauth::OAuthAccount::new(oauth, grant),
            client,
            token_url: spec.token_url.clone(),
        })
    }

    /// A usable token, or why none can be had now (nothing is sent without one).
    async fn token(&self) -> Result<crate::oauth::Token, Unready> {
        self.account
            .authorize(&self.client, &self.token_url, None)
            .await
            .map_err(|no_token| {
                let said = match no_token.failure {
                    crate::oauth::TokenFailure::Refused { message } => {
                        format!("the token endpoint refused the client's credentials: {message}; correct client_id_env and client_secret_env")
                    }
                    crate::oauth::TokenFailure::Unavailable { message } => {
                        format!("the token endpoint gave no token: {message}")
                    }
                };
                Unready {
                    reason: format!("no access token for the upstream: {said}"),
                    retry_after_ms: Some(no_token.retry_after_ms.max(1)),
                }
            })
    }

    /// How many times the token endpoint was asked.
    pub fn requests(&self) -> u64 {
        self.account.refreshes()
    }
}

impl std::fmt::Debug for Launch {
    /// Never the environment's or the headers' values: they may be secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stdio { command, args, .. } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .finish_non_exhaustive(),
            Self::Http { url, .. } => f
                .debug_struct("Http")
                .field("url", url)
                .finish_non_exhaustive(),
        }
    }
}

/// Variables the child keeps from this process besides the ones the document names: what a
/// program needs to be found and to run (`uvx` and `npx` keep their caches under `HOME`).
const INHERITED_VARIABLES: &[&str] = &["PATH", "HOME", "LANG", "TMPDIR"];

/// The HTTP client of a Streamable HTTP upstream: TLS through rustls, trusting the operating
/// system's roots (`SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured) and the certificates of
/// `ca_file` beside them. Redirects are not followed: an MCP endpoint answers where it is.
pub(crate) fn http_client(ca_file: Option<&str>) -> Result<reqwest013::Client, String> {
    let mut builder = reqwest013::Client::builder().redirect(reqwest013::redirect::Policy::none());
    if let Some(path) = ca_file {
        let pem = std::fs::read(path).map_err(|error| {
            format!("`{path}` cannot be read ({error}); give the PEM file of the CA that signed the upstream's certificate")
        })?;
        let certificates = reqwest013::Certificate::from_pem_bundle(&pem)
            .map_err(|error| format!("`{path}` is no PEM certificate bundle: {error}"))?;
        if certificates.is_empty() {
            return Err(format!(
                "`{path}` holds no certificate (a PEM file starts with -----BEGIN CERTIFICATE-----)"
            ));
        }
        for certificate in certificates {
            builder = builder.add_root_certificate(certificate);
        }
    }
    builder
        .build()
        .map_err(|error| format!("the HTTPS client cannot be made: {error}"))
}

/// An error with every cause under it (`: `-joined), skipping a cause its parent already says:
/// a refused certificate or a refused connection is said at the bottom of the chain, and the top
/// of it only says a request failed. (The SDK's HTTP error keeps the client's error without
/// naming it as its cause, so the chain is followed into it by hand.)
fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    use rmcp::service::ClientInitializeError;
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    let mut text = error.to_string();
    let mut cause = match error.downcast_ref::<ClientInitializeError>() {
        Some(ClientInitializeError::TransportError { error, .. }) => Some(&*error.error as _),
        _ => error.source(),
    };
    while let Some(inner) = cause {
        let said = inner.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = match inner.downcast_ref::<StreamableHttpError<reqwest013::Error>>() {
            Some(StreamableHttpError::Client(client)) => Some(client),
            _ => inner.source(),
        };
    }
    text
}

/// Why no session is at hand; nothing was sent.
#[derive(Debug)]
pub(crate) struct Unready {
    pub reason: String,
    pub retry_after_ms: Option<u64>,
}

#[derive(Default)]
struct Slot {
    session: Option<Arc<Session>>,
    last_start: Option<Instant>,
    /// When the session's access token is due for renewal (`None`: no token, or no expiry).
    renew_at: Option<tokio::time::Instant>,
}

/// Every session of one connector.
pub(crate) struct Sessions {
    launch: Launch,
    slots: Vec<Mutex<Slot>>,
    next: AtomicUsize,
    start_timeout: Duration,
    restart_wait: Duration,
    starts: AtomicU64,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("launch", &self.launch)
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl Sessions {
    pub fn new(
        launch: Launch,
        count: usize,
        start_timeout: Duration,
        restart_wait: Duration,
    ) -> Self {
        assert!(
            (1..=super::MAX_SESSIONS_PER_UPSTREAM).contains(&count),
            "the document's check keeps the session count in range"
        );
        Self {
            launch,
            slots: (0..count).map(|_| Mutex::new(Slot::default())).collect(),
            next: AtomicUsize::new(0),
            start_timeout,
            restart_wait,
            starts: AtomicU64::new(0),
        }
    }

    /// How a session is started (for a one-off session, such as listing the tools).
    pub fn launch_for_listing(&self) -> Launch {
        self.launch.clone()
    }

    /// How many times the upstream's token endpoint was asked (`None`: it takes no token).
    pub fn token_requests(&self) -> Option<u64> {
        match &self.launch {
            Launch::Http {
                oauth: Some(source),
                ..
            } => Some(source.requests()),
            _ => None,
        }
    }

    /// The person's login the upstream is reached with, if it takes one.
    pub fn login(&self) -> Option<&Arc<super::login::Login>> {
        match &self.launch {
            Launch::Http {
                login: Some(login), ..
            } => Some(login),
            _ => None,
        }
    }

    /// How many sessions were started so far (a restart counts).
    pub fn starts(&self) -> u64 {
        self.starts.load(Ordering::Relaxed)
    }

    /// A live session (the next one in turn), started if it is not open.
    pub async fn get(&self) -> Result<(usize, Arc<Session>), Unready> {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut slot = self.slots[index].lock().await;
        if let Some(session) = &slot.session {
            let token_due = slot
                .renew_at
                .is_some_and(|at| tokio::time::Instant::now() >= at);
            if !session.is_closed() && !token_due {
                return Ok((index, Arc::clone(session)));
            }
            // A session whose token is due is left to the calls still using it (it closes when
            // the last lets it go) and not counted as closed: it is started again at once.
            if token_due {
                slot.last_start = None;
            }
            slot.session = None;
        }
        if let Some(last) = slot.last_start {
            let since = last.elapsed();
            if since < self.restart_wait {
                let wait = self.restart_wait - since;
                return Err(Unready {
                    reason: format!(
                        "the upstream's session closed and was started {} ms ago; it is started again at most once every {} ms (restart_wait_ms)",
                        since.as_millis(),
                        self.restart_wait.as_millis()
                    ),
                    retry_after_ms: Some(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1)),
                });
            }
        }
        slot.last_start = Some(Instant::now());
        self.starts.fetch_add(1, Ordering::Relaxed);
        let (session, renew_at) = start(&self.launch, self.start_timeout).await?;
        let session = Arc::new(session);
        slot.session = Some(Arc::clone(&session));
        slot.renew_at = renew_at;
        Ok((index, session))
    }

    /// Forgets `session` (after it broke with a call out), so the next call starts another.
    pub async fn discard(&self, index: usize, session: &Arc<Session>) {
        let mut slot = self.slots[index].lock().await;
        if slot
            .session
            .as_ref()
            .is_some_and(|held| Arc::ptr_eq(held, session))
        {
            if let Some(held) = slot.session.take() {
                held.cancellation_token().cancel();
            }
        }
    }
}

/// Starts one session: spawns the child or connects (with an access token when the upstream
/// takes one), then the MCP `initialize` handshake, all within `timeout`. Also when the session's
/// token is due for renewal.
pub(crate) async fn start(
    launch: &Launch,
    timeout: Duration,
) -> Result<(Session, Option<tokio::time::Instant>), Unready> {
    let mut renew_at = None;
    let unready = |reason: String| Unready {
        reason,
        retry_after_ms: None,
    };
    let started = match launch {
        Launch::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut child = tokio::process::Command::new(command);
            child.args(args).env_clear();
            for name in INHERITED_VARIABLES {
                if let Some(value) = std::env::var_os(name) {
                    child.env(name, value);
                }
            }
            child.envs(env.iter().map(|(name, value)| (name, value)));
            if let Some(cwd) = cwd {
                child.current_dir(cwd);
            }
            let (transport, _) = TokioChildProcess::builder(child)
                .stderr(std::process::Stdio::inherit())
                .spawn()
                .map_err(|error| {
                    unready(format!(
                        "the upstream `{command}` could not be started: {error}"
                    ))
                })?;
            tokio::time::timeout(timeout, ().serve(transport)).await
        }
        Launch::Http {
            url,
            headers,
            client,
            oauth,
            login,
        } => {
            let mut headers: HashMap<_, _> = headers.iter().cloned().collect();
            if let Some(source) = oauth {
                let token = source.token().await?;
                headers.insert(http::header::AUTHORIZATION, token.value);
                renew_at = token.renew_at;
            }
            let config =
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(headers);
            if let Some(login) = login {
                // The SDK's client adds the login's token to each request, renews it shortly
                // before it expires, and after a 401 renews it once and sends the request again.
                let client = login.client().await?;
                let transport = StreamableHttpClientTransport::with_client(client, config);
                tokio::time::timeout(timeout, ().serve(transport)).await
            } else {
                let transport = StreamableHttpClientTransport::with_client(client.clone(), config);
                tokio::time::timeout(timeout, ().serve(transport)).await
            }
        }
    };
    let login = match launch {
        Launch::Http {
            login: Some(login), ..
        } => Some(login),
        _ => None,
    };
    match started {
        Ok(Ok(session)) => Ok((session, renew_at)),
        Ok(Err(error)) if login.is_some() && super::login::refused_at_start(&error) => {
            // The login's tokens were refused and could not be renewed: only a person can
            // help, by logging in again (read at the next start).
            if let Some(login) = login {
                login.forget().await;
            }
            Err(Unready {
                reason: format!(
                    "the upstream refused the login's token and it could not be renewed ({}); run `opledger connectors login {}` again",
                    with_causes(&error),
                    login.map(|login| login.provider()).unwrap_or_default()
                ),
                retry_after_ms: Some(super::REFUSED_LOGIN_WAIT_MS),
            })
        }
        Ok(Err(error)) => Err(unready(format!(
            "no session with the upstream: {}",
            with_causes(&error)
        ))),
        Err(_) => Err(unready(format!(
            "no session with the upstream within {} ms (start_timeout_ms)",
            timeout.as_millis()
        ))),
    }
}
