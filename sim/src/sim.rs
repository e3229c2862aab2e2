//! One seed's run: the world (store, provider, clock, faults), the processes with their real
//! engines, the workers' dispatch from the work queue, callers and people, and the scheduler
//! that picks the next step with the seed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use opledger_domain::app::{IntentRequest, Ledger};
use opledger_domain::contract::RetryPolicy;
use opledger_domain::engine::{Engine, EnginePolicy};
use opledger_domain::event::{OperationEvent, ReconciliationResult, ReviewDecision};
use opledger_domain::ids::{
    AccountId, ActionName, ActorId, AttemptId, IdempotencyKey, OperationId, ProviderId, SourceId,
    StreamVersion, TenantId, WorkerId,
};
use opledger_domain::ports::IdSource;
use opledger_domain::provider::{operation_label, BindingQuery, Providers};
use opledger_domain::state::Status;
use opledger_domain::store::{EventStore, LogStart, RecordedEvent, MAX_READ_BATCH};
use opledger_domain::verify::Verifier;

use crate::checker::Checker;
use crate::clock::SimClock;
use crate::executor::{Executor, Polled, TaskKind};
use crate::faults::{FaultClass, Faults};
use crate::provider::{
    ProviderShape, SimProvider, SimProviders, SIM_ACCOUNTS, SIM_ACTIONS, SIM_PROVIDER,
};
use crate::readmodel::{LogEvent, ReadModels};
use crate::rng::SimRng;
use crate::store::SimStore;
use crate::trace::Trace;
use crate::{SeedReport, SimConfig};

/// The lease the simulated workers take, in milliseconds: five times the client's timeout, so
/// only a stalled process (a clock jump) or a response late on purpose outlasts it.
pub const LEASE_MS: u64 = 10_000;
/// How long after the last arrival the safety phase goes on, in simulated milliseconds.
pub const SAFETY_TAIL_MS: i64 = 120_000;
/// The bound within which every operation must settle once faults are off (liveness), in
/// simulated milliseconds: the lookup budget (10 lookups, backoff capped at a minute), the
/// attempt budget and the longest Retry-After (10 minutes) fit in it several times.
pub const LIVENESS_BOUND_MS: i64 = 3 * 3600 * 1000;
/// The most scheduler steps one seed may take; a run that needs more is reported, not waited for.
pub const MAX_STEPS: u64 = 400_000;
/// How long a worker waits before driving an unchanged operation again, in simulated ms.
pub const REDRIVE_PAUSE_MS: i64 = 500;
/// The longest gap between two callers' arrivals, in simulated milliseconds.
pub const MAX_ARRIVAL_GAP_MS: u64 = 2_000;
/// One operation in this many asks for a person's approval before it may be sent.
pub const APPROVAL_ONE_IN: u64 = 8;

type SimEngine = Engine<SimStore, SimClock, SimIds, SimProviders>;

/// Ids and jitter from the seed (never for production: guessable by design).
#[derive(Clone, Debug)]
pub struct SimIds {
    rng: Arc<Mutex<SimRng>>,
}

impl SimIds {
    fn next(&self) -> u64 {
        self.rng
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .next_u64()
    }

    fn next_u128(&self) -> u128 {
        (u128::from(self.next()) << 64) | u128::from(self.next())
    }
}

impl IdSource for SimIds {
    fn new_operation_id(&self) -> OperationId {
        OperationId::from_uuid(uuid::Uuid::from_u128(self.next_u128()))
    }

    fn new_attempt_id(&self) -> AttemptId {
        AttemptId::from_uuid(uuid::Uuid::from_u128(self.next_u128()))
    }

    fn new_idempotency_key(&self) -> IdempotencyKey {
        IdempotencyKey::new(format!("opk_sim_{:032x}", self.next_u128()))
            .expect("a hex key is a valid idempotency key")
    }

    fn random_below(&self, bound: u64) -> u64 {
        self.next().checked_rem(bound).unwrap_or(0)
    }
}

struct Process {
    engine: Arc<SimEngine>,
    restarts: u32,
    busy: BTreeSet<OperationId>,
    last_driven: BTreeMap<OperationId, (i64, StreamVersion)>,
}

struct PlannedOp {
    id: OperationId,
    request: IntentRequest,
    arrival_ms: i64,
    arrived: bool,
}

