//! The one error type the binary reports, its exit statuses and its `--json` shape.

use std::process::ExitCode;

use opledger_domain::app::AppError;
use opledger_domain::error::ValidationError;
use opledger_domain::store::StoreError;

/// Everything a subcommand can fail with, each with the exit code scripts can branch on.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The input is wrong; nothing was written.
    #[error("{0}")]
    Invalid(#[from] ValidationError),
    /// The ledger refused or failed.
    #[error("{0}")]
    App(#[from] AppError),
    /// The store could not be opened or failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// Anything else at the edge (files, terminals).
    #[error("{0}")]
    Other(String),
    /// The read models failed.
    #[error("{0}")]
    ReadModel(#[from] opledger_readmodel::ReadModelError),
    /// The server's configuration is wrong; nothing was opened.
    #[error("{0}")]
    Config(String),
    /// Nothing matches the id asked for.
    #[error("{0}")]
    NotFound(String),
    /// `replay --verify` found the live read models differ from a rebuild.
    #[error("the live read models differ from a rebuild in {tables} table(s); run `opledger replay` to replace them")]
    Differs {
        /// How many tables differ.
        tables: usize,
    },
    /// `verify` found tampering.
    #[error("the ledger shows {findings} sign(s) of tampering")]
    Tampered {
        /// How many findings.
        findings: usize,
    },
    /// The user interrupted.
    #[error("interrupted; everything acknowledged so far is in the ledger")]
    Interrupted,
    /// `sim` found seeds that broke an invariant.
    #[error("{failed} seed(s) broke an invariant; each one's reproduce line is above")]
    SimFailed {
        /// How many.
        failed: usize,
    },
    /// The file at `--db` cannot be a ledger for this command (missing, in a missing directory,
    /// not a database); nothing was opened or created.
    #[error("{0}")]
    LedgerFile(#[from] crate::ledger_file::LedgerFileError),
    /// The store refused to open an existing file as a ledger; `next` says what to do.
    #[error("{error}; {next}")]
    Unopenable {
        /// The store's refusal.
        error: StoreError,
        /// The next step, in a phrase.
        next: &'static str,
    },
}

impl CliError {
    /// 2 for bad input (nothing written), 3 for a refusal by the ledger's rules, 1 otherwise.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            // The decider checks some inputs itself (note lengths); those are bad input too.
            Self::Invalid(_)
            | Self::App(
                AppError::Invalid(_)
                | AppError::Rejected {
                    rejection: opledger_domain::decider::Rejection::Invalid(_),
                    ..
                },
            ) => ExitCode::from(2),
            Self::App(
                AppError::Rejected { .. }
                | AppError::NotFound { .. }
                | AppError::SourceReused { .. },
            ) => ExitCode::from(3),
            Self::NotFound(_) => ExitCode::from(3),
            Self::Config(_) => ExitCode::from(2),
            Self::ReadModel(opledger_readmodel::ReadModelError::InvalidQuery { .. }) => {
                ExitCode::from(2)
            }
            Self::Interrupted => ExitCode::from(130),
            Self::Tampered { .. } => ExitCode::from(4),
            _ => ExitCode::FAILURE,
        }
    }

    /// A short, stable name of what went wrong, for scripts reading `--json` errors; the same
    /// names as the HTTP API's where the meaning is the same.
    pub fn code(&self) -> &'static str {
        use opledger_domain::decider::Rejection;
        match self {
            Self::Invalid(_)
            | Self::App(
                AppError::Invalid(_)
                | AppError::Rejected {
                    rejection: Rejection::Invalid(_),
                    ..
                },
            )
            | Self::ReadModel(opledger_readmodel::ReadModelError::InvalidQuery { .. }) => {
                "invalid_input"
            }
            Self::App(AppError::Rejected { .. }) => "refused",
            Self::App(AppError::NotFound { .. }) | Self::NotFound(_) => "not_found",
            Self::App(AppError::SourceReused { .. }) => "source_id_reused",
            Self::App(AppError::Moved { .. }) => "stale",
            Self::App(AppError::Contended { .. }) => "contended",
            Self::App(AppError::Store(_)) | Self::Store(_) => "store_unavailable",
            Self::App(AppError::Decode(_)) => "undecodable_event",
            Self::App(AppError::PersonalData(
                opledger_domain::personal::PersonalDataError::Erased,
            )) => "subject_erased",
            Self::App(AppError::PersonalData(_)) => "personal_data_failed",
            Self::ReadModel(_) => "read_models_unavailable",
            Self::Config(_) => "invalid_config",
            Self::Differs { .. } => "read_models_differ",
            Self::Tampered { .. } => "tampered",
            Self::Interrupted => "interrupted",
            Self::SimFailed { .. } => "sim_failed",
            Self::LedgerFile(error) => error.code(),
            Self::Unopenable { .. } => "store_unavailable",
            Self::Other(_) => "failed",
        }
    }
}

impl CliError {
    /// Whether the command already printed its report of this failure on stdout (`replay
    /// --verify`'s differences, `verify`'s findings), so nothing more is printed there.
    pub fn reported_on_stdout(&self) -> bool {
        matches!(self, Self::Differs { .. } | Self::Tampered { .. })
    }
}

/// `error` as `--json` prints it: `{"error": {"code": …, "message": …}}`, the HTTP API's shape.
pub fn error_json(error: &CliError) -> serde_json::Value {
    serde_json::json!({"error": {"code": error.code(), "message": error.to_string()}})
}

impl From<opledger_http_api::render::RenderError> for CliError {
    fn from(error: opledger_http_api::render::RenderError) -> Self {
        use opledger_http_api::render::RenderError;
        match error {
            RenderError::App(error) => Self::App(error),
            RenderError::Store(error) => Self::Store(error),
            RenderError::ReadModel(error) => Self::ReadModel(error),
            RenderError::Invalid(error) => Self::Invalid(error),
            other => Self::Other(other.to_string()),
        }
    }
}

impl From<opledger_http_api::ServeError> for CliError {
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
