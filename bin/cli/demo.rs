//! The product against stand-ins: `demo`, `sim` and the CRM `stand`.

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Where to write the demo ledger (default: a fresh file in a temporary directory).
    #[arg(long)]
    pub db: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SimArgs {
    /// How many seeds to run (at least 1).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    pub from: u64,
    /// Operations per seed, from 1 to the simulator's limit (`opledger_sim::MAX_OPS`).
    #[arg(
        long,
        default_value_t = opledger_sim::DEFAULT_OPS,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
            .range(1..=opledger_sim::MAX_OPS as u64)
    )]
    pub ops: usize,
}

#[derive(Debug, Args)]
pub struct StandArgs {
    /// The loopback address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8787")]
    pub listen: String,
    /// How long a keyed Idempotency-Key is remembered, in seconds of the stand's clock.
    #[arg(long, default_value_t = 86_400)]
    pub key_retention_s: u64,
    /// How long a plain task stays invisible to search, in milliseconds of the stand's clock.
    #[arg(long, default_value_t = 2_000)]
    pub search_lag_ms: u64,
}
