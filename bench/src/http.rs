//! `opledger bench http`: the service end to end, as an agent platform uses it — record an
//! intent, then execute it and wait for the outcome — over real HTTP on loopback, against the CRM
//! stand, with the SQLite ledger at synchronous=FULL.
//!
//! Without `--url` it starts everything itself (a fresh ledger file in the temporary directory,
//! the stand, `opledger serve`'s embedded default) and removes the file afterwards; with `--url`
//! and `--token` it drives a server that is already running. One operation's latency is from
//! sending the record request to receiving the execute answer; an operation counts only when
//! the answer says `succeeded`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opledger_domain::error::ValidationError;
use serde_json::{json, Value};

use crate::args::BenchHttpArgs;
use crate::files::fresh_path;
use crate::{BenchError, Product};

/// Most concurrent clients.
const MAX_CONCURRENCY: u32 = 1024;
/// Most operations per concurrency level.
const MAX_OPERATIONS: u32 = 1_000_000;
/// How long one execute call may wait for its outcome, in milliseconds.
const EXECUTE_WAIT_MS: u64 = 10_000;

/// This run's id, in every task's arguments: runs against the same server never repeat a request.
static RUN: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| uuid::Uuid::new_v4().simple().to_string());

pub async fn run(args: BenchHttpArgs, product: &dyn Product) -> Result<(), BenchError> {
    if args.concurrency.is_empty()
        || args
            .concurrency
            .iter()
            .any(|c| *c == 0 || *c > MAX_CONCURRENCY)
    {
        return Err(ValidationError::new(
            "--concurrency",
            format!("give levels from 1 to {MAX_CONCURRENCY}, comma-separated"),
        )
        .into());
    }
    if args.operations == 0 || args.operations > MAX_OPERATIONS {
        return Err(ValidationError::new(
            "--operations",
            format!("{} must be from 1 to {MAX_OPERATIONS}", args.operations),
        )
        .into());
    }
    if args.personal && args.url.is_some() {
        return Err(ValidationError::new(
            "--personal",
            "turns personal data on in a server started here; leave out --url and --token",
        )
        .into());
    }
    if args.no_tree && args.url.is_some() {
        return Err(ValidationError::new(
            "--no-tree",
            "switches the tree off in a server started here; leave out --url and --token",
        )
        .into());
    }
    if args.webhook && args.url.is_some() {
        return Err(ValidationError::new(
            "--webhook",
            "subscribes a receiver of its own to a server started here; leave out --url and --token",
        )
        .into());
    }
    match (&args.url, &args.token) {
        (Some(url), Some(token)) => {
            let provider = args.provider.clone();
            let account = args.account.clone();
            tokio::select! {
                result = measure_all(&args, url, token, &provider, &account, None) => result,
                _ = tokio::signal::ctrl_c() => Err(BenchError::Interrupted),
            }
        }
        (Some(_), None) | (None, Some(_)) => Err(ValidationError::new(
            "--url",
            "--url and --token go together (the server's address and a tenant token); leave both out to benchmark a server started here",
        )
        .into()),
        (None, None) => self_hosted(&args, product).await,
    }
}

