//! The PostgreSQL store on a real server (a private cluster this binary starts,
//! `tests/postgres_server`): what the conformance suite cannot show with one store handle.
//!
//! - many writers on several instances while subscribers follow: every subscriber's sequence
//!   is the final log, no gap, no repeat, in every run (the store's central promise);
//! - the schema: created once by instances starting together, a newer one refused and left;
//! - start-up refusals, one sentence each: a wrong URL, an unreachable server, wrong or missing
//!   credentials (and `PGPASSWORD`), a missing database;
//! - a TCP proxy between the store and the server that cuts the connection at COMMIT: the
//!   append's outcome is learnt from the database, never acknowledged unless stored, never
//!   written twice; a server that goes away answers "unavailable" and the store recovers;
//! - a statement timeout, so a lock held elsewhere cannot hold an append for ever; a client
//!   deadline on every round trip, so a silent network path cannot either (`deadlines.rs`);
//! - a failover to a synchronous standby under load, on a multi-host URL: no restart, no
//!   acknowledged append lost, nothing written to the old primary when it comes back
//!   (`failover.rs`);
//! - a reconnection to an older copy of the ledger or another ledger is refused
//!   (`identity.rs`);
//! - `opledger migrate` with an owner role, `serve` with a DML-only role refused on an old schema
//!   and running once it is migrated, a tree built for a log from before it (`migrate.rs`);
//! - PgBouncer in transaction mode refused at start with the reason (`pooler.rs`);
//! - the transparency log's tree follows the log under many writers, and every tampering of the
//!   database is caught by `verify --against` a kept checkpoint and by a witness
//!   (`transparency_log.rs`);
//! - the data subjects' key table: one key per subject when two instances make it at once, and a
//!   destroyed key gone from every file of the database, not only from its row
//!   (`subject_keys.rs`);
//! - another instance's commit wakes a subscriber through LISTEN/NOTIFY, not its poll;
//! - a group commit costs the same few round trips to the server whatever its size, counted by
//!   the proxy (the position lock is held for those round trips, so they are the store's limit).

#[path = "approved_operations/mod.rs"]
mod approved_operations;
mod postgres_server;

#[path = "postgres/deadlines.rs"]
mod deadlines;
#[path = "postgres/failover.rs"]
mod failover;
#[path = "postgres/identity.rs"]
mod identity;
#[path = "postgres/migrate.rs"]
mod migrate;
#[path = "postgres/pooler.rs"]
mod pooler;
#[path = "postgres/subject_keys.rs"]
mod subject_keys;
#[path = "postgres/transparency_log.rs"]
mod transparency_log;

use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use opledger_domain::ids::{EventId, GlobalPosition, StreamVersion};
use opledger_domain::merkle;
use opledger_domain::store::{
    EventData, EventStore, ExpectedVersion, LogStart, RecordedEvent, StoreError, StreamName,
    Subscription, MAX_READ_BATCH,
};
use opledger_postgres::{
    PostgresConfig, PostgresError, MAX_SUBSCRIPTION_POLL_MS, PASSWORD_VAR,
    ROUND_TRIPS_PER_CHECKED_COMMIT, ROUND_TRIPS_PER_COMMIT,
};
use opledger_store::PostgresStore;
use tokio::sync::watch;

use postgres_server::proxy::{Mode, Proxy};
use postgres_server::{server, tls_server};

/// Guards every wait against a hang; no test relies on it for ordering.
const WAIT_LIMIT: Duration = Duration::from_secs(60);

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT_LIMIT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out after {WAIT_LIMIT:?}: {what}"))
}

fn stream(name: &str) -> StreamName {
    StreamName::new(name).expect("a valid stream name")
}

fn event(n: u128) -> EventData {
    EventData {
        event_id: EventId::from_uuid(uuid::Uuid::from_u128(n)),
        event_type: "Tested".into(),
        data: format!("{{\"n\":{n}}}").into_bytes(),
        metadata: b"{\"schema\":1}".to_vec(),
    }
}

fn ids(events: &[RecordedEvent]) -> Vec<EventId> {
    events.iter().map(|event| event.event_id).collect()
}

async fn connect(url: &str) -> PostgresStore {
    PostgresStore::connect(url)
        .await
        .expect("connect to the test PostgreSQL")
}

/// A store on a fresh database, and that database's name.
async fn fresh_store() -> (PostgresStore, String) {
    let database = server().database();
    (connect(&server().url(&database)).await, database)
}

async fn whole_log(store: &PostgresStore) -> Vec<RecordedEvent> {
    let mut log = Vec::new();
    let mut start = LogStart::Beginning;
    loop {
        let page = store
            .read_all(start, MAX_READ_BATCH)
            .await
            .expect("read the log");
        let Some(last) = page.last() else { return log };
        start = LogStart::After(last.position);
        log.extend(page);
    }
}

