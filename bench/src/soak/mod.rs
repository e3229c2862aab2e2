//! `opledger bench soak`: the crash soak with real processes.
//!
//! The CRM stand runs here, in this process: it is the external system, holding the ground
//! truth, and must outlive every server. `opledger serve` (this very binary) runs as a child on
//! a fresh SQLite ledger, with the stand's keyed and labelled shapes as connectors. Each cycle
//! is a burst of record-and-execute calls from several clients, a SIGKILL at a seeded random
//! moment while they are in flight, a restart on the same file, and the checks (`checks.rs`):
//! nothing acknowledged is lost, a redelivery finds its operation, everything settles once the
//! stand is fault-free, and no request has two objects at the stand.
//!
//! Files: `server.rs` the child process, `api.rs` the requests and the calls, `burst.rs` the
//! clients and the kill, `checks.rs` the checks. It never leaves a child running (the guard
//! kills it), and never asks the stand for more tasks than it holds (`MAX_TASKS`).

mod api;
mod burst;
mod checks;
mod server;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use opledger_crm_stand::{Fault, FaultKind, FaultMethod, Shape, Stand, StandAdmin, StandConfig};
use opledger_domain::error::ValidationError;

use self::api::{Api, ACCOUNT, ACCOUNT_TOKEN, CALL_TIMEOUT_MS, TENANT, TENANT_TOKEN};
use self::checks::Record;
use self::server::ServerProcess;
use crate::args::BenchSoakArgs;
use crate::BenchError;

/// Most cycles a run may ask for: each burst may still send [`MIN_CYCLE_REQUESTS`].
const MAX_CYCLES: u32 = 9_000;
/// Most clients per burst.
const MAX_CLIENTS: u32 = 256;
/// The latest kill moment a run may ask for, in milliseconds.
const MAX_KILL_AFTER_MS: u64 = 60_000;
/// The requests of a whole run, at most: the stand holds `MAX_TASKS` objects and is never
/// reset (its objects are the ground truth of every cycle), so a run stays well below it.
const MAX_RUN_REQUESTS: u32 = opledger_crm_stand::MAX_TASKS as u32 / 10 * 9;
/// Most requests of one burst: a cycle's checks read each of them a few times.
const MAX_CYCLE_REQUESTS: u32 = 2_000;
/// The fewest requests a burst may send, however many cycles share the run's budget.
const MIN_CYCLE_REQUESTS: u32 = 10;
/// Operations of earlier cycles read again after each restart.
const RECHECKED_PER_CYCLE: usize = 16;
/// The server's claim on a send: short, so a send the kill interrupted is swept to unknown,
/// looked up and settled soon after the restart; above the longest send, which serve takes to
/// be twice the request timeout (`Connector::longest_send_ms`).
const LEASE_MS: u64 = 2_500;
const REQUEST_TIMEOUT_MS: u64 = 1_000;

const _: () = assert!(2 * REQUEST_TIMEOUT_MS < LEASE_MS);
const _: () = assert!(MAX_CYCLE_REQUESTS <= MAX_RUN_REQUESTS);
const _: () = assert!(MAX_RUN_REQUESTS / MAX_CYCLES >= MIN_CYCLE_REQUESTS);

/// A small seeded generator (SplitMix64): the soak's choices repeat with the seed, and the
/// binary needs no random-number crate for them.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64().checked_rem(n).unwrap_or(0)
    }
}

/// The run's counts, and every failure with the operation and request it is about.
#[derive(Debug, Default)]
pub struct Tally {
    pub cycles: u32,
    pub requests: u64,
    /// First deliveries answered 2xx with an operation id.
    pub acknowledged: u64,
    /// Requests first left unanswered (the kill) that a redelivery after the restart answered.
    pub recovered: u64,
    /// First deliveries answered with something other than 2xx.
    pub refused: u64,
    /// Cycles whose kill found requests in flight, and how many in all.
    pub killed_mid_burst: u32,
    pub in_flight_at_kill: u64,
    /// Cycles killed when their request budget was spent, before their time.
    pub kills_at_budget: u32,
    /// Operations still open (in flight, unknown, pending) when delivered again right after
    /// the restart: the kill, or a fault, caught them before their outcome was recorded.
    pub interrupted: u64,
    pub needs_review: u64,
    pub fault_cycles: u32,
    pub lost: Vec<String>,
    pub duplicates: Vec<String>,
    pub mismatched: Vec<String>,
    pub unsettled: Vec<String>,
    pub wrong_outcomes: Vec<String>,
}

impl Tally {
    fn failure_count(&self) -> usize {
        self.lost.len()
            + self.duplicates.len()
            + self.mismatched.len()
            + self.unsettled.len()
            + self.wrong_outcomes.len()
    }