/// One seed's world and scheduler.
pub(crate) struct Sim {
    seed: u64,
    config: SimConfig,
    rng: SimRng,
    clock: SimClock,
    faults: Faults,
    store: SimStore,
    provider: SimProvider,
    ids: SimIds,
    processes: Vec<Process>,
    executor: Executor,
    ops: Vec<PlannedOp>,
    read_models: ReadModels,
    checker: Checker,
    trace: Trace,
    steps: u64,
    crashes: u64,
    /// Approval tasks not yet finished.
    approvals_in_flight: usize,
}

impl Sim {
    pub(crate) fn new(seed: u64, config: &SimConfig) -> Self {
        let mut rng = SimRng::derived(seed, 0);
        let clock = SimClock::new();
        let faults = Faults::for_seed(seed);
        let store = SimStore::new(faults.clone());
        let key_retention_s = rng.between(120, 900);
        let shape = ProviderShape {
            key_retention_s,
            key_margin_s: rng.between(30, 60),
            search_lag_ms: rng.between(500, 5_000),
        };
        let provider = SimProvider::new(clock.clone(), faults.clone(), shape, LEASE_MS);
        let ids = SimIds {
            rng: Arc::new(Mutex::new(SimRng::derived(seed, 3))),
        };
        let mut sim = Self {
            seed,
            config: config.clone(),
            rng,
            clock,
            faults,
            store,
            provider,
            ids,
            processes: Vec::new(),
            executor: Executor::default(),
            ops: Vec::new(),
            read_models: ReadModels::default(),
            checker: Checker::default(),
            trace: Trace::new(config.keep_full_trace),
            steps: 0,
            crashes: 0,
            approvals_in_flight: 0,
        };
        for process in 0..config.processes.max(1) {
            let started = sim.start_process(process, 0);
            sim.processes.push(started);
        }
        sim.plan_operations();
        sim.trace.line(
            0,
            format!(
                "seed {seed}: {} ops, {} processes, key retention {} s (margin {} s), search lag {} ms",
                sim.ops.len(),
                sim.processes.len(),
                shape.key_retention_s,
                shape.key_margin_s,
                shape.search_lag_ms
            ),
        );
        sim
    }

    fn start_process(&self, process: usize, restarts: u32) -> Process {
        let ledger = Ledger::new(
            self.store.for_process(process),
            self.clock.clone(),
            self.ids.clone(),
        );
        let policy = EnginePolicy {
            lease_ms: LEASE_MS,
            retry: RetryPolicy::default(),
            ..EnginePolicy::default()
        };
        let worker = WorkerId::new(format!("p{process}-r{restarts}")).expect("valid worker id");
        let engine = Engine::new(
            ledger,
            self.provider.for_process(self.clock.clone()),
            policy,
            worker,
        );
        Process {
            engine: Arc::new(engine),
            restarts,
            busy: BTreeSet::new(),
            last_driven: BTreeMap::new(),
        }
    }

    fn plan_operations(&mut self) {
        let mut at_ms = self.clock.now_ms();
        // A stream of its own, so the rest of the plan is drawn as it was before approvals.
        let mut approvals = SimRng::derived(self.seed, 4);
        for index in 0..self.config.ops {
            let (account, tenant) = SIM_ACCOUNTS[self.rng.index(SIM_ACCOUNTS.len())];
            let (action, _, _) = SIM_ACTIONS[self.rng.index(SIM_ACTIONS.len())];
            let source = format!("src-{}-{index}", self.seed);
            let tenant_id = TenantId::new(tenant).expect("valid");
            let id =
                OperationId::for_source(&tenant_id, &SourceId::new(source.clone()).expect("valid"));
            self.faults.name(id, index);
            at_ms += i64::try_from(self.rng.below(MAX_ARRIVAL_GAP_MS)).unwrap_or(0);
            self.ops.push(PlannedOp {
                id,
                request: IntentRequest {
                    tenant: tenant.into(),
                    owner: Some("agent".into()),
                    provider: SIM_PROVIDER.into(),
                    account: account.into(),
                    credential_fingerprint: "unbound".into(),
                    action: action.into(),
                    args: serde_json::json!({"title": format!("task {index}"), "n": index}),
                    source_id: Some(source),
                    requires_approval: approvals.below(APPROVAL_ONE_IN) == 0,
                },
                arrival_ms: at_ms,
                arrived: false,
            });
        }
    }

