//! Credentials: how a connector authenticates, where an account's secrets come from, and the
//! ready header each request carries.
//!
//! A connector file names environment variables only (`token_env`, `username_env`,
//! `password_env`); code (tests, the demo) may hand a secret over directly. Either way a secret is
//! read once, when the connector is built, and kept only in memory: as a sensitive header value
//! and as text to scrub outcomes with. [`Secret`] has no `Display`, and every `Debug` here writes
//! `[redacted]`. The fingerprint is `sha256:` and [`FINGERPRINT_HEX_DIGITS`] hex digits of the
//! secret's SHA-256 (for basic auth, of `username:password`): enough to notice that an account's
//! credentials changed, useless for recovering them.

use std::ffi::OsString;
use std::fmt;

use opledger_domain::ids::CredentialFingerprint;
use reqwest::header::{HeaderName, HeaderValue, AUTHORIZATION};
use sha2::{Digest, Sha256};

/// How many hex digits of the secret's SHA-256 the fingerprint keeps (64 bits).
pub const FINGERPRINT_HEX_DIGITS: usize = 16;

/// How a connector's requests authenticate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    /// `Authorization: Bearer <token>`.
    Bearer,
    /// `<header>: <prefix><token>`, e.g. `X-Api-Key: <token>`.
    Header {
        /// The header's name.
        header: HeaderName,
        /// Text written before the token (often empty).
        prefix: String,
    },
    /// `Authorization: Basic <base64(username:password)>`.
    Basic,
    /// `Authorization: Bearer <access token>`, the access token obtained from the API's OAuth2
    /// token endpoint per account and renewed there (see [`crate::oauth`]).
    OAuth2(crate::oauth::OAuth2Spec),
}

impl Auth {
    /// The name written in a connector file: `bearer`, `header` or `basic`.
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Bearer => "bearer",
            Self::Header { .. } => "header",
            Self::Basic => "basic",
            Self::OAuth2(_) => "oauth2",
        }
    }
}

/// A secret value. It has no `Display`, and its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret; it is checked when the connector is built.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the request header, the token request and redaction only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// The fingerprint of this secret alone (a bearer or header token).
    pub fn fingerprint(&self) -> CredentialFingerprint {
        fingerprint_of(&self.0)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// `sha256:` and the first [`FINGERPRINT_HEX_DIGITS`] hex digits of the SHA-256 of `text`.
pub fn fingerprint_of(text: &str) -> CredentialFingerprint {
    let digest = Sha256::digest(text.as_bytes());
    let mut out = String::with_capacity(7 + FINGERPRINT_HEX_DIGITS);
    out.push_str("sha256:");
    for byte in digest.iter().take(FINGERPRINT_HEX_DIGITS / 2) {
        out.push_str(&format!("{byte:02x}"));
    }
    CredentialFingerprint::new(out).expect("a short hex digest is a valid fingerprint")
}

/// The server's key for credential fingerprints (`credential_fingerprint_key_env`). Its `Debug`
/// never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct FingerprintKey(Vec<u8>);

/// Shortest fingerprint key accepted, in bytes: HMAC-SHA256's own block of security.
pub const MIN_FINGERPRINT_KEY_BYTES: usize = 32;

impl FingerprintKey {
    /// A key of at least [`MIN_FINGERPRINT_KEY_BYTES`] bytes; the error says what to give.
    pub fn new(key: impl Into<Vec<u8>>) -> Result<Self, String> {
        let key = key.into();
        if key.len() < MIN_FINGERPRINT_KEY_BYTES {
            return Err(format!(
                "the fingerprint key is {} bytes; give at least {MIN_FINGERPRINT_KEY_BYTES} (e.g. `openssl rand -hex 32`)",
                key.len()
            ));
        }
        Ok(Self(key))
    }

    /// `hmac-sha256:` and the first [`FINGERPRINT_HEX_DIGITS`] hex digits of HMAC-SHA256 under
    /// this key of the credential's unkeyed fingerprint (which stands for its secret).
    pub fn keyed(&self, unkeyed: &CredentialFingerprint) -> CredentialFingerprint {
        use hmac::Mac as _;
        let mut mac =
            hmac::Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(unkeyed.as_str().as_bytes());
        let digest = mac.finalize().into_bytes();
        let mut out = String::with_capacity(12 + FINGERPRINT_HEX_DIGITS);
        out.push_str("hmac-sha256:");
        for byte in digest.iter().take(FINGERPRINT_HEX_DIGITS / 2) {
            out.push_str(&format!("{byte:02x}"));
        }
        CredentialFingerprint::new(out).expect("a short hex digest is a valid fingerprint")
    }
}

impl fmt::Debug for FingerprintKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FingerprintKey([redacted])")
    }
}

