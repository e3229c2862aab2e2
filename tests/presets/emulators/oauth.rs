//! An OAuth2 token endpoint every emulator can mount, speaking each provider's dialect as its
//! documentation describes it. Facts relied on, per dialect:
//!
//! - **Salesforce** (Salesforce Help, "OAuth 2.0 Refresh Token Flow for Renewed Sessions"; REST
//!   API guide, "Understanding the OAuth Refresh Token Process"): `POST /services/oauth2/token`,
//!   form `grant_type=refresh_token&client_id&client_secret&refresh_token`; the answer is
//!   `{"access_token","instance_url","id","token_type":"Bearer","issued_at","signature"}` with no
//!   `expires_in` (the org's session timeout ends the token; an expired one answers 401
//!   `INVALID_SESSION_ID`); a bad refresh token answers 400 `{"error":"invalid_grant",
//!   "error_description":"expired access/refresh token"}` (for a deactivated user, "inactive
//!   user", and the same refresh token works again once the user is active), a bad client 400
//!   `invalid_client_id`
//!   / `invalid_client`. Refresh token rotation is a connected-app setting: when on, each renewal
//!   issues a new refresh token and invalidates the old. The client credentials flow (Salesforce
//!   Help, "OAuth 2.0 Client Credentials Flow for Server-to-Server Integration"): the same endpoint
//!   on the org's My Domain, form `grant_type=client_credentials&client_id&client_secret`; the
//!   connected app names a "Run As" user whose access the token carries; the answer is the
//!   refresh-token flow's without a refresh token (and again without `expires_in`); an app
//!   without a Run As user answers 400 `{"error":"invalid_grant","error_description":"no client
//!   credentials user enabled"}`.
//! - **HubSpot** (developers.hubspot.com, "Refresh an access token"): `POST /oauth/v1/token`, form;
//!   `{"token_type":"bearer","refresh_token","access_token","expires_in":1800}`; the refresh token
//!   stays the same; a bad one answers 400 `{"status":"BAD_REFRESH_TOKEN","message":"missing or
//!   invalid refresh token"}`.
//! - **Zendesk** (developer.zendesk.com, "Working with OAuth refresh tokens"; the refresh-token
//!   announcement of April 2025): `POST /oauth/tokens`; every renewal returns a new refresh token
//!   and deletes the previous access and refresh tokens (rotation); `expires_in` (30 minutes by
//!   default); a used or revoked refresh token answers 400 `{"error":"invalid_grant",…}`.
//!
//! Not confirmed from the docs: whether Zendesk also takes a form body (the emulator takes a form,
//! as RFC 6749 requires), and HubSpot's body for a bad client (taken as `BAD_CLIENT_ID`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

use super::Reply;

/// Which provider's token endpoint it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Salesforce,
    HubSpot,
    Zendesk,
}

impl Dialect {
    /// Where the endpoint is.
    pub const fn path(self) -> &'static str {
        match self {
            Self::Salesforce => "/services/oauth2/token",
            Self::HubSpot => "/oauth/v1/token",
            Self::Zendesk => "/oauth/tokens",
        }
    }

    /// A refused refresh token; `salesforce_says` is Salesforce's description of the cause.
    fn bad_grant(self, salesforce_says: &str) -> Reply {
        match self {
            Self::HubSpot => Reply::json(
                400,
                &json!({"status": "BAD_REFRESH_TOKEN", "message": "missing or invalid refresh token"}),
            ),
            Self::Salesforce => Reply::json(
                400,
                &json!({"error": "invalid_grant", "error_description": salesforce_says}),
            ),
            Self::Zendesk => Reply::json(
                400,
                &json!({"error": "invalid_grant", "error_description": "The provided authorization grant or refresh token is invalid, expired or revoked."}),
            ),
        }
    }

    fn bad_client(self) -> Reply {
        match self {
            Self::HubSpot => Reply::json(
                400,
                &json!({"status": "BAD_CLIENT_ID", "message": "missing or unknown client id"}),
            ),
            Self::Salesforce => Reply::json(
                400,
                &json!({"error": "invalid_client_id", "error_description": "client identifier invalid"}),
            ),
            Self::Zendesk => Reply::json(
                401,
                &json!({"error": "invalid_client", "error_description": "Client authentication failed."}),
            ),
        }
    }
}

/// How the endpoint is set up: its dialect, its client, lifetimes and rotation.
#[derive(Clone, Debug)]
pub struct Setup {
    pub dialect: Dialect,
    pub client_id: String,
    pub client_secret: String,
    /// The access token's lifetime as `expires_in` says, in seconds (`None`: not said).
    pub expires_in_s: Option<u64>,
    /// Whether a renewal issues a new refresh token and invalidates the old.
    pub rotates: bool,
}

#[derive(Debug, Default)]
struct Tokens {
    setup: Option<Setup>,
    /// Refresh token → account.
    refresh: BTreeMap<String, String>,
    /// Access token → account; removed when it expires or is revoked.
    access: BTreeMap<String, (String, Option<Instant>)>,
    issued: u64,
    /// Accounts whose integration user is deactivated: their refresh tokens are refused until
    /// the user is active again.
    inactive: Vec<String>,
    /// Token requests answered, granted or not.
    requests: u64,
    /// The account of the connected app's "Run As" user, when the client credentials flow is
    /// enabled (Salesforce).
    run_as: Option<String>,
    /// Requests to the API refused for an unknown or expired access token.
    refused: u64,
}

/// An emulator's OAuth2 side: the token endpoint and the access tokens it issued.
#[derive(Debug, Default)]
pub struct OAuth(Mutex<Tokens>);

