//! The `opledger bench` command line: its targets, their flags and help texts. The product's
//! parser takes them as they are (`opledger bench …`), so what people type and read stays one
//! definition.

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub target: BenchTarget,
}

#[derive(Debug, Subcommand)]
pub enum BenchTarget {
    /// Minimal lifecycles (intent, attempt started, succeeded) on a fresh SQLite file at several
    /// concurrencies, then a replay of the whole log; prints one `bench=…` line per measurement.
    Store(BenchStoreArgs),
    /// Replay an existing ledger file: read the whole log, decode every event and fold it into
    /// the totals read model; prints `bench=replay …`.
    Replay(BenchReplayArgs),
    /// Rebuild the SQLite read models from position 0 of an existing ledger file into a fresh
    /// temporary file (removed afterwards); prints `bench=projection-rebuild …`. With `--floor`,
    /// then writes the rebuilt rows again from memory into a file set up as a rebuild's is (SQLite
    /// alone: no log read, decode or fold) and prints `bench=projection-floor …` per sorter
    /// setting, with each table's and index's time per event.
    Projections(BenchProjectionsArgs),
    /// `opledger serve --db FILE` from process start: to `/healthz` ready, to the first due
    /// operation driven, and its peak RSS; prints `bench=startup events=… ready_ms=…
    /// first_drive_ms=… max_rss_mb=…`. The read models beside the file are caught up first
    /// (untimed): the measurement is a restart, not a first start.
    Startup(BenchStartupArgs),
    /// Erasure of one data subject: records --operations intents under one subject on a fresh
    /// SQLite ledger (untimed beyond its own line), then erases the subject (the event, every
    /// open operation to review, the key destroyed); prints `bench=erase operations=…
    /// record_s=… erase_ms=…`.
    Erase(BenchEraseArgs),
    /// The HTTP service end to end: record + execute against the CRM stand on loopback, at each
    /// concurrency; prints `bench=http concurrency=… operations=… ops_per_s=… p50_ms=… p99_ms=…`.
    /// Without --url it starts the stand and `opledger serve` itself on a fresh ledger file.
    Http(BenchHttpArgs),
    /// A crash soak with real processes: the CRM stand here, `opledger serve` as a child on a
    /// fresh SQLite ledger, a burst of record-and-execute calls from several clients, SIGKILL at
    /// a seeded random moment, a restart on the same file — repeated. After each cycle every
    /// acknowledged operation must be there under its id, a redelivery must map to it, and once
    /// settled no request may have two objects at the stand; prints `bench=soak cycles=…
    /// acknowledged=… lost=… duplicates=… redeliveries_mismatched=… unsettled=… wall_s=…` and
    /// exits 1 naming the operations when a check fails.
    Soak(BenchSoakArgs),
    /// The floor under `serve`, for the peers' harness: serves `POST /v1/operations` doing only
    /// the two durable appends of the SQLite store (intent with claim, then outcome) around the
    /// send to --provider-url, with the service's own HTTP stacks and no read models, engine or
    /// hash chain. Prints `opledger bench floor: listening on http://…`; runs until Ctrl-C or SIGTERM. A
    /// bound to measure `serve` against, not a ledger: a re-sent source_id is refused.
    Floor(BenchFloorArgs),
    /// The transparency log of an existing ledger file: inclusion proofs of random positions
    /// against its whole tree, as `opledger prove` and /v1/log/proof/inclusion make them (the
    /// stored hashes read, the proof built), then the tree rebuilt from the log (every event
    /// read, leaf-hashed and folded); prints `bench=prove samples=… tree_size=… p50_us=…
    /// p99_us=… max_us=…` and `bench=tree-rebuild events=… events_per_s=…`.
    Proofs(BenchProofsArgs),
}

#[derive(Debug, Args)]
pub struct BenchProofsArgs {
    /// The ledger file (left as it is).
    #[arg(long)]
    pub db: PathBuf,
    /// Inclusion proofs to make, at positions spread over the whole log.
    #[arg(long, default_value_t = 10_000)]
    pub samples: u32,
}

