//! The crash soak, CI-sized: `opledger bench soak` runs 20 cycles of a burst of
//! record-and-execute calls, a SIGKILL of `opledger serve` mid-burst and a restart on the same
//! SQLite file, checking after each that nothing acknowledged was lost, that redeliveries map to
//! their operations, and that no request has two objects at the CRM stand.
//!
//! The soak is the opledger-bench crate's (`bench/src/soak/`); this test holds it to its result line, so a soak
//! that stopped killing mid-burst, or stopped acknowledging anything, fails here too.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

/// The CI run's cycles (the number) and its shape: short bursts, so 20 cycles fit in
/// about a minute of a debug build on a loaded 2-core machine.
const CYCLES: u32 = 20;
const CLIENTS: u32 = 6;
const KILL_AFTER_MS_MIN: u64 = 150;
const KILL_AFTER_MS_MAX: u64 = 700;
/// The whole run, at most: a soak that hangs fails instead of holding CI.
const RUN_DEADLINE: Duration = Duration::from_secs(600);

#[test]
fn twenty_sigkill_cycles_lose_nothing_acknowledged_and_duplicate_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["bench", "soak", "--seed", "17"])
        .args(["--cycles", &CYCLES.to_string()])
        .args(["--clients", &CLIENTS.to_string()])
        .args(["--kill-after-ms-min", &KILL_AFTER_MS_MIN.to_string()])
        .args(["--kill-after-ms-max", &KILL_AFTER_MS_MAX.to_string()])
        .arg("--db")
        .arg(dir.path())
        .output()
        .expect("opledger bench soak runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        started.elapsed() < RUN_DEADLINE,
        "the soak took {:?}",
        started.elapsed()
    );
    assert!(
        output.status.success(),
        "the soak failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let result = result_line(&stdout);
    let count = |key: &str| -> u64 {
        result
            .get(key)
            .unwrap_or_else(|| panic!("no {key}= in the result line:\n{stdout}"))
            .parse()
            .unwrap_or_else(|_| panic!("{key}= is not a count:\n{stdout}"))
    };
    assert_eq!(count("cycles"), u64::from(CYCLES), "{stdout}");
    for check in [
        "lost",
        "duplicates",
        "redeliveries_mismatched",
        "unsettled",
        "wrong_outcomes",
    ] {
        assert_eq!(count(check), 0, "{check}:\n{stdout}\n{stderr}");
    }
    assert!(count("acknowledged") > 0, "nothing acknowledged:\n{stdout}");
    // The kills must hit work in progress, or the soak proves nothing about crashes: most
    // cycles were killed with requests in flight, and some acknowledged operations were read
    // back after the restart before their outcome had been recorded.
    assert!(
        count("killed_mid_burst") >= u64::from(CYCLES) / 2,
        "too few kills mid-burst:\n{stdout}\n{stderr}"
    );
    assert!(
        count("interrupted") > 0,
        "no kill caught a send before its outcome was recorded:\n{stdout}\n{stderr}"
    );
    eprintln!("{stdout}(in {:?})", started.elapsed());
}

/// The `bench=soak …` line's `key=value` pairs.
fn result_line(stdout: &str) -> HashMap<String, String> {
    let line = stdout
        .lines()
        .find(|line| line.starts_with("bench=soak "))
        .unwrap_or_else(|| panic!("no result line in:\n{stdout}"));
    line.split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect()
}
