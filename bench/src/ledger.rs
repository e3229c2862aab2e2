//! `opledger bench store`: lifecycles per second on the embedded store (or, with `--store`, on a
//! PostgreSQL database), then a full replay.
//!
//! Each lifecycle is the minimal real one, through the same application service the product
//! uses: record an intent, start an attempt, record its success — three conditional appends to
//! one stream, each durable (synchronous=FULL) before the next begins. Concurrency comes from
//! independent operations, so group commit can share fsyncs between them.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opledger_domain::app::{IntentRequest, LoadedOperation};
use opledger_domain::codec;
use opledger_domain::command::Command;
use opledger_domain::contract::{
    Deduplication, LookupSupport, ProviderCapabilities, RetryPolicy, SendBinding,
};
use opledger_domain::event::IntentRecorded;
use opledger_domain::ids::{AttemptId, ExternalObjectId, WorkerId};
use opledger_domain::ports::IdSource;
use opledger_domain::store::{EventStore, LogStart, MAX_READ_BATCH};
use opledger_projections::totals::Totals;
use opledger_readmodel::FloorLayout;
use tokio::sync::mpsc;

use crate::args::{BenchEraseArgs, BenchStoreArgs};
use crate::files::fresh_path;
use crate::{BenchError, Product, SqliteLedger};
use opledger_domain::app::Ledger;
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_store::PostgresStore;

/// A ledger on any store.
type AnyLedger<S> = Ledger<S, SystemClock, RandomIds>;

/// Most concurrent lifecycles a run may ask for.
const MAX_CONCURRENCY: u32 = 1024;
/// Most lifecycles per concurrency level.
const MAX_OPERATIONS: u32 = 10_000_000;

/// Rebuilds the read models from position 0 into `target` and reports the rate and the peak
/// memory of the rebuild alone; with `floor`, then SQLite's floor for the same rows.
pub(crate) async fn projections(
    ledger: &Arc<SqliteLedger>,
    target: &Path,
    floor: bool,
) -> Result<(), BenchError> {
    reset_peak_rss();
    let started = Instant::now();
    let head = opledger_domain::store::EventStore::head_position(ledger.store()).await?;
    let (read_models, report) =
        opledger_readmodel::rebuild_to(ledger.store(), target, head).await?;
    let elapsed = started.elapsed();
    let peak = peak_rss_mb();
    drop(read_models);
    let events = report.applied;
    let ms = |duration: Duration| duration.as_millis();
    println!(
        "bench=projection-rebuild events={events} events_per_s={:.0} max_rss_mb={} \
         read_back={} asked_the_file={} wall_ms={} fold_waited_for_log_ms={} \
         fold_waited_for_writer_ms={} writer_waited_for_fold_ms={} writer_indexing_ms={} publishing_ms={}",
        events as f64 / elapsed.as_secs_f64(),
        peak.map_or_else(|| "unknown".to_owned(), |mb| format!("{mb:.1}")),
        report.read_back,
        report.asked_the_file,
        ms(elapsed),
        ms(report.waits.fold_for_log),
        ms(report.waits.fold_for_writer),
        ms(report.waits.writer_for_fold),
        ms(report.waits.writer_indexing),
        ms(report.waits.publishing),
    );
    if floor {
        let target = target.to_path_buf();
        tokio::task::spawn_blocking(move || projection_floor(&target, events))
            .await
            .map_err(|error| {
                BenchError::Other(format!("the floor measurement failed: {error}"))
            })??;
    }
    Ok(())
}

/// The floor's runs: today's layout with SQLite's default sorter (no helper threads) and with
/// two helpers (one per core of the 2-core machine the numbers are for, as a rebuild has), then
/// a candidate layout with two helpers.
const FLOOR_RUNS: [(FloorLayout, u32); 3] = [
    (FloorLayout::CURRENT, 0),
    (FloorLayout::CURRENT, 2),
    (
        FloorLayout {
            without_created_index: true,
        },
        2,
    ),
];