impl OAuth {
    /// Sets the endpoint up.
    pub fn set_up(&self, setup: Setup) {
        self.lock().setup = Some(setup);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tokens> {
        self.0.lock().expect("not poisoned")
    }

    /// An account authorises the app: a refresh token for it, as the authorization code flow
    /// would have given.
    pub fn authorise(&self, account: &str) -> String {
        let mut tokens = self.lock();
        tokens.issued += 1;
        let token = format!("refresh-{account}-{}", tokens.issued);
        tokens.refresh.insert(token.clone(), account.to_owned());
        token
    }

    /// The account removes the app: its refresh and access tokens stop working.
    pub fn revoke(&self, account: &str) {
        let mut tokens = self.lock();
        tokens.refresh.retain(|_, owner| owner != account);
        tokens.access.retain(|_, (owner, _)| owner != account);
    }

    /// An admin deactivates the account's integration user: its access tokens stop working and
    /// its refresh token is refused (Salesforce: 400 `invalid_grant` "inactive user") until
    /// [`OAuth::reactivate`]; the refresh token itself stays the same.
    pub fn deactivate(&self, account: &str) {
        let mut tokens = self.lock();
        tokens.inactive.push(account.to_owned());
        tokens.access.retain(|_, (owner, _)| owner != account);
    }

    /// The admin activates the user again: the same refresh token works again.
    pub fn reactivate(&self, account: &str) {
        self.lock().inactive.retain(|owner| owner != account);
    }

    /// Enables the client credentials flow with `account`'s user as the app's "Run As" user.
    pub fn enable_client_credentials(&self, account: &str) {
        self.lock().run_as = Some(account.to_owned());
    }

    /// Every access token issued so far stops working (a session timeout).
    pub fn expire_access_tokens(&self) {
        self.lock().access.clear();
    }

    /// Token requests answered so far.
    pub fn requests(&self) -> u64 {
        self.lock().requests
    }

    /// API requests refused for their access token so far.
    pub fn refused(&self) -> u64 {
        self.lock().refused
    }

    /// The account a live access token belongs to; counts a refusal otherwise.
    pub fn account(&self, token: &str) -> Option<String> {
        let mut tokens = self.lock();
        let live = match tokens.access.get(token) {
            Some((account, expires)) if expires.is_none_or(|at| Instant::now() < at) => {
                Some(account.clone())
            }
            _ => None,
        };
        if live.is_none() && tokens.setup.is_some() {
            tokens.refused += 1;
        }
        live
    }

    fn grant(&self, form: &BTreeMap<String, String>) -> Reply {
        let mut tokens = self.lock();
        tokens.requests += 1;
        let Some(setup) = tokens.setup.clone() else {
            return Reply::json(404, &json!({"error": "not_found"}));
        };
        let dialect = setup.dialect;
        let field = |name: &str| form.get(name).map(String::as_str);
        if field("client_id") != Some(setup.client_id.as_str())
            || field("client_secret") != Some(setup.client_secret.as_str())
        {
            return dialect.bad_client();
        }
        let client_credentials =
            dialect == Dialect::Salesforce && field("grant_type") == Some("client_credentials");
        if field("grant_type") != Some("refresh_token") && !client_credentials {
            return Reply::json(
                400,
                &json!({"error": "unsupported_grant_type", "error_description": "grant type not supported"}),
            );
        }
        let presented = field("refresh_token").unwrap_or_default().to_owned();
        let owner = if client_credentials {
            tokens.run_as.clone()
        } else {
            tokens.refresh.get(&presented).cloned()
        };
        let Some(account) = owner else {
            return dialect.bad_grant(if client_credentials {
                "no client credentials user enabled"
            } else {
                "expired access/refresh token"
            });
        };
        if tokens.inactive.contains(&account) {
            return dialect.bad_grant("inactive user");
        }
        tokens.issued += 1;
        let access = format!("access-{account}-{}", tokens.issued);
        let expires = setup
            .expires_in_s
            .map(|seconds| Instant::now() + std::time::Duration::from_secs(seconds));
        tokens
            .access
            .insert(access.clone(), (account.clone(), expires));
        let refresh = if setup.rotates && !client_credentials {
            tokens.refresh.remove(&presented);
            let rotated = format!("refresh-{account}-{}", tokens.issued);
            tokens.refresh.insert(rotated.clone(), account.clone());
            rotated
        } else {
            presented
        };
        let body = match dialect {
            Dialect::Salesforce => {
                let mut body = json!({
                    "access_token": access, "instance_url": "https://example.my.salesforce.com",
                    "id": format!("https://login.salesforce.com/id/00D/{account}"),
                    "token_type": "Bearer", "issued_at": "1700000000000", "signature": "c2ln"
                });
                if setup.rotates && !client_credentials {
                    body["refresh_token"] = Value::from(refresh);
                }
                body
            }
            Dialect::HubSpot | Dialect::Zendesk => json!({
                "token_type": "bearer", "access_token": access, "refresh_token": refresh,
                "expires_in": setup.expires_in_s,
            }),
        };
        Reply::json(200, &body)
    }
}

/// The token endpoint of `dialect`, served from `oauth`, as a router to merge into the API's.
pub fn routes<S: Clone + Send + Sync + 'static>(dialect: Dialect, oauth: Arc<OAuth>) -> Router<S> {
    Router::new()
        .route(dialect.path(), post(token))
        .with_state(oauth)
}

async fn token(State(oauth): State<Arc<OAuth>>, body: Bytes) -> Reply {
    let form: BTreeMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    oauth.grant(&form)
}
