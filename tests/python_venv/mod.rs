//! Python virtual environments for the tests that run Python (the client's pytest suite, the
//! OpenAPI validator, the offline export verifier with pyarrow): made with the machine's
//! `python3` in the target directory, filled from PyPI, and reused while their requirements stay
//! the same. Anything missing fails the test; nothing skips.
//!
//! Several tests ask at once, in one process (`cargo test`) or in several (`cargo nextest`):
//! threads wait for each other, and a process builds its environment aside and renames it into
//! place, so none ever sees another's half-made one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};

/// Runs `command`; fails the test with its output when it fails.
pub fn run(command: &mut Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("{what}: cannot start {command:?}: {error}"));
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{printed}",
        output.status
    );
    printed
}

/// The python of the virtual environment `name`, made (or brought up to date) with
/// `requirements` as pip takes them.
pub fn python_with(name: &str, requirements: &[&str]) -> PathBuf {
    static MADE: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    let mut made = MADE.lock().unwrap_or_else(PoisonError::into_inner);
    let made = made.get_or_insert_with(HashMap::new);
    if let Some(python) = made.get(name) {
        return python.clone();
    }
    let python = make(name, requirements);
    made.insert(name.to_owned(), python.clone());
    python
}

fn make(name: &str, requirements: &[&str]) -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let venv = tmp.join(name);
    let wanted = requirements.join("\n");
    let is_ready = |venv: &Path| {
        std::fs::read_to_string(venv.join("opledger-requirements.txt"))
            .ok()
            .as_deref()
            == Some(wanted.as_str())
            && venv.join("bin").join("python").exists()
    };
    if is_ready(&venv) {
        return venv.join("bin").join("python");
    }
    let aside = tmp.join(format!("{name}.making-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&aside);
    run(
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&aside),
        "making a virtual environment with python3 (install python3 and its venv module)",
    );
    run(
        Command::new(aside.join("bin").join("python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(requirements),
        "installing the tests' requirements from PyPI",
    );
    std::fs::write(aside.join("opledger-requirements.txt"), &wanted)
        .expect("the requirements stamp is written");
    if venv.exists() && !is_ready(&venv) {
        let stale = tmp.join(format!("{name}.stale-{}", std::process::id()));
        if std::fs::rename(&venv, &stale).is_ok() {
            let _ = std::fs::remove_dir_all(&stale);
        }
    }
    if std::fs::rename(&aside, &venv).is_err() {
        // Another process renamed its own into place first: use that one.
        let _ = std::fs::remove_dir_all(&aside);
        assert!(
            is_ready(&venv),
            "cannot put the virtual environment in place at {}",
            venv.display()
        );
    }
    venv.join("bin").join("python")
}
