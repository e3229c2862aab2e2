//! `opledger replay [--verify]`: rebuild the read models from position 0 into a fresh file next to
//! the read-model file, then either compare it with the live read models table by table (`--verify`) or put
//! it in their place with one atomic rename.
//!
//! Both files are brought to the same position (the log's head when the replay started), so a
//! difference is a real one, not writes that arrived in between. It must never rename over a
//! read-model file another process has open: SQLite would pair that process's write-ahead log with the
//! new file. The read models' lock file makes sure of that (`readmodel::replace_read_models`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Instant;

use opledger_domain::ids::GlobalPosition;
use opledger_domain::store::EventStore;
use opledger_readmodel::{
    compare_files, is_read_model_file, rebuild_to, replace_read_models, ReadModelError, ReadModels,
    TableDifference,
};
use opledger_store::SqliteStore;
use serde_json::json;

use crate::cli::{CliError, ReplayArgs};
use crate::intent::{close, open_for_reading, SqliteLedger};
use crate::read_models::{self, print_json};

pub async fn run(args: ReplayArgs) -> Result<(), CliError> {
    let ledger = open_for_reading(&args.read_models.store.db).await?;
    let live = read_models::read_models_path(&args.read_models);
    let temporary = sibling(&live, &format!(".replay-{}", std::process::id()));
    let result = tokio::select! {
        result = replay(&ledger, &args, &live, &temporary) => result,
        _ = tokio::signal::ctrl_c() => Err(CliError::Interrupted),
    };
    let closed = close(&ledger).await;
    // Whatever happened, the temporary file is not left behind (after a rename it is gone).
    remove_database(&temporary);
    result?;
    closed
}

async fn replay(
    ledger: &SqliteLedger,
    args: &ReplayArgs,
    live: &Path,
    temporary: &Path,
) -> Result<(), CliError> {
    let store = ledger.store();
    let target = replay_target(store, args, live).await?;
    // A leftover from an interrupted replay of this same process id is stale.
    remove_database(temporary);
    let started = Instant::now();
    // The rebuild folds in memory and writes the file without a journal; it appears at
    // `temporary` only once complete and fsynced.
    let (rebuilt, report) = rebuild_to(store, temporary, target).await?;
    let seconds = started.elapsed().as_secs_f64();
    // Closing the connection folds its write-ahead log into the file, so the file alone is whole.
    drop(rebuilt);
    let rate = if seconds > 0.0 {
        report.applied as f64 / seconds
    } else {
        0.0
    };
    let summary = format!(
        "replayed {} events in {seconds:.2} s ({rate:.0} events/s)",
        report.applied
    );
    if args.verify {
        let differences = compare_with_live(store, args, live, temporary, target).await?;
        let outcome = if differences.is_empty() {
            Ok(())
        } else {
            Err(CliError::Differs {
                tables: differences.len(),
            })
        };
        report_differences(
            args.json,
            &summary,
            report.applied,
            seconds,
            &differences,
            outcome.as_ref().err(),
        )?;
        return outcome;
    }
    replace(live, temporary).await?;
    if args.json {
        return print_json(&json!({
            "events": report.applied,
            "seconds": seconds,
            "events_per_s": rate,
            "replaced": live,
        }));
    }
    println!("{summary}");
    println!("replaced {}", live.display());
    Ok(())
}

/// The position to rebuild to: the log's head, or with `--verify` the live read models'
/// checkpoint when that is further, refused when it is past the ledger itself.
async fn replay_target(
    store: &SqliteStore,
    args: &ReplayArgs,
    live: &Path,
) -> Result<Option<GlobalPosition>, CliError> {
    let head = EventStore::head_position(store).await?;
    if !args.verify {
        return Ok(head);
    }
    // Verifying compares two files at one position. The live read models may already be past the head
    // read above (another process caught them up meanwhile), so rebuild to whichever is further.
    let live_models = ReadModels::open(live).await?;
    let checkpoint = live_models.checkpoint().await?;
    drop(live_models);
    if checkpoint > head {
        // Re-read the head: events may have been appended since it was first read.
        let now = EventStore::head_position(store).await?;
        if checkpoint > now {
            return Err(ReadModelError::AheadOfLedger {
                checkpoint: checkpoint.map_or(0, |p| p.value()),
                head: now.map_or(0, |p| p.value()),
            }
            .into());
        }
    }
    Ok(head.max(checkpoint))
}

