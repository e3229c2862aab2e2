//! The connector document: one external REST API described as data, in TOML, and everything
//! checked about it when it is loaded.
//!
//! A connector says where the API is (`base_url`), how requests authenticate (`[auth]`), how the
//! API reports errors and rate limits (`[errors]`, `[rate_limit]`), which accounts may be used
//! and by which tenants (`[[accounts]]`), and what it can do (`[[actions]]`). Each action has an
//! input JSON Schema, the request it sends (built from templates, see [`crate::template`]), where
//! the created object's id is in the answer, and two promises of the provider that decide what the
//! ledger may do after an unclear outcome: how it deduplicates a repeated request
//! (`[actions.dedup]`) and how an operation can be looked up (`[actions.lookup]`).
//!
//! [`parse`] checks everything and reports **every** problem it finds, each with the file, line
//! and field, and what to write instead: a connector that loads is one whose requests can be
//! built for any arguments its schemas accept. It must never accept a secret written in the file:
//! credentials are named by environment variable only (`token_env`, `username_env`,
//! `password_env`), or given in code.
//!
//! # A complete example
//!
//! ```
//! let text = r#"
//! id = "tasks-api"
//! description = "The task API of Example CRM"
//! base_url = "https://crm.example.com/api/v2"
//! request_timeout_ms = 10000             # 1..=120000, default 10000
//! connect_timeout_ms = 2000              # 1..=request_timeout_ms, default 2000
//! request_id_header = "x-request-id"     # default "request-id"
//!
//! [auth]
//! kind = "header"                        # "bearer" | "header" | "basic"
//! header = "X-Api-Key"
//! prefix = ""                            # written before the token, default ""
//!
//! [settings]                             # defaults the user may override
//! label_property = "opledger_label"
//!
//! [errors]
//! code_at = "/error/type"                # JSON pointers into an error body (these are the defaults)
//! message_at = "/error/message"
//!
//! [[errors.rules]]                       # checked before the default table
//! status = 403
//! code = "RATE_LIMITED"                  # matched at code_at, or at this rule's own `at`
//! means = "not_sent"                     # "not_sent" | "rejected" | "uncertain"
//! retry_after_ms = 30000                 # the wait when the answer names none
//!
//! [rate_limit]                           # optional, and so is each key
//! reset_header = "x-ratelimit-reset"     # read beside Retry-After on every answer
//! reset_unit = "unix_seconds"            # "seconds" | "unix_seconds" | "milliseconds"
//! min_wait_ms = 1000                     # the least wait after a 429 (default 1000)
//!
//! [[accounts]]
//! id = "acme-main"
//! tenants = ["acme"]                     # who may act in this account; at least one
//! token_env = "EXAMPLE_CRM_TOKEN_ACME"   # never the token itself
//!
//! [[actions]]
//! name = "create_task"
//! description = "create a task"
//! destructive = false
//!
//! [actions.input]                        # JSON Schema 2020-12, as a TOML table
//! type = "object"
//! required = ["title"]
//! additionalProperties = false
//! properties.title = { type = "string", maxLength = 500 }
//! properties.due = { type = "string" }
//!
//! [actions.request]
//! method = "POST"                        # GET | POST | PUT | PATCH | DELETE
//! path = "/accounts/{{account}}/tasks"   # each placeholder is one percent-encoded segment
//! query = { notify = "false" }
//! headers = { "X-Trace" = "{{operation_id}}" }
//! body_encoding = "json"                 # "json" | "form" | "none"
//! body_base = "args"                     # start the body from the arguments
//! body = { "{{settings.label_property}}" = "{{label}}", due_at = "{{args.due}}" }
//!
//! [actions.response]
//! success = [200, 201]                   # default: any 2xx
//! id = "/data/id"                        # or id_header = "location"
//!
//! [actions.dedup]
//! kind = "idempotency_key"               # | "unique_label" | "naturally_idempotent" | "none"
//! header = "Idempotency-Key"
//! retention_s = 86400
//! safety_margin_s = 3600
//! in_flight = { status = 409, code = "idempotency_in_flight" }
//!
//! [actions.lookup]
//! kind = "by_key"                        # | "by_label" | "search" | "none"
//! method = "GET"
//! path = "/accounts/{{account}}/requests/{{key}}"
//! found = { status = 200, at = "/status", equals = "completed" }
//! in_progress = { status = 200, at = "/status", equals = "in_progress" }
//! not_found = { status = 404, at = "/error/type", equals = "not_found" }
//! id = "/id"
//! "#;
//! let document = opledger_providers::document::parse("tasks-api.toml", text)
//!     .expect("the example is a valid connector");
//! assert_eq!(document.actions[0].name.as_str(), "create_task");
//! ```
//!
//! A `search` lookup instead names the request, where the results are and how a result is
//! recognised as this operation's (never by its title):
//!
//! ```toml
//! [actions.lookup]
//! kind = "search"
//! method = "POST"
//! path = "/tasks/search"
//! body = { filter = { label = "{{label}}" } }
//! results = "/results"                   # the array of results
//! id = "/id"                             # inside one result
//! label_at = "/opledger_label"           # must equal the operation's label exactly
//! account_at = "/account"                # optional: must equal the account
//! lag_ms = 2000                          # how long the index may lag behind a create
//! ```
//!
//! In `label_at` and `account_at` a step written `*` means "any element of this array": a result
//! counts when any element reached equals the label (`label_at = "/item/custom_fields/*"` finds
//! Pipedrive's label wherever it stands among a hit's custom field values, whose order is not
//! documented). `*` must be a whole step, at most twice in a pointer, reaches array elements
//! only, and is refused in `results` and `id`, which name one value each (see
//! [`crate::pointer`]).
//!
//! `[probe]` (optional) is the read-only request `opledger connectors test` sends to check each
//! account's credentials against the live API: `path` (and `query`, `headers`), always a GET,
//! templates with `{{account}}` and settings only. Nothing is created.
//!
//! `[rate_limit]` may also declare each account's request budget, enforced before a request is
//! made: `requests_per_s` and `burst` (default: `requests_per_s`) for sends and lookups each,
//! and `[rate_limit.sends]` / `[rate_limit.lookups]` with the same two keys where one kind is
//! limited apart (HubSpot's search API allows 5 a second per account).
//!
//! `[rate_limit]` may be left out. `min_wait_ms` (default [`DEFAULT_RATE_LIMIT_MIN_WAIT_MS`],
//! 1000) is the least wait after a 429: the wait when the answer names none (no Retry-After, no
//! reset header, no matching rule's `retry_after_ms`), and the floor under a shorter one, so a
//! 429 is never repeated inside the window that refused it. A rule on status 429 with its own
//! `retry_after_ms` (matched, say, on `at = "/policyName"`) gives one kind of 429 a longer wait.
//!
//! `unique_label` declares `conflict = { status = 409, code = "label_conflict" }` (a conflict is a
//! rejection) and its request must carry `{{label}}`; `by_label` is `by_key` with `{{label}}`.

