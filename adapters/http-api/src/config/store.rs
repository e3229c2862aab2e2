//! The ledger's store: `store = "URL"`, or a `[store]` table with the URL and the limits of a
//! PostgreSQL store (its read pool and timeouts), each checked here against the store's own
//! bounds so a wrong value stops the start with the file's line.

use opledger_store::postgres::{PostgresConfig, PostgresError, StoreLimits};
use serde::Deserialize;
use toml::Spanned;

use super::{parse_store, Checker, ConfigError, StoreUrl};

/// The `[store]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreTable {
    url: String,
    pool_size: Option<usize>,
    pool_wait_ms: Option<u64>,
    connect_timeout_ms: Option<u64>,
    statement_timeout_ms: Option<u64>,
    idle_in_transaction_timeout_ms: Option<u64>,
    round_trip_timeout_ms: Option<u64>,
    subscription_poll_ms: Option<u64>,
}

impl Checker<'_> {
    /// The store and its limits; the default SQLite file when the file names none.
    pub(super) fn store(
        &self,
        entry: Option<&Spanned<toml::Value>>,
    ) -> Result<(StoreUrl, StoreLimits), ConfigError> {
        let Some(entry) = entry else {
            return Ok((
                StoreUrl::Sqlite(std::path::PathBuf::from(
                    opledger_store::DEFAULT_SQLITE_PATH,
                )),
                StoreLimits::default(),
            ));
        };
        let at = Some(entry.span());
        let fail = |field: &str, message: String| self.error(at.clone(), field, message);
        let table = match entry.get_ref() {
            toml::Value::String(url) => {
                let store = parse_store(url).map_err(|message| fail("store", message))?;
                return Ok((store, StoreLimits::default()));
            }
            toml::Value::Table(table) => table.clone(),
            _ => {
                return Err(fail(
                    "store",
                    "is neither a URL nor a table; write store = \"postgres://…\" or a [store] table with url = \"…\" and the pool's limits".into(),
                ))
            }
        };
        let table: StoreTable = toml::Value::Table(table)
            .try_into()
            .map_err(|error: toml::de::Error| fail("store", error.message().to_owned()))?;
        let store = parse_store(&table.url).map_err(|message| fail("store.url", message))?;
        let limits = StoreLimits {
            pool_size: table.pool_size,
            pool_wait_ms: table.pool_wait_ms,
            connect_timeout_ms: table.connect_timeout_ms,
            statement_timeout_ms: table.statement_timeout_ms,
            idle_in_transaction_timeout_ms: table.idle_in_transaction_timeout_ms,
            round_trip_timeout_ms: table.round_trip_timeout_ms,
            subscription_poll_ms: table.subscription_poll_ms,
        };
        match &store {
            StoreUrl::Postgres(url) => {
                let mut config = PostgresConfig::from_url(url)
                    .map_err(|error| fail("store.url", error.to_string()))?;
                config.apply(&limits).map_err(|error| match error {
                    PostgresError::InvalidUrl { reason } => fail("store", reason),
                    other => fail("store", other.to_string()),
                })?;
            }
            _ if limits.any() => {
                return Err(fail(
                    "store",
                    "sets a pool or timeout limit, which only a PostgreSQL store has; remove it or use a postgres:// URL".into(),
                ))
            }
            _ => {}
        }
        Ok((store, limits))
    }
}
