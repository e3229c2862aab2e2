//! `[limits]`: request bodies, SSE streams, execute waits, shutdown, connections and their
//! timeouts, each between its floor and its ceiling.

use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use super::{span, spanned_or, Checker, ConfigError};

/// The largest request body any configuration may allow, in bytes.
pub const MAX_BODY_LIMIT_BYTES: usize = 16 * 1024 * 1024;

/// Most concurrent SSE streams any configuration may allow.
pub const MAX_SSE_LIMIT: usize = 10_000;

/// Most concurrent execute calls any configuration may allow.
pub const MAX_EXECUTES_LIMIT: usize = 100_000;

/// The longest `wait_ms` any configuration may allow an execute call, in milliseconds.
pub const MAX_WAIT_LIMIT_MS: u64 = 10 * 60 * 1000;

/// How long a connection may take to deliver a request's headers, from its accept (or from the
/// first byte of a later request on it), in milliseconds, when the file does not say. A client
/// sends its headers in one write, so they arrive within a round trip; 10 s leaves room for a
/// congested link and closes a slowloris connection (half a header, then nothing) long before
/// it matters.
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;

/// The shortest header read timeout any configuration may set, in milliseconds: below it an
/// honest client on a slow link would lose its requests (the tests use it to stay quick).
pub const MIN_HEADER_READ_TIMEOUT_MS: u64 = 100;

/// How long a keep-alive connection may wait for its next request, in milliseconds, when the file
/// does not say. Longer than the idle expiry of common client pools (Go's and reqwest's 90 s), so
/// a client drops an idle connection before the server does and never sends a request on one the
/// server is closing at that very moment.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 120_000;

/// The longest idle timeout any configuration may set, in milliseconds.
pub const MAX_IDLE_TIMEOUT_MS: u64 = 60 * 60 * 1000;

/// Most connections open at once when the file does not say. A half-open connection costs about
/// 27 KiB (measured: docs/src/performance.md), so a flood holding them all costs ~108 MiB,
/// for at most `header_read_timeout_ms` each.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4_096;

/// Most connections open at once from one client address when the file does not say: one
/// address's flood leaves the other places to everyone else.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;

/// The most connections any configuration may allow: each holds a file descriptor.
pub const MAX_CONNECTIONS_LIMIT: usize = 1_000_000;

const _: () = assert!(
    MIN_HEADER_READ_TIMEOUT_MS <= DEFAULT_HEADER_READ_TIMEOUT_MS
        && DEFAULT_HEADER_READ_TIMEOUT_MS <= DEFAULT_IDLE_TIMEOUT_MS
        && DEFAULT_IDLE_TIMEOUT_MS <= MAX_IDLE_TIMEOUT_MS
);

const _: () = assert!(
    DEFAULT_MAX_CONNECTIONS_PER_ADDRESS <= DEFAULT_MAX_CONNECTIONS
        && DEFAULT_MAX_CONNECTIONS <= MAX_CONNECTIONS_LIMIT
);