mod action;
mod mcp;
mod read;
mod tree;

use std::collections::BTreeMap;

use opledger_domain::contract::{Deduplication, LookupSupport, ProviderCapabilities};
use opledger_domain::ids::{AccountId, ActionName, ProviderId, TenantId};
use reqwest::header::HeaderName;
use reqwest::Method;
use serde_json::Value;

use crate::body::BodyEncoding;
use crate::credentials::{Auth, Credentials};
use crate::error::ConnectorError;
use crate::template::{Template, Tree};

pub(crate) use read::{check_base_url, check_timeouts};

/// Largest connector document read, in bytes.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;
/// Most actions one connector may declare.
pub const MAX_ACTIONS_PER_CONNECTOR: usize = 256;
/// Most accounts one connector may be built with (file and overrides together).
pub const MAX_ACCOUNTS_PER_CONNECTOR: usize = 1024;
/// Most tenants one account may name.
pub const MAX_TENANTS_PER_ACCOUNT: usize = 1024;
/// Most settings one connector may declare.
pub const MAX_SETTINGS: usize = 64;
/// Longest setting value, in characters.
pub const MAX_SETTING_VALUE_CHARS: usize = 1_024;
/// Most error rules one connector may declare.
pub const MAX_ERROR_RULES: usize = 64;
/// Most query parameters or extra headers one request may declare (each).
pub const MAX_REQUEST_ENTRIES: usize = 32;
/// Largest input schema, in bytes of its JSON text.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Longest description (of the connector or of an action), in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 500;
/// Shortest request or connect timeout accepted, in milliseconds.
pub const MIN_TIMEOUT_MS: u64 = 1;
/// Longest request or connect timeout accepted, in milliseconds.
pub const MAX_TIMEOUT_MS: u64 = 120_000;
/// Default whole-request timeout (connect, send, wait, read), in milliseconds.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 10_000;
/// Default connect timeout, in milliseconds.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 2_000;
const _: () = assert!(
    MIN_TIMEOUT_MS <= DEFAULT_CONNECT_TIMEOUT_MS
        && DEFAULT_CONNECT_TIMEOUT_MS <= DEFAULT_REQUEST_TIMEOUT_MS
        && DEFAULT_REQUEST_TIMEOUT_MS <= MAX_TIMEOUT_MS
);
/// Longest idempotency-key retention accepted, in seconds (a year; Stripe keeps keys 24 hours).
pub const MAX_KEY_RETENTION_S: u64 = 366 * 24 * 60 * 60;
/// Longest search-index lag accepted, in milliseconds (a day).
pub const MAX_SEARCH_LAG_MS: u64 = 24 * 60 * 60 * 1000;
/// Longest base URL accepted, in bytes.
pub const MAX_BASE_URL_BYTES: usize = 2048;
/// The least wait after a 429 unless the connector says otherwise, in milliseconds. Most APIs
/// count requests in windows of a second or more (HubSpot, Stripe and Attio per second,
/// Pipedrive per 2 s, Zendesk per minute), so a 429 that names no wait is refused again if it is
/// repeated sooner; without a floor the engine's backoff base (tens of milliseconds in a test
/// configuration) would decide the wait.
pub const DEFAULT_RATE_LIMIT_MIN_WAIT_MS: u64 = 1_000;
/// Shortest `min_wait_ms` a connector may declare, in milliseconds: a 429 is never repeated at
/// once.
pub const MIN_RATE_LIMIT_WAIT_MS: u64 = 1;
const _: () = assert!(
    MIN_RATE_LIMIT_WAIT_MS <= DEFAULT_RATE_LIMIT_MIN_WAIT_MS
        && DEFAULT_RATE_LIMIT_MIN_WAIT_MS <= crate::http::MAX_RETRY_AFTER_MS
);
/// The header that names the provider's request id unless the connector says otherwise.
pub const DEFAULT_REQUEST_ID_HEADER: &str = "request-id";
/// Where the error code is in an error body unless the connector says otherwise.
pub const DEFAULT_CODE_AT: &str = "/error/type";
/// Where the error message is in an error body unless the connector says otherwise.
pub const DEFAULT_MESSAGE_AT: &str = "/error/message";

