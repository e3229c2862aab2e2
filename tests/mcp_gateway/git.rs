//! `mcp-server-git`, the reference git server: `git_commit` commits what is staged; repeated,
//! it is refused ("No changes staged for commit") — a refusal that proves nothing on its own, so
//! it must never be read as "not done". `git_log` finds a commit by the label in its message.

use std::path::Path;
use std::process::Command;

use opledger_domain::state::Status;
use serde_json::json;

use super::python::python_venv::run;
use super::support::{here, listed, python_text, quoted, server_args, succeeded_with, Gateway};

fn document(repo: &str) -> String {
    let repo = quoted(repo);
    format!(
        r#"
id = "upstream"
description = "A git repository, through mcp-server-git"
transport = "mcp"
call_timeout_ms = 5000
start_timeout_ms = 15000
restart_wait_ms = 0
read_only = ["git_status", "git_log"]

[upstream]
command = {python}
args = [{relay}, {python}, {server}, "--repository", {repo}]
env_from = {{ OPLEDGER_FAULT_FILE = "TEST_FAULT_FILE" }}

[[accounts]]
id = "main"
tenants = ["acme"]

[[actions]]
name = "commit"
description = "commit the staged changes"
tool = "git_commit"
input = {{ type = "object", required = ["message"], additionalProperties = false, properties.message = {{ type = "string", pattern = "^[^\\n\\[\\]]+$" }} }}
arguments = {{ repo_path = {repo}, message = "{{{{args.message}}}} [{{{{label}}}}]" }}
result = {{ id_pattern = "committed successfully with hash ([0-9a-f]{{40}})" }}
dedup = {{ kind = "none" }}

[actions.lookup]
kind = "tool"
tool = "git_log"
arguments = {{ repo_path = {repo}, max_count = 100 }}
found = "Commit: ([0-9a-f]{{40}})\nAuthor: [^\n]*\nDate: [^\n]*\nMessage: [^\n]*\\[{{{{label}}}}\\]"
consistent = true
"#,
        python = quoted(&python_text()),
        relay = quoted(&here("relay.py")),
        server = listed(&server_args("mcp_server_git")),
    )
}

struct Repository {
    gateway: Gateway,
    path: std::path::PathBuf,
}

impl Repository {
    /// A repository with one commit, and a change staged for the next.
    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("repo");
        std::fs::create_dir(&path).expect("the repository folder");
        git(&path, &["init", "--quiet", "--initial-branch=main"]);
        git(&path, &["config", "user.email", "agent@example.com"]);
        git(&path, &["config", "user.name", "Agent"]);
        stage(&path, "README.md", "hello\n");
        git(&path, &["commit", "--quiet", "-m", "first"]);
        stage(&path, "TODO.md", "call the client\n");
        let text = document(path.to_str().expect("a UTF-8 path"));
        Self {
            gateway: Gateway::start(dir, &text).await,
            path,
        }
    }

    /// The commits whose message carries `label`.
    fn commits_with(&self, label: &str) -> Vec<String> {
        git(&self.path, &["log", "--format=%H %s"])
            .lines()
            .filter(|line| line.contains(label))
            .map(|line| line[..40].to_owned())
            .collect()
    }

    fn commit_count(&self) -> usize {
        git(&self.path, &["rev-list", "--count", "HEAD"])
            .trim()
            .parse()
            .expect("a count")
    }
}

fn git(repo: &Path, args: &[&str]) -> String {
    run(Command::new("git").arg("-C").arg(repo).args(args), "git")
}

fn stage(repo: &Path, file: &str, text: &str) {
    std::fs::write(repo.join(file), text).expect("the file is written");
    git(repo, &["add", file]);
}

#[tokio::test]
async fn a_retried_commit_makes_one_commit() {
    let repo = Repository::start().await;
    let call = json!({"message": "Add the client call"});
    let first = repo.gateway.record("commit", call.clone(), "call-1").await;
    let hash = succeeded_with(&repo.gateway.settle(first).await);
    let again = repo.gateway.record("commit", call, "call-1").await;
    assert_eq!(again, first, "the agent's retry finds the same operation");
    assert_eq!(succeeded_with(&repo.gateway.settle(again).await), hash);
    let label = format!("opl-{first}");
    assert_eq!(repo.commits_with(&label), [hash]);
    assert_eq!(repo.commit_count(), 2);
}