/// Writes the rows of the rebuilt file at `rebuilt` again from memory, once per run of
/// [`FLOOR_RUNS`], and prints each phase's wall and CPU time per event of the log (`events`).
fn projection_floor(rebuilt: &Path, events: u64) -> Result<(), BenchError> {
    let rows = opledger_readmodel::FloorRows::load(rebuilt)?;
    let per_event = |duration: Duration| duration.as_secs_f64() * 1e6 / events.max(1) as f64;
    for (layout, threads) in FLOOR_RUNS {
        let target = fresh_path("projection-floor");
        let mut marks: Vec<(Instant, Duration)> = Vec::new();
        let written = rows.write(&target, layout, threads, |_| {
            marks.push((Instant::now(), process_cpu()));
        });
        crate::files::remove_database(&target);
        let written = written?;
        let threads = written.sorter_threads;
        let phase = |from: usize| {
            let ((wall_from, cpu_from), (wall_to, cpu_to)) = (marks[from], marks[from + 1]);
            (
                per_event(wall_to - wall_from),
                per_event(cpu_to.saturating_sub(cpu_from)),
            )
        };
        let (inserts, inserts_cpu) = phase(0);
        let (indexes, indexes_cpu) = phase(1);
        let (close, _) = phase(2);
        println!(
            "bench=projection-floor without_created_index={} \
             sorter_threads={threads} events={events} rows={} \
             inserts_us_per_event={inserts:.3} inserts_cpu_us_per_event={inserts_cpu:.3} \
             indexes_us_per_event={indexes:.3} indexes_cpu_us_per_event={indexes_cpu:.3} \
             close_us_per_event={close:.3} total_us_per_event={:.3}",
            layout.without_created_index,
            rows.rows(),
            inserts + indexes + close,
        );
        let steps: Vec<String> = written
            .steps
            .iter()
            .map(|(step, took)| format!("{}={:.3}", step.replace(' ', ":"), per_event(*took)))
            .collect();
        println!(
            "bench=projection-floor-steps us_per_event: {}",
            steps.join(" ")
        );
    }
    Ok(())
}

/// The CPU time (user + system) of this whole process so far, from `/proc/self/stat` (Linux
/// only; zero elsewhere), in clock ticks of 10 ms (`CLK_TCK` is 100 on Linux).
fn process_cpu() -> Duration {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            // Fields after the command name, which is in parentheses and may hold spaces.
            let after = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = after.split_whitespace().collect();
            // utime and stime are the 14th and 15th fields of the line, 12th and 13th after it.
            let user: u64 = fields.get(11)?.parse().ok()?;
            let system: u64 = fields.get(12)?.parse().ok()?;
            Some(user + system)
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

pub(crate) async fn store(
    args: BenchStoreArgs,
    product: &'static dyn Product,
) -> Result<(), BenchError> {
    if args.operations == 0 || args.operations > MAX_OPERATIONS {
        return Err(BenchError::Other(format!(
            "--operations must be between 1 and {MAX_OPERATIONS}"
        )));
    }
    if args.open_per_mille > 1000 {
        return Err(BenchError::Other(
            "--open-per-mille must be between 0 and 1000".into(),
        ));
    }
    if let Some(bad) = args
        .concurrency
        .iter()
        .find(|c| **c == 0 || **c > MAX_CONCURRENCY)
    {
        return Err(BenchError::Other(format!(
            "--concurrency {bad} is out of range; use 1 to {MAX_CONCURRENCY}"
        )));
    }
    if let Some(url) = &args.store {
        return store_on_postgres(url, &args, product.demo_crm_token()).await;
    }
    let path = args.db.clone().unwrap_or_else(|| fresh_path("bench"));
    if path.exists() {
        return Err(BenchError::Other(format!(
            "{} exists; the benchmark needs a fresh file",
            path.display()
        )));
    }
    eprintln!("# ledger file: {}", path.display());
    let ledger = if args.no_tree {
        let options = opledger_store::SqliteOptions { log_tree: false };
        let store = opledger_store::SqliteStore::open_with(&path, options).await?;
        Arc::new(Ledger::new(store, SystemClock, RandomIds))
    } else {
        Arc::new(product.open_ledger(&path).await?)
    };
    measure(&ledger, &args, "sqlite", product.demo_crm_token(), || {
        let stats = ledger.store().commit_stats();
        (stats.commits, stats.appends)
    })
    .await?;
    replay(&ledger, "sqlite").await?;
    crate::close(&ledger).await
}

/// The same run on a PostgreSQL database that holds no ledger yet.
async fn store_on_postgres(
    url: &str,
    args: &BenchStoreArgs,
    crm_token: &'static str,
) -> Result<(), BenchError> {
    let store = PostgresStore::connect(url)
        .await
        .map_err(|error| BenchError::Other(error.to_string()))?;
    if store.head_position().await?.is_some() {
        return Err(BenchError::Other(format!(
            "{} already holds a ledger; the benchmark needs a fresh database",
            store.target()
        )));
    }
    eprintln!("# ledger database: {}", store.target());
    let ledger = Arc::new(Ledger::new(store, SystemClock, RandomIds));
    measure(&ledger, args, "postgres", crm_token, || {
        let stats = ledger.store().commit_stats();
        (stats.commits, stats.appends)
    })
    .await?;
    replay(&ledger, "postgres").await?;
    Ok(ledger.store().clone().close().await?)
}

/// Runs the lifecycles at each concurrency and prints a line for each; `commit_stats` gives
/// the store's (commits, appends) so far.
async fn measure<S: EventStore + 'static>(
    ledger: &Arc<AnyLedger<S>>,
    args: &BenchStoreArgs,
    backend: &str,
    crm_token: &'static str,
    commit_stats: impl Fn() -> (u64, u64),
) -> Result<(), BenchError> {
    for &concurrency in &args.concurrency {
        let before = commit_stats();
        let measured = lifecycles(
            ledger,
            concurrency,
            args.operations,
            args.open_per_mille,
            crm_token,
        )
        .await?;
        let after = commit_stats();
        let per_commit = (after.1 - before.1) as f64 / (after.0 - before.0).max(1) as f64;
        println!(
            "bench=store backend={backend} concurrency={concurrency} operations={} ops_per_s={:.0} p50_ms={:.3} p99_ms={:.3} appends_per_commit={per_commit:.1}",
            args.operations,
            f64::from(args.operations) / measured.elapsed.as_secs_f64(),
            millis(measured.percentile(50)),
            millis(measured.percentile(99)),
        );
    }
    Ok(())
}

