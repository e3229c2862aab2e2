//! Several `opledger serve` instances sharing one ledger, each with its own read-model file fed
//! from the shared log, as a deployment runs them — and what each operation costs at the CRM
//! then. Every scenario runs twice: on KurrentDB (the protocol stand) and on PostgreSQL (a
//! database of its own on the binary's private cluster, `tests/postgres_server`).
//!
//! Every instance's workers see every due operation. A send is claimed with a conditional append
//! (one instance wins), and so is a lookup (`LookupClaimed`, with a lease), so neither is made
//! once per instance; a lookup claimed by an instance that dies is taken over by another once its
//! lease runs out. The numbers each test prints are the ones in the book's KurrentDB and PostgreSQL pages.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use opledger_crm_stand::{FaultKind, FaultMethod, LoggedRequest, Shape};
use opledger_kurrentdb_stand::KurrentDbStand;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::support::{Harness, Server, DEADLINE, TENANT_A_TOKEN};

/// Instances sharing the ledger, as in the measurement.
const INSTANCES: usize = 3;

/// The shared ledger a scenario runs on.
#[derive(Clone, Copy, Debug)]
enum Backend {
    KurrentDb,
    Postgres,
}

/// The running shared ledger, kept for the scenario's length.
enum SharedLedger {
    KurrentDb(KurrentDbStand),
    Postgres(String),
}

impl SharedLedger {
    async fn start(backend: Backend) -> Self {
        match backend {
            Backend::KurrentDb => Self::KurrentDb(
                KurrentDbStand::start()
                    .await
                    .expect("the KurrentDB stand starts"),
            ),
            Backend::Postgres => {
                let server = crate::postgres_server::server();
                Self::Postgres(server.url(&server.database()))
            }
        }
    }

    fn url(&self) -> String {
        match self {
            Self::KurrentDb(stand) => stand.connection_string(),
            Self::Postgres(url) => url.clone(),
        }
    }

    /// Appends refused for a version conflict, where the ledger counts them.
    fn conflicts(&self) -> String {
        match self {
            Self::KurrentDb(stand) => stand.version_conflicts().to_string(),
            Self::Postgres(_) => "not counted".into(),
        }
    }
}

