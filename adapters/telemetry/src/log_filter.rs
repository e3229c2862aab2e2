//! The log layer's filter: the `-v`/`RUST_LOG` directives as `EnvFilter` parsed them, held as a
//! `Targets` when none of them names a span or a field.
//!
//! `EnvFilter`'s per-layer-filter hooks take its span map's `RwLock` on every enter, exit and
//! record of a span the log enables (`-v` or `RUST_LOG=info` enables every span of the ledger):
//! the map only holds spans matched by a span or field directive (`[send]=debug`,
//! `[{operation_id}]=trace`), so without one the lock guards an empty map, and one `RwLock`
//! shared by every thread is a cache line they all write. `Targets` decides by target and level
//! alone, with the same `StaticDirective`s `EnvFilter` keeps for such directives, and has no
//! span hooks. It must never log a different line than `EnvFilter` would: anything with a `[`
//! keeps `EnvFilter` (the test below compares the lines of both).

use std::str::FromStr;

use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Filter};
use tracing_subscriber::EnvFilter;

/// See the module documentation.
#[derive(Debug)]
pub(crate) enum LogFilter {
    /// Target and level directives only. (Both boxed: each is several hundred bytes of inline
    /// vectors, and the filter is built once.)
    Targets(Box<Targets>),
    /// Directives that name a span or a field: `EnvFilter` tracks the spans they match.
    Env(Box<EnvFilter>),
}

impl LogFilter {
    /// `filter` as a `Targets` when its directives allow it. `EnvFilter` prints back the
    /// directives it kept (after its own parsing, defaults and dropped invalid ones), so the
    /// `Targets` is built from exactly what `filter` would apply.
    pub(crate) fn of(filter: EnvFilter) -> Self {
        let directives = filter.to_string();
        if directives.is_empty() || directives.contains('[') {
            return Self::Env(Box::new(filter));
        }
        match Targets::from_str(&directives) {
            Ok(targets) => Self::Targets(Box::new(targets)),
            Err(_) => Self::Env(Box::new(filter)),
        }
    }
}

impl<S: Subscriber> Filter<S> for LogFilter {
    fn enabled(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool {
        match self {
            Self::Targets(targets) => <Targets as Filter<S>>::enabled(targets, meta, cx),
            Self::Env(env) => <EnvFilter as Filter<S>>::enabled(env, meta, cx),
        }
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        match self {
            Self::Targets(targets) => <Targets as Filter<S>>::callsite_enabled(targets, meta),
            Self::Env(env) => <EnvFilter as Filter<S>>::callsite_enabled(env, meta),
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        match self {
            Self::Targets(targets) => <Targets as Filter<S>>::max_level_hint(targets),
            Self::Env(env) => <EnvFilter as Filter<S>>::max_level_hint(env),
        }
    }

    // The span hooks: `Targets` has none (its `Filter` defaults do nothing).

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, cx: Context<'_, S>) {
        if let Self::Env(env) = self {
            <EnvFilter as Filter<S>>::on_new_span(env, attrs, id, cx);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, cx: Context<'_, S>) {
        if let Self::Env(env) = self {
            <EnvFilter as Filter<S>>::on_record(env, id, values, cx);
        }
    }

    fn on_enter(&self, id: &Id, cx: Context<'_, S>) {
        if let Self::Env(env) = self {
            <EnvFilter as Filter<S>>::on_enter(env, id, cx);
        }
    }

    fn on_exit(&self, id: &Id, cx: Context<'_, S>) {
        if let Self::Env(env) = self {
            <EnvFilter as Filter<S>>::on_exit(env, id, cx);
        }
    }

    fn on_close(&self, id: Id, cx: Context<'_, S>) {
        if let Self::Env(env) = self {
            <EnvFilter as Filter<S>>::on_close(env, id, cx);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;

    use super::*;

    /// The log's lines, kept in memory.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("the lines").extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Spans and lines of several targets and levels, nested, with fields recorded late and a
    /// span entered twice: what the filters are asked about in a run of the ledger.
    fn work() {
        let request = tracing::info_span!(target: "opledger_http_api::metrics", "POST /v1/operations", operation_id = tracing::field::Empty);
        let _request = request.enter();
        tracing::info!(target: "opledger_http_api::api", "intent recorded");
        request.record("operation_id", "op_1");
        let send = tracing::info_span!(target: "opledger_domain::engine", "send", attempt = 1);
        for _ in 0..2 {
            let _send = send.enter();
            let debug =
                tracing::debug_span!(target: "opledger_providers::connector", "provider.execute");
            let _debug = debug.enter();
            tracing::trace!(target: "opledger_providers::http", "bytes read");
            tracing::debug!(target: "opledger_providers::http", status = 201, "answered");
            tracing::warn!(target: "opledger_domain::engine", "outcome unknown");
            tracing::info!(target: "hyper_util::client", "connection reused");
        }
        tracing::error!(target: "opledger_runtime::workers", "store unavailable");
        tracing::warn!(target: "reqwest::connect", "retrying");
    }

    fn lines_with(
        filter: impl Filter<tracing_subscriber::Registry> + Send + Sync + 'static,
    ) -> String {
        let lines = Lines::default();
        let writer = lines.clone();
        let layer = tracing_subscriber::fmt::layer()
            .without_time()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .with_filter(filter);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), work);
        let bytes = lines.0.lock().expect("the lines").clone();
        String::from_utf8(bytes).expect("text lines")
    }

    #[test]
    fn the_log_lines_are_the_same_with_either_filter_for_every_kind_of_directive() {
        for directives in [
            "warn",
            "info",
            "debug",
            "trace",
            "error",
            "off",
            "opledger=debug,warn",
            "opledger_domain=trace,opledger_http_api=info",
            "error,opledger_providers::http=debug",
            "hyper_util=info,opledger=warn",
            "[send]=debug",
            "opledger_providers[{status}]=debug",
            "warn,[send{attempt=1}]=trace",
        ] {
            let env = lines_with(EnvFilter::new(directives));
            let ours = lines_with(LogFilter::of(EnvFilter::new(directives)));
            assert_eq!(ours, env, "the lines with `{directives}`");
        }
        // Not equal by being empty: the directives above print lines, spans listed with them.
        assert!(lines_with(EnvFilter::new("info")).contains("POST /v1/operations{operation_id=\"op_1\"}:send{attempt=1}: opledger_domain::engine: outcome unknown"));
    }

    #[test]
    fn directives_naming_no_span_or_field_become_targets_and_the_others_stay_env_filters() {
        let kind = |directives: &str| match LogFilter::of(EnvFilter::new(directives)) {
            LogFilter::Targets(_) => "targets",
            LogFilter::Env(_) => "env",
        };
        assert_eq!(kind("warn"), "targets");
        assert_eq!(kind("opledger=debug,warn"), "targets");
        assert_eq!(kind("[send]=debug"), "env");
        assert_eq!(kind("warn,opledger_providers[{status}]=debug"), "env");
    }
}
