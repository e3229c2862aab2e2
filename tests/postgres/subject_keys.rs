//! The data subjects' key table in PostgreSQL (`opledger.subject_keys`), on the binary's real
//! cluster: one key per subject whichever instance makes it first, and a destroyed key gone from
//! every file of the database, not only from its rows.

use std::sync::{Arc, Barrier};

use opledger_domain::ids::{OperationId, TenantId};
use opledger_domain::personal::PersonalData;
use opledger_subjects::table::{KeyTable, Write};
use opledger_subjects::{Kek, Subjects};

use crate::postgres_server::server;
use crate::{connect, fresh_store};

const KEK: &str = "5e1f0a9e5b7d2c4e6f8a1b3d5c7e9f0a2b4c6d8e1f3a5b7c9d0e2f4a6b8c1d3e";

fn kek() -> Kek {
    Kek::parse(KEK, "the test").expect("a key")
}

fn key(key_id: &str, tag: &[u8], wrapped: &[u8]) -> Write {
    Write::Key {
        key_id: key_id.to_owned(),
        tag: tag.to_vec(),
        tenant: "tenant-a".to_owned(),
        wrapped_key: wrapped.to_vec(),
        sealed_name: b"sealed name".to_vec(),
        at: "2026-01-01T00:00:00.000Z".to_owned(),
    }
}

fn link(key_id: &str, operation: &str) -> Write {
    Write::Link {
        key_id: key_id.to_owned(),
        operation_id: operation.to_owned(),
        at: "2026-01-01T00:00:01.000Z".to_owned(),
    }
}

