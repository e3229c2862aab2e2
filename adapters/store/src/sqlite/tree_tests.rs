//! The log tree in the file: grown with the log, equal to a tree built from the log alone, and
//! caught up from the log when a file was written without it.

use opledger_domain::ids::EventId;
use opledger_domain::merkle::{self, MemoryTree};
use opledger_domain::store::{EventData, EventStore, ExpectedVersion, LogStart, StreamName};
use tempfile::TempDir;
use uuid::Uuid;

use super::*;

fn event(id: u128) -> EventData {
    EventData {
        event_id: EventId::from_uuid(Uuid::from_u128(id)),
        event_type: "Tested".into(),
        data: format!("{{\"n\":{id}}}").into_bytes(),
        metadata: b"{}".to_vec(),
    }
}

/// Appends `count` events in appends of one to three events over a few streams.
async fn append_events(store: &SqliteStore, first_id: u128, count: u128) {
    let mut id = first_id;
    while id < first_id + count {
        let name = StreamName::new(format!("s-{id}")).unwrap();
        let events: Vec<EventData> = (id..(id + 1 + id % 3).min(first_id + count))
            .map(event)
            .collect();
        id += events.len() as u128;
        store
            .append(&name, ExpectedVersion::NoStream, events)
            .await
            .unwrap();
    }
}

/// The tree built from the log's events alone.
async fn tree_from_log(store: &SqliteStore) -> MemoryTree {
    let mut tree = MemoryTree::new();
    for event in store.read_all(LogStart::Beginning, 4096).await.unwrap() {
        tree.push(merkle::leaf_hash(&event.view()));
    }
    tree
}

#[tokio::test]
async fn the_stored_tree_is_the_tree_of_the_log_and_its_proofs_verify() {
    let dir = TempDir::new().unwrap();
    let store = SqliteStore::open(dir.path().join("events.db"))
        .await
        .unwrap();
    append_events(&store, 1, 300).await;
    let expected = tree_from_log(&store).await.head();
    let head = merkle::head_of(&store, None).await.unwrap();
    assert_eq!(head, expected);
    let older = merkle::head_of(&store, Some(77)).await.unwrap();
    let events = store.read_all(LogStart::Beginning, 4096).await.unwrap();
    for index in [0, 1, 76, 150, 299] {
        let proof = merkle::inclusion_proof_of(&store, index, 300)
            .await
            .unwrap();
        let leaf = merkle::leaf_hash(&events[index as usize].view());
        merkle::check_inclusion(&proof, head, index, leaf).unwrap();
    }
    let proof = merkle::consistency_proof_of(&store, 77, 300).await.unwrap();
    merkle::check_consistency(&proof, older, head).unwrap();
    store.close().await.unwrap();
}

#[tokio::test]
async fn a_file_written_without_the_tree_gets_it_from_the_log_when_opened_with_it() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("events.db");
    let off = SqliteOptions { log_tree: false };
    let store = SqliteStore::open_with(&path, off).await.unwrap();
    // More than one run's worth of hashes in the catch-up's one transaction.
    append_events(&store, 1, 500).await;
    assert_eq!(store.tree_size().await.unwrap(), 0);
    store.close().await.unwrap();

    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(store.tree_size().await.unwrap(), 500);
    append_events(&store, 501, 10).await;
    let head = merkle::head_of(&store, None).await.unwrap();
    assert_eq!(head, tree_from_log(&store).await.head());
    store.close().await.unwrap();
}

#[tokio::test]
async fn a_tree_kept_a_row_per_hash_is_copied_into_runs_when_opened_and_proves_the_same() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("events.db");
    let store = SqliteStore::open(&path).await.unwrap();
    // Enough for a catch-up to span several runs, and proofs across their edges.
    append_events(&store, 1, 700).await;
    let head = merkle::head_of(&store, None).await.unwrap();
    store.close().await.unwrap();

    // The file as a build from before runs wrote it: a row per stored hash.
    {
        let connection = rusqlite::Connection::open(&path).unwrap();
        let runs: Vec<(i64, Vec<u8>)> = connection
            .prepare("SELECT first_index, hashes FROM log_tree_runs ORDER BY first_index")
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(runs.len() > 1, "the tree is kept in runs: {}", runs.len());
        for (first, hashes) in runs {
            for (offset, hash) in (0_i64..).zip(hashes.chunks(32)) {
                connection
                    .execute(
                        "INSERT INTO log_tree (stored_index, hash) VALUES (?1, ?2)",
                        rusqlite::params![first + offset, hash],
                    )
                    .unwrap();
            }
        }
        connection.execute("DELETE FROM log_tree_runs", []).unwrap();
    }

    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(merkle::head_of(&store, None).await.unwrap(), head);
    let events = store.read_all(LogStart::Beginning, 4096).await.unwrap();
    for index in [0, 119, 120, 121, 350, 699] {
        let proof = merkle::inclusion_proof_of(&store, index, 700)
            .await
            .unwrap();
        let leaf = merkle::leaf_hash(&events[index as usize].view());
        merkle::check_inclusion(&proof, head, index, leaf).unwrap();
    }
    append_events(&store, 701, 5).await;
    assert_eq!(
        merkle::head_of(&store, None).await.unwrap(),
        tree_from_log(&store).await.head()
    );
    store.close().await.unwrap();
    let connection = rusqlite::Connection::open(&path).unwrap();
    let rows: i64 = connection
        .query_row("SELECT count(*) FROM log_tree", [], |row| row.get(0))
        .unwrap();
    assert_eq!(rows, 0, "the copied rows are removed");
}