/// A loaded, checked connector document. Plain data: [`crate::Connector::build`] turns it into
/// something that sends.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    /// The name it was loaded under (its file name), for messages.
    pub name: String,
    /// The provider id it registers under unless the user gives another.
    pub id: ProviderId,
    /// What the API is, in one line.
    pub description: String,
    /// `http://` or `https://`, host, optional port and path prefix, no trailing `/`; `None` when
    /// the installation must say (a stand, a self-hosted CRM).
    pub base_url: Option<String>,
    /// Whole-request timeout, in milliseconds.
    pub request_timeout_ms: u64,
    /// Connect timeout, in milliseconds; at most `request_timeout_ms`.
    pub connect_timeout_ms: u64,
    /// The response header that carries the provider's request id.
    pub request_id_header: HeaderName,
    /// How requests authenticate.
    pub auth: Auth,
    /// Settings and their defaults.
    pub settings: BTreeMap<String, String>,
    /// How the API reports errors.
    pub errors: ErrorSpec,
    /// How the API signals its rate limit (a reset header, the least wait after a 429).
    pub rate_limit: RateLimit,
    /// Accounts declared in the file (more may be given when building).
    pub accounts: Vec<AccountSpec>,
    /// What the API can do.
    pub actions: Vec<Action>,
    /// The read-only request `opledger connectors test` checks an account's credentials with.
    pub probe: Option<RequestSpec>,
}

