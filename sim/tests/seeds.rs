//! The CI run of the simulator: 10,000 seeds of at least 50 operations each, on two threads,
//! with every fault class firing in at least 1 % of the seeds.

use std::sync::atomic::AtomicBool;

use opledger_sim::{run_seed, run_seeds, SimConfig};

/// Seeds the CI run covers (the issue asks for at least 10,000).
const CI_SEEDS: u64 = 10_000;
/// Operations per seed (at least 50).
const CI_OPS: usize = 50;
/// The share of seeds each fault class must fire in, per mille (1 %).
const MIN_CLASS_SHARE_PER_MILLE: u64 = 10;
/// The machine CI runs on has two cores.
const CI_THREADS: usize = 2;

#[test]
fn ten_thousand_seeds_keep_every_invariant_and_every_fault_class_fires() {
    let config = SimConfig {
        ops: CI_OPS,
        ..SimConfig::default()
    };
    let started = std::time::Instant::now();
    let summary = run_seeds(
        0,
        CI_SEEDS,
        &config,
        CI_THREADS,
        &AtomicBool::new(false),
        &|_, _| {},
    );
    let elapsed = started.elapsed();
    println!("{}", summary.line());
    println!(
        "{} seeds in {:.1} s ({:.0} seeds/s)",
        summary.seeds,
        elapsed.as_secs_f64(),
        summary.seeds as f64 / elapsed.as_secs_f64()
    );
    for class in opledger_sim::FaultClass::ALL {
        println!(
            "  {:<20} fired in {:>5} seeds",
            class.name(),
            summary.seeds_with.get(&class).copied().unwrap_or(0)
        );
    }
    let failures: Vec<String> = summary
        .failed
        .iter()
        .take(5)
        .map(|report| {
            format!(
                "seed {}: {}\n  reproduce: {}\n{}",
                report.seed,
                report.violations.join("; "),
                report.reproduce_command(),
                report.trace_tail.join("\n")
            )
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} seed(s) failed:\n{}",
        summary.failed.len(),
        failures.join("\n\n")
    );
    assert_eq!(summary.seeds, CI_SEEDS);
    let rare = summary.rare_classes(MIN_CLASS_SHARE_PER_MILLE);
    assert!(
        rare.is_empty(),
        "fault classes firing in under 1 % of the seeds: {rare:?}"
    );
}

#[test]
fn a_seed_runs_the_same_trace_every_time() {
    let config = SimConfig::default();
    let first = run_seed(42, &config);
    let second = run_seed(42, &config);
    assert_eq!(first.trace_hash, second.trace_hash);
    assert_eq!(first.trace_tail, second.trace_tail);
    assert_ne!(
        run_seed(43, &config).trace_hash,
        first.trace_hash,
        "another seed, another run"
    );
}

#[test]
fn the_trace_of_a_fixed_seed_is_stable_across_builds() {
    // Computed once and written down: a change of this hash means the simulation of seed 7
    // changed (the engine's behaviour, the faults, or the scheduler) and must be looked at.
    // Last changed when a search that settled an operation inside the provider's lag started
    // asking for one more look after the lag, for a duplicate the index did not show yet (seed 7
    // keeps every invariant either way; the CI seeds pass).
    const SEED_7_TRACE_HASH: u64 = 0xfcbb_b683_8f86_6db3;
    let report = run_seed(7, &SimConfig::default());
    assert!(report.passed(), "{:?}", report.violations);
    assert_eq!(
        report.trace_hash, SEED_7_TRACE_HASH,
        "trace hash of seed 7: {:#018x}",
        report.trace_hash
    );
}
