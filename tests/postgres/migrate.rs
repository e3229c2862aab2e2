//! The schema moved on its own, by `opledger migrate` run with a role that owns it, and `serve`
//! with a role that may only read and write rows: on an old schema it refuses to start, saying
//! what to run; once migrated it runs. A database of the previous version (before the
//! transparency log's tree) gets its tree built from its log, and appends grow it from there.

use std::process::{Command, Output};

use opledger_domain::merkle;
use opledger_domain::store::{EventStore, ExpectedVersion};
use opledger_store::PostgresStore;

use crate::postgres_server::{server, PASSWORD};
use crate::{assert_the_tenant_trees_are_the_logs, connect, event, stream, whole_log};

/// Takes a database of this version back to version 5, as the build before the tenants' trees
/// made it: their table and columns removed, the version row set back.
fn back_to_the_version_before_the_tenant_trees(database: &str) {
    server().sql(
        database,
        "DROP TABLE opledger.tenant_trees;
         ALTER TABLE opledger.log_head DROP COLUMN tenants_size;
         ALTER TABLE opledger.streams DROP COLUMN tenant;
         UPDATE opledger.schema_version SET version = 5;",
    );
}

/// Takes a database of this version back to version 3, as the build before the tree made it:
/// version 6's tenant trees, the tree's tables and columns and version 5's claims and webhook
/// definitions removed, the version row set back.
fn back_to_the_version_before_the_tree(database: &str) {
    back_to_the_version_before_the_tenant_trees(database);
    server().sql(
        database,
        "DROP TABLE opledger.review_claims; DROP TABLE opledger.webhook_definitions;
         DROP TABLE opledger.log_tree; DROP TABLE opledger.log_checkpoints;
         ALTER TABLE opledger.log_head DROP COLUMN tree_size, DROP COLUMN tree_frontier;
         UPDATE opledger.schema_version SET version = 3;",
    );
}

async fn append_some(store: &PostgresStore, prefix: &str, streams: u128) {
    for n in 0..streams {
        for version in 0..3_u128 {
            let expected = match version {
                0 => ExpectedVersion::NoStream,
                v => ExpectedVersion::Exact(opledger_domain::ids::StreamVersion::new(v as u64 - 1)),
            };
            store
                .append(
                    &stream(&format!("{prefix}-{n}")),
                    expected,
                    vec![event(n * 10 + version + prefix.len() as u128 * 1_000)],
                )
                .await
                .expect("appended");
        }
    }
}

/// The stored tree's head is the head of the tree of the log as it reads now.
async fn assert_the_tree_is_the_logs(store: &PostgresStore) {
    let mut of_the_log = merkle::MemoryTree::new();
    for event in whole_log(store).await {
        of_the_log.push(merkle::leaf_hash(&event.view()));
    }
    let stored = merkle::head_of(store, None).await.expect("the tree's head");
    assert_eq!(stored, of_the_log.head());
}

fn migrate(url: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["migrate", "--store", url])
        .env_remove("OPLEDGER_CONFIG")
        .output()
        .expect("runs")
}