impl Document {
    /// The action called `name`.
    pub fn action(&self, name: &str) -> Option<&Action> {
        self.actions
            .iter()
            .find(|action| action.name.as_str() == name)
    }
}

/// Where an error body holds its code and message, and the rules read before the default table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorSpec {
    /// JSON pointer of the error code.
    pub code_at: String,
    /// JSON pointer of the error message.
    pub message_at: String,
    /// Rules checked in order before the default classification.
    pub rules: Vec<ErrorRule>,
}

/// "An answer with this status (and code) means this."
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorRule {
    /// The status it matches.
    pub status: u16,
    /// The code it matches, if any (compared as text).
    pub code: Option<String>,
    /// Where the code is, when not at [`ErrorSpec::code_at`].
    pub at: Option<String>,
    /// What such an answer means for a send.
    pub means: Means,
    /// The wait when the answer names none, in milliseconds.
    pub retry_after_ms: Option<u64>,
}

/// What an answer matched by a rule means for a send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Means {
    /// The provider processed nothing: `NotSent`, to be tried again after the wait.
    NotSent,
    /// The provider refused and applied nothing: `Rejected`.
    Rejected,
    /// It may have been applied: `Uncertain`.
    Uncertain,
}

/// How the API signals its rate limit: a reset header read beside Retry-After, and the least wait
/// after a 429. Every connector has one: `[rate_limit]` may be left out, which is the default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimit {
    /// A documented header that says when the limit resets, if the API sends one.
    pub reset: Option<ResetHeader>,
    /// The least wait after a 429, in milliseconds: the wait when the answer names none (no
    /// Retry-After, no reset header) and the floor under a shorter one it names.
    pub min_wait_ms: u64,
    /// Each account's budget for sends (`requests_per_s`, `burst`, or `[rate_limit.sends]`).
    pub sends: Option<crate::budget::Budget>,
    /// Each account's budget for lookups (`requests_per_s`, `burst`, or
    /// `[rate_limit.lookups]`, e.g. HubSpot's search API, limited apart from the rest).
    pub lookups: Option<crate::budget::Budget>,
}

impl Default for RateLimit {
    /// No reset header, and a 429 never retried sooner than [`DEFAULT_RATE_LIMIT_MIN_WAIT_MS`].
    fn default() -> Self {
        Self {
            reset: None,
            min_wait_ms: DEFAULT_RATE_LIMIT_MIN_WAIT_MS,
            sends: None,
            lookups: None,
        }
    }
}

/// A rate-limit reset header and how to read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResetHeader {
    /// The header, e.g. `x-ratelimit-reset`.
    pub header: HeaderName,
    /// What its number counts.
    pub unit: ResetUnit,
}

/// What a rate-limit reset header's number counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetUnit {
    /// Seconds from now.
    Seconds,
    /// The Unix time (seconds) of the reset.
    UnixSeconds,
    /// Milliseconds from now.
    Milliseconds,
}

