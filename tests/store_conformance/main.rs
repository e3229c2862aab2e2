//! The conformance suite of the event-store port, run against every store.
//!
//! [`suite`] holds the checks, each generic over the store; the macro below instantiates every
//! check once per store, so a failure reads as `sqlite::thirty_two_racing_appends_have_exactly_one_winner`.
//! [`sqlite_file`] adds what only a store on disk can promise: data that survives a restart, a
//! refused file left alone, and acknowledged appends that survive a SIGKILL.
//!
//! `postgres` runs it against the PostgreSQL store on a private cluster the binary starts
//! (`tests/postgres_server`), a fresh database per check.
//!
//! `kurrentdb` runs the suite against the KurrentDB store on the protocol stand (a fresh stand
//! per check); `kurrentdb_server` runs it against a real server when `OPLEDGER_KURRENTDB_URL` is
//! set (each check in its own stream namespace, so a shared server's other data stays out), and
//! otherwise prints that it was skipped. One check is not in their list: KurrentDB does not refuse
//! an event id already stored in another stream (see `store/kurrentdb.rs`).

#[path = "../postgres_server/mod.rs"]
mod postgres_server;
mod sqlite_file;
mod suite;
mod support;

use opledger_kurrentdb_stand::KurrentDbStand;
use opledger_store::kurrentdb::KurrentDbConfig;
use opledger_store::{KurrentDbStore, MemoryStore, PostgresStore, SqliteStore};
use tempfile::TempDir;

/// How a check gets a fresh, empty store and what is done with it afterwards.
trait Harness: Sized {
    type Store: support::TestStore;

    async fn start() -> Self;
    fn store(&self) -> Self::Store;
    async fn finish(self);
}

struct MemoryHarness(MemoryStore);

impl Harness for MemoryHarness {
    type Store = MemoryStore;

    async fn start() -> Self {
        Self(MemoryStore::new())
    }

    fn store(&self) -> MemoryStore {
        self.0.clone()
    }

    async fn finish(self) {}
}

struct SqliteHarness {
    store: SqliteStore,
    /// Keeps the file until the store is closed.
    _dir: TempDir,
}

impl Harness for SqliteHarness {
    type Store = SqliteStore;

    async fn start() -> Self {
        let dir = TempDir::new().expect("create a temporary directory");
        let store = SqliteStore::open(dir.path().join("events.db"))
            .await
            .expect("open a fresh SQLite store");
        Self { store, _dir: dir }
    }

    fn store(&self) -> SqliteStore {
        self.store.clone()
    }

    async fn finish(self) {
        self.store.close().await.expect("close the SQLite store");
    }
}

/// The PostgreSQL store on a fresh database of the binary's private cluster.
struct PostgresHarness(PostgresStore);

impl Harness for PostgresHarness {
    type Store = PostgresStore;

    async fn start() -> Self {
        let server = postgres_server::server();
        let url = server.url(&server.database());
        Self(
            PostgresStore::connect(&url)
                .await
                .expect("connect to the test PostgreSQL"),
        )
    }

    fn store(&self) -> PostgresStore {
        self.0.clone()
    }

    async fn finish(self) {
        self.0.close().await.expect("close the PostgreSQL store");
    }
}

/// The KurrentDB store on a fresh protocol stand.
struct KurrentDbStandHarness {
    store: KurrentDbStore,
    _stand: KurrentDbStand,
}

/// A store whose log is every stream of one fresh namespace, so the suite's stream names
/// ("race", "a", …) are all in the global log.
async fn kurrentdb_store(connection_string: &str) -> KurrentDbStore {
    let mut config = KurrentDbConfig::from_connection_string(connection_string)
        .expect("a valid connection string");
    config.namespace = format!("conformance-{}-", uuid::Uuid::new_v4().simple());
    config.log_prefix = String::new();
    KurrentDbStore::connect_with(config)
        .await
        .expect("connect to KurrentDB")
}

impl Harness for KurrentDbStandHarness {
    type Store = KurrentDbStore;

    async fn start() -> Self {
        let stand = KurrentDbStand::start()
            .await
            .expect("start the KurrentDB stand");
        // System records in $all that the log's filter must keep out.
        stand.write_system_events(3);
        let store = kurrentdb_store(&stand.connection_string()).await;
        Self {
            store,
            _stand: stand,
        }
    }

