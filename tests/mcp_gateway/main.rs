//! The MCP gateway against real upstream MCP servers nobody here wrote, installed from the
//! registries by the tests, and one fault-injecting server of our own written with the official
//! Python SDK. Each upstream is a connector (`transport = "mcp"`); the engine drives its calls as
//! it drives a REST action's.
//!
//! The three reference servers behave three different ways on a repeat, and each is checked for:
//! a retried call makes one change; the upstream killed with SIGKILL after the change and before
//! its answer leaves the call unknown, the lookup finds the change and the call succeeds; killed
//! before the change, the lookup finds nothing and the call is retried (under a contract that
//! makes a retry safe) or handed to a person (under none) — never blindly repeated.
//!
//! - [`sqlite`]: `mcp-server-sqlite` (PyPI): an INSERT repeated makes a second row;
//! - [`git`]: `mcp-server-git` (PyPI): a commit repeated is refused ("No changes staged"), which
//!   proves nothing on its own;
//! - [`filesystem`]: `@modelcontextprotocol/server-filesystem` (npm): writing a file is naturally
//!   idempotent;
//! - [`faults`]: the fault-injecting server over stdio and Streamable HTTP: a lost request, a lost
//!   answer, a late answer, errors before and after the change, an upstream restarted between
//!   calls.
//! - [`login`]: an upstream that acts for a person's account, its authorization server and
//!   protected resource the official Python SDK's: `opledger connectors login`, renewals, a
//!   revoked login, and no token in clear anywhere.
//! - [`inspector`]: the MCP Inspector's CLI (npm), a client nobody here wrote, calling the
//!   gateway's tools.
//! - [`current_sdk`]: the current line of the official Python SDK (2.x) as the agent's client,
//!   checking every answer against the tool's `outputSchema`.
//!
//! Cost: the Python environment is made once per target directory (about a minute on first use,
//! reused afterwards); the npm packages likewise.

mod book;
mod current_sdk;
mod faults;
mod filesystem;
mod git;
mod inspector;
mod login;
mod sqlite;
mod support;

/// The npm installs the serve tests use, shared.
#[path = "../serve/npm.rs"]
mod npm;
mod python;