/// One account: who owns it and where its credentials come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountSpec {
    /// The account, as the provider knows it (it may appear in paths as `{{account}}`).
    pub id: AccountId,
    /// The tenants that may act in it; never empty.
    pub tenants: Vec<TenantId>,
    /// Its credentials.
    pub credentials: Credentials,
}

/// One thing the API can do.
#[derive(Clone, Debug, PartialEq)]
pub struct Action {
    /// Its name, snake_case.
    pub name: ActionName,
    /// One line saying what it does ("create a task"): the agent's sentence and the MCP tool use it.
    pub description: String,
    /// Whether it destroys or overwrites something (a tool marks it so).
    pub destructive: bool,
    /// The JSON Schema (2020-12) its arguments must satisfy.
    pub input: Value,
    /// The request a call sends.
    pub request: RequestSpec,
    /// How a successful answer names the object.
    pub response: ResponseSpec,
    /// How the provider deduplicates a repeated request.
    pub dedup: Dedup,
    /// How an operation can be looked up.
    pub lookup: Lookup,
    /// Where in the arguments the data subject is named (`subject = "/email"`): an operation
    /// of this action is recorded with personal data under that person's key.
    pub subject: Option<String>,
    /// Which argument values are personal (`personal = ["/email", "/name"]`), sealed under the
    /// subject's key when the tenant seals declared fields only.
    pub personal: Vec<String>,
}

impl Action {
    /// What the action promises the ledger: its `[actions.dedup]` and `[actions.lookup]` as the
    /// domain's deduplication and lookup contract.
    pub fn capabilities(&self) -> ProviderCapabilities {
        let deduplication = match &self.dedup {
            Dedup::IdempotencyKey {
                retention_s,
                safety_margin_s,
                ..
            } => Deduplication::IdempotencyKey {
                retention_s: *retention_s,
                safety_margin_s: *safety_margin_s,
            },
            Dedup::UniqueLabel { .. } => Deduplication::UniqueLabel,
            Dedup::NaturallyIdempotent => Deduplication::NaturallyIdempotent,
            Dedup::None => Deduplication::None,
        };
        let lookup = match &self.lookup {
            Lookup::None => LookupSupport::None,
            Lookup::Consistent(_) => LookupSupport::Consistent,
            Lookup::Search(search) => LookupSupport::EventuallyConsistent {
                lag_ms: search.lag_ms,
            },
        };
        ProviderCapabilities {
            deduplication,
            lookup,
        }
    }
}

/// A request written with templates.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestSpec {
    /// GET, POST, PUT, PATCH or DELETE.
    pub method: Method,
    /// The path below the base URL, starting with `/`.
    pub path: Template,
    /// Query parameters, in the order written.
    pub query: Vec<(String, Template)>,
    /// Extra headers, in the order written.
    pub headers: Vec<(HeaderName, Template)>,
    /// How the body is written.
    pub encoding: BodyEncoding,
    /// Whether the body starts from the arguments object.
    pub body_base_args: bool,
    /// The body, merged over the arguments when `body_base_args`.
    pub body: Option<Tree>,
}

/// How a successful answer is recognised and names the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseSpec {
    /// The statuses that mean success; `None`: any 2xx.
    pub success: Option<Vec<u16>>,
    /// Where the object's id is.
    pub id: IdSource,
}

/// Where a successful answer names the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdSource {
    /// A JSON pointer into the body (a string, or an integer written as one).
    Pointer(String),
    /// The last path segment of a header (`Location`), for answers without a body.
    Header(HeaderName),
}

/// An error answer by status and, optionally, its code at [`ErrorSpec::code_at`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusMatch {
    /// The status.
    pub status: u16,
    /// The code, if it must match too.
    pub code: Option<String>,
}

