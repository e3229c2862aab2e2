//! What the query commands share: where the read-model file is, bringing it up to the ledger's
//! head before a query, parsing durations and limits, and printing ages and JSON.
//!
//! The read models lag the log, so every query first catches them up; nothing here decides
//! anything on them (decisions go through the ledger).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use opledger_domain::error::ValidationError;
use opledger_domain::ids::GlobalPosition;
use opledger_domain::store::EventStore;
use opledger_readmodel::{catch_up, CatchUpProgress, ReadModels, MAX_QUERY_ROWS};

use crate::cli::{CliError, ViewsArgs};

/// Below this many events to apply a catch-up is quick, and a progress line would only flicker.
const PROGRESS_FROM_EVENTS: u64 = 5_000;
/// How often progress is shown on a terminal.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// The longest duration `--older-than` accepts, in days: further back than any ledger reaches.
const MAX_DURATION_DAYS: i64 = 100 * 365;

/// The read-model file: `--views`, else the ledger file's path with `.views` appended.
pub fn views_path(args: &ViewsArgs) -> PathBuf {
    args.views.clone().unwrap_or_else(|| {
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

/// Catches `read_models` up to `target` (the log's head as it is now, if `None`), with progress on
/// a terminal.
pub async fn catch_up_showing_progress<S: EventStore>(
    store: &S,
    read_models: &ReadModels,
    target: Option<GlobalPosition>,
    what: &str,
    quiet: bool,
) -> Result<CatchUpProgress, CliError> {
    let terminal = !quiet && std::io::stderr().is_terminal();
    let mut last_shown: Option<Instant> = None;
    let report = catch_up(store, read_models, target, |progress| {
        if !terminal || progress.behind < PROGRESS_FROM_EVENTS {
            return;
        }
        if last_shown.is_none_or(|at| at.elapsed() >= PROGRESS_EVERY) {
            eprint!(
                "\r{what}: {} of {} events…",
                progress.applied, progress.behind
            );
            last_shown = Some(Instant::now());
        }
    })
    .await?;
    if last_shown.is_some() {
        eprint!("\r\x1b[2K");
    }
    Ok(report)
}

/// Parses `10s`, `10m`, `2h`, `3d` (a positive whole number and one unit).
pub fn parse_duration(flag: &str, text: &str) -> Result<chrono::Duration, ValidationError> {
    let text = text.trim();
    let invalid = |why: &str| {
        ValidationError::new(
            flag,
            format!(
                "`{text}` {why}; write a whole number and a unit s, m, h or d, e.g. 10m, 2h, 3d"
            ),
        )
    };
    let split = text
        .char_indices()
        .last()
        .map(|(index, _)| index)
        .ok_or_else(|| invalid("is empty"))?;
    let (number, unit) = text.split_at(split);
    let seconds_per_unit: i64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(invalid("has no unit")),
    };
    let amount: i64 = number
        .parse()
        .map_err(|_| invalid("does not start with a whole number"))?;
    if amount <= 0 {
        return Err(invalid("is not positive"));
    }
    let seconds = amount
        .checked_mul(seconds_per_unit)
        .filter(|seconds| *seconds <= MAX_DURATION_DAYS * 86_400)
        .ok_or_else(|| invalid(&format!("is longer than {MAX_DURATION_DAYS} days")))?;
    Ok(chrono::Duration::seconds(seconds))
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
    fn durations_take_a_number_and_one_unit() {
        assert_eq!(
            parse_duration("--older-than", "10m").map(|d| d.num_seconds()),
            Ok(600)
        );
        assert_eq!(
            parse_duration("--older-than", "3d").map(|d| d.num_seconds()),
            Ok(259_200)
        );
        for bad in [
            "",
            "10",
            "m",
            "-5m",
            "0s",
            "1.5h",
            "10x",
            "99999999999d",
            "5 m",
        ] {
            let error = parse_duration("--older-than", bad).expect_err(bad);
            assert_eq!(error.field, "--older-than", "{bad}");
        }
    }

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
