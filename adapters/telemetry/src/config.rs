//! `[telemetry]`: where traces go and how logs read, checked at start.
//!
//! ```toml
//! [telemetry]
//! endpoint = "http://127.0.0.1:4318"   # the OTLP base URL; traces go to <endpoint>/v1/traces
//! protocol = "http/protobuf"           # or "grpc" (then the endpoint is the collector's, e.g. :4317)
//! sampling_ratio = 1.0                 # of traces started here; a caller's decision is followed
//! service_name = "opledger"
//! export_timeout_ms = 10000            # one export of one batch
//! log_format = "text"                  # or "json" (trace_id and span_id on every line)
//! [telemetry.headers_env]              # header = the environment variable holding its value
//! x-honeycomb-team = "HONEYCOMB_API_KEY"
//! ```
//!
//! Export is off unless the file names an endpoint or `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; the standard `OTEL_*` variables fill in what the
//! file leaves out (`OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_SERVICE_NAME`,
//! `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`, and the batch processor's
//! `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_SCHEDULE_DELAY` and `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, read
//! here for both exporters), and `OTEL_SDK_DISABLED=true` turns export off. Every refusal names
//! the file, the line and the field (or the variable) and says what to write. Header values are
//! secrets: they are read from the environment, never written in the file, and never printed.

use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

/// The service name spans carry when neither the file nor `OTEL_SERVICE_NAME` names one.
pub const DEFAULT_SERVICE_NAME: &str = "opledger";
/// The longest service name accepted, in bytes.
pub const MAX_SERVICE_NAME_BYTES: usize = 255;
/// How long one batch's export may take when the file does not say, in milliseconds (the
/// OpenTelemetry default, `OTEL_EXPORTER_OTLP_TIMEOUT`).
pub const DEFAULT_EXPORT_TIMEOUT_MS: u64 = 10_000;
/// The shortest export timeout accepted, in milliseconds: below it a collector across a network
/// could never answer.
pub const MIN_EXPORT_TIMEOUT_MS: u64 = 100;
/// The longest export timeout accepted, in milliseconds. A batch waits for the one before it, so
/// a longer one only fills the queue (whose overflow is dropped) while a dead collector hangs.
pub const MAX_EXPORT_TIMEOUT_MS: u64 = 60_000;
/// Finished spans waiting for export when `OTEL_BSP_MAX_QUEUE_SIZE` does not say (the
/// OpenTelemetry default): about 20 ms of `bench http` at 64 with every trace sampled. A span
/// that finds the queue full is dropped and counted, never waited for.
pub const DEFAULT_MAX_QUEUED_SPANS: usize = 2_048;
/// The largest queue accepted, in spans (a few hundred bytes each): a queue is for a collector's
/// hiccup, not for holding a dead one's backlog in memory.
pub const MAX_MAX_QUEUED_SPANS: usize = 65_536;
const _: () =
    assert!(1 <= DEFAULT_MAX_QUEUED_SPANS && DEFAULT_MAX_QUEUED_SPANS <= MAX_MAX_QUEUED_SPANS);
/// `OTEL_BSP_SCHEDULE_DELAY`'s default (the SDK's), in milliseconds.
pub const DEFAULT_SCHEDULE_DELAY_MS: u64 = 5_000;
/// The longest `OTEL_BSP_SCHEDULE_DELAY` accepted, in milliseconds: an hour between posts.
pub const MAX_SCHEDULE_DELAY_MS: u64 = 3_600_000;
/// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`'s default (the SDK's), in spans.
pub const DEFAULT_EXPORT_BATCH_SPANS: usize = 512;
const _: () = assert!(DEFAULT_EXPORT_BATCH_SPANS <= DEFAULT_MAX_QUEUED_SPANS);
/// Most extra headers on export requests.
pub const MAX_HEADERS: usize = 32;
/// The longest endpoint URL accepted, in bytes.
pub const MAX_ENDPOINT_BYTES: usize = 2048;
const _: () = assert!(
    MIN_EXPORT_TIMEOUT_MS <= DEFAULT_EXPORT_TIMEOUT_MS
        && DEFAULT_EXPORT_TIMEOUT_MS <= MAX_EXPORT_TIMEOUT_MS
);

/// A telemetry setting that cannot be used, with where it came from.
#[derive(Debug, thiserror::Error)]
#[error("{file}{}: {field}: {message}", line.map(|line| format!(":{line}")).unwrap_or_default())]
pub struct ConfigError {
    /// The configuration file, or `environment` for an `OTEL_*` variable.
    pub file: String,
    /// The 1-based line in the file, when there is one.
    pub line: Option<usize>,
    /// The field (`telemetry.protocol`) or the variable's name.
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

/// The wire protocol of the OTLP exporter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Protobuf over HTTP POST to `<endpoint>/v1/traces` (`http/protobuf`).
    HttpProtobuf,
    /// OTLP over gRPC (`grpc`).
    Grpc,
}

