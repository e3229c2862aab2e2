//! The `[personal_data]` section and each tenant's privacy settings: where the key-encryption
//! key comes from (a file or an environment variable; never the configuration itself), where the
//! key store is, and per tenant which argument values are personal and how long they are kept.
//!
//! ```toml
//! [personal_data]
//! kek_file = "/run/secrets/opledger-kek"   # or kek_env = "OPLEDGER_KEK"
//!
//! [[tenants]]
//! id = "acme"
//! token_env = "ACME_TOKEN"
//! personal_data = "all"     # every argument value of an operation with a subject; or "declared"
//! retention_days = 365      # erase subjects whose operations all settled longer ago
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;

use opledger_domain::ids::TenantId;
use opledger_subjects::Kek;
use serde::Deserialize;
use toml::Spanned;

use super::{span, Checker, ConfigError, TokenHolder};

/// The environment variable read for the key-encryption key when the section names neither a
/// file nor a variable.
pub const DEFAULT_KEK_ENV: &str = "OPLEDGER_KEK";

/// The longest retention accepted, in days (100 years): a longer one is a typo.
pub const MAX_RETENTION_DAYS: u32 = 36_500;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PersonalDataSection {
    kek_file: Option<Spanned<String>>,
    kek_env: Option<Spanned<String>>,
    /// The key store's file (default: the ledger file's name with `.keys` added).
    key_store: Option<PathBuf>,
}

/// Which of a tenant's argument values are personal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PersonalFieldsMode {
    /// Every argument value of an operation that names a data subject (the default: nothing
    /// personal can slip through an undeclared field).
    #[default]
    All,
    /// Only the fields the connector's action declares `personal`.
    Declared,
}

/// One tenant's privacy settings.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TenantPrivacy {
    /// Which values are sealed.
    pub fields: PersonalFieldsMode,
    /// Subjects whose operations all settled longer ago than this are erased automatically.
    pub retention_days: Option<u32>,
}

/// Personal data, as configured.
#[derive(Clone, Debug)]
pub struct PersonalDataSettings {
    /// The key-encryption key, read at start.
    pub kek: Kek,
    /// The key store's file (`None`: beside the SQLite ledger, or in memory for other stores).
    pub key_store: Option<PathBuf>,
    /// Each tenant's settings (tenants not named keep the defaults).
    pub tenants: BTreeMap<TenantId, TenantPrivacy>,
}

impl Checker<'_> {
    /// `[personal_data]` and the tenants' `personal_data` / `retention_days`, checked; the key
    /// is read now, so a missing one stops the start with what to do. Without the section and
    /// without `OPLEDGER_KEK`, personal data is off (an intent naming a subject is refused).
    pub(super) fn personal_data(
        &self,
        section: Option<&PersonalDataSection>,
        tenants: &[TokenHolder],
    ) -> Result<Option<PersonalDataSettings>, ConfigError> {
        let mut privacy = BTreeMap::new();
        for (index, holder) in tenants.iter().enumerate() {
            let field = format!("tenants[{index}]");
            let fields = match &holder.personal_data {
                None => PersonalFieldsMode::All,
                Some(mode) => match mode.get_ref().as_str() {
                    "all" => PersonalFieldsMode::All,
                    "declared" => PersonalFieldsMode::Declared,
                    other => {
                        return Err(self.error(
                            Some(mode.span()),
                            &format!("{field}.personal_data"),
                            format!("is `{other}`; write \"all\" (every argument value of an operation with a subject) or \"declared\" (the fields its connector declares personal)"),
                        ))
                    }
                },
            };
            let retention_days = holder.retention_days.as_ref().map(|days| *days.get_ref());
            if let Some(days) =
                retention_days.filter(|days| *days == 0 || *days > MAX_RETENTION_DAYS)
            {
                return Err(self.error(
                    span(&holder.retention_days),
                    &format!("{field}.retention_days"),
                    format!("is {days}; use 1 to {MAX_RETENTION_DAYS}"),
                ));
            }
            if let Ok(tenant) = TenantId::new(holder.id.get_ref().clone()) {
                privacy.insert(
                    tenant,
                    TenantPrivacy {
                        fields,
                        retention_days,
                    },
                );
            }
        }
        let kek = match section {
            Some(PersonalDataSection { kek_file: Some(_), kek_env: Some(env), .. }) => {
                return Err(self.error(
                    Some(env.span()),
                    "personal_data.kek_env",
                    "is given with kek_file; name the key-encryption key one way".into(),
                ))
            }
            Some(PersonalDataSection { kek_file: Some(file), .. }) => {
                Kek::from_file(&self.relative(file.get_ref())).map_err(|error| {
                    self.error(Some(file.span()), "personal_data.kek_file", error.to_string())
                })?
            }
            Some(PersonalDataSection { kek_env: Some(env), .. }) => {
                let text = (self.env)(env.get_ref()).ok_or_else(|| {
                    self.error(
                        Some(env.span()),
                        "personal_data.kek_env",
                        format!("names ${}, which is not set; set it to 32 random bytes as 64 hex digits (`openssl rand -hex 32`), and keep a copy: without it no personal value can be read again", env.get_ref()),
                    )
                })?;
                Kek::parse(&text, &format!("${}", env.get_ref())).map_err(|error| {
                    self.error(Some(env.span()), "personal_data.kek_env", error.to_string())
                })?
            }
            Some(_) | None => match (self.env)(DEFAULT_KEK_ENV) {
                Some(text) => Kek::parse(&text, &format!("${DEFAULT_KEK_ENV}"))
                    .map_err(|error| self.error(None, "personal_data", error.to_string()))?,
                None if section.is_some() => {
                    return Err(self.error(
                        None,
                        "personal_data",
                        format!("names no key-encryption key; add kek_file = \"…\" or kek_env = \"…\", or set ${DEFAULT_KEK_ENV}"),
                    ))
                }
                None => {
                    if privacy.values().any(|p: &TenantPrivacy| p.retention_days.is_some()) {
                        return Err(self.error(
                            None,
                            "personal_data",
                            "is not configured, but a tenant sets retention_days; add [personal_data] with kek_file or kek_env".into(),
                        ));
                    }
                    return Ok(None);
                }
            },
        };
        Ok(Some(PersonalDataSettings {
            kek,
            key_store: section
                .and_then(|section| section.key_store.as_ref())
                .map(|path| self.relative(&path.to_string_lossy())),
            tenants: privacy,
        }))
    }
}
