//! A failover, as a platform team runs one: a primary and a synchronous streaming standby
//! (`pg_basebackup -R`, `synchronous_standby_names`) on clusters of the test's own, two store
//! instances on a multi-host URL (`target_session_attrs=read-write`) under load, the primary
//! crashed, the standby promoted. The instances go on without a restart on the new primary,
//! every acknowledged append is there, and when the old primary comes back as a primary they
//! refuse it (an older timeline) and write nothing to it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opledger_domain::ids::{EventId, StreamVersion};
use opledger_domain::merkle;
use opledger_domain::store::{EventStore, ExpectedVersion};
use opledger_store::PostgresStore;

use crate::postgres_server::{own_cluster, PASSWORD, USER};
use crate::{connect, event, stream, whole_log, whole_stream, within};

/// Writers per instance, each appending to a stream of its own.
const WRITERS: usize = 4;
/// Longest one append may take to be acknowledged across the failover, retried as a caller does.
const APPEND_DEADLINE: Duration = Duration::from_secs(40);

/// The acknowledged appends: stream → the event ids acknowledged, in version order.
type Acknowledged = Arc<Mutex<BTreeMap<String, Vec<EventId>>>>;

/// Appends to its own stream until `stop`, retrying each append (same event ids, same expected
/// version) until it is acknowledged, as a caller does after "unavailable" or "outcome unknown".
fn spawn_writer(
    store: PostgresStore,
    name: String,
    seed: u128,
    acknowledged: Acknowledged,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut version = 0_u64;
        while !stop.load(Ordering::SeqCst) {
            let expected = match version {
                0 => ExpectedVersion::NoStream,
                v => ExpectedVersion::Exact(StreamVersion::new(v - 1)),
            };
            let appended = event(seed + u128::from(version));
            let id = appended.event_id;
            let started = Instant::now();
            loop {
                match store
                    .append(&stream(&name), expected, vec![appended.clone()])
                    .await
                {
                    Ok(_) => break,
                    Err(error) => {
                        assert!(
                            started.elapsed() < APPEND_DEADLINE,
                            "`{name}` v{version} was never acknowledged: {error}"
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            acknowledged
                .lock()
                .expect("not poisoned")
                .entry(name.clone())
                .or_default()
                .push(id);
            version += 1;
        }
    })
}

/// Counts acknowledged appends until `more` new ones came.
async fn wait_for_appends(acknowledged: &Acknowledged, more: usize) {
    let count = |acknowledged: &Acknowledged| -> usize {
        acknowledged
            .lock()
            .expect("not poisoned")
            .values()
            .map(Vec::len)
            .sum()
    };
    let target = count(acknowledged) + more;
    within("appends acknowledged", async {
        while count(acknowledged) < target {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_on_a_multi_host_url_go_on_after_a_failover_lose_no_acknowledged_write_and_refuse_the_old_primary(
) {
    let primary = own_cluster(&[]);
    primary.sql("postgres", "CREATE DATABASE ledger");
    let standby = primary.standby("standby");
    // Synchronous from here on: a COMMIT returns once the standby has it.
    primary.sql(
        "postgres",
        "ALTER SYSTEM SET synchronous_standby_names = 'standby'",
    );
    primary.sql("postgres", "SELECT pg_reload_conf()");
    within("the standby is synchronous", async {
        while primary.sql(
            "postgres",
            "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'standby' AND sync_state = 'sync'",
        ) != "1"
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let url = format!(
        "postgres://{USER}:{PASSWORD}@127.0.0.1:{},127.0.0.1:{}/ledger?target_session_attrs=read-write",
        primary.port, standby.port
    );
    let instances = [connect(&url).await, connect(&url).await];
    let acknowledged: Acknowledged = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for (instance, store) in instances.iter().enumerate() {
        for writer in 0..WRITERS {
            writers.push(spawn_writer(
                store.clone(),
                format!("failover-{instance}-{writer}"),
                (instance * 1_000_000 + writer * 10_000) as u128,
                Arc::clone(&acknowledged),
                Arc::clone(&stop),
            ));
        }
    }
    wait_for_appends(&acknowledged, 40).await;

    // The primary dies under load; the standby is promoted.
    primary.crash();
    standby.promote();
    wait_for_appends(&acknowledged, 40).await;

    // The old primary comes back as a primary, on the URL's first host. The instances'
    // connections are cut so that each opens new ones, trying the old primary first.
    primary.start_again();
    let old_head = primary.sql("ledger", "SELECT last_position FROM opledger.log_head");
    standby.sql(
        "postgres",
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = 'ledger' AND application_name LIKE 'opledger%'",
    );
    wait_for_appends(&acknowledged, 40).await;
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        within("a writer stops", writer)
            .await
            .expect("the writer task");
    }

    // Every acknowledged append is on the new primary, in its stream, in order.
    let acknowledged = acknowledged.lock().expect("not poisoned").clone();
    for (name, ids) in &acknowledged {
        let stored: Vec<EventId> = whole_stream(&instances[0], &stream(name))
            .await
            .iter()
            .map(|event| event.event_id)
            .collect();
        assert_eq!(
            &stored, ids,
            "`{name}` holds every acknowledged append once"
        );
    }
    // The tree grown across the failover is the tree of the log.
    let log = whole_log(&instances[1]).await;
    let mut of_the_log = merkle::MemoryTree::new();
    for event in &log {
        of_the_log.push(merkle::leaf_hash(&event.view()));
    }
    assert_eq!(
        merkle::head_of(&instances[1], None)
            .await
            .expect("the tree"),
        of_the_log.head()
    );
    // Nothing was written to the old primary after it came back.
    assert_eq!(
        primary.sql("ledger", "SELECT last_position FROM opledger.log_head"),
        old_head,
        "the old primary's log did not move"
    );
    for store in instances {
        store.close().await.expect("closes");
    }
}