    /// Moves the clock forward by `by_ms`; requests in transit arrive on their own time first.
    fn advance(&mut self, by_ms: u64) {
        let to = self.clock.now_ms() + i64::try_from(by_ms).unwrap_or(i64::MAX / 4);
        self.advance_to(to);
    }

    fn advance_to(&mut self, to_ms: i64) {
        for line in self.provider.deliver_late(to_ms) {
            self.line(line);
        }
        self.clock.advance_to(to_ms);
    }

    fn line(&mut self, text: String) {
        self.trace.line(self.clock.elapsed_ms(), text);
    }

    /// Runs both phases and the end checks.
    pub(crate) fn run(&mut self) {
        self.run_phase(false);
        self.faults.disable();
        self.line("liveness phase: faults off; callers redeliver what was never recorded".into());
        for index in 0..self.ops.len() {
            if self.checker.status_of(self.ops[index].id).is_none() {
                let process = self.rng.index(self.processes.len());
                self.spawn_client(index, process);
            }
        }
        self.run_phase(true);
        self.end_checks();
    }

    fn run_phase(&mut self, liveness: bool) {
        let last_arrival = self.ops.last().map_or(0, |op| op.arrival_ms);
        let deadline = if liveness {
            self.clock.now_ms() + LIVENESS_BOUND_MS
        } else {
            last_arrival + SAFETY_TAIL_MS
        };
        loop {
            self.steps += 1;
            if self.steps > MAX_STEPS {
                self.checker
                    .record(format!("the run took more than {MAX_STEPS} steps"));
                return;
            }
            self.observe();
            if !self.checker.violations().is_empty() && !self.config.continue_after_violation {
                return;
            }
            let now = self.clock.now_ms();
            if liveness && self.executor.is_empty() && self.all_settled() {
                return;
            }
            if now >= deadline {
                if liveness {
                    self.report_unsettled();
                }
                return;
            }
            if !liveness {
                self.inject_faults();
            } else if self.approvals_in_flight == 0 && self.any_awaiting_approval() {
                // Faults, and with them the approval decisions, are off: a person decides each
                // operation still waiting, one at a time.
                self.spawn_approval();
            }
            self.act(liveness);
        }
    }

    fn all_settled(&self) -> bool {
        self.ops
            .iter()
            .all(|op| self.checker.status_of(op.id).is_some_and(settled))
    }

    fn report_unsettled(&mut self) {
        for index in 0..self.ops.len() {
            let status = self
                .checker
                .status_of(self.ops[index].id)
                .map_or("never recorded", Status::name);
            if !self
                .checker
                .status_of(self.ops[index].id)
                .is_some_and(settled)
            {
                self.checker.record(format!(
                    "op{index}: not settled within {} s of the liveness phase: {status}",
                    LIVENESS_BOUND_MS / 1000
                ));
            }
        }
    }

    /// Takes in what happened in the last step: late arrivals, fault notes, new events and
    /// sends; checks every invariant that can be checked step by step.
    fn observe(&mut self) {
        for line in self.provider.deliver_late(self.clock.now_ms()) {
            self.line(line);
        }
        for note in self.faults.take_notes() {
            self.line(note);
        }
        let events = self.read_models.catch_up(self.store.inner());
        for logged in &events {
            let text = describe(&self.faults, logged);
            self.line(text);
        }
        self.checker
            .check_events(&events, &self.provider, &self.faults);
        let sends_before = self.provider_sends_seen();
        self.checker.check_sends(&self.provider, &self.faults);
        for send in self.provider.sends_from(sends_before) {
            let op = self.faults.op_name(send.operation_id);
            self.line(format!(
                "provider: received {op} attempt {}",
                short(&send.attempt_id.to_string())
            ));
        }
        self.checker.check_objects(&self.provider, &self.faults);
    }

    fn provider_sends_seen(&self) -> usize {
        self.checker.sends_checked()
    }