/// How log lines are written on stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Plain text for people.
    #[default]
    Text,
    /// One JSON object per line, with `trace_id` and `span_id`, for log shippers.
    Json,
}

impl LogFormat {
    /// Reads `text` or `json`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "text" => Some(Self::Text),
            "json" => Some(Self::Json),
            _ => None,
        }
    }
}

/// Where and how traces are exported.
#[derive(Clone, Debug, PartialEq)]
pub struct Export {
    /// For HTTP, the full URL spans are posted to; for gRPC, the collector's address.
    pub endpoint: String,
    /// The wire protocol.
    pub protocol: Protocol,
    /// Extra request headers (name, value); values are secrets.
    pub headers: Vec<(String, String)>,
    /// Which traces are recorded.
    pub sampling: Sampling,
    /// `service.name` on every span.
    pub service_name: String,
    /// `service.instance.id` on every span: the instance's id when the command has one (`serve`'s
    /// `instance_id`, the id its attempts, logs, metrics and PostgreSQL sessions carry); `None`:
    /// a random one per start.
    pub instance_id: Option<String>,
    /// How long one batch's export may take, in milliseconds.
    pub export_timeout_ms: u64,
    /// Finished spans waiting for export, at most (`OTEL_BSP_MAX_QUEUE_SIZE`).
    pub max_queued_spans: usize,
    /// A post at least this often while spans wait, in milliseconds (`OTEL_BSP_SCHEDULE_DELAY`).
    pub schedule_delay_ms: u64,
    /// A post as soon as this many spans wait, and at most this many in one
    /// (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`); never more than `max_queued_spans`.
    pub max_export_batch_spans: usize,
}

/// How traces are sampled (`OTEL_TRACES_SAMPLER`): OpenTelemetry's `TraceIdRatioBased` at
/// `ratio`, for the traces that start here or for every trace. The decisions are the span
/// layer's (`layer.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// The share of traces recorded, 0.0 to 1.0, decided from the trace id.
    pub ratio: f64,
    /// A caller's decision (its `traceparent`'s sampled flag) is followed and the ratio decides
    /// only traces that start here (`parentbased_*` samplers, the default); else the ratio
    /// decides every trace (`always_on`, `always_off`, `traceidratio`).
    pub follow_caller: bool,
}

impl Sampling {
    /// Every trace, and a caller's decision followed: the default.
    pub const EVERY_TRACE: Self = Self {
        ratio: 1.0,
        follow_caller: true,
    };
}

/// The checked telemetry settings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    /// Trace export (`None`: off).
    pub export: Option<Export>,
    /// The log format.
    pub log_format: LogFormat,
}

#[derive(Debug, Default, Deserialize)]
struct Outer {
    #[serde(default)]
    telemetry: Option<Section>,
}

/// `[telemetry]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Section {
    endpoint: Option<Spanned<String>>,
    protocol: Option<Spanned<String>>,
    sampling_ratio: Option<Spanned<f64>>,
    service_name: Option<Spanned<String>>,
    export_timeout_ms: Option<Spanned<u64>>,
    log_format: Option<Spanned<String>>,
    headers_env: Option<Spanned<toml::Table>>,
}

/// Reads the settings from the environment alone (no configuration file).
pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Settings, ConfigError> {
    resolve(&Source::none(), &Section::default(), env)
}

/// Reads `[telemetry]` from a configuration file's text (other sections are another reader's),
/// then the environment for what it leaves out.
pub fn from_file(
    file: &str,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Settings, ConfigError> {
    let source = Source { file, text };
    let outer: Outer = toml::from_str(text)
        .map_err(|error| source.error(error.span(), "syntax", error.message().trim().to_owned()))?;
    resolve(&source, &outer.telemetry.unwrap_or_default(), env)
}

struct Source<'a> {
    file: &'a str,
    text: &'a str,
}

impl Source<'_> {
    fn none() -> Source<'static> {
        Source {
            file: "environment",
            text: "",
        }
    }

    fn error(&self, span: Option<Range<usize>>, field: &str, message: String) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            line: span.map(|span| line_of(self.text, span.start)),
            field: field.to_owned(),
            message,
        }
    }
}

fn env_error(name: &str, message: String) -> ConfigError {
    ConfigError {
        file: "environment".into(),
        line: None,
        field: name.into(),
        message,
    }
}

