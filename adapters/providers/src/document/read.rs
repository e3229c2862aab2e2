//! Reading a connector document's top level: identity, URL, timeouts, auth, settings, errors,
//! rate limit and accounts. Actions are read in [`super::action`].
//!
//! Every reader records its findings and carries on, so one document yields every problem at
//! once; a reader that could not produce its value returns `None` only after recording why.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use opledger_domain::ids::{AccountId, ProviderId, TenantId};
use reqwest::header::HeaderName;

use super::tree::{self, Found, Table};
use super::{
    action, AccountSpec, Document, ErrorRule, ErrorSpec, Means, RateLimit, ResetHeader, ResetUnit,
    DEFAULT_CODE_AT, DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_MESSAGE_AT,
    DEFAULT_RATE_LIMIT_MIN_WAIT_MS, DEFAULT_REQUEST_ID_HEADER, DEFAULT_REQUEST_TIMEOUT_MS,
    MAX_ACCOUNTS_PER_CONNECTOR, MAX_BASE_URL_BYTES, MAX_DESCRIPTION_CHARS, MAX_DOCUMENT_BYTES,
    MAX_ERROR_RULES, MAX_SETTINGS, MAX_SETTING_VALUE_CHARS, MAX_TENANTS_PER_ACCOUNT,
    MAX_TIMEOUT_MS, MIN_RATE_LIMIT_WAIT_MS, MIN_TIMEOUT_MS,
};
use crate::body::BodyEncoding;
use crate::budget::{Budget, MAX_BURST, MAX_REQUESTS_PER_S};
use crate::credentials::{Auth, Credentials, SecretSource};
use crate::error::{ConnectorError, Findings};
use crate::http::MAX_RETRY_AFTER_MS;
use crate::oauth::{Grant, OAuth2Spec, DEFAULT_REFUSED_WAIT_MS, MAX_SCOPES, MIN_REFUSED_WAIT_MS};
use crate::template::{check_pointer, is_setting_name, resolve_pointer};

const TOP_KEYS: &[&str] = &[
    "id",
    "transport",
    "description",
    "base_url",
    "request_timeout_ms",
    "connect_timeout_ms",
    "request_id_header",
    "auth",
    "settings",
    "errors",
    "rate_limit",
    "accounts",
    "actions",
    "probe",
];

/// Keys that would hold a secret: refused with a pointer to the `_env` form.
const SECRET_KEYS: &[&str] = &[
    "token",
    "password",
    "username",
    "secret",
    "api_key",
    "client_secret",
    "refresh_token",
];

/// Reads and checks the whole document.
pub(super) fn document(name: &str, text: &str) -> Result<Document, Vec<ConnectorError>> {
    match any_document(name, text)? {
        super::AnyDocument::Rest(document) => Ok(*document),
        super::AnyDocument::Mcp(_) => Err(vec![ConnectorError {
            file: name.to_owned(),
            line: None,
            field: "transport".to_owned(),
            message: "is \"mcp\": this is an MCP connector, which is loaded where connectors are configured (a [[connectors]] entry), not as a REST document".to_owned(),
        }]),
    }
}

/// Reads and checks a whole document of either transport: `transport = "mcp"` (an upstream MCP
/// server, [`super::mcp`]) or `"http"`, the default (a REST API).
pub(super) fn any_document(
    name: &str,
    text: &str,
) -> Result<super::AnyDocument, Vec<ConnectorError>> {
    let mut findings = Findings::new(name, text);
    if text.len() > MAX_DOCUMENT_BYTES {
        findings.add(
            None,
            "file",
            format!(
                "is {} bytes; a connector document is at most {MAX_DOCUMENT_BYTES} bytes",
                text.len()
            ),
        );
        return Err(findings.into_errors());
    }
    let root = match tree::parse(text) {
        Ok(root) => root,
        Err((span, message)) => {
            findings.add(span.as_ref(), "syntax", message);
            return Err(findings.into_errors());
        }
    };
    let Some(top) = Table::of(&root, String::new(), &mut findings) else {
        return Err(findings.into_errors());
    };
    let document = match transport(&top, &mut findings) {
        Some(Transport::Mcp) => super::mcp::document(name, &top, &mut findings)
            .map(|document| super::AnyDocument::Mcp(Box::new(document))),
        Some(Transport::Http) => top_level(name, &top, &mut findings)
            .map(|document| super::AnyDocument::Rest(Box::new(document))),
        None => None,
    };
    match document {
        Some(document) if findings.is_empty() => Ok(document),
        _ => {
            debug_assert!(!findings.is_empty(), "a document that failed says why");
            Err(findings.into_errors())
        }
    }
}

