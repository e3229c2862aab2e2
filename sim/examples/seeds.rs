//! `cargo run -p opledger-sim --example seeds -- <seeds> [from]`: the library's seed runner
//! without the `opledger` binary (the mutation script uses it: it relinks in seconds). Prints
//! the summary line and `first_failing_seed=<seed|none>`.

use std::sync::atomic::AtomicBool;

use opledger_sim::{run_seeds, SimConfig};

fn main() {
    let mut args = std::env::args().skip(1);
    let seeds = args
        .next()
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(10_000);
    let from = args.next().and_then(|arg| arg.parse().ok()).unwrap_or(0);
    std::panic::set_hook(Box::new(|_| {}));
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let summary = run_seeds(
        from,
        seeds,
        &SimConfig::default(),
        threads,
        &AtomicBool::new(false),
        &|_, _| {},
    );
    let first = summary.failed.first();
    println!("{}", summary.line());
    match first {
        Some(report) => println!(
            "first_failing_seed={} ({})",
            report.seed,
            report.violations.join("; ")
        ),
        None => println!("first_failing_seed=none"),
    }
}