/// A setting from the file (with where it is) or else from an environment variable.
enum Setting<'a, T> {
    File(&'a Spanned<T>),
    Env(&'static str, String),
}

fn pick<'a, T>(
    written: &'a Option<Spanned<T>>,
    env: &dyn Fn(&str) -> Option<String>,
    names: &[&'static str],
) -> Option<Setting<'a, T>> {
    if let Some(written) = written {
        return Some(Setting::File(written));
    }
    names.iter().find_map(|name| {
        env(name)
            .filter(|value| !value.trim().is_empty())
            .map(|value| Setting::Env(name, value.trim().to_owned()))
    })
}

fn resolve(
    source: &Source<'_>,
    section: &Section,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Settings, ConfigError> {
    let log_format = match &section.log_format {
        None => LogFormat::Text,
        Some(written) => LogFormat::parse(written.get_ref()).ok_or_else(|| {
            source.error(
                Some(written.span()),
                "telemetry.log_format",
                format!("is `{}`; write \"text\" or \"json\"", written.get_ref()),
            )
        })?,
    };
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|value| value.trim() == "true");
    let Some(endpoint) = pick(
        &section.endpoint,
        env,
        &[
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ],
    ) else {
        return Ok(Settings {
            export: None,
            log_format,
        });
    };
    let protocol = protocol(source, section, env)?;
    let endpoint = endpoint_url(source, endpoint, protocol)?;
    let max_queued_spans = max_queued_spans(env)?;
    let export = Export {
        endpoint,
        protocol,
        headers: headers(source, section, env)?,
        sampling: sampling(source, section, env)?,
        service_name: service_name(source, section, env)?,
        instance_id: None,
        export_timeout_ms: export_timeout_ms(source, section)?,
        max_queued_spans,
        schedule_delay_ms: schedule_delay_ms(env)?,
        max_export_batch_spans: max_export_batch_spans(env, max_queued_spans)?,
    };
    Ok(Settings {
        export: (!disabled).then_some(export),
        log_format,
    })
}

fn protocol(
    source: &Source<'_>,
    section: &Section,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Protocol, ConfigError> {
    let read = |text: &str| match text {
        "http/protobuf" => Ok(Protocol::HttpProtobuf),
        "grpc" => Ok(Protocol::Grpc),
        "http/json" => Err(format!(
            "is `{text}`, which this build does not export; write \"http/protobuf\" or \"grpc\""
        )),
        other => Err(format!("is `{other}`; write \"http/protobuf\" or \"grpc\"")),
    };
    match pick(
        &section.protocol,
        env,
        &[
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ],
    ) {
        None => Ok(Protocol::HttpProtobuf),
        Some(Setting::File(written)) => read(written.get_ref())
            .map_err(|message| source.error(Some(written.span()), "telemetry.protocol", message)),
        Some(Setting::Env(name, value)) => read(&value).map_err(|message| env_error(name, message)),
    }
}

/// The URL spans go to: for HTTP, `<base>/v1/traces` unless the traces-only variable gave the
/// full URL (as the OpenTelemetry specification says of the two variables).
fn endpoint_url(
    source: &Source<'_>,
    endpoint: Setting<'_, String>,
    protocol: Protocol,
) -> Result<String, ConfigError> {
    let (text, full, fail): (String, bool, Box<dyn Fn(String) -> ConfigError>) = match endpoint {
        Setting::File(written) => (
            written.get_ref().trim().to_owned(),
            false,
            Box::new(move |message| {
                source.error(Some(written.span()), "telemetry.endpoint", message)
            }),
        ),
        Setting::Env(name, value) => (
            value,
            name == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            Box::new(move |message| env_error(name, message)),
        ),
    };
    if text.len() > MAX_ENDPOINT_BYTES {
        return Err(fail(format!(
            "is {} bytes long; an endpoint is at most {MAX_ENDPOINT_BYTES}",
            text.len()
        )));
    }
    let uri: http::Uri = text.parse().map_err(|_| {
        fail(format!(
            "`{text}` is not a URL; write the collector's, e.g. \"http://127.0.0.1:4318\""
        ))
    })?;
    let scheme = uri.scheme_str().unwrap_or_default();
    if !matches!(scheme, "http" | "https") || uri.authority().is_none() {
        return Err(fail(format!(
            "`{text}` is not an http:// or https:// URL with a host; write the collector's, e.g. \"http://127.0.0.1:4318\""
        )));
    }
    if uri.query().is_some() {
        return Err(fail(
            "carries a query string; put credentials in headers_env (or OTEL_EXPORTER_OTLP_HEADERS), not in the URL".into(),
        ));
    }
    match protocol {
        // This build's gRPC exporter carries no TLS stack of its own.
        Protocol::Grpc if scheme == "https" => Err(fail(
            "is https, and this build exports gRPC in plain text only; use protocol \"http/protobuf\" (TLS through rustls) or a collector on a private network".into(),
        )),
        Protocol::Grpc => Ok(text),
        Protocol::HttpProtobuf if full => Ok(text),
        Protocol::HttpProtobuf => Ok(format!("{}/v1/traces", text.trim_end_matches('/'))),
    }
}

fn headers(
    source: &Source<'_>,
    section: &Section,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut headers = file_headers(source, section, env)?;
    // The standard variables add what the file does not name (the file wins, as for every
    // setting); opentelemetry-otlp's HTTP exporter read them itself, ours is given them here.
    let Some((variable, list)) = [
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "OTEL_EXPORTER_OTLP_HEADERS",
    ]
    .into_iter()
    .find_map(|name| env(name).map(|value| (name, value))) else {
        return Ok(headers);
    };
    let fail = |message: String| env_error(variable, message);
    for (index, entry) in list.split(',').map(str::trim).enumerate() {
        if entry.is_empty() {
            continue;
        }
        // Values are secrets: a refusal names the entry by its place, never by its text.
        let place = index + 1;
        let Some((name, value)) = entry.split_once('=') else {
            return Err(fail(format!(
                "entry {place} is not `name=value`; write comma-separated `name=value` pairs"
            )));
        };
        let name = name.trim().to_ascii_lowercase();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(fail(format!(
                "entry {place}: `{name}` is not an HTTP header name"
            )));
        }
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|_| {
                fail(format!(
                    "entry {place}: the value is not UTF-8 once %-decoded"
                ))
            })?
            .into_owned();
        if value.is_empty() || http::HeaderValue::from_str(&value).is_err() {
            return Err(fail(format!(
                "entry {place} (`{name}`): the value is empty or not a valid header value (visible ASCII only)"
            )));
        }
        if headers
            .iter()
            .any(|(written, _)| written.eq_ignore_ascii_case(&name))
        {
            continue;
        }
        if headers.len() == MAX_HEADERS {
            return Err(fail(format!(
                "names more headers than the {MAX_HEADERS} allowed (with the file's)"
            )));
        }
        headers.push((name, value));
    }
    Ok(headers)
}