/// The wire a document speaks.
enum Transport {
    Http,
    Mcp,
}

fn transport(top: &Table<'_>, findings: &mut Findings<'_>) -> Option<Transport> {
    match top.string("transport", findings) {
        None if top.has("transport") => None,
        None => Some(Transport::Http),
        Some(found) => match found.value {
            "http" => Some(Transport::Http),
            "mcp" => Some(Transport::Mcp),
            other => {
                findings.add(
                    Some(found.span),
                    &found.field,
                    format!("`{other}` is no transport; write \"http\" (a REST API, the default) or \"mcp\" (an upstream MCP server)"),
                );
                None
            }
        },
    }
}

fn top_level(name: &str, top: &Table<'_>, findings: &mut Findings<'_>) -> Option<Document> {
    top.only(TOP_KEYS, findings);
    let id = provider_id(top, findings);
    let description = description(top, findings);
    let base_url = top.string("base_url", findings).and_then(|url| {
        check_base_url(url.value)
            .map_err(|message| findings.add(Some(url.span), &url.field, message))
            .ok()
    });
    let (request_timeout_ms, connect_timeout_ms) = timeouts(top, findings);
    let request_id_header = match top.string("request_id_header", findings) {
        Some(found) => header_name(&found, findings),
        None => Some(HeaderName::from_static(DEFAULT_REQUEST_ID_HEADER)),
    };
    let auth = auth(top, findings);
    let settings = settings(top, findings);
    let errors = errors(top, findings);
    let rate_limit = match top.has("rate_limit") {
        true => top
            .table("rate_limit", findings)
            .and_then(|table| rate_limit(&table, findings)),
        false => Some(RateLimit::default()),
    };
    let accounts = accounts(top, auth.as_ref(), findings);
    let actions = action::read_all(top, &settings, auth.as_ref(), findings);
    let probe = action::probe(top, &settings, auth.as_ref(), findings);
    Some(Document {
        name: name.to_owned(),
        id: id?,
        description: description?,
        base_url,
        request_timeout_ms,
        connect_timeout_ms,
        request_id_header: request_id_header?,
        auth: auth?,
        settings,
        errors: errors?,
        rate_limit: rate_limit?,
        accounts,
        actions,
        probe,
    })
}

pub(super) fn provider_id(top: &Table<'_>, findings: &mut Findings<'_>) -> Option<ProviderId> {
    let found = top.required_string(
        "id",
        "write the provider id it registers under, e.g. id = \"hubspot\"",
        findings,
    )?;
    ProviderId::new(found.value)
        .map_err(|error| findings.add(Some(found.span), &found.field, error.message))
        .ok()
}

pub(super) fn description(top: &Table<'_>, findings: &mut Findings<'_>) -> Option<String> {
    let found = top.required_string(
        "description",
        "write one line saying which API this is",
        findings,
    )?;
    one_line(&found, findings).then(|| found.value.to_owned())
}

/// Whether a description is one non-empty line of at most [`MAX_DESCRIPTION_CHARS`]; records a
/// finding when not.
pub(super) fn one_line(found: &Found<'_, &str>, findings: &mut Findings<'_>) -> bool {
    let text = found.value;
    let problem = if text.trim().is_empty() {
        Some("is empty; write one line".to_owned())
    } else if text.contains('\n') || text.contains('\r') {
        Some("must be one line".to_owned())
    } else if text.chars().count() > MAX_DESCRIPTION_CHARS {
        Some(format!(
            "is longer than {MAX_DESCRIPTION_CHARS} characters; keep it to one short line"
        ))
    } else {
        None
    };
    if let Some(message) = &problem {
        findings.add(Some(found.span), &found.field, message.clone());
    }
    problem.is_none()
}