/// The tenants' map the log's events make, grown as the book specifies (each event in its
/// stream's tenant's tree, the tenant named by the intent that opens the stream).
fn tenant_map_of(log: &[RecordedEvent]) -> merkle::tenants::TenantMap {
    let mut tenants = std::collections::HashMap::new();
    let mut trees = merkle::tenants::TenantTrees::new();
    for event in log {
        if event.version == StreamVersion::FIRST {
            tenants.insert(
                event.stream.clone(),
                merkle::tenants::tenant_of_first_event(&event.event_type, &event.data),
            );
        }
        if let Some(Some(tenant)) = tenants.get(&event.stream) {
            trees.push(
                tenant,
                event.position.value(),
                merkle::leaf_hash(&event.view()),
            );
        }
    }
    trees.map()
}

/// The tenants' trees the store keeps are the ones its log makes, and cover its whole tree.
async fn assert_the_tenant_trees_are_the_logs(store: &PostgresStore) {
    use opledger_domain::merkle::LogTree;
    let log = whole_log(store).await;
    let stored = store
        .tenant_heads()
        .await
        .expect("reads")
        .expect("the tenant trees cover the log's tree");
    assert_eq!(stored.log_size, log.len() as u64);
    assert_eq!(stored.map, tenant_map_of(&log));
}

/// An intent of `tenant` as the tenant trees read it (the first event of its stream).
fn intent_of(tenant: &str, n: u128) -> EventData {
    EventData {
        event_id: EventId::from_uuid(uuid::Uuid::from_u128(n)),
        event_type: "IntentRecorded".into(),
        data: format!("{{\"tenant\":\"{tenant}\",\"n\":{n}}}").into_bytes(),
        metadata: b"{\"schema\":1}".to_vec(),
    }
}

async fn whole_stream(store: &PostgresStore, name: &StreamName) -> Vec<RecordedEvent> {
    store
        .read_stream(name, StreamVersion::FIRST, MAX_READ_BATCH)
        .await
        .expect("read the stream")
}

// ----- global positions under concurrent writers -----------------------------------------------

/// Runs of the gap test, each on a fresh database.
const GAP_RUNS: usize = 4;
/// Store instances (each its own writer connection and group commit) per run.
const INSTANCES: usize = 4;
/// Concurrent writers on each instance, each appending to its own stream.
const WRITERS_PER_INSTANCE: usize = 8;
/// Appends each writer makes, of one to three events.
const APPENDS_PER_WRITER: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_writers_on_four_instances_while_subscribers_follow_leave_no_gap_and_no_repeat() {
    for run in 0..GAP_RUNS {
        let database = server().database();
        let url = server().url(&database);
        let mut stores = Vec::new();
        for _ in 0..INSTANCES {
            stores.push(connect(&url).await);
        }
        // One subscriber per instance, each woken by its own instance's commits and finding
        // the others' by polling: reads happen all through the run, at every moment a gap
        // could show.
        let mut followers = Vec::new();
        // The log's last position once every writer is done: each subscriber follows until it
        // has delivered that one, so a skipped event shows as a difference, not as a hang.
        let (done, finished) = watch::channel(None::<GlobalPosition>);
        for store in &stores {
            let mut subscription = store
                .subscribe_all(LogStart::Beginning)
                .await
                .expect("subscribe");
            let mut finished = finished.clone();
            followers.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                loop {
                    let last_seen = seen.last().map(|event: &RecordedEvent| event.position);
                    if let Some(last) = *finished.borrow() {
                        if last_seen >= Some(last) {
                            return seen;
                        }
                    }
                    tokio::select! {
                        event = subscription.next() => seen.push(event.expect("the subscription delivers")),
                        _ = finished.changed() => {}
                    }
                }
            }));
        }
        let mut writers = Vec::new();
        for (instance, store) in stores.iter().enumerate() {
            for writer in 0..WRITERS_PER_INSTANCE {
                let store = store.clone();
                writers.push(tokio::spawn(async move {
                    let name = stream(&format!("gap-{instance}-{writer}"));
                    let mut expected = ExpectedVersion::NoStream;
                    let mut written = 0;
                    for append in 0..APPENDS_PER_WRITER {
                        let count = 1 + (instance + writer + append) % 3;
                        let first = (instance * 1_000_000 + writer * 10_000 + append * 10) as u128;
                        let events = (0..count as u128).map(|i| event(first + i)).collect();
                        let outcome = store
                            .append(&name, expected, events)
                            .await
                            .expect("each writer owns its stream");
                        expected = ExpectedVersion::Exact(outcome.next_expected);
                        written += count;
                    }
                    written
                }));
            }
        }
        let mut total = 0;
        for writer in writers {
            total += within("a writer finishes", writer)
                .await
                .expect("the writer task");
        }
        let log = whole_log(&stores[0]).await;
        done.send_replace(log.last().map(|event| event.position));
        assert_eq!(
            log.len(),
            total,
            "run {run}: the log holds every event once"
        );
        for pair in log.windows(2) {
            assert!(
                pair[0].position < pair[1].position,
                "run {run}: the log is in position order"
            );
        }
        // The tree grown by four instances' writers, each in its own commits, is the tree of
        // the log in position order: no leaf missing, none out of place.
        let mut of_the_log = merkle::MemoryTree::new();
        for event in &log {
            of_the_log.push(merkle::leaf_hash(&event.view()));
        }
        let grown = merkle::head_of(&stores[run % INSTANCES], None)
            .await
            .expect("the stored tree's head");
        assert_eq!(
            grown,
            of_the_log.head(),
            "run {run}: the tree follows the log"
        );
        for (instance, follower) in followers.into_iter().enumerate() {
            let seen = within("a subscriber catches up", follower)
                .await
                .expect("the subscriber task");
            let seen: Vec<(GlobalPosition, EventId)> = seen
                .iter()
                .map(|event| (event.position, event.event_id))
                .collect();
            let logged: Vec<(GlobalPosition, EventId)> = log
                .iter()
                .map(|event| (event.position, event.event_id))
                .collect();
            assert!(
                seen == logged,
                "run {run}: the subscriber on instance {instance} saw {} events, the log holds {}; \
                 first difference at index {:?}",
                seen.len(),
                logged.len(),
                seen.iter().zip(&logged).position(|(a, b)| a != b)
            );
        }
        for store in stores {
            store.close().await.expect("close");
        }
    }
}

