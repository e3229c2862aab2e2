//! The one secret scrubber: every text bound for a log line, a trace, an event or an answer that
//! may hold what a provider echoed back passes through [`scrub`] first.
//!
//! Two kinds of rule, both applied to every text:
//!
//! - **configured secrets**: every secret the process was configured with (an account's token,
//!   a basic password, an OAuth2 client secret and refresh token, an access token a token
//!   endpoint issued, the API's bearer tokens, webhook secrets) is [`register`]ed once where it is
//!   read, and any occurrence of it — as it is, or percent-encoded as a form body echoes it — is
//!   replaced by [`REDACTED`];
//! - **patterns**: a value that looks like a secret whoever configured it: the value after
//!   `client_secret`, `refresh_token`, `access_token`, `id_token`, `api_key`, `apikey`, `password`,
//!   `secret` or `token` written as `key=value`, `key: value` or `"key":"value"`; the credential after
//!   `Bearer` or `Basic`; a `whsec_` webhook secret.
//!
//! The set is process-wide (as [`crate::trace_context`]'s exporter is) because the log layer is
//! installed before any connector is built and must still know every secret built later; it
//! lives in the domain because the domain is the one crate the log layer, the connectors, the API
//! and the webhooks all share, and it does no I/O. Scrubbing is a last guard: code still never
//! writes a secret on purpose. It must never let a configured secret through, and never change a
//! text that holds neither a secret nor a pattern (an unchanged text is borrowed, not copied).

use std::borrow::Cow;
use std::sync::RwLock;

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Most secrets kept; one process configures a few per account, so more means a loop that
/// registers the same value again and again (registering is idempotent) or a bug.
pub const MAX_REGISTERED_SECRETS: usize = 100_000;

/// Shortest secret kept by [`register`], in characters. A shorter one would redact ordinary words
/// in every log line (a test's `token` or `abc`); no configured token is that short (the API's are at
/// least 16 characters), and a connector still scrubs its own account's secrets of any length
/// from what the provider answered.
pub const MIN_REGISTERED_SECRET_CHARS: usize = 8;

/// Shortest value after `Bearer`/`Basic` treated as a credential, in characters: shorter words
/// are prose ("basic auth", "Bearer <token>").
const MIN_SCHEME_CREDENTIAL_CHARS: usize = 8;

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Adds `secret` to the process's configured secrets (and its percent-encoded form when that
/// differs). Text shorter than [`MIN_REGISTERED_SECRET_CHARS`] is ignored; a secret registered
/// twice is kept once.
pub fn register(secret: &str) {
    if secret.chars().count() < MIN_REGISTERED_SECRET_CHARS {
        return;
    }
    let encoded = percent_encoded(secret);
    let Ok(mut secrets) = SECRETS.write() else {
        return;
    };
    for form in [secret.to_owned(), encoded] {
        if !secrets.contains(&form) && secrets.len() < MAX_REGISTERED_SECRETS {
            secrets.push(form);
        }
    }
    // Longest first: a secret that contains another is replaced whole.
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
}

/// `text` with every configured secret and every secret-looking value replaced by [`REDACTED`].
pub fn scrub(text: &str) -> Cow<'_, str> {
    let secrets = SECRETS.read();
    let configured: &[String] = secrets.as_deref().map_or(&[], |secrets| secrets);
    scrub_with(configured, text)
}

/// An owned `text`, scrubbed (see [`scrub`]).
pub fn scrub_owned(text: String) -> String {
    match scrub(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(scrubbed) => scrubbed,
    }
}

/// [`scrub`] with `secrets` as the configured secrets (longest first).
pub fn scrub_with<'a>(secrets: &[String], text: &'a str) -> Cow<'a, str> {
    let mut out = Cow::Borrowed(text);
    for secret in secrets {
        if !secret.is_empty() && out.contains(secret.as_str()) {
            out = Cow::Owned(out.replace(secret.as_str(), REDACTED));
        }
    }
    match scrub_patterns(&out) {
        Cow::Borrowed(_) => out,
        Cow::Owned(scrubbed) => Cow::Owned(scrubbed),
    }
}