struct Measured {
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Measured {
    fn percentile(&self, p: usize) -> Duration {
        let index = (self.latencies.len() * p / 100).min(self.latencies.len().saturating_sub(1));
        self.latencies.get(index).copied().unwrap_or_default()
    }
}

async fn lifecycles<S: EventStore + 'static>(
    ledger: &Arc<AnyLedger<S>>,
    concurrency: u32,
    operations: u32,
    open_per_mille: u32,
    crm_token: &'static str,
) -> Result<Measured, BenchError> {
    let next = Arc::new(AtomicU32::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for worker in 0..concurrency {
        let ledger = Arc::clone(ledger);
        let next = Arc::clone(&next);
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= operations {
                    return Ok::<_, BenchError>(latencies);
                }
                let begun = Instant::now();
                if index % 1000 < open_per_mille {
                    crate::startup::leave_open(&ledger, worker, index, crm_token).await?;
                } else {
                    lifecycle(&ledger, worker, index).await?;
                }
                latencies.push(begun.elapsed());
            }
        }));
    }
    let mut latencies = Vec::with_capacity(operations as usize);
    for worker in workers {
        let done = worker
            .await
            .map_err(|error| BenchError::Other(format!("a benchmark worker failed: {error}")))?;
        latencies.extend(done?);
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Ok(Measured { elapsed, latencies })
}

async fn lifecycle<S: EventStore>(
    ledger: &AnyLedger<S>,
    worker: u32,
    index: u32,
) -> Result<LoadedOperation, BenchError> {
    let recorded = ledger
        .record_intent(IntentRequest {
            tenant: "bench".into(),
            owner: None,
            provider: "bench-crm".into(),
            account: "acct-1".into(),
            credential_fingerprint: "fp-1".into(),
            action: "create_task".into(),
            args: serde_json::json!({"title": format!("Call client {index}"), "due": "2026-12-01"}),
            source_id: None,
            requires_approval: false,
        })
        .await?;
    let attempt_id = RandomIds.new_attempt_id();
    let start = keyed_start(recorded.intent(), attempt_id, &worker)?;
    let claimed = ledger.execute_from(recorded.operation, &start).await?;
    let success = Command::RecordSuccess {
        attempt_id,
        external_id: ExternalObjectId::new(format!("task-{index}"))?,
        provider_request_id: None,
    };
    Ok(ledger.execute_from(claimed, &success).await?)
}