/// Request limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Most concurrent SSE streams.
    pub max_sse_connections: usize,
    /// Most concurrent SSE streams of one tenant (or one operator or approver).
    pub max_sse_connections_per_holder: usize,
    /// The longest an execute call may wait, in milliseconds.
    pub max_wait_ms: u64,
    /// The wait of an execute call that names none, in milliseconds.
    pub default_wait_ms: u64,
    /// How long shutdown waits for requests in progress before dropping them, in milliseconds.
    pub shutdown_grace_ms: u64,
    /// How long, after a shutdown signal, `/readyz` answers 503 while requests are still
    /// accepted and served, before the listener closes, in milliseconds: time for a load
    /// balancer or Kubernetes' endpoints to stop sending traffic here.
    pub shutdown_drain_ms: u64,
    /// Most execute calls driving or waiting at once (each holds a drive or a timer).
    pub max_concurrent_executes: usize,
    /// How long a connection may take to deliver a request's headers, in milliseconds: from its
    /// accept for the first request, from the request's first byte for later ones.
    pub header_read_timeout_ms: u64,
    /// How long a keep-alive connection may wait for its next request's headers, in milliseconds.
    pub idle_timeout_ms: u64,
    /// Most connections open at once; the next one is answered 503 and closed.
    pub max_connections: usize,
    /// Most connections open at once from one client address; the next one from it is answered
    /// 429 and closed.
    pub max_connections_per_address: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 256 * 1024,
            max_sse_connections: 64,
            max_sse_connections_per_holder: 16,
            max_wait_ms: 30_000,
            default_wait_ms: 5_000,
            shutdown_grace_ms: 35_000,
            shutdown_drain_ms: 0,
            max_concurrent_executes: 1_024,
            header_read_timeout_ms: DEFAULT_HEADER_READ_TIMEOUT_MS,
            idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitsSection {
    pub(super) max_body_bytes: Option<Spanned<usize>>,
    pub(super) max_sse_connections: Option<Spanned<usize>>,
    pub(super) max_sse_connections_per_holder: Option<Spanned<usize>>,
    pub(super) max_wait_ms: Option<Spanned<u64>>,
    pub(super) default_wait_ms: Option<Spanned<u64>>,
    pub(super) shutdown_grace_ms: Option<Spanned<u64>>,
    pub(super) shutdown_drain_ms: Option<Spanned<u64>>,
    pub(super) max_concurrent_executes: Option<Spanned<usize>>,
    pub(super) header_read_timeout_ms: Option<Spanned<u64>>,
    pub(super) idle_timeout_ms: Option<Spanned<u64>>,
    pub(super) max_connections: Option<Spanned<usize>>,
    pub(super) max_connections_per_address: Option<Spanned<usize>>,
}

impl LimitsSection {
    /// The limits the section asks for, each key it leaves out at its default.
    fn resolved(&self) -> Limits {
        let section = self;
        let defaults = Limits::default();
        Limits {
            max_body_bytes: spanned_or(&section.max_body_bytes, defaults.max_body_bytes),
            max_sse_connections: spanned_or(
                &section.max_sse_connections,
                defaults.max_sse_connections,
            ),
            max_sse_connections_per_holder: spanned_or(
                &section.max_sse_connections_per_holder,
                defaults.max_sse_connections_per_holder,
            ),
            max_wait_ms: spanned_or(&section.max_wait_ms, defaults.max_wait_ms),
            default_wait_ms: spanned_or(&section.default_wait_ms, defaults.default_wait_ms),
            shutdown_grace_ms: spanned_or(&section.shutdown_grace_ms, defaults.shutdown_grace_ms),
            shutdown_drain_ms: spanned_or(&section.shutdown_drain_ms, defaults.shutdown_drain_ms),
            max_concurrent_executes: spanned_or(
                &section.max_concurrent_executes,
                defaults.max_concurrent_executes,
            ),
            header_read_timeout_ms: spanned_or(
                &section.header_read_timeout_ms,
                defaults.header_read_timeout_ms,
            ),
            idle_timeout_ms: spanned_or(&section.idle_timeout_ms, defaults.idle_timeout_ms),
            max_connections: spanned_or(&section.max_connections, defaults.max_connections),
            max_connections_per_address: spanned_or(
                &section.max_connections_per_address,
                defaults.max_connections_per_address,
            ),
        }
    }
}