fn said(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_builds_the_tree_of_a_database_from_before_it_once_and_appends_grow_it() {
    let database = server().database();
    let url = server().url(&database);
    let store = connect(&url).await;
    append_some(&store, "before", 5).await;
    store.close().await.expect("closes");
    back_to_the_version_before_the_tree(&database);

    let first = migrate(&url);
    assert!(first.status.success(), "{}", said(&first));
    assert!(
        said(&first).contains(&format!(
            "migrated opledger's schema from version 3 to {}",
            opledger_postgres::SCHEMA_VERSION
        )) && said(&first).contains("built the transparency log's tree from the log (15 events)"),
        "{}",
        said(&first)
    );
    let again = migrate(&url);
    assert!(again.status.success(), "{}", said(&again));
    assert!(
        said(&again).contains(&format!(
            "schema version {} already; nothing to do",
            opledger_postgres::SCHEMA_VERSION
        )) && !said(&again).contains("built"),
        "{}",
        said(&again)
    );

    let store = connect(&url).await;
    assert_the_tree_is_the_logs(&store).await;
    append_some(&store, "after", 2).await;
    assert_the_tree_is_the_logs(&store).await;
    store.close().await.expect("closes");
}

/// A role that may log in and read and write opledger's rows (now and in tables an owner adds
/// later), and nothing else: what a platform team gives a service.
fn dml_only_role(database: &str) -> String {
    let role = format!("dml_{database}");
    server().sql(
        database,
        &format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}';
             GRANT CONNECT ON DATABASE {database} TO {role};
             GRANT USAGE ON SCHEMA opledger TO {role};
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA opledger TO {role};
             GRANT USAGE ON ALL SEQUENCES IN SCHEMA opledger TO {role};
             ALTER DEFAULT PRIVILEGES IN SCHEMA opledger
                 GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role};
             ALTER DEFAULT PRIVILEGES IN SCHEMA opledger GRANT USAGE ON SEQUENCES TO {role};"
        ),
    );
    format!(
        "postgres://{role}:{PASSWORD}@127.0.0.1:{}/{database}",
        server().port
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_a_dml_only_role_refuses_an_old_schema_saying_to_migrate_and_runs_once_migrated()
{
    let database = server().database();
    let owner_url = server().url(&database);
    let store = connect(&owner_url).await;
    append_some(&store, "owner", 1).await;
    store.close().await.expect("closes");
    back_to_the_version_before_the_tree(&database);
    let dml_url = dml_only_role(&database);

    // The service's own start, as a process, with the role it runs as.
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nstore = \"{dml_url}\"\nread_models = \"{}\"\n",
            dir.path().join("read-models.db").display()
        ),
    )
    .expect("written");
    let refused = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["serve", "--config"])
        .arg(&config)
        .env_remove("OPLEDGER_DB")
        .output()
        .expect("runs");
    assert_ne!(refused.status.code(), Some(0), "{}", said(&refused));
    assert!(
        said(&refused).contains(&format!(
            "holds opledger's schema version 3, this opledger needs version {}",
            opledger_postgres::SCHEMA_VERSION
        )) && said(&refused)
            .contains("Run `opledger migrate --config FILE` once with a role that owns the schema"),
        "{}",
        said(&refused)
    );
    assert_eq!(
        server().sql(&database, "SELECT version FROM opledger.schema_version"),
        "3",
        "the refused start changed nothing"
    );

    let migrated = migrate(&owner_url);
    assert!(migrated.status.success(), "{}", said(&migrated));
    let store = PostgresStore::connect(&dml_url)
        .await
        .expect("the DML-only role runs on the migrated schema");
    append_some(&store, "dml", 2).await;
    assert_the_tree_is_the_logs(&store).await;
    store.close().await.expect("closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_builds_the_tenant_trees_of_a_database_from_before_them_and_appends_grow_them() {
    let database = server().database();
    let url = server().url(&database);
    let store = connect(&url).await;
    crate::approved_operations::record_approved_of(&store, &crate::TENANTS, 5).await;
    store.close().await.expect("closes");
    back_to_the_version_before_the_tenant_trees(&database);

    let migrated = migrate(&url);
    assert!(migrated.status.success(), "{}", said(&migrated));
    assert!(
        said(&migrated).contains(&format!(
            "migrated opledger's schema from version 5 to {}",
            opledger_postgres::SCHEMA_VERSION
        )) && said(&migrated).contains("built the tenants' trees from the log (10 events)"),
        "{}",
        said(&migrated)
    );
    assert_eq!(
        server().sql(
            &database,
            "SELECT count(*) FROM opledger.streams WHERE tenant IS NULL"
        ),
        "0",
        "every stream's tenant is on its row"
    );
    let store = connect(&url).await;
    assert_the_tenant_trees_are_the_logs(&store).await;
    crate::approved_operations::record_approved_of(&store, &crate::TENANTS, 4).await;
    assert_the_tenant_trees_are_the_logs(&store).await;
    store.close().await.expect("closes");

    // Trees removed by hand are built again from the log when the store next starts.
    server().sql(&database, "DELETE FROM opledger.tenant_trees");
    let store = connect(&url).await;
    assert_the_tenant_trees_are_the_logs(&store).await;
    store.close().await.expect("closes");
}