/// One `#[tokio::test]` per backend for a scenario (multi-threaded: the KurrentDB stand lives on
/// the test's runtime and must answer while the test thread waits for the child processes).
macro_rules! on_both_ledgers {
    ($scenario:ident: $on_kurrentdb:ident, $on_postgres:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $on_kurrentdb() {
            $scenario(Backend::KurrentDb).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $on_postgres() {
            $scenario(Backend::Postgres).await;
        }
    };
}

/// Starts `INSTANCES` servers on the harness's ledger, each with its own read models.
fn start_instances(harness: &Harness) -> Vec<Server> {
    (0..INSTANCES)
        .map(|n| harness.serve_with(&harness.instance_config(n, &[])))
        .collect()
}

/// Records `count` operations of the keyed CRM, spread over the servers, for their workers to
/// send (nobody executes them); returns their ids.
async fn record_spread(servers: &[Server], count: usize, title: &str) -> Vec<String> {
    let mut ids = Vec::with_capacity(count);
    for n in 0..count {
        let server = &servers[n % servers.len()];
        let (status, recorded) = server
            .record(TENANT_A_TOKEN, "crm", &format!("{title} {n}"), None)
            .await;
        assert_eq!(status, StatusCode::CREATED, "{recorded}");
        ids.push(recorded["operation_id"].as_str().expect("an id").to_owned());
    }
    ids
}

/// The operation's history as the API answers it (read from the shared log).
async fn history(server: &Server, operation_id: &str) -> Value {
    let (status, body) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{operation_id}/events"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// The idempotency key the operation's intent froze: the stand logs every request with it.
async fn key_of(server: &Server, operation_id: &str) -> String {
    let body = history(server, operation_id).await;
    body["events"][0]["data"]["idempotency_key"]
        .as_str()
        .expect("the intent names its key")
        .to_owned()
}

/// What the stand received for one key: (creates, lookups).
fn requests_for(requests: &[LoggedRequest], key: &str) -> (usize, usize) {
    let of = |method: &str| {
        requests
            .iter()
            .filter(|request| request.method == method && request.key.as_deref() == Some(key))
            .count()
    };
    (of("POST"), of("GET"))
}

/// Creates and lookups the stand received per operation, in the order of `ids`.
async fn per_operation(
    harness: &Harness,
    server: &Server,
    ids: &[String],
) -> (Vec<usize>, Vec<usize>) {
    let requests = harness.admin.requests().await.expect("the request log");
    let mut sends = Vec::new();
    let mut lookups = Vec::new();
    for id in ids {
        let (creates, gets) = requests_for(&requests, &key_of(server, id).await);
        sends.push(creates);
        lookups.push(gets);
    }
    (sends, lookups)
}

on_both_ledgers!(once_each: three_instances_send_each_operation_once_and_look_each_unknown_one_up_once,
    three_instances_on_postgres_send_each_operation_once_and_look_each_unknown_one_up_once);

async fn once_each(backend: Backend) {
    const OPERATIONS: usize = 6;
    // Long enough that the other instances' read models show the operation unknown (and due)
    // while the first lookup is still out: without a claim, each of them looks it up too.
    const SLOW_LOOKUP_MS: u64 = 1_000;
    let ledger = SharedLedger::start(backend).await;
    let harness = Harness::with_store("", Some(ledger.url())).await;
    let servers = start_instances(&harness);
    // Every create applied with its answer lost: each operation becomes unknown, and the
    // lookup by key finds the task.
    let count = u32::try_from(OPERATIONS).expect("small");
    harness
        .fault(Shape::Keyed, FaultKind::DropResponse, count)
        .await;
    harness
        .fault_on(
            Shape::Keyed,
            FaultMethod::Get,
            FaultKind::LateResponse {
                delay_ms: SLOW_LOOKUP_MS,
            },
            count,
        )
        .await;
    let ids = record_spread(&servers, OPERATIONS, "shared").await;
    for id in &ids {
        let settled = servers[0]
            .wait_for_state(TENANT_A_TOKEN, id, &["succeeded"])
            .await;
        assert_eq!(settled["state"], "succeeded", "{settled}");
    }

    let (sends, lookups) = per_operation(&harness, &servers[0], &ids).await;
    // Contention, which the claims cost: appends that lost the race for a stream.
    let conflicts = ledger.conflicts();
    eprintln!(
        "{INSTANCES} instances on {backend:?}, {OPERATIONS} operations with lost answers: sends per operation {sends:?}, lookups per operation {lookups:?}, appends refused for a version conflict {conflicts}"
    );
    assert!(
        sends.iter().all(|&sends| sends == 1),
        "one send per operation: {sends:?}"
    );
    assert!(
        lookups.iter().all(|&lookups| lookups == 1),
        "one lookup per unknown operation, not one per instance: {lookups:?}"
    );
    assert_eq!(harness.objects().await.len(), OPERATIONS);
}

/// The worker named by each operation's latest `LookupClaimed`, once every operation has one.
async fn lookup_claimants(server: &Server, ids: &[String]) -> Vec<String> {
    let started = Instant::now();
    let mut claimants = Vec::with_capacity(ids.len());
    for id in ids {
        loop {
            let body = history(server, id).await;
            let claimed = body["events"]
                .as_array()
                .expect("events")
                .iter()
                .rev()
                .find(|event| event["type"] == "LookupClaimed")
                .map(|event| {
                    event["data"]["worker"]
                        .as_str()
                        .expect("a worker")
                        .to_owned()
                });
            if let Some(worker) = claimed {
                claimants.push(worker);
                break;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "operation {id} was never claimed for a lookup: {body}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    claimants
}

/// Waits until the stand has received at least one lookup for each of `keys`.
async fn await_lookups(harness: &Harness, keys: &[String]) {
    let started = Instant::now();
    loop {
        let requests = harness.admin.requests().await.expect("the request log");
        if keys.iter().all(|key| requests_for(&requests, key).1 >= 1) {
            return;
        }
        assert!(started.elapsed() < DEADLINE, "the lookups never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

on_both_ledgers!(lookup_takeover: a_killed_instances_claimed_lookups_are_taken_over_once_their_lease_runs_out,
    on_postgres_a_killed_instances_claimed_lookups_are_taken_over_once_their_lease_runs_out);

async fn lookup_takeover(backend: Backend) {
    const OPERATIONS: usize = 3;
    /// The harness's engine lease (`lease_ms`), which a lookup claim takes too.
    const LEASE_MS: u64 = 5_000;
    /// What a takeover may take beyond the lease: the survivors' next look at their queue, their
    /// read models' linger, the claim and the lookup itself.
    const PICKUP_MARGIN_MS: u64 = 3_000;
    let ledger = SharedLedger::start(backend).await;
    let harness = Harness::with_store("", Some(ledger.url())).await;
    let mut servers = start_instances(&harness);
    // The first lookup of each operation hangs until the request timeout (2 s): the window in
    // which its claimant is killed.
    let count = u32::try_from(OPERATIONS).expect("small");
    harness
        .fault(Shape::Keyed, FaultKind::DropResponse, count)
        .await;
    harness
        .fault_on(
            Shape::Keyed,
            FaultMethod::Get,
            FaultKind::LateResponse { delay_ms: 30_000 },
            count,
        )
        .await;
    let ids = record_spread(&servers, OPERATIONS, "killed").await;
    let mut keys = Vec::with_capacity(ids.len());
    for id in &ids {
        keys.push(key_of(&servers[0], id).await);
    }
    let claimants = lookup_claimants(&servers[0], &ids).await;
    await_lookups(&harness, &keys).await;

    // SIGKILL the instance holding the first operation's lookup, in the middle of it.
    let victim_worker = claimants[0].clone();
    let victim = servers
        .iter()
        .position(|server| victim_worker.starts_with(&format!("serve-{}-", server.pid())))
        .expect("the claimant is one of the instances");
    servers.remove(victim).kill();
    let killed_at = Instant::now();

    let mut pickup_ms: HashMap<String, u128> = HashMap::new();
    for (id, claimant) in ids.iter().zip(&claimants) {
        servers[0]
            .wait_for_state(TENANT_A_TOKEN, id, &["succeeded"])
            .await;
        if *claimant == victim_worker {
            pickup_ms.insert(id.clone(), killed_at.elapsed().as_millis());
        }
    }
    let (sends, lookups) = per_operation(&harness, &servers[0], &ids).await;
    eprintln!(
        "{INSTANCES} instances on {backend:?}, one SIGKILLed holding {} of {OPERATIONS} lookups: settled after the kill in {pickup_ms:?} ms (lease {LEASE_MS} ms); sends per operation {sends:?}, lookups per operation {lookups:?}",
        pickup_ms.len()
    );
    let bound = u128::from(LEASE_MS + PICKUP_MARGIN_MS);
    assert!(
        pickup_ms.values().all(|&ms| ms <= bound),
        "the killed instance's lookups were taken over within {bound} ms: {pickup_ms:?}"
    );
    assert!(
        sends.iter().all(|&sends| sends == 1),
        "one send per operation: {sends:?}"
    );
    // The hung first lookup, then one more (the takeover, or the survivor's own next round).
    assert!(
        lookups.iter().all(|&lookups| lookups == 2),
        "two lookups per operation, not one per instance: {lookups:?}"
    );
    assert_eq!(harness.objects().await.len(), OPERATIONS);
}

/// The worker named by the operation's first `AttemptStarted`, once there is one.
async fn sender_of(server: &Server, operation_id: &str) -> String {
    let started = Instant::now();
    loop {
        let body = history(server, operation_id).await;
        let sender = body["events"]
            .as_array()
            .expect("events")
            .iter()
            .find(|event| event["type"] == "AttemptStarted")
            .map(|event| {
                event["data"]["worker"]
                    .as_str()
                    .expect("a worker")
                    .to_owned()
            });
        if let Some(worker) = sender {
            return worker;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "operation {operation_id} was never claimed for a send: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

on_both_ledgers!(send_takeover: a_killed_instances_send_in_flight_is_swept_and_looked_up_once_by_the_others,
    on_postgres_a_killed_instances_send_in_flight_is_swept_and_looked_up_once_by_the_others);

async fn send_takeover(backend: Backend) {
    /// The harness's engine lease (`lease_ms`): how long the dead sender's claim holds.
    const LEASE_MS: u64 = 5_000;
    /// The survivors' next look at their queue, the sweep, the lookup's claim and the lookup.
    const PICKUP_MARGIN_MS: u64 = 3_000;
    let ledger = SharedLedger::start(backend).await;
    let harness = Harness::with_store("", Some(ledger.url())).await;
    let mut servers = start_instances(&harness);
    // The create is applied at once and its answer held past the request timeout (2 s): the
    // window in which the sender is killed, its attempt in flight. The plain CRM has no key, so
    // only a search (its lag long past by then) can tell what happened.
    harness
        .fault(
            Shape::Plain,
            FaultKind::LateResponse { delay_ms: 30_000 },
            1,
        )
        .await;
    let (status, recorded) = servers[1]
        .record(TENANT_A_TOKEN, "crm-plain", "sent by the dead", None)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    let id = recorded["operation_id"].as_str().expect("an id").to_owned();
    let sender = sender_of(&servers[0], &id).await;
    let started = Instant::now();
    while !harness
        .admin
        .requests()
        .await
        .expect("the request log")
        .iter()
        .any(|request| request.method == "POST")
    {
        assert!(
            started.elapsed() < DEADLINE,
            "the send never reached the CRM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let victim = servers
        .iter()
        .position(|server| sender.starts_with(&format!("serve-{}-", server.pid())))
        .expect("the sender is one of the instances");
    servers.remove(victim).kill();
    let killed_at = Instant::now();

    let settled = servers[0]
        .wait_for_state(TENANT_A_TOKEN, &id, &["succeeded"])
        .await;
    let pickup_ms = killed_at.elapsed().as_millis();
    let requests = harness.admin.requests().await.expect("the request log");
    let count = |method: &str| requests.iter().filter(|r| r.method == method).count();
    let body = history(&servers[0], &id).await;
    let types: Vec<&str> = body["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|event| event["type"].as_str().expect("a type"))
        .collect();
    eprintln!(
        "{INSTANCES} instances on {backend:?}, the sender SIGKILLed mid-send: settled {pickup_ms} ms after the kill (lease {LEASE_MS} ms); sends {}, lookups {}, history {types:?}",
        count("POST"),
        count("GET")
    );
    assert_eq!(settled["state"], "succeeded", "{settled}");
    assert!(
        pickup_ms <= u128::from(LEASE_MS + PICKUP_MARGIN_MS),
        "the dead sender's attempt was taken over within the lease and margin: {pickup_ms} ms"
    );
    assert_eq!(count("POST"), 1, "one send");
    // The search settled it: when that came inside the search's lag after the attempt's end (the
    // lease's expiry, 200 ms, which a fast pickup can beat), the look for a duplicate after the
    // lag follows. That look is not claimed (it can only add a duplicate found), so each
    // surviving instance may make it once; the claimed lookup is made once, whoever sweeps.
    let looks_after_the_lag = types
        .iter()
        .filter(|kind| **kind == "ReconciliationRecorded")
        .count()
        - 1;
    assert_eq!(
        types[..5],
        [
            "IntentRecorded",
            "AttemptStarted",
            "LeaseExpired",
            "LookupClaimed",
            "ReconciliationRecorded"
        ],
        "one sweep and one claimed lookup"
    );
    assert!(
        types[5..]
            .iter()
            .all(|kind| *kind == "ReconciliationRecorded")
            && looks_after_the_lag < INSTANCES,
        "at most one look after the lag per surviving instance: {types:?}"
    );
    assert!(
        (1..=INSTANCES).contains(&count("GET")),
        "one claimed lookup, and at most one look after the lag per surviving instance: {} lookups",
        count("GET")
    );
    assert_eq!(harness.objects().await.len(), 1);
}
