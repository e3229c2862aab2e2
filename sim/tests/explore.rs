//! Scratch: `SIM_SEEDS=20 cargo test -p opledger-sim --test explore -- --nocapture`.
use opledger_sim::{run_seed, SimConfig};

#[test]
fn explore() {
    let seeds: u64 = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let from: u64 = std::env::var("SIM_FROM")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let started = std::time::Instant::now();
    let mut failed = 0;
    for seed in from..from + seeds {
        let report = run_seed(seed, &SimConfig::default());
        if !report.passed() {
            failed += 1;
            if failed <= 3 {
                println!("seed {seed} FAILED: {:?}", report.violations);
                for line in &report.trace_tail {
                    println!("  {line}");
                }
            }
        }
        println!(
            "seed {seed}: steps={} sim={}s crashes={} outcomes={:?} faults={}",
            report.steps,
            report.sim_ms / 1000,
            report.crashes,
            report.outcomes,
            report.faults.summary()
        );
    }
    println!("{seeds} seeds, {failed} failed, {:?}", started.elapsed());
}
