//! `opledger bench startup` as a person runs it: real processes (the benchmark, and the `serve`
//! it starts) on a real ledger written by `opledger bench store`. Each run is bounded by a
//! process timeout, so a benchmark that waits for a drive that cannot come fails the test
//! instead of hanging it.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The longest one benchmark run may take: a start of a small ledger takes about a second even
/// on a loaded machine, and the benchmark's own wait for a drive is ten minutes.
const RUN_TIMEOUT: Duration = Duration::from_secs(90);
/// How often the test looks whether the benchmark has exited.
const POLL: Duration = Duration::from_millis(20);

/// Runs `opledger` with `args` in a process group of its own; kills the whole group (the
/// benchmark and its server) and fails if it has not exited within [`RUN_TIMEOUT`].
fn run_bounded(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(args)
        .env_remove("OPLEDGER_DB")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("opledger starts");
    let started = Instant::now();
    while child.try_wait().expect("the child's status").is_none() {
        if started.elapsed() > RUN_TIMEOUT {
            // The group's id is the benchmark's pid; `--` so that `-pid` names the group.
            let _ = Command::new("kill")
                .args(["-s", "KILL", "--", &format!("-{}", child.id())])
                .status();
            let output = child.wait_with_output().expect("the killed child's output");
            panic!(
                "`opledger {}` did not end within {RUN_TIMEOUT:?}; stderr: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(POLL);
    }
    child.wait_with_output().expect("the child's output")
}

/// Writes a small ledger with `bench store`, leaving `open_per_mille` of its operations open.
fn ledger(dir: &Path, open_per_mille: u32) -> String {
    let db = dir.join("bench.db").display().to_string();
    let open = open_per_mille.to_string();
    let output = run_bounded(&[
        "bench",
        "store",
        "--concurrency",
        "1",
        "--operations",
        "20",
        "--open-per-mille",
        &open,
        "--db",
        &db,
    ]);
    assert!(
        output.status.success(),
        "bench store: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    db
}

/// The value of `key` in the `bench=startup` line of `output`.
fn reported(output: &Output, key: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find(|line| line.starts_with("bench=startup "))
        .unwrap_or_else(|| panic!("no bench=startup line in: {stdout}"));
    line.split_whitespace()
        .find_map(|field| field.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in: {line}"))
        .to_owned()
}

fn assert_no_drive_is_awaited(output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench startup: {stderr}");
    assert_eq!(reported(output, "first_drive_ms"), "none");
    assert!(
        reported(output, "ready_ms").parse::<u64>().is_ok(),
        "the start is still measured"
    );
    assert!(
        stderr.contains("no drive can come") && stderr.contains("--open-per-mille"),
        "the sentence says why and what to run: {stderr}"
    );
}

#[test]
fn startup_on_a_ledger_without_open_work_measures_the_start_and_says_no_drive_can_come() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = ledger(dir.path(), 0);
    let output = run_bounded(&["bench", "startup", "--db", &db, "--settle-ms", "0"]);
    assert_no_drive_is_awaited(&output);
}

#[test]
fn startup_of_another_build_on_a_ledger_without_open_work_reads_the_log_and_says_no_drive_can_come()
{
    let dir = tempfile::tempdir().expect("temp dir");
    let db = ledger(dir.path(), 0);
    // `--server-exe` leaves the read models to that build, so the open work is read from the log.
    let output = run_bounded(&[
        "bench",
        "startup",
        "--db",
        &db,
        "--settle-ms",
        "0",
        "--server-exe",
        env!("CARGO_BIN_EXE_opledger"),
    ]);
    assert_no_drive_is_awaited(&output);
}

#[test]
fn startup_on_a_ledger_with_open_work_measures_the_first_drive() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Every operation left open: a due send, one in flight, an unknown outcome, and two that
    // wait for a person, in turn.
    let db = ledger(dir.path(), 1000);
    let output = run_bounded(&["bench", "startup", "--db", &db, "--settle-ms", "0"]);
    assert!(
        output.status.success(),
        "bench startup: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let first_drive = reported(&output, "first_drive_ms");
    assert!(
        first_drive.parse::<u64>().is_ok(),
        "a due send is driven: first_drive_ms={first_drive}"
    );
}
