//! `GET /metrics` in Prometheus' text format, and the middleware that times every request.
//!
//! Ledger figures come from the read models (counts by state, the oldest unknown and
//! needs-review operations' ages, reconciliations that confirmed a success, duplicates found,
//! attempts per operation); request latencies are measured here. Every label has a bounded set of
//! values whatever clients send, since `/metrics` and the routes it counts are open to anyone who
//! can connect: `method` is one of [`METHODS`] or `other` (an invented method, `curl -X M1`, must
//! not add a series), `route` one of the router's templates or `other` (never a raw path),
//! `status` a status this server answered with, `state` one of the API's states. Only aggregates
//! are shown: no operation id, no tenant.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use opledger_domain::in_span::InSpanExt;
use opledger_projections::metrics::Counter;
use opledger_readmodel::{Metrics, RunnerHealthReport};

use super::error::ApiError;
use super::Shared;

/// Upper bounds of the latency histogram's buckets, in seconds.
const BUCKETS_S: [f64; 14] = [
    0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The methods counted by name: the standard ones (RFC 9110 §9, and PATCH). Any other method is
/// counted as [`OTHER`].
pub(crate) const METHODS: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::CONNECT,
    Method::OPTIONS,
    Method::TRACE,
    Method::PATCH,
];

/// The label value of a method or route outside the known ones.
pub(crate) const OTHER: &str = "other";

/// A request's `method` label: its name if it is one of [`METHODS`], else [`OTHER`].
fn method_label(method: &Method) -> &'static str {
    METHODS
        .iter()
        .find(|known| *known == method)
        .map_or(OTHER, Method::as_str)
}

/// A request's `route` label: the router's template it matched, else [`OTHER`] (no route, so a
/// raw path never becomes a label).
fn route_label(matched: Option<&MatchedPath>) -> &'static str {
    matched
        .and_then(|matched| {
            super::api::ROUTES
                .iter()
                .find(|(_, path)| *path == matched.as_str())
        })
        .map_or(OTHER, |(_, path)| path)
}

#[derive(Debug, Default)]
struct Histogram {
    /// Per bucket of [`BUCKETS_S`] (not cumulative), then the overflow.
    counts: [u64; BUCKETS_S.len() + 1],
    sum_s: f64,
}

/// Request counts and latencies, per method, route template and status (labels from bounded sets:
/// see the module's documentation).
#[derive(Debug, Default)]
pub struct RequestMetrics {
    latencies: Mutex<BTreeMap<(&'static str, &'static str), Histogram>>,
    statuses: Mutex<BTreeMap<(&'static str, &'static str, u16), u64>>,
}

impl RequestMetrics {
    fn observe(&self, method: &'static str, route: &'static str, status: u16, seconds: f64) {
        {
            let mut latencies = self
                .latencies
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let histogram = latencies.entry((method, route)).or_default();
            let bucket = BUCKETS_S
                .iter()
                .position(|bound| seconds <= *bound)
                .unwrap_or(BUCKETS_S.len());
            histogram.counts[bucket] += 1;
            histogram.sum_s += seconds;
        }
        let mut statuses = self.statuses.lock().unwrap_or_else(PoisonError::into_inner);
        *statuses.entry((method, route, status)).or_default() += 1;
    }

    fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP opledger_http_requests_total HTTP requests answered, by method, route and status."
        );
        let _ = writeln!(out, "# TYPE opledger_http_requests_total counter");
        for ((method, route, status), count) in self
            .statuses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            let _ = writeln!(
                out,
                "opledger_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {count}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP opledger_http_request_duration_seconds Time to answer a request (to the headers, for streams)."
        );
        let _ = writeln!(
            out,
            "# TYPE opledger_http_request_duration_seconds histogram"
        );
        for ((method, route), histogram) in self
            .latencies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            let labels = format!("method=\"{method}\",route=\"{route}\"");
            let mut cumulative = 0;
            for (bound, count) in BUCKETS_S.iter().zip(histogram.counts) {
                cumulative += count;
                let _ = writeln!(
                    out,
                    "opledger_http_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {cumulative}"
                );
            }
            cumulative += histogram.counts[BUCKETS_S.len()];
            let _ = writeln!(
                out,
                "opledger_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {cumulative}"
            );
            let _ = writeln!(
                out,
                "opledger_http_request_duration_seconds_sum{{{labels}}} {}",
                histogram.sum_s
            );
            let _ = writeln!(
                out,
                "opledger_http_request_duration_seconds_count{{{labels}}} {cumulative}"
            );
        }
    }
}

