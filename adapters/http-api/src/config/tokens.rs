//! `[[tenants]]`, `[[operators]]` and `[[approvers]]`: the bearer tokens and whom each stands for.

use std::collections::{BTreeMap, BTreeSet};

use opledger_domain::ids::TenantId;
use serde::Deserialize;
use toml::Spanned;

use super::{Checker, ConfigError, File};

/// The shortest token accepted: shorter ones are guessable.
pub const MIN_TOKEN_CHARS: usize = 16;

/// Who a bearer token belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// A tenant's agents and services: their own operations only.
    Tenant(TenantId),
    /// A person working the review queue, for some tenants or all.
    Operator {
        /// Their name, recorded as the reviewer.
        name: String,
        /// The tenants whose queue they work (`None`: every tenant).
        tenants: Option<BTreeSet<TenantId>>,
    },
    /// A person who approves or denies operations awaiting approval, for some tenants or all.
    /// Once a tenant has an approver, its own token can no longer approve: an agent holding the
    /// tenant's token cannot approve its own request.
    Approver {
        /// Their name, recorded as the approver.
        name: String,
        /// The tenants whose operations they decide (`None`: every tenant).
        tenants: Option<BTreeSet<TenantId>>,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TokenHolder {
    pub(super) id: Spanned<String>,
    pub(super) token: Option<Spanned<String>>,
    pub(super) token_env: Option<Spanned<String>>,
    /// `"all"` or `"declared"`: which argument values of an operation with a subject are sealed.
    pub(super) personal_data: Option<Spanned<String>>,
    /// Days after which a subject whose operations all settled is erased automatically.
    pub(super) retention_days: Option<Spanned<u32>>,
    /// Whether the tenant's own webhook endpoints may post to loopback (this host's ports).
    pub(super) webhooks_to_loopback: Option<Spanned<bool>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Operator {
    pub(super) id: Spanned<String>,
    pub(super) token: Option<Spanned<String>>,
    pub(super) token_env: Option<Spanned<String>>,
    pub(super) tenants: Option<Vec<Spanned<String>>>,
}

/// The tenants the tokens name.
pub(super) fn tenant_ids(tokens: &BTreeMap<String, Principal>) -> BTreeSet<TenantId> {
    tokens
        .values()
        .filter_map(|principal| match principal {
            Principal::Tenant(tenant) => Some(tenant.clone()),
            _ => None,
        })
        .collect()
}

impl Checker<'_> {
    pub(super) fn tokens(&self, file: &File) -> Result<BTreeMap<String, Principal>, ConfigError> {
        let mut tokens = BTreeMap::new();
        let mut tenants = BTreeSet::new();
        for (index, holder) in file.tenants.iter().enumerate() {
            let field = format!("tenants[{index}]");
            let tenant = TenantId::new(holder.id.get_ref().clone()).map_err(|error| {
                self.error(
                    Some(holder.id.span()),
                    &format!("{field}.id"),
                    error.message,
                )
            })?;
            if !tenants.insert(tenant.clone()) {
                return Err(self.error(
                    Some(holder.id.span()),
                    &format!("{field}.id"),
                    format!("tenant `{tenant}` is listed twice; list each tenant once"),
                ));
            }
            let token = self.token(&field, &holder.id, &holder.token, &holder.token_env)?;
            self.insert_token(&mut tokens, token, Principal::Tenant(tenant), &holder.id)?;
        }
        for (index, operator) in file.operators.iter().enumerate() {
            let (name, scope, token) = self.person("operators", index, operator, &tenants)?;
            let principal = Principal::Operator {
                name,
                tenants: scope,
            };
            self.insert_token(&mut tokens, token, principal, &operator.id)?;
        }
        for (index, approver) in file.approvers.iter().enumerate() {
            let (name, scope, token) = self.person("approvers", index, approver, &tenants)?;
            let principal = Principal::Approver {
                name,
                tenants: scope,
            };
            self.insert_token(&mut tokens, token, principal, &approver.id)?;
        }
        Ok(tokens)
    }

    /// An operator's or approver's name (recorded as the reviewer or approver), tenant scope
    /// (`None`: every tenant) and token.
    pub(super) fn person(
        &self,
        section: &str,
        index: usize,
        person: &Operator,
        tenants: &BTreeSet<TenantId>,
    ) -> Result<(String, Option<BTreeSet<TenantId>>, String), ConfigError> {
        let field = format!("{section}[{index}]");
        let name = person.id.get_ref().trim().to_owned();
        if name.is_empty() || name.len() > 128 {
            return Err(self.error(
                Some(person.id.span()),
                &format!("{field}.id"),
                "must be 1 to 128 characters; it is recorded with every decision".into(),
            ));
        }
        let scope = match &person.tenants {
            None => None,
            Some(list) => {
                let mut scope = BTreeSet::new();
                for (position, tenant) in list.iter().enumerate() {
                    let id = TenantId::new(tenant.get_ref().clone()).map_err(|error| {
                        self.error(
                            Some(tenant.span()),
                            &format!("{field}.tenants[{position}]"),
                            error.message,
                        )
                    })?;
                    if !tenants.contains(&id) {
                        return Err(self.error(
                            Some(tenant.span()),
                            &format!("{field}.tenants[{position}]"),
                            format!("names tenant `{id}`, which is not under [[tenants]]; add it there or remove it here"),
                        ));
                    }
                    scope.insert(id);
                }
                Some(scope)
            }
        };
        let token = self.token(&field, &person.id, &person.token, &person.token_env)?;
        Ok((name, scope, token))
    }

    pub(super) fn insert_token(
        &self,
        tokens: &mut BTreeMap<String, Principal>,
        token: String,
        principal: Principal,
        at: &Spanned<String>,
    ) -> Result<(), ConfigError> {
        if tokens.insert(token, principal).is_some() {
            return Err(self.error(
                Some(at.span()),
                "token",
                format!(
                    "`{}` has the same token as another tenant or operator; every token must be unique",
                    at.get_ref()
                ),
            ));
        }
        Ok(())
    }

    /// The token given inline or through an environment variable (exactly one of the two).
    pub(super) fn token(
        &self,
        field: &str,
        owner: &Spanned<String>,
        inline: &Option<Spanned<String>>,
        env: &Option<Spanned<String>>,
    ) -> Result<String, ConfigError> {
        let (token, at, name) = match (inline, env) {
            (Some(token), None) => (token.get_ref().clone(), token.span(), "token"),
            (None, Some(variable)) => {
                let value = (self.env)(variable.get_ref()).ok_or_else(|| {
                    self.error(
                        Some(variable.span()),
                        &format!("{field}.token_env"),
                        format!(
                            "environment variable `{}` is not set; export it before starting the server",
                            variable.get_ref()
                        ),
                    )
                })?;
                (value, variable.span(), "token_env")
            }
            (Some(token), Some(_)) => {
                return Err(self.error(
                    Some(token.span()),
                    &format!("{field}.token"),
                    "is given together with token_env; keep one (token_env keeps the secret out of the file)".into(),
                ))
            }
            (None, None) => {
                return Err(self.error(
                    Some(owner.span()),
                    field,
                    "has no token; add token_env = \"VARIABLE\" (or token = \"…\" for local use)"
                        .into(),
                ))
            }
        };
        let token = token.trim().to_owned();
        // Kept out of every log line and answer (`opledger_domain::redact`).
        opledger_domain::redact::register(&token);
        if token.chars().count() < MIN_TOKEN_CHARS || token.chars().any(char::is_whitespace) {
            return Err(self.error(
                Some(at),
                &format!("{field}.{name}"),
                format!("the token must be at least {MIN_TOKEN_CHARS} characters without spaces; generate one, e.g. with `openssl rand -hex 24`"),
            ));
        }
        Ok(token)
    }
}
