//! Upstream MCP servers as connectors: each action is one upstream tool, called through the
//! ledger with the same contract as a REST action (send, look up, classify), with the official
//! Rust SDK's client (`rmcp`). The engine never knows the wire: an [`McpConnector`] answers the
//! same [`Providers`](opledger_domain::provider::Providers) calls a REST [`crate::Connector`]
//! does, behind the same registry.
//!
//! It must never call an upstream tool outside the ledger: a tool is either an action (recorded
//! first, sent under its contract), declared `read_only` (it changes nothing, so it may pass
//! through), or refused.
//!
//! # The document
//!
//! ```
//! let text = r#"
//! id = "notes"
//! description = "The notes database, through its MCP server"
//! transport = "mcp"
//! call_timeout_ms = 10000        # one tools/call; then the outcome is unclear (default 10000)
//! start_timeout_ms = 10000       # spawning or connecting, then initialize (default 10000)
//! restart_wait_ms = 1000         # least time between two starts of a session (default 1000)
//! sessions = 1                   # sessions kept open, each multiplexing calls (1..=8)
//! read_only = ["read_query", "list_tables"]   # passed through; every other tool is refused
//!
//! [upstream]                     # a child process on stdio ...
//! command = "mcp-server-sqlite"
//! args = ["--db-path", "/var/lib/notes.db"]
//! env_from = { NOTES_TOKEN = "OPLEDGER_NOTES_TOKEN" }   # child variable = ours (never a value)
//! ## ... or Streamable HTTP: url = "https://mcp.example.com/mcp",
//! ##      headers_from = { Authorization = "NOTES_MCP_AUTHORIZATION" }, or a person's account:
//! ##      [upstream.login] scopes = ["notes"] (once: `opledger connectors login notes`)
//!
//! [[accounts]]
//! id = "main"
//! tenants = ["acme"]
//!
//! [[errors]]                     # read over an error's text before the default table
//! contains = "UNIQUE constraint failed"
//! means = "uncertain"            # "uncertain" | "rejected" | "not_sent"
//!
//! [[actions]]
//! name = "add_note"
//! description = "add a note"
//! tool = "write_query"
//! input = { type = "object", required = ["body"], properties.body = { type = "string", pattern = "^[^']*$" } }
//! arguments = { query = "INSERT INTO notes (label, body) VALUES ('{{label}}', '{{args.body}}')" }
//!
//! [actions.result]
//! success_pattern = "'affected_rows': 1\\b"   # the text that says it was done
//! id = "{{label}}"               # or id_at = "/id" (structured content), id_pattern = "id (\\d+)"
//!
//! [actions.dedup]
//! kind = "label_argument"        # | "idempotency_argument" | "naturally_idempotent" | "none"
//! argument = "query"             # the argument that carries {{label}} (or {{key}})
//!
//! [actions.lookup]
//! kind = "tool"                  # | "none"
//! tool = "read_query"
//! arguments = { query = "SELECT label FROM notes WHERE label = '{{label}}'" }
//! found = "'label': '({{label}})'"   # holds {{label}} or {{key}}; group 1 is the id
//! consistent = true              # false: "no match" proves nothing; then lag_ms = …
//! "#;
//! let document = match opledger_providers::document::parse_any("notes.toml", text) {
//!     Ok(opledger_providers::document::AnyDocument::Mcp(document)) => document,
//!     other => panic!("an MCP document: {other:?}"),
//! };
//! assert_eq!(document.actions[0].tool, "write_query");
//! ```
//!
//! Arguments are written as a REST body is (see [`crate::template`]): `arguments_base = "args"`
//! (the default when `arguments` is left out) starts from the call's arguments. A contract's
//! `argument` not written in `arguments` is set to the key or the label. A value placed inside
//! text (SQL, a commit message) is written as it is: the input schema must rule out what would
//! break out of it (above: no `'`).
//!
//! # How a call is classified
//!
//! | what happened | outcome | why |
//! |---|---|---|
//! | a result that is no error, matches `success_pattern` (if given) and names the object | `Confirmed` | the upstream said it was done, and what |
//! | such a result without the object, or not matching `success_pattern` | `Uncertain` | it may have been done; nothing names it |
//! | an error result (`isError`), a JSON-RPC error, or a result not matching `success_pattern`, whose text holds a rule's `contains` | the rule's meaning | the connector's author knows the upstream (some answer a failure as an ordinary result) |
//! | any other error result | `Uncertain` | a tool that failed may have done part of its work; a refusal proves nothing on its own (`git commit` refusing "nothing to commit" on a repeat) |
//! | a JSON-RPC error -32601 (no such method) or -32602 (invalid params: an unknown tool, arguments refused) | `Rejected` | refused before the tool ran |
//! | any other JSON-RPC error | `Uncertain` | the server failed while it may have been running the tool |
//! | no answer within `call_timeout_ms` | `Uncertain` | the call may still run and finish |
//! | the session closed or broke with the call out (the upstream died, the connection reset) | `Uncertain`, the session restarted for the next call | the upstream may have done it before it died |
//! | no session could be started (spawn failed, connect refused, `initialize` failed or timed out), or one was started less than `restart_wait_ms` ago | `NotSent` | the call was never written |
//! | the upstream refused a person's login token (401) and no new one could be had, or none could be had before the call was written | `NotSent`, a minute's wait, "run `opledger connectors login …` again" | a 401 is a refusal before the tool runs |
//! | unknown provider or account, or a tenant that does not own it | `NotSent` | nothing was sent |
//! | an action the connector does not have | `Rejected { code: "local …" }` | it can never be sent |
//!
//! A lookup calls its tool and reads the result's text with `found` (the operation's label or
//! key filled in): every match is the operation's object (the first is the one, the others
//! duplicates); no match is `NotFound`, authoritative only when `consistent = true`. An error,
//! a timeout or a broken session is `Unavailable`.
//!
//! # Sessions
//!
//! Sessions are started when first needed and kept open: at most [`MAX_SESSIONS_PER_UPSTREAM`]
//! per connector (`sessions`), each carrying up to [`MAX_CALLS_IN_FLIGHT_PER_UPSTREAM`] calls of
//! the connector at once in all. A session that closed (the child exited, the server dropped it)
//! is started again on the next call, but never sooner than `restart_wait_ms` after its last
//! start: a call in between is `NotSent` with that wait, so an upstream that keeps dying is not
//! restarted in a loop and the ledger, not a worker, holds the waiting operation.

