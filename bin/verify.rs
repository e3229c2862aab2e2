//! `opledger verify`: walk the whole log and report every event edited, removed or moved behind
//! the ledger's back, by stream and version. Exit status 4 when anything is found.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use opledger_domain::ids::StreamVersion;
use opledger_domain::store::{EventStore, LogStart, RecordedEvent, MAX_READ_BATCH};
use opledger_domain::verify::{Finding, Verifier};

use crate::cli::{CliError, VerifyArgs};
use crate::intent::{close, open_for_reading};

/// How often progress is shown on a terminal.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Most findings printed; the count is always exact.
const MAX_FINDINGS_SHOWN: usize = 1_000;
/// Events read from the log at a time. Smaller than the store's `MAX_READ_BATCH`: a batch in
/// memory (its events' data and metadata) is the part of the walk's peak memory that swings, and
/// with 4,096 the peak at 10M events was 10–15 % above the one at 1M; with 512 it is 8 %, for
/// the same walking speed (docs/src/performance.md).
const VERIFY_READ_BATCH: usize = 512;
const _: () = assert!(0 < VERIFY_READ_BATCH && VERIFY_READ_BATCH <= MAX_READ_BATCH);

pub async fn run(args: VerifyArgs) -> Result<(), CliError> {
    let ledger = open_for_reading(&args.db).await?;
    let result = tokio::select! {
        result = walk(ledger.store(), args.json) => result,
        _ = tokio::signal::ctrl_c() => Err(CliError::Interrupted),
    };
    let closed = close(&ledger).await;
    let findings = result?;
    closed?;
    if findings == 0 {
        Ok(())
    } else {
        Err(CliError::Tampered { findings })
    }
}

async fn walk<S: EventStore>(store: &S, json: bool) -> Result<usize, CliError> {
    // The SQLite store numbers its log 1, 2, 3… without gaps, so a missing position is a removal.
    let mut verifier = Verifier::new(true);
    let head = store.head_position().await?.map_or(0, |head| head.value());
    let progress = std::io::stderr().is_terminal() && !json;
    let mut last_progress = Instant::now();
    let mut findings: Vec<Finding> = Vec::new();
    let mut found = 0;
    let mut start = LogStart::Beginning;
    loop {
        let batch = store.read_all(start, VERIFY_READ_BATCH).await?;
        let Some(last) = batch.last() else { break };
        start = LogStart::After(last.position);
        for event in &batch {
            if verifier.needs_history(event) {
                let earlier = earlier_events(store, event).await?;
                verifier.seed(event, &earlier);
            }
            for finding in verifier.check(event) {
                found += 1;
                if findings.len() < MAX_FINDINGS_SHOWN {
                    findings.push(finding);
                }
            }
        }
        if progress && last_progress.elapsed() >= PROGRESS_EVERY {
            eprint!("\rverified {} of {head} events…", verifier.events());
            last_progress = Instant::now();
        }
    }
    if progress {
        eprint!("\r\x1b[2K");
    }
    if json {
        print_report_json(&verifier, &findings, found)?;
    } else {
        print_report_text(&verifier, &findings, found);
    }
    Ok(found)
}

/// Prints the walk's counts and the findings shown as JSON; with findings, also as the error.
/// The stored events of `event`'s stream before its version: what the verifier needs for a
/// stream it no longer tracks (its memory is bounded). One operation's stream is short.
async fn earlier_events<S: EventStore>(
    store: &S,
    event: &RecordedEvent,
) -> Result<Vec<RecordedEvent>, CliError> {
    let mut earlier: Vec<RecordedEvent> = Vec::new();
    let mut from = StreamVersion::FIRST;
    while from < event.version {
        let batch = store
            .read_stream(&event.stream, from, MAX_READ_BATCH)
            .await?;
        let Some(last) = batch.last() else { break };
        from = last.version.next();
        earlier.extend(
            batch
                .into_iter()
                .filter(|stored| stored.version < event.version),
        );
    }
    Ok(earlier)
}

fn print_report_json(
    verifier: &Verifier,
    findings: &[Finding],
    found: usize,
) -> Result<(), CliError> {
    let rows: Vec<_> = findings
        .iter()
        .map(|finding| {
            serde_json::json!({
                "kind": finding.kind.name(),
                "stream": finding.stream.as_ref().map(ToString::to_string),
                "version": finding.version.map(|v| v.value()),
                "position": finding.position.value(),
                "detail": finding.detail,
            })
        })
        .collect();
    let mut out = serde_json::json!({"events": verifier.events(), "streams": verifier.streams(), "findings": found, "shown": rows});
    if found > 0 {
        // The findings are also the error, in the shape every `--json` error has.
        out["error"] =
            crate::cli::error_json(&CliError::Tampered { findings: found })["error"].take();
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&out).map_err(|error| CliError::Other(error.to_string()))?
    );
    Ok(())
}

/// Prints the findings shown, how many more there were, and the walk's counts.
fn print_report_text(verifier: &Verifier, findings: &[Finding], found: usize) {
    for finding in findings {
        println!("{finding}");
    }
    if found > findings.len() {
        println!("… and {} more", found - findings.len());
    }
    println!(
        "verified {} events in {} streams: {}",
        verifier.events(),
        verifier.streams(),
        if found == 0 {
            "no tampering found".to_owned()
        } else {
            format!("{found} finding(s)")
        }
    );
}