    /// The one result line.
    fn line(&self, clients: u32, seed: u64, wall: Duration) -> String {
        format!(
            "bench=soak cycles={} clients={clients} seed={seed} requests={} acknowledged={} \
             recovered={} refused={} killed_mid_burst={} in_flight_at_kill={} kills_at_budget={} interrupted={} \
             fault_cycles={} needs_review={} lost={} duplicates={} redeliveries_mismatched={} \
             unsettled={} wrong_outcomes={} wall_s={:.1}",
            self.cycles,
            self.requests,
            self.acknowledged,
            self.recovered,
            self.refused,
            self.killed_mid_burst,
            self.in_flight_at_kill,
            self.kills_at_budget,
            self.interrupted,
            self.fault_cycles,
            self.needs_review,
            self.lost.len(),
            self.duplicates.len(),
            self.mismatched.len(),
            self.unsettled.len(),
            self.wrong_outcomes.len(),
            wall.as_secs_f64(),
        )
    }

    /// Every failure, one per line, under the check it failed.
    fn failures(&self) -> String {
        let mut text = String::new();
        for (what, list) in [
            ("lost", &self.lost),
            ("duplicates", &self.duplicates),
            ("redeliveries mismatched", &self.mismatched),
            ("unsettled", &self.unsettled),
            ("wrong outcomes", &self.wrong_outcomes),
        ] {
            for failure in list {
                text.push_str(&format!("\n  {what}: {failure}"));
            }
        }
        text
    }
}

/// Where the run's files are, and whether the run made (and so removes) their directory.
struct Files {
    dir: PathBuf,
    ledger: PathBuf,
    config: PathBuf,
    log: PathBuf,
    made_dir: bool,
}

pub async fn run(args: BenchSoakArgs) -> Result<(), BenchError> {
    check(&args)?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64)
    });
    let files = files(args.db.as_deref())?;
    let stand = Stand::start(
        std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        StandConfig {
            accounts: vec![(ACCOUNT.to_owned(), ACCOUNT_TOKEN.to_owned())],
            ..StandConfig::default()
        },
    )
    .await
    .map_err(|error| BenchError::Other(format!("cannot start the CRM stand: {error}")))?;
    write_config(&files, &stand.base_url())?;
    eprintln!(
        "# soak: seed {seed}, ledger {}, server log {}, stand {}",
        files.ledger.display(),
        files.log.display(),
        stand.base_url()
    );
    let started = Instant::now();
    let mut tally = Tally::default();
    let result = tokio::select! {
        result = soak(&args, seed, &files, &stand, &mut tally) => result,
        _ = tokio::signal::ctrl_c() => Err(BenchError::Interrupted),
    };
    stand.shutdown().await;
    println!("{}", tally.line(args.clients, seed, started.elapsed()));
    result?;
    if tally.failure_count() > 0 {
        return Err(BenchError::Other(format!(
            "the soak failed (its files are kept in {}):{}",
            files.dir.display(),
            tally.failures()
        )));
    }
    if files.made_dir {
        let _ = std::fs::remove_dir_all(&files.dir);
    }
    Ok(())
}

fn check(args: &BenchSoakArgs) -> Result<(), BenchError> {
    let invalid = |field: &str, message: String| -> Result<(), BenchError> {
        Err(ValidationError::new(field, message).into())
    };
    if args.cycles == 0 || args.cycles > MAX_CYCLES {
        return invalid("--cycles", format!("use 1 to {MAX_CYCLES}"));
    }
    if args.clients == 0 || args.clients > MAX_CLIENTS {
        return invalid("--clients", format!("use 1 to {MAX_CLIENTS}"));
    }
    if args.kill_after_ms_max > MAX_KILL_AFTER_MS || args.kill_after_ms_min > args.kill_after_ms_max
    {
        return invalid(
            "--kill-after-ms-max",
            format!("use --kill-after-ms-min ≤ --kill-after-ms-max ≤ {MAX_KILL_AFTER_MS}"),
        );
    }
    Ok(())
}