#[tokio::test]
async fn checkpoints_are_kept_by_size_and_the_newest_is_found() {
    let dir = TempDir::new().unwrap();
    let store = SqliteStore::open(dir.path().join("events.db"))
        .await
        .unwrap();
    assert_eq!(store.kept_checkpoint(None).await.unwrap(), None);
    store.keep_checkpoint(3, "three".into()).await.unwrap();
    store.keep_checkpoint(9, "nine".into()).await.unwrap();
    store
        .keep_checkpoint(3, "another three".into())
        .await
        .unwrap();
    assert_eq!(
        store.kept_checkpoint(Some(3)).await.unwrap(),
        Some((3, "three".into()))
    );
    assert_eq!(
        store.kept_checkpoint(None).await.unwrap(),
        Some((9, "nine".into()))
    );
    store.close().await.unwrap();
}

/// Opens `operations` operation streams of three tenants (an intent naming the tenant, then one
/// or two more events, appended apart so operations interleave in the log), plus one stream
/// whose first event names no tenant.
async fn append_operations(store: &SqliteStore, first: u128, operations: u128) {
    use opledger_domain::ids::StreamVersion;
    let tenants = ["acme", "globex", "initech"];
    for id in first..first + operations {
        let intent = EventData {
            event_id: EventId::from_uuid(Uuid::from_u128(id << 8)),
            event_type: "IntentRecorded".into(),
            data: format!(
                "{{\"tenant\":\"{}\",\"n\":{id}}}",
                tenants[(id % 3) as usize]
            )
            .into_bytes(),
            metadata: b"{}".to_vec(),
        };
        let name = StreamName::new(format!("operation-{id}")).unwrap();
        store
            .append(&name, ExpectedVersion::NoStream, vec![intent])
            .await
            .unwrap();
    }
    for id in first..first + operations {
        let name = StreamName::new(format!("operation-{id}")).unwrap();
        let more: Vec<EventData> = (1..=1 + id % 2).map(|n| event((id << 8) + n)).collect();
        store
            .append(&name, ExpectedVersion::Exact(StreamVersion::FIRST), more)
            .await
            .unwrap();
    }
    let other = StreamName::new(format!("subject-{first}")).unwrap();
    store
        .append(
            &other,
            ExpectedVersion::NoStream,
            vec![event(first << 8 | 0xff)],
        )
        .await
        .unwrap();
}

/// Every tenant's tree built from the log's events alone.
async fn tenant_trees_from_log(store: &SqliteStore) -> merkle::tenants::TenantMap {
    use std::collections::HashMap;
    let mut trees = merkle::tenants::TenantTrees::new();
    let mut tenants: HashMap<String, Option<String>> = HashMap::new();
    for event in store.read_all(LogStart::Beginning, 4096).await.unwrap() {
        let tenant = tenants
            .entry(event.stream.as_str().to_owned())
            .or_insert_with(|| {
                merkle::tenants::tenant_of_first_event(&event.event_type, &event.data)
            })
            .clone();
        if let Some(tenant) = tenant {
            trees.push(
                &tenant,
                event.position.value(),
                merkle::leaf_hash(&event.view()),
            );
        }
    }
    trees.map()
}

#[tokio::test]
async fn each_tenants_tree_grows_with_the_log_and_is_the_tree_of_its_events() {
    let dir = TempDir::new().unwrap();
    let store = SqliteStore::open(dir.path().join("events.db"))
        .await
        .unwrap();
    append_operations(&store, 1, 40).await;
    let heads = store
        .tenant_heads()
        .await
        .unwrap()
        .expect("tenant trees kept");
    assert_eq!(heads.log_size, store.tree_size().await.unwrap());
    let expected = tenant_trees_from_log(&store).await;
    assert_eq!(expected.len(), 3);
    assert_eq!(heads.map, expected);
    let (head, tenants) = merkle::heads_to_sign(&store).await.unwrap();
    assert_eq!(head, tree_from_log(&store).await.head());
    assert_eq!(tenants, Some(expected.head()));
    store.close().await.unwrap();
}

#[tokio::test]
async fn tenant_trees_lost_or_never_written_are_rebuilt_from_the_log_when_opened() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("events.db");
    let off = SqliteOptions { log_tree: false };
    let store = SqliteStore::open_with(&path, off).await.unwrap();
    append_operations(&store, 1, 20).await;
    // Without the tree, a checkpoint signs no tenant map: none is kept.
    assert_eq!(store.tenant_heads().await.unwrap(), None);
    store.close().await.unwrap();

    let store = SqliteStore::open(&path).await.unwrap();
    append_operations(&store, 100, 10).await;
    let expected = tenant_trees_from_log(&store).await;
    assert_eq!(store.tenant_heads().await.unwrap().unwrap().map, expected);
    store.close().await.unwrap();

    // A file from before the tenant trees (its log tree kept, its tenant trees gone).
    let connection = rusqlite::Connection::open(&path).unwrap();
    connection
        .execute_batch("DROP TABLE tenant_trees; DROP TABLE tenant_trees_cover;")
        .unwrap();
    drop(connection);
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(store.tenant_heads().await.unwrap().unwrap().map, expected);
    store.close().await.unwrap();
}
