//! `[[connectors]]`: REST connectors (files, presets, inline documents) and upstream MCP servers,
//! their accounts, owners and credentials.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use opledger_domain::ids::{AccountId, ProviderId, TenantId};
use opledger_providers::document::{parse_any, AnyDocument};
use opledger_providers::mcp::spec::McpAccount;
use opledger_providers::mcp::{McpConnector, McpDocument};
use opledger_providers::{
    presets, AccountSpec, Connector, ConnectorError, Credentials, Overrides, Secret, SecretSource,
};
use serde::Deserialize;
use toml::Spanned;

use super::{line_of, Checker, ConfigError};

/// One built `[[connectors]]` entry.
pub(super) enum Built {
    Rest(Connector),
    Mcp(McpConnector),
}

/// One `[[connectors]]` entry: a connector document (a preset shipped in the binary, a file, or
/// inline) and what this installation adds to it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ConnectorEntry {
    /// The provider id to register under (default: the document's `id`).
    pub(super) id: Option<Spanned<String>>,
    /// A connector shipped in the binary, by name (`opledger connectors list --presets`).
    pub(super) preset: Option<Spanned<String>>,
    /// A connector file, relative to this configuration file.
    pub(super) file: Option<Spanned<String>>,
    /// A connector document written here, as a TOML multi-line string.
    pub(super) inline: Option<Spanned<String>>,
    pub(super) base_url: Option<Spanned<String>>,
    pub(super) request_timeout_ms: Option<Spanned<u64>>,
    pub(super) connect_timeout_ms: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) settings: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    pub(super) accounts: Vec<ConnectorAccount>,
}

/// One account this installation adds to a connector.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ConnectorAccount {
    pub(super) id: Spanned<String>,
    pub(super) tenants: Option<Vec<Spanned<String>>>,
    pub(super) token: Option<Spanned<String>>,
    pub(super) token_env: Option<Spanned<String>>,
    pub(super) username_env: Option<Spanned<String>>,
    pub(super) password_env: Option<Spanned<String>>,
    pub(super) client_id_env: Option<Spanned<String>>,
    pub(super) client_secret_env: Option<Spanned<String>>,
    pub(super) refresh_token_env: Option<Spanned<String>>,
}

/// Most bytes of one connector file.
pub const MAX_CONNECTOR_FILE_BYTES: u64 = 1024 * 1024;

/// Reads a connector file, bounded by [`MAX_CONNECTOR_FILE_BYTES`].
pub fn read_connector_file(path: &Path) -> Result<String, String> {
    let size = std::fs::metadata(path)
        .map_err(|error| format!("`{}` cannot be read ({error}); write the path of a connector TOML file, relative to this configuration", path.display()))?
        .len();
    if size > MAX_CONNECTOR_FILE_BYTES {
        return Err(format!(
            "`{}` is {size} bytes; a connector file is at most {MAX_CONNECTOR_FILE_BYTES} bytes",
            path.display()
        ));
    }
    std::fs::read_to_string(path).map_err(|error| {
        format!(
            "`{}` cannot be read as UTF-8 text ({error})",
            path.display()
        )
    })
}