/// Keys whose value is a secret, lower case. A key counts only as a whole word (`token` is not
/// found in `refresh_token_env`) followed by `=` or `:`.
const SECRET_KEYS: [&str; 10] = [
    "client_secret",
    "refresh_token",
    "access_token",
    "id_token",
    "api_key",
    "apikey",
    "api-key",
    "password",
    "secret",
    "token",
];

/// Schemes whose next word is a credential.
const SCHEMES: [&str; 2] = ["bearer", "basic"];

/// The prefix of a Standard Webhooks secret.
const WEBHOOK_SECRET_PREFIX: &str = "whsec_";

/// `text` with the values the patterns find replaced; borrowed when none is found.
fn scrub_patterns(text: &str) -> Cow<'_, str> {
    let lower = text.to_ascii_lowercase();
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for key in SECRET_KEYS {
        for (start, _) in lower.match_indices(key) {
            if let Some(span) = keyed_value(&lower, start, key.len()) {
                spans.push(span);
            }
        }
    }
    for scheme in SCHEMES {
        for (start, _) in lower.match_indices(scheme) {
            if let Some(span) = scheme_credential(&lower, start, scheme.len()) {
                spans.push(span);
            }
        }
    }
    for (start, _) in lower.match_indices(WEBHOOK_SECRET_PREFIX) {
        let end = value_end(lower.as_bytes(), start, None);
        if end > start + WEBHOOK_SECRET_PREFIX.len() {
            spans.push((start, end));
        }
    }
    if spans.is_empty() {
        return Cow::Borrowed(text);
    }
    spans.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end) in spans {
        if end <= at {
            continue;
        }
        let start = start.max(at);
        out.push_str(&text[at..start]);
        out.push_str(REDACTED);
        at = end;
    }
    out.push_str(&text[at..]);
    Cow::Owned(out)
}

fn is_word(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-'
}

/// The value after the key at `start..start + len` when it is followed by `=` or `:` (with
/// optional quotes and spaces around): its byte span.
fn keyed_value(lower: &str, start: usize, len: usize) -> Option<(usize, usize)> {
    let bytes = lower.as_bytes();
    if start > 0 && is_word(bytes[start - 1]) {
        return None;
    }
    let mut at = start + len;
    if bytes.get(at).is_some_and(|&byte| is_word(byte)) {
        return None;
    }
    if matches!(bytes.get(at), Some(b'"' | b'\'')) {
        at += 1;
    }
    while bytes.get(at) == Some(&b' ') {
        at += 1;
    }
    let separator = match bytes.get(at) {
        Some(&separator @ (b'=' | b':')) => separator,
        _ => return None,
    };
    at += 1;
    while bytes.get(at) == Some(&b' ') {
        at += 1;
    }
    let quote = match bytes.get(at) {
        Some(&quote @ (b'"' | b'\'')) => {
            at += 1;
            Some(quote)
        }
        _ => None,
    };
    let end = value_end(bytes, at, quote);
    // `key: word` is also how a sentence names a token ("has no access token: the token endpoint
    // answered …"): after a colon, an unquoted value is taken for a credential only when it is
    // as long as one. `key=value` (forms, queries) and quoted values are always taken.
    let short_word_after_colon =
        separator == b':' && quote.is_none() && end - at < MIN_SCHEME_CREDENTIAL_CHARS;
    (end > at && !short_word_after_colon).then_some((at, end))
}