/// Checks a base URL; returns it without a trailing `/`, or what is wrong with it.
pub(crate) fn check_base_url(base_url: &str) -> Result<String, String> {
    let invalid = |reason: &str| Err(format!("`{base_url}` {reason}"));
    if base_url.len() > MAX_BASE_URL_BYTES {
        return Err(format!("is longer than {MAX_BASE_URL_BYTES} bytes"));
    }
    if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
        return invalid("must start with http:// or https://");
    }
    let parsed = match reqwest::Url::parse(base_url) {
        Ok(parsed) => parsed,
        Err(error) => return invalid(&format!("is not a URL: {error}")),
    };
    if parsed.host_str().is_none_or(str::is_empty) {
        return invalid("has no host");
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        // Credentials in a URL end up in error messages and logs; they belong in the accounts.
        return invalid(
            "must not carry user info; credentials go in the accounts, by environment variable",
        );
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return invalid("must not have a query or a fragment; put query parameters in an action's request.query");
    }
    Ok(base_url.trim_end_matches('/').to_owned())
}

fn timeouts(top: &Table<'_>, findings: &mut Findings<'_>) -> (u64, u64) {
    let request = top.unsigned("request_timeout_ms", findings);
    let connect = top.unsigned("connect_timeout_ms", findings);
    let request_ms = request
        .as_ref()
        .map_or(DEFAULT_REQUEST_TIMEOUT_MS, |found| found.value);
    let connect_ms = connect
        .as_ref()
        .map_or(DEFAULT_CONNECT_TIMEOUT_MS, |found| found.value);
    for (field, message) in check_timeouts(request_ms, connect_ms) {
        let span = if field == "request_timeout_ms" {
            request.as_ref().map(|found| found.span)
        } else {
            connect.as_ref().map(|found| found.span)
        };
        findings.add(span, field, message);
    }
    (request_ms, connect_ms)
}

/// Checks a request and connect timeout; each problem with the field it is about.
pub(crate) fn check_timeouts(request_ms: u64, connect_ms: u64) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    for (field, value) in [
        ("request_timeout_ms", request_ms),
        ("connect_timeout_ms", connect_ms),
    ] {
        if !(MIN_TIMEOUT_MS..=MAX_TIMEOUT_MS).contains(&value) {
            problems.push((
                field,
                format!("is {value} ms; write {MIN_TIMEOUT_MS} to {MAX_TIMEOUT_MS}"),
            ));
        }
    }
    if problems.is_empty() && connect_ms > request_ms {
        // The whole-request timeout would fire first and make a host that never answered look
        // like a request that may have been applied.
        problems.push((
            "connect_timeout_ms",
            format!("({connect_ms} ms) must not exceed request_timeout_ms ({request_ms} ms)"),
        ));
    }
    problems
}

/// A header name; a finding when it is not one.
pub(super) fn header_name(
    found: &Found<'_, &str>,
    findings: &mut Findings<'_>,
) -> Option<HeaderName> {
    HeaderName::from_str(found.value)
        .map_err(|_| {
            findings.add(
                Some(found.span),
                &found.field,
                format!(
                    "`{}` is not an HTTP header name (letters, digits and `-`)",
                    found.value
                ),
            );
        })
        .ok()
}

/// A JSON pointer; a finding when it is not one.
pub(super) fn pointer(found: &Found<'_, &str>, findings: &mut Findings<'_>) -> Option<String> {
    check_pointer(found.value)
        .map_err(|message| findings.add(Some(found.span), &found.field, message))
        .ok()
        .map(|()| found.value.to_owned())
}

/// A JSON pointer that may name settings (see [`resolve_pointer`]), checked with the document's
/// own settings; the text is kept as written, and resolved again with the installation's settings
/// when the connector is built.
pub(super) fn settings_pointer(
    found: &Found<'_, &str>,
    settings: &BTreeMap<String, String>,
    findings: &mut Findings<'_>,
) -> Option<String> {
    resolve_pointer(found.value, settings)
        .map_err(|message| findings.add(Some(found.span), &found.field, message))
        .ok()
        .map(|_| found.value.to_owned())
}

/// The optional pointer under `key`.
pub(super) fn optional_pointer(
    table: &Table<'_>,
    key: &str,
    findings: &mut Findings<'_>,
) -> Option<String> {
    table
        .string(key, findings)
        .and_then(|found| pointer(&found, findings))
}

/// An HTTP status (100..=599) under `key`; a finding when out of range.
pub(super) fn status(table: &Table<'_>, key: &str, findings: &mut Findings<'_>) -> Option<u16> {
    let found = table.unsigned(key, findings)?;
    match u16::try_from(found.value) {
        Ok(status) if (100..=599).contains(&status) => Some(status),
        _ => {
            findings.add(
                Some(found.span),
                &found.field,
                format!("is {}; an HTTP status is 100 to 599", found.value),
            );
            None
        }
    }
}

