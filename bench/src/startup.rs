//! `opledger bench startup --db FILE`: how long `opledger serve` takes from process start to
//! `/healthz` ready and to its first due operation driven, and its peak memory, on a
//! ledger of any size written by `bench store --open-per-mille N`.
//!
//! The server is a child process (the same binary), so its peak RSS is its own. Its read models
//! are caught up before it starts, untimed: what is measured is a restart. The first drive is
//! seen as the log's head moving past where it was before the start (`/healthz` reports it);
//! the benchmark's drives append to the ledger, so a second run finds less due work.
//!
//! Before it starts the server it asks the ledger when its first work falls due. With none (a
//! ledger from `bench store` without `--open-per-mille`, or one whose open work earlier runs
//! drove) no drive can come: it measures the start alone and prints `first_drive_ms=none` with a
//! sentence saying why and what to run, instead of waiting out [`MAX_WAIT_MS`] in silence.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use opledger_domain::app::LoadedOperation;
use opledger_domain::app::{IntentRequest, Ledger};
use opledger_domain::codec;
use opledger_domain::command::Command as LedgerCommand;
use opledger_domain::ports::IdSource;
use opledger_domain::store::{EventStore, LogStart, MAX_READ_BATCH};
use opledger_projections::work_queue::WorkQueue;

use crate::args::BenchStartupArgs;
use crate::{BenchError, Product};
use opledger_runtime::system::{RandomIds, SystemClock};

/// How often the benchmark asks `/healthz`, in milliseconds.
const POLL_MS: u64 = 5;
/// The longest the benchmark waits for the server to be ready or to drive, in milliseconds.
const MAX_WAIT_MS: u64 = 600_000;

pub async fn run(args: BenchStartupArgs, product: &dyn Product) -> Result<(), BenchError> {
    let prepared = prepare(&args.db, args.server_exe.is_none(), product).await?;
    let (events, head) = (prepared.events, prepared.head);
    let drive_expected = drive_expected(&args.db, prepared.first_due_at, Utc::now());
    let exe = match args.server_exe {
        Some(exe) => exe,
        None => std::env::current_exe()
            .map_err(|error| BenchError::Other(format!("cannot find this executable: {error}")))?,
    };
    let listen = free_port()?;
    let started = Instant::now();
    let mut child = spawn_server(&exe, &args.db, listen)?;
    let measured = measure(
        &mut child,
        listen,
        started,
        head,
        drive_expected,
        args.settle_ms,
    )
    .await;
    stop(&mut child);
    let (ready, first_drive, rss) = measured?;
    if drive_expected && first_drive.is_none() {
        eprintln!("# work was due, but the server drove none within {MAX_WAIT_MS} ms");
    }
    println!(
        "bench=startup events={events} ready_ms={} first_drive_ms={} max_rss_mb={}",
        ready.as_millis(),
        first_drive.map_or_else(|| "none".to_owned(), |at| at.as_millis().to_string()),
        rss.map_or_else(|| "unknown".to_owned(), |mb| format!("{mb:.1}")),
    );
    Ok(())
}

/// Whether a first drive can come within [`MAX_WAIT_MS`] of `now`, given when `db`'s first work
/// falls due; if not, a sentence on stderr says why and what to run.
fn drive_expected(db: &Path, first_due_at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
    let wait_end = now + chrono::Duration::milliseconds(MAX_WAIT_MS as i64);
    match first_due_at {
        None => {
            eprintln!(
                "# no operation in {} waits for a send, a sweep or a lookup, so no drive can come: the start alone is measured (first_drive_ms=none); for a first drive, write a ledger with open work, e.g. opledger bench store --concurrency 64 --operations 10000 --open-per-mille 10 --db NEW_FILE",
                db.display()
            );
            false
        }
        Some(due_at) if due_at > wait_end => {
            eprintln!(
                "# the first work in {} falls due at {due_at}, after the benchmark's wait of {MAX_WAIT_MS} ms: the start alone is measured (first_drive_ms=none)",
                db.display()
            );
            false
        }
        Some(_) => true,
    }
}

/// What the benchmark knows of the ledger before the start.
struct Prepared {
    /// How many events the log holds.
    events: u64,
    /// The log's head position (`None`: empty).
    head: Option<u64>,
    /// When its first work (a send, a sweep, a lookup) falls due; `None`: no operation waits
    /// for any, so a server has nothing to drive.
    first_due_at: Option<DateTime<Utc>>,
}

/// Catches the read models beside `db` up to its log (untimed; only when `own_read_models`:
/// another build's read models are its own, so then the log is folded instead) and reads the
/// number of events, the log's head and when the first work falls due.
async fn prepare(
    db: &Path,
    own_read_models: bool,
    product: &dyn Product,
) -> Result<Prepared, BenchError> {
    let ledger = product.open_for_reading(db).await?;
    let head = ledger.store().head_position().await?;
    let first_due_at = if own_read_models {
        let mut views = db.as_os_str().to_owned();
        views.push(".views");
        let read_models =
            opledger_readmodel::ReadModels::open(std::path::PathBuf::from(views)).await?;
        eprintln!("# catching up the read models (untimed)");
        opledger_readmodel::catch_up(ledger.store(), &read_models, head, |_| {}).await?;
        // No send delay: the question is whether work waits, not when a worker takes it.
        let page = read_models
            .call(|store| store.due_work(Utc::now(), chrono::Duration::zero(), 1))
            .await?;
        page.due.first().map(|due| due.due_at).or(page.next_due_at)
    } else {
        eprintln!("# reading the ledger's open work from its log (untimed)");
        first_due_in_log(ledger.store()).await?
    };
    crate::close(&ledger).await?;
    // SQLite positions are one per event, from 1.
    let head = head.map(|position| position.value());
    Ok(Prepared {
        events: head.unwrap_or(0),
        head,
        first_due_at,
    })
}