    /// Process-level faults, each drawn once per step.
    fn inject_faults(&mut self) {
        if self.faults.fire(FaultClass::Crash) {
            let process = self.rng.index(self.processes.len());
            self.crash(process, "fault: crash");
        }
        if self.faults.fire(FaultClass::ClockJump) {
            let by = self.faults.between(1_000, 3 * LEASE_MS);
            self.advance(by);
            self.line(format!("fault: the clock jumps {by} ms forward"));
        }
        if self.faults.fire(FaultClass::KeyAged) {
            let retention_ms = self.provider.shape().key_retention_s * 1000;
            let by = self.faults.between(retention_ms, 2 * retention_ms);
            self.advance(by);
            self.line(format!("fault: {by} ms pass, beyond every key's retention"));
        }
        if self.faults.fire(FaultClass::CredentialsRotated) {
            let (account, _) = SIM_ACCOUNTS[self.rng.index(SIM_ACCOUNTS.len())];
            let account = AccountId::new(account).expect("valid");
            let generation = self.provider.rotate(&account);
            self.line(format!("fault: credentials of {account} rotated to generation {generation}; the old ones are revoked"));
            if self.rng.below(2) == 0 {
                let process = self.rng.index(self.processes.len());
                self.crash(process, "restart to load the new credentials");
            }
        }
        if self.faults.fire_uncounted(FaultClass::Redelivery) {
            let arrived: Vec<usize> = (0..self.ops.len())
                .filter(|index| self.ops[*index].arrived)
                .collect();
            if !arrived.is_empty() {
                self.faults.count(FaultClass::Redelivery);
                let index = arrived[self.rng.index(arrived.len())];
                let process = self.rng.index(self.processes.len());
                self.line(format!("fault: source delivery of op{index} arrives again"));
                self.spawn_client(index, process);
            }
        }
        if self.faults.fire_uncounted(FaultClass::ReviewDecision) {
            self.spawn_review();
        }
        if self.faults.fire_uncounted(FaultClass::ApprovalDecision) {
            self.spawn_approval();
        }
    }

    fn act(&mut self, liveness: bool) {
        let now = self.clock.now_ms();
        let runnable = self.executor.runnable(now);
        let arrival = self
            .ops
            .iter()
            .position(|op| !op.arrived && op.arrival_ms <= now);
        let roll = self.rng.below(100);
        self.trace.mix(roll);
        if let Some(index) = arrival.filter(|_| runnable.is_empty() || roll < 8) {
            self.ops[index].arrived = true;
            let process = self.rng.index(self.processes.len());
            self.spawn_client(index, process);
            return;
        }
        if (roll < 20 || runnable.is_empty()) && self.dispatch() {
            return;
        }
        if !runnable.is_empty() && roll >= 3 {
            let task = runnable[self.rng.index(runnable.len())];
            self.trace.mix(task);
            self.poll(task);
            return;
        }
        if !runnable.is_empty() {
            let by = self.rng.between(1, 300);
            self.advance(by);
            return;
        }
        self.idle(liveness);
    }

    /// Nothing can run now: moves the clock to when something can.
    fn idle(&mut self, liveness: bool) {
        let now = self.clock.now_ms();
        let next_arrival = self
            .ops
            .iter()
            .filter(|op| !op.arrived)
            .map(|op| op.arrival_ms)
            .min();
        let next_due = self
            .read_models
            .queue()
            .next_due_at()
            .map(|at| at.timestamp_millis());
        let next = [
            self.executor.next_wake_ms(),
            next_arrival,
            next_due,
            self.provider.next_late_ms(),
        ]
        .into_iter()
        .flatten()
        .min();
        match next {
            Some(at) if at > now => self.advance_to(at),
            // Due, but skipped for now (driven moments ago): let the redrive pause pass.
            Some(_) => self
                .clock
                .advance(u64::try_from(REDRIVE_PAUSE_MS / 5).unwrap_or(100)),
            None if liveness => self.advance(60_000),
            None => self.advance(1_000),
        }
    }

    fn poll(&mut self, task: crate::executor::TaskId) {
        match self.executor.poll(task, &self.clock) {
            Polled::Waiting => {}
            Polled::Finished(kind, end) => {
                if let TaskKind::Approval { .. } = &kind {
                    self.approvals_in_flight = self.approvals_in_flight.saturating_sub(1);
                }
                if let TaskKind::Drive { process, op } = &kind {
                    let id = self.ops[*op].id;
                    if let Some(process) = self.processes.get_mut(*process) {
                        process.busy.remove(&id);
                    }
                }
                self.line(format!("done {kind}: {end}"));
            }
        }
    }

