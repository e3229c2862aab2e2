//! `opledger bench …`: the harnesses live in the `opledger-bench` crate; this module hands them
//! the parts of the command they measure as they are (see [`opledger_bench::Product`]) and turns
//! their errors into the command's own, with the same messages and exit statuses.

use std::path::Path;

use opledger_bench::{BenchArgs, BenchError, Product, ProductFuture, SqliteLedger};
use opledger_crm_stand::Stand;
use opledger_http_api::ServeConfig;

use crate::cli::CliError;

/// The `opledger` command, as the harnesses see it.
struct Opledger;

impl Product for Opledger {
    fn open_ledger<'a>(
        &'a self,
        path: &'a Path,
    ) -> ProductFuture<'a, Result<SqliteLedger, BenchError>> {
        Box::pin(async move { Ok(crate::intent::open_ledger(path).await?) })
    }

    fn open_for_reading<'a>(
        &'a self,
        path: &'a Path,
    ) -> ProductFuture<'a, Result<SqliteLedger, BenchError>> {
        Box::pin(async move { Ok(crate::intent::open_for_reading(path).await?) })
    }

    fn embedded_default<'a>(
        &'a self,
        db: &'a Path,
    ) -> ProductFuture<'a, Result<(ServeConfig, Stand), BenchError>> {
        Box::pin(async move { Ok(crate::serve::embedded_default(db).await?) })
    }

    fn shutdown_signal(&self) -> ProductFuture<'static, ()> {
        Box::pin(crate::serve::shutdown_signal())
    }

    fn demo_tenant_token(&self) -> &'static str {
        crate::serve::DEMO_TENANT_TOKEN
    }

    fn demo_crm_token(&self) -> &'static str {
        crate::serve::DEMO_CRM_TOKEN
    }
}

/// `opledger bench`.
pub async fn run(args: BenchArgs) -> Result<(), CliError> {
    Ok(opledger_bench::run(args, &Opledger).await?)
}

impl From<CliError> for BenchError {
    fn from(error: CliError) -> Self {
        BenchError::Product(Box::new(error))
    }
}

impl From<BenchError> for CliError {
    fn from(error: BenchError) -> Self {
        match error {
            BenchError::Invalid(error) => CliError::Invalid(error),
            BenchError::App(error) => CliError::App(error),
            BenchError::Store(error) => CliError::Store(error),
            BenchError::ReadModel(error) => CliError::ReadModel(error),
            BenchError::Other(message) => CliError::Other(message),
            BenchError::Config(message) => CliError::Config(message),
            BenchError::NotFound(message) => CliError::NotFound(message),
            BenchError::Interrupted => CliError::Interrupted,
            // Only this module boxes errors into `Product`, and only the command's own.
            BenchError::Product(error) => match error.downcast::<CliError>() {
                Ok(error) => *error,
                Err(error) => CliError::Other(error.to_string()),
            },
        }
    }
}
