//! The benchmark harnesses behind `opledger bench …`: the store's lifecycles per second, a
//! replay, a read-model rebuild, erasure and proofs on a ledger file (`ledger.rs`), the HTTP
//! service end to end (`http.rs`), a restart's start-up time (`startup.rs`), the crash soak
//! with real processes (`soak/`), and the no-ledger floor for the peers' harness (`floor.rs`).
//! `args.rs` holds their command line, which the `opledger` parser takes as it is.
//!
//! They measure the product as people run it, so they borrow from the `opledger` command what it
//! alone defines (see [`Product`]): ledger files opened with its checks, `serve`'s embedded
//! default and its shutdown signal. The soak and the start-up benchmark start `opledger serve`
//! as a child from the running executable, so the harnesses run inside the `opledger` binary.
//! They never touch a ledger they were not pointed at: every file they create is fresh and is
//! removed afterwards unless a flag keeps it.

mod args;
mod error;
mod files;
mod floor;
mod http;
mod ledger;
mod soak;
mod startup;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use opledger_crm_stand::Stand;
use opledger_domain::app::Ledger;
use opledger_http_api::ServeConfig;
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_store::SqliteStore;

pub use args::{
    BenchArgs, BenchEraseArgs, BenchFloorArgs, BenchHttpArgs, BenchProjectionsArgs,
    BenchProofsArgs, BenchReplayArgs, BenchSoakArgs, BenchStartupArgs, BenchStoreArgs, BenchTarget,
};
pub use error::BenchError;

use crate::files::fresh_path;

/// The ledger over the embedded store with the real clock and randomness.
pub type SqliteLedger = Ledger<SqliteStore, SystemClock, RandomIds>;

/// A future the product hands back, borrowing what it was given.
pub type ProductFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the harnesses take from the `opledger` command: the parts of it they run as they are,
/// so a measurement is of the product and not of a copy.
pub trait Product: Sync {
    /// Opens (or creates) the ledger file, with the command's checks of the path.
    fn open_ledger<'a>(
        &'a self,
        path: &'a Path,
    ) -> ProductFuture<'a, Result<SqliteLedger, BenchError>>;
    /// Opens a ledger file that must already exist, to read it; nothing is created.
    fn open_for_reading<'a>(
        &'a self,
        path: &'a Path,
    ) -> ProductFuture<'a, Result<SqliteLedger, BenchError>>;
    /// `opledger serve`'s embedded default on the ledger at `db`, with its CRM stand started.
    fn embedded_default<'a>(
        &'a self,
        db: &'a Path,
    ) -> ProductFuture<'a, Result<(ServeConfig, Stand), BenchError>>;
    /// `opledger serve`'s shutdown: resolves at SIGTERM or Ctrl-C.
    fn shutdown_signal(&self) -> ProductFuture<'static, ()>;
    /// The embedded default's tenant token.
    fn demo_tenant_token(&self) -> &'static str;
    /// The CRM stand's token for the embedded default's account `demo`.
    fn demo_crm_token(&self) -> &'static str;
}

/// Closes the ledger's store, waiting until every acknowledged append is committed.
async fn close(ledger: &SqliteLedger) -> Result<(), BenchError> {
    Ok(ledger.store().clone().close().await?)
}

/// `opledger bench …`: runs the target asked for.
pub async fn run(args: BenchArgs, product: &'static dyn Product) -> Result<(), BenchError> {
    match args.target {
        BenchTarget::Store(args) => {
            tokio::select! {
                result = ledger::store(args, product) => result,
                _ = tokio::signal::ctrl_c() => Err(BenchError::Interrupted),
            }
        }
        BenchTarget::Replay(args) => {
            let ledger = Arc::new(product.open_for_reading(&args.db).await?);
            let result = tokio::select! {
                result = ledger::replay(&ledger, "sqlite") => result,
                _ = tokio::signal::ctrl_c() => Err(BenchError::Interrupted),
            };
            let closed = close(&ledger).await;
            result?;
            closed
        }
        BenchTarget::Http(args) => http::run(args, product).await,
        BenchTarget::Erase(args) => ledger::erase(args, product).await,
        BenchTarget::Floor(args) => floor::run(args, product).await,
        BenchTarget::Proofs(args) => {
            let ledger = product.open_for_reading(&args.db).await?;
            let result = tokio::select! {
                result = ledger::proofs(ledger.store(), args.samples) => result,
                _ = tokio::signal::ctrl_c() => Err(BenchError::Interrupted),
            };
            let closed = close(&ledger).await;
            result?;
            closed
        }
        BenchTarget::Startup(args) => startup::run(args, product).await,
        BenchTarget::Soak(args) => soak::run(args).await,
        BenchTarget::Projections(args) => {
            let ledger = Arc::new(product.open_for_reading(&args.db).await?);
            let target = fresh_path("projections");
            let result = tokio::select! {
                result = ledger::projections(&ledger, &target, args.floor) => result,
                _ = tokio::signal::ctrl_c() => Err(BenchError::Interrupted),
            };
            let closed = close(&ledger).await;
            files::remove_database(&target);
            result?;
            closed
        }
    }
}
