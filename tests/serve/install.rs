//! The documented installs, run as a new user runs them: the first ```sh block under "## Install"
//! of docs/src/agents/clients-python.md and clients-typescript.md, executed by `sh -eu` in a fresh
//! directory with `OPLEDGER_REPO` set to this repository, then every adapter imported from what
//! they installed. The Python one also runs the framework and async tests against that install —
//! the newest framework releases the extras' ranges admit (tests/serve/python.rs runs the lowest).
//!
//! The npm install runs in a new directory every time (about 30 s), and the TypeScript framework
//! tests run against what it installed (the newest releases), as the Python ones do. The pip install takes minutes
//! (a few hundred packages' worth of resolving), so its app directory is kept in the target
//! directory and made again from nothing whenever the commands, pyproject.toml or the package's
//! sources change; made aside and renamed into place, as tests/python_venv's are.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::python::python_venv::run;
use super::support::{Harness, ACCOUNT, TENANT_A_TOKEN};
use super::typescript::{copy_package_folders, node_test};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The commands of the first ```sh block under `heading` in the file `path` (relative to the
/// repository).
fn first_sh_block_under(path: &str, heading: &str) -> String {
    let text = std::fs::read_to_string(repo().join(path))
        .unwrap_or_else(|error| panic!("{path} is readable: {error}"));
    let section = text
        .split_once(&format!("{heading}\n"))
        .unwrap_or_else(|| panic!("{path} has a `{heading}` section"))
        .1;
    let block = section
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .unwrap_or_else(|| panic!("{path}'s `{heading}` section has a sh block"))
        .0;
    block.to_owned()
}

/// The commands of the first ```sh block under "## Install" in the book page `page`.
fn install_commands(page: &str) -> String {
    first_sh_block_under(&format!("docs/src/agents/{page}"), "## Install")
}

#[test]
fn the_readmes_install_commands_are_the_books_which_these_tests_run() {
    for (readme_section, page) in [
        ("## From Python", "clients-python.md"),
        ("## From TypeScript", "clients-typescript.md"),
    ] {
        assert_eq!(
            first_sh_block_under("README.md", readme_section),
            install_commands(page),
            "the README's install under `{readme_section}` is not the one {page} documents and \
             this file runs: make them the same"
        );
    }
}

/// Runs `commands` with `sh -eu` in `dir`, as the docs say.
fn run_documented(commands: &str, dir: &Path, what: &str) -> String {
    run(
        Command::new("sh")
            .args(["-eu", "-c", commands])
            .current_dir(dir)
            .env("OPLEDGER_REPO", repo()),
        what,
    )
}

/// The stamp of what the Python app directory was made from: the commands, the manifest and
/// every source file of the package.
fn python_install_stamp(commands: &str) -> String {
    let client = repo().join("adapters/python-client");
    let mut stamp = commands.to_owned();
    stamp
        .push_str(&std::fs::read_to_string(client.join("pyproject.toml")).expect("pyproject.toml"));
    let mut sources: Vec<PathBuf> = std::fs::read_dir(client.join("opledger_client"))
        .expect("the package's folder")
        .map(|entry| entry.expect("a file").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "py"))
        .collect();
    sources.sort();
    for source in sources {
        stamp.push_str(&std::fs::read_to_string(&source).expect("a source file"));
    }
    stamp
}

/// The app directory the documented pip commands made (and pytest added to), made again when
/// its stamp changes.
fn python_app() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let place = tmp.join("python-documented-install");
    let commands = install_commands("clients-python.md");
    let stamp = python_install_stamp(&commands);
    let is_ready = |dir: &Path| {
        std::fs::read_to_string(dir.join("opledger-install-stamp"))
            .ok()
            .as_deref()
            == Some(stamp.as_str())
    };
    if is_ready(&place) {
        return place;
    }
    let dir = tmp.join(format!(
        "python-documented-install.making-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a fresh app directory");
    run_documented(&commands, &dir, "the documented pip install");
    // What the tests themselves need beside the app's own install.
    run(
        Command::new(dir.join(".venv/bin/python")).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "pytest>=7",
            "jsonschema>=4.18",
        ]),
        "installing pytest into the fresh app",
    );
    std::fs::write(dir.join("opledger-install-stamp"), &stamp).expect("the stamp is written");
    if place.exists() {
        let stale = tmp.join(format!(
            "python-documented-install.stale-{}",
            std::process::id()
        ));
        if std::fs::rename(&place, &stale).is_ok() {
            let _ = std::fs::remove_dir_all(&stale);
        }
    }
    if std::fs::rename(&dir, &place).is_err() {
        // Another process put its own in place first: use that one.
        let _ = std::fs::remove_dir_all(&dir);
        assert!(is_ready(&place), "cannot put the app directory in place");
    }
    place
}