/// Reads the whole log, decodes every event and folds it into the totals read model. Reading runs
/// one batch ahead of decoding, so the two cores share the work; memory stays at two batches.
pub(crate) async fn replay<S: EventStore + 'static>(
    ledger: &Arc<AnyLedger<S>>,
    backend: &str,
) -> Result<(), BenchError> {
    reset_peak_rss();
    let (sender, mut batches) = mpsc::channel(2);
    let reader_ledger = Arc::clone(ledger);
    let reader = tokio::spawn(async move {
        let mut start = LogStart::Beginning;
        loop {
            let batch = reader_ledger
                .store()
                .read_all(start, MAX_READ_BATCH)
                .await?;
            let Some(last) = batch.last() else {
                return Ok::<_, BenchError>(());
            };
            start = LogStart::After(last.position);
            if sender.send(batch).await.is_err() {
                return Ok(());
            }
        }
    });
    let started = Instant::now();
    let mut totals = Totals::default();
    while let Some(batch) = batches.recv().await {
        for recorded in &batch {
            totals.apply(&codec::decode(recorded).map_err(opledger_domain::app::AppError::from)?);
        }
    }
    reader
        .await
        .map_err(|error| BenchError::Other(format!("the replay reader failed: {error}")))??;
    let elapsed = started.elapsed();
    println!(
        "bench=replay backend={backend} events={} events_per_s={:.0} max_rss_mb={}",
        totals.events,
        totals.events as f64 / elapsed.as_secs_f64(),
        peak_rss_mb().map_or_else(|| "unknown".to_owned(), |mb| format!("{mb:.1}")),
    );
    eprintln!("# replayed totals: {totals:?}");
    Ok(())
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Resets the kernel's peak-RSS mark, so the replay's peak is measured on its own (Linux only).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The peak resident set size since the last reset, in MiB (Linux only).
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Most operations `bench erase` records.
const MAX_ERASE_OPERATIONS: u32 = 1_000_000;

/// `bench erase`: one subject with `--operations` pending operations, erased.
pub(crate) async fn erase(args: BenchEraseArgs, product: &dyn Product) -> Result<(), BenchError> {
    use opledger_domain::app::IntentRequest;
    use opledger_domain::personal::{Personal, PersonalFields};
    if args.operations == 0 || args.operations > MAX_ERASE_OPERATIONS {
        return Err(opledger_domain::error::ValidationError::new(
            "--operations",
            format!(
                "{} must be from 1 to {MAX_ERASE_OPERATIONS}",
                args.operations
            ),
        )
        .into());
    }
    let path = fresh_path("bench-erase");
    let keys = opledger_subjects::key_store_path(&path);
    let kek = opledger_subjects::Kek::parse(
        &format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        ),
        "a fresh key",
    )
    .map_err(|error| BenchError::Other(error.to_string()))?;
    let subjects = Arc::new(
        opledger_subjects::Subjects::open(Some(&keys), kek)
            .map_err(|error| BenchError::Other(error.to_string()))?,
    );
    let ledger = product
        .open_ledger(&path)
        .await?
        .with_personal_data(subjects.clone());
    let subject = "bench-person@example.org";
    let started = std::time::Instant::now();
    for number in 0..args.operations {
        let request = IntentRequest {
            tenant: "bench".into(),
            owner: None,
            provider: "crm".into(),
            account: "demo".into(),
            credential_fingerprint: "fp".into(),
            action: "create_task".into(),
            args: serde_json::json!({"title": format!("call {subject} #{number}"), "email": subject}),
            source_id: None,
            requires_approval: false,
        };
        let personal = Personal {
            subject: subject.into(),
            fields: PersonalFields::All,
        };
        ledger
            .record_personal_then(request, Some(personal), |_| None)
            .await?;
    }
    let record_s = started.elapsed().as_secs_f64();
    let key_id = subjects
        .show(subject)
        .map_err(|error| BenchError::Other(error.to_string()))?[0]
        .key_id
        .clone();
    let started = std::time::Instant::now();
    let report = opledger_subjects::erase_key(
        &ledger,
        &subjects,
        &key_id,
        opledger_domain::event::Principal {
            kind: opledger_domain::event::PrincipalKind::Operator,
            name: "bench".into(),
        },
        "bench",
    )
    .await
    .map_err(|error| BenchError::Other(error.to_string()))?;
    let erase_ms = started.elapsed().as_secs_f64() * 1000.0;
    crate::close(&ledger).await?;
    drop(subjects);
    crate::files::remove_database(&path);
    crate::files::remove_database(&keys);
    println!(
        "bench=erase operations={} sent_to_review={} record_s={record_s:.2} erase_ms={erase_ms:.1}",
        report.operations,
        report.sent_to_review.len()
    );
    Ok(())
}

