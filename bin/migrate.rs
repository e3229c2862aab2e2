//! `opledger migrate`: brings the ledger's schema to this build's version on its own, for a role
//! that owns the schema, so that `serve` can run with a role that may only read and write rows.
//! Idempotent: a database already at this version is left as it is, and says so. It must never
//! change a database of a newer opledger.

use opledger_http_api::config::StoreUrl;
use opledger_store::postgres::{PostgresConfig, PostgresStore, StoreLimits};

use crate::cli::{CliError, MigrateArgs};

pub async fn run(args: MigrateArgs) -> Result<(), CliError> {
    let (store, limits) =
        match (&args.store, &args.config) {
            (Some(url), _) => (StoreUrl::Postgres(url.clone()), StoreLimits::default()),
            (None, Some(path)) => {
                let config = opledger_http_api::config::load(path)
                    .map_err(|error| CliError::Config(error.to_string()))?;
                (config.store, config.store_limits)
            }
            (None, None) => return Err(CliError::Config(
                "name the ledger to migrate: --config FILE (its `store`) or --store postgres://…"
                    .into(),
            )),
        };
    let url = match store {
        StoreUrl::Postgres(url) => url,
        StoreUrl::Sqlite(path) => {
            println!(
                "{}: a SQLite ledger's schema is brought up to date when opledger opens it; nothing to do",
                path.display()
            );
            return Ok(());
        }
        StoreUrl::KurrentDb(_) => {
            println!("a KurrentDB ledger has no schema of opledger's; nothing to do");
            return Ok(());
        }
    };
    let mut config =
        PostgresConfig::from_url(&url).map_err(|error| CliError::Config(error.to_string()))?;
    config
        .apply(&limits)
        .map_err(|error| CliError::Config(error.to_string()))?;
    let target = config.target();
    let migration = PostgresStore::migrate(config)
        .await
        .map_err(|error| CliError::Config(error.to_string()))?;
    if migration.changed_nothing() {
        println!(
            "{target}: schema version {} already; nothing to do",
            migration.to
        );
    } else if migration.from == 0 {
        println!(
            "{target}: created opledger's schema, version {}",
            migration.to
        );
    } else {
        println!(
            "{target}: migrated opledger's schema from version {} to {}",
            migration.from, migration.to
        );
    }
    if let Some(leaves) = migration.tree_built {
        println!("{target}: built the transparency log's tree from the log ({leaves} events)");
    }
    if let Some(leaves) = migration.tenant_trees_built.filter(|leaves| *leaves > 0) {
        println!("{target}: built the tenants' trees from the log ({leaves} events)");
    }
    Ok(())
}