/// How the provider deduplicates a repeated request (the domain's `Deduplication`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dedup {
    /// The provider replays the first answer for a repeated idempotency key.
    IdempotencyKey {
        /// The header the key travels in.
        header: HeaderName,
        /// How long the provider remembers a key, in seconds.
        retention_s: u64,
        /// How much of the retention a retry never uses, in seconds.
        safety_margin_s: u64,
        /// The answer meaning "an earlier request with this key is still being processed; this
        /// one was not": `NotSent` with a short wait.
        in_flight: Option<StatusMatch>,
    },
    /// The provider refuses a second object with the operation's label (an upsert by an
    /// external id).
    UniqueLabel {
        /// The answer meaning "the label holds another object": `Rejected`.
        conflict: Option<StatusMatch>,
    },
    /// A repeat has no further effect (a PUT of a whole resource, a DELETE).
    NaturallyIdempotent,
    /// Nothing: every request may create another object.
    None,
}

/// How an operation can be looked up.
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup {
    /// Not at all.
    None,
    /// By key or by label, consistently: "not found" is authoritative.
    Consistent(ConsistentLookup),
    /// A search in a lagging index: "not found" proves nothing.
    Search(SearchLookup),
}

/// What a consistent lookup is keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LookupBy {
    /// The idempotency key (`{{key}}`).
    Key,
    /// The operation's label (`{{label}}`).
    Label,
}

/// A consistent lookup: one request and how to read its answer.
#[derive(Clone, Debug, PartialEq)]
pub struct ConsistentLookup {
    /// What it is keyed by.
    pub by: LookupBy,
    /// The request (no arguments: a lookup carries none).
    pub request: RequestSpec,
    /// The answer that means "found".
    pub found: Expect,
    /// The answer that means "still being processed", if the API has one.
    pub in_progress: Option<Expect>,
    /// The answer that means "no such object".
    pub not_found: Expect,
    /// Where the object's id is in a "found" answer.
    pub id: String,
}

/// An expected answer: a status and, optionally, a value at a pointer.
#[derive(Clone, Debug, PartialEq)]
pub struct Expect {
    /// The status.
    pub status: u16,
    /// Where the value is, if one must match.
    pub at: Option<String>,
    /// The value it must equal.
    pub equals: Option<Value>,
}

/// A search lookup.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchLookup {
    /// The request (no arguments).
    pub request: RequestSpec,
    /// The status of a successful search.
    pub status: u16,
    /// Where the results array is.
    pub results: String,
    /// Where a result's id is.
    pub id: String,
    /// Where a result's label is; it must equal the operation's label exactly.
    pub label_at: String,
    /// Where a result's account is, if the results carry one; it must then equal the account.
    pub account_at: Option<String>,
    /// How long the index may lag behind a create, in milliseconds.
    pub lag_ms: u64,
}

/// A checked connector document of either transport.
#[derive(Clone, Debug)]
pub enum AnyDocument {
    /// A REST API (`transport = "http"`, the default). Both are boxed: a document is read once,
    /// and the two differ in size by hundreds of bytes.
    Rest(Box<Document>),
    /// An upstream MCP server (`transport = "mcp"`, see [`crate::mcp`]).
    Mcp(Box<crate::mcp::McpDocument>),
}

impl AnyDocument {
    /// The provider id it registers under unless the user gives another.
    pub fn id(&self) -> &ProviderId {
        match self {
            Self::Rest(document) => &document.id,
            Self::Mcp(document) => &document.id,
        }
    }
}

/// Reads and checks a connector document of either transport (see [`AnyDocument`]); every
/// problem found is returned, each with its line and field.
pub fn parse_any(name: &str, text: &str) -> Result<AnyDocument, Vec<ConnectorError>> {
    read::any_document(name, text)
}

pub(crate) use mcp::fill_pattern;

/// Reads and checks a connector document; `name` is its file name (for messages). Every problem
/// found is returned, each with its line and field.
pub fn parse(name: &str, text: &str) -> Result<Document, Vec<ConnectorError>> {
    read::document(name, text)
}

#[cfg(test)]
mod tests;
