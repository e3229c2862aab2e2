//! Catching the read models up with progress on a terminal: what `opledger serve` shows at
//! start-up and the query commands show when the read models are far behind.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use opledger_domain::ids::GlobalPosition;
use opledger_domain::store::EventStore;
use opledger_readmodel::{catch_up, CatchUpProgress, ReadModels};

use super::RenderError;

/// Progress is shown only when at least this many events are behind.
const PROGRESS_FROM_EVENTS: u64 = 5_000;
/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Catches `read_models` up to `target` (the log's head as it is now, if `None`), with progress on
/// a terminal.
pub async fn catch_up_showing_progress<S: EventStore>(
    store: &S,
    read_models: &ReadModels,
    target: Option<GlobalPosition>,
    what: &str,
    quiet: bool,
) -> Result<CatchUpProgress, RenderError> {
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
