//! `opledger subjects`: the data subjects of a SQLite ledger, from its key store beside it —
//! list, show, erase, rotate the key-encryption key. The same erasure as
//! `POST /v1/subjects/{subject}/erase` ([`opledger_subjects::erase_key`]).

use std::path::Path;

use opledger_domain::event::{Principal, PrincipalKind};
use opledger_domain::personal::check_subject;
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_store::postgres::PostgresStore;
use opledger_subjects::table::KeyTable;
use opledger_subjects::{key_store_path, ErasureReport, Kek, Subjects, SubjectsError};

use crate::cli::{
    CliError, KeyStoreArgs, SubjectsEraseArgs, SubjectsListArgs, SubjectsRotateArgs,
    SubjectsShowArgs,
};
use crate::intent::{close, open_existing_ledger};

/// The environment variable holding the key-encryption key when no file is named.
const KEK_ENV: &str = "OPLEDGER_KEK";

/// The key store beside `db` (or at `key_store`), opened with the key in `kek_file` or
/// `$OPLEDGER_KEK`.
pub fn open_subjects(
    db: &Path,
    key_store: Option<&Path>,
    kek_file: Option<&Path>,
) -> Result<Subjects, CliError> {
    let kek = kek_of(kek_file)?;
    let path = key_store.map_or_else(|| key_store_path(db), Path::to_path_buf);
    Subjects::open(Some(&path), kek).map_err(|error| CliError::Config(error.to_string()))
}

fn kek_of(kek_file: Option<&Path>) -> Result<Kek, CliError> {
    match kek_file {
        Some(file) => Kek::from_file(file),
        None => Kek::from_env(KEK_ENV),
    }
    .map_err(|error| {
        CliError::Config(format!(
            "{error} (name the key-encryption key with --kek-file FILE or ${KEK_ENV})"
        ))
    })
}

/// The key store `keys` names: the key tables of the PostgreSQL ledger at `--store` (with that
/// store, open), or the SQLite file beside `--db`.
async fn open(keys: &KeyStoreArgs) -> Result<(Subjects, Option<PostgresStore>), CliError> {
    let Some(url) = &keys.store else {
        let subjects = open_subjects(
            &keys.db,
            keys.key_store.as_deref(),
            keys.kek_file.as_deref(),
        )?;
        return Ok((subjects, None));
    };
    let kek = kek_of(keys.kek_file.as_deref())?;
    let config = |error: &dyn std::fmt::Display| CliError::Config(error.to_string());
    let store = PostgresStore::connect(url)
        .await
        .map_err(|error| config(&error))?;
    let table = || {
        store
            .key_table()
            .map(|table| Box::new(table) as Box<dyn KeyTable>)
            .map_err(|error| config(&error))
    };
    let subjects =
        Subjects::with_tables(table()?, Some(table()?), kek).map_err(|error| config(&error))?;
    Ok((subjects, Some(store)))
}

/// Closes the PostgreSQL store [`open`] opened, if it did.
async fn done(store: Option<PostgresStore>) -> Result<(), CliError> {
    match store {
        Some(store) => Ok(store.close().await?),
        None => Ok(()),
    }
}

/// `subjects list`.
pub async fn list(args: SubjectsListArgs) -> Result<(), CliError> {
    let (subjects, store) = open(&args.keys).await?;
    let listed = subjects.list().map_err(other);
    drop(subjects);
    done(store).await?;
    let listed = listed?;
    if args.json {
        return crate::read_models::print_json(&serde_json::json!({ "subjects": listed }));
    }
    println!(
        "{:<32}  {:<12}  {:>5}  {:<24}  SUBJECT",
        "KEY", "TENANT", "OPS", "ERASED"
    );
    for subject in listed {
        println!(
            "{:<32}  {:<12}  {:>5}  {:<24}  {}",
            subject.key_id,
            subject.tenant,
            subject.operations.len(),
            subject.erased_at.as_deref().unwrap_or("-"),
            subject.subject.as_deref().unwrap_or("[erased]"),
        );
    }
    Ok(())
}

/// `subjects show SUBJECT`.
pub async fn show(args: SubjectsShowArgs) -> Result<(), CliError> {
    let (subjects, store) = open(&args.keys).await?;
    let found = subjects
        .show(&args.subject)
        .map_err(|error| CliError::NotFound(error.to_string()));
    drop(subjects);
    done(store).await?;
    let found = found?;
    if args.json {
        return crate::read_models::print_json(&serde_json::json!({ "subjects": found }));
    }
    for subject in found {
        println!("key_id       {}", subject.key_id);
        println!("tenant       {}", subject.tenant);
        println!("created_at   {}", subject.created_at);
        println!("last_record  {}", subject.last_recorded_at);
        println!(
            "erased_at    {}",
            subject.erased_at.as_deref().unwrap_or("-")
        );
        println!("operations   {}", subject.operations.len());
        for operation in subject.operations {
            println!("  {operation}");
        }
    }
    Ok(())
}