/// Headers a connector may never set itself: credentials come from `[auth]`, framing from the
/// HTTP stack, the content type from the body encoding.
pub(super) const RESERVED_HEADERS: &[&str] = &[
    "authorization",
    "content-type",
    "content-length",
    "host",
    "transfer-encoding",
    "connection",
];

fn auth(top: &Table<'_>, findings: &mut Findings<'_>) -> Option<Auth> {
    if !top.has("auth") {
        top.missing(
            "auth",
            "add [auth] with kind = \"bearer\", \"header\" (and header = \"X-Api-Key\"), \"basic\" or \"oauth2\"",
            findings,
        );
        return None;
    }
    let table = top.table("auth", findings)?;
    let kind = table.required_string(
        "kind",
        "write kind = \"bearer\", \"header\", \"basic\" or \"oauth2\"",
        findings,
    )?;
    match kind.value {
        "bearer" | "basic" => {
            table.only(&["kind"], findings);
            Some(if kind.value == "bearer" {
                Auth::Bearer
            } else {
                Auth::Basic
            })
        }
        "header" => {
            table.only(&["kind", "header", "prefix"], findings);
            let header = table.required_string(
                "header",
                "write the header the token travels in, e.g. header = \"X-Api-Key\"",
                findings,
            )?;
            let name = header_name(&header, findings)?;
            if RESERVED_HEADERS[1..].contains(&name.as_str()) {
                findings.add(
                    Some(header.span),
                    &header.field,
                    format!("`{name}` cannot carry a credential; name the API's key header"),
                );
                return None;
            }
            let prefix = table
                .string("prefix", findings)
                .map_or_else(String::new, |found| found.value.to_owned());
            Some(Auth::Header {
                header: name,
                prefix,
            })
        }
        "oauth2" => oauth2(&table, findings).map(Auth::OAuth2),
        other => {
            findings.add(
                Some(kind.span),
                &kind.field,
                format!("`{other}` is no auth kind; write \"bearer\", \"header\", \"basic\" or \"oauth2\""),
            );
            None
        }
    }
}

/// `[auth] kind = "oauth2"`: the grant, the token endpoint, scopes, the body encoding and the
/// wait after a refusal.
fn oauth2(table: &Table<'_>, findings: &mut Findings<'_>) -> Option<OAuth2Spec> {
    table.only(
        &[
            "kind",
            "grant",
            "token_url",
            "scopes",
            "body_encoding",
            "refused_wait_ms",
        ],
        findings,
    );
    let grant = table
        .required_string(
            "grant",
            "write grant = \"refresh_token\" (an account authorised a connected app) or \"client_credentials\" (the client alone)",
            findings,
        )
        .and_then(|found| match found.value {
            "refresh_token" => Some(Grant::RefreshToken),
            "client_credentials" => Some(Grant::ClientCredentials),
            other => {
                findings.add(
                    Some(found.span),
                    &found.field,
                    format!("`{other}` is no grant opledger can use unattended; write \"refresh_token\" or \"client_credentials\""),
                );
                None
            }
        });
    let token_url = table
        .required_string(
            "token_url",
            "write the token endpoint, e.g. token_url = \"/services/oauth2/token\" (on the base URL's host) or a whole https:// URL",
            findings,
        )
        .and_then(|found| {
            let valid = if found.value.starts_with('/') {
                found.value.len() <= MAX_BASE_URL_BYTES
                    && found.value.bytes().all(|byte| byte.is_ascii_graphic() && byte != b'?' && byte != b'#')
            } else {
                check_base_url(found.value).is_ok()
            };
            if valid {
                Some(found.value.to_owned())
            } else {
                findings.add(
                    Some(found.span),
                    &found.field,
                    format!("`{}` is no token endpoint; write a path starting with `/` (on the base URL's host) or an http:// or https:// URL without query", found.value),
                );
                None
            }
        });
    let scopes = match table.has("scopes") {
        false => Some(Vec::new()),
        true => table.strings("scopes", findings).and_then(|items| {
            let span = table.get("scopes").map(|node| &node.span);
            if items.len() > MAX_SCOPES {
                findings.add(span, &table.field("scopes"), format!("lists {}; at most {MAX_SCOPES}", items.len()));
                return None;
            }
            let mut scopes = Vec::with_capacity(items.len());
            for item in items {
                // RFC 6749 §3.3: a scope token is visible ASCII without `"` or `\`.
                if item.value.is_empty()
                    || !item.value.bytes().all(|byte| byte.is_ascii_graphic() && byte != b'"' && byte != b'\\')
                {
                    findings.add(Some(item.span), &item.field, format!("`{}` is no scope (RFC 6749 §3.3: visible ASCII without spaces, `\"` or `\\`)", item.value));
                    return None;
                }
                scopes.push(item.value.to_owned());
            }
            Some(scopes)
        }),
    };
    let body_encoding = match table.string("body_encoding", findings) {
        None => Some(BodyEncoding::Form),
        Some(found) => match found.value {
            "form" => Some(BodyEncoding::Form),
            "json" => Some(BodyEncoding::Json),
            other => {
                findings.add(Some(found.span), &found.field, format!("`{other}` is no token request encoding; write \"form\" (RFC 6749) or \"json\""));
                None
            }
        },
    };
    let refused_wait_ms = match table.unsigned("refused_wait_ms", findings) {
        None if table.has("refused_wait_ms") => None,
        None => Some(DEFAULT_REFUSED_WAIT_MS),
        Some(found) if (MIN_REFUSED_WAIT_MS..=MAX_RETRY_AFTER_MS).contains(&found.value) => {
            Some(found.value)
        }
        Some(found) => {
            findings.add(
                Some(found.span),
                &found.field,
                format!("is {}; write how long operations wait after the token endpoint refused an account's credentials, {MIN_REFUSED_WAIT_MS} to {MAX_RETRY_AFTER_MS} ms, e.g. refused_wait_ms = {DEFAULT_REFUSED_WAIT_MS}", found.value),
            );
            None
        }
    };
    Some(OAuth2Spec {
        grant: grant?,
        token_url: token_url?,
        scopes: scopes?,
        body_encoding: body_encoding?,
        refused_wait_ms: refused_wait_ms?,
    })
}

