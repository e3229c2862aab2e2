//! An MCP connector document, read and checked: the upstream server, the accounts, and each
//! action as one upstream tool with the ledger's contract (see [`crate::mcp`] for the format).

use opledger_domain::contract::{Deduplication, LookupSupport, ProviderCapabilities};
use opledger_domain::ids::{ActionName, ProviderId};
use serde_json::Value;

use opledger_domain::ids::{AccountId, TenantId};

use crate::document::Means;
use crate::template::{Template, Tree};

/// A loaded, checked MCP connector document. Plain data: [`crate::mcp::McpConnector::build`]
/// turns it into something that calls the upstream.
#[derive(Clone, Debug)]
pub struct McpDocument {
    /// The name it was loaded under (its file name), for messages.
    pub name: String,
    /// The provider id it registers under unless the user gives another.
    pub id: ProviderId,
    /// What the upstream is, in one line.
    pub description: String,
    /// How the upstream is reached.
    pub upstream: Upstream,
    /// Longest one `tools/call` may take before its outcome is unclear, in milliseconds.
    pub call_timeout_ms: u64,
    /// Longest starting a session may take (spawning or connecting, then `initialize`), in
    /// milliseconds.
    pub start_timeout_ms: u64,
    /// Least time between two starts of one session, in milliseconds: an upstream that keeps
    /// dying is not restarted in a tight loop; a call in between is not sent.
    pub restart_wait_ms: u64,
    /// Sessions kept open to the upstream (calls are spread over them; each multiplexes).
    pub sessions: usize,
    /// Accounts: who may use the upstream (it has one identity, so no credentials per account).
    pub accounts: Vec<McpAccount>,
    /// What the ledger calls, each an upstream tool.
    pub actions: Vec<McpAction>,
    /// Upstream tools declared read-only: passed through without the ledger (they change
    /// nothing). Every other tool is refused.
    pub read_only: Vec<String>,
    /// Rules over an error's text, checked before the default classification.
    pub errors: Vec<TextRule>,
}

impl McpDocument {
    /// The action called `name`.
    pub fn action(&self, name: &str) -> Option<&McpAction> {
        self.actions
            .iter()
            .find(|action| action.name.as_str() == name)
    }
}

/// One account: a name the ledger binds operations to, and the tenants that may use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpAccount {
    /// The account's id.
    pub id: AccountId,
    /// The tenants that may act in it; never empty.
    pub tenants: Vec<TenantId>,
}

/// How the upstream MCP server is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Upstream {
    /// A child process speaking MCP on its standard input and output.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables set in its environment, each read from one of this process's: (the
        /// child's name, the variable it is read from). The child starts with an empty
        /// environment besides these and `PATH`/`HOME`, so nothing else leaks into it.
        env_from: Vec<(String, String)>,
        /// Its working directory (`None`: this process's).
        cwd: Option<String>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        /// `http://` or `https://` URL of the MCP endpoint.
        url: String,
        /// Headers sent with every request, each read from an environment variable: (header,
        /// variable). `Authorization` carries a bearer token this way.
        headers_from: Vec<(String, String)>,
        /// A PEM file of CA certificates trusted for an `https://` URL beside the operating
        /// system's (an upstream behind a private CA).
        ca_file: Option<String>,
        /// An access token obtained with OAuth2 client credentials, sent as
        /// `Authorization: Bearer`.
        oauth: Option<UpstreamOAuth>,
        /// A person's account at the upstream, authorized once with `opledger connectors
        /// login` (the MCP authorization flow); its tokens are sent as `Authorization: Bearer`.
        login: Option<UpstreamLogin>,
    },
}

/// `[upstream.login]`: the upstream acts for a person's account, authorized once with the MCP
/// specification's authorization flow (OAuth 2.1 authorization code with PKCE, the authorization
/// server found from the upstream's protected resource metadata). The refresh token it yields is
/// kept sealed beside the ledger.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpstreamLogin {
    /// Scopes asked for (none: what the upstream's metadata or challenge names).
    pub scopes: Vec<String>,
    /// The variable holding a client id registered with the authorization server beforehand
    /// (`None`: the client registers itself, RFC 7591).
    pub client_id_env: Option<String>,
    /// The variable holding that client's secret (a confidential client only).
    pub client_secret_env: Option<String>,
    /// The loopback port the authorization server redirects to (`None`: any free port; a client
    /// registered beforehand names the redirect URI it registered).
    pub redirect_port: Option<u16>,
}

/// `[upstream.oauth]`: an access token for the upstream from its authorization server, with the
/// client-credentials grant (RFC 6749 §4.4), renewed before it expires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamOAuth {
    /// The token endpoint's `http(s)://` URL.
    pub token_url: String,
    /// Scopes asked for (none: the parameter is left out).
    pub scopes: Vec<String>,
    /// The variable holding the client id.
    pub client_id_env: String,
    /// The variable holding the client secret.
    pub client_secret_env: String,
}