/// `[telemetry.headers_env]`: each header's value from the variable the file names.
fn file_headers(
    source: &Source<'_>,
    section: &Section,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let Some(table) = &section.headers_env else {
        return Ok(Vec::new());
    };
    let fail = |message: String| source.error(Some(table.span()), "telemetry.headers_env", message);
    if table.get_ref().len() > MAX_HEADERS {
        return Err(fail(format!(
            "names {} headers; at most {MAX_HEADERS} are allowed",
            table.get_ref().len()
        )));
    }
    let mut headers = Vec::new();
    for (name, variable) in table.get_ref() {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(fail(format!("`{name}` is not an HTTP header name")));
        }
        let Some(variable) = variable.as_str() else {
            return Err(fail(format!(
                "`{name}` must name an environment variable, as a string (\"{}_TOKEN\")",
                name.to_uppercase().replace('-', "_")
            )));
        };
        let Some(value) = env(variable).filter(|value| !value.is_empty()) else {
            return Err(fail(format!(
                "`{name}` is read from the environment variable `{variable}`, which is not set; set it, or remove the header"
            )));
        };
        if http::HeaderValue::from_str(&value).is_err() {
            // The value is a secret: say where it is, never what it is.
            return Err(fail(format!(
                "the value of `{variable}` (for `{name}`) is not a valid header value (visible ASCII only)"
            )));
        }
        headers.push((name.clone(), value));
    }
    Ok(headers)
}

/// `OTEL_TRACES_SAMPLER`'s values, with (ratio, follow the caller); `None` for a ratio read from
/// `sampling_ratio` or `OTEL_TRACES_SAMPLER_ARG`.
const SAMPLERS: [(&str, Option<f64>, bool); 6] = [
    ("parentbased_traceidratio", None, true),
    ("parentbased_always_on", Some(1.0), true),
    ("parentbased_always_off", Some(0.0), true),
    ("traceidratio", None, false),
    ("always_on", Some(1.0), false),
    ("always_off", Some(0.0), false),
];