pub(super) fn settings(top: &Table<'_>, findings: &mut Findings<'_>) -> BTreeMap<String, String> {
    let mut settings = BTreeMap::new();
    let Some(table) = top.table("settings", findings) else {
        return settings;
    };
    if table.entries().len() > MAX_SETTINGS {
        findings.add(
            Some(table.span()),
            table.path(),
            format!(
                "declares {} settings; at most {MAX_SETTINGS}",
                table.entries().len()
            ),
        );
    }
    for (name, _) in table.entries() {
        let Some(value) = table.string(name, findings) else {
            continue;
        };
        if !is_setting_name(name) {
            findings.add(
                Some(value.span),
                &value.field,
                format!("`{name}` is no setting name; use lower-case letters, digits and `_`, starting with a letter"),
            );
        } else if value.value.chars().count() > MAX_SETTING_VALUE_CHARS {
            findings.add(
                Some(value.span),
                &value.field,
                format!("is longer than {MAX_SETTING_VALUE_CHARS} characters"),
            );
        } else {
            settings.insert(name.clone(), value.value.to_owned());
        }
    }
    settings
}

fn errors(top: &Table<'_>, findings: &mut Findings<'_>) -> Option<ErrorSpec> {
    let Some(table) = top.table("errors", findings) else {
        return (!top.has("errors")).then(|| ErrorSpec {
            code_at: DEFAULT_CODE_AT.to_owned(),
            message_at: DEFAULT_MESSAGE_AT.to_owned(),
            rules: Vec::new(),
        });
    };
    table.only(&["code_at", "message_at", "rules"], findings);
    let code_at = optional_pointer(&table, "code_at", findings);
    let message_at = optional_pointer(&table, "message_at", findings);
    let tables = table.tables("rules", findings);
    if tables.len() > MAX_ERROR_RULES {
        findings.add(
            Some(table.span()),
            &table.field("rules"),
            format!("lists {} rules; at most {MAX_ERROR_RULES}", tables.len()),
        );
    }
    let rules = tables
        .iter()
        .filter_map(|rule| error_rule(rule, findings))
        .collect();
    Some(ErrorSpec {
        code_at: code_at.unwrap_or_else(|| DEFAULT_CODE_AT.to_owned()),
        message_at: message_at.unwrap_or_else(|| DEFAULT_MESSAGE_AT.to_owned()),
        rules,
    })
}

