//! The `[log]` section: the transparency log's signing key, how often checkpoints are published,
//! and the tree switch. The key is named by a file (never written in the configuration, never
//! stored in the ledger); without one, `OPLEDGER_LOG_KEY_FILE` or `OPLEDGER_LOG_KEY` is read.

use serde::Deserialize;
use toml::Spanned;

use super::{span, spanned_or, Checker, ConfigError};
use crate::log::{
    key_from_environment, LogSettings, DEFAULT_CHECKPOINT_EVERY_EVENTS, DEFAULT_CHECKPOINT_EVERY_S,
    MAX_CHECKPOINT_EVERY_S,
};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LogSection {
    signing_key_file: Option<Spanned<String>>,
    checkpoint_every_s: Option<Spanned<u64>>,
    checkpoint_every_events: Option<Spanned<u64>>,
    tree: Option<bool>,
}

impl Checker<'_> {
    /// The `[log]` section, checked; the key file is read now, so a wrong path stops the start.
    pub(super) fn log(&self, section: Option<&LogSection>) -> Result<LogSettings, ConfigError> {
        let empty = LogSection::default();
        let section = section.unwrap_or(&empty);
        let signing_key = match &section.signing_key_file {
            Some(file) => {
                let path = self.relative(file.get_ref());
                Some(std::fs::read_to_string(&path).map_err(|error| {
                    self.error(
                        Some(file.span()),
                        "log.signing_key_file",
                        format!("cannot read {}: {error}; make a key with `opledger keys generate --name NAME --out FILE`", path.display()),
                    )
                })?)
            }
            None => key_from_environment()
                .map_err(|message| self.error(None, "log.signing_key_file", message))?,
        };
        if let Some(key) = &signing_key {
            opledger_domain::checkpoint::LogSigner::parse(key).map_err(|error| {
                self.error(
                    span(&section.signing_key_file),
                    "log.signing_key_file",
                    error.to_string(),
                )
            })?;
        }
        let every_s = spanned_or(&section.checkpoint_every_s, DEFAULT_CHECKPOINT_EVERY_S);
        if !(1..=MAX_CHECKPOINT_EVERY_S).contains(&every_s) {
            return Err(self.error(
                span(&section.checkpoint_every_s),
                "log.checkpoint_every_s",
                format!("is {every_s}; use 1 to {MAX_CHECKPOINT_EVERY_S} seconds"),
            ));
        }
        let every_events = spanned_or(
            &section.checkpoint_every_events,
            DEFAULT_CHECKPOINT_EVERY_EVENTS,
        );
        if every_events == 0 {
            return Err(self.error(
                span(&section.checkpoint_every_events),
                "log.checkpoint_every_events",
                "is 0; use at least 1 event".to_owned(),
            ));
        }
        Ok(LogSettings {
            signing_key,
            checkpoint_every_s: every_s,
            checkpoint_every_events: every_events,
            tree: section.tree.unwrap_or(true),
        })
    }
}