/// The sampling: `OTEL_TRACES_SAMPLER` (the OpenTelemetry names; `parentbased_traceidratio` when
/// unset) and the ratio for the ratio samplers. A fixed sampler with a ratio written beside it is refused rather than one of the
/// two quietly winning.
fn sampling(
    source: &Source<'_>,
    section: &Section,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Sampling, ConfigError> {
    const NAME: &str = "OTEL_TRACES_SAMPLER";
    let Some(written) = env(NAME).filter(|value| !value.trim().is_empty()) else {
        return Ok(Sampling {
            ratio: sampling_ratio(source, section, env)?,
            follow_caller: true,
        });
    };
    let Some((name, fixed, follow_caller)) = SAMPLERS
        .iter()
        .find(|(name, ..)| name.eq_ignore_ascii_case(written.trim()))
    else {
        let names: Vec<&str> = SAMPLERS.iter().map(|(name, ..)| *name).collect();
        return Err(env_error(
            NAME,
            format!(
                "is `{written}`; write one of {} (remote samplers such as jaeger_remote are not supported)",
                names.join(", ")
            ),
        ));
    };
    let follow_caller = *follow_caller;
    let Some(ratio) = *fixed else {
        return Ok(Sampling {
            ratio: sampling_ratio(source, section, env)?,
            follow_caller,
        });
    };
    if let Some(written_ratio) = &section.sampling_ratio {
        return Err(source.error(
            Some(written_ratio.span()),
            "telemetry.sampling_ratio",
            format!("is set, but {NAME} is `{name}`, which takes no ratio; remove one of the two, or make the sampler a traceidratio one"),
        ));
    }
    if env("OTEL_TRACES_SAMPLER_ARG").is_some_and(|value| !value.trim().is_empty()) {
        return Err(env_error(
            "OTEL_TRACES_SAMPLER_ARG",
            format!("is set, but {NAME} is `{name}`, which takes no argument; unset it, or make the sampler a traceidratio one"),
        ));
    }
    Ok(Sampling {
        ratio,
        follow_caller,
    })
}

fn sampling_ratio(
    source: &Source<'_>,
    section: &Section,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<f64, ConfigError> {
    const WHAT: &str = "write a number from 0.0 (none) to 1.0 (every trace)";
    let in_range = |ratio: f64| (0.0..=1.0).contains(&ratio);
    match pick(&section.sampling_ratio, env, &["OTEL_TRACES_SAMPLER_ARG"]) {
        None => Ok(1.0),
        Some(Setting::File(written)) if in_range(*written.get_ref()) => Ok(*written.get_ref()),
        Some(Setting::File(written)) => Err(source.error(
            Some(written.span()),
            "telemetry.sampling_ratio",
            format!("is {}; {WHAT}", written.get_ref()),
        )),
        Some(Setting::Env(name, value)) => value
            .parse::<f64>()
            .ok()
            .filter(|ratio| in_range(*ratio))
            .ok_or_else(|| env_error(name, format!("is `{value}`; {WHAT}"))),
    }
}

fn service_name(
    source: &Source<'_>,
    section: &Section,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    let check = |name: &str| {
        if name.trim().is_empty() || name.len() > MAX_SERVICE_NAME_BYTES {
            Err(format!(
                "is {} bytes; write a name of 1 to {MAX_SERVICE_NAME_BYTES} bytes",
                name.len()
            ))
        } else {
            Ok(name.to_owned())
        }
    };
    match pick(&section.service_name, env, &["OTEL_SERVICE_NAME"]) {
        None => Ok(DEFAULT_SERVICE_NAME.to_owned()),
        Some(Setting::File(written)) => check(written.get_ref()).map_err(|message| {
            source.error(Some(written.span()), "telemetry.service_name", message)
        }),
        Some(Setting::Env(name, value)) => {
            check(&value).map_err(|message| env_error(name, message))
        }
    }
}

fn export_timeout_ms(source: &Source<'_>, section: &Section) -> Result<u64, ConfigError> {
    let Some(written) = &section.export_timeout_ms else {
        return Ok(DEFAULT_EXPORT_TIMEOUT_MS);
    };
    let value = *written.get_ref();
    if (MIN_EXPORT_TIMEOUT_MS..=MAX_EXPORT_TIMEOUT_MS).contains(&value) {
        return Ok(value);
    }
    Err(source.error(
        Some(written.span()),
        "telemetry.export_timeout_ms",
        format!(
            "is {value}; write {MIN_EXPORT_TIMEOUT_MS} to {MAX_EXPORT_TIMEOUT_MS} (milliseconds)"
        ),
    ))
}

/// The batch processor's queue, from the standard variable: the span layer counts what it holds
/// against the same number (`layer::Backlog`), so it is read and checked here, not by the SDK.
fn max_queued_spans(env: &dyn Fn(&str) -> Option<String>) -> Result<usize, ConfigError> {
    let spans = env_number(
        env,
        "OTEL_BSP_MAX_QUEUE_SIZE",
        1..=MAX_MAX_QUEUED_SPANS as u64,
        "spans",
    )?;
    // Within `MAX_MAX_QUEUED_SPANS`, a `usize`.
    Ok(spans.map_or(DEFAULT_MAX_QUEUED_SPANS, |spans| spans as usize))
}

/// The batch processor's delay between posts, from the standard variable. Read here for both
/// exporters (the spool, and the SDK's processor for gRPC, which is given it): the SDK would
/// quietly take its default for a value that is not a number, so a typo would look like export
/// that does not keep its timing.
fn schedule_delay_ms(env: &dyn Fn(&str) -> Option<String>) -> Result<u64, ConfigError> {
    let delay_ms = env_number(
        env,
        "OTEL_BSP_SCHEDULE_DELAY",
        1..=MAX_SCHEDULE_DELAY_MS,
        "milliseconds between posts",
    )?;
    Ok(delay_ms.unwrap_or(DEFAULT_SCHEDULE_DELAY_MS))
}

/// The most spans a post carries, from the standard variable, and at most the queue (as the
/// SDK has it: a batch larger than what may wait would never fill).
fn max_export_batch_spans(
    env: &dyn Fn(&str) -> Option<String>,
    max_queued_spans: usize,
) -> Result<usize, ConfigError> {
    let spans = env_number(
        env,
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        1..=MAX_MAX_QUEUED_SPANS as u64,
        "spans a post carries at most",
    )?;
    // Within `MAX_MAX_QUEUED_SPANS`, a `usize`.
    let spans = spans.map_or(DEFAULT_EXPORT_BATCH_SPANS, |spans| spans as usize);
    Ok(spans.min(max_queued_spans))
}

/// The whole number in the variable `name` (`None` when unset or empty), refused outside
/// `allowed` with what to write: "a number of {what} from … to …".
fn env_number(
    env: &dyn Fn(&str) -> Option<String>,
    name: &str,
    allowed: std::ops::RangeInclusive<u64>,
    what: &str,
) -> Result<Option<u64>, ConfigError> {
    let Some(value) = env(name).filter(|value| !value.trim().is_empty()) else {
        return Ok(None);
    };
    match value.trim().parse::<u64>() {
        Ok(number) if allowed.contains(&number) => Ok(Some(number)),
        _ => Err(env_error(
            name,
            format!(
                "is `{value}`; write a number of {what} from {} to {}",
                allowed.start(),
                allowed.end()
            ),
        )),
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(1, |before| before.matches('\n').count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn file(text: &str) -> Result<Settings, ConfigError> {
        from_file("opledger.toml", text, &no_env)
    }

    #[test]
    fn without_an_endpoint_export_is_off() {
        assert_eq!(file("listen = \"127.0.0.1:1\"\n").unwrap().export, None);
        assert_eq!(from_env(&no_env).unwrap(), Settings::default());
    }

    #[test]
    fn the_standard_endpoint_variable_turns_export_on_and_the_protocol_variable_picks_grpc() {
        let env = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://127.0.0.1:4317".to_owned()),
            "OTEL_EXPORTER_OTLP_PROTOCOL" => Some("grpc".to_owned()),
            _ => None,
        };
        let export = from_env(&env).unwrap().export.expect("on");
        assert_eq!(export.protocol, Protocol::Grpc);
        assert_eq!(export.endpoint, "http://127.0.0.1:4317");
        let env = |name: &str| {
            (name == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://127.0.0.1:4318/".to_owned())
        };
        let export = from_env(&env).unwrap().export.expect("on");
        assert_eq!(export.protocol, Protocol::HttpProtobuf);
        assert_eq!(export.endpoint, "http://127.0.0.1:4318/v1/traces");
    }

    #[test]
    fn the_standard_sampler_variable_picks_the_ratio_and_whether_a_caller_decides() {
        let export_with = |sampler: &'static str, argument: Option<&'static str>| {
            let env = move |name: &str| match name {
                "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://127.0.0.1:4318".to_owned()),
                "OTEL_TRACES_SAMPLER" => Some(sampler.to_owned()),
                "OTEL_TRACES_SAMPLER_ARG" => argument.map(str::to_owned),
                _ => None,
            };
            from_env(&env).map(|settings| {
                let export = settings.export.expect("on");
                (export.sampling.ratio, export.sampling.follow_caller)
            })
        };
        assert_eq!(export_with("", None).unwrap(), (1.0, true));
        assert_eq!(
            export_with("parentbased_traceidratio", Some("0.25")).unwrap(),
            (0.25, true)
        );
        assert_eq!(
            export_with("traceidratio", Some("0.5")).unwrap(),
            (0.5, false)
        );
        assert_eq!(export_with("ALWAYS_ON", None).unwrap(), (1.0, false));
        assert_eq!(export_with("always_off", None).unwrap(), (0.0, false));
        assert_eq!(
            export_with("parentbased_always_off", None).unwrap(),
            (0.0, true)
        );
        let unknown = export_with("jaeger_remote", None).unwrap_err();
        assert_eq!(unknown.field, "OTEL_TRACES_SAMPLER");
        assert!(
            unknown.message.contains("parentbased_traceidratio"),
            "{unknown}"
        );
        let both = export_with("always_on", Some("0.1")).unwrap_err();
        assert_eq!(both.field, "OTEL_TRACES_SAMPLER_ARG");
        assert!(both.message.contains("takes no argument"), "{both}");
        let env = |name: &str| (name == "OTEL_TRACES_SAMPLER").then(|| "always_off".to_owned());
        let text = "[telemetry]\nendpoint = \"http://127.0.0.1:4318\"\nsampling_ratio = 0.5\n";
        let error = from_file("f.toml", text, &env).unwrap_err();
        assert_eq!(
            (error.field.as_str(), error.line),
            ("telemetry.sampling_ratio", Some(3))
        );
    }

    #[test]
    fn bad_values_are_refused_at_their_line_with_what_to_write() {
        let cases = [
            ("protocol = \"smoke\"", "telemetry.protocol"),
            ("sampling_ratio = 1.5", "telemetry.sampling_ratio"),
            ("endpoint = \"ftp://x\"", "telemetry.endpoint"),
            (
                "endpoint = \"http://x:4318?key=secret\"",
                "telemetry.endpoint",
            ),
            ("export_timeout_ms = 5", "telemetry.export_timeout_ms"),
            ("log_format = \"xml\"", "telemetry.log_format"),
            ("service_name = \"\"", "telemetry.service_name"),
        ];
        for (line, field) in cases {
            let text = format!("listen = \"127.0.0.1:1\"\n[telemetry]\nendpoint = \"http://127.0.0.1:4318\"\n{line}\n");
            let text = if line.starts_with("endpoint") {
                format!("listen = \"127.0.0.1:1\"\n[telemetry]\n\n{line}\n")
            } else {
                text
            };
            let error = file(&text).expect_err(line);
            assert_eq!(error.field, field, "{line}");
            assert_eq!(error.line, Some(4), "{line}: {error}");
            assert!(error
                .to_string()
                .starts_with(&format!("opledger.toml:4: {field}: ")));
        }
        let error = file("[telemetry]\nendpont = \"http://x\"\n").unwrap_err();
        assert_eq!((error.field.as_str(), error.line), ("syntax", Some(2)));
    }

    #[test]
    fn a_header_is_read_from_its_variable_and_a_missing_one_is_named_without_a_value() {
        let text = "[telemetry]\nendpoint = \"http://127.0.0.1:4318\"\n[telemetry.headers_env]\nx-api-key = \"COLLECTOR_KEY\"\n";
        let env = |name: &str| (name == "COLLECTOR_KEY").then(|| "s3cret".to_owned());
        let export = from_file("f.toml", text, &env).unwrap().export.unwrap();
        assert_eq!(export.headers, vec![("x-api-key".into(), "s3cret".into())]);
        let error = file(text).unwrap_err();
        assert_eq!(error.line, Some(3));
        assert!(
            error.message.contains("`COLLECTOR_KEY`, which is not set"),
            "{error}"
        );
    }

    #[test]
    fn the_standard_headers_variable_adds_decoded_headers_the_file_does_not_name() {
        let text = "[telemetry]\nendpoint = \"http://127.0.0.1:4318\"\n[telemetry.headers_env]\nx-api-key = \"COLLECTOR_KEY\"\n";
        let env = |name: &str| match name {
            "COLLECTOR_KEY" => Some("from-file".to_owned()),
            "OTEL_EXPORTER_OTLP_HEADERS" => {
                Some(" X-Team = ledger%20one ,, x-api-key=from-env".to_owned())
            }
            _ => None,
        };
        let export = from_file("f.toml", text, &env).unwrap().export.unwrap();
        assert_eq!(
            export.headers,
            vec![
                ("x-api-key".into(), "from-file".into()),
                ("x-team".into(), "ledger one".into()),
            ]
        );
    }

    #[test]
    fn a_malformed_headers_variable_is_refused_by_entry_without_its_value() {
        let env = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://127.0.0.1:4318".to_owned()),
            "OTEL_EXPORTER_OTLP_HEADERS" => Some("x-team=ledger,s3cret-token".to_owned()),
            _ => None,
        };
        let error = from_env(&env).unwrap_err();
        assert_eq!(
            error.to_string(),
            "environment: OTEL_EXPORTER_OTLP_HEADERS: entry 2 is not `name=value`; write comma-separated `name=value` pairs"
        );
    }

    #[test]
    fn a_bad_environment_value_names_the_variable() {
        let env = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://127.0.0.1:4318".to_owned()),
            "OTEL_EXPORTER_OTLP_PROTOCOL" => Some("carrier-pigeon".to_owned()),
            _ => None,
        };
        let error = from_env(&env).unwrap_err();
        assert_eq!(
            error.to_string(),
            "environment: OTEL_EXPORTER_OTLP_PROTOCOL: is `carrier-pigeon`; write \"http/protobuf\" or \"grpc\""
        );
    }

    #[test]
    fn the_batch_queue_size_is_read_from_its_standard_variable_and_checked() {
        let env = |queue: &'static str| {
            move |name: &str| match name {
                "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://127.0.0.1:4318".to_owned()),
                "OTEL_BSP_MAX_QUEUE_SIZE" => Some(queue.to_owned()),
                _ => None,
            }
        };
        let export = from_env(&env("8192")).unwrap().export.unwrap();
        assert_eq!(export.max_queued_spans, 8_192);
        let export = from_env(&env("")).unwrap().export.unwrap();
        assert_eq!(export.max_queued_spans, DEFAULT_MAX_QUEUED_SPANS);
        let error = from_env(&env("0")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "environment: OTEL_BSP_MAX_QUEUE_SIZE: is `0`; write a number of spans from 1 to 65536"
        );
    }

    #[test]
    fn the_batch_timing_variables_are_checked_and_a_typo_is_refused_with_what_to_write() {
        let env = |name_set: &'static str, value: &'static str| {
            move |name: &str| match name {
                "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://127.0.0.1:4318".to_owned()),
                _ if name == name_set => Some(value.to_owned()),
                _ => None,
            }
        };
        assert!(from_env(&env("OTEL_BSP_SCHEDULE_DELAY", "1000")).is_ok());
        assert!(from_env(&env("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", " 2048 ")).is_ok());
        assert!(from_env(&env("OTEL_BSP_SCHEDULE_DELAY", "")).is_ok());
        // What the exporters are given: the value, the default when empty, and a batch never
        // larger than the queue (2,048 spans by default).
        let given = [
            ("OTEL_BSP_SCHEDULE_DELAY", "1000", 1000),
            ("OTEL_BSP_SCHEDULE_DELAY", "", DEFAULT_SCHEDULE_DELAY_MS),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "100", 100),
            (
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                "4096",
                DEFAULT_MAX_QUEUED_SPANS as u64,
            ),
        ];
        for (name, value, expected) in given {
            let export = from_env(&env(name, value)).unwrap().export.expect("on");
            let read = if name == "OTEL_BSP_SCHEDULE_DELAY" {
                export.schedule_delay_ms
            } else {
                export.max_export_batch_spans as u64
            };
            assert_eq!(read, expected, "{name}={value:?}");
        }
        let error = from_env(&env("OTEL_BSP_SCHEDULE_DELAY", "5s")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "environment: OTEL_BSP_SCHEDULE_DELAY: is `5s`; write a number of milliseconds between posts from 1 to 3600000"
        );
        let error = from_env(&env("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "0")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "environment: OTEL_BSP_MAX_EXPORT_BATCH_SIZE: is `0`; write a number of spans a post carries at most from 1 to 65536"
        );
    }

    #[test]
    fn the_file_wins_over_the_environment_and_sdk_disabled_turns_export_off() {
        let text =
            "[telemetry]\nendpoint = \"http://collector:4318\"\nservice_name = \"ledger-eu\"\n";
        let env = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://elsewhere:4318".to_owned()),
            "OTEL_SERVICE_NAME" => Some("other".to_owned()),
            _ => None,
        };
        let export = from_file("f.toml", text, &env).unwrap().export.unwrap();
        assert_eq!(export.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(export.service_name, "ledger-eu");
        let off = |name: &str| (name == "OTEL_SDK_DISABLED").then(|| "true".to_owned());
        assert_eq!(from_file("f.toml", text, &off).unwrap().export, None);
    }
}