/// The run's files: beside `db` (a file that must not exist yet, or a directory to put a fresh
/// one in), else in a fresh directory of their own.
fn files(db: Option<&Path>) -> Result<Files, BenchError> {
    let name = format!("opledger-soak-{}", uuid::Uuid::new_v4().simple());
    let (dir, ledger, made_dir) = match db {
        Some(dir) if dir.is_dir() => (dir.to_path_buf(), dir.join(format!("{name}.db")), false),
        Some(file) if file.exists() => {
            return Err(ValidationError::new(
                "--db",
                format!("{} exists; the soak needs a fresh ledger", file.display()),
            )
            .into())
        }
        Some(file) => {
            let dir = file
                .parent()
                .filter(|parent| !parent.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            (dir.to_path_buf(), file.to_path_buf(), false)
        }
        None => {
            let dir = std::env::temp_dir().join(&name);
            std::fs::create_dir(&dir).map_err(|error| {
                BenchError::Other(format!("cannot make {}: {error}", dir.display()))
            })?;
            (dir.clone(), dir.join("ledger.db"), true)
        }
    };
    let beside = |suffix: &str| {
        let mut path = ledger.clone().into_os_string();
        path.push(suffix);
        PathBuf::from(path)
    };
    Ok(Files {
        config: beside(".soak.toml"),
        log: beside(".serve.log"),
        dir,
        ledger,
        made_dir,
    })
}

/// The serve configuration: the ledger, one tenant, the stand's keyed and labelled shapes.
fn write_config(files: &Files, stand: &str) -> Result<(), BenchError> {
    let mut text = format!(
        r#"listen = "127.0.0.1:0"
store = "sqlite://{ledger}"

[engine]
lease_ms = {LEASE_MS}
workers = 8
backoff_base_ms = 50
backoff_max_ms = 500
max_attempts = 5
max_total_ms = 120000
max_reconciliations = 20

[[tenants]]
id = "{TENANT}"
token = "{TENANT_TOKEN}"
"#,
        ledger = files.ledger.display(),
    );
    for (id, preset) in [
        ("keyed", "crm-stand-keyed"),
        ("labelled", "crm-stand-labelled"),
    ] {
        text.push_str(&format!(
            r#"
[[connectors]]
id = "{id}"
preset = "{preset}"
base_url = "{stand}"
request_timeout_ms = {REQUEST_TIMEOUT_MS}
connect_timeout_ms = 500

[[connectors.accounts]]
id = "{ACCOUNT}"
tenants = ["{TENANT}"]
token = "{ACCOUNT_TOKEN}"
"#
        ));
    }
    std::fs::write(&files.config, text).map_err(|error| {
        BenchError::Other(format!("cannot write {}: {error}", files.config.display()))
    })
}

/// The cycles. Everything it starts is dropped with it: a Ctrl-C kills the server at once.
async fn soak(
    args: &BenchSoakArgs,
    seed: u64,
    files: &Files,
    stand: &Stand,
    tally: &mut Tally,
) -> Result<(), BenchError> {
    let soak = Soak {
        exe: std::env::current_exe()
            .map_err(|error| BenchError::Other(format!("cannot find this executable: {error}")))?,
        client: reqwest::Client::builder()
            .timeout(Duration::from_millis(CALL_TIMEOUT_MS))
            .build()
            .map_err(|error| BenchError::Other(format!("cannot build the HTTP client: {error}")))?,
        admin: stand
            .admin()
            .map_err(|error| BenchError::Other(format!("cannot reach the stand: {error}")))?,
        args,
        files,
        seed,
        budget_max: (MAX_RUN_REQUESTS / args.cycles).min(MAX_CYCLE_REQUESTS),
    };
    let mut rng = Rng::new(seed);
    let mut earlier: Vec<Record> = Vec::new();
    let mut server = soak.start().await?;
    for cycle in 1..=args.cycles {
        let mut records = soak.cycle(cycle, &mut server, &mut rng, tally).await?;
        let api = soak.api(&server);
        checks::recheck(&api, &sample(&earlier, &mut rng), tally).await;
        tally.cycles = cycle;
        earlier.append(&mut records);
    }
    // Once more over the whole run: no request gained a second object since its cycle.
    let mut whole = Tally::default();
    checks::stand(&soak.admin, &earlier, &mut whole).await?;
    for duplicate in whole.duplicates {
        if !tally.duplicates.contains(&duplicate) {
            tally.duplicates.push(duplicate);
        }
    }
    server.kill();
    Ok(())
}

/// What every cycle of a run shares.
struct Soak<'a> {
    exe: PathBuf,
    client: reqwest::Client,
    admin: StandAdmin,
    args: &'a BenchSoakArgs,
    files: &'a Files,
    seed: u64,
    /// The most requests one burst may send.
    budget_max: u32,
}

