//! The Python client (adapters/python-client) against a spawned `opledger serve` and the CRM
//! stand: this test makes a virtual environment with the machine's `python3`, installs what the
//! client's tests need from PyPI (pytest, jsonschema; kept in the target directory and reused
//! while the list is the same), and runs pytest. Anything missing fails the test; nothing skips.
//!
//! The same environment holds openapi-spec-validator, which checks the document a real server
//! serves against the OpenAPI 3.1 schema: a validator that is not ours, as the tools that read
//! the document (code generators, schemathesis) are not.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::support::{Harness, ACCOUNT, TENANT_A_TOKEN};

/// What the client's tests and the document's check need, as pip takes it (the client itself
/// needs nothing).
const REQUIREMENTS: [&str; 3] = [
    "pytest>=7",
    "jsonschema>=4.18",
    "openapi-spec-validator>=0.7",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `command`; fails the test with its output when it fails.
fn run(command: &mut Command, what: &str) -> String {
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
///
/// Several tests, in one process (`cargo test`) or in several (`cargo nextest`), ask at once: each
/// thread waits for the first, and a process builds its environment aside and renames it into
/// place, so none ever sees another's half-made one.
fn venv_python() -> PathBuf {
    static MADE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MADE.get_or_init(make_venv).clone()
}

fn make_venv() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let venv = tmp.join("python-client-venv");
    let wanted = REQUIREMENTS.join("\n");
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
    let aside = tmp.join(format!("python-client-venv.making-{}", std::process::id()));
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
            .args(REQUIREMENTS),
        "installing the client's test requirements from PyPI",
    );
    std::fs::write(aside.join("opledger-requirements.txt"), &wanted)
        .expect("the requirements stamp is written");
    if venv.exists() && !is_ready(&venv) {
        let stale = tmp.join(format!("python-client-venv.stale-{}", std::process::id()));
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

/// Checks `document` (a file) with openapi-spec-validator; its output when it refuses.
fn validate_openapi(python: &Path, document: &Path) -> Result<String, String> {
    let output = Command::new(python)
        .args(["-m", "openapi_spec_validator", "--schema", "3.1.0"])
        .arg(document)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap_or_else(|error| panic!("cannot start openapi-spec-validator: {error}"));
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(printed)
    } else {
        Err(printed)
    }
}

#[tokio::test]
async fn the_served_openapi_document_is_valid_openapi_3_1() {
    let python = tokio::task::spawn_blocking(venv_python)
        .await
        .expect("the virtual environment is made");
    let harness = Harness::new("").await;
    let server = harness.serve();
    let (status, served) = server
        .call(reqwest::Method::GET, "/v1/openapi.json", None, None)
        .await;
    assert_eq!(status, reqwest::StatusCode::OK);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("served-openapi.json");
    std::fs::write(&file, served.to_string()).expect("the served document is written");
    let checked = tokio::task::spawn_blocking({
        let python = python.clone();
        move || validate_openapi(&python, &file)
    })
    .await
    .expect("the validator ran");
    let printed = checked.unwrap_or_else(|refusal| {
        panic!("openapi-spec-validator refuses the served document:\n{refusal}")
    });
    assert!(printed.contains("OK"), "the validator said: {printed}");
}

#[tokio::test]
async fn the_validator_refuses_a_document_with_null_parameters() {
    // The check above can fail: the defect it guards against (a route served with
    // `"parameters": null`) is refused by the same validator.
    let python = tokio::task::spawn_blocking(venv_python)
        .await
        .expect("the virtual environment is made");
    let mut broken: serde_json::Value =
        serde_json::from_str(include_str!("../../adapters/http-api/src/openapi.json"))
            .expect("the document is JSON");
    broken["paths"]["/healthz"]["get"]["parameters"] = serde_json::Value::Null;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("broken-openapi.json");
    std::fs::write(&file, broken.to_string()).expect("the broken document is written");
    let checked = tokio::task::spawn_blocking(move || validate_openapi(&python, &file))
        .await
        .expect("the validator ran");
    let refusal = checked.expect_err("a null `parameters` must be refused");
    assert!(
        refusal.contains("parameters"),
        "the validator said: {refusal}"
    );
}