fn error_rule(table: &Table<'_>, findings: &mut Findings<'_>) -> Option<ErrorRule> {
    table.only(
        &["status", "code", "at", "means", "retry_after_ms"],
        findings,
    );
    if !table.has("status") {
        table.missing(
            "status",
            "write the HTTP status this rule matches, e.g. status = 403",
            findings,
        );
    }
    let status = status(table, "status", findings);
    let code = table
        .string("code", findings)
        .map(|found| found.value.to_owned());
    let at = optional_pointer(table, "at", findings);
    let means = table
        .required_string(
            "means",
            "write means = \"not_sent\", \"rejected\" or \"uncertain\"",
            findings,
        )
        .and_then(|found| match found.value {
            "not_sent" => Some(Means::NotSent),
            "rejected" => Some(Means::Rejected),
            "uncertain" => Some(Means::Uncertain),
            other => {
                findings.add(
                    Some(found.span),
                    &found.field,
                    format!("`{other}` means nothing here; write \"not_sent\", \"rejected\" or \"uncertain\""),
                );
                None
            }
        });
    let retry_after_ms = table
        .unsigned("retry_after_ms", findings)
        .and_then(|found| {
            if found.value > MAX_RETRY_AFTER_MS {
                findings.add(
                    Some(found.span),
                    &found.field,
                    format!(
                        "is {}; the longest wait is {MAX_RETRY_AFTER_MS} ms",
                        found.value
                    ),
                );
                return None;
            }
            Some(found.value)
        });
    if at.is_some() && code.is_none() {
        findings.add(
            Some(table.span()),
            &table.field("at"),
            "says where a code is, but the rule names no code; add code = \"…\" or remove at",
        );
    }
    Some(ErrorRule {
        status: status?,
        code,
        at,
        means: means?,
        retry_after_ms,
    })
}

/// `[rate_limit]`: both of `reset_header` and `reset_unit` or neither, and `min_wait_ms` in
/// [`MIN_RATE_LIMIT_WAIT_MS`]..=[`MAX_RETRY_AFTER_MS`] (default
/// [`DEFAULT_RATE_LIMIT_MIN_WAIT_MS`]).
fn rate_limit(table: &Table<'_>, findings: &mut Findings<'_>) -> Option<RateLimit> {
    table.only(
        &[
            "reset_header",
            "reset_unit",
            "min_wait_ms",
            "requests_per_s",
            "burst",
            "sends",
            "lookups",
        ],
        findings,
    );
    let both = budget(table, findings);
    let kind = |key: &str, findings: &mut Findings<'_>| match table.has(key) {
        false => Some(both?),
        true => table.table(key, findings).map(|sub| {
            sub.only(&["requests_per_s", "burst"], findings);
            budget(&sub, findings).flatten()
        }),
    };
    let sends = kind("sends", findings);
    let lookups = kind("lookups", findings);
    let reset = match (table.has("reset_header"), table.has("reset_unit")) {
        (false, false) => Some(None),
        (true, false) => {
            table.missing(
                "reset_unit",
                "say what the reset header's number counts: reset_unit = \"seconds\", \"unix_seconds\" or \"milliseconds\"",
                findings,
            );
            None
        }
        (false, true) => {
            table.missing(
                "reset_header",
                "name the header that says when the limit resets, e.g. reset_header = \"x-ratelimit-reset\", or remove reset_unit",
                findings,
            );
            None
        }
        (true, true) => reset_header(table, findings).map(Some),
    };
    let min_wait_ms = match table.unsigned("min_wait_ms", findings) {
        None if table.has("min_wait_ms") => None,
        None => Some(DEFAULT_RATE_LIMIT_MIN_WAIT_MS),
        Some(found) if (MIN_RATE_LIMIT_WAIT_MS..=MAX_RETRY_AFTER_MS).contains(&found.value) => {
            Some(found.value)
        }
        Some(found) => {
            findings.add(
                Some(found.span),
                &found.field,
                format!(
                    "is {}; write the least wait after a 429 in milliseconds, {MIN_RATE_LIMIT_WAIT_MS} to {MAX_RETRY_AFTER_MS}, e.g. min_wait_ms = {DEFAULT_RATE_LIMIT_MIN_WAIT_MS}",
                    found.value
                ),
            );
            None
        }
    };
    Some(RateLimit {
        reset: reset?,
        min_wait_ms: min_wait_ms?,
        sends: sends?,
        lookups: lookups?,
    })
}

