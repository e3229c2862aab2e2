//! Debian packages the tests install on a fresh machine (Chromium, Go, PostgreSQL, PgBouncer),
//! one installation at a time.
//!
//! Tests that need a tool start together: in one `cargo test` process several threads, under
//! `cargo nextest` several processes. Two `apt-get` runs at once fail on each other's lock
//! (`apt-get update` does not wait for the lists lock), so every installation first takes an
//! exclusive `flock` on one file. The lock belongs to an open file description, so it orders
//! threads of one process as well as processes, whichever test binary includes this module.

use std::fs::OpenOptions;
use std::process::{Command, Stdio};

/// The file whose lock orders every installation of every test binary on this machine.
const LOCK_PATH: &str = "/tmp/opledger-tests-apt.lock";

/// Installs `packages` unless `present()` says they are there, holding the machine's
/// installation lock, after an `apt-get update`. `present()` is asked again under the lock: the
/// test that waited finds what its neighbour installed and runs nothing. The lock goes with the
/// file when this returns (or when the process dies). `missing` names what
/// `present()` looks for, in the messages. Fails with apt's words when apt fails.
pub fn install(packages: &[&str], missing: &str, present: impl Fn() -> bool) -> Result<(), String> {
    if present() {
        return Ok(());
    }
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_PATH)
        .map_err(|error| format!("open {LOCK_PATH}: {error}"))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|error| format!("lock {LOCK_PATH}: {error}"))?;
    if present() {
        return Ok(());
    }
    eprintln!(
        "{missing} is missing: installing Debian's {} for the tests",
        packages.join(", ")
    );
    apt(&["update"])?;
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend_from_slice(packages);
    apt(&install)?;
    if present() {
        Ok(())
    } else {
        Err(format!(
            "apt-get installed {} but {missing} is still missing",
            packages.join(", ")
        ))
    }
}

/// One `apt-get` run that also waits (up to ten minutes) for a dpkg lock held outside the tests.
fn apt(args: &[&str]) -> Result<(), String> {
    let output = Command::new("apt-get")
        .args(["-o", "DPkg::Lock::Timeout=600"])
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("cannot run apt-get {}: {error}", args.join(" ")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "apt-get {} failed ({}); the tests install their tools as root:\n{}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}
