//! One cycle's burst: `clients` tasks record-and-execute requests of their own until the kill,
//! and the kill itself (SIGKILL at the cycle's moment, whatever is in flight).
//!
//! The moment is the cycle's seeded time, or the moment its seeded request budget is spent,
//! whichever comes first. The budget keeps a run within what the stand can hold; killing when
//! it is spent (rather than letting the clients fall idle until the time) keeps every client
//! busy up to the kill, so the kill finds requests in every stage: being recorded, being sent
//! to the stand, having their outcome recorded. Clients pause a short seeded moment between
//! requests, so their requests do not move in step.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinSet;

use super::api::{Answer, Api, Request, BURST_WAIT_MS, PROVIDERS};
use super::server::ServerProcess;
use super::Rng;
use crate::BenchError;

/// The longest pause of a client between two requests, in milliseconds.
const THINK_MS_MAX: u64 = 5;

/// What the burst asks for.
pub struct Plan {
    /// Names every request's uid, so runs and cycles never repeat one.
    pub run: String,
    pub cycle: u32,
    pub clients: u32,
    /// Most requests the burst may send; the kill comes when they are.
    pub budget: u32,
    pub kill_after: Duration,
    pub seed: u64,
}

/// Every request sent, with its answer, and when the kill came with how much in flight.
pub struct Burst {
    pub sent: Vec<(Request, Answer)>,
    pub in_flight_at_kill: u32,
    pub killed_after: Duration,
    /// The kill came when the budget was spent, before the plan's time.
    pub killed_at_budget: bool,
}

/// Runs the burst against `server` and kills it at the plan's moment.
pub async fn run(api: &Api, server: &mut ServerProcess, plan: &Plan) -> Result<Burst, BenchError> {
    let stop = Arc::new(AtomicBool::new(false));
    let in_flight = Arc::new(AtomicU32::new(0));
    let issued = Arc::new(AtomicU32::new(0));
    let spent = Arc::new(Notify::new());
    let started = Instant::now();
    let mut clients = JoinSet::new();
    for client in 0..plan.clients {
        let client_loop = Client {
            api: api.clone(),
            stop: Arc::clone(&stop),
            in_flight: Arc::clone(&in_flight),
            issued: Arc::clone(&issued),
            spent: Arc::clone(&spent),
            budget: plan.budget,
            prefix: format!("{}-c{}-k{client}", plan.run, plan.cycle),
            rng: Rng::new(plan.seed ^ (u64::from(plan.cycle) << 32) ^ u64::from(client)),
        };
        clients.spawn(client_loop.run());
    }
    let killed_at_budget = tokio::select! {
        () = tokio::time::sleep(plan.kill_after) => false,
        () = spent.notified() => true,
    };
    let killed_after = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let in_flight_at_kill = in_flight.load(Ordering::SeqCst);
    server.kill();
    let mut sent = Vec::new();
    while let Some(joined) = clients.join_next().await {
        let part =
            joined.map_err(|error| BenchError::Other(format!("a soak client failed: {error}")))?;
        sent.extend(part);
    }
    Ok(Burst {
        sent,
        in_flight_at_kill,
        killed_after,
        killed_at_budget,
    })
}

struct Client {
    api: Api,
    stop: Arc<AtomicBool>,
    in_flight: Arc<AtomicU32>,
    issued: Arc<AtomicU32>,
    /// Told when the budget's last request is taken; it is sent, and in flight at the kill.
    spent: Arc<Notify>,
    budget: u32,
    prefix: String,
    rng: Rng,
}

impl Client {
    async fn run(mut self) -> Vec<(Request, Answer)> {
        let mut sent = Vec::new();
        while !self.stop.load(Ordering::SeqCst) {
            let number = self.issued.fetch_add(1, Ordering::SeqCst);
            if number >= self.budget {
                break;
            }
            if number + 1 == self.budget {
                // A permit is kept if the burst is not waiting yet.
                self.spent.notify_one();
            }
            let request = Request {
                uid: format!("{}-{}", self.prefix, sent.len()),
                provider: PROVIDERS[self.rng.below(PROVIDERS.len() as u64) as usize],
                by_header: self.rng.below(2) == 0,
            };
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            let answer = self.api.record(&request, BURST_WAIT_MS).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            sent.push((request, answer));
            let think = self.rng.below(THINK_MS_MAX + 1);
            tokio::time::sleep(Duration::from_millis(think)).await;
        }
        sent
    }
}