#[tokio::test]
async fn the_documented_python_install_in_a_fresh_app_imports_every_adapter_and_passes_the_framework_tests(
) {
    let app = tokio::task::spawn_blocking(python_app)
        .await
        .expect("the documented install ran");
    let python = app.join(".venv/bin/python");
    let imported = run(
        Command::new(&python).current_dir(&app).args([
            "-c",
            "import opledger_client, opledger_client.aio, opledger_client.openai_agents, \
             opledger_client.langchain, opledger_client.pydantic_ai, importlib.metadata as m\n\
             print(opledger_client.__file__)\n\
             print(*(f'{p} {m.version(p)}' for p in ('openai-agents', 'langchain-core', 'pydantic-ai-slim', 'httpx')))",
        ]),
        "importing every adapter from the fresh install",
    );
    assert!(
        imported.contains(".venv"),
        "the installed package, not the clone's: {imported}"
    );
    println!("installed: {imported}");
    let harness = Harness::new("").await;
    let server = harness.serve();
    let tests = repo().join("adapters/python-client/tests");
    let mut pytest = Command::new(python);
    // Run from the app's directory, so `opledger_client` is the installed one.
    pytest
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs"])
        .arg(tests.join("test_frameworks.py"))
        .arg(tests.join("test_aio.py"))
        .current_dir(&app)
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
        printed.contains(" passed") && !printed.contains("skipped"),
        "{printed}"
    );
}

#[tokio::test]
async fn the_documented_npm_install_in_a_fresh_app_imports_every_adapter() {
    let app = tempfile::tempdir().expect("a fresh app directory");
    // `npm init -y` names the package after its folder, which must be a valid package name.
    let dir = app.path().join("my-agent");
    std::fs::create_dir(&dir).expect("the app's folder");
    let printed = tokio::task::spawn_blocking(move || {
        run_documented(
            &install_commands("clients-typescript.md"),
            &dir,
            "the documented npm install",
        );
        let script = "
            const modules = ['opledger-client', 'opledger-client/ai-sdk', 'opledger-client/openai-agents', 'opledger-client/langchain'];
            for (const name of modules) {
              const module = await import(name);
              if (typeof module.Ledger !== 'function') throw new Error(`${name} exports no Ledger`);
              if (name !== 'opledger-client' && typeof module.ledgerTools !== 'function') throw new Error(`${name} exports no ledgerTools`);
              console.log(`${name}: ${import.meta.resolve(name)}`);
            }";
        run(
            Command::new("node")
                .args(["--input-type=module", "-e", script])
                .current_dir(&dir),
            "importing every adapter in the fresh app",
        )
    })
    .await
    .expect("the documented install ran");
    println!("{printed}");
    assert!(
        printed.contains("opledger-client/langchain: file://")
            && printed.contains("node_modules/opledger-client/"),
        "the adapters resolve from the app's own copy: {printed}"
    );

    // The framework tests against the releases that install brought (the newest the ranges
    // admit; tests/serve/typescript.rs runs them against the lock file's): the package's sources
    // and tests copied into the app, so their bare imports resolve to the app's own frameworks.
    let checkout = app.path().join("my-agent/opledger-tests");
    copy_package_folders(&checkout, &["src", "test"]);
    std::fs::write(checkout.join("package.json"), r#"{"type": "module"}"#)
        .expect("the tests' manifest");
    let harness = Harness::new("").await;
    let server = harness.serve();
    let mut node = node_test(
        &checkout,
        &[PathBuf::from("test/frameworks.test.js")],
        &server.base,
        &harness.stand_url(),
    );
    let printed = tokio::task::spawn_blocking(move || run(&mut node, "node --test"))
        .await
        .expect("node ran");
    println!("{printed}");
    assert!(
        printed.contains("ℹ pass") && printed.contains("ℹ fail 0"),
        "the framework tests on the newest releases:\n{printed}"
    );
    assert!(
        printed.contains("ℹ skipped 0") && printed.contains("ℹ todo 0"),
        "a test skipped, which counts as missing:\n{printed}"
    );
}
