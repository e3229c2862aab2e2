//! `[mcp]`: the browser origins `/mcp` answers besides loopback ones.

use serde::Deserialize;
use toml::Spanned;

use super::{Checker, ConfigError, MAX_ENTRIES};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct McpSection {
    #[serde(default)]
    pub(super) allowed_origins: Vec<Spanned<String>>,
}

impl Checker<'_> {
    /// `[mcp] allowed_origins`: each a browser origin, `scheme://host[:port]` with nothing after.
    pub(super) fn mcp_allowed_origins(
        &self,
        section: &McpSection,
    ) -> Result<Vec<String>, ConfigError> {
        if section.allowed_origins.len() > MAX_ENTRIES {
            return Err(self.error(
                None,
                "mcp.allowed_origins",
                format!(
                    "lists {}; at most {MAX_ENTRIES} are allowed",
                    section.allowed_origins.len()
                ),
            ));
        }
        section
            .allowed_origins
            .iter()
            .enumerate()
            .map(|(index, origin)| {
                let text = origin.get_ref().trim().to_ascii_lowercase();
                let well_formed = ["http://", "https://"]
                    .iter()
                    .find_map(|scheme| text.strip_prefix(scheme))
                    .is_some_and(|host| {
                        !host.is_empty()
                            && host.bytes().all(|byte| {
                                byte.is_ascii_alphanumeric() || b"-.:[]".contains(&byte)
                            })
                    });
                if well_formed {
                    Ok(text)
                } else {
                    Err(self.error(
                        Some(origin.span()),
                        &format!("mcp.allowed_origins[{index}]"),
                        format!(
                            "`{}` is no browser origin; write the scheme, host and port only, e.g. \"https://agent.example.com\" or \"http://localhost:3000\"",
                            origin.get_ref()
                        ),
                    ))
                }
            })
            .collect()
    }
}