// ----- round trips per group commit ------------------------------------------------------------

/// Appends queued at once in each wave of the round-trip test, so they share commits.
const BATCHED_APPENDS: usize = 32;

// One thread: the spawned appends all queue before the writer task runs, so each wave is one
// group commit, and the proxy sees each pipeline leave the client in one piece.
#[tokio::test(flavor = "current_thread")]
async fn a_group_commit_of_fresh_appends_costs_one_round_trip_whatever_the_number_of_appends() {
    let database = server().database();
    let proxy = Proxy::start(server().port).await;
    let store = connect(&proxy.url(&database)).await;
    // The first append opens the writer's connection and prepares its statements: not counted.
    store
        .append(
            &stream("warm-up"),
            ExpectedVersion::NoStream,
            vec![event(0)],
        )
        .await
        .expect("append");
    let round_trips_before = proxy.round_trips.load(Ordering::SeqCst);
    let before = store.commit_stats();
    // A wave creating streams, then a wave growing each of them.
    for wave in 0..2_u128 {
        let appends: Vec<_> = (0..BATCHED_APPENDS)
            .map(|n| {
                let store = store.clone();
                let expected = match wave {
                    0 => ExpectedVersion::NoStream,
                    _ => ExpectedVersion::Exact(StreamVersion::FIRST),
                };
                let events = vec![event(1_000 * (wave + 1) + n as u128)];
                tokio::spawn(async move {
                    let name = stream(&format!("batched-{n}"));
                    store.append(&name, expected, events).await
                })
            })
            .collect();
        for append in appends {
            within("an append", append)
                .await
                .expect("the append task")
                .expect("each append owns its stream");
        }
    }
    let round_trips = proxy.round_trips.load(Ordering::SeqCst) - round_trips_before;
    let after = store.commit_stats();
    let (commits, appends) = (
        after.commits - before.commits,
        after.appends - before.appends,
    );
    assert_eq!(appends, 2 * BATCHED_APPENDS as u64);
    assert!(
        commits * 8 <= appends,
        "the appends share commits ({appends} appends in {commits} commits)"
    );
    assert!(
        round_trips <= commits as usize * ROUND_TRIPS_PER_COMMIT,
        "{round_trips} round trips for {commits} commits of {appends} appends; \
         at most {ROUND_TRIPS_PER_COMMIT} per commit"
    );
    let log = whole_log(&store).await;
    assert_eq!(log.len(), 1 + appends as usize, "every append stored once");
}

/// Tenants the tenant-tree tests spread their operations over.
const TENANTS: [&str; 3] = ["acme", "globex", "initech"];

