//! `[engine]`: the lease, the retry budget and the backoff, and the workers.

use std::ops::Range;

use opledger_domain::contract::RetryPolicy;
use opledger_domain::engine::EnginePolicy;
use opledger_runtime::workers::MAX_CONCURRENT_LIMIT;
use serde::Deserialize;
use toml::Spanned;

use super::{span, spanned_or, Checker, ConfigError, DEFAULT_WORKERS};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EngineSection {
    pub(super) lease_ms: Option<Spanned<u64>>,
    pub(super) workers: Option<Spanned<usize>>,
    pub(super) worker_send_delay_ms: Option<Spanned<u64>>,
    pub(super) backoff_base_ms: Option<Spanned<u64>>,
    pub(super) backoff_max_ms: Option<Spanned<u64>>,
    pub(super) max_attempts: Option<Spanned<u32>>,
    pub(super) max_total_ms: Option<Spanned<u64>>,
    pub(super) max_reconciliations: Option<Spanned<u32>>,
}

impl EngineSection {
    /// Where the key the engine policy names (`OutOfRange::field`) is written, if it is.
    fn span_of(&self, field: &str) -> Option<Range<usize>> {
        match field {
            "lease_ms" => span(&self.lease_ms),
            "backoff_base_ms" => span(&self.backoff_base_ms),
            "backoff_max_ms" => span(&self.backoff_max_ms),
            "max_attempts" => span(&self.max_attempts),
            "max_total_ms" => span(&self.max_total_ms),
            "max_reconciliations" => span(&self.max_reconciliations),
            _ => None,
        }
    }
}

/// What an engine range protects, said after the range in a configuration error.
pub(super) fn why_engine_range(field: &str) -> &'static str {
    match field {
        "lease_ms" => {
            " ms (longer than any send may take, short enough that a crashed send is swept soon)"
        }
        "backoff_base_ms" | "backoff_max_ms" => {
            " ms (the longest pause must be at least the first)"
        }
        "max_total_ms" => " ms",
        _ => "",
    }
}

impl Checker<'_> {
    /// The engine section. Its ranges are the domain's ([`EnginePolicy::validate`]), so a file can
    /// never hold a policy the engine would refuse at its first claim; only the workers' count,
    /// which the engine does not know, is checked here.
    pub(super) fn engine(
        &self,
        section: &EngineSection,
    ) -> Result<(EnginePolicy, usize), ConfigError> {
        let defaults = EnginePolicy::default();
        let retry_defaults = RetryPolicy::default();
        let workers = spanned_or(&section.workers, DEFAULT_WORKERS);
        if !(1..=MAX_CONCURRENT_LIMIT).contains(&workers) {
            return Err(self.error(
                span(&section.workers),
                "engine.workers",
                format!("is {workers}; use 1 to {MAX_CONCURRENT_LIMIT} concurrent drives"),
            ));
        }
        let policy = EnginePolicy {
            lease_ms: spanned_or(&section.lease_ms, defaults.lease_ms),
            retry: RetryPolicy {
                max_attempts: spanned_or(&section.max_attempts, retry_defaults.max_attempts),
                max_total_ms: spanned_or(&section.max_total_ms, retry_defaults.max_total_ms),
                max_reconciliations: spanned_or(
                    &section.max_reconciliations,
                    retry_defaults.max_reconciliations,
                ),
            },
            backoff_base_ms: spanned_or(&section.backoff_base_ms, defaults.backoff_base_ms),
            backoff_max_ms: spanned_or(&section.backoff_max_ms, defaults.backoff_max_ms),
        };
        policy.validate().map_err(|refused| {
            self.error(
                section.span_of(refused.field),
                &format!("engine.{}", refused.field),
                format!(
                    "is {}; use {} to {}{}",
                    refused.value,
                    refused.min,
                    refused.max,
                    why_engine_range(refused.field)
                ),
            )
        })?;
        Ok((policy, workers))
    }
}