/// One thing the ledger may ask the upstream to do: one tool, and its contract.
#[derive(Clone, Debug)]
pub struct McpAction {
    /// Its name, snake_case (the gateway's tool is named from it).
    pub name: ActionName,
    /// One line saying what it does.
    pub description: String,
    /// Whether it destroys or overwrites something.
    pub destructive: bool,
    /// The JSON Schema (2020-12) its arguments must satisfy.
    pub input: Value,
    /// The upstream tool it calls.
    pub tool: String,
    /// Whether the tool's arguments start from the call's arguments.
    pub arguments_base_args: bool,
    /// The tool's arguments, written with templates (merged over the call's arguments when
    /// `arguments_base_args`).
    pub arguments: Option<Tree>,
    /// How a result is read.
    pub result: ResultSpec,
    /// How the upstream deduplicates a repeated call.
    pub dedup: McpDedup,
    /// How an unclear call is looked up.
    pub lookup: McpLookup,
}

impl McpAction {
    /// What the action promises the ledger, as the domain's contract.
    pub fn capabilities(&self) -> ProviderCapabilities {
        let deduplication = match &self.dedup {
            McpDedup::IdempotencyArgument {
                retention_s,
                safety_margin_s,
                ..
            } => Deduplication::IdempotencyKey {
                retention_s: *retention_s,
                safety_margin_s: *safety_margin_s,
            },
            McpDedup::LabelArgument { .. } => Deduplication::UniqueLabel,
            McpDedup::NaturallyIdempotent => Deduplication::NaturallyIdempotent,
            McpDedup::None => Deduplication::None,
        };
        let lookup = match &self.lookup {
            McpLookup::None => LookupSupport::None,
            McpLookup::Tool(tool) if tool.consistent => LookupSupport::Consistent,
            McpLookup::Tool(tool) => LookupSupport::EventuallyConsistent {
                lag_ms: tool.lag_ms,
            },
        };
        ProviderCapabilities {
            deduplication,
            lookup,
        }
    }
}

/// How a tool's result names the object it made.
#[derive(Clone, Debug)]
pub struct ResultSpec {
    /// A pattern the result's text must match to count as done (e.g. `'affected_rows': 1`);
    /// without it any result that is not an error counts.
    pub success_pattern: Option<regex::Regex>,
    /// Where the object's id is.
    pub id: IdRule,
}

/// Where a result names the object.
#[derive(Clone, Debug)]
pub enum IdRule {
    /// A JSON pointer into the structured content (or into the text, when it is JSON).
    At(String),
    /// The first capture group of a pattern over the result's text.
    Pattern(regex::Regex),
    /// A value the call itself determines (`{{label}}`, `{{args.path}}`): the object is named
    /// by what was asked, once the result says it was done.
    Template(Template),
}

/// How the upstream deduplicates a repeated call (the domain's `Deduplication`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum McpDedup {
    /// The tool takes an idempotency key in `argument` and replays its first result for it.
    IdempotencyArgument {
        /// The tool argument that carries `{{key}}`.
        argument: String,
        /// How long the upstream remembers a key, in seconds.
        retention_s: u64,
        /// How much of the retention a retry never uses, in seconds.
        safety_margin_s: u64,
    },
    /// The operation's label travels in `argument` and the upstream refuses a second object
    /// with it (a unique column, an external id).
    LabelArgument {
        /// The tool argument that carries `{{label}}`.
        argument: String,
    },
    /// A repeat has no further effect (writing a whole file).
    NaturallyIdempotent,
    /// Nothing: every call may make another object.
    None,
}

/// How an unclear call is looked up.
#[derive(Clone, Debug)]
pub enum McpLookup {
    /// Not at all.
    None,
    /// Another tool, and a pattern over its result that names this operation's object.
    Tool(ToolLookup),
}

/// A lookup by another upstream tool.
#[derive(Clone, Debug)]
pub struct ToolLookup {
    /// The tool.
    pub tool: String,
    /// Its arguments (no call arguments: a lookup carries none).
    pub arguments: Option<Tree>,
    /// The pattern over the result's text; it holds `{{label}}` or `{{key}}` (filled in,
    /// escaped, per operation) and its first capture group is the object's id.
    pub found: String,
    /// Whether "no match" is conclusive (a consistent read), or proves nothing.
    pub consistent: bool,
    /// How long a create may take to show in the tool's result, in milliseconds (0 when
    /// consistent).
    pub lag_ms: u64,
}

/// "An error whose text holds this means this."
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextRule {
    /// The text it matches (a substring of the error's text).
    pub contains: String,
    /// What such an error means for a send.
    pub means: Means,
}