#[derive(Debug, Args)]
pub struct BenchFloorArgs {
    /// Where each operation is sent: the provider's full URL, e.g. the peers' stub CRM at
    /// http://127.0.0.1:PORT/keyed/bench/tasks. The answer's `id` is the new object's id.
    #[arg(long)]
    pub provider_url: String,
    /// The address to serve on.
    #[arg(long, default_value_t = crate::floor::DEFAULT_LISTEN)]
    pub listen: std::net::SocketAddr,
    /// The ledger file to create (it must not exist; default: a fresh file in the temporary
    /// directory, removed at exit).
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Write no ledger at all: only receive, send to the provider and answer (the two HTTP
    /// hops alone). A re-sent source_id is then sent again.
    #[arg(long)]
    pub without_ledger: bool,
}

#[derive(Debug, Args)]
pub struct BenchEraseArgs {
    /// Operations recorded under the subject.
    #[arg(long, default_value_t = 10_000)]
    pub operations: u32,
}

#[derive(Debug, Args)]
pub struct BenchHttpArgs {
    /// Operations (record + execute) per concurrency level.
    #[arg(long, default_value_t = 5_000)]
    pub operations: u32,
    /// Concurrency levels to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    pub concurrency: Vec<u32>,
    /// A running server to drive (default: start one here).
    #[arg(long)]
    pub url: Option<String>,
    /// A tenant token of that server.
    #[arg(long, env = "OPLEDGER_TOKEN")]
    pub token: Option<String>,
    /// The provider to send to (with --url).
    #[arg(long, default_value = "crm")]
    pub provider: String,
    /// The account at that provider (with --url).
    #[arg(long, default_value = "demo")]
    pub account: String,
    /// Record and execute in one call (`POST /v1/operations?execute=true`) instead of two.
    #[arg(long)]
    pub one_call: bool,
    /// Subscribe one outcome webhook (a receiver started here that answers 200 at once) to
    /// `succeeded`, and print after each level its deliveries per second and how long after
    /// the level's last operation it had delivered everything (not with --url).
    #[arg(long)]
    pub webhook: bool,
    /// Record every operation with a data subject (one of 1,000) and personal data on, every
    /// argument sealed (not with --url): compare with a run without it.
    #[arg(long)]
    pub personal: bool,
    /// Keep no transparency-log tree in the server started here (not with --url): compare with
    /// a run with it, to measure what maintaining the tree costs each append.
    #[arg(long)]
    pub no_tree: bool,
}

#[derive(Debug, Args)]
pub struct BenchSoakArgs {
    /// Kill-and-restart cycles.
    #[arg(long, default_value_t = 200)]
    pub cycles: u32,
    /// Concurrent clients in each burst.
    #[arg(long, default_value_t = 8)]
    pub clients: u32,
    /// The seed of the kill moments, the faults and the requests' mix (default: from the clock;
    /// printed, so a run can be repeated — its timing, and so what a kill hits, cannot).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where the ledger goes: a file that does not exist yet, or a directory to make a fresh one
    /// in (default: a fresh directory in the temporary directory, removed after a clean run).
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// The earliest moment of the kill after a burst starts, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub kill_after_ms_min: u64,
    /// The latest moment of the kill after a burst starts, in milliseconds. A burst is killed
    /// earlier when its seeded request budget is spent (the run's total stays within what the
    /// stand holds), so that every client is busy up to the kill.
    #[arg(long, default_value_t = 1_500)]
    pub kill_after_ms_max: u64,
    /// Every how many cycles the stand injects faults during the burst (lost responses, 5xx
    /// after its commit), so some outcomes are unknown before the kill too; 0: never.
    #[arg(long, default_value_t = 3)]
    pub fault_every: u32,
    /// How long a cycle may take to settle (every operation terminal or waiting for a person)
    /// after the restart, in milliseconds; what is still open then is counted `unsettled`.
    #[arg(long, default_value_t = 30_000)]
    pub settle_ms_max: u64,
}

#[derive(Debug, Args)]
pub struct BenchReplayArgs {
    /// The ledger file to replay (left as it is).
    #[arg(long)]
    pub db: PathBuf,
}

#[derive(Debug, Args)]
pub struct BenchProjectionsArgs {
    /// The ledger file to rebuild the read models of (left as it is).
    #[arg(long)]
    pub db: PathBuf,
    /// After the rebuild, measure SQLite's floor for the same rows: write them again from memory
    /// (no log read, decode or fold), the indexes built with 0 and then 2 sorter threads.
    #[arg(long)]
    pub floor: bool,
}

#[derive(Debug, Args)]
pub struct BenchStoreArgs {
    /// Lifecycles per concurrency level.
    #[arg(long, default_value_t = 20_000)]
    pub operations: u32,
    /// Concurrency levels to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    pub concurrency: Vec<u32>,
    /// Where to put the benchmark's ledger (default: a fresh file in a temporary directory).
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// A PostgreSQL database to put the ledger in instead of a file
    /// (`postgres://user@host:5432/database`, the password from the URL or `PGPASSWORD`); it
    /// must hold no ledger yet.
    #[arg(long, conflicts_with = "db")]
    pub store: Option<String>,
    /// Operations per thousand left open instead of succeeding, in turn: a due send, an attempt
    /// in flight (its lease runs out 30 s later), an unknown outcome due for a lookup, one
    /// awaiting approval, one in review — for `bench startup`. They name the embedded default's
    /// provider `crm` and account `demo`, so `opledger serve --db FILE` can drive them.
    #[arg(long, default_value_t = 0)]
    pub open_per_mille: u32,
    /// Keep no transparency-log tree (nor the tenants' trees) in the benchmark's SQLite file:
    /// compare with a run with it, to measure what maintaining the trees costs the store alone.
    #[arg(long, conflicts_with = "store")]
    pub no_tree: bool,
}

#[derive(Debug, Args)]
pub struct BenchStartupArgs {
    /// The ledger to start on (written by `bench store`). The benchmark's drives append to it.
    #[arg(long)]
    pub db: PathBuf,
    /// How long to keep the server running after its first drive before reading its peak
    /// memory, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    pub settle_ms: u64,
    /// Start another opledger build's `serve` instead of this one's (to measure before a
    /// change). Its read models are left as they are: start it once first to catch them up.
    #[arg(long)]
    pub server_exe: Option<PathBuf>,
}
