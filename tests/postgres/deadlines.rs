//! Every round trip to the server has a bounded wait: a network path that drops answers without
//! a reset (a partition, a host that died) cannot hold an append, a read or a pooled
//! connection for ever. A commit whose answer never came is resolved on a new connection, as
//! one whose connection broke is; readiness fails while the writer waits.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use opledger_domain::ids::StreamVersion;
use opledger_domain::store::{EventStore, ExpectedVersion, LogStart, StoreError};
use opledger_postgres::PostgresConfig;
use opledger_store::PostgresStore;

use crate::postgres_server::proxy::{Mode, Proxy};
use crate::postgres_server::server;
use crate::{event, ids, ids_of, no_env, stream, whole_log, whole_stream, within};

/// Short limits, so a test waits seconds, not the defaults' tens of seconds.
async fn impatient_store(url: &str) -> PostgresStore {
    let mut config = PostgresConfig::from_url_and_env(url, no_env).expect("a valid URL");
    config.statement_timeout_ms = 500;
    config.round_trip_timeout_ms = 1_000;
    config.connect_timeout_ms = 1_000;
    config.pool_wait_ms = 1_000;
    config.pool_size = 2;
    PostgresStore::connect_with(config)
        .await
        .expect("connect to the test PostgreSQL")
}

/// The longest any one call may take with [`impatient_store`]'s limits: a round trip, then
/// the renewed asks (each a connection and two round trips) and their pauses, with room for a
/// loaded machine.
const BOUNDED: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_never_comes_is_resolved_on_a_new_connection_and_readiness_fails_meanwhile(
) {
    let database = server().database();
    let proxy = Proxy::start(server().port).await;
    let store = impatient_store(&proxy.url(&database)).await;
    let name = stream("answer-never-comes");
    let first = store
        .append(&name, ExpectedVersion::NoStream, vec![event(1)])
        .await
        .expect("create the stream");
    assert_eq!(store.readiness().await, Ok(()));

    proxy.set(Mode::SwallowAfterCommit);
    let started = Instant::now();
    let append = tokio::spawn({
        let store = store.clone();
        let name = name.clone();
        async move {
            store
                .append(
                    &name,
                    ExpectedVersion::Exact(first.next_expected),
                    vec![event(2), event(3)],
                )
                .await
        }
    });
    let mut not_ready = None;
    while !append.is_finished() {
        if let Err(reason) = store.readiness().await {
            not_ready = Some(reason);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let outcome = within("the append whose answer never came", append)
        .await
        .expect("the append task")
        .expect("the renewed ask finds the append stored");

    assert!(started.elapsed() < BOUNDED, "took {:?}", started.elapsed());
    let not_ready = not_ready.expect("readiness failed while the writer waited for an answer");
    assert!(not_ready.contains("writer"), "{not_ready}");
    assert_eq!(proxy.cuts.load(Ordering::SeqCst), 1, "one COMMIT swallowed");
    let stored = whole_stream(&store, &name).await;
    assert_eq!(ids(&stored), ids_of(&[1, 2, 3]), "every event once");
    assert_eq!(outcome.next_expected, StreamVersion::new(2));
    assert_eq!(whole_log(&store).await.len(), 3, "nothing written twice");
    assert_eq!(store.readiness().await, Ok(()), "ready again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_network_path_fails_appends_and_reads_in_bounded_time_and_the_store_recovers() {
    let database = server().database();
    let proxy = Proxy::start(server().port).await;
    let store = impatient_store(&proxy.url(&database)).await;
    let name = stream("silent-path");
    store
        .append(&name, ExpectedVersion::NoStream, vec![event(1)])
        .await
        .expect("create the stream");
    store
        .read_all(LogStart::Beginning, 10)
        .await
        .expect("a read opens a pooled connection");

    proxy.set(Mode::Silent);
    let started = Instant::now();
    let unknown = within(
        "an append on a silent path",
        store.append(
            &name,
            ExpectedVersion::Exact(StreamVersion::FIRST),
            vec![event(2)],
        ),
    )
    .await
    .expect_err("nothing can be confirmed");
    assert!(started.elapsed() < BOUNDED, "took {:?}", started.elapsed());
    // Its COMMIT went out with its statements, and no answer came: it may have committed.
    assert!(
        matches!(unknown, StoreError::AppendOutcomeUnknown { .. }),
        "{unknown:?}"
    );
    // More reads than the pool has connections: none waits for a slot a silent one holds.
    for _ in 0..4 {
        let started = Instant::now();
        let read = within(
            "a read on a silent path",
            store.read_all(LogStart::Beginning, 10),
        )
        .await;
        assert!(
            matches!(read, Err(StoreError::Unavailable { .. })),
            "{read:?}"
        );
        assert!(started.elapsed() < BOUNDED, "took {:?}", started.elapsed());
    }
    let not_ready = within("readiness on a silent path", store.readiness()).await;
    assert!(not_ready.is_err(), "ready on a silent path");

    proxy.set(Mode::Pass);
    // The append whose outcome was unknown, asked again as the engine would: the same events.
    let retried = within(
        "the same append once the path is back",
        store.append(
            &name,
            ExpectedVersion::Exact(StreamVersion::FIRST),
            vec![event(2)],
        ),
    )
    .await
    .expect("the store recovers on new connections");
    assert_eq!(retried.next_expected, StreamVersion::new(1));
    assert_eq!(ids(&whole_stream(&store, &name).await), ids_of(&[1, 2]));
    assert_eq!(
        within("readiness once the path is back", store.readiness()).await,
        Ok(())
    );
}
