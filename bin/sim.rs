//! `opledger sim`: the deterministic simulator (the `opledger-sim` crate) over many seeds, with
//! progress on stderr, each failing seed's reproduction command and trace, and one summary line.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opledger_sim::{run_seeds, SeedReport, SimConfig};

use crate::cli::{CliError, SimArgs};

/// How often progress is printed.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

pub async fn run(args: SimArgs) -> Result<(), CliError> {
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                stop.store(true, Ordering::Relaxed);
            }
        });
    }
    let config = SimConfig {
        ops: args.ops,
        keep_full_trace: args.seeds == 1,
        ..SimConfig::default()
    };
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let (from, seeds) = (args.from, args.seeds);
    // A panic inside the engine is a failed seed with its trace; the default hook's backtrace
    // would only bury the report.
    std::panic::set_hook(Box::new(|_| {}));
    let worker_stop = Arc::clone(&stop);
    let summary = tokio::task::spawn_blocking(move || {
        let last = Mutex::new(Instant::now());
        let started = Instant::now();
        let progress = |done: u64, report: &SeedReport| {
            if !report.passed() {
                eprintln!(
                    "seed {} failed: {}",
                    report.seed,
                    report.violations.join("; ")
                );
            }
            let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
            if last.elapsed() >= PROGRESS_EVERY {
                *last = Instant::now();
                let rate = done as f64 / started.elapsed().as_secs_f64();
                eprintln!("sim: {done}/{seeds} seeds, {rate:.0} seeds/s");
            }
        };
        run_seeds(from, seeds, &config, threads, &worker_stop, &progress)
    })
    .await
    .map_err(|error| CliError::Other(format!("the simulation stopped: {error}")))?;
    let _ = std::panic::take_hook();
    for report in &summary.failed {
        println!(
            "seed {} broke: {}",
            report.seed,
            report.violations.join("; ")
        );
        println!("reproduce: {}", report.reproduce_command());
        let lines = report.full_trace.as_ref().unwrap_or(&report.trace_tail);
        for line in lines {
            println!("  {line}");
        }
    }
    println!("{}", summary.line());
    if !summary.failed.is_empty() {
        return Err(CliError::SimFailed {
            failed: summary.failed.len(),
        });
    }
    if stop.load(Ordering::Relaxed) {
        return Err(CliError::Interrupted);
    }
    Ok(())
}