/// Where one secret comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretSource {
    /// The environment variable of this name, read when the connector is built.
    Env(String),
    /// The secret itself (code only: tests, the demo, a caller with its own secret store).
    Direct(Secret),
}

/// An account's credentials, matching the connector's [`Auth`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credentials {
    /// A token, for `bearer` and `header` auth.
    Token(SecretSource),
    /// A username and a password, for `basic` auth.
    Basic {
        /// The username.
        username: SecretSource,
        /// The password.
        password: SecretSource,
    },
    /// An OAuth2 client (and, for the refresh-token grant, the account's refresh token), for
    /// `oauth2` auth.
    OAuth2 {
        /// The client id (Salesforce: the consumer key).
        client_id: SecretSource,
        /// The client secret (Salesforce: the consumer secret).
        client_secret: SecretSource,
        /// The refresh token the account's authorisation gave; `None` for client credentials.
        refresh_token: Option<SecretSource>,
    },
}

impl Credentials {
    /// A token read from the environment variable `variable`.
    pub fn token_env(variable: impl Into<String>) -> Self {
        Self::Token(SecretSource::Env(variable.into()))
    }

    /// A token given directly.
    pub fn token(token: impl Into<String>) -> Self {
        Self::Token(SecretSource::Direct(Secret::new(token)))
    }

    /// A username and password given directly.
    pub fn basic(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self::Basic {
            username: SecretSource::Direct(Secret::new(username)),
            password: SecretSource::Direct(Secret::new(password)),
        }
    }
}

/// One account's credentials, ready to send. Its `Debug` shows only the fingerprint.
pub(crate) struct Credential {
    pub header: HeaderName,
    /// The static header value; for OAuth2 the value comes from [`Credential::oauth`] instead.
    pub value: HeaderValue,
    /// Every text an echo of which must be scrubbed from outcomes.
    secrets: Vec<String>,
    pub fingerprint: CredentialFingerprint,
    /// The unkeyed form of `fingerprint` when it is keyed: what operations recorded before the
    /// server had a fingerprint key carry.
    pub earlier_fingerprint: Option<CredentialFingerprint>,
    /// The account's OAuth2 grant and token cache, for `oauth2` auth.
    pub oauth: Option<crate::oauth::OAuthAccount>,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("header", &self.header)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// Keys the fingerprint under `key`, keeping the unkeyed one as the earlier form.
    pub fn key_fingerprint(&mut self, key: &FingerprintKey) {
        let keyed = key.keyed(&self.fingerprint);
        self.earlier_fingerprint = Some(std::mem::replace(&mut self.fingerprint, keyed));
    }

    /// `text` with every secret of this credential replaced by `[redacted]`, then passed through
    /// the process's one scrubber ([`opledger_domain::redact`]: every configured secret and every
    /// value that looks like one).
    pub fn scrub(&self, text: String) -> String {
        let mut text = text;
        let live = self
            .oauth
            .as_ref()
            .map(crate::oauth::OAuthAccount::live_secrets)
            .unwrap_or_default();
        for secret in self.secrets.iter().chain(&live) {
            if !secret.is_empty() && text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), opledger_domain::redact::REDACTED);
            }
        }
        opledger_domain::redact::scrub_owned(text)
    }
}

/// Reads a secret through `env`; the error names the variable (never a value). `what` says whose
/// secret it is, for the message.
fn read(
    source: &SecretSource,
    what: &str,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<Secret, String> {
    match source {
        SecretSource::Direct(secret) => Ok(secret.clone()),
        SecretSource::Env(variable) if variable.is_empty() => {
            Err(format!("names an empty environment variable for {what}"))
        }
        SecretSource::Env(variable) => match env(variable) {
            Some(value) if !value.is_empty() => value.into_string().map(Secret).map_err(|_| {
                format!("environment variable `{variable}` ({what}) is not valid UTF-8")
            }),
            _ => Err(format!(
                "environment variable `{variable}` ({what}) is not set or is empty; export it before starting"
            )),
        },
    }
}

/// A bearer or header token is visible ASCII (RFC 6750 `b64token` is a subset); anything else
/// would be refused as a header value, or is a pasted newline that should not silently count.
fn visible_ascii(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_graphic())
}