// One thread, as above. The tenants' trees are grown in the same transaction as the events, by
// the statements the commit already sends: no round trip is added for them.
#[tokio::test(flavor = "current_thread")]
async fn a_group_commit_of_fresh_intents_grows_the_tenants_trees_in_its_one_round_trip() {
    let database = server().database();
    let proxy = Proxy::start(server().port).await;
    let store = connect(&proxy.url(&database)).await;
    // The writer meets each tenant once (reading its tree under the lock): not counted.
    for (n, tenant) in TENANTS.iter().enumerate() {
        store
            .append(
                &stream(&format!("warm-up-{n}")),
                ExpectedVersion::NoStream,
                vec![intent_of(tenant, n as u128)],
            )
            .await
            .expect("append");
    }
    let round_trips_before = proxy.round_trips.load(Ordering::SeqCst);
    let before = store.commit_stats();
    // A wave opening operations of every tenant, then a wave growing each of them.
    for wave in 0..2_u128 {
        let appends: Vec<_> = (0..BATCHED_APPENDS)
            .map(|n| {
                let store = store.clone();
                let (expected, events) = match wave {
                    0 => (
                        ExpectedVersion::NoStream,
                        vec![intent_of(TENANTS[n % TENANTS.len()], 1_000 + n as u128)],
                    ),
                    _ => (
                        ExpectedVersion::Exact(StreamVersion::FIRST),
                        vec![event(2_000 + n as u128)],
                    ),
                };
                tokio::spawn(async move {
                    store
                        .append(&stream(&format!("operation-{n}")), expected, events)
                        .await
                })
            })
            .collect();
        for append in appends {
            within("an append", append)
                .await
                .expect("the append task")
                .expect("each append owns its stream");
        }
    }
    let round_trips = proxy.round_trips.load(Ordering::SeqCst) - round_trips_before;
    let after = store.commit_stats();
    let commits = after.commits - before.commits;
    assert_eq!(after.appends - before.appends, 2 * BATCHED_APPENDS as u64);
    assert!(
        round_trips <= commits as usize * ROUND_TRIPS_PER_COMMIT,
        "{round_trips} round trips for {commits} commits; at most {ROUND_TRIPS_PER_COMMIT} per commit"
    );
    assert_the_tenant_trees_are_the_logs(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_appending_several_tenants_operations_at_once_grow_each_tenants_tree_in_log_order(
) {
    const WRITERS: usize = 4;
    const OPERATIONS_PER_WRITER: usize = 8;
    let database = server().database();
    let url = server().url(&database);
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(connect(&url).await);
    }
    let mut writers = Vec::new();
    for (i, instance) in instances.iter().enumerate() {
        for w in 0..WRITERS {
            let store = instance.clone();
            writers.push(tokio::spawn(async move {
                for op in 0..OPERATIONS_PER_WRITER {
                    let n = ((i * WRITERS + w) * OPERATIONS_PER_WRITER + op) as u128;
                    let name = stream(&format!("operation-{n}"));
                    let tenant = TENANTS[n as usize % TENANTS.len()];
                    store
                        .append(
                            &name,
                            ExpectedVersion::NoStream,
                            vec![intent_of(tenant, n * 2)],
                        )
                        .await
                        .expect("opened");
                    store
                        .append(
                            &name,
                            ExpectedVersion::Exact(StreamVersion::FIRST),
                            vec![event(n * 2 + 1)],
                        )
                        .await
                        .expect("grown");
                }
            }));
        }
    }
    for writer in writers {
        within("a writer", writer).await.expect("the writer task");
    }
    // Every instance reads the same trees, and they are the ones the log's order makes.
    for instance in &instances {
        assert_the_tenant_trees_are_the_logs(instance).await;
    }
    for instance in instances {
        instance.close().await.expect("closes");
    }
}

// One thread, as above: the wave is one batch.
#[tokio::test(flavor = "current_thread")]
async fn a_conflict_and_a_retry_in_a_group_commit_are_answered_as_such_and_the_others_written_once()
{
    let database = server().database();
    let proxy = Proxy::start(server().port).await;
    let store = connect(&proxy.url(&database)).await;
    // Two streams of one event: `stale` is where a lost race leaves it, `retried` then gets
    // the append its caller will send again, as after an answer lost on the way.
    for (n, name) in [(1, "stale"), (2, "retried")] {
        store
            .append(&stream(name), ExpectedVersion::NoStream, vec![event(n)])
            .await
            .expect("append");
    }
    let retried_ids = || vec![event(7), event(8)];
    let first = store
        .append(
            &stream("retried"),
            ExpectedVersion::Exact(StreamVersion::FIRST),
            retried_ids(),
        )
        .await
        .expect("the first delivery");
    let round_trips_before = proxy.round_trips.load(Ordering::SeqCst);
    let before = store.commit_stats();
    let mut appends: Vec<_> = (0..BATCHED_APPENDS - 2)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                let name = stream(&format!("fresh-{n}"));
                let events = vec![event(10_000 + n as u128)];
                store.append(&name, ExpectedVersion::NoStream, events).await
            })
        })
        .collect();
    let stale = store.clone();
    appends.push(tokio::spawn(async move {
        // `stale` exists; this caller believes it is new.
        stale
            .append(&stream("stale"), ExpectedVersion::NoStream, vec![event(99)])
            .await
    }));
    let retry = store.clone();
    appends.push(tokio::spawn(async move {
        retry
            .append(
                &stream("retried"),
                ExpectedVersion::Exact(StreamVersion::FIRST),
                retried_ids(),
            )
            .await
    }));
    let mut answers = Vec::new();
    for append in appends {
        answers.push(within("an append", append).await.expect("the append task"));
    }
    let round_trips = proxy.round_trips.load(Ordering::SeqCst) - round_trips_before;
    let retried = answers.pop().expect("the retry's answer");
    let conflicted = answers.pop().expect("the stale append's answer");
    assert_eq!(
        retried.expect("a retry is answered with its outcome"),
        first
    );
    assert!(
        matches!(conflicted, Err(StoreError::VersionConflict { .. })),
        "the stale append conflicts: {conflicted:?}"
    );
    for answer in answers {
        answer.expect("a fresh append is written");
    }
    let after = store.commit_stats();
    assert_eq!(after.appends - before.appends, BATCHED_APPENDS as u64 - 2);
    let commits = (after.commits - before.commits) as usize;
    assert!(
        round_trips <= commits * (ROUND_TRIPS_PER_COMMIT + ROUND_TRIPS_PER_CHECKED_COMMIT),
        "{round_trips} round trips for {commits} commits: the refused fresh attempt and the \
         checked path, no more"
    );
    let log = whole_log(&store).await;
    // Two streams created, the first delivery's two events, and the fresh appends.
    assert_eq!(
        log.len(),
        4 + BATCHED_APPENDS - 2,
        "every append stored once"
    );
    let stale_events: Vec<_> = log
        .iter()
        .filter(|event| event.stream.as_str() == "stale")
        .collect();
    assert_eq!(stale_events.len(), 1, "the stale append wrote nothing");
}