    fn store(&self) -> KurrentDbStore {
        self.store.clone()
    }

    async fn finish(self) {}
}

/// The KurrentDB store on the server named by `OPLEDGER_KURRENTDB_URL`.
struct KurrentDbServerHarness(KurrentDbStore);

/// The variable naming a real KurrentDB server for the opt-in checks.
const SERVER_URL_VAR: &str = "OPLEDGER_KURRENTDB_URL";

impl KurrentDbServerHarness {
    fn url() -> Option<String> {
        let url = std::env::var(SERVER_URL_VAR)
            .ok()
            .filter(|url| !url.is_empty());
        if url.is_none() {
            eprintln!("skipped: set {SERVER_URL_VAR}=esdb://localhost:2113?tls=false to run this check against a real KurrentDB server");
        }
        url
    }
}

impl Harness for KurrentDbServerHarness {
    type Store = KurrentDbStore;

    async fn start() -> Self {
        let url = std::env::var(SERVER_URL_VAR).expect("checked by the caller");
        Self(kurrentdb_store(&url).await)
    }

    fn store(&self) -> KurrentDbStore {
        self.0.clone()
    }

    async fn finish(self) {}
}

/// The checks every store passes.
macro_rules! common_checks {
    ($callback:ident ! ($($prefix:tt)*)) => {
        $callback!($($prefix)*
                thirty_two_racing_appends_have_exactly_one_winner,
                thirty_two_racing_creations_of_one_stream_have_exactly_one_winner,
                appending_no_stream_to_an_existing_stream_conflicts_with_its_last_version,
                appending_an_exact_version_to_a_missing_stream_conflicts_with_no_stream,
                appending_behind_or_ahead_of_the_stream_conflicts_with_its_last_version,
                re_appending_the_same_event_ids_returns_the_first_outcome_and_writes_nothing,
                re_appending_at_the_same_version_with_other_ids_conflicts,
                positions_strictly_increase_in_commit_order_across_sixteen_concurrent_writers,
                a_subscription_started_while_writers_run_delivers_every_event_once_in_order,
                a_subscription_after_a_position_starts_strictly_after_it,
                a_caught_up_subscription_wakes_for_the_next_commit,
                reading_a_stream_from_a_middle_version_pages_by_max_count,
                a_missing_stream_reads_as_empty,
                reading_the_log_pages_with_log_start_after,
                reads_return_at_most_the_maximum_read_batch,
                an_empty_append_is_refused_and_writes_nothing,
                an_oversized_event_is_refused_and_writes_nothing,
                an_append_over_the_event_count_limit_is_refused_and_writes_nothing,
                recorded_events_carry_exactly_the_appended_type_data_and_metadata,
                the_head_position_is_none_for_an_empty_log_then_the_newest_position,
        );
    };
}

/// One `#[tokio::test]` per check for one store, in a module named after the store.
macro_rules! conformance_suite {
    ($backend:ident, $harness:ty) => {
        mod $backend {
            use super::*;

            common_checks!(conformance_suite!(@checks $harness;));
            conformance_suite!(@checks $harness; an_event_id_stored_elsewhere_is_refused_and_nothing_is_written);
        }
    };
    (@without_unique_ids $backend:ident, $harness:ty) => {
        mod $backend {
            use super::*;

            common_checks!(conformance_suite!(@checks $harness;));
        }
    };
    (@opt_in $backend:ident, $harness:ty) => {
        mod $backend {
            use super::*;

            common_checks!(conformance_suite!(@opt_in_checks $harness;));
        }
    };
    (@opt_in_checks $harness:ty; $($check:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                if KurrentDbServerHarness::url().is_none() {
                    return;
                }
                let harness = <$harness as Harness>::start().await;
                crate::suite::$check(harness.store()).await;
                harness.finish().await;
            }
        )+
    };
    (@checks $harness:ty; $($check:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                let harness = <$harness as Harness>::start().await;
                crate::suite::$check(harness.store()).await;
                harness.finish().await;
            }
        )+
    };
}

conformance_suite!(memory, MemoryHarness);
conformance_suite!(sqlite, SqliteHarness);
conformance_suite!(postgres, PostgresHarness);
conformance_suite!(@without_unique_ids kurrentdb, KurrentDbStandHarness);
conformance_suite!(@opt_in kurrentdb_server, KurrentDbServerHarness);
