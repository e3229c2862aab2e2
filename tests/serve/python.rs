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

#[path = "../python_venv/mod.rs"]
pub mod python_venv;
use python_venv::{python_with, run};

/// What the client's tests and the document's check need, as pip takes it (the client itself
/// needs nothing). The agent frameworks (and httpx, the async client's) at the lowest releases
/// pyproject.toml's extras admit: the newest are installed and tested by tests/serve/install.rs,
/// the way the docs say.
const REQUIREMENTS: [&str; 7] = [
    "pytest>=7",
    "jsonschema>=4.18",
    "openapi-spec-validator>=0.7",
    "openai-agents==0.24.0",
    "langchain-core==1.7.7",
    "pydantic-ai-slim==2.68.0",
    "httpx==0.27.0",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The virtual environment's python, made (or brought up to date) with [`REQUIREMENTS`].
fn venv_python() -> PathBuf {
    python_with("python-client-venv", &REQUIREMENTS)
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
        )
        .env(
            "OPLEDGER_CLIENTS_PAGE",
            repo().join("docs/src/agents/clients.md"),
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