/// Starts the stand and the embedded default on a fresh file, measures, stops, removes the file.
async fn self_hosted(args: &BenchHttpArgs, product: &dyn Product) -> Result<(), BenchError> {
    let path = fresh_path("bench-http");
    let (mut config, stand) = product.embedded_default(&path).await?;
    config.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    config.log.tree = !args.no_tree;
    // Sealing is measured only when asked for, whatever `$OPLEDGER_KEK` the shell holds.
    config.personal_data = None;
    if args.personal {
        let kek = opledger_subjects::Kek::parse(
            &format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            ),
            "a fresh key",
        )
        .map_err(|error| BenchError::Other(error.to_string()))?;
        config.personal_data = Some(opledger_http_api::config::personal::PersonalDataSettings {
            kek,
            key_store: None,
            tenants: Default::default(),
        });
    }
    let receiver = if args.webhook {
        let receiver = Receiver::start().await?;
        config.webhooks = vec![receiver.endpoint()?];
        Some(receiver)
    } else {
        None
    };
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(opledger_http_api::run(
        config,
        async move {
            let _ = stop_rx.await;
        },
        Some(ready_tx),
    ));
    let result = match ready_rx.await {
        Ok(address) => {
            let url = format!("http://{address}");
            tokio::select! {
                result = measure_all(args, &url, product.demo_tenant_token(), "crm", "demo", receiver.as_ref()) => result,
                _ = tokio::signal::ctrl_c() => Err(BenchError::Interrupted),
            }
        }
        Err(_) => Err(BenchError::Other("the server did not start".into())),
    };
    let _ = stop_tx.send(());
    let served = server
        .await
        .map_err(|error| BenchError::Other(format!("the server task failed: {error}")))?;
    stand.shutdown().await;
    // The ledger and the read models beside it (`.views`, with its swap lock `.views.lock`):
    // left behind, one pair per run would pile up in the temporary directory.
    crate::files::remove_database(&path);
    crate::files::remove_database(&crate::files::sibling(&path, ".views"));
    crate::files::remove_database(&crate::files::sibling(&path, ".webhooks"));
    crate::files::remove_database(&opledger_subjects::key_store_path(&path));
    // The claims of the server's workers, beside the read models.
    crate::files::remove_database(&crate::files::sibling(&path, ".claims"));
    result?;
    Ok(served?)
}

async fn measure_all(
    args: &BenchHttpArgs,
    url: &str,
    token: &str,
    provider: &str,
    account: &str,
    receiver: Option<&Receiver>,
) -> Result<(), BenchError> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(MAX_CONCURRENCY as usize)
        .timeout(Duration::from_millis(EXECUTE_WAIT_MS + 5_000))
        .build()
        .map_err(|error| BenchError::Other(format!("cannot build the HTTP client: {error}")))?;
    let target = Target {
        client,
        one_call: args.one_call,
        url: url.to_owned(),
        token: token.to_owned(),
        provider: provider.to_owned(),
        account: account.to_owned(),
        personal: args.personal,
    };
    // A short warm-up opens connections and pages in the ledger.
    measure(&target, 8, 200.min(args.operations)).await?;
    // Every operation succeeds once, so the endpoint has everything when it has received as
    // many deliveries as operations were run.
    let mut expected_deliveries = u64::from(200.min(args.operations));
    for &concurrency in &args.concurrency {
        // The level starts with the endpoint caught up, so its deliveries are this level's.
        if let Some(receiver) = receiver {
            receiver.wait_for(expected_deliveries).await?;
        }
        let level_started = Instant::now();
        let delivered_before = receiver.map(|_| expected_deliveries);
        let (elapsed, mut latencies) = measure(&target, concurrency, args.operations).await?;
        expected_deliveries += u64::from(args.operations);
        if let (Some(receiver), Some(before)) = (receiver, delivered_before) {
            let level_ended = Instant::now();
            let caught_up = receiver.wait_for(expected_deliveries).await?;
            let delivered = expected_deliveries.saturating_sub(before);
            println!(
                "bench=http-webhook concurrency={concurrency} delivered={delivered} deliveries_per_s={:.0} caught_up_after_ms={}",
                delivered as f64 / caught_up.duration_since(level_started).as_secs_f64(),
                caught_up.saturating_duration_since(level_ended).as_millis()
            );
        }
        latencies.sort_unstable();
        let percentile = |p: f64| {
            let index = ((latencies.len() as f64 - 1.0) * p).round() as usize;
            latencies[index].as_secs_f64() * 1000.0
        };
        println!(
            "bench=http{} concurrency={concurrency} operations={} ops_per_s={:.0} p50_ms={:.2} p99_ms={:.2}",
            if args.one_call { " calls=1" } else { "" },
            latencies.len(),
            latencies.len() as f64 / elapsed.as_secs_f64(),
            percentile(0.50),
            percentile(0.99)
        );
    }
    Ok(())
}

#[derive(Clone)]
struct Target {
    client: reqwest::Client,
    /// Record and execute in one call (`?execute=true`) instead of two.
    one_call: bool,
    url: String,
    token: String,
    provider: String,
    account: String,
    /// Name a data subject on every record (one of 1,000), so every argument is sealed.
    personal: bool,
}