/// The credential after a scheme word at `start..start + len`: its byte span, when it is long
/// enough to be one.
fn scheme_credential(lower: &str, start: usize, len: usize) -> Option<(usize, usize)> {
    let bytes = lower.as_bytes();
    if start > 0 && is_word(bytes[start - 1]) {
        return None;
    }
    let mut at = start + len;
    if bytes.get(at) != Some(&b' ') {
        return None;
    }
    while bytes.get(at) == Some(&b' ') {
        at += 1;
    }
    let end = at
        + bytes[at..]
            .iter()
            .take_while(|&&byte| byte.is_ascii_alphanumeric() || b"-._~+/=".contains(&byte))
            .count();
    (end - at >= MIN_SCHEME_CREDENTIAL_CHARS).then_some((at, end))
}

/// Where a value starting at `at` ends: at the closing `quote`, or (unquoted) at the first
/// space, separator or bracket.
fn value_end(bytes: &[u8], at: usize, quote: Option<u8>) -> usize {
    let rest = &bytes[at.min(bytes.len())..];
    let length = match quote {
        Some(quote) => rest
            .iter()
            .position(|&byte| byte == quote || byte == b'\n')
            .unwrap_or(rest.len()),
        None => rest
            .iter()
            .position(|&byte| byte.is_ascii_whitespace() || b"&,;\"'`<>()[]{}".contains(&byte))
            .unwrap_or(rest.len()),
    };
    at + length
}

/// `text` percent-encoded as a form body writes it (everything but RFC 3986 unreserved).
fn percent_encoded(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrubbed(secrets: &[&str], text: &str) -> String {
        let secrets: Vec<String> = secrets.iter().map(|s| (*s).to_owned()).collect();
        scrub_with(&secrets, text).into_owned()
    }

    #[test]
    fn a_configured_secret_is_replaced_wherever_it_is() {
        assert_eq!(
            scrubbed(&["s3cr3t-value"], "echo s3cr3t-value and xs3cr3t-valuex"),
            "echo [redacted] and x[redacted]x"
        );
    }

    #[test]
    fn a_form_body_echo_loses_every_secret_value() {
        let echoed = "the token endpoint answered 400: grant_type=refresh_token&client_id=abc&client_secret=zz9&refresh_token=rt%2Fx1";
        assert_eq!(
            scrubbed(&[], echoed),
            "the token endpoint answered 400: grant_type=refresh_token&client_id=abc&client_secret=[redacted]&refresh_token=[redacted]"
        );
    }

    #[test]
    fn json_and_header_forms_are_scrubbed_too() {
        assert_eq!(
            scrubbed(
                &[],
                r#"{"access_token": "at-1", "api_key":"k1", "ok": "yes"}"#
            ),
            r#"{"access_token": "[redacted]", "api_key":"[redacted]", "ok": "yes"}"#
        );
        assert_eq!(
            scrubbed(&[], "Authorization: Bearer abcdefgh12345 seen"),
            "Authorization: Bearer [redacted] seen"
        );
        assert_eq!(
            scrubbed(&[], "authorization: basic QWxhZGRpbjpvcGVu"),
            "authorization: basic [redacted]"
        );
        assert_eq!(
            scrubbed(&[], "secret whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw end"),
            "secret [redacted] end"
        );
    }

    #[test]
    fn prose_about_tokens_is_left_alone() {
        for prose in [
            "the token endpoint refused the account's credentials",
            "account `main` has no access token: the token endpoint answered 400",
            "give refresh_token_env naming the variable",
            "send `Authorization: Bearer <your token>`",
            "the connector uses basic auth",
            "provider answered 201",
        ] {
            assert!(
                matches!(scrub_with(&[], prose), Cow::Borrowed(_)),
                "{prose}"
            );
        }
    }

    #[test]
    fn a_registered_secret_is_scrubbed_as_is_and_percent_encoded() {
        register("reg/secret+value-01");
        assert_eq!(
            scrub("a reg/secret+value-01 b reg%2Fsecret%2Bvalue-01"),
            "a [redacted] b [redacted]"
        );
        register("");
        register("short");
        assert_eq!(scrub("nothing short here"), "nothing short here");
    }
}
