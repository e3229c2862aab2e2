//! What one HTTP provider is configured with, checked once when the provider is built.
//!
//! Tokens come from environment variables by default and are turned at once into a redacted
//! [`ApiToken`] and a [`CredentialFingerprint`]. Nothing here may ever print a token: the token
//! types have no `Display`, and their `Debug` writes `[redacted]`.

use std::ffi::OsString;
use std::fmt;
use std::str::FromStr;

use opledger_domain::contract::{Deduplication, LookupSupport, ProviderCapabilities};
use opledger_domain::ids::{AccountId, CredentialFingerprint, ProviderId};
use sha2::{Digest, Sha256};

/// Shortest request or connect timeout accepted, in milliseconds.
pub const MIN_TIMEOUT_MS: u64 = 1;
/// Longest request or connect timeout accepted, in milliseconds.
pub const MAX_TIMEOUT_MS: u64 = 120_000;
/// Longest idempotency-key retention accepted, in seconds (a year; Stripe keeps keys 24 hours).
pub const MAX_KEY_RETENTION_S: u64 = 366 * 24 * 60 * 60;
/// Longest search-index lag accepted, in milliseconds (a day).
pub const MAX_SEARCH_LAG_MS: u64 = 24 * 60 * 60 * 1000;
/// Most accounts one provider may be configured with.
pub const MAX_ACCOUNTS_PER_PROVIDER: usize = 1024;
/// Longest base URL accepted, in bytes.
pub const MAX_BASE_URL_BYTES: usize = 2048;
/// How many hex digits of the token's SHA-256 the fingerprint keeps (64 bits).
pub const FINGERPRINT_HEX_DIGITS: usize = 16;

/// Default whole-request timeout (connect, send, wait, read), in milliseconds.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 10_000;
/// Default connect timeout, in milliseconds.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Default idempotency-key retention, in seconds: 24 hours, as Stripe and the stand keep keys.
pub const DEFAULT_KEY_RETENTION_S: u64 = 24 * 60 * 60;
/// Default part of the retention never used for a retry, in seconds.
pub const DEFAULT_KEY_SAFETY_MARGIN_S: u64 = 60 * 60;
/// Default search-index lag of a plain provider, in milliseconds (the stand's default).
pub const DEFAULT_SEARCH_LAG_MS: u64 = 2_000;

/// Which of the three CRM API shapes a provider speaks (the wire contract is in [`crate::contract`]).
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
    /// The shape's name, as used in the stand's paths: `keyed`, `labelled` or `plain`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Keyed => "keyed",
            Self::Labelled => "labelled",
            Self::Plain => "plain",
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Shape {
    type Err = ProviderConfigError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "keyed" => Ok(Self::Keyed),
            "labelled" => Ok(Self::Labelled),
            "plain" => Ok(Self::Plain),
            other => Err(ProviderConfigError::UnknownShape {
                value: other.to_owned(),
            }),
        }
    }
}

/// A bearer token. It has no `Display`, and its `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken(String);

impl ApiToken {
    /// Wraps a token; it is checked when the provider is built.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The token itself, for the `Authorization` header and for redaction only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// `sha256:` and the first [`FINGERPRINT_HEX_DIGITS`] hex digits of the token's SHA-256.
    /// Enough to notice that an account's credentials changed; useless for recovering the token.
    pub fn fingerprint(&self) -> CredentialFingerprint {
        let digest = Sha256::digest(self.0.as_bytes());
        let mut text = String::with_capacity(7 + FINGERPRINT_HEX_DIGITS);
        text.push_str("sha256:");
        for byte in digest.iter().take(FINGERPRINT_HEX_DIGITS / 2) {
            text.push_str(&format!("{byte:02x}"));
        }
        CredentialFingerprint::new(text).expect("a short hex digest is a valid fingerprint")
    }
}

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiToken([redacted])")
    }
}

/// Where an account's bearer token comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenSource {
    /// The environment variable of this name, read when the provider is built (the default).
    Env(String),
    /// The token itself (tests, or a caller that has its own secret store).
    Direct(ApiToken),
}

/// One account at a provider and where its token comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountConfig {
    /// The account, as it appears in the provider's paths.
    pub account: AccountId,
    /// Where its bearer token comes from.
    pub token: TokenSource,
}

impl AccountConfig {
    /// An account whose token is read from the environment variable `token_env` when the
    /// provider is built.
    pub fn from_env(account: AccountId, token_env: impl Into<String>) -> Self {
        Self {
            account,
            token: TokenSource::Env(token_env.into()),
        }
    }

