//! The TypeScript client and its framework adapters (clients/typescript) against a spawned
//! `opledger serve` and the CRM stand, on Node's own test runner. This test provides what the
//! scripts stand on and fails (never skips) when any of it cannot be had:
//!
//! - the package's dev dependencies (the frameworks, typescript, openapi-typescript), installed
//!   with `npm ci` from the committed lock file into the target directory and reused while the
//!   lock is the same (made aside and renamed into place, as the console's are);
//! - a copy of the package beside those modules, so the sources' bare imports (`ai`,
//!   `@openai/agents`, `@langchain/core`) resolve as they do in a user's project.
//!
//! The scripts check the committed generated types against the served document, type-check the
//! sources with tsc, and play each framework's tool call through a lost response.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::npm;
use super::python::python_venv::run;
use super::support::{Harness, ACCOUNT, OPERATOR_TOKEN, TENANT_A_TOKEN};

fn package() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/typescript")
}

/// The folder whose `node_modules` holds the lock file's packages, made once per lock file.
fn node_modules() -> PathBuf {
    static MADE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MADE.get_or_init(|| {
        npm::installed(
            &package(),
            "typescript-client-modules",
            &[".bin/tsc"],
            "the TypeScript client's dev dependencies",
        )
    })
    .clone()
}

/// Copies these folders of the package into `into`.
pub(super) fn copy_package_folders(into: &Path, folders: &[&str]) {
    for folder in folders {
        std::fs::create_dir_all(into.join(folder)).expect("a folder");
        for entry in std::fs::read_dir(package().join(folder)).expect("the package's folder") {
            let entry = entry.expect("a file");
            std::fs::copy(entry.path(), into.join(folder).join(entry.file_name()))
                .expect("a file copied");
        }
    }
}

/// `node --test` on `tests` in `dir`, with what the package's test support reads: the server
/// at `base`, the tokens, the account, the CRM stand and the clients page.
pub(super) fn node_test(dir: &Path, tests: &[PathBuf], base: &str, stand_url: &str) -> Command {
    let mut node = Command::new("node");
    node.args(["--test", "--test-reporter=spec", "--test-concurrency=1"])
        .args(tests)
        .current_dir(dir)
        .env("OPLEDGER_BASE_URL", base)
        .env("OPLEDGER_TOKEN", TENANT_A_TOKEN)
        .env("OPLEDGER_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env("OPLEDGER_ACCOUNT", ACCOUNT)
        .env("OPLEDGER_STAND_URL", stand_url)
        .env(
            "OPLEDGER_CLIENTS_PAGE",
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/src/agents/clients.md"),
        );
    node
}

/// Copies the package's sources, tests, types and manifests into `into`, beside a link to the
/// installed modules.
fn lay_out(into: &Path, modules: &Path) {
    copy_package_folders(into, &["src", "test", "types"]);
    for file in ["package.json", "tsconfig.json", "tsconfig.types.json"] {
        std::fs::copy(package().join(file), into.join(file)).expect("a manifest copied");
    }
    std::os::unix::fs::symlink(modules.join("node_modules"), into.join("node_modules"))
        .expect("node_modules linked");
}

#[tokio::test]
async fn the_typescript_client_and_adapters_pass_their_tests_against_a_real_server() {
    let modules = tokio::task::spawn_blocking(node_modules)
        .await
        .expect("the packages are installed");
    let harness = Harness::new("").await;
    let server = harness.serve();
    let copy = tempfile::tempdir().expect("a folder for the package");
    lay_out(copy.path(), &modules);
    // The test files by name: given the folder, node would run its helper module as a test too.
    let mut tests: Vec<PathBuf> = std::fs::read_dir(copy.path().join("test"))
        .expect("the tests")
        .map(|entry| entry.expect("a file").path())
        .filter(|path| path.to_string_lossy().ends_with(".test.js"))
        .collect();
    tests.sort();
    assert!(tests.len() >= 3, "the test files: {tests:?}");
    let mut node = node_test(copy.path(), &tests, &server.base, &harness.stand_url());
    let printed = tokio::task::spawn_blocking(move || run(&mut node, "node --test"))
        .await
        .expect("node ran");
    println!("{printed}");
    assert!(printed.contains("ℹ pass"), "node ran no test:\n{printed}");
    assert!(
        printed.contains("ℹ skipped 0") && printed.contains("ℹ todo 0"),
        "a test skipped, which counts as missing:\n{printed}"
    );
}