    /// The workers of each process look at the queue and start a drive for each due operation
    /// they own (and, as a fault, for those another process owns too).
    fn dispatch(&mut self) -> bool {
        let now = self.clock.now_ms();
        let due = self.read_models.queue().due(crate::clock::to_time(now), 64);
        let mut started = false;
        for (id, work) in due {
            let Some(index) = self.faults.op_index(id) else {
                continue;
            };
            let version = self
                .read_models
                .state(id)
                .map_or(StreamVersion::FIRST, |(_, version)| *version);
            let owner = index % self.processes.len();
            let mut targets = vec![owner];
            let concurrent = self.processes.len() > 1
                && self.faults.fire_uncounted(FaultClass::ConcurrentWorkers);
            if concurrent {
                targets.extend((0..self.processes.len()).filter(|process| *process != owner));
            }
            for (n, process) in targets.into_iter().enumerate() {
                let worker = &mut self.processes[process];
                let unchanged = worker
                    .last_driven
                    .get(&id)
                    .is_some_and(|(at, seen)| *seen == version && now - at < REDRIVE_PAUSE_MS);
                if unchanged || worker.busy.contains(&id) {
                    continue;
                }
                worker.busy.insert(id);
                worker.last_driven.insert(id, (now, version));
                let engine = Arc::clone(&worker.engine);
                if n > 0 {
                    self.faults.count(FaultClass::ConcurrentWorkers);
                    self.line(format!("fault: p{process} drives op{index} too"));
                }
                self.line(format!("p{process} worker: {work:?} op{index}"));
                self.executor
                    .spawn(TaskKind::Drive { process, op: index }, async move {
                        match engine.drive(id).await {
                            Ok(report) => report.state().status.name().to_owned(),
                            Err(error) => format!("failed: {error}"),
                        }
                    });
                started = true;
            }
        }
        started
    }

    fn spawn_client(&mut self, index: usize, process: usize) {
        let engine = Arc::clone(&self.processes[process].engine);
        let mut request = self.ops[index].request.clone();
        // A caller gets the fingerprint from the configuration of the process it talks to,
        // as the API does when it records an intent.
        if let Some(fingerprint) = bound_fingerprint(&engine, &request) {
            request.credential_fingerprint = fingerprint;
        }
        self.line(format!(
            "p{process} caller: record and execute op{index} ({})",
            request.action
        ));
        self.executor
            .spawn(TaskKind::Client { process, op: index }, async move {
                match engine.record_and_drive(request).await {
                    Ok((recorded, report)) => {
                        let how = if recorded.created {
                            "recorded"
                        } else {
                            "found"
                        };
                        match report {
                            Ok(report) => format!("{how}, {}", report.state().status.name()),
                            Err(error) => format!("{how}, drive failed: {error}"),
                        }
                    }
                    Err(error) => format!("not recorded: {error}"),
                }
            });
    }

    /// The indexes of the operations whose state, as the checker folded the log, is `wanted`.
    fn ops_where(&self, wanted: impl Fn(&Status) -> bool) -> Vec<usize> {
        (0..self.ops.len())
            .filter(|index| {
                self.checker
                    .status_of(self.ops[*index].id)
                    .is_some_and(&wanted)
            })
            .collect()
    }

    fn any_awaiting_approval(&self) -> bool {
        self.ops.iter().any(|op| {
            matches!(
                self.checker.status_of(op.id),
                Some(Status::AwaitingApproval)
            )
        })
    }

    /// A person decides about an operation awaiting approval: approves the arguments as
    /// recorded (three times in four) or denies them. The decision is the ledger's alone; the
    /// workers send an approved operation when they find it due.
    fn spawn_approval(&mut self) {
        let waiting = self.ops_where(|status| *status == Status::AwaitingApproval);
        if waiting.is_empty() {
            return;
        }
        self.faults.count(FaultClass::ApprovalDecision);
        let index = waiting[self.rng.index(waiting.len())];
        let id = self.ops[index].id;
        let approve = self.rng.below(4) != 0;
        let process = self.rng.index(self.processes.len());
        let verb = if approve { "approves" } else { "denies" };
        self.line(format!("p{process} person: {verb} op{index}"));
        let engine = Arc::clone(&self.processes[process].engine);
        self.approvals_in_flight += 1;
        self.executor
            .spawn(TaskKind::Approval { process, op: index }, async move {
                let ledger = engine.ledger();
                let seen = match ledger.get(id).await {
                    Ok(seen) => seen,
                    Err(error) => return format!("cannot load: {error}"),
                };
                let args_hash = match (&seen.state.status, &seen.state.intent) {
                    (Status::AwaitingApproval, Some(intent)) => intent.args_hash.clone(),
                    (status, _) => return format!("nothing to decide: {}", status.name()),
                };
                let approver = ActorId::new("approver").expect("valid");
                let decided = if approve {
                    ledger.approve(id, approver, args_hash).await
                } else {
                    let reason = "simulated denial".to_owned();
                    ledger.deny(id, approver, args_hash, reason).await
                };
                match decided {
                    Ok(decided) => decided.state.status.name().to_owned(),
                    Err(error) => format!("refused: {error}"),
                }
            });
    }

