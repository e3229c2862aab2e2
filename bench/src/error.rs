//! What a harness can fail with. The `opledger` command maps each variant to its own error of
//! the same name, so `opledger bench` keeps its messages and exit statuses.

use opledger_domain::app::AppError;
use opledger_domain::error::ValidationError;
use opledger_domain::store::StoreError;

/// Everything a harness can fail with.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The input is wrong; nothing was measured.
    #[error("{0}")]
    Invalid(#[from] ValidationError),
    /// The ledger refused or failed.
    #[error("{0}")]
    App(#[from] AppError),
    /// The store could not be opened or failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The read models failed.
    #[error("{0}")]
    ReadModel(#[from] opledger_readmodel::ReadModelError),
    /// Anything else (files, processes, the HTTP client, a failed check).
    #[error("{0}")]
    Other(String),
    /// A setting is out of its range; nothing was measured.
    #[error("{0}")]
    Config(String),
    /// Nothing to measure (an empty tree).
    #[error("{0}")]
    NotFound(String),
    /// The user interrupted.
    #[error("interrupted; everything acknowledged so far is in the ledger")]
    Interrupted,
    /// The product failed (opening a ledger file, starting its embedded default): its own
    /// error, which the `opledger` command reports as it reports it anywhere else.
    #[error("{0}")]
    Product(Box<dyn std::error::Error + Send + Sync>),
}

/// A server `bench http` started failed, as `opledger serve` reports it.
impl From<opledger_http_api::ServeError> for BenchError {
    fn from(error: opledger_http_api::ServeError) -> Self {
        use opledger_http_api::ServeError;
        match error {
            ServeError::Config(message) => Self::Config(message),
            ServeError::Invalid(error) => Self::Invalid(error),
            ServeError::App(error) => Self::App(error),
            ServeError::Store(error) => Self::Store(error),
            ServeError::ReadModel(error) => Self::ReadModel(error),
            ServeError::Io(message) => Self::Other(message),
            ServeError::Webhooks(error) => Self::Other(error.to_string()),
        }
    }
}