impl Checker<'_> {
    /// Every `[[connectors]]` entry, built; `tenants` are the configured tenants, which every
    /// account's owners must be among.
    pub(super) fn connectors(
        &self,
        entries: &[ConnectorEntry],
        tenants: &BTreeSet<TenantId>,
        token_dir: &Path,
        fingerprint_key: Option<&opledger_providers::credentials::FingerprintKey>,
        kek: Option<&opledger_subjects::Kek>,
    ) -> Result<(Vec<Connector>, Vec<McpConnector>), ConfigError> {
        let mut seen = BTreeSet::new();
        let mut built = Vec::with_capacity(entries.len());
        let mut upstreams = Vec::new();
        for (index, entry) in entries.iter().enumerate() {
            let field = format!("connectors[{index}]");
            let id =
                match self.connector(&field, entry, tenants, token_dir, fingerprint_key, kek)? {
                    Built::Rest(connector) => {
                        let id = connector.id().clone();
                        built.push(connector);
                        id
                    }
                    Built::Mcp(upstream) => {
                        let id = upstream.id().clone();
                        upstreams.push(upstream);
                        id
                    }
                };
            if !seen.insert(id.clone()) {
                return Err(self.error(
                    entry.id.as_ref().map(Spanned::span),
                    &format!("{field}.id"),
                    format!(
                        "provider `{id}` is configured twice; give one of them another id = \"…\""
                    ),
                ));
            }
        }
        Ok((built, upstreams))
    }

    /// One connector: its document, then what this file adds, built with the environment.
    pub(super) fn connector(
        &self,
        field: &str,
        entry: &ConnectorEntry,
        tenants: &BTreeSet<TenantId>,
        token_dir: &Path,
        fingerprint_key: Option<&opledger_providers::credentials::FingerprintKey>,
        kek: Option<&opledger_subjects::Kek>,
    ) -> Result<Built, ConfigError> {
        let document = match self.document(field, entry)? {
            AnyDocument::Rest(document) => *document,
            AnyDocument::Mcp(document) => {
                let upstream = self.upstream(field, entry, &document, tenants)?;
                if upstream.takes_login() {
                    // A person's login is kept beside the ledger, one file per upstream, sealed
                    // under the server's key-encryption key (never in the ledger's events).
                    let Some(kek) = kek else {
                        return Err(self.error(
                            entry.id.as_ref().map(Spanned::span),
                            field,
                            format!("`{}` acts for a person's login ([upstream.login]), which is kept sealed under the server's key-encryption key, and none is configured; set OPLEDGER_KEK (`openssl rand -hex 32`) or add [personal_data] with kek_file or kek_env", upstream.id()),
                        ));
                    };
                    let file =
                        token_dir.join(format!("opledger-mcp-login-{}.sealed", upstream.id()));
                    upstream
                        .place_login(file, kek.subkey(opledger_providers::mcp::LOGIN_KEY_PURPOSE));
                }
                return Ok(Built::Mcp(upstream));
            }
        };
        let mut overrides = self.overrides(field, entry, tenants)?;
        overrides.fingerprint_key = fingerprint_key.cloned();
        // Rotated OAuth2 refresh tokens are kept beside the ledger, one file per connector, so
        // a restart finds the token the provider last issued (never in the ledger's events).
        let provider = overrides.id.clone().unwrap_or_else(|| document.id.clone());
        overrides.token_file = Some(token_dir.join(format!("opledger-oauth-{provider}.json")));
        let env = |name: &str| (self.env)(name).map(std::ffi::OsString::from);
        Connector::with_env(&document, overrides, &env)
            .map(Built::Rest)
            .map_err(|errors| self.connector_errors(field, &errors))
    }

    /// An upstream MCP server: what an entry may add to its document is an id and accounts
    /// (owners only: the upstream has one identity, reached as its document says).
    pub(super) fn upstream(
        &self,
        field: &str,
        entry: &ConnectorEntry,
        document: &McpDocument,
        tenants: &BTreeSet<TenantId>,
    ) -> Result<McpConnector, ConfigError> {
        let rest_only = [
            (entry.base_url.as_ref().map(Spanned::span), "base_url"),
            (
                entry.request_timeout_ms.as_ref().map(Spanned::span),
                "request_timeout_ms",
            ),
            (
                entry.connect_timeout_ms.as_ref().map(Spanned::span),
                "connect_timeout_ms",
            ),
            (
                entry.settings.values().next().map(Spanned::span),
                "settings",
            ),
        ];
        if let Some((at, key)) = rest_only.into_iter().find(|(at, _)| at.is_some()) {
            return Err(self.error(at, &format!("{field}.{key}"), format!("is for a REST connector; `{}` is an MCP upstream, whose document says how it is reached (its [upstream] and timeouts)", document.id)));
        }
        let id = match &entry.id {
            Some(id) => Some(ProviderId::new(id.get_ref().clone()).map_err(|error| {
                self.error(Some(id.span()), &format!("{field}.id"), error.message)
            })?),
            None => None,
        };
        let mut accounts = Vec::with_capacity(entry.accounts.len());
        for (position, account) in entry.accounts.iter().enumerate() {
            let account_field = format!("{field}.accounts[{position}]");
            let credentials = [
                &account.token,
                &account.token_env,
                &account.username_env,
                &account.password_env,
                &account.client_id_env,
                &account.client_secret_env,
                &account.refresh_token_env,
            ];
            if let Some(given) = credentials.into_iter().flatten().next() {
                return Err(self.error(Some(given.span()), &account_field, "an MCP upstream's account carries no credentials (the upstream has one identity: its document's env_from or headers_from); give id and tenants only".to_owned()));
            }
            let (id, owners) = self.account_owners(&account_field, account, tenants)?;
            accounts.push(McpAccount {
                id,
                tenants: owners,
            });
        }
        let env = |name: &str| (self.env)(name).map(std::ffi::OsString::from);
        McpConnector::build(document, id, &accounts, &env)
            .map_err(|errors| self.connector_errors(field, &errors))
    }

    /// The connector document an entry names: exactly one of `preset`, `file` and `inline`.
    pub(super) fn document(
        &self,
        field: &str,
        entry: &ConnectorEntry,
    ) -> Result<AnyDocument, ConfigError> {
        let given = [&entry.preset, &entry.file, &entry.inline];
        let count = given.iter().filter(|source| source.is_some()).count();
        if count != 1 {
            let at = given
                .iter()
                .find_map(|source| source.as_ref().map(Spanned::span));
            return Err(self.error(
                at,
                field,
                format!("names {count} connector documents; give exactly one of preset = \"NAME\" (`opledger connectors list --presets` lists them), file = \"PATH\" or inline = '''…'''"),
            ));
        }
        let parsed = if let Some(preset) = &entry.preset {
            let (name, text) = presets::preset(preset.get_ref()).ok_or_else(|| {
                let known: Vec<&str> = presets::preset_names().collect();
                self.error(
                    Some(preset.span()),
                    &format!("{field}.preset"),
                    format!(
                        "`{}` is not a preset; the presets are {}",
                        preset.get_ref(),
                        known.join(", ")
                    ),
                )
            })?;
            parse_any(name, text)
        } else if let Some(file) = &entry.file {
            let path = self.relative(file.get_ref());
            let text = read_connector_file(&path).map_err(|message| {
                self.error(Some(file.span()), &format!("{field}.file"), message)
            })?;
            parse_any(&path.display().to_string(), &text)
        } else {
            let inline = entry.inline.as_ref().expect("exactly one source is given");
            self.inline_document(field, inline)
        };
        parsed.map_err(|errors| self.connector_errors(field, &errors))
    }

    /// A connector document written inside this file: its errors point at this file's lines.
    pub(super) fn inline_document(
        &self,
        field: &str,
        inline: &Spanned<String>,
    ) -> Result<AnyDocument, Vec<ConnectorError>> {
        // The string's first line is the line its opening quotes are on; TOML drops a newline
        // right after them, so the document's line 1 is the next one.
        let opening_line = line_of(self.text, inline.span().start);
        let skipped = usize::from(
            self.text
                .get(inline.span().start..)
                .is_some_and(|rest| rest.starts_with("'''\n") || rest.starts_with("\"\"\"\n")),
        );
        parse_any(self.file, inline.get_ref()).map_err(|errors| {
            errors
                .into_iter()
                .map(|mut error| {
                    error.line = error.line.map(|line| line + opening_line + skipped - 1);
                    error.field = format!("{field}.inline.{}", error.field);
                    error
                })
                .collect()
        })
    }

    /// What an entry adds to its document: id, base URL, timeouts, settings and accounts.
    pub(super) fn overrides(
        &self,
        field: &str,
        entry: &ConnectorEntry,
        tenants: &BTreeSet<TenantId>,
    ) -> Result<Overrides, ConfigError> {
        let id = match &entry.id {
            Some(id) => Some(ProviderId::new(id.get_ref().clone()).map_err(|error| {
                self.error(Some(id.span()), &format!("{field}.id"), error.message)
            })?),
            None => None,
        };
        let mut accounts = Vec::with_capacity(entry.accounts.len());
        for (position, account) in entry.accounts.iter().enumerate() {
            let account_field = format!("{field}.accounts[{position}]");
            accounts.push(self.account(&account_field, account, tenants)?);
        }
        Ok(Overrides {
            id,
            base_url: entry.base_url.as_ref().map(|url| url.get_ref().clone()),
            settings: entry
                .settings
                .iter()
                .map(|(name, value)| (name.clone(), value.get_ref().clone()))
                .collect(),
            accounts,
            request_timeout_ms: entry.request_timeout_ms.as_ref().map(|ms| *ms.get_ref()),
            connect_timeout_ms: entry.connect_timeout_ms.as_ref().map(|ms| *ms.get_ref()),
            token_file: None,
            fingerprint_key: None,
        })
    }

    /// The key credential fingerprints are keyed with, from the variable
    /// `credential_fingerprint_key_env` names (`None` when it is not set: the unkeyed form).
    pub(super) fn fingerprint_key(
        &self,
        variable: &Option<Spanned<String>>,
    ) -> Result<Option<opledger_providers::credentials::FingerprintKey>, ConfigError> {
        let Some(variable) = variable else {
            return Ok(None);
        };
        let at = |message: String| {
            self.error(
                Some(variable.span()),
                "credential_fingerprint_key_env",
                message,
            )
        };
        let value = (self.env)(variable.get_ref()).ok_or_else(|| {
            at(format!(
                "environment variable `{}` is not set; export a key of at least {} bytes (e.g. `openssl rand -hex 32`) before starting the server",
                variable.get_ref(),
                opledger_providers::credentials::MIN_FINGERPRINT_KEY_BYTES
            ))
        })?;
        opledger_domain::redact::register(value.trim());
        opledger_providers::credentials::FingerprintKey::new(value.trim().as_bytes().to_vec())
            .map(Some)
            .map_err(|message| at(format!("`{}`: {message}", variable.get_ref())))
    }

    /// One account an entry adds, with its owners (configured tenants) and its credentials
    /// (read from the environment here, so a missing variable is named at its line).
    pub(super) fn account(
        &self,
        field: &str,
        account: &ConnectorAccount,
        tenants: &BTreeSet<TenantId>,
    ) -> Result<AccountSpec, ConfigError> {
        let (id, owned_by) = self.account_owners(field, account, tenants)?;
        Ok(AccountSpec {
            id,
            tenants: owned_by,
            credentials: self.credentials(field, account)?,
        })
    }

    /// An account's id and owners (each a configured tenant).
    pub(super) fn account_owners(
        &self,
        field: &str,
        account: &ConnectorAccount,
        tenants: &BTreeSet<TenantId>,
    ) -> Result<(AccountId, Vec<TenantId>), ConfigError> {
        let id = AccountId::new(account.id.get_ref().clone()).map_err(|error| {
            self.error(
                Some(account.id.span()),
                &format!("{field}.id"),
                error.message,
            )
        })?;
        let owners = account.tenants.as_deref().unwrap_or_default();
        if owners.is_empty() {
            return Err(self.error(
                Some(account.id.span()),
                &format!("{field}.tenants"),
                format!("account `{id}` names no tenant; add tenants = [\"…\"] with the tenants whose operations may use it"),
            ));
        }
        let mut owned_by = Vec::with_capacity(owners.len());
        for (position, tenant) in owners.iter().enumerate() {
            let at = format!("{field}.tenants[{position}]");
            let tenant_id = TenantId::new(tenant.get_ref().clone())
                .map_err(|error| self.error(Some(tenant.span()), &at, error.message))?;
            if !tenants.contains(&tenant_id) {
                return Err(self.error(
                    Some(tenant.span()),
                    &at,
                    format!("names tenant `{tenant_id}`, which is not under [[tenants]]; add it there or remove it here"),
                ));
            }
            owned_by.push(tenant_id);
        }
        Ok((id, owned_by))
    }

    /// An account's credentials: `token_env` (or `token` for local use), or `username_env` and
    /// `password_env` for basic authentication.
    pub(super) fn credentials(
        &self,
        field: &str,
        account: &ConnectorAccount,
    ) -> Result<Credentials, ConfigError> {
        let secret = |variable: &Spanned<String>, name: &str| {
            (self.env)(variable.get_ref())
                .filter(|value| !value.trim().is_empty())
                .map(|value| SecretSource::Direct(Secret::new(value.trim())))
                .ok_or_else(|| {
                    self.error(
                        Some(variable.span()),
                        &format!("{field}.{name}"),
                        format!("environment variable `{}` is not set or empty; export the account's credential there", variable.get_ref()),
                    )
                })
        };
        if let Some(client_id) = &account.client_id_env {
            let others = [
                &account.token,
                &account.token_env,
                &account.username_env,
                &account.password_env,
            ];
            let Some(client_secret) = &account.client_secret_env else {
                return Err(self.error(
                    Some(client_id.span()),
                    &format!("{field}.client_secret_env"),
                    "an OAuth2 client needs its secret too; add client_secret_env = \"VARIABLE\""
                        .into(),
                ));
            };
            if others.iter().any(|other| other.is_some()) {
                return Err(self.error(
                    Some(account.id.span()),
                    field,
                    "gives an OAuth2 client and a token or a username and password; keep client_id_env, client_secret_env (and refresh_token_env) for an oauth2 connector".into(),
                ));
            }
            return Ok(Credentials::OAuth2 {
                client_id: secret(client_id, "client_id_env")?,
                client_secret: secret(client_secret, "client_secret_env")?,
                refresh_token: account
                    .refresh_token_env
                    .as_ref()
                    .map(|variable| secret(variable, "refresh_token_env"))
                    .transpose()?,
            });
        }
        if let Some(stray) = account
            .client_secret_env
            .as_ref()
            .or(account.refresh_token_env.as_ref())
        {
            return Err(self.error(
                Some(stray.span()),
                field,
                "gives an OAuth2 secret without client_id_env; an oauth2 account gives client_id_env, client_secret_env and, for the refresh_token grant, refresh_token_env".into(),
            ));
        }
        match (
            &account.token,
            &account.token_env,
            &account.username_env,
            &account.password_env,
        ) {
            (Some(token), None, None, None) if !token.get_ref().trim().is_empty() => Ok(
                Credentials::Token(SecretSource::Direct(Secret::new(token.get_ref().trim()))),
            ),
            (None, Some(variable), None, None) => {
                Ok(Credentials::Token(secret(variable, "token_env")?))
            }
            (None, None, Some(username), Some(password)) => Ok(Credentials::Basic {
                username: secret(username, "username_env")?,
                password: secret(password, "password_env")?,
            }),
            _ => Err(self.error(
                Some(account.id.span()),
                field,
                "needs exactly one of token_env = \"VARIABLE\", token = \"…\" (local use), username_env and password_env (basic authentication), or client_id_env, client_secret_env and refresh_token_env (oauth2)".into(),
            )),
        }
    }

    /// Every problem of a connector document or its build, as one error: the first names its
    /// place, and the message lists them all, each with its file, line and field.
    pub(super) fn connector_errors(&self, field: &str, errors: &[ConnectorError]) -> ConfigError {
        let Some(first) = errors.first() else {
            return self.error(None, field, "could not be built".into());
        };
        // Problems of the build (overrides, the environment) have no line in the document:
        // they come from this entry.
        let (file, line, at) = if first.line.is_none() && first.file != self.file {
            (
                self.file.to_owned(),
                None,
                format!("{field}.{}", first.field),
            )
        } else {
            (first.file.clone(), first.line, first.field.clone())
        };
        let message = if errors.len() == 1 {
            first.message.clone()
        } else {
            format!(
                "{} (and {} more problem(s) in {field}):\n{}",
                first.message,
                errors.len() - 1,
                opledger_providers::render_all(errors)
            )
        };
        ConfigError {
            file,
            line,
            field: at,
            message,
        }
    }
}