    /// A person looks at an operation waiting for one (or still unknown), checks the provider
    /// by hand, and decides: confirm the object found, or retry or give up.
    fn spawn_review(&mut self) {
        let waiting =
            self.ops_where(|status| matches!(status, Status::NeedsReview | Status::Unknown));
        if waiting.is_empty() {
            return;
        }
        self.faults.count(FaultClass::ReviewDecision);
        let index = waiting[self.rng.index(waiting.len())];
        let id = self.ops[index].id;
        let account = AccountId::new(self.ops[index].request.account.clone()).expect("valid");
        let found = self
            .provider
            .objects_with_label(&operation_label(id))
            .into_iter()
            .find(|object| object.account == account)
            .map(|object| object.id);
        let accept = self.rng.below(2) == 0;
        let decision = match found {
            Some(external_id) => ReviewDecision::ConfirmSucceeded { external_id },
            None if self.rng.below(3) == 0 => ReviewDecision::Abandon,
            None => ReviewDecision::Retry,
        };
        let process = self.rng.index(self.processes.len());
        self.line(format!(
            "p{process} person: reviews op{index}: {decision:?}, duplicate risk accepted: {accept}"
        ));
        let engine = Arc::clone(&self.processes[process].engine);
        self.executor
            .spawn(TaskKind::Review { process, op: index }, async move {
                let seen = match engine.ledger().get(id).await {
                    Ok(seen) => seen,
                    Err(error) => return format!("cannot load: {error}"),
                };
                if !matches!(seen.state.status, Status::NeedsReview | Status::Unknown) {
                    return format!("nothing to decide: {}", seen.state.status.name());
                }
                let reviewer = ActorId::new("person").expect("valid");
                match engine
                    .resolve_review_seen(
                        seen,
                        reviewer,
                        None,
                        decision,
                        "simulated review".into(),
                        accept,
                    )
                    .await
                {
                    Ok(report) => report.state().status.name().to_owned(),
                    Err(error) => format!("refused: {error}"),
                }
            });
    }

    /// Process `process` crashes: its tasks stop where they are, its memory is gone, appends it
    /// had under way land or not; it restarts with the configuration as it is now. The read
    /// models are rebuilt from the store (and compared with the incremental fold first).
    fn crash(&mut self, process: usize, why: &str) {
        self.observe();
        let killed = self.executor.kill_process(process);
        let approvals_killed = killed
            .iter()
            .filter(|kind| matches!(kind, TaskKind::Approval { .. }))
            .count();
        self.approvals_in_flight = self.approvals_in_flight.saturating_sub(approvals_killed);
        let landed = self.store.crash_process(process);
        let restarts = self.processes[process].restarts + 1;
        self.processes[process] = self.start_process(process, restarts);
        self.crashes += 1;
        self.line(format!(
            "{why}: p{process} lost {} task(s); {landed} append(s) cut off landed; restarted as p{process}-r{restarts}",
            killed.len()
        ));
        self.observe();
        self.check_store();
        // The restarted process goes on from read models folded afresh from the store.
        self.read_models = self.rebuild_and_compare();
    }

    /// The read models rebuilt from the whole store, after recording a violation if the ones
    /// folded incrementally differ from them.
    fn rebuild_and_compare(&mut self) -> ReadModels {
        let (rebuilt, _) = ReadModels::rebuild(self.store.inner());
        if !self.read_models.same_as(&rebuilt) {
            self.checker
                .record("the read models folded incrementally differ from a rebuild".into());
        }
        rebuilt
    }

    /// The whole-store checks: every acknowledged append is there, the chain verifies.
    fn check_store(&mut self) {
        let all = read_everything(&self.store);
        let lost = self.store.lost_acknowledged(&all);
        if !lost.is_empty() {
            self.checker.record(format!(
                "{} acknowledged event(s) missing from the store, first {}",
                lost.len(),
                lost[0]
            ));
        }
        let mut verifier = Verifier::new(true);
        for event in &all {
            debug_assert!(
                !verifier.needs_history(event),
                "every stream is tracked in a run this small"
            );
            for finding in verifier.check(event) {
                self.checker
                    .record(format!("the hash chain does not verify: {finding}"));
            }
        }
    }

