//! A reconnection never writes to an older copy of the ledger or to another ledger: every
//! connection the store opens is checked (the ledger id, the cluster, the timeline, the log's
//! head against the newest position this store has seen). A refused one is closed unused;
//! appends and reads answer "unavailable" with a sentence saying what to do, readiness fails,
//! and the store serves again once the URL leads to the current copy.
//!
//! The copies are databases of the test cluster swapped by name under the store, while the
//! proxy keeps it from connecting: an older copy made by `CREATE DATABASE … TEMPLATE` (the same
//! ledger id and cluster, a shorter log), and another ledger made by another store.

use opledger_domain::ids::StreamVersion;
use opledger_domain::store::{EventStore, ExpectedVersion, LogStart, StoreError};
use opledger_store::PostgresStore;

use crate::postgres_server::proxy::{Mode, Proxy};
use crate::postgres_server::server;
use crate::{connect, event, ids, ids_of, stream, whole_stream, within};

/// Puts `incoming` in the place (the name) of `database`, keeping `database` as `outgoing`,
/// while the proxy refuses the store's connections.
fn swap(proxy: &Proxy, database: &str, outgoing: &str, incoming: &str) {
    proxy.set(Mode::Gone);
    server().sql_alone(
        database,
        &format!("ALTER DATABASE {database} RENAME TO {outgoing}"),
    );
    server().sql_alone(
        incoming,
        &format!("ALTER DATABASE {incoming} RENAME TO {database}"),
    );
    proxy.set(Mode::Pass);
}

async fn refused_append(store: &PostgresStore, version: u64, n: u128) -> String {
    let refused = within(
        "an append on a refused copy",
        store.append(
            &stream("ledger"),
            ExpectedVersion::Exact(StreamVersion::new(version)),
            vec![event(n)],
        ),
    )
    .await
    .expect_err("nothing is written to a refused copy");
    assert!(
        matches!(refused, StoreError::Unavailable { .. }),
        "{refused:?}"
    );
    refused.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnection_to_an_older_copy_of_the_ledger_is_refused_and_nothing_is_written_there() {
    let database = server().database();
    let older = format!("{database}_older");
    let newer = format!("{database}_newer");
    let proxy = Proxy::start(server().port).await;
    let store = connect(&proxy.url(&database)).await;
    let name = stream("ledger");
    store
        .append(&name, ExpectedVersion::NoStream, vec![event(1)])
        .await
        .expect("the first event");
    // The older copy: the ledger as it is now, one event long.
    proxy.set(Mode::Gone);
    server().sql_alone(
        &database,
        &format!("CREATE DATABASE {older} TEMPLATE {database}"),
    );
    proxy.set(Mode::Pass);
    for (version, n) in [(0, 2), (1, 3)] {
        within(
            "an append on the current copy",
            store.append(
                &name,
                ExpectedVersion::Exact(StreamVersion::new(version)),
                vec![event(n)],
            ),
        )
        .await
        .expect("the current copy takes it");
    }

    swap(&proxy, &database, &newer, &older);
    let refused = refused_append(&store, 2, 4).await;
    assert!(
        refused.contains("older copy") && refused.contains("position 3"),
        "{refused}"
    );
    let read = within(
        "a read on the older copy",
        store.read_all(LogStart::Beginning, 10),
    )
    .await;
    assert!(
        matches!(read, Err(StoreError::Unavailable { .. })),
        "{read:?}"
    );
    let not_ready = within("readiness on the older copy", store.readiness()).await;
    assert!(not_ready.is_err_and(|reason| reason.contains("older copy")));

    let stale = format!("{database}_stale");
    swap(&proxy, &database, &stale, &newer);
    within(
        "the append once the current copy is back",
        store.append(
            &name,
            ExpectedVersion::Exact(StreamVersion::new(2)),
            vec![event(4)],
        ),
    )
    .await
    .expect("the current copy takes it");
    assert_eq!(
        ids(&whole_stream(&store, &name).await),
        ids_of(&[1, 2, 3, 4])
    );
    assert_eq!(within("readiness", store.readiness()).await, Ok(()));
    assert_eq!(
        server().sql(&stale, "SELECT count(*) FROM opledger.events"),
        "1",
        "nothing was written to the older copy"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnection_to_another_ledger_is_refused_saying_so() {
    let database = server().database();
    let other = server().database();
    PostgresStore::connect(&server().url(&other))
        .await
        .expect("another ledger")
        .close()
        .await
        .expect("closed");
    let proxy = Proxy::start(server().port).await;
    let store = connect(&proxy.url(&database)).await;
    store
        .append(&stream("ledger"), ExpectedVersion::NoStream, vec![event(1)])
        .await
        .expect("the first event");

    let ours = format!("{database}_ours");
    swap(&proxy, &database, &ours, &other);
    let refused = refused_append(&store, 0, 2).await;
    assert!(refused.contains("another ledger"), "{refused}");
    let not_ready = within("readiness on another ledger", store.readiness()).await;
    assert!(not_ready.is_err_and(|reason| reason.contains("another ledger")));
    assert_eq!(
        server().sql(&database, "SELECT count(*) FROM opledger.events"),
        "0",
        "nothing was written to the other ledger"
    );
}
