//! `[metrics]`: who may scrape `/metrics`, and whether webhook counts are labelled by endpoint.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

use super::{Checker, ConfigError, Principal};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MetricsSection {
    pub(super) token: Option<Spanned<String>>,
    pub(super) token_env: Option<Spanned<String>>,
    /// Shows `/metrics` to anyone though several tenants are configured.
    pub(super) open: Option<Spanned<bool>>,
    /// Labels the webhook metrics by endpoint though several tenants are configured.
    pub(super) endpoint_labels: Option<Spanned<bool>>,
}

impl Checker<'_> {
    /// The token `/metrics` asks for, if any: never one a tenant or an operator holds.
    pub(super) fn metrics_token(
        &self,
        metrics: &MetricsSection,
        tokens: &BTreeMap<String, Principal>,
    ) -> Result<Option<String>, ConfigError> {
        let Some(owner) = metrics.token.as_ref().or(metrics.token_env.as_ref()) else {
            return Ok(None);
        };
        let token = self.token("metrics", owner, &metrics.token, &metrics.token_env)?;
        if tokens.contains_key(&token) {
            return Err(self.error(
                Some(owner.span()),
                "metrics",
                "has the same token as a tenant or operator; give the scraper its own".into(),
            ));
        }
        Ok(Some(token))
    }
}
