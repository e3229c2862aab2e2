//! What the query commands share: where the read-model file is, bringing it up to the ledger's
//! head before a query, parsing durations and limits, and printing ages and JSON.
//!
//! The read models lag the log, so every query first catches them up; nothing here decides
//! anything on them (decisions go through the ledger).

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use opledger_domain::error::ValidationError;
use opledger_domain::store::EventStore;
use opledger_readmodel::{ReadModels, MAX_QUERY_ROWS};

use opledger_http_api::render::catch_up_showing_progress;

use crate::cli::{CliError, ReadModelArgs};

/// The read-model file: `--views`, else the ledger file's path with `.views` appended.
pub fn read_models_path(args: &ReadModelArgs) -> PathBuf {
    args.read_models.clone().unwrap_or_else(|| {
        let mut path = args.store.db.clone().into_os_string();
        path.push(".views");
        PathBuf::from(path)
    })
}

/// Opens (creating if needed) the read models at `path` and applies the ledger's log up to its
/// current head; shows progress on a terminal when far behind (never with `quiet`).
pub async fn open_caught_up<S: EventStore>(
    store: &S,
    path: &Path,
    quiet: bool,
) -> Result<ReadModels, CliError> {
    let read_models = ReadModels::open(path).await?;
    catch_up_showing_progress(
        store,
        &read_models,
        None,
        "catching up the read models",
        quiet,
    )
    .await?;
    Ok(read_models)
}

/// Checks a row limit against the read models' maximum.
pub fn check_limit(limit: usize) -> Result<usize, ValidationError> {
    if limit == 0 || limit > MAX_QUERY_ROWS {
        return Err(ValidationError::new(
            "--limit",
            format!("{limit} is out of range; pass a number from 1 to {MAX_QUERY_ROWS}"),
        ));
    }
    Ok(limit)
}

/// How long ago `at` was, compactly: `42s`, `17m`, `3h12m`, `5d4h`.
pub fn age(now: DateTime<Utc>, at: DateTime<Utc>) -> String {
    let seconds = (now - at).num_seconds().max(0);
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3_600 => format!("{}m", seconds / 60),
        3_600..86_400 => format!("{}h{}m", seconds / 3_600, seconds % 3_600 / 60),
        _ => format!("{}d{}h", seconds / 86_400, seconds % 86_400 / 3_600),
    }
}

/// A time as people read it in a table, to the second.
pub fn time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// Prints `value` as pretty JSON on stdout.
pub fn print_json(value: &serde_json::Value) -> Result<(), CliError> {
    let text =
        serde_json::to_string_pretty(value).map_err(|error| CliError::Other(error.to_string()))?;
    println!("{text}");
    Ok(())
}

/// Prints rows under headers, each column as wide as its widest cell.
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers
        .iter()
        .map(|header| header.chars().count())
        .collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", text.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_are_compact() {
        let now = Utc::now();
        assert_eq!(age(now, now - chrono::Duration::seconds(42)), "42s");
        assert_eq!(
            age(now, now - chrono::Duration::seconds(3 * 3_600 + 720)),
            "3h12m"
        );
        assert_eq!(age(now, now + chrono::Duration::seconds(5)), "0s");
    }
}