// ----- TLS, with libpq's sslmode meanings -------------------------------------------------------

#[tokio::test]
async fn sslmode_require_and_the_default_prefer_encrypt_without_verifying_the_certificate() {
    let server = tls_server();
    for mode in ["?sslmode=require", ""] {
        let database = server.database();
        let store = PostgresStore::connect(&format!("{}{mode}", server.url(&database)))
            .await
            .unwrap_or_else(|error| panic!("`{mode}` connects to a self-signed server: {error}"));
        store
            .append(&stream("tls"), ExpectedVersion::NoStream, vec![event(1)])
            .await
            .expect("append");
        let encrypted = server.sql(
            &database,
            &format!(
                "SELECT bool_and(s.ssl) AND count(*) > 0 FROM pg_stat_ssl s \
                 JOIN pg_stat_activity a USING (pid) \
                 WHERE a.datname = '{database}' AND a.application_name = 'opledger'"
            ),
        );
        assert_eq!(
            encrypted, "t",
            "`{mode}`: every opledger connection is encrypted"
        );
        store.close().await.expect("close");
    }
}

#[tokio::test]
async fn sslmode_verify_full_refuses_an_untrusted_certificate_saying_what_to_do() {
    let server = tls_server();
    let database = server.database();
    for (mode, named) in [
        ("verify-full", "sslmode=verify-full"),
        ("verify-ca", "sslmode=verify-ca"),
    ] {
        let url = format!("{}?sslmode={mode}", server.url(&database));
        let refused = PostgresStore::connect(&url)
            .await
            .expect_err("a certificate no root vouches for is refused");
        let message = refused.to_string();
        assert!(
            matches!(refused, PostgresError::UntrustedCertificate { .. })
                && message.contains("does not trust")
                && message.contains(named)
                && message.contains("sslmode=require")
                && !message.contains(postgres_server::PASSWORD),
            "{message}"
        );
    }
}

// ----- other instances' commits wake subscribers -------------------------------------------------