impl Soak<'_> {
    async fn start(&self) -> Result<ServerProcess, BenchError> {
        ServerProcess::start(&self.exe, &self.files.config, &self.files.log, &self.client).await
    }

    fn api(&self, server: &ServerProcess) -> Api {
        Api {
            client: self.client.clone(),
            base: server.base.clone(),
        }
    }

    /// One cycle: the burst and the kill, the restart (left in `server`), the checks; returns
    /// the cycle's records.
    async fn cycle(
        &self,
        cycle: u32,
        server: &mut ServerProcess,
        rng: &mut Rng,
        tally: &mut Tally,
    ) -> Result<Vec<Record>, BenchError> {
        let args = self.args;
        let faults = args.fault_every > 0 && cycle.is_multiple_of(args.fault_every);
        let span = args.kill_after_ms_max - args.kill_after_ms_min;
        let spare = u64::from(self.budget_max - MIN_CYCLE_REQUESTS);
        let plan = burst::Plan {
            run: format!("{:x}", self.seed),
            cycle,
            clients: args.clients,
            budget: MIN_CYCLE_REQUESTS + rng.below(spare + 1) as u32,
            kill_after: Duration::from_millis(args.kill_after_ms_min + rng.below(span + 1)),
            seed: self.seed,
        };
        if faults {
            queue_faults(&self.admin).await?;
            tally.fault_cycles += 1;
        }
        let started = Instant::now();
        let burst = burst::run(&self.api(server), server, &plan).await?;
        let progress = format!(
            "killed {} after {} ms with {} requests in flight, {} sent{}",
            if burst.killed_at_budget {
                "at its request budget"
            } else {
                "at its time"
            },
            burst.killed_after.as_millis(),
            burst.in_flight_at_kill,
            burst.sent.len(),
            if faults { ", stand faults on" } else { "" },
        );
        *server = self.start().await?;
        // Fault-free from here: what the faults and the kill left unknown is reconciled.
        self.admin.clear_faults().await.map_err(|error| {
            BenchError::Other(format!("cannot clear the stand's faults: {error}"))
        })?;
        let records = after_restart(&self.api(server), &self.admin, burst, args, tally).await?;
        eprintln!(
            "# cycle {cycle}/{}: {progress}; cycle {:.1} s; failures so far: {}",
            args.cycles,
            started.elapsed().as_secs_f64(),
            tally.failure_count(),
        );
        Ok(records)
    }
}

/// Tallies a burst and runs the checks after the restart; returns the cycle's records.
async fn after_restart(
    api: &Api,
    admin: &StandAdmin,
    burst: burst::Burst,
    args: &BenchSoakArgs,
    tally: &mut Tally,
) -> Result<Vec<Record>, BenchError> {
    if burst.killed_at_budget {
        tally.kills_at_budget += 1;
    }
    if burst.in_flight_at_kill > 0 {
        tally.killed_mid_burst += 1;
        tally.in_flight_at_kill += u64::from(burst.in_flight_at_kill);
    }
    let mut records: Vec<Record> = burst
        .sent
        .into_iter()
        .map(|(request, answer)| Record::new(request, answer))
        .collect();
    tally.requests += records.len() as u64;
    for record in &records {
        match record.first {
            api::Answer::Acked(_) => tally.acknowledged += 1,
            api::Answer::Refused { .. } => tally.refused += 1,
            api::Answer::Unanswered(_) => {}
        }
    }
    checks::presence(api, &mut records, tally).await;
    checks::redeliver(api, &mut records, tally).await;
    checks::settle(
        api,
        &mut records,
        Duration::from_millis(args.settle_ms_max),
        tally,
    )
    .await;
    tally.needs_review += records
        .iter()
        .filter(|record| {
            record
                .last
                .as_ref()
                .is_some_and(|view| view.state == "needs_review")
        })
        .count() as u64;
    checks::stand(admin, &records, tally).await?;
    Ok(records)
}

/// Faults for the burst's creates, so some outcomes are unknown before the kill: lost
/// responses on both shapes (applied, no answer) and a 503 after a keyed commit.
async fn queue_faults(admin: &StandAdmin) -> Result<(), BenchError> {
    let faults = [
        Fault::new(FaultKind::DropResponse)
            .shape(Shape::Keyed)
            .method(FaultMethod::Post)
            .times(2),
        Fault::new(FaultKind::ErrorAfterCommit {
            status: 503,
            retry_after_s: None,
        })
        .shape(Shape::Keyed)
        .method(FaultMethod::Post),
        Fault::new(FaultKind::DropResponse)
            .shape(Shape::Labelled)
            .method(FaultMethod::Put)
            .times(2),
    ];
    for fault in &faults {
        admin
            .queue_fault(fault)
            .await
            .map_err(|error| BenchError::Other(format!("cannot queue a stand fault: {error}")))?;
    }
    Ok(())
}

/// Up to [`RECHECKED_PER_CYCLE`] records of earlier cycles, chosen by the seed.
fn sample(earlier: &[Record], rng: &mut Rng) -> Vec<Record> {
    if earlier.is_empty() {
        return Vec::new();
    }
    (0..RECHECKED_PER_CYCLE.min(earlier.len()))
        .map(|_| earlier[rng.below(earlier.len() as u64) as usize].clone())
        .collect()
}