/// Catches the live read models up to `target`, then compares them with the rebuilt file table
/// by table.
async fn compare_with_live(
    store: &SqliteStore,
    args: &ReplayArgs,
    live: &Path,
    temporary: &Path,
    target: Option<GlobalPosition>,
) -> Result<Vec<TableDifference>, CliError> {
    let live_models = ReadModels::open(live).await?;
    opledger_http_api::render::catch_up_showing_progress(
        store,
        &live_models,
        target,
        "catching up",
        args.json,
    )
    .await?;
    let (left, right) = (live.to_path_buf(), temporary.to_path_buf());
    let differences = tokio::task::spawn_blocking(move || compare_files(&left, &right))
        .await
        .map_err(|error| CliError::Other(format!("the comparison failed: {error}")))??;
    // If another process applied events to the live read models while they were compared, the
    // differences may be those events, not a fault: say so instead of reporting them.
    if live_models.checkpoint().await? != target {
        return Err(CliError::Other(
            "the live read models moved on during the comparison (another process is applying \
             events to them); run `opledger replay --verify` again when it is idle"
                .to_owned(),
        ));
    }
    drop(live_models);
    Ok(differences)
}

fn report_differences(
    json: bool,
    summary: &str,
    events: u64,
    seconds: f64,
    differences: &[TableDifference],
    failure: Option<&CliError>,
) -> Result<(), CliError> {
    if json {
        let rows: Vec<_> = differences
            .iter()
            .map(|d| {
                json!({
                    "table": d.table,
                    "live_rows": d.left_rows,
                    "replayed_rows": d.right_rows,
                    "only_live": d.only_left,
                    "only_replayed": d.only_right,
                })
            })
            .collect();
        // `verified`: the live read models equal the rebuild. A difference is also the error, in
        // the shape every `--json` error has, so a script needs to look in one place.
        let mut out = json!({
            "events": events,
            "seconds": seconds,
            "verified": differences.is_empty(),
            "differences": rows,
        });
        if let Some(failure) = failure {
            out["error"] = crate::cli::error_json(failure)["error"].take();
        }
        return print_json(&out);
    }
    println!("{summary}");
    let rows = |count: Option<u64>| count.map_or_else(|| "missing".to_owned(), |n| n.to_string());
    for d in differences {
        println!(
            "table {}: live {} rows, replayed {} rows; {} only in live, {} only in replayed",
            d.table,
            rows(d.left_rows),
            rows(d.right_rows),
            d.only_left,
            d.only_right
        );
    }
    if differences.is_empty() {
        println!("verified: the live read models equal a rebuild from position 0, table by table");
    }
    Ok(())
}

/// Renames `temporary` over `live` when nobody has `live` open (see `replace_read_models`).
async fn replace(live: &Path, temporary: &Path) -> Result<(), CliError> {
    if live.exists() {
        let checked = live.to_owned();
        let is_views = tokio::task::spawn_blocking(move || is_read_model_file(&checked))
            .await
            .map_err(|error| {
                CliError::Other(format!("checking {} failed: {error}", live.display()))
            })??;
        if !is_views {
            return Err(CliError::Other(format!(
                "{} exists and is not a read-model file; replay replaces only read models. \
                 Check --read-models (it must not name the ledger), or move that file away",
                live.display()
            )));
        }
    }
    let (from, to) = (temporary.to_owned(), live.to_owned());
    tokio::task::spawn_blocking(move || replace_read_models(&from, &to))
        .await
        .map_err(|error| {
            CliError::Other(format!("replacing {} failed: {error}", live.display()))
        })??;
    Ok(())
}

/// `path` with `suffix` appended to its file name.
pub(crate) fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name: OsString = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Removes an SQLite file and its side files, if present. Only for a file whose name is this
/// process's own (its lock file is then no one else's), e.g. a benchmark's fresh file.
pub(crate) fn remove_database(path: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal", ".lock"] {
        let _ = std::fs::remove_file(sibling(path, suffix));
    }
}