/// Runs `operations` record+execute pairs with `concurrency` clients; returns the wall time and
/// each operation's latency.
async fn measure(
    target: &Target,
    concurrency: u32,
    operations: u32,
) -> Result<(Duration, Vec<Duration>), BenchError> {
    let next = Arc::new(AtomicU32::new(0));
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let next = Arc::clone(&next);
        let target = target.clone();
        clients.spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let number = next.fetch_add(1, Ordering::Relaxed);
                if number >= operations {
                    break;
                }
                let began = Instant::now();
                one(&target, number).await?;
                latencies.push(began.elapsed());
            }
            Ok::<_, BenchError>(latencies)
        });
    }
    let mut latencies = Vec::with_capacity(operations as usize);
    while let Some(joined) = clients.join_next().await {
        let part = joined
            .map_err(|error| BenchError::Other(format!("a client task failed: {error}")))??;
        latencies.extend(part);
    }
    Ok((started.elapsed(), latencies))
}

/// One operation: record, execute, and check the answer says it succeeded. Every operation
/// asks for a different task: identical requests from different deliveries are flagged as
/// possible duplicate intents, which is not the traffic being measured.
async fn one(target: &Target, number: u32) -> Result<(), BenchError> {
    let mut body = json!({
        "provider": target.provider,
        "account": target.account,
        "action": "create_task",
        "args": {"title": format!("bench task {number}"), "run": RUN.as_str()},
    });
    if target.personal {
        body["subject"] = json!(format!("bench-person-{}@example.org", number % 1_000));
    }
    let executed = if target.one_call {
        post(
            target,
            &format!("/v1/operations?execute=true&wait_ms={EXECUTE_WAIT_MS}"),
            Some(body),
        )
        .await?
    } else {
        let recorded = post(target, "/v1/operations", Some(body)).await?;
        let id = recorded
            .operation_id
            .ok_or_else(|| BenchError::Other("record answered without an operation id".into()))?;
        post(
            target,
            &format!("/v1/operations/{id}/execute?wait_ms={EXECUTE_WAIT_MS}"),
            None,
        )
        .await?
    };
    if executed.state.as_deref() != Some("succeeded") {
        return Err(BenchError::Other(format!(
            "operation {} ended {} instead of succeeded (last error: {}; execute error: {})",
            executed.operation_id.as_deref().unwrap_or("?"),
            executed.state.as_deref().unwrap_or("without a state"),
            executed.last_error.as_deref().unwrap_or("none"),
            executed
                .execute_error
                .as_ref()
                .map_or_else(|| "none".to_owned(), Value::to_string)
        )));
    }
    Ok(())
}

/// The two fields of an operation's answer the benchmark checks; the rest is skipped unparsed,
/// so the client spends its share of the two cores on requests, not on building JSON trees.
#[derive(serde::Deserialize)]
struct Answer {
    operation_id: Option<String>,
    state: Option<String>,
    /// Read only to explain a failure.
    last_error: Option<String>,
    execute_error: Option<Value>,
}

async fn post(target: &Target, path: &str, body: Option<Value>) -> Result<Answer, BenchError> {
    let mut request = target
        .client
        .post(format!("{}{path}", target.url))
        .bearer_auth(&target.token);
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request
        .send()
        .await
        .map_err(|error| BenchError::Other(format!("POST {path} failed: {error}")))?;
    let status = response.status();
    let text = response
        .text()
        .await
        .map_err(|error| BenchError::Other(format!("POST {path}: reading the answer: {error}")))?;
    if !status.is_success() {
        return Err(BenchError::Other(format!(
            "POST {path} answered {status}: {text}"
        )));
    }
    serde_json::from_str(&text).map_err(|error| {
        BenchError::Other(format!(
            "POST {path} answered something else than an operation ({error}): {text}"
        ))
    })
}

/// Most time the bench waits for the endpoint to have everything after a level, in seconds.
const MAX_CATCH_UP_S: u64 = 600;