    /// An account with the token given directly (tests; secret stores other than the environment).
    pub fn with_token(account: AccountId, token: impl Into<String>) -> Self {
        Self {
            account,
            token: TokenSource::Direct(ApiToken::new(token)),
        }
    }
}

/// Everything one HTTP provider is configured with. Fields a shape does not use are ignored
/// (`key_*` only matter for [`Shape::Keyed`], `search_lag_ms` only for [`Shape::Plain`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpProviderConfig {
    /// The API shape the provider speaks.
    pub shape: Shape,
    /// `http://` or `https://`, host, optional port and path prefix; no query, no user info.
    pub base_url: String,
    /// The accounts this process may act in.
    pub accounts: Vec<AccountConfig>,
    /// Whole-request timeout (connect, send, wait for and read the response), in milliseconds.
    pub request_timeout_ms: u64,
    /// Connect timeout (TCP and TLS), in milliseconds; at most `request_timeout_ms`.
    pub connect_timeout_ms: u64,
    /// How long the provider remembers an idempotency key, in seconds (keyed).
    pub key_retention_s: u64,
    /// How much of the retention a retry may never use, in seconds (keyed).
    pub key_safety_margin_s: u64,
    /// The longest the provider's search index lags behind a create, in milliseconds (plain).
    pub search_lag_ms: u64,
}

impl HttpProviderConfig {
    /// A configuration with the default timeouts, retention and lag (the `DEFAULT_*` constants).
    pub fn new(shape: Shape, base_url: impl Into<String>, accounts: Vec<AccountConfig>) -> Self {
        Self {
            shape,
            base_url: base_url.into(),
            accounts,
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            key_retention_s: DEFAULT_KEY_RETENTION_S,
            key_safety_margin_s: DEFAULT_KEY_SAFETY_MARGIN_S,
            search_lag_ms: DEFAULT_SEARCH_LAG_MS,
        }
    }

    /// What a provider of this configuration can promise the ledger.
    pub fn capabilities(&self) -> ProviderCapabilities {
        match self.shape {
            Shape::Keyed => ProviderCapabilities {
                deduplication: Deduplication::IdempotencyKey {
                    retention_s: self.key_retention_s,
                    safety_margin_s: self.key_safety_margin_s,
                },
                lookup: LookupSupport::Consistent,
            },
            Shape::Labelled => ProviderCapabilities {
                deduplication: Deduplication::UniqueLabel,
                lookup: LookupSupport::Consistent,
            },
            Shape::Plain => ProviderCapabilities {
                deduplication: Deduplication::None,
                lookup: LookupSupport::EventuallyConsistent {
                    lag_ms: self.search_lag_ms,
                },
            },
        }
    }

    /// Checks everything but the tokens; returns the base URL without a trailing `/`.
    pub(crate) fn validate(&self) -> Result<String, ProviderConfigError> {
        check_timeout("request_timeout_ms", self.request_timeout_ms)?;
        check_timeout("connect_timeout_ms", self.connect_timeout_ms)?;
        if self.connect_timeout_ms > self.request_timeout_ms {
            // The whole-request timeout would fire first and make a host that never answered
            // look like a request that may have been applied.
            return Err(ProviderConfigError::ConnectTimeoutAboveRequestTimeout {
                connect_timeout_ms: self.connect_timeout_ms,
                request_timeout_ms: self.request_timeout_ms,
            });
        }
        if self.shape == Shape::Keyed {
            if self.key_retention_s == 0 || self.key_retention_s > MAX_KEY_RETENTION_S {
                return Err(ProviderConfigError::KeyRetentionOutOfRange {
                    key_retention_s: self.key_retention_s,
                });
            }
            if self.key_safety_margin_s >= self.key_retention_s {
                return Err(ProviderConfigError::SafetyMarginNotBelowRetention {
                    key_retention_s: self.key_retention_s,
                    key_safety_margin_s: self.key_safety_margin_s,
                });
            }
        }
        if self.shape == Shape::Plain && self.search_lag_ms > MAX_SEARCH_LAG_MS {
            return Err(ProviderConfigError::SearchLagOutOfRange {
                search_lag_ms: self.search_lag_ms,
            });
        }
        if self.accounts.is_empty() {
            return Err(ProviderConfigError::NoAccounts);
        }
        if self.accounts.len() > MAX_ACCOUNTS_PER_PROVIDER {
            return Err(ProviderConfigError::TooManyAccounts {
                count: self.accounts.len(),
            });
        }
        for (index, account) in self.accounts.iter().enumerate() {
            if self.accounts[..index]
                .iter()
                .any(|earlier| earlier.account == account.account)
            {
                return Err(ProviderConfigError::DuplicateAccount {
                    account: account.account.clone(),
                });
            }
        }
        validate_base_url(&self.base_url)
    }
}