/// When the first work of `store`'s log falls due, folding the whole log into the work queue.
async fn first_due_in_log(store: &impl EventStore) -> Result<Option<DateTime<Utc>>, BenchError> {
    let mut queue = WorkQueue::new();
    let mut start = LogStart::Beginning;
    loop {
        let batch = store.read_all(start, MAX_READ_BATCH).await?;
        let Some(last) = batch.last() else {
            return Ok(queue.next_due_at());
        };
        start = LogStart::After(last.position);
        for recorded in &batch {
            let Some(operation_id) = recorded.stream.operation_id() else {
                continue;
            };
            let event = codec::decode(recorded).map_err(opledger_domain::app::AppError::from)?;
            queue.apply(operation_id, &event);
        }
    }
}

fn free_port() -> Result<SocketAddr, BenchError> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .map_err(|error| BenchError::Other(format!("cannot find a free port: {error}")))?;
    listener
        .local_addr()
        .map_err(|error| BenchError::Other(format!("cannot find a free port: {error}")))
}

fn spawn_server(exe: &Path, db: &Path, listen: SocketAddr) -> Result<Child, BenchError> {
    Command::new(exe)
        .arg("serve")
        .arg("--db")
        .arg(db)
        .arg("--listen")
        .arg(listen.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|error| BenchError::Other(format!("cannot start the server: {error}")))
}

/// Time to ready, time to the first drive (`None` if none came, or none was `drive_expected`),
/// and the child's peak RSS `settle_ms` after that.
async fn measure(
    child: &mut Child,
    listen: SocketAddr,
    started: Instant,
    head: Option<u64>,
    drive_expected: bool,
    settle_ms: u64,
) -> Result<(Duration, Option<Duration>, Option<f64>), BenchError> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|error| BenchError::Other(format!("cannot build the HTTP client: {error}")))?;
    let url = format!("http://{listen}/healthz");
    let mut ready = None;
    let mut first_drive = None;
    while first_drive.is_none() && (drive_expected || ready.is_none()) {
        if started.elapsed() > Duration::from_millis(MAX_WAIT_MS) {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(BenchError::Other(format!("the server exited: {status}")));
        }
        if let Some((is_ready, log_head)) = health(&client, &url).await {
            if is_ready && ready.is_none() {
                ready = Some(started.elapsed());
            }
            if log_head > head && ready.is_some() {
                first_drive = Some(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    let ready = ready.ok_or_else(|| BenchError::Other("the server never became ready".into()))?;
    tokio::time::sleep(Duration::from_millis(settle_ms)).await;
    Ok((ready, first_drive, peak_rss_mb(child.id())))
}

/// Whether `/healthz` answers ready, and the log head it reports.
async fn health(client: &reqwest::Client, url: &str) -> Option<(bool, Option<u64>)> {
    let response = client.get(url).send().await.ok()?;
    let ready = response.status().is_success();
    let body: serde_json::Value = response.json().await.ok()?;
    Some((ready, body["log_head"].as_u64()))
}

/// The peak resident set size of process `pid`, in MiB (Linux only).
fn peak_rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Asks the server to stop (SIGTERM) and waits for it; kills it if that fails.
fn stop(child: &mut Child) {
    let asked = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .is_ok_and(|status| status.success());
    if !asked {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// One operation `bench store --open-per-mille` leaves open, by `index`: in turn a due send, an
/// attempt in flight, an unknown outcome, one awaiting approval, one in review. Bound to the
/// embedded default's `crm` provider and `demo` account, so `opledger serve` can drive them.
pub async fn leave_open<S: EventStore>(
    ledger: &Ledger<S, SystemClock, RandomIds>,
    worker: u32,
    index: u32,
    crm_token: &str,
) -> Result<LoadedOperation, BenchError> {
    let fingerprint = opledger_providers::credentials::fingerprint_of(crm_token);
    let kind = index % 5;
    let recorded = ledger
        .record_intent(IntentRequest {
            tenant: "demo".into(),
            owner: None,
            provider: "crm".into(),
            account: "demo".into(),
            credential_fingerprint: fingerprint.as_str().into(),
            action: "create_task".into(),
            args: serde_json::json!({"title": format!("Open task {index}")}),
            source_id: None,
            requires_approval: kind == 3,
        })
        .await?;
    if kind == 0 || kind == 3 {
        return Ok(recorded.operation);
    }
    let attempt_id = RandomIds.new_attempt_id();
    let start = crate::ledger::keyed_start(recorded.intent(), attempt_id, &worker)?;
    let mut loaded = ledger.execute_from(recorded.operation, &start).await?;
    if kind == 1 {
        return Ok(loaded);
    }
    let unknown = LedgerCommand::RecordUnknown {
        attempt_id,
        error: "read timed out".into(),
        check_not_before: None,
    };
    loaded = ledger.execute_from(loaded, &unknown).await?;
    if kind == 2 {
        return Ok(loaded);
    }
    let review = LedgerCommand::RequireReview {
        reason: "no evidence and no retry contract".into(),
        evidence: "a lookup found nothing".into(),
    };
    Ok(ledger.execute_from(loaded, &review).await?)
}