impl Checker<'_> {
    pub(super) fn limits(&self, section: &LimitsSection) -> Result<Limits, ConfigError> {
        let limits = section.resolved();
        let usize_ranges = [
            (
                &section.max_concurrent_executes,
                "max_concurrent_executes",
                limits.max_concurrent_executes,
                1,
                MAX_EXECUTES_LIMIT,
            ),
            (
                &section.max_body_bytes,
                "max_body_bytes",
                limits.max_body_bytes,
                1024,
                MAX_BODY_LIMIT_BYTES,
            ),
            (
                &section.max_sse_connections,
                "max_sse_connections",
                limits.max_sse_connections,
                1,
                MAX_SSE_LIMIT,
            ),
            (
                &section.max_sse_connections_per_holder,
                "max_sse_connections_per_holder",
                limits.max_sse_connections_per_holder,
                1,
                MAX_SSE_LIMIT,
            ),
        ];
        for (given, name, value, min, max) in usize_ranges {
            self.limit_in_range(span(given), name, value as u64, min as u64, max as u64, "")?;
        }
        self.limit_in_range(
            span(&section.shutdown_grace_ms),
            "shutdown_grace_ms",
            limits.shutdown_grace_ms,
            1_000,
            MAX_WAIT_LIMIT_MS,
            " (longer than max_wait_ms lets every execute call answer)",
        )?;
        self.limit_in_range(
            span(&section.shutdown_drain_ms),
            "shutdown_drain_ms",
            limits.shutdown_drain_ms,
            0,
            MAX_WAIT_LIMIT_MS,
            " (a few times the readiness probe's period, e.g. 10000 on Kubernetes)",
        )?;
        self.limit_in_range(
            span(&section.max_wait_ms),
            "max_wait_ms",
            limits.max_wait_ms,
            0,
            MAX_WAIT_LIMIT_MS,
            "",
        )?;
        self.connection_limits(section, &limits)?;
        if limits.default_wait_ms > limits.max_wait_ms {
            return Err(self.error(
                span(&section.default_wait_ms),
                "limits.default_wait_ms",
                format!(
                    "is {}, above max_wait_ms {}; make it at most max_wait_ms",
                    limits.default_wait_ms, limits.max_wait_ms
                ),
            ));
        }
        Ok(limits)
    }

    /// The connection limits: each in its range, the per-address one within the global one, and
    /// the idle timeout no shorter than the header read timeout (hyper measures an idle
    /// connection's wait and its next request's headers as one span, see `connections.rs`).
    pub(super) fn connection_limits(
        &self,
        section: &LimitsSection,
        limits: &Limits,
    ) -> Result<(), ConfigError> {
        self.limit_in_range(
            span(&section.max_connections),
            "max_connections",
            limits.max_connections as u64,
            1,
            MAX_CONNECTIONS_LIMIT as u64,
            " (each open connection holds a file descriptor)",
        )?;
        self.limit_in_range(
            span(&section.max_connections_per_address),
            "max_connections_per_address",
            limits.max_connections_per_address as u64,
            1,
            limits.max_connections as u64,
            " (at most max_connections; behind a proxy every client has its address, so make it max_connections there)",
        )?;
        self.limit_in_range(
            span(&section.header_read_timeout_ms),
            "header_read_timeout_ms",
            limits.header_read_timeout_ms,
            MIN_HEADER_READ_TIMEOUT_MS,
            MAX_IDLE_TIMEOUT_MS,
            "",
        )?;
        self.limit_in_range(
            span(&section.idle_timeout_ms),
            "idle_timeout_ms",
            limits.idle_timeout_ms,
            limits.header_read_timeout_ms,
            MAX_IDLE_TIMEOUT_MS,
            " (no shorter than header_read_timeout_ms)",
        )
    }

    /// `limits.<name>` must lie in `min..=max`; `why` is said after the range.
    pub(super) fn limit_in_range(
        &self,
        at: Option<Range<usize>>,
        name: &str,
        value: u64,
        min: u64,
        max: u64,
        why: &str,
    ) -> Result<(), ConfigError> {
        if (min..=max).contains(&value) {
            return Ok(());
        }
        Err(self.error(
            at,
            &format!("limits.{name}"),
            format!("is {value}; use {min} to {max}{why}"),
        ))
    }
}