fn check_timeout(field: &'static str, value_ms: u64) -> Result<(), ProviderConfigError> {
    if (MIN_TIMEOUT_MS..=MAX_TIMEOUT_MS).contains(&value_ms) {
        Ok(())
    } else {
        Err(ProviderConfigError::TimeoutOutOfRange { field, value_ms })
    }
}

fn validate_base_url(base_url: &str) -> Result<String, ProviderConfigError> {
    let invalid = |reason: &str| ProviderConfigError::InvalidBaseUrl {
        base_url: base_url.to_owned(),
        reason: reason.to_owned(),
    };
    if base_url.len() > MAX_BASE_URL_BYTES {
        return Err(invalid("is longer than 2048 bytes"));
    }
    if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
        return Err(invalid("must start with http:// or https://"));
    }
    let parsed = reqwest::Url::parse(base_url).map_err(|error| invalid(&error.to_string()))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(invalid("has no host"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        // Credentials in a URL end up in error messages and logs; tokens go in `accounts`.
        return Err(invalid(
            "must not carry user info; put tokens in the account configuration",
        ));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(invalid("must not have a query or a fragment"));
    }
    Ok(base_url.trim_end_matches('/').to_owned())
}

/// Reads an account's token from where its configuration says, through `env` (the process
/// environment in production, a closure in tests).
pub(crate) fn resolve_token(
    account: &AccountConfig,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<ApiToken, ProviderConfigError> {
    let token = match &account.token {
        TokenSource::Direct(token) => token.clone(),
        TokenSource::Env(variable) => {
            if variable.is_empty() {
                return Err(ProviderConfigError::EmptyTokenVariableName {
                    account: account.account.clone(),
                });
            }
            let value = env(variable).unwrap_or_default();
            if value.is_empty() {
                return Err(ProviderConfigError::MissingToken {
                    account: account.account.clone(),
                    variable: variable.clone(),
                });
            }
            let value = value
                .into_string()
                .map_err(|_| ProviderConfigError::InvalidToken {
                    account: account.account.clone(),
                })?;
            ApiToken::new(value)
        }
    };
    // A bearer token is visible ASCII (RFC 6750 `b64token` is a subset); anything else would be
    // refused as a header value, or be a pasted newline that should not silently count.
    let visible =
        !token.expose().is_empty() && token.expose().bytes().all(|byte| byte.is_ascii_graphic());
    if visible {
        Ok(token)
    } else {
        Err(ProviderConfigError::InvalidToken {
            account: account.account.clone(),
        })
    }
}

/// A provider configuration that cannot be used. Never carries a token.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProviderConfigError {
    /// The shape name is not one of the three.
    #[error("unknown provider shape `{value}`; expected keyed, labelled or plain")]
    UnknownShape {
        /// What was given.
        value: String,
    },
    /// The base URL cannot be used.
    #[error("base_url `{base_url}` {reason}")]
    InvalidBaseUrl {
        /// What was given.
        base_url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A timeout is outside 1 ms..=120 s.
    #[error(
        "{field} is {value_ms} ms; it must be between {MIN_TIMEOUT_MS} and {MAX_TIMEOUT_MS} ms"
    )]
    TimeoutOutOfRange {
        /// The field.
        field: &'static str,
        /// What was given, in milliseconds.
        value_ms: u64,
    },
    /// The connect timeout is longer than the whole-request timeout.
    #[error("connect_timeout_ms ({connect_timeout_ms}) must not exceed request_timeout_ms ({request_timeout_ms})")]
    ConnectTimeoutAboveRequestTimeout {
        /// The connect timeout, in milliseconds.
        connect_timeout_ms: u64,
        /// The request timeout, in milliseconds.
        request_timeout_ms: u64,
    },
    /// The key retention is zero or longer than a year.
    #[error(
        "key_retention_s is {key_retention_s}; it must be between 1 and {MAX_KEY_RETENTION_S}"
    )]
    KeyRetentionOutOfRange {
        /// What was given, in seconds.
        key_retention_s: u64,
    },
    /// The safety margin leaves no time to retry in.
    #[error("key_safety_margin_s ({key_safety_margin_s}) must be smaller than key_retention_s ({key_retention_s}), or no retry would ever be safe")]
    SafetyMarginNotBelowRetention {
        /// The retention, in seconds.
        key_retention_s: u64,
        /// The margin, in seconds.
        key_safety_margin_s: u64,
    },
    /// The search lag is longer than a day.
    #[error("search_lag_ms is {search_lag_ms}; the limit is {MAX_SEARCH_LAG_MS}")]
    SearchLagOutOfRange {
        /// What was given, in milliseconds.
        search_lag_ms: u64,
    },
    /// No account is configured.
    #[error("no accounts are configured; a provider needs at least one")]
    NoAccounts,
    /// Too many accounts are configured.
    #[error("{count} accounts are configured; the limit is {MAX_ACCOUNTS_PER_PROVIDER}")]
    TooManyAccounts {
        /// How many were given.
        count: usize,
    },
    /// An account appears twice.
    #[error("account `{account}` is configured twice")]
    DuplicateAccount {
        /// The account.
        account: AccountId,
    },
    /// An account names no environment variable.
    #[error("account `{account}` names an empty token environment variable")]
    EmptyTokenVariableName {
        /// The account.
        account: AccountId,
    },
    /// The environment variable holding an account's token is unset or empty.
    #[error("environment variable `{variable}` (the bearer token of account `{account}`) is not set or is empty")]
    MissingToken {
        /// The account.
        account: AccountId,
        /// The variable.
        variable: String,
    },
    /// An account's token is not visible ASCII (the value itself is never shown).
    #[error("the bearer token of account `{account}` is not visible ASCII (no spaces, newlines or other characters a header cannot carry)")]
    InvalidToken {
        /// The account.
        account: AccountId,
    },
    /// A provider id appears twice in a registry.
    #[error("provider `{provider}` is configured twice")]
    DuplicateProvider {
        /// The provider.
        provider: ProviderId,
    },
    /// The HTTP client could not be built (e.g. TLS setup failed).
    #[error("the HTTP client could not be built: {reason}")]
    Client {
        /// What went wrong.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(name: &str) -> AccountId {
        AccountId::new(name).expect("test account ids are valid")
    }

    fn config() -> HttpProviderConfig {
        HttpProviderConfig::new(
            Shape::Keyed,
            "http://127.0.0.1:8080/",
            vec![AccountConfig::with_token(account("acct-1"), "token-acct-1")],
        )
    }

    #[test]
    fn a_default_config_is_valid_and_its_base_url_loses_the_trailing_slash() {
        assert_eq!(config().validate(), Ok("http://127.0.0.1:8080".to_owned()));
    }

    #[test]
    fn base_urls_must_be_http_with_a_host_and_no_user_info_or_query() {
        for bad in [
            "127.0.0.1:8080",
            "ftp://crm.example",
            "http://",
            "https://user:secret@crm.example",
            "https://crm.example/api?x=1",
            "HTTP://crm.example",
        ] {
            let mut config = config();
            config.base_url = bad.to_owned();
            assert!(
                matches!(
                    config.validate(),
                    Err(ProviderConfigError::InvalidBaseUrl { .. })
                ),
                "{bad} was accepted"
            );
        }
        let mut config = config();
        config.base_url = "https://crm.example/api/v2".to_owned();
        assert_eq!(
            config.validate(),
            Ok("https://crm.example/api/v2".to_owned())
        );
    }

    #[test]
    fn timeouts_must_lie_between_one_millisecond_and_two_minutes() {
        for (request, connect) in [(0, 1), (120_001, 1), (1000, 0)] {
            let mut config = config();
            config.request_timeout_ms = request;
            config.connect_timeout_ms = connect;
            assert!(matches!(
                config.validate(),
                Err(ProviderConfigError::TimeoutOutOfRange { .. })
            ));
        }
        let mut config = config();
        config.request_timeout_ms = 1;
        config.connect_timeout_ms = 1;
        assert!(config.validate().is_ok());
        config.request_timeout_ms = MAX_TIMEOUT_MS;
        config.connect_timeout_ms = MAX_TIMEOUT_MS;
        assert!(config.validate().is_ok());
    }

    #[test]
    fn a_connect_timeout_longer_than_the_request_timeout_is_refused() {
        let mut config = config();
        config.request_timeout_ms = 500;
        config.connect_timeout_ms = 501;
        assert!(matches!(
            config.validate(),
            Err(ProviderConfigError::ConnectTimeoutAboveRequestTimeout { .. })
        ));
    }

    #[test]
    fn a_keyed_safety_margin_must_leave_part_of_the_retention() {
        let mut config = config();
        config.key_retention_s = 600;
        config.key_safety_margin_s = 600;
        assert!(matches!(
            config.validate(),
            Err(ProviderConfigError::SafetyMarginNotBelowRetention { .. })
        ));
        config.key_retention_s = 0;
        config.key_safety_margin_s = 0;
        assert!(matches!(
            config.validate(),
            Err(ProviderConfigError::KeyRetentionOutOfRange { .. })
        ));
        // The margin means nothing to a shape without keys.
        config.shape = Shape::Labelled;
        assert!(config.validate().is_ok());
    }

    #[test]
    fn accounts_must_be_present_and_unique() {
        let mut config = config();
        config.accounts.clear();
        assert_eq!(config.validate(), Err(ProviderConfigError::NoAccounts));
        config.accounts = vec![
            AccountConfig::with_token(account("acct-1"), "a"),
            AccountConfig::with_token(account("acct-1"), "b"),
        ];
        assert_eq!(
            config.validate(),
            Err(ProviderConfigError::DuplicateAccount {
                account: account("acct-1")
            })
        );
    }

    #[test]
    fn capabilities_follow_the_shape() {
        let mut config = config();
        config.key_retention_s = 86_400;
        config.key_safety_margin_s = 3_600;
        config.search_lag_ms = 2_500;
        assert_eq!(
            config.capabilities(),
            ProviderCapabilities {
                deduplication: Deduplication::IdempotencyKey {
                    retention_s: 86_400,
                    safety_margin_s: 3_600
                },
                lookup: LookupSupport::Consistent,
            }
        );
        config.shape = Shape::Labelled;
        assert_eq!(
            config.capabilities(),
            ProviderCapabilities {
                deduplication: Deduplication::UniqueLabel,
                lookup: LookupSupport::Consistent,
            }
        );
        config.shape = Shape::Plain;
        assert_eq!(
            config.capabilities(),
            ProviderCapabilities {
                deduplication: Deduplication::None,
                lookup: LookupSupport::EventuallyConsistent { lag_ms: 2_500 },
            }
        );
    }

    #[test]
    fn a_missing_or_empty_token_variable_is_named_in_the_error() {
        let from_env = AccountConfig::from_env(account("acct-1"), "CRM_TOKEN_ACCT_1");
        let unset = resolve_token(&from_env, &|_| None);
        assert_eq!(
            unset,
            Err(ProviderConfigError::MissingToken {
                account: account("acct-1"),
                variable: "CRM_TOKEN_ACCT_1".to_owned()
            })
        );
        let message = unset.expect_err("unset").to_string();
        assert!(message.contains("CRM_TOKEN_ACCT_1"), "{message}");
        let empty = resolve_token(&from_env, &|_| Some(OsString::new()));
        assert!(matches!(
            empty,
            Err(ProviderConfigError::MissingToken { .. })
        ));
        let set = resolve_token(&from_env, &|name| {
            (name == "CRM_TOKEN_ACCT_1").then(|| OsString::from("s3cret-token"))
        });
        assert_eq!(set, Ok(ApiToken::new("s3cret-token")));
    }

    #[test]
    fn tokens_with_whitespace_or_control_characters_are_refused_without_showing_them() {
        for bad in ["tok en", "token\n", "", "tökén"] {
            let config = AccountConfig::with_token(account("acct-1"), bad);
            let error = resolve_token(&config, &|_| None).expect_err("refused");
            assert_eq!(
                error,
                ProviderConfigError::InvalidToken {
                    account: account("acct-1")
                }
            );
        }
    }

    #[test]
    fn a_fingerprint_is_a_short_sha256_prefix_and_never_the_token() {
        let token = ApiToken::new("token-acct-1");
        let fingerprint = token.fingerprint();
        let text = fingerprint.as_str();
        assert!(text.starts_with("sha256:"), "{text}");
        assert_eq!(text.len(), "sha256:".len() + FINGERPRINT_HEX_DIGITS);
        assert!(!text.contains("token"));
        assert_eq!(fingerprint, ApiToken::new("token-acct-1").fingerprint());
        assert_ne!(fingerprint, ApiToken::new("token-acct-2").fingerprint());
        // The SHA-256 of "abc" starts with ba7816bf8f01cfea.
        assert_eq!(
            ApiToken::new("abc").fingerprint().as_str(),
            "sha256:ba7816bf8f01cfea"
        );
    }

    #[test]
    fn debug_output_of_a_config_never_shows_a_token() {
        let text = format!("{:?}", config());
        assert!(!text.contains("token-acct-1"), "{text}");
        assert!(text.contains("[redacted]"), "{text}");
    }

    #[test]
    fn shapes_parse_from_their_names() {
        for shape in [Shape::Keyed, Shape::Labelled, Shape::Plain] {
            assert_eq!(shape.as_str().parse::<Shape>(), Ok(shape));
        }
        assert!("rest".parse::<Shape>().is_err());
    }
}