/// `requests_per_s` and `burst` of a `[rate_limit]` table: `Some(None)` when neither is given,
/// `None` after a finding.
fn budget(table: &Table<'_>, findings: &mut Findings<'_>) -> Option<Option<Budget>> {
    let in_range =
        |key: &str, most: u64, findings: &mut Findings<'_>| match table.unsigned(key, findings) {
            None if table.has(key) => Err(()),
            None => Ok(None),
            Some(found) if (1..=most).contains(&found.value) => Ok(Some(found.value)),
            Some(found) => {
                findings.add(
                    Some(found.span),
                    &found.field,
                    format!("is {}; write 1 to {most}", found.value),
                );
                Err(())
            }
        };
    let rate = in_range("requests_per_s", MAX_REQUESTS_PER_S, findings);
    let burst = in_range("burst", MAX_BURST, findings);
    match (rate.ok()?, burst.ok()?) {
        (None, None) => Some(None),
        (Some(requests_per_s), burst) => Some(Some(Budget {
            requests_per_s,
            burst: burst.unwrap_or(requests_per_s),
        })),
        (None, Some(_)) => {
            table.missing(
                "requests_per_s",
                "a burst needs its rate; write requests_per_s = N beside it",
                findings,
            );
            None
        }
    }
}

fn reset_header(table: &Table<'_>, findings: &mut Findings<'_>) -> Option<ResetHeader> {
    let header = table
        .string("reset_header", findings)
        .and_then(|found| header_name(&found, findings));
    let unit = table
        .string("reset_unit", findings)
        .and_then(|found| match found.value {
            "seconds" => Some(ResetUnit::Seconds),
            "unix_seconds" => Some(ResetUnit::UnixSeconds),
            "milliseconds" => Some(ResetUnit::Milliseconds),
            other => {
                findings.add(
                    Some(found.span),
                    &found.field,
                    format!("`{other}` is no unit; write \"seconds\", \"unix_seconds\" or \"milliseconds\""),
                );
                None
            }
        });
    Some(ResetHeader {
        header: header?,
        unit: unit?,
    })
}

fn accounts(top: &Table<'_>, auth: Option<&Auth>, findings: &mut Findings<'_>) -> Vec<AccountSpec> {
    let tables = top.tables("accounts", findings);
    if tables.len() > MAX_ACCOUNTS_PER_CONNECTOR {
        findings.add(
            None,
            "accounts",
            format!(
                "lists {} accounts; at most {MAX_ACCOUNTS_PER_CONNECTOR}",
                tables.len()
            ),
        );
    }
    let mut accounts: Vec<AccountSpec> = Vec::new();
    for table in &tables {
        let Some(account) = account(table, auth, findings) else {
            continue;
        };
        if accounts.iter().any(|earlier| earlier.id == account.id) {
            findings.add(
                table.get("id").map(|node| &node.span),
                &table.field("id"),
                format!(
                    "account `{}` is listed twice; list each account once",
                    account.id
                ),
            );
            continue;
        }
        accounts.push(account);
    }
    accounts
}

fn account(
    table: &Table<'_>,
    auth: Option<&Auth>,
    findings: &mut Findings<'_>,
) -> Option<AccountSpec> {
    let mut known = vec![
        "id",
        "tenants",
        "token_env",
        "username_env",
        "password_env",
        "client_id_env",
        "client_secret_env",
        "refresh_token_env",
    ];
    known.extend_from_slice(SECRET_KEYS);
    table.only(&known, findings);
    for key in SECRET_KEYS {
        if let Some(node) = table.get(key) {
            let instead = match *key {
                "username" | "password" | "client_secret" | "refresh_token" => *key,
                _ => "token",
            };
            findings.add(
                Some(&node.span),
                &table.field(key),
                format!("a secret is never written in a connector file; write {instead}_env = \"VARIABLE\" and export the value there"),
            );
        }
    }
    let id = table
        .required_string(
            "id",
            "write the account's id, e.g. id = \"acme-main\"",
            findings,
        )
        .and_then(|found| {
            AccountId::new(found.value)
                .map_err(|error| findings.add(Some(found.span), &found.field, error.message))
                .ok()
        });
    let tenants = tenants(table, findings);
    let credentials = auth.and_then(|auth| file_credentials(table, auth, findings));
    Some(AccountSpec {
        id: id?,
        tenants: tenants?,
        credentials: credentials?,
    })
}