/// The files under `dir` whose bytes hold `needle`.
fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the database's directory") {
        let path = entry.expect("an entry").path();
        let bytes = std::fs::read(&path).unwrap_or_default();
        if bytes.windows(needle.len()).any(|window| window == needle) {
            found.push(path);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_making_one_subjects_key_at_once_store_one_and_the_other_learns_its_key_lost()
{
    let (first, database) = fresh_store().await;
    let second = connect(&server().url(&database)).await;
    let mut tables = [
        first.key_table().expect("a key table"),
        second.key_table().expect("a key table"),
    ];
    tokio::task::block_in_place(|| {
        for round in 0..8u8 {
            let tag = [b't', round];
            let ids = [format!("first{round}"), format!("second{round}")];
            let barrier = Arc::new(Barrier::new(2));
            let lost: Vec<Vec<String>> = std::thread::scope(|scope| {
                let writes: Vec<_> = tables
                    .iter_mut()
                    .zip(&ids)
                    .map(|(table, id)| {
                        let barrier = Arc::clone(&barrier);
                        scope.spawn(move || {
                            barrier.wait();
                            table
                                .write(&[key(id, &tag, b"wrapped"), link(id, &format!("op-{id}"))])
                                .expect("the batch commits")
                        })
                    })
                    .collect();
                writes
                    .into_iter()
                    .map(|write| write.join().expect("no panic"))
                    .collect()
            });
            let winner = tables[0]
                .row_by_tag(&tag)
                .expect("read")
                .expect("a row")
                .key_id;
            let loser = ids.iter().find(|id| **id != winner).expect("two ids");
            assert!(ids.contains(&winner), "round {round}: {winner}");
            let mut said_lost: Vec<&String> = lost.iter().flatten().collect();
            said_lost.sort();
            assert_eq!(
                said_lost,
                vec![loser],
                "round {round}: only the loser is told"
            );
            assert_eq!(
                tables[1].operations_of(&winner).expect("read"),
                vec![format!("op-{winner}")]
            );
            assert!(
                tables[1].operations_of(loser).expect("read").is_empty(),
                "the lost key's links are not written"
            );
            assert!(tables[0].row_by_key(loser).expect("read").is_none());
        }
    });
    drop(tables);

    // Two key stores started on the new table at once share one index key, so they name every
    // subject alike: a value sealed by one opens in the other.
    let (one, two) = tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let open = |store: &opledger_store::PostgresStore| {
                let store = store.clone();
                scope.spawn(move || {
                    Subjects::with_tables(
                        Box::new(store.key_table().expect("a key table")),
                        Some(Box::new(store.key_table().expect("a key table"))),
                        kek(),
                    )
                    .expect("the key store opens")
                })
            };
            let (one, two) = (open(&first), open(&second));
            (one.join().expect("no panic"), two.join().expect("no panic"))
        })
    });
    let tenant = TenantId::new("tenant-a").expect("a tenant");
    let operation = OperationId::from_uuid(uuid::Uuid::new_v4());
    let token = one
        .seal(&tenant, "ada@example.org", operation, "\"ada@example.org\"")
        .expect("sealed");
    one.all_durable().await.expect("durable");
    assert_eq!(
        two.open(operation, &token).as_deref(),
        Some("\"ada@example.org\"")
    );
    let again = two
        .seal(&tenant, "ada@example.org", operation, "\"again\"")
        .expect("sealed");
    two.all_durable().await.expect("durable");
    assert_eq!(one.open(operation, &again).as_deref(), Some("\"again\""));
    let shown = tokio::task::block_in_place(|| one.show("ada@example.org")).expect("shown");
    assert_eq!(shown.len(), 1, "one key for the subject: {shown:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destroyed_key_is_in_no_file_of_the_database_and_no_instance_opens_its_values_again() {
    let (first, database) = fresh_store().await;
    let second = connect(&server().url(&database)).await;
    let open = |store: &opledger_store::PostgresStore| {
        tokio::task::block_in_place(|| {
            Subjects::with_tables(
                Box::new(store.key_table().expect("a key table")),
                Some(Box::new(store.key_table().expect("a key table"))),
                kek(),
            )
            .expect("the key store opens")
        })
    };
    let (here, there) = (open(&first), open(&second));
    let tenant = TenantId::new("tenant-a").expect("a tenant");
    // Others around it, so the erased row sits among live ones in the table's pages.
    let mut tokens = Vec::new();
    for n in 0..40 {
        let operation = OperationId::from_uuid(uuid::Uuid::new_v4());
        let subject = format!("person{n}@example.org");
        let token = here
            .seal(&tenant, &subject, operation, "\"a value\"")
            .expect("sealed");
        tokens.push((subject, operation, token));
    }
    here.all_durable().await.expect("durable");
    let (subject, operation, token) = tokens[39].clone();
    assert!(there.open(operation, &token).is_some(), "read by the other");

    let mut reader = first.key_table().expect("a key table");
    let row = tokio::task::block_in_place(|| {
        let id = here.show(&subject).expect("shown").remove(0).key_id;
        reader.row_by_key(&id).expect("read").expect("its row")
    });
    let wrapped = row.wrapped_key.clone().expect("a live key");
    let sealed_name = row.sealed_name.clone().expect("a live name");
    let files = server().database_files(&database);
    assert_eq!(
        files_holding(&files, &wrapped).len(),
        1,
        "the wrapped key is in the table's file before the erasure (the search finds it)"
    );

    let erased =
        tokio::task::block_in_place(|| here.erase(&subject, None, "operator").expect("erased"));
    assert_eq!(erased.len(), 1);
    let files = server().database_files(&database);
    assert_eq!(
        files_holding(&files, &wrapped),
        Vec::<std::path::PathBuf>::new(),
        "the wrapped key after the erasure"
    );
    assert_eq!(
        files_holding(&files, &sealed_name),
        Vec::<std::path::PathBuf>::new(),
        "the sealed name after the erasure"
    );
    let dump = server().dump_plain(&database);
    let hex: String = wrapped.iter().map(|b| format!("{b:02x}")).collect();
    assert!(!String::from_utf8_lossy(&dump).contains(&hex), "in a dump");

    // The other instance had the key in memory: it learns of the erasure from the table's
    // generation, and neither opens the value again.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert_eq!(there.open(operation, &token), None, "the other instance");
    assert_eq!(here.open(operation, &token), None, "this instance");
    let (_, kept_operation, kept) = &tokens[0];
    assert!(
        there.open(*kept_operation, kept).is_some(),
        "another subject's values stay readable"
    );
    let row = tokio::task::block_in_place(|| reader.row_by_key(&row.key_id))
        .expect("read")
        .expect("the row stays, erased");
    assert!(
        row.wrapped_key.is_none() && row.erased_at.is_some(),
        "{row:?}"
    );
}
