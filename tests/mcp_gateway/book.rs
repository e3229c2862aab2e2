//! The book's gateway page (`docs/src/agents/mcp-gateway.md`) run as written: its files written
//! out, its shell steps run in order in a fresh folder, the service started, the agent's Python
//! script run with the official MCP SDK. The one change: the page's port, 8787, is replaced by a
//! free one, so the test never collides with anything listening there.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::python::python_venv::run;
use super::support::{python_text, server_args};

const PAGE: &str = include_str!("../../docs/src/agents/mcp-gateway.md");

/// The page's fenced blocks, each with the marker comment above it (`file: NAME`, `run: STEP`).
fn blocks() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut marker: Option<String> = None;
    let mut lines = PAGE.lines();
    while let Some(line) = lines.next() {
        // The book's own example runner leaves these blocks to this test (they need the
        // upstream's environment): `<!-- not-runnable: run by tests/mcp_gateway/book.rs, step
        // setup (…) -->` or `…, file git.toml -->`.
        if let Some(found) = line
            .strip_prefix("<!-- not-runnable: run by tests/mcp_gateway/book.rs, ")
            .and_then(|rest| rest.strip_suffix(" -->"))
        {
            let mut words = found.split_whitespace();
            marker = match (words.next(), words.next()) {
                (Some("step"), Some(step)) => Some(format!("run: {step}")),
                (Some("file"), Some(file)) => Some(format!("file: {file}")),
                _ => panic!("a marker this test does not know: {line}"),
            };
        } else if line.starts_with("```") {
            let body: Vec<&str> = lines
                .by_ref()
                .take_while(|line| !line.starts_with("```"))
                .collect();
            if let Some(marker) = marker.take() {
                out.push((marker, body.join("\n") + "\n"));
            }
        }
    }
    out
}

/// Programs the page calls by name, as the environment and the build provide them.
fn shims(dir: &Path) {
    let python = python_text();
    let [flag, code] = server_args("mcp_server_git")
        .try_into()
        .expect("two arguments");
    let scripts = [
        ("python", format!("exec '{python}' \"$@\"")),
        (
            "pip",
            format!("exec '{python}' -m pip --disable-pip-version-check --quiet \"$@\""),
        ),
        (
            "mcp-server-git",
            format!("exec '{python}' {flag} '{code}' \"$@\""),
        ),
        (
            "opledger",
            format!("exec '{}' \"$@\"", env!("CARGO_BIN_EXE_opledger")),
        ),
    ];
    for (name, body) in scripts {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("a shim");
        run(Command::new("chmod").arg("+x").arg(&path), "chmod");
    }
}

/// The page's service, running in a fresh folder: the page's files written, its steps run in
/// order up to the agent's (run by [`Page::run_agent`]), the service listening on a free port.
pub(super) struct Page {
    pub(super) dir: tempfile::TempDir,
    pub(super) port: u16,
    path: String,
    agent: Vec<String>,
    server: Option<std::process::Child>,
}

impl Page {
    pub(super) fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).expect("a folder for the shims");
        shims(&bin);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut page = Self {
            dir,
            port,
            path,
            agent: Vec::new(),
            server: None,
        };
        for (marker, body) in blocks() {
            let body = body.replace("127.0.0.1:8787", &format!("127.0.0.1:{port}"));
            if let Some(file) = marker.strip_prefix("file: ") {
                std::fs::write(page.dir.path().join(file), body).expect("the page's file");
            } else if marker == "run: serve" {
                let log = std::fs::File::create(page.dir.path().join("serve.log")).expect("a log");
                let mut command = page.shell(&format!("{body}\nwait"));
                command.stdout(Stdio::null()).stderr(log).process_group(0);
                page.server = Some(command.spawn().expect("the service starts"));
                wait_for(port, page.dir.path());
            } else if marker == "run: agent" {
                page.agent.push(body);
            } else if let Some(step) = marker.strip_prefix("run: ") {
                page.run(step, &body);
            }
        }
        page
    }

    /// A shell in the page's folder, with the shims first on the `PATH`.
    pub(super) fn shell(&self, script: &str) -> Command {
        let mut command = Command::new("bash");
        command
            .args(["-euc", script])
            .current_dir(self.dir.path())
            .env("PATH", &self.path);
        command
    }

    /// Runs the page's `step`, which must succeed; what it printed.
    pub(super) fn run(&self, step: &str, body: &str) -> String {
        let output = self.shell(body).output().expect("bash runs");
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.status.success(),
            "the page's `{step}` step failed:\n{printed}\nthe service's log:\n{}",
            std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
        );
        printed
    }

    /// Runs the page's agent step; what it printed.
    fn run_agent(&self) -> String {
        assert!(!self.agent.is_empty(), "the page has an agent step");
        self.agent
            .iter()
            .map(|body| self.run("agent", body))
            .collect()
    }

    /// The repository's commits, newest first, as `<hash> <subject>` lines.
    pub(super) fn commits(&self) -> String {
        run(
            Command::new("git")
                .args(["-C", "repo", "log", "--format=%H %s"])
                .current_dir(self.dir.path()),
            "git log",
        )
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            // The service and its children run in a process group of their own, led by the shell.
            let group = format!("-{}", server.id());
            let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
            let _ = server.wait();
        }
    }
}

#[test]
fn the_gateway_page_runs_as_written() {
    let page = Page::start();
    let agent_output = page.run_agent();
    let answers: Vec<&str> = agent_output
        .lines()
        .filter(|line| line.starts_with("succeeded "))
        .collect();
    assert_eq!(answers.len(), 2, "two answers:\n{agent_output}");
    assert!(
        agent_output.contains("read-only: git__git_log True"),
        "the read-only tool is listed as such:\n{agent_output}"
    );
    assert!(
        agent_output.contains("Message: Add the client call [opl-"),
        "the read-only tool answered with the upstream's log:\n{agent_output}"
    );
    assert!(
        agent_output.contains("\n1 operation(s)"),
        "the ledger holds the commit and nothing for the read-only call:\n{agent_output}"
    );
    assert_eq!(answers[0], answers[1], "the retry found the same commit");
    let hash = answers[0].trim_start_matches("succeeded ");
    let log = page.commits();
    assert_eq!(log.lines().count(), 1, "one commit:\n{log}");
    assert!(log.starts_with(hash), "{log}");
    assert!(log.contains("Add the client call [opl-"), "{log}");
}

fn wait_for(port: u16, dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the service listens on {port}:\n{}",
            std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