/// `subjects erase SUBJECT --reason …`.
pub async fn erase(args: SubjectsEraseArgs) -> Result<(), CliError> {
    check_subject(&args.subject)?;
    if args.reason.trim().is_empty() {
        return Err(opledger_domain::error::ValidationError::new(
            "--reason",
            "is empty; say why (the request's reference), without the person's data",
        )
        .into());
    }
    let (subjects, store) = open(&args.keys).await?;
    let subjects = std::sync::Arc::new(subjects);
    let found = subjects
        .show(&args.subject)
        .map_err(|error| CliError::NotFound(error.to_string()));
    let by = Principal {
        kind: PrincipalKind::Operator,
        name: args.operator.clone(),
    };
    let (reports, failed) = match (found, store) {
        (Err(error), store) => {
            done(store).await?;
            return Err(error);
        }
        (Ok(found), Some(store)) => {
            let ledger = opledger_domain::app::Ledger::new(store.clone(), SystemClock, RandomIds)
                .with_personal_data(subjects.clone());
            let erased = erase_each(&ledger, &subjects, found, &args, &by).await;
            drop(ledger);
            store.close().await?;
            erased
        }
        (Ok(found), None) => {
            let ledger = open_existing_ledger(&args.keys.db)
                .await?
                .with_personal_data(subjects.clone());
            let erased = erase_each(&ledger, &subjects, found, &args, &by).await;
            close(&ledger).await?;
            erased
        }
    };
    if let Some(error) = failed {
        return Err(error);
    }
    if reports.is_empty() {
        return Err(CliError::NotFound(format!(
            "no data subject of that name in tenant `{}`; nothing was erased",
            args.tenant.unwrap_or_default()
        )));
    }
    if args.json {
        return crate::read_models::print_json(&serde_json::json!({ "erased": reports }));
    }
    for report in reports {
        match &report.already_erased_at {
            Some(at) => println!("subject in tenant {} was erased already at {at} (key {})", report.tenant, report.key_id),
            None => println!(
                "erased: tenant {} key {} — {} operation(s) now read [erased]; {} open one(s) sent to review",
                report.tenant,
                report.key_id,
                report.operations,
                report.sent_to_review.len()
            ),
        }
    }
    Ok(())
}

/// Erases each of `found` (in `--tenant` only, if given) on `ledger`: the reports, and the
/// failure that stopped it, if one did.
async fn erase_each<S, C, I>(
    ledger: &opledger_domain::app::Ledger<S, C, I>,
    subjects: &Subjects,
    found: Vec<opledger_subjects::SubjectSummary>,
    args: &SubjectsEraseArgs,
    by: &Principal,
) -> (Vec<ErasureReport>, Option<CliError>)
where
    S: opledger_domain::store::EventStore,
    C: opledger_domain::ports::Clock,
    I: opledger_domain::ports::IdSource,
{
    let mut reports = Vec::new();
    for summary in found {
        if args
            .tenant
            .as_ref()
            .is_some_and(|tenant| *tenant != summary.tenant)
        {
            continue;
        }
        match opledger_subjects::erase_key(
            ledger,
            subjects,
            &summary.key_id,
            by.clone(),
            &args.reason,
        )
        .await
        {
            Ok(report) => reports.push(report),
            Err(error) => return (reports, Some(CliError::Other(error.to_string()))),
        }
    }
    (reports, None)
}

/// `subjects rotate-kek --new-kek-file FILE`.
pub async fn rotate(args: SubjectsRotateArgs) -> Result<(), CliError> {
    let new =
        Kek::from_file(&args.new_kek_file).map_err(|error| CliError::Config(error.to_string()))?;
    let (subjects, store) = open(&args.keys).await?;
    let id = new.id();
    let count = subjects.rotate_kek(new).map_err(other);
    drop(subjects);
    done(store).await?;
    let count = count?;
    println!("re-wrapped {count} data key(s) under the key-encryption key {id}; start the server with the new key from now on");
    Ok(())
}

fn other(error: SubjectsError) -> CliError {
    CliError::Other(error.to_string())
}