mod connector;
mod import;
mod login;
mod session;
pub mod spec;

pub use connector::{list_tools, McpConnector, UpstreamTool};
pub use import::starting_document;
pub use login::{LoginReport, LOGIN_KEY_PURPOSE, REFUSED_LOGIN_WAIT_MS, UNAVAILABLE_TOKEN_WAIT_MS};
pub use spec::McpDocument;

/// The longest any upstream timeout may be set to, in milliseconds.
pub const MAX_UPSTREAM_TIMEOUT_MS: u64 = 120_000;
/// One `tools/call`'s timeout unless the document says otherwise, in milliseconds. With the
/// start timeout it is the longest a send takes, which the engine's lease (30 s by default) must
/// outlast.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 10_000;
/// Starting a session's timeout unless the document says otherwise, in milliseconds (a `uvx` or
/// `npx` upstream may install itself on its first start).
pub const DEFAULT_START_TIMEOUT_MS: u64 = 10_000;
const _: () = assert!(
    DEFAULT_CALL_TIMEOUT_MS <= MAX_UPSTREAM_TIMEOUT_MS
        && DEFAULT_START_TIMEOUT_MS <= MAX_UPSTREAM_TIMEOUT_MS
        && DEFAULT_CALL_TIMEOUT_MS + DEFAULT_START_TIMEOUT_MS
            < opledger_domain::command::DEFAULT_LEASE_MS
);
/// The least time between two starts of one session unless the document says otherwise, in
/// milliseconds.
pub const DEFAULT_RESTART_WAIT_MS: u64 = 1_000;
/// The longest `restart_wait_ms` accepted, in milliseconds (ten minutes, the longest wait any
/// answer may name: [`crate::http::MAX_RETRY_AFTER_MS`]).
pub const MAX_RESTART_WAIT_MS: u64 = crate::http::MAX_RETRY_AFTER_MS;
const _: () = assert!(DEFAULT_RESTART_WAIT_MS <= MAX_RESTART_WAIT_MS);
/// Most sessions one connector keeps open to its upstream. Each is a child process (stdio) or
/// an HTTP session; one multiplexes many calls, so more only spread a slow upstream's load.
pub const MAX_SESSIONS_PER_UPSTREAM: usize = 8;
/// Most calls one connector has out at once, over all its sessions (as for a REST connector:
/// [`crate::MAX_IN_FLIGHT_PER_PROVIDER`]).
pub const MAX_CALLS_IN_FLIGHT_PER_UPSTREAM: usize = crate::MAX_IN_FLIGHT_PER_PROVIDER;
/// Most arguments an upstream command may be given.
pub const MAX_UPSTREAM_ARGS: usize = 64;
/// Most tools one document may declare read-only.
pub const MAX_READ_ONLY_TOOLS: usize = 256;
/// Most `[[errors]]` rules one document may declare.
pub const MAX_ERROR_TEXT_RULES: usize = crate::document::MAX_ERROR_RULES;
/// Most characters of a tool's result kept as evidence or in a message.
pub const MAX_RESULT_TEXT_CHARS: usize = 2_000;