/// Most inclusion proofs one run may make.
const MAX_PROOF_SAMPLES: u32 = 10_000_000;

/// `opledger bench proofs`: inclusion proofs at spread positions, then the tree rebuilt from the
/// log in memory.
pub(crate) async fn proofs<S>(store: &S, samples: u32) -> Result<(), BenchError>
where
    S: opledger_domain::store::EventStore + opledger_domain::merkle::LogTree,
{
    use opledger_domain::merkle;
    use opledger_domain::store::LogStart;
    if samples == 0 || samples > MAX_PROOF_SAMPLES {
        return Err(BenchError::Config(format!(
            "--samples must be 1 to {MAX_PROOF_SAMPLES}"
        )));
    }
    let size = store.tree_size().await?;
    if size == 0 {
        return Err(BenchError::NotFound("the ledger's tree is empty".into()));
    }
    // Positions spread by a fixed odd stride, so every part of the tree is asked and a run is
    // repeatable.
    let stride = (0x9E37_79B9_7F4A_7C15_u64 % size).max(1);
    let mut took = Vec::with_capacity(samples as usize);
    let mut index = 0_u64;
    for _ in 0..samples {
        index = (index + stride) % size;
        let started = std::time::Instant::now();
        merkle::inclusion_proof_of(store, index, size)
            .await
            .map_err(|error| BenchError::Other(error.to_string()))?;
        took.push(started.elapsed().as_micros());
    }
    took.sort_unstable();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    println!(
        "bench=prove samples={samples} tree_size={size} p50_us={} p99_us={} max_us={}",
        at(0.5),
        at(0.99),
        at(1.0)
    );
    let started = std::time::Instant::now();
    let mut tree = merkle::RootFolder::new();
    let mut start = LogStart::Beginning;
    loop {
        let batch = store.read_all(start, 512).await?;
        let Some(last) = batch.last() else { break };
        start = LogStart::After(last.position);
        for event in &batch {
            tree.push(merkle::leaf_hash(&event.view()));
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let stored = merkle::head_of(store, Some(tree.size().min(size)))
        .await
        .map_err(|error| BenchError::Other(error.to_string()))?;
    let rebuilt = tree.head();
    println!(
        "bench=tree-rebuild events={} events_per_s={:.0} matches_stored_tree={}",
        rebuilt.size,
        rebuilt.size as f64 / seconds.max(1e-9),
        rebuilt.size == stored.size && rebuilt.root == stored.root
    );
    Ok(())
}

/// A bench worker's claim to send a recorded intent to a keyed provider with a consistent
/// lookup: the second event of every operation the benches write.
pub(crate) fn keyed_start(
    intent: &IntentRecorded,
    attempt_id: AttemptId,
    worker: &dyn std::fmt::Display,
) -> Result<Command, BenchError> {
    Ok(Command::StartAttempt {
        request: None,
        budget_wait: None,
        attempt_id,
        worker: WorkerId::new(format!("bench-{worker}"))?,
        lease_ms: 30_000,
        binding: SendBinding {
            account: intent.account.clone(),
            credential_fingerprint: intent.credential_fingerprint.clone(),
            args_hash: intent.args_hash.clone(),
        },
        capabilities: ProviderCapabilities {
            deduplication: Deduplication::IdempotencyKey {
                retention_s: 86_400,
                safety_margin_s: 3_600,
            },
            lookup: LookupSupport::Consistent,
        },
        policy: RetryPolicy::default(),
    })
}