/// The tenants that own an account: at least one, each once.
pub(super) fn tenants(table: &Table<'_>, findings: &mut Findings<'_>) -> Option<Vec<TenantId>> {
    if !table.has("tenants") {
        table.missing(
            "tenants",
            "every account is owned by at least one tenant; write tenants = [\"acme\"]",
            findings,
        );
        return None;
    }
    let items = table.strings("tenants", findings)?;
    let field = table.field("tenants");
    let span = table.get("tenants").map(|node| &node.span);
    if items.is_empty() {
        findings.add(
            span,
            &field,
            "is empty; every account is owned by at least one tenant, e.g. tenants = [\"acme\"]",
        );
        return None;
    }
    if items.len() > MAX_TENANTS_PER_ACCOUNT {
        findings.add(
            span,
            &field,
            format!("lists {}; at most {MAX_TENANTS_PER_ACCOUNT}", items.len()),
        );
        return None;
    }
    let mut seen = BTreeSet::new();
    let mut tenants = Vec::with_capacity(items.len());
    for item in items {
        match TenantId::new(item.value) {
            Ok(tenant) if seen.insert(tenant.clone()) => tenants.push(tenant),
            Ok(tenant) => findings.add(
                Some(item.span),
                &item.field,
                format!("tenant `{tenant}` is listed twice"),
            ),
            Err(error) => findings.add(Some(item.span), &item.field, error.message),
        }
    }
    Some(tenants)
}

fn file_credentials(
    table: &Table<'_>,
    auth: &Auth,
    findings: &mut Findings<'_>,
) -> Option<Credentials> {
    let variable = |key: &str, findings: &mut Findings<'_>| -> Option<SecretSource> {
        let found = table.required_string(
            key,
            &format!("the connector uses {} auth; write {key} = \"VARIABLE\" naming the environment variable that holds it", auth.kind()),
            findings,
        )?;
        env_name(&found, findings).map(SecretSource::Env)
    };
    let refuse = |keys: &[&str], findings: &mut Findings<'_>| {
        for key in keys {
            if let Some(node) = table.get(key) {
                findings.add(
                    Some(&node.span),
                    &table.field(key),
                    format!("means nothing with {} auth; remove it", auth.kind()),
                );
            }
        }
    };
    const OAUTH_KEYS: &[&str] = &["client_id_env", "client_secret_env", "refresh_token_env"];
    match auth {
        Auth::Bearer | Auth::Header { .. } => {
            refuse(&["username_env", "password_env"], findings);
            refuse(OAUTH_KEYS, findings);
            variable("token_env", findings).map(Credentials::Token)
        }
        Auth::OAuth2(spec) => {
            refuse(&["token_env", "username_env", "password_env"], findings);
            let client_id = variable("client_id_env", findings);
            let client_secret = variable("client_secret_env", findings);
            let refresh_token = match spec.grant {
                Grant::RefreshToken => Some(variable("refresh_token_env", findings)?),
                Grant::ClientCredentials => {
                    if let Some(node) = table.get("refresh_token_env") {
                        findings.add(
                            Some(&node.span),
                            &table.field("refresh_token_env"),
                            "means nothing with the client_credentials grant; remove it",
                        );
                    }
                    None
                }
            };
            Some(Credentials::OAuth2 {
                client_id: client_id?,
                client_secret: client_secret?,
                refresh_token,
            })
        }
        Auth::Basic => {
            refuse(&["token_env"], findings);
            refuse(OAUTH_KEYS, findings);
            let username = variable("username_env", findings);
            let password = variable("password_env", findings);
            Some(Credentials::Basic {
                username: username?,
                password: password?,
            })
        }
    }
}

/// An environment variable's name: a letter or `_`, then letters, digits and `_`.
fn env_name(found: &Found<'_, &str>, findings: &mut Findings<'_>) -> Option<String> {
    let name = found.value;
    let valid = name
        .bytes()
        .next()
        .is_some_and(|byte| byte.is_ascii_alphabetic() || byte == b'_')
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_');
    if valid {
        Some(name.to_owned())
    } else {
        findings.add(
            Some(found.span),
            &found.field,
            format!("`{name}` is no environment variable name; write letters, digits and `_`, e.g. \"CRM_TOKEN_ACME\""),
        );
        None
    }
}