#[tokio::test]
async fn killed_after_the_commit_the_lookup_finds_it_by_its_label() {
    let repo = Repository::start().await;
    repo.gateway.arm("kill_after git_commit");
    let operation = repo
        .gateway
        .record(
            "commit",
            json!({"message": "Add the client call"}),
            "call-1",
        )
        .await;
    let hash = succeeded_with(&repo.gateway.settle(operation).await);
    assert_eq!(repo.gateway.fired(), ["kill_after git_commit"]);
    assert_eq!(repo.commits_with(&format!("opl-{operation}")), [hash]);
    assert!(
        repo.gateway
            .events(operation)
            .await
            .contains(&"OutcomeUnknown"),
        "the lost answer was unknown first"
    );
}

#[tokio::test]
async fn killed_before_the_commit_the_lookup_finds_nothing_and_a_person_decides() {
    let repo = Repository::start().await;
    repo.gateway.arm("kill_before git_commit");
    let operation = repo
        .gateway
        .record(
            "commit",
            json!({"message": "Add the client call"}),
            "call-1",
        )
        .await;
    let state = repo.gateway.settle(operation).await;
    assert_eq!(state.status, Status::NeedsReview, "{state:?}");
    assert_eq!(
        repo.commit_count(),
        1,
        "nothing committed, nothing repeated"
    );
}

#[tokio::test]
async fn a_commit_refused_for_nothing_staged_is_not_read_as_not_done() {
    let repo = Repository::start().await;
    git(
        &repo.path,
        &["commit", "--quiet", "-m", "staged work, committed by hand"],
    );
    let operation = repo
        .gateway
        .record(
            "commit",
            json!({"message": "Add the client call"}),
            "call-1",
        )
        .await;
    let state = repo.gateway.settle(operation).await;
    assert_eq!(
        state.status,
        Status::NeedsReview,
        "the refusal proves nothing; the lookup found no commit of its own; a person decides: {state:?}"
    );
    let events = repo.gateway.events(operation).await;
    assert!(!events.contains(&"AttemptRejected"), "{events:?}");
    assert!(events.contains(&"OutcomeUnknown"), "{events:?}");
}

#[test]
fn import_mcp_lists_the_servers_tools_and_leaves_every_decision_to_a_person() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let repo = dir.path().join("repo");
    std::fs::create_dir(&repo).expect("the repository folder");
    git(&repo, &["init", "--quiet"]);
    let out = dir.path().join("git.toml");
    let mut command = Command::new(env!("CARGO_BIN_EXE_opledger"));
    command
        .args(["connectors", "import-mcp", "--id", "git", "--command"])
        .arg(super::support::python_text())
        .arg("--out")
        .arg(&out)
        .arg("--")
        .args(super::support::server_args("mcp_server_git"))
        .arg("--repository")
        .arg(&repo);
    let said = run(&mut command, "opledger connectors import-mcp");
    assert!(said.contains("tool(s) listed"), "{said}");
    let text = std::fs::read_to_string(&out).expect("the document is written");
    assert!(text.contains("tool = \"git_commit\""), "{text}");
    assert!(
        text.contains("# the server says: readOnlyHint=false"),
        "{text}"
    );
    assert!(
        text.contains("# read_only = [") && text.contains("\"git_log\""),
        "the server's read-only tools are offered, commented out: {text}"
    );
    assert!(!text.contains("tool = \"git_log\""), "{text}");
    let checked = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["connectors", "check"])
        .arg(&out)
        .output()
        .expect("opledger runs");
    assert!(
        !checked.status.success(),
        "an undecided document does not load"
    );
    let problems = String::from_utf8_lossy(&checked.stderr);
    assert!(problems.contains("dedup.kind"), "{problems}");
}