/// How long the follower may take to see an append: far below its poll of an hour, far above a
/// notification's delay on a loaded machine.
const WAKE_LIMIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_on_another_instance_is_woken_by_the_commit_not_by_its_poll() {
    let database = server().database();
    let url = server().url(&database);
    let writer = connect(&url).await;
    let mut config = PostgresConfig::from_url_and_env(&url, no_env).expect("a valid URL");
    config.subscription_poll_ms = MAX_SUBSCRIPTION_POLL_MS;
    let follower = PostgresStore::connect_with(config).await.expect("connect");
    let mut subscription = follower
        .subscribe_all(LogStart::Beginning)
        .await
        .expect("subscribe");
    let name = stream("followed");
    let mut expected = ExpectedVersion::NoStream;
    // Twice: the first may find the follower reading, the second finds it waiting.
    for n in 1..=2 {
        let following = tokio::spawn(async move {
            let event = subscription.next().await;
            (subscription, event)
        });
        let outcome = writer
            .append(&name, expected, vec![event(n)])
            .await
            .expect("append");
        expected = ExpectedVersion::Exact(outcome.next_expected);
        let (returned, delivered) = tokio::time::timeout(WAKE_LIMIT, following)
            .await
            .unwrap_or_else(|_| {
                panic!("the follower did not see append {n} within {WAKE_LIMIT:?}; only the poll of an hour was left to find it")
            })
            .expect("the follower task");
        subscription = returned;
        let delivered = delivered.expect("the subscription delivers");
        assert_eq!(delivered.event_id, event(n).event_id);
        assert_eq!(delivered.position, outcome.position);
    }
    follower.close().await.expect("close");
    writer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_dropped_without_close_leaves_no_listening_connection_behind() {
    let (store, database) = fresh_store().await;
    // Nothing appended or read: the listener's is the store's only connection left open.
    let listening = format!("SELECT count(*) FROM pg_stat_activity WHERE datname = '{database}'");
    assert_ne!(
        server().sql("postgres", &listening),
        "0",
        "the store listens"
    );
    drop(store);
    let deadline = Instant::now() + WAIT_LIMIT;
    while server().sql("postgres", &listening) != "0" {
        assert!(
            Instant::now() < deadline,
            "the listening connection outlived its store"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ----- the schema -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_starting_together_on_a_fresh_database_create_the_schema_once() {
    let database = server().database();
    let url = server().url(&database);
    let starts = (0..4).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { PostgresStore::connect(&url).await })
    });
    for start in starts {
        start
            .await
            .expect("the start task")
            .expect("every instance starts");
    }
    assert_eq!(
        server().sql(&database, "SELECT version FROM opledger.schema_version"),
        opledger_postgres::SCHEMA_VERSION.to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_of_a_newer_schema_is_refused_with_a_sentence_and_left_as_it_is() {
    let (store, database) = fresh_store().await;
    store
        .append(&stream("kept"), ExpectedVersion::NoStream, vec![event(1)])
        .await
        .expect("append");
    store.close().await.expect("close");
    let newer = opledger_postgres::SCHEMA_VERSION + 1;
    server().sql(
        &database,
        &format!("UPDATE opledger.schema_version SET version = {newer}"),
    );

    let refused = PostgresStore::connect(&server().url(&database))
        .await
        .expect_err("a newer schema is refused");
    assert!(
        matches!(refused, PostgresError::NewerSchema { .. }),
        "{refused:?}"
    );
    let sentence = refused.to_string();
    assert!(
        sentence.contains(&format!("schema version {newer}"))
            && sentence.contains("Upgrade opledger"),
        "{sentence}"
    );
    assert_eq!(
        server().sql(&database, "SELECT version FROM opledger.schema_version"),
        newer.to_string()
    );
    assert_eq!(
        server().sql(&database, "SELECT count(*) FROM opledger.events"),
        "1"
    );
}

// ----- start-up refusals ------------------------------------------------------------------------

async fn refusal(config: Result<PostgresConfig, PostgresError>) -> PostgresError {
    match config {
        Err(error) => error,
        Ok(config) => PostgresStore::connect_with(config)
            .await
            .expect_err("the store refuses to start"),
    }
}

fn no_env(_: &str) -> Option<String> {
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_without_a_user_is_refused_with_what_to_write() {
    let error = refusal(PostgresConfig::from_url_and_env(
        "postgres://127.0.0.1:5432/ledger",
        no_env,
    ))
    .await;
    assert!(
        matches!(error, PostgresError::InvalidUrl { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("postgres://USER@host/database"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_refused_naming_where_it_looked() {
    let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let url = format!("postgres://ledger:pw@127.0.0.1:{port}/ledger");
    let error = refusal(PostgresConfig::from_url_and_env(&url, no_env)).await;
    assert!(
        matches!(error, PostgresError::Unreachable { .. }),
        "{error:?}"
    );
    let sentence = error.to_string();
    assert!(
        sentence.contains(&format!("127.0.0.1:{port}")) && sentence.contains("server runs"),
        "{sentence}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_without_showing_it() {
    let url = format!(
        "postgres://postgres:not-the-password@127.0.0.1:{}/postgres",
        server().port
    );
    let error = refusal(PostgresConfig::from_url_and_env(&url, no_env)).await;
    assert!(
        matches!(error, PostgresError::Authentication { .. }),
        "{error:?}"
    );
    let sentence = error.to_string();
    assert!(
        sentence.contains(PASSWORD_VAR) && !sentence.contains("not-the-password"),
        "{sentence}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_password_is_refused_and_pgpassword_supplies_it() {
    let database = server().database();
    let url = server().url_without_password(&database);
    let error = refusal(PostgresConfig::from_url_and_env(&url, no_env)).await;
    assert!(
        matches!(error, PostgresError::Authentication { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("none was given"), "{error}");

    let config = PostgresConfig::from_url_and_env(&url, |name| {
        (name == PASSWORD_VAR).then(|| postgres_server::PASSWORD.to_owned())
    })
    .expect("a valid URL");
    PostgresStore::connect_with(config)
        .await
        .expect("the password from PGPASSWORD is used");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_database_is_refused_with_how_to_create_it() {
    let error = refusal(PostgresConfig::from_url_and_env(
        &server().url("no_such_ledger"),
        no_env,
    ))
    .await;
    assert!(
        matches!(error, PostgresError::NoDatabase { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("createdb no_such_ledger"),
        "{error}"
    );
}

// ----- a connection cut at COMMIT, and a server that goes away ----------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_is_read_back_as_written_and_not_written_twice() {
    let database = server().database();
    let proxy = Proxy::start(server().port).await;
    let store = connect(&proxy.url(&database)).await;
    let name = stream("answer-lost");
    let first = store
        .append(&name, ExpectedVersion::NoStream, vec![event(1)])
        .await
        .expect("create the stream");

    proxy.set(Mode::CutAfterCommit);
    let outcome = within(
        "the unclear append is resolved",
        store.append(
            &name,
            ExpectedVersion::Exact(first.next_expected),
            vec![event(2), event(3)],
        ),
    )
    .await
    .expect("the renewed ask finds the append stored");

    assert_eq!(
        proxy.cuts.load(Ordering::SeqCst),
        1,
        "the proxy cut one COMMIT"
    );
    let stored = whole_stream(&store, &name).await;
    assert_eq!(ids(&stored), ids_of(&[1, 2, 3]), "every event once");
    assert_eq!(outcome.next_expected, StreamVersion::new(2));
    assert_eq!(
        Some(outcome.position),
        stored.last().map(|event| event.position)
    );
    assert_eq!(whole_log(&store).await.len(), 3, "nothing written twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_cut_before_it_reaches_the_server_is_written_once_when_asked_again() {
    let database = server().database();
    let proxy = Proxy::start(server().port).await;
    let store = connect(&proxy.url(&database)).await;
    let name = stream("commit-lost");
    let first = store
        .append(&name, ExpectedVersion::NoStream, vec![event(1)])
        .await
        .expect("create the stream");

    proxy.set(Mode::CutBeforeCommit);
    let outcome = within(
        "the unclear append is resolved",
        store.append(
            &name,
            ExpectedVersion::Exact(first.next_expected),
            vec![event(2)],
        ),
    )
    .await
    .expect("the renewed ask writes the append");

    assert_eq!(
        proxy.cuts.load(Ordering::SeqCst),
        1,
        "the proxy cut one COMMIT"
    );
    let stored = whole_stream(&store, &name).await;
    assert_eq!(ids(&stored), ids_of(&[1, 2]), "every event once");
    assert_eq!(outcome.next_expected, StreamVersion::new(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_goes_away_answers_unavailable_writes_nothing_and_the_store_recovers() {
    let database = server().database();
    let proxy = Proxy::start(server().port).await;
    let store = connect(&proxy.url(&database)).await;
    let name = stream("gone");
    store
        .append(&name, ExpectedVersion::NoStream, vec![event(1)])
        .await
        .expect("create the stream");

    proxy.set(Mode::Gone);
    // The first append may meet the writer's connection still open: its COMMIT goes out in the
    // same write as its statements, so a connection that breaks then leaves the outcome
    // unknown, unless the server can be asked again (it cannot: it is gone).
    let first = within(
        "an append as the server goes",
        store.append(
            &name,
            ExpectedVersion::Exact(StreamVersion::FIRST),
            vec![event(2)],
        ),
    )
    .await
    .expect_err("nothing can be written");
    assert!(
        matches!(
            first,
            StoreError::Unavailable { .. } | StoreError::AppendOutcomeUnknown { .. }
        ),
        "{first:?}"
    );
    // Now no connection can be opened: refused before anything is sent.
    let refused = within(
        "an append while the server is gone",
        store.append(
            &name,
            ExpectedVersion::Exact(StreamVersion::FIRST),
            vec![event(4)],
        ),
    )
    .await
    .expect_err("nothing can be written");
    assert!(
        matches!(refused, StoreError::Unavailable { .. }),
        "{refused:?}"
    );
    let read = within(
        "a read while the server is gone",
        store.read_all(LogStart::Beginning, 10),
    )
    .await;
    assert!(
        matches!(read, Err(StoreError::Unavailable { .. })),
        "{read:?}"
    );

    proxy.set(Mode::Pass);
    store
        .append(
            &name,
            ExpectedVersion::Exact(StreamVersion::FIRST),
            vec![event(3)],
        )
        .await
        .expect("the store recovers once the server is back");
    let stored = whole_stream(&store, &name).await;
    assert_eq!(
        ids(&stored),
        ids_of(&[1, 3]),
        "the refused append left nothing"
    );
}

// ----- the statement timeout --------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_waiting_on_a_lock_held_elsewhere_fails_at_the_statement_timeout() {
    let database = server().database();
    let mut config =
        PostgresConfig::from_url_and_env(&server().url(&database), no_env).expect("a valid URL");
    config.statement_timeout_ms = 300;
    let store = PostgresStore::connect_with(config).await.expect("connect");
    // Another session holds the log's lock for far longer than the timeout.
    let holder = postgres_server::server().spawn_sql(
        &database,
        "BEGIN; SELECT last_position FROM opledger.log_head FOR UPDATE; SELECT pg_sleep(5); COMMIT;",
    );
    let deadline = Instant::now() + WAIT_LIMIT;
    while server().sql(
        &database,
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(5)%' AND pid <> pg_backend_pid()",
    ) != "1"
    {
        assert!(Instant::now() < deadline, "the lock holder never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let started = Instant::now();
    let refused = store
        .append(&stream("stuck"), ExpectedVersion::NoStream, vec![event(1)])
        .await
        .expect_err("the append cannot take the lock");
    let waited = started.elapsed();
    assert!(
        matches!(refused, StoreError::Unavailable { .. }),
        "{refused:?}"
    );
    assert!(
        refused.to_string().contains("statement timeout"),
        "{refused}"
    );
    assert!(
        waited < Duration::from_secs(10),
        "the append waited {waited:?}"
    );
    drop(holder);
    assert_eq!(whole_log(&store).await.len(), 0);
}

fn ids_of(numbers: &[u128]) -> Vec<EventId> {
    numbers.iter().map(|n| event(*n).event_id).collect()
}

/// The webhooks' journal on the shared database (`webhook_journal.rs`): a lease held unexpired
/// is not granted to another instance; an expired one is, with a new token; and the instance
/// that lost it can neither move the checkpoint, nor disable the endpoint, nor renew, nor give
/// the new holder's lease up. Operators' status changes need no lease.
#[tokio::test]
async fn a_webhook_lease_is_granted_to_one_instance_and_fences_the_checkpoint_of_one_that_lost_it()
{
    use opledger_postgres::{WebhookFence, WebhookLeaseAsk};
    let (store, _) = fresh_store().await;
    let journal = store.webhook_journal();
    let row = journal.ensure("billing", Some(3)).await.expect("created");
    assert_eq!(
        (row.checkpoint, row.status.as_str(), row.epoch),
        (Some(3), "active", 0)
    );

    const LEASE_MS: u64 = 1_000;
    let WebhookLeaseAsk::Granted(first) = journal
        .acquire("billing", "a", LEASE_MS)
        .await
        .expect("asks")
    else {
        panic!("a free lease is granted");
    };
    assert_eq!(
        journal
            .acquire("billing", "b", LEASE_MS)
            .await
            .expect("asks"),
        WebhookLeaseAsk::HeldBy("a".into()),
        "a lease held unexpired is not granted to another instance"
    );
    let a = WebhookFence {
        endpoint: "billing",
        holder: "a",
        token: first,
    };
    assert!(journal.advance(a, 0, 4).await.expect("moves"));
    assert_eq!(journal.renew(a, LEASE_MS).await.expect("renews"), Some(0));

    // `a` stalls past its lease; `b` takes the endpoint over with a new token.
    let started = Instant::now();
    let second = loop {
        match journal
            .acquire("billing", "b", LEASE_MS)
            .await
            .expect("asks")
        {
            WebhookLeaseAsk::Granted(token) => break token,
            WebhookLeaseAsk::HeldBy(holder) => assert_eq!(holder, "a"),
        }
        assert!(started.elapsed() < WAIT_LIMIT, "the lease never ran out");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(second > first, "a takeover grants a new token");
    let b = WebhookFence {
        endpoint: "billing",
        holder: "b",
        token: second,
    };
    assert!(
        !journal.advance(a, 0, 9).await.expect("asks"),
        "the loser cannot move the checkpoint"
    );
    assert!(
        !journal
            .set_status("billing", "disabled", Some("loser"), None, Some((0, a)))
            .await
            .expect("asks"),
        "the loser cannot disable the endpoint"
    );
    assert_eq!(
        journal.renew(a, LEASE_MS).await.expect("asks"),
        None,
        "nor renew"
    );
    journal.release(a).await.expect("a no-op");
    assert_eq!(
        journal
            .acquire("billing", "a", LEASE_MS)
            .await
            .expect("asks"),
        WebhookLeaseAsk::HeldBy("b".into()),
        "the loser's release left the new holder's lease alone"
    );
    assert!(journal.advance(b, 0, 5).await.expect("moves"));
    // An operator's replay from any instance: no lease, the epoch moves, the holder's writes
    // under the old epoch are refused.
    assert!(journal
        .set_status("billing", "active", None, Some(Some(1)), None)
        .await
        .expect("replays"));
    assert!(!journal.advance(b, 0, 6).await.expect("asks"));
    let row = journal
        .record("billing")
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!((row.checkpoint, row.epoch), (Some(1), 1));
    // A given-up lease is granted at once.
    journal.release(b).await.expect("gives up");
    assert!(matches!(
        journal.acquire("billing", "a", LEASE_MS).await.expect("asks"),
        WebhookLeaseAsk::Granted(token) if token > second
    ));
}

/// A batch of webhook deliveries on the shared database (`WebhookJournal::record_deliveries`):
/// one statement records every attempt in order and moves the checkpoint under the current
/// lease; under a lost lease the attempts are recorded and the checkpoint is not moved.
#[tokio::test]
async fn a_batch_of_webhook_deliveries_is_recorded_whole_and_moves_the_checkpoint_only_under_the_lease(
) {
    use opledger_postgres::{WebhookAttemptRow, WebhookFence, WebhookLeaseAsk};
    let (store, _) = fresh_store().await;
    let journal = store.webhook_journal();
    journal.ensure("billing", None).await.expect("created");
    let WebhookLeaseAsk::Granted(token) =
        journal.acquire("billing", "a", 60_000).await.expect("asks")
    else {
        panic!("a free lease is granted");
    };
    let fence = WebhookFence {
        endpoint: "billing",
        holder: "a",
        token,
    };
    let batch = |positions: std::ops::Range<u64>| -> Vec<WebhookAttemptRow> {
        positions
            .map(|position| WebhookAttemptRow {
                endpoint: "billing".into(),
                position,
                webhook_id: format!("msg_{position}"),
                attempt: 1,
                at: "2026-12-03T17:00:00.000001Z".into(),
                status: Some(200),
                duration_ms: 1,
                error: None,
            })
            .collect()
    };
    assert!(journal
        .record_deliveries(&batch(1..4), fence, 0, 5)
        .await
        .expect("recorded"));
    let stale = WebhookFence {
        token: token + 1,
        ..fence
    };
    assert!(
        !journal
            .record_deliveries(&batch(6..8), stale, 0, 9)
            .await
            .expect("recorded"),
        "a lost lease moves no checkpoint"
    );
    let row = journal
        .record("billing")
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(row.checkpoint, Some(5));
    let attempts = journal.attempts("billing", 10).await.expect("lists");
    let positions: Vec<u64> = attempts.iter().map(|a| a.position).collect();
    assert_eq!(
        positions,
        vec![7, 6, 3, 2, 1],
        "every attempt, newest first"
    );
    assert_eq!(attempts[4].webhook_id, "msg_1");
    assert_eq!(attempts[4].status, Some(200));
}