/// Times every request by its route template.
pub async fn observe(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let method = method_label(request.method());
    let route = route_label(request.extensions().get::<MatchedPath>());
    let started = Instant::now();
    let span = request_span(method, route, &request);
    let response = next.run(request).in_span(span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    shared.requests.observe(
        method,
        route,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

/// The request's span, with OpenTelemetry's HTTP server conventions (the route, not the path
/// with its ids, names it). A caller's W3C `traceparent` (and `tracestate`) makes it the child of
/// the caller's span, so the work the request starts is in the caller's trace. When the span is
/// not enabled (text logs below info, no trace export) it costs a cached level check.
fn request_span(method: &'static str, route: &'static str, request: &Request) -> tracing::Span {
    let span = tracing::info_span!(
        "http_request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        http.request.method = method,
        http.route = route,
        // A data subject's route names the person in its path: its logs and traces carry the
        // route instead, so no log line keeps a subject's name (an erased person's above all).
        url.path = if route.starts_with("/v1/subjects") {
            route
        } else {
            request.uri().path()
        },
        // The service listens in plain HTTP (TLS, if any, ends before it).
        url.scheme = "http",
        server.address = tracing::field::Empty,
        server.port = tracing::field::Empty,
        user_agent.original = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        // Recorded by a handler that acts on one operation (an operator's execute).
        operation_id = tracing::field::Empty,
    );
    if !span.is_disabled() {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
        };
        if let Some(agent) = header("user-agent") {
            span.record("user_agent.original", agent);
        }
        // The host the client asked for, as the conventions take it (the Host header).
        if let Some(host) =
            header("host").and_then(|host| host.parse::<axum::http::uri::Authority>().ok())
        {
            span.record(
                "server.address",
                host.host().trim_start_matches('[').trim_end_matches(']'),
            );
            if let Some(port) = host.port_u16() {
                span.record("server.port", port);
            }
        }
        if let Some(traceparent) = header("traceparent") {
            opledger_domain::trace_context::set_remote_parent(
                &span,
                traceparent,
                header("tracestate"),
            );
        }
    }
    span
}

/// `GET /metrics`: the read models' counts, the workers' and the server's own, in Prometheus'
/// text format.
pub async fn render(
    State(shared): State<Arc<Shared>>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    if shared.metrics_closed {
        return Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "forbidden",
            "/metrics is closed: several tenants are configured and its counters show each one's activity; configure a scraper token under [metrics] (token_env) and send it, or declare it open with [metrics] open = true",
        ));
    }
    if let Some(expected) = &shared.metrics_token {
        super::auth::require_token(&headers, expected)?;
    }
    let metrics = shared.read_models.call(|store| store.metrics()).await?;
    let lag = shared
        .read_models
        .lag(shared.engine.ledger().store())
        .await?;
    let mut out = String::with_capacity(4096);
    render_states_and_ages(&mut out, &metrics, Utc::now());
    render_counters(&mut out, &metrics);
    render_duplicates_and_attempts(&mut out, &metrics);
    gauge(
        &mut out,
        "opledger_read_model_lag_positions",
        "Log positions the read models have not applied yet (events for SQLite, byte offsets for KurrentDB).",
    );
    let _ = writeln!(out, "opledger_read_model_lag_positions {}", lag.positions);
    render_connections(&mut out, &shared.connections);
    render_instance(&mut out, &shared.instance_id);
    render_runner(&mut out, &shared.runner_health.report(), lag.positions);
    let endpoints = shared
        .webhooks
        .overview(lag.head.map(opledger_domain::ids::GlobalPosition::value))
        .await
        .map_err(|error| ApiError::internal("the webhook journal could not be read", error))?;
    render_webhooks(&mut out, &endpoints);
    gauge(
        &mut out,
        "opledger_event_streams_open",
        "Server-Sent Event streams open now.",
    );
    let _ = writeln!(
        out,
        "opledger_event_streams_open {}",
        shared.limits.max_sse_connections - shared.sse.available_permits()
    );
    counter(
        &mut out,
        "opledger_trace_export_failures_total",
        "Batches of trace spans the OTLP exporter could not deliver (dropped; the requests that made them were not held up).",
    );
    let _ = writeln!(
        out,
        "opledger_trace_export_failures_total {}",
        opledger_domain::trace_context::export_failures()
    );
    counter(
        &mut out,
        "opledger_undecodable_events_total",
        "Events of the log the workers could not decode and skipped; their operations are set aside for a person (opledger verify, opledger trace).",
    );
    let _ = writeln!(
        out,
        "opledger_undecodable_events_total {}",
        shared.worker_counters.undecodable_events()
    );
    render_budgets(&mut out, shared.engine.providers());
    gauge(
        &mut out,
        "opledger_build_info",
        "Always 1; its label names the version of the build that answers.",
    );
    let _ = writeln!(
        out,
        "opledger_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    shared.requests.render(&mut out);
    Ok((
        StatusCode::OK,
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response())
}

/// Per provider and kind (sends, lookups): how often a request waited for its account's request
/// budget, how long in total, and how often its slot was too far away to wait for (the operation
/// waited in the ledger instead). Providers come from the configuration, so the label set is
/// bounded.
fn render_budgets(out: &mut String, providers: &opledger_providers::HttpProviders) {
    use opledger_providers::budget::Kind;
    let families = [
        ("opledger_provider_budget_waits_total", "Requests that waited for their account's request budget before they were made."),
        // Seconds, Prometheus' base unit for time.
        ("opledger_provider_budget_wait_seconds_total", "Seconds requests waited for their account's request budget."),
        ("opledger_provider_budget_deferred_total", "Requests not made because the budget's next slot was further than the request timeout; the operation waited in the ledger."),
    ];
    for (index, (name, help)) in families.iter().enumerate() {
        counter(out, name, help);
        for connector in providers.connectors() {
            for kind in [Kind::Send, Kind::Lookup] {
                let (waits, waited_ms, deferred) = connector.budget_waits().of(kind);
                let value = match index {
                    0 => waits.to_string(),
                    1 => format!("{}", waited_ms as f64 / 1_000.0),
                    _ => deferred.to_string(),
                };
                let _ = writeln!(
                    out,
                    "{name}{{provider=\"{}\",kind=\"{}\"}} {value}",
                    connector.id(),
                    kind.as_str()
                );
            }
        }
    }
}

/// Per webhook endpoint (ids come from the configuration, at most `MAX_ENDPOINTS`, so the label
/// set is bounded): deliveries, failed attempts, disablings, lag, and whether it is delivering.
fn render_webhooks(out: &mut String, endpoints: &[opledger_webhooks::EndpointOverview]) {
    use opledger_webhooks::{DeliveryState, EndpointStatus};
    type Value = fn(&opledger_webhooks::EndpointOverview) -> u64;
    let series: [(&str, bool, &str, Value); 5] = [
        ("opledger_webhook_delivered_total", true, "Events delivered (answered 2xx) since the service started.", |e| e.delivered_total),
        ("opledger_webhook_failed_attempts_total", true, "Delivery attempts that failed (no answer, or not 2xx) since the service started.", |e| e.failed_attempts_total),
        ("opledger_webhook_disabled_total", true, "Times the endpoint was disabled (410 Gone, or failing for its whole retry window) since the service started.", |e| e.disabled_total),
        ("opledger_webhook_lag_positions", false, "Log positions after the endpoint's checkpoint: what it has still to go through (pending).", |e| e.lag_positions),
        ("opledger_webhook_retrying", false, "1 while an event of the endpoint waits for its next attempt after a failure.", |e| u64::from(matches!(e.delivery, DeliveryState::Retrying { .. }))),
    ];
    for (name, is_counter, help, value) in series {
        if is_counter {
            counter(out, name, help);
        } else {
            gauge(out, name, help);
        }
        for endpoint in endpoints {
            let _ = writeln!(
                out,
                "{name}{{endpoint=\"{}\"}} {}",
                endpoint.id,
                value(endpoint)
            );
        }
    }
    gauge(out, "opledger_webhook_active", "1 while the endpoint is delivered to; 0 while paused or disabled (GET /v1/webhooks says why).");
    for endpoint in endpoints {
        let active = u8::from(endpoint.status == EndpointStatus::Active);
        let _ = writeln!(
            out,
            "opledger_webhook_active{{endpoint=\"{}\"}} {active}",
            endpoint.id
        );
    }
}

/// The read-model runner: whether it is healthy, its failures, and how long since it advanced.
fn render_runner(out: &mut String, runner: &RunnerHealthReport, lag_positions: u64) {
    gauge(
        out,
        "opledger_read_model_runner_healthy",
        "1 while the read-model runner follows the log; 0 while it retries after a fault, has stopped, or has not advanced for 30 s while behind (see /healthz for the reason).",
    );
    let healthy = u8::from(runner.problem(lag_positions).is_none());
    let _ = writeln!(out, "opledger_read_model_runner_healthy {healthy}");
    counter(
        out,
        "opledger_read_model_runner_failures_total",
        "Runs of the read-model runner that failed (a full disk, an unwritable file, a store error); each is retried from the checkpoint after a pause.",
    );
    let _ = writeln!(
        out,
        "opledger_read_model_runner_failures_total {}",
        runner.failures_total
    );
    gauge(
        out,
        "opledger_read_model_since_progress_seconds",
        "Seconds since the read models last committed a batch (or since the runner started).",
    );
    let _ = writeln!(
        out,
        "opledger_read_model_since_progress_seconds {}",
        runner.since_progress_ms as f64 / 1000.0
    );
}

/// The accept loop's counts: connections open, refused at each limit, closed at the header read
/// timeout (`connections.rs`).
fn render_instance(out: &mut String, instance_id: &str) {
    gauge(
        out,
        "opledger_instance_info",
        "1, labelled with this instance's id (instance_id): the worker id its attempts carry and its PostgreSQL application_name.",
    );
    let _ = writeln!(
        out,
        "opledger_instance_info{{instance_id=\"{instance_id}\"}} 1"
    );
}

fn render_connections(out: &mut String, connections: &crate::connections::ConnectionCounters) {
    gauge(
        out,
        "opledger_http_connections_open",
        "HTTP connections open (at most limits.max_connections).",
    );
    let _ = writeln!(out, "opledger_http_connections_open {}", connections.open());
    counter(
        out,
        "opledger_http_connections_refused_total",
        "Connections answered 503 or 429 and closed at accept, by the limit reached.",
    );
    let (full, per_address) = connections.refused();
    let _ = writeln!(
        out,
        "opledger_http_connections_refused_total{{limit=\"max_connections\"}} {full}"
    );
    let _ = writeln!(
        out,
        "opledger_http_connections_refused_total{{limit=\"max_connections_per_address\"}} {per_address}"
    );
    counter(
        out,
        "opledger_http_header_read_timeouts_total",
        "Connections closed because a request's headers did not arrive within limits.header_read_timeout_ms.",
    );
    let _ = writeln!(
        out,
        "opledger_http_header_read_timeouts_total {}",
        connections.header_timeouts()
    );
}

fn gauge(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
}

fn counter(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} counter");
}

/// Operations by state, and the ages of the oldest unknown and needs-review ones.
fn render_states_and_ages(out: &mut String, metrics: &Metrics, now: chrono::DateTime<Utc>) {
    gauge(out, "opledger_operations", "Operations by current state.");
    // The API's states, each always present (0 when none is in it); the fold's `new` is not
    // one (no recorded operation is in it) and so is not shown.
    for state in super::api::API_STATES {
        let count = metrics.by_state.get(state).copied().unwrap_or(0);
        let _ = writeln!(out, "opledger_operations{{state=\"{state}\"}} {count}");
    }
    let age = |since: Option<chrono::DateTime<Utc>>| {
        since.map_or(0, |since| (now - since).num_seconds().max(0))
    };
    gauge(
        out,
        "opledger_oldest_unknown_age_seconds",
        "Age of the operation unknown the longest (0 when none is unknown).",
    );
    let _ = writeln!(
        out,
        "opledger_oldest_unknown_age_seconds {}",
        age(metrics.oldest_unknown.as_ref().map(|oldest| oldest.since))
    );
    gauge(
        out,
        "opledger_oldest_needs_review_age_seconds",
        "Age of the operation waiting for a person the longest (0 when none waits).",
    );
    let _ = writeln!(
        out,
        "opledger_oldest_needs_review_age_seconds {}",
        age(metrics
            .oldest_needs_review
            .as_ref()
            .map(|oldest| oldest.since))
    );
}

/// The ledger's counters, as the read models keep them.
fn render_counters(out: &mut String, metrics: &Metrics) {
    for (kind, name, help) in [
        (
            Counter::IntentsRecorded,
            "opledger_intents_recorded_total",
            "Intents recorded.",
        ),
        (
            Counter::AttemptsStarted,
            "opledger_attempts_started_total",
            "Attempts started.",
        ),
        (
            Counter::UnknownOutcomes,
            "opledger_unknown_outcomes_total",
            "Attempts that ended without a known outcome.",
        ),
        (
            Counter::ReconciliationsConfirmed,
            "opledger_reconciliations_confirmed_total",
            "Lookups that found the object of an unconfirmed operation and so confirmed it.",
        ),
        (
            Counter::ReviewsRequired,
            "opledger_reviews_required_total",
            "Hand-overs to a person.",
        ),
        (
            Counter::DuplicatesDetected,
            "opledger_duplicates_detected_total",
            "Second objects found for confirmed operations.",
        ),
    ] {
        counter(out, name, help);
        let _ = writeln!(out, "{name} {}", metrics.counter(kind));
    }
}

/// Shared external ids, possible duplicate intents, and operations by their attempts.
fn render_duplicates_and_attempts(out: &mut String, metrics: &Metrics) {
    gauge(
        out,
        "opledger_shared_external_ids",
        "External objects named by more than one operation.",
    );
    let _ = writeln!(
        out,
        "opledger_shared_external_ids {}",
        metrics.shared_external_ids
    );
    gauge(
        out,
        "opledger_possible_duplicate_intents",
        "Pairs of identical intents from different deliveries, flagged for a person.",
    );
    let _ = writeln!(
        out,
        "opledger_possible_duplicate_intents {}",
        metrics.possible_duplicate_intents
    );
    gauge(
        out,
        "opledger_operations_by_attempts",
        "Operations by the number of attempts they took.",
    );
    for (attempts, operations) in &metrics.attempts.histogram {
        let _ = writeln!(
            out,
            "opledger_operations_by_attempts{{attempts=\"{attempts}\"}} {operations}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invented_method_is_counted_as_other() {
        for invented in ["M1", "M2", "get", "PROPFIND"] {
            let method = Method::from_bytes(invented.as_bytes()).expect("a token");
            assert_eq!(method_label(&method), OTHER, "{invented}");
        }
        assert_eq!(method_label(&Method::GET), "GET");
        assert_eq!(method_label(&Method::PATCH), "PATCH");
    }

    #[test]
    fn requests_with_invented_methods_add_no_series_after_the_first() {
        let metrics = RequestMetrics::default();
        for n in 0..500 {
            let method = Method::from_bytes(format!("M{n}").as_bytes()).expect("a token");
            metrics.observe(method_label(&method), route_label(None), 404, 0.001);
        }
        let mut out = String::new();
        metrics.render(&mut out);
        let series = out.lines().filter(|line| !line.starts_with('#')).count();
        // One status series and one histogram (its buckets, +Inf, sum and count).
        assert_eq!(series, 1 + BUCKETS_S.len() + 3, "{out}");
        assert!(
            out.contains(r#"method="other",route="other",status="404""#),
            "{out}"
        );
    }
}