/// Builds an account's ready credential for `auth`; the error says what is wrong without showing
/// a secret.
pub(crate) fn resolve(
    auth: &Auth,
    credentials: &Credentials,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<Credential, String> {
    match (auth, credentials) {
        (Auth::OAuth2(spec), Credentials::OAuth2 { client_id, client_secret, refresh_token }) => {
            let client_id = read(client_id, "the OAuth2 client id", env)?;
            let client_secret = read(client_secret, "the OAuth2 client secret", env)?;
            let refresh_token = match (spec.grant, refresh_token) {
                (crate::oauth::Grant::RefreshToken, Some(source)) => {
                    Some(read(source, "the account's OAuth2 refresh token", env)?)
                }
                (crate::oauth::Grant::RefreshToken, None) => return Err("the connector uses the refresh_token grant; give refresh_token_env naming the variable with the account's refresh token".to_owned()),
                (crate::oauth::Grant::ClientCredentials, Some(_)) => return Err("the connector uses the client_credentials grant, which takes no refresh token; remove refresh_token_env".to_owned()),
                (crate::oauth::Grant::ClientCredentials, None) => None,
            };
            for (what, secret) in [("client id", Some(&client_id)), ("client secret", Some(&client_secret)), ("refresh token", refresh_token.as_ref())] {
                if secret.is_some_and(|secret| !visible_ascii(secret.expose())) {
                    return Err(format!("the OAuth2 {what} is not visible ASCII (no spaces, newlines or other characters)"));
                }
            }
            let secrets = vec![client_secret.expose().to_owned()];
            for secret in [Some(&client_secret), refresh_token.as_ref()].into_iter().flatten() {
                opledger_domain::redact::register(secret.expose());
            }
            let grant = crate::oauth::GrantSecrets { client_id, client_secret, refresh_token };
            // The grant's fingerprint names the account too; the connector sets it when it places
            // the account (`OAuthAccount::place`). Until then, this one names no account.
            let fingerprint = fingerprint_of("oauth2 grant not yet placed in an account");
            Ok(Credential {
                header: AUTHORIZATION,
                // Never sent: an OAuth2 account's header value comes from its token cache.
                value: HeaderValue::from_static("Bearer"),
                secrets,
                fingerprint,
                earlier_fingerprint: None,
                oauth: Some(crate::oauth::OAuthAccount::new(spec.clone(), grant)),
            })
        }
        (Auth::OAuth2(_), _) => Err("the connector uses oauth2 auth; give client_id_env and client_secret_env (and refresh_token_env for the refresh_token grant) instead of a token or a username and password".to_owned()),
        (_, Credentials::OAuth2 { .. }) => Err(format!(
            "the connector uses {} auth; an OAuth2 client id, secret or refresh token means nothing to it",
            auth.kind()
        )),
        (Auth::Bearer | Auth::Header { .. }, Credentials::Token(source)) => {
            let token = read(source, "the account's token", env)?;
            if !visible_ascii(token.expose()) {
                return Err("the token is not visible ASCII (no spaces, newlines or other characters a header cannot carry)".to_owned());
            }
            let (header, text) = match auth {
                Auth::Header { header, prefix } => {
                    (header.clone(), format!("{prefix}{}", token.expose()))
                }
                _ => (AUTHORIZATION, format!("Bearer {}", token.expose())),
            };
            ready(
                header,
                &text,
                vec![token.expose().to_owned()],
                token.fingerprint(),
            )
        }
        (Auth::Basic, Credentials::Basic { username, password }) => {
            let username = read(username, "the account's username", env)?;
            let password = read(password, "the account's password", env)?;
            if username.expose().contains(':') || username.expose().chars().any(char::is_control) {
                return Err("the username holds a `:` or a control character, which basic auth cannot carry (RFC 7617)".to_owned());
            }
            if password.expose().chars().any(char::is_control) {
                return Err("the password holds a control character".to_owned());
            }
            let pair = format!("{}:{}", username.expose(), password.expose());
            let encoded = base64(pair.as_bytes());
            let fingerprint = fingerprint_of(&pair);
            let secrets = vec![password.expose().to_owned(), encoded.clone()];
            ready(
                AUTHORIZATION,
                &format!("Basic {encoded}"),
                secrets,
                fingerprint,
            )
        }
        (Auth::Basic, Credentials::Token(_)) => Err(
            "the connector uses basic auth; give username_env and password_env instead of a token"
                .to_owned(),
        ),
        (_, Credentials::Basic { .. }) => Err(format!(
            "the connector uses {} auth; give token_env instead of a username and password",
            auth.kind()
        )),
    }
}

fn ready(
    header: HeaderName,
    text: &str,
    secrets: Vec<String>,
    fingerprint: CredentialFingerprint,
) -> Result<Credential, String> {
    let mut value = HeaderValue::from_str(text)
        .map_err(|_| "the credentials cannot be written as a header value".to_owned())?;
    for secret in &secrets {
        opledger_domain::redact::register(secret);
    }
    // Marks the value so the HTTP stack never writes it into its own debug output.
    value.set_sensitive(true);
    Ok(Credential {
        header,
        value,
        secrets,
        fingerprint,
        earlier_fingerprint: None,
        oauth: None,
    })
}

/// Standard base64 with padding (RFC 4648 §4), for basic auth: twenty lines instead of a crate.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (index, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if index <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<OsString> {
        None
    }

    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
            ("Aladdin:open sesame", "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain}");
        }
    }

    #[test]
    fn a_fingerprint_is_a_short_sha256_prefix_and_never_the_secret() {
        // The SHA-256 of "abc" starts with ba7816bf8f01cfea.
        assert_eq!(fingerprint_of("abc").as_str(), "sha256:ba7816bf8f01cfea");
        let token = Secret::new("token-acct-1");
        assert!(!token.fingerprint().as_str().contains("token"));
        assert_ne!(
            token.fingerprint(),
            Secret::new("token-acct-2").fingerprint()
        );
        assert_eq!(format!("{token:?}"), "Secret([redacted])");
    }

    #[test]
    fn each_auth_kind_writes_its_header() {
        let bearer = resolve(&Auth::Bearer, &Credentials::token("t0k"), &no_env).expect("valid");
        assert_eq!(bearer.header, AUTHORIZATION);
        assert_eq!(bearer.value, "Bearer t0k");
        assert!(bearer.value.is_sensitive());
        let header = Auth::Header {
            header: HeaderName::from_static("x-api-key"),
            prefix: String::new(),
        };
        let keyed = resolve(&header, &Credentials::token("k3y"), &no_env).expect("valid");
        assert_eq!(
            (keyed.header.as_str(), keyed.value.to_str().ok()),
            ("x-api-key", Some("k3y"))
        );
        let basic = resolve(
            &Auth::Basic,
            &Credentials::basic("Aladdin", "open sesame"),
            &no_env,
        )
        .expect("valid");
        assert_eq!(basic.value, "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
        assert_eq!(basic.fingerprint, fingerprint_of("Aladdin:open sesame"));
        assert_eq!(
            basic.scrub("echo open sesame and QWxhZGRpbjpvcGVuIHNlc2FtZQ==".to_owned()),
            "echo [redacted] and [redacted]"
        );
        assert!(!format!("{basic:?}").contains("sesame"));
    }

    #[test]
    fn a_missing_variable_is_named_and_a_bad_token_is_refused_without_showing_it() {
        let error = resolve(&Auth::Bearer, &Credentials::token_env("CRM_TOKEN"), &no_env)
            .expect_err("unset");
        assert!(error.contains("CRM_TOKEN"), "{error}");
        let set = |name: &str| (name == "CRM_TOKEN").then(|| OsString::from("s3cret"));
        let credential =
            resolve(&Auth::Bearer, &Credentials::token_env("CRM_TOKEN"), &set).expect("set");
        assert_eq!(credential.fingerprint, Secret::new("s3cret").fingerprint());
        for bad in ["tok en", "token\n", "", "tökén"] {
            let error =
                resolve(&Auth::Bearer, &Credentials::token(bad), &no_env).expect_err("refused");
            assert!(bad.is_empty() || !error.contains(bad), "{error}");
        }
        assert!(resolve(&Auth::Basic, &Credentials::basic("a:b", "p"), &no_env).is_err());
        assert!(resolve(&Auth::Basic, &Credentials::token("t"), &no_env).is_err());
        assert!(resolve(&Auth::Bearer, &Credentials::basic("u", "p"), &no_env).is_err());
    }
}