/// A loopback receiver that answers 200 at once and counts what it was sent, and the endpoint
/// subscribing it. It checks nothing: signatures are the webhook tests' work, not the bench's.
///
/// It runs in the measured process, so its own cost is kept to what any receiver pays: hyper's
/// HTTP/1 server straight (no router, no protocol sniffing; with axum the receiver as a whole
/// was ~20 % of a delivery's CPU here), the body read whole, and one wake-up of the waiting
/// bench when the count it waits for is reached instead of a `notify_waiters` at every request.
struct Receiver {
    url: String,
    counts: Arc<Counts>,
}

/// What the receiver's connections share with the bench waiting on them.
#[derive(Default)]
struct Counts {
    received: std::sync::atomic::AtomicU64,
    /// The count the bench waits for; the request that reaches it wakes the bench.
    wanted: std::sync::atomic::AtomicU64,
    reached: tokio::sync::Notify,
}

impl Counts {
    fn count(&self) {
        let received = self.received.fetch_add(1, Ordering::AcqRel) + 1;
        if received == self.wanted.load(Ordering::Acquire) {
            self.reached.notify_waiters();
        }
    }
}

impl Receiver {
    async fn start() -> Result<Self, BenchError> {
        let counts = Arc::new(Counts::default());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|error| BenchError::Other(format!("cannot listen for webhooks: {error}")))?;
        let address = listener
            .local_addr()
            .map_err(|error| BenchError::Other(format!("the receiver has no address: {error}")))?;
        tokio::spawn(serve_receiver(listener, Arc::clone(&counts)));
        Ok(Self {
            url: format!("http://{address}/hooks"),
            counts,
        })
    }

    fn endpoint(&self) -> Result<opledger_webhooks::Endpoint, BenchError> {
        let url =
            opledger_webhooks::endpoint::check_url(&self.url, false).map_err(BenchError::Other)?;
        // A fixed key: the receiver does not verify, and nothing outside this process sees it.
        let secret =
            opledger_webhooks::signing::Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
                .map_err(BenchError::Other)?;
        Ok(opledger_webhooks::Endpoint {
            id: "bench".into(),
            url,
            secrets: vec![secret],
            events: ["succeeded".to_owned()].into(),
            tenants: None,
            allow_private_network: false,
            retry_window_s: 60,
            request_timeout_ms: opledger_webhooks::DEFAULT_REQUEST_TIMEOUT_MS,
        })
    }

    fn received(&self) -> u64 {
        self.counts.received.load(Ordering::Acquire)
    }

    /// Waits until `count` deliveries arrived; answers when the last of them did.
    async fn wait_for(&self, count: u64) -> Result<Instant, BenchError> {
        let deadline = Instant::now() + Duration::from_secs(MAX_CATCH_UP_S);
        self.counts.wanted.store(count, Ordering::Release);
        loop {
            let reached = self.counts.reached.notified();
            if self.received() >= count {
                return Ok(Instant::now());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(BenchError::Other(format!(
                    "the webhook endpoint had {} of {count} deliveries after {MAX_CATCH_UP_S} s",
                    self.received()
                )));
            }
            // The request that reaches `count` wakes this wait (it was registered before the
            // check above); the timeout only looks at the deadline.
            let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), reached).await;
        }
    }
}

/// How long the receiver pauses after a failed accept, in milliseconds.
const ACCEPT_RETRY_MS: u64 = 10;

/// Accepts the endpoint's connections and answers each POST `ok` once its body is read.
async fn serve_receiver(listener: tokio::net::TcpListener, counts: Arc<Counts>) {
    use http_body_util::BodyExt as _;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of descriptors and the like: pause, as axum's own loop does, not spin.
                tokio::time::sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
                continue;
            }
        };
        let counts = Arc::clone(&counts);
        let service =
            hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let counts = Arc::clone(&counts);
                async move {
                    // Read like a receiver that verifies would; a broken body is not counted.
                    let read = request.into_body().collect().await;
                    let status = match read {
                        Ok(_) => {
                            counts.count();
                            hyper::StatusCode::OK
                        }
                        Err(_) => hyper::StatusCode::BAD_REQUEST,
                    };
                    let mut answer = hyper::Response::new(String::from("ok"));
                    *answer.status_mut() = status;
                    Ok::<_, std::convert::Infallible>(answer)
                }
            });
        tokio::spawn(
            hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
        );
    }
}
