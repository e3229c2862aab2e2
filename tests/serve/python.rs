//! The Python client (adapters/python-client) against a spawned `opledger serve` and the CRM
//! stand: this test makes a virtual environment with the machine's `python3`, installs what the
//! client's tests need from PyPI (pytest, jsonschema; kept in the target directory and reused
//! while the list is the same), and runs pytest. Anything missing fails the test; nothing skips.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::support::{Harness, ACCOUNT, TENANT_A_TOKEN};

/// What the client's tests need, as pip takes it (the client itself needs nothing).
const REQUIREMENTS: [&str; 2] = ["pytest>=7", "jsonschema>=4.18"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

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

/// The virtual environment's python, made (or brought up to date) with [`REQUIREMENTS`].
fn venv_python() -> PathBuf {
    venv_python_with("python-client-venv", &REQUIREMENTS)
}

/// The python of the virtual environment `name` (in the target directory), made (or brought up
/// to date) with `requirements` from PyPI.
pub fn venv_python_with(name: &str, requirements: &[&str]) -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let python = venv.join("bin").join("python");
    let stamp = venv.join("opledger-requirements.txt");
    let wanted = requirements.join("\n");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) && python.exists() {
        return python;
    }
    run(
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
        "making a virtual environment with python3 (install python3 and its venv module)",
    );
    run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(requirements),
        "installing test requirements from PyPI",
    );
    std::fs::write(&stamp, wanted).expect("the requirements stamp is written");
    python
}

#[tokio::test]
async fn the_python_client_passes_its_tests_against_a_real_server() {
    let python = tokio::task::spawn_blocking(venv_python)
        .await
        .expect("the virtual environment is made");
    let harness = Harness::new("").await;
    let server = harness.serve();
    let client = repo().join("adapters").join("python-client");
    let mut pytest = Command::new(python);
    pytest
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs"])
        .arg(client.join("tests"))
        .current_dir(&client)
        .env("PYTHONPATH", &client)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("OPLEDGER_BASE_URL", &server.base)
        .env("OPLEDGER_TOKEN", TENANT_A_TOKEN)
        .env("OPLEDGER_ACCOUNT", ACCOUNT)
        .env("OPLEDGER_STAND_URL", harness.stand_url())
        .env(
            "OPLEDGER_OPENAPI",
            repo().join("adapters/http-api/src/openapi.json"),
        );
    let printed = tokio::task::spawn_blocking(move || run(&mut pytest, "pytest"))
        .await
        .expect("pytest ran");
    println!("{printed}");
    assert!(
        printed.contains(" passed"),
        "pytest ran no test:\n{printed}"
    );
    assert!(
        !printed.contains("skipped"),
        "a test skipped, which counts as missing:\n{printed}"
    );
}