    fn end_checks(&mut self) {
        self.observe();
        self.check_store();
        self.rebuild_and_compare();
        for error in self.read_models.errors().to_vec() {
            self.checker
                .record(format!("a read model could not fold an event: {error}"));
        }
        self.checker
            .check_not_sent_honest(&self.provider, &self.faults);
    }

    pub(crate) fn report(&self) -> SeedReport {
        let mut outcomes: BTreeMap<&'static str, usize> = BTreeMap::new();
        for op in &self.ops {
            let status = self
                .checker
                .status_of(op.id)
                .map_or("never recorded", Status::name);
            *outcomes.entry(status).or_default() += 1;
        }
        SeedReport {
            seed: self.seed,
            ops: self.ops.len(),
            steps: self.steps,
            sim_ms: self.clock.elapsed_ms(),
            crashes: self.crashes,
            trace_hash: self.trace.hash(),
            faults: self.faults.counts(),
            violations: self.checker.violations().to_vec(),
            trace_tail: self.trace.tail(),
            full_trace: self.trace.full().map(<[String]>::to_vec),
            outcomes,
        }
    }

    pub(crate) fn panicked(&mut self, message: String) {
        self.line(format!("panic: {message}"));
        self.checker.record(format!("the run panicked: {message}"));
    }
}

/// Settled, for the liveness phase: succeeded, rejected, needs review, abandoned (or denied).
fn settled(status: &Status) -> bool {
    matches!(
        status,
        Status::Succeeded { .. }
            | Status::Rejected
            | Status::NeedsReview
            | Status::Abandoned
            | Status::Denied
    )
}

fn bound_fingerprint(engine: &SimEngine, request: &IntentRequest) -> Option<String> {
    let tenant = TenantId::new(request.tenant.clone()).ok()?;
    let provider = ProviderId::new(request.provider.clone()).ok()?;
    let account = AccountId::new(request.account.clone()).ok()?;
    let action = ActionName::new(request.action.clone()).ok()?;
    let binding = engine
        .providers()
        .bind(&BindingQuery {
            tenant: &tenant,
            provider: &provider,
            account: &account,
            action: &action,
        })
        .ok()?;
    Some(binding.credential_fingerprint.to_string())
}

fn read_everything(store: &SimStore) -> Vec<RecordedEvent> {
    let mut all: Vec<RecordedEvent> = Vec::new();
    loop {
        let start = all
            .last()
            .map_or(LogStart::Beginning, |last| LogStart::After(last.position));
        let batch = crate::block_on(store.inner().read_all(start, MAX_READ_BATCH))
            .expect("the memory store reads");
        let full = batch.len() == MAX_READ_BATCH;
        all.extend(batch);
        if !full {
            return all;
        }
    }
}

fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

fn describe(faults: &Faults, logged: &LogEvent) -> String {
    let op = faults.op_name(logged.operation_id);
    let detail = match &logged.event {
        OperationEvent::AttemptStarted(started) => format!(
            " #{} {} by {}",
            started.attempt_number,
            short(&started.attempt_id.to_string()),
            started.worker
        ),
        OperationEvent::AttemptSucceeded(succeeded) => format!(" {}", succeeded.external_id),
        OperationEvent::ReconciliationRecorded(recorded) => match &recorded.result {
            ReconciliationResult::Found { external_id, .. } => format!(" found {external_id}"),
            ReconciliationResult::NotFound { authoritative } => {
                format!(" not found (authoritative: {authoritative})")
            }
            ReconciliationResult::Inconclusive { reason } => format!(" inconclusive: {reason}"),
        },
        OperationEvent::ReviewRequired(review) => format!(": {}", review.reason),
        OperationEvent::ReviewResolved(resolved) => format!(" {:?}", resolved.decision),
        OperationEvent::LateResponseReceived(late) => format!(" {:?}", late.response),
        OperationEvent::DuplicateDetected(duplicate) => {
            format!(" {}", duplicate.duplicate_external_id)
        }
        OperationEvent::AttemptRejected(rejected) => format!(" {}", rejected.code),
        _ => String::new(),
    };
    format!(
        "ledger: {op} v{} {}{detail}",
        logged.version,
        logged.event.type_name()
    )
}
