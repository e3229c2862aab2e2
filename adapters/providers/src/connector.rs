//! The runnable connector: a checked [`Document`] plus what the installation adds
//! ([`Overrides`]: id, base URL, settings, accounts, timeouts), with its HTTP client, its
//! accounts' credentials and each action's compiled input schema.
//!
//! Building reads every credential from the environment once and reports every problem (a
//! missing variable is named, its value never). Sending re-checks the binding first — the
//! provider, the account, that the tenant owns the account, the action — so nothing leaves this
//! process for a call the connector was not built to make.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fmt;
use std::time::Duration;

use chrono::Utc;
use opledger_domain::contract::ProviderCapabilities;
use opledger_domain::event::BudgetWait;
use opledger_domain::ids::{AccountId, ActionName, CredentialFingerprint, ProviderId, TenantId};
use opledger_domain::in_span::InSpanExt;
use opledger_domain::provider::{
    ArgProblem, Binding, LookupOutcome, LookupRequest, Readiness, RequestKind, SendOutcome,
    SendRequest, Unbound,
};
use reqwest::header::HeaderValue;
use serde_json::{Map, Value};
use tokio::sync::Semaphore;
use tracing::{field, Span};

use crate::body::{self, BodyEncoding};
use crate::budget::{Bucket, Kind, Waits};
use crate::classify::{classify_send, Reading};
use crate::credentials::{self, Credential};
use crate::document::{
    check_base_url, check_timeouts, AccountSpec, Action, Dedup, Document, Lookup, RequestSpec,
    MAX_ACCOUNTS_PER_CONNECTOR, MAX_SETTING_VALUE_CHARS,
};
use crate::error::ConnectorError;
use crate::http::{self, encode_component, shorten, PreparedRequest, MAX_MESSAGE_CHARS};
use crate::lookup::{classify_consistent, classify_search, Asked};
use crate::oauth::{Grant, NoToken, Place, TokenFailure, TokenFile};
use crate::pointer::{check_any_steps, check_no_any_step};
use crate::template::{resolve_pointer, Context};

/// Most requests one connector runs at once.
pub const MAX_IN_FLIGHT_PER_PROVIDER: usize = 64;
/// Most argument problems reported for one call.
pub const MAX_ARG_PROBLEMS: usize = 20;

/// What an installation adds to a connector document. Plain data: code builds it directly, the
/// serve configuration fills it from its file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// The provider id to register under, instead of the document's `id`.
    pub id: Option<ProviderId>,
    /// The base URL, instead of the document's (required when the document has none).
    pub base_url: Option<String>,
    /// Setting values over the document's defaults; each must be a declared setting.
    pub settings: BTreeMap<String, String>,
    /// Accounts beside the document's; an id may appear once in both together.
    pub accounts: Vec<AccountSpec>,
    /// The whole-request timeout, in milliseconds, instead of the document's.
    pub request_timeout_ms: Option<u64>,
    /// The connect timeout, in milliseconds, instead of the document's.
    pub connect_timeout_ms: Option<u64>,
    /// The file OAuth2 refresh tokens the provider rotates are kept in (beside the ledger; one
    /// per connector). `None`: a rotated token lives in memory only, and a restart needs the
    /// account re-authorised.
    pub token_file: Option<std::path::PathBuf>,
    /// The server's key for credential fingerprints: each account's fingerprint is then an
    /// HMAC-SHA256 under it (`hmac-sha256:…`), so one shown to a tenant or in an export cannot be
    /// used to confirm a guessed key offline. `None`: the unkeyed `sha256:` form.
    pub fingerprint_key: Option<credentials::FingerprintKey>,
}

/// One account, ready: who owns it, its credential and its request budgets.
#[derive(Debug)]
struct Account {
    tenants: BTreeSet<TenantId>,
    credential: Credential,
    sends: Option<Bucket>,
    lookups: Option<Bucket>,
}

/// One action, ready: its spec, its compiled schema, how its answers are read, what it promises.
struct Compiled {
    action: Action,
    validator: jsonschema::Validator,
    reading: Reading,
    capabilities: ProviderCapabilities,
}

impl fmt::Debug for Compiled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compiled")
            .field("action", &self.action.name)
            .field("capabilities", &self.capabilities)
            .finish_non_exhaustive()
    }
}

/// A connector ready to send: see the module docs.
#[derive(Debug)]
pub struct Connector {
    id: ProviderId,
    name: String,
    description: String,
    base_url: String,
    client: reqwest::Client,
    accounts: BTreeMap<AccountId, Account>,
    actions: Vec<Compiled>,
    settings: BTreeMap<String, String>,
    request_timeout: Duration,
    permits: Semaphore,
    waits: Waits,
    probe: Option<RequestSpec>,
}

/// Collects the problems of building one connector (no lines: they are about values given in
/// code, the serve configuration or the environment).
struct Problems {
    file: String,
    errors: Vec<ConnectorError>,
}

impl Problems {
    fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ConnectorError {
            file: self.file.clone(),
            line: None,
            field: field.into(),
            message: message.into(),
        });
    }
}

impl Connector {
    /// Builds the connector `document` describes with `overrides`, reading credentials from the
    /// process environment. Every problem is reported.
    pub fn build(document: &Document, overrides: Overrides) -> Result<Self, Vec<ConnectorError>> {
        Self::with_env(document, overrides, &|name| std::env::var_os(name))
    }

    /// Loads the preset `preset` (see [`crate::presets`]) and builds it with `overrides`
    /// (credentials from the process environment).
    pub fn from_preset(preset: &str, overrides: Overrides) -> Result<Self, Vec<ConnectorError>> {
        let Some((file, text)) = crate::presets::preset(preset) else {
            let known: Vec<&str> = crate::presets::preset_names().collect();
            return Err(vec![ConnectorError {
                file: preset.to_owned(),
                line: None,
                field: "preset".to_owned(),
                message: format!("is no preset; the presets are: {}", known.join(", ")),
            }]);
        };
        let document = crate::document::parse(file, text)?;
        Self::build(&document, overrides)
    }

    /// [`Connector::build`] with the environment given as a function (tests, secret stores).
    pub fn with_env(
        document: &Document,
        overrides: Overrides,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<Self, Vec<ConnectorError>> {
        let mut problems = Problems {
            file: document.name.clone(),
            errors: Vec::new(),
        };
        let base_url = base_url(document, &overrides, &mut problems);
        let request_ms = overrides
            .request_timeout_ms
            .unwrap_or(document.request_timeout_ms);
        let connect_ms = overrides
            .connect_timeout_ms
            .unwrap_or(document.connect_timeout_ms);
        for (field, message) in check_timeouts(request_ms, connect_ms) {
            problems.add(field, message);
        }
        let settings = settings(document, &overrides, &mut problems);
        let token_file = overrides
            .token_file
            .as_ref()
            .map(|path| std::sync::Arc::new(TokenFile::new(path)));
        let provider = overrides.id.clone().unwrap_or_else(|| document.id.clone());
        let accounts = accounts(
            document,
            &overrides.accounts,
            env,
            (
                &provider,
                token_file.as_ref(),
                overrides.fingerprint_key.as_ref(),
            ),
            &mut problems,
        );
        let actions = compile(document, &settings, &mut problems);
        let client = http::build_client(request_ms, connect_ms)
            .map_err(|message| problems.add("client", message))
            .ok();
        match (base_url, client) {
            (Some(base_url), Some(client)) if problems.errors.is_empty() => Ok(Self {
                id: overrides.id.unwrap_or_else(|| document.id.clone()),
                name: document.name.clone(),
                description: document.description.clone(),
                base_url,
                client,
                accounts,
                actions,
                settings,
                request_timeout: Duration::from_millis(request_ms),
                permits: Semaphore::new(MAX_IN_FLIGHT_PER_PROVIDER),
                waits: Waits::default(),
                probe: document.probe.clone(),
            }),
            _ => Err(problems.errors),
        }
    }

    /// The provider id it is registered under.
    pub fn id(&self) -> &ProviderId {
        &self.id
    }

    /// The name of the document it was built from (its file name).
    pub fn document_name(&self) -> &str {
        &self.name
    }

    /// What the API is, in one line.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Every action, in the order declared.
    pub fn actions(&self) -> impl Iterator<Item = &Action> {
        self.actions.iter().map(|compiled| &compiled.action)
    }

    /// The action called `name`.
    pub fn action(&self, name: &ActionName) -> Option<&Action> {
        self.compiled(name).map(|compiled| &compiled.action)
    }

    /// The accounts it may act in, in order.
    pub fn accounts(&self) -> impl Iterator<Item = &AccountId> {
        self.accounts.keys()
    }

    /// Each account with the tenants that own it and its credential fingerprint, in order (for
    /// listings: never the credential itself).
    pub fn account_owners(
        &self,
    ) -> impl Iterator<Item = (&AccountId, &BTreeSet<TenantId>, &CredentialFingerprint)> {
        self.accounts
            .iter()
            .map(|(id, account)| (id, &account.tenants, &account.credential.fingerprint))
    }

    /// What the ledger is promised for `action`: its deduplication and lookup contract.
    pub fn capabilities(&self, action: &ActionName) -> Option<ProviderCapabilities> {
        self.compiled(action).map(|compiled| compiled.capabilities)
    }

    fn compiled(&self, name: &ActionName) -> Option<&Compiled> {
        self.actions
            .iter()
            .find(|compiled| compiled.action.name == *name)
    }

    fn action_names(&self) -> Vec<String> {
        self.actions
            .iter()
            .map(|compiled| compiled.action.name.as_str().to_owned())
            .collect()
    }

    /// The longest one send can take, in milliseconds: waiting up to the request timeout for a
    /// free request slot, then up to the request timeout for the request itself.
    pub fn longest_send_ms(&self) -> u64 {
        u64::try_from(self.request_timeout.as_millis())
            .unwrap_or(u64::MAX / 2)
            .saturating_mul(2)
    }

    /// What `tenant` acting in `account` through `action` is bound to: the action's contract and
    /// the account's credential fingerprint; or why there is no such binding.
    pub fn bind(
        &self,
        tenant: &TenantId,
        account: &AccountId,
        action: &ActionName,
    ) -> Result<Binding, Unbound> {
        let compiled = self.compiled(action).ok_or_else(|| Unbound::Action {
            provider: self.id.clone(),
            action: action.clone(),
            known: self.action_names(),
        })?;
        let account_entry = self.owned_account(tenant, account)?;
        Ok(Binding {
            capabilities: compiled.capabilities,
            credential_fingerprint: account_entry.credential.fingerprint.clone(),
            earlier_fingerprints: account_entry
                .credential
                .earlier_fingerprint
                .iter()
                .cloned()
                .collect(),
        })
    }

    fn owned_account(&self, tenant: &TenantId, account: &AccountId) -> Result<&Account, Unbound> {
        let entry = self.accounts.get(account).ok_or_else(|| Unbound::Account {
            provider: self.id.clone(),
            account: account.clone(),
        })?;
        if !entry.tenants.contains(tenant) {
            return Err(Unbound::NotOwned {
                provider: self.id.clone(),
                account: account.clone(),
                tenant: tenant.clone(),
            });
        }
        Ok(entry)
    }

    /// Checks a call's arguments against the action's input schema: each problem with the JSON
    /// pointer of the failing field (at most [`MAX_ARG_PROBLEMS`]). An unknown action is one
    /// problem at the root that names the known actions.
    pub fn check_args(&self, action: &ActionName, args: &Value) -> Result<(), Vec<ArgProblem>> {
        let Some(compiled) = self.compiled(action) else {
            return Err(vec![ArgProblem {
                pointer: String::new(),
                message: format!(
                    "provider `{}` has no action `{action}`; its actions are: {}",
                    self.id,
                    self.action_names().join(", ")
                ),
            }]);
        };
        let mut problems: Vec<ArgProblem> = compiled
            .validator
            .iter_errors(args)
            .take(MAX_ARG_PROBLEMS)
            .map(|error| ArgProblem {
                pointer: error.instance_path().as_str().to_owned(),
                message: shorten(&error.to_string(), MAX_MESSAGE_CHARS),
            })
            .collect();
        // A path value stays one segment: `..` would send the request elsewhere (a server
        // resolves `/deals/../notes` to `/notes`), so it is refused here, before anything is
        // recorded, as the schema's own problems are.
        for (path, value) in compiled.action.request.path.dot_segment_args(args) {
            problems.push(ArgProblem {
                pointer: format!("/{}", path.join("/")),
                message: format!(
                    "{:?} is a dot segment; a value placed in the request's path may not be `.` or `..` (nor a percent-encoded form of them), since a server would move up or across the path instead of naming an object",
                    shorten(&value, 20)
                ),
            });
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// The credential for a call by `tenant` in `account` at `provider`, or why nothing may be
    /// sent.
    fn credential_for(
        &self,
        provider: &ProviderId,
        tenant: &TenantId,
        account: &AccountId,
    ) -> Result<&Credential, String> {
        if *provider != self.id {
            return Err(format!(
                "the call is for provider `{provider}`, not `{}`",
                self.id
            ));
        }
        self.owned_account(tenant, account)
            .map(|entry| &entry.credential)
            .map_err(|unbound| unbound.to_string())
    }

    /// Carries out one attempt and classifies it (see the table in the crate docs).
    pub async fn execute(&self, request: &SendRequest) -> SendOutcome {
        in_send_span(&self.id, request, self.execute_unlogged(request)).await
    }

    async fn execute_unlogged(&self, request: &SendRequest) -> SendOutcome {
        let credential =
            match self.credential_for(&request.provider, &request.tenant, &request.account) {
                Ok(credential) => credential,
                Err(reason) => {
                    return SendOutcome::NotSent {
                        reason: format!("{reason}; nothing was sent"),
                        retry_after_ms: None,
                    }
                }
            };
        let Some(compiled) = self.compiled(&request.action) else {
            return SendOutcome::Rejected {
                code: "local unsupported_action".to_owned(),
                message: format!(
                    "provider `{}` has no action `{}` (its actions: {}); nothing was sent",
                    self.id,
                    request.action,
                    self.action_names().join(", ")
                ),
            };
        };
        let prepared = match self.prepare_send(&compiled.action, request) {
            Ok(prepared) => prepared,
            Err(outcome) => return outcome,
        };
        // The send's budget slot was taken before its claim was recorded ([`Connector::prepare`]).
        let Some(_permit) = self.permit().await else {
            return SendOutcome::NotSent {
                reason: self.busy(),
                retry_after_ms: None,
            };
        };
        let answer = match self.exchange(credential, &prepared).await {
            Ok(answer) => answer,
            Err(no_token) => {
                let (reason, retry_after_ms) = token_failure(&request.account, no_token);
                return scrub_send(
                    SendOutcome::NotSent {
                        reason: format!("{reason}; nothing was sent"),
                        retry_after_ms: Some(retry_after_ms),
                    },
                    credential,
                );
            }
        };
        let outcome = match answer {
            Ok(reply) => {
                tracing::debug!(request = %prepared.describe(), status = reply.status, "provider answered");
                classify_send(
                    &compiled.reading,
                    &compiled.action.response,
                    &reply,
                    Utc::now(),
                )
            }
            Err(failure) => failure.send_outcome(),
        };
        scrub_send(outcome, credential)
    }

    /// Sends `prepared` with the account's credential and reads the answer. An OAuth2 account's
    /// request carries its current access token (renewed first if it is about to expire); a 401
    /// to it is sent once more with a renewed token: the classification table in the crate docs
    /// reads a 401 as a definitive refusal with nothing applied, so the repeat cannot apply the
    /// request twice. `Err` when no access token could be had: nothing was sent.
    async fn exchange(
        &self,
        credential: &Credential,
        prepared: &PreparedRequest,
    ) -> Result<Result<http::HttpReply, http::TransportFailure>, NoToken> {
        let Some(oauth) = &credential.oauth else {
            let auth = (&credential.header, &credential.value);
            return Ok(http::send(&self.client, &self.base_url, auth, prepared).await);
        };
        let mut stale = None;
        loop {
            let token = oauth.authorize(&self.client, &self.base_url, stale).await?;
            let auth = (&credential.header, &token.value);
            let answer = http::send(&self.client, &self.base_url, auth, prepared).await;
            let unauthorised = matches!(&answer, Ok(reply) if reply.status == 401);
            if !unauthorised || stale.is_some() {
                return Ok(answer);
            }
            tracing::info!(
                generation = token.generation,
                "401 with the access token; renewing it and sending once more"
            );
            stale = Some(token.generation);
        }
    }

    /// What a request of `kind` for `account` needs before its claim is recorded (the port's
    /// [`opledger_domain::provider::Providers::prepare`]): an OAuth2 account's access token
    /// (obtained now, so a refusal starts no attempt), then a slot in its `kind` budget, waited
    /// for when `may_wait` (a caller that may not wait is told to, also when the token would
    /// have to be asked for first). An account the tenant does not own is left to the send,
    /// which refuses it.
    pub async fn prepare(
        &self,
        tenant: &TenantId,
        account: &AccountId,
        kind: RequestKind,
        may_wait: bool,
    ) -> Readiness {
        let Ok(entry) = self.owned_account(tenant, account) else {
            return Readiness::Ready { budget_wait: None };
        };
        let credential = &entry.credential;
        let nothing_done = match kind {
            RequestKind::Send => "nothing was sent",
            RequestKind::Lookup => "nothing was asked",
        };
        if let Some(oauth) = &credential.oauth {
            // A caller that may not wait (an intent about to be recorded) is not held up by a
            // request to the token endpoint either: it records first and prepares after.
            if !may_wait && !oauth.has_token_now() {
                return Readiness::Wait {
                    reason: format!("account `{account}`'s access token is not at hand yet"),
                    retry_after_ms: 0,
                };
            }
            if let Err(no_token) = oauth.authorize(&self.client, &self.base_url, None).await {
                let (reason, retry_after_ms) = token_failure(account, no_token);
                return Readiness::Wait {
                    reason: credential.scrub(format!("{reason}; {nothing_done}")),
                    retry_after_ms,
                };
            }
        }
        let kind = match kind {
            RequestKind::Send => Kind::Send,
            RequestKind::Lookup => Kind::Lookup,
        };
        let longest = if may_wait {
            self.request_timeout
        } else {
            Duration::ZERO
        };
        match self.budget(entry, kind, longest).await {
            Ok(None) => Readiness::Ready { budget_wait: None },
            Ok(Some(waited_ms)) => Readiness::Ready {
                budget_wait: Some(BudgetWait {
                    account: account.clone(),
                    budget: kind.as_str().to_owned(),
                    waited_ms,
                }),
            },
            Err(wait_ms) => Readiness::Wait {
                reason: format!("account `{account}` has used its {} budget; its next slot is {wait_ms} ms away; {nothing_done}", kind.as_str()),
                retry_after_ms: wait_ms,
            },
        }
    }

    /// Waits for the account's next slot in its `kind` budget, if it has one, and says how long
    /// it waited in milliseconds (`None`: not at all); `Err(wait)` in milliseconds when the slot
    /// is further away than `longest` (nothing reserved; the operation waits that long in the
    /// ledger instead of holding a worker).
    async fn budget(
        &self,
        entry: &Account,
        kind: Kind,
        longest: Duration,
    ) -> Result<Option<u64>, u64> {
        let bucket = match kind {
            Kind::Send => entry.sends.as_ref(),
            Kind::Lookup => entry.lookups.as_ref(),
        };
        let Some(bucket) = bucket else {
            return Ok(None);
        };
        match bucket.reserve(tokio::time::Instant::now(), longest) {
            Ok(wait) if wait.is_zero() => Ok(None),
            Ok(wait) => {
                self.waits.record(kind, wait);
                let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
                tracing::info!(
                    budget = kind.as_str(),
                    wait_ms,
                    "waiting for the account's request budget"
                );
                tokio::time::sleep(wait).await;
                Ok(Some(wait_ms))
            }
            Err(wait) => {
                self.waits.record_refused(kind);
                Err(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1))
            }
        }
    }

    /// Checks `account`'s credentials with the connector's read-only `[probe]` request: what
    /// works (`Ok`) or what to fix (`Err`), in words. An OAuth2 account first gets its access
    /// token, so a token endpoint's refusal is reported with the provider's own message.
    /// Nothing is created.
    pub async fn probe(&self, account: &AccountId) -> Result<String, String> {
        let spec = self.probe.as_ref().ok_or_else(|| {
            format!("provider `{}` declares no [probe]; add one (a GET that only reads) to test credentials", self.id)
        })?;
        let entry = self
            .accounts
            .get(account)
            .ok_or_else(|| format!("`{account}` is not an account of provider `{}`", self.id))?;
        let credential = &entry.credential;
        let context = self.context(None, "", "", account.as_str(), "");
        let prepared = prepare(spec, &context)
            .map_err(|message| format!("the probe request cannot be built: {message}"))?;
        let asked = prepared.describe();
        let answer = self
            .exchange(credential, &prepared)
            .await
            .map_err(|no_token| credential.scrub(probe_token_failure(account, no_token)))?;
        match answer {
            Ok(reply) if (200..300).contains(&reply.status) => {
                let token = if credential.oauth.is_some() {
                    "an access token was issued and "
                } else {
                    ""
                };
                Ok(format!("{token}{asked} answered {}", reply.status))
            }
            Ok(reply) => {
                let hint = match reply.status {
                    401 => "the credentials are not accepted; check the token (or the OAuth2 client and refresh token)",
                    403 => "the credentials lack a permission (scope) the connector needs",
                    404 => "the base URL or a setting names something the API does not have",
                    _ => "see the provider's answer",
                };
                Err(credential.scrub(format!(
                    "{asked} answered {}: {}; {hint}",
                    reply.status,
                    reply.body_excerpt()
                )))
            }
            Err(failure) => {
                let (http::TransportFailure::NothingSent { error }
                | http::TransportFailure::MaybeSent { error }) = failure;
                Err(credential.scrub(format!(
                    "{asked} got no answer: {error}; check base_url and the network"
                )))
            }
        }
    }

    /// What the request budgets made requests wait (for metrics): per kind, see [`Waits::of`].
    pub fn budget_waits(&self) -> &Waits {
        &self.waits
    }

    /// How many times `account`'s access token was asked of the token endpoint (OAuth2 only).
    pub fn token_requests(&self, account: &AccountId) -> Option<u64> {
        let oauth = self.accounts.get(account)?.credential.oauth.as_ref()?;
        Some(oauth.refreshes())
    }

    /// A free request slot, waiting at most the request timeout for one.
    async fn permit(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        match tokio::time::timeout(self.request_timeout, self.permits.acquire()).await {
            Ok(Ok(permit)) => Some(permit),
            _ => None,
        }
    }

    fn busy(&self) -> String {
        format!(
            "{MAX_IN_FLIGHT_PER_PROVIDER} requests to provider `{}` were already running for the whole request timeout; nothing was sent",
            self.id
        )
    }

    fn context<'a>(
        &'a self,
        args: Option<&'a Map<String, Value>>,
        key: &'a str,
        label: &'a str,
        account: &'a str,
        operation_id: &'a str,
    ) -> Context<'a> {
        Context {
            args,
            key,
            label,
            account,
            operation_id,
            settings: &self.settings,
        }
    }

    /// The request a send of `intent` makes, as `METHOD URL` with the base URL, secrets
    /// scrubbed (the evidence recorded with each attempt); `None` for an action it does not have
    /// or a request that cannot be built (the send itself says why).
    pub fn describe_send(&self, intent: &opledger_domain::event::IntentRecorded) -> Option<String> {
        let compiled = self.compiled(&intent.action)?;
        let operation_id = intent.operation_id.to_string();
        let label = opledger_domain::provider::operation_label(intent.operation_id);
        let context = self.context(
            Some(intent.args.as_map()),
            intent.idempotency_key.as_str(),
            &label,
            intent.account.as_str(),
            &operation_id,
        );
        let prepared = prepare(&compiled.action.request, &context).ok()?;
        let line = format!("{} {}{}", prepared.method, self.base_url, prepared.path);
        let line = match self.accounts.get(&intent.account) {
            Some(entry) => entry.credential.scrub(line),
            None => opledger_domain::redact::scrub_owned(line),
        };
        Some(shorten(&line, MAX_MESSAGE_CHARS))
    }

    /// The send's request, or the outcome of a request that can never be built.
    fn prepare_send(
        &self,
        action: &Action,
        request: &SendRequest,
    ) -> Result<PreparedRequest, SendOutcome> {
        let operation_id = request.operation_id.to_string();
        let context = self.context(
            Some(request.args.as_map()),
            request.idempotency_key.as_str(),
            &request.label,
            request.account.as_str(),
            &operation_id,
        );
        let mut prepared =
            prepare(&action.request, &context).map_err(|message| SendOutcome::Rejected {
                code: "local invalid_request".to_owned(),
                message: format!(
                    "the request cannot be built from these arguments: {message}; nothing was sent"
                ),
            })?;
        if let Dedup::IdempotencyKey { header, .. } = &action.dedup {
            // Keys come from our own random source as `opk_<hex>`. A key that is not visible
            // ASCII can never be sent as it is (a header would carry raw bytes the provider may
            // read differently), so retrying would not help either.
            let key = request.idempotency_key.as_str();
            let value = header_value(key).ok_or_else(|| SendOutcome::Rejected {
                code: "local invalid_idempotency_key".to_owned(),
                message: "the idempotency key holds characters other than visible ASCII, which a header cannot carry faithfully; nothing was sent".to_owned(),
            })?;
            prepared.headers.push((header.clone(), value));
        }
        Ok(prepared)
    }

    /// Looks the operation up (see the table in the crate docs).
    pub async fn lookup(&self, request: &LookupRequest) -> LookupOutcome {
        in_lookup_span(&self.id, request, self.lookup_unlogged(request)).await
    }

    async fn lookup_unlogged(&self, request: &LookupRequest) -> LookupOutcome {
        let unavailable = |reason: String| LookupOutcome::Unavailable {
            reason,
            retry_after_ms: None,
        };
        let credential =
            match self.credential_for(&request.provider, &request.tenant, &request.account) {
                Ok(credential) => credential,
                Err(reason) => return unavailable(reason),
            };
        let Some(compiled) = self.compiled(&request.action) else {
            return unavailable(format!(
                "provider `{}` has no action `{}`",
                self.id, request.action
            ));
        };
        let spec = match &compiled.action.lookup {
            Lookup::None => {
                return unavailable(format!(
                    "action `{}` of provider `{}` declares no lookup; only a person can tell what became of the operation",
                    request.action, self.id
                ))
            }
            Lookup::Consistent(consistent) => &consistent.request,
            Lookup::Search(search) => &search.request,
        };
        let operation_id = request.operation_id.to_string();
        let context = self.context(
            None,
            request.idempotency_key.as_str(),
            &request.label,
            request.account.as_str(),
            &operation_id,
        );
        let prepared = match prepare(spec, &context) {
            Ok(prepared) => prepared,
            Err(message) => {
                return unavailable(format!("the lookup request cannot be built: {message}"))
            }
        };
        let asked = prepared.describe();
        // The lookup's budget slot was taken before its claim was recorded
        // ([`Connector::prepare`]).
        let Some(_permit) = self.permit().await else {
            return unavailable(self.busy());
        };
        let answer = match self.exchange(credential, &prepared).await {
            Ok(answer) => answer,
            Err(no_token) => {
                let (reason, retry_after_ms) = token_failure(&request.account, no_token);
                return scrub_lookup(
                    LookupOutcome::NotAsked {
                        reason: format!("{reason}; nothing was asked"),
                        retry_after_ms,
                    },
                    credential,
                );
            }
        };
        let outcome = match answer {
            Ok(reply) => {
                let what = Asked {
                    request: &asked,
                    label: &request.label,
                    account: &request.account,
                };
                classify_lookup(compiled, &what, &reply)
            }
            Err(failure) => failure.lookup_outcome(&asked),
        };
        scrub_lookup(outcome, credential)
    }
}

/// Reads a lookup's answer by the action's kind of lookup.
fn classify_lookup(
    compiled: &Compiled,
    asked: &Asked<'_>,
    reply: &http::HttpReply,
) -> LookupOutcome {
    let now = Utc::now();
    match &compiled.action.lookup {
        Lookup::Consistent(consistent) => {
            classify_consistent(consistent, &compiled.reading, asked, reply, now)
        }
        Lookup::Search(search) => classify_search(search, &compiled.reading, asked, reply, now),
        // Refused before any request is built (see `lookup_unlogged`); kept total here.
        Lookup::None => LookupOutcome::Unavailable {
            reason: format!("{} declares no lookup", compiled.action.name),
            retry_after_ms: None,
        },
    }
}

/// The base URL: the override, else the document's; a finding when neither is there or it is bad.
fn base_url(document: &Document, overrides: &Overrides, problems: &mut Problems) -> Option<String> {
    match (&overrides.base_url, &document.base_url) {
        (Some(url), _) => check_base_url(url)
            .map_err(|message| problems.add("base_url", message))
            .ok(),
        (None, Some(url)) => Some(url.clone()),
        (None, None) => {
            problems.add(
                "base_url",
                "the connector names no base URL (it depends on the installation); give one, e.g. base_url = \"http://127.0.0.1:8070\"",
            );
            None
        }
    }
}

/// The document's settings with the overrides over them; each override must name a declared one.
fn settings(
    document: &Document,
    overrides: &Overrides,
    problems: &mut Problems,
) -> BTreeMap<String, String> {
    let mut settings = document.settings.clone();
    for (name, value) in &overrides.settings {
        if !settings.contains_key(name) {
            let declared: Vec<&str> = document.settings.keys().map(String::as_str).collect();
            problems.add(
                format!("settings.{name}"),
                format!(
                    "the connector declares no setting `{name}` (declared: {})",
                    if declared.is_empty() {
                        "none".to_owned()
                    } else {
                        declared.join(", ")
                    }
                ),
            );
        } else if value.chars().count() > MAX_SETTING_VALUE_CHARS {
            problems.add(
                format!("settings.{name}"),
                format!("is longer than {MAX_SETTING_VALUE_CHARS} characters"),
            );
        } else {
            settings.insert(name.clone(), value.clone());
        }
    }
    settings
}

/// The document's accounts and the overrides' together, each with its credential read.
fn accounts(
    document: &Document,
    extra: &[AccountSpec],
    env: &dyn Fn(&str) -> Option<OsString>,
    (provider, token_file, fingerprint_key): (
        &ProviderId,
        Option<&std::sync::Arc<TokenFile>>,
        Option<&credentials::FingerprintKey>,
    ),
    problems: &mut Problems,
) -> BTreeMap<AccountId, Account> {
    let all = document
        .accounts
        .iter()
        .enumerate()
        .map(|(index, account)| (format!("accounts[{index}]"), account))
        .chain(
            extra
                .iter()
                .enumerate()
                .map(|(index, account)| (format!("overrides.accounts[{index}]"), account)),
        );
    let mut accounts = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for (field, spec) in all {
        if !seen.insert(&spec.id) {
            problems.add(
                format!("{field}.id"),
                format!(
                    "account `{}` is given twice; give each account once",
                    spec.id
                ),
            );
            continue;
        }
        if spec.tenants.is_empty() {
            problems.add(
                format!("{field}.tenants"),
                "is empty; every account is owned by at least one tenant",
            );
            continue;
        }
        let resolved = credentials::resolve(&document.auth, &spec.credentials, env).and_then(
            |mut credential| {
                if let Some(oauth) = &mut credential.oauth {
                    let place = token_file.map(|file| Place {
                        file: std::sync::Arc::clone(file),
                        key: format!("{provider}/{}", spec.id),
                    });
                    credential.fingerprint = oauth.place(&spec.id, place)?;
                }
                if let Some(key) = fingerprint_key {
                    credential.key_fingerprint(key);
                }
                Ok(credential)
            },
        );
        match resolved {
            Ok(credential) => {
                accounts.insert(
                    spec.id.clone(),
                    Account {
                        tenants: spec.tenants.iter().cloned().collect(),
                        credential,
                        sends: document.rate_limit.sends.map(Bucket::new),
                        lookups: document.rate_limit.lookups.map(Bucket::new),
                    },
                );
            }
            Err(message) => problems.add(
                format!("{field}.credentials"),
                format!("account `{}`: {message}", spec.id),
            ),
        }
    }
    if document.accounts.len() + extra.len() > MAX_ACCOUNTS_PER_CONNECTOR {
        problems.add(
            "accounts",
            format!(
                "{} accounts are given; at most {MAX_ACCOUNTS_PER_CONNECTOR}",
                document.accounts.len() + extra.len()
            ),
        );
    } else if document.accounts.is_empty() && extra.is_empty() {
        problems.add(
            "accounts",
            "no account is given; a connector needs at least one, with its tenants and credentials",
        );
    }
    accounts
}

/// Every action with its compiled schema and reading.
fn compile(
    document: &Document,
    settings: &BTreeMap<String, String>,
    problems: &mut Problems,
) -> Vec<Compiled> {
    let mut compiled = Vec::with_capacity(document.actions.len());
    for (index, action) in document.actions.iter().enumerate() {
        let action = match with_settings(action, settings) {
            Ok(action) => action,
            Err(message) => {
                problems.add(format!("actions[{index}].lookup"), message);
                continue;
            }
        };
        match jsonschema::draft202012::new(&action.input) {
            Ok(validator) => compiled.push(Compiled {
                validator,
                reading: Reading::new(document, &action.dedup),
                capabilities: action.capabilities(),
                action,
            }),
            Err(error) => problems.add(
                format!("actions[{index}].input"),
                format!("cannot be compiled: {error}"),
            ),
        }
    }
    compiled
}

/// `action` with the settings its search pointers name written in (the document kept them as
/// written, checked against its defaults; the installation may have named another property).
fn with_settings(action: &Action, settings: &BTreeMap<String, String>) -> Result<Action, String> {
    let mut action = action.clone();
    if let Lookup::Search(search) = &mut action.lookup {
        for pointer in [&mut search.results, &mut search.id] {
            *pointer = resolve_pointer(pointer, settings)?;
            check_no_any_step(pointer)?;
        }
        // A setting's value is one step: one holding a `*` would change what the pointer says.
        for pointer in std::iter::once(&mut search.label_at).chain(search.account_at.as_mut()) {
            *pointer = resolve_pointer(pointer, settings)?;
            check_any_steps(pointer)?;
        }
    }
    Ok(action)
}

/// A header value of visible ASCII and spaces; `None` for anything a header cannot carry as it is.
fn header_value(text: &str) -> Option<HeaderValue> {
    text.bytes()
        .all(|byte| byte.is_ascii_graphic() || byte == b' ')
        .then(|| HeaderValue::from_str(text).ok())
        .flatten()
}

/// Builds a request from its spec: path, query, headers and body, all from templates.
fn prepare(spec: &RequestSpec, context: &Context<'_>) -> Result<PreparedRequest, String> {
    let mut path = spec.path.render_path(context)?;
    let query: Vec<String> = spec
        .query
        .iter()
        .filter_map(|(name, template)| {
            let value = template.render_text(context)?;
            Some(format!(
                "{}={}",
                encode_component(name),
                encode_component(&value)
            ))
        })
        .collect();
    if !query.is_empty() {
        path.push('?');
        path.push_str(&query.join("&"));
    }
    let mut headers = Vec::with_capacity(spec.headers.len() + 1);
    for (name, template) in &spec.headers {
        if let Some(text) = template.render_text(context) {
            let value = header_value(&text).ok_or_else(|| {
                format!("header `{name}` would hold characters a header cannot carry")
            })?;
            headers.push((name.clone(), value));
        }
    }
    let body = match spec.encoding {
        BodyEncoding::None => None,
        encoding => body_value(spec, context)
            .map(|value| body::encode(encoding, &value))
            .transpose()?
            .flatten()
            .zip(encoding.content_type()),
    };
    // A lookup by key carries the key in its path: the span shows `{key}` in its place.
    let encoded_key = encode_component(context.key);
    let shown_path = (!context.key.is_empty() && path.contains(&encoded_key))
        .then(|| path.replace(&encoded_key, "{key}"));
    Ok(PreparedRequest {
        method: spec.method.clone(),
        path,
        headers,
        body,
        shown_path,
    })
}

/// The body: the arguments (when the body starts from them) with the rendered tree merged over.
fn body_value(spec: &RequestSpec, context: &Context<'_>) -> Option<Value> {
    let base = spec
        .body_base_args
        .then(|| context.args.map(|args| Value::Object(args.clone())))
        .flatten();
    let over = spec.body.as_ref().and_then(|tree| tree.render(context));
    match (base, over) {
        (Some(base), Some(over)) => Some(body::merge(base, over)),
        (base, over) => base.or(over),
    }
}

/// Why an operation of `account` waits for its access token, what to do, and how long to wait
/// (the account's wait, in milliseconds).
fn token_failure(account: &AccountId, no_token: NoToken) -> (String, u64) {
    let reason = match (no_token.failure, no_token.grant) {
        // The client alone asks: once the provider grants it again (the client re-enabled, its
        // access restored) the next ask succeeds and the operations go on, without a restart.
        (TokenFailure::Refused { message }, Grant::ClientCredentials) => format!("account `{account}` has no access token: {message}; the token endpoint refused the client's credentials: restore the client's access at the provider (its operations go on by themselves once a token is granted), or correct the client id and secret in the configuration and restart opledger; until then its operations wait, and the token endpoint is asked again in {} ms", no_token.retry_after_ms),
        (TokenFailure::Refused { message }, Grant::RefreshToken) => format!("account `{account}` has no access token: {message}; fix the account's OAuth2 credentials (re-authorise the account and configure its new refresh token, or correct the client id and secret) and restart opledger; until then its operations wait, and the token endpoint is asked again in {} ms", no_token.retry_after_ms),
        (TokenFailure::Unavailable { message }, _) => format!("account `{account}` has no access token yet: {message}; it is asked again in {} ms", no_token.retry_after_ms),
    };
    (reason, no_token.retry_after_ms)
}

/// Why a probe of `account` got no access token and what to do: the probe asks once, so unlike
/// [`token_failure`] it names no retry.
fn probe_token_failure(account: &AccountId, no_token: NoToken) -> String {
    match no_token.failure {
        TokenFailure::Refused { message } if no_token.grant == Grant::ClientCredentials => format!("account `{account}` has no access token: {message}; the token endpoint refused the client's credentials: correct the client id and secret, or restore the client's access at the provider"),
        TokenFailure::Refused { message } => format!("account `{account}` has no access token: {message}; fix the account's OAuth2 credentials (re-authorise the account and configure its new refresh token, or correct the client id and secret)"),
        TokenFailure::Unavailable { message } => format!("account `{account}` has no access token: {message}; check the token URL and the network, then test again"),
    }
}

/// Runs `send` (a connector's send of `request` to `provider`, of either kind) in the
/// `provider.execute` span, then logs its outcome.
pub(crate) async fn in_send_span(
    provider: &ProviderId,
    request: &SendRequest,
    send: impl std::future::Future<Output = SendOutcome>,
) -> SendOutcome {
    // Debug: the engine's `send` span, around this one, carries the same fields, and a span
    // exported per request costs CPU (docs/src/performance.md).
    let span = tracing::debug_span!(
        "provider.execute",
        operation_id = %request.operation_id,
        attempt_id = %request.attempt_id,
        provider = %provider,
        account = %request.account,
        action = %request.action,
        external_id = field::Empty,
    );
    let this_span = span.clone();
    async {
        let outcome = send.await;
        log_send(&this_span, request, &outcome);
        outcome
    }
    .in_span(span)
    .await
}

/// Runs `lookup` (a connector's lookup for `request` at `provider`) in the `provider.lookup`
/// span, then logs its outcome.
pub(crate) async fn in_lookup_span(
    provider: &ProviderId,
    request: &LookupRequest,
    lookup: impl std::future::Future<Output = LookupOutcome>,
) -> LookupOutcome {
    // Debug, as the send's span (see `in_send_span`).
    let span = tracing::debug_span!(
        "provider.lookup",
        operation_id = %request.operation_id,
        provider = %provider,
        account = %request.account,
        action = %request.action,
        external_id = field::Empty,
    );
    let this_span = span.clone();
    async {
        let outcome = lookup.await;
        log_lookup(&this_span, &outcome);
        outcome
    }
    .in_span(span)
    .await
}

/// Logs `outcome` and records its external id on `span`, the provider's own span: not on the
/// current span, which is the engine's `send` when `span` is disabled (debug-level), and which
/// the engine records the id on itself: recorded twice, it was exported twice.
/// The warning carries the operation and attempt itself: at the default level the spans around
/// it are not written, and a warning nobody can tie to an operation helps nobody.
fn log_send(span: &Span, request: &SendRequest, outcome: &SendOutcome) {
    match outcome {
        SendOutcome::Confirmed {
            external_id,
            provider_request_id,
        } => {
            span.record("external_id", field::display(external_id));
            tracing::info!(
                outcome = "confirmed",
                provider_request_id = provider_request_id.as_ref().map(|id| id.as_str()),
                "provider confirmed the object"
            );
        }
        SendOutcome::Rejected { code, message } => {
            tracing::info!(outcome = "rejected", code = %code, message = %message, "provider refused");
        }
        SendOutcome::Uncertain {
            error,
            retry_after_ms,
        } => {
            tracing::warn!(operation_id = %request.operation_id, attempt_id = %request.attempt_id, outcome = "uncertain", error = %error, retry_after_ms = retry_after_ms, "the send may or may not have been applied");
        }
        SendOutcome::NotSent {
            reason,
            retry_after_ms,
        } => {
            tracing::info!(outcome = "not_sent", reason = %reason, retry_after_ms = retry_after_ms, "nothing was applied");
        }
    }
}

/// Logs `outcome` and records its external id on `span` (see [`log_send`]).
fn log_lookup(span: &Span, outcome: &LookupOutcome) {
    match outcome {
        LookupOutcome::Found {
            external_id,
            evidence,
            duplicates,
            ..
        } => {
            span.record("external_id", field::display(external_id));
            tracing::info!(outcome = "found", evidence = %evidence, duplicates = duplicates.len(), "lookup found the object");
        }
        LookupOutcome::NotFound {
            authoritative,
            evidence,
        } => {
            tracing::info!(outcome = "not_found", authoritative, evidence = %evidence, "lookup found nothing");
        }
        LookupOutcome::InProgress {
            evidence,
            retry_after_ms,
        } => {
            tracing::info!(outcome = "in_progress", evidence = %evidence, retry_after_ms = retry_after_ms, "the provider still processes the first request");
        }
        LookupOutcome::Refused { reason } => {
            tracing::warn!(outcome = "refused", reason = %reason, "lookup refused for its credentials");
        }
        LookupOutcome::NotAsked {
            reason,
            retry_after_ms,
        } => {
            tracing::warn!(outcome = "not_asked", reason = %reason, retry_after_ms = retry_after_ms, "lookup not made: no access token");
        }
        LookupOutcome::Unavailable {
            reason,
            retry_after_ms,
        } => {
            tracing::warn!(outcome = "unavailable", reason = %reason, retry_after_ms = retry_after_ms, "lookup gave no answer");
        }
    }
}

/// Scrubs every text of a send outcome of the credential's secrets: the last guard before an
/// outcome leaves the adapter.
fn scrub_send(outcome: SendOutcome, credential: &Credential) -> SendOutcome {
    match outcome {
        SendOutcome::Rejected { code, message } => SendOutcome::Rejected {
            code: credential.scrub(code),
            message: credential.scrub(message),
        },
        SendOutcome::Uncertain {
            error,
            retry_after_ms,
        } => SendOutcome::Uncertain {
            error: credential.scrub(error),
            retry_after_ms,
        },
        SendOutcome::NotSent {
            reason,
            retry_after_ms,
        } => SendOutcome::NotSent {
            reason: credential.scrub(reason),
            retry_after_ms,
        },
        confirmed @ SendOutcome::Confirmed { .. } => confirmed,
    }
}

fn scrub_lookup(outcome: LookupOutcome, credential: &Credential) -> LookupOutcome {
    match outcome {
        LookupOutcome::Found {
            external_id,
            account,
            evidence,
            duplicates,
        } => LookupOutcome::Found {
            external_id,
            account,
            evidence: credential.scrub(evidence),
            duplicates,
        },
        LookupOutcome::NotFound {
            authoritative,
            evidence,
        } => LookupOutcome::NotFound {
            authoritative,
            evidence: credential.scrub(evidence),
        },
        LookupOutcome::InProgress {
            evidence,
            retry_after_ms,
        } => LookupOutcome::InProgress {
            evidence: credential.scrub(evidence),
            retry_after_ms,
        },
        LookupOutcome::Refused { reason } => LookupOutcome::Refused {
            reason: credential.scrub(reason),
        },
        LookupOutcome::NotAsked {
            reason,
            retry_after_ms,
        } => LookupOutcome::NotAsked {
            reason: credential.scrub(reason),
            retry_after_ms,
        },
        LookupOutcome::Unavailable {
            reason,
            retry_after_ms,
        } => LookupOutcome::Unavailable {
            reason: credential.scrub(reason),
            retry_after_ms,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::{Credentials, Secret};
    use crate::test_support::{
        keyed_document, labelled_document, lookup_request, plain_document, send_request,
    };
    use opledger_domain::args::ArgsSnapshot;
    use opledger_domain::contract::{Deduplication, LookupSupport};
    use serde_json::json;

    fn acme() -> TenantId {
        TenantId::new("acme").expect("valid")
    }

    fn overrides() -> Overrides {
        Overrides {
            id: Some(ProviderId::new("crm").expect("valid")),
            // Port 9 (discard) on loopback: nothing listens there in tests that reach the network.
            base_url: Some("http://127.0.0.1:9/".to_owned()),
            accounts: vec![AccountSpec {
                id: AccountId::new("acct-1").expect("valid"),
                tenants: vec![acme()],
                credentials: Credentials::token_env("OPLEDGER_TEST_TOKEN"),
            }],
            ..Overrides::default()
        }
    }

    fn env(name: &str) -> Option<OsString> {
        (name == "OPLEDGER_TEST_TOKEN").then(|| OsString::from("s3cret-value"))
    }

    fn connector(document: &Document) -> Connector {
        Connector::with_env(document, overrides(), &env).expect("a valid connector")
    }

    fn prepared(document: &Document, request: &SendRequest) -> PreparedRequest {
        let connector = connector(document);
        let action = connector
            .action(&request.action)
            .expect("create_task")
            .clone();
        connector.prepare_send(&action, request).expect("a request")
    }

    fn body_of(prepared: &PreparedRequest) -> Value {
        let (bytes, content_type) = prepared.body.as_ref().expect("a body");
        assert_eq!(*content_type, "application/json");
        serde_json::from_slice(bytes).expect("json")
    }

    #[tokio::test(start_paused = true)]
    async fn a_budget_slot_is_taken_before_the_claim_and_its_wait_is_named() {
        let mut document = keyed_document();
        document.rate_limit.sends = Some(crate::budget::Budget {
            requests_per_s: 2,
            burst: 1,
        });
        let connector = connector(&document);
        let (tenant, account) = (acme(), AccountId::new("acct-1").expect("valid"));
        let prepare = |may_wait| connector.prepare(&tenant, &account, RequestKind::Send, may_wait);
        assert_eq!(prepare(false).await, Readiness::Ready { budget_wait: None });
        // The next slot is half a second away: a caller that may not wait is told so, nothing
        // reserved; one that may wait gets it and is told how long it waited, for its claim.
        assert!(matches!(
            prepare(false).await,
            Readiness::Wait { retry_after_ms: 500, reason } if reason.contains("account `acct-1` has used its sends budget")
        ));
        let started = tokio::time::Instant::now();
        assert_eq!(
            prepare(true).await,
            Readiness::Ready {
                budget_wait: Some(BudgetWait {
                    account: account.clone(),
                    budget: "sends".to_owned(),
                    waited_ms: 500,
                })
            }
        );
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        assert_eq!(connector.budget_waits().of(Kind::Send), (1, 500, 1));
    }

    #[test]
    fn the_keyed_connector_posts_the_arguments_with_the_operations_key() {
        let request = send_request("crm", "acct-1");
        let prepared = prepared(&keyed_document(), &request);
        assert_eq!(prepared.describe(), "POST /keyed/acct-1/tasks");
        assert_eq!(prepared.headers.len(), 1);
        assert_eq!(prepared.headers[0].0.as_str(), "idempotency-key");
        assert_eq!(prepared.headers[0].1, request.idempotency_key.as_str());
        assert_eq!(
            body_of(&prepared),
            Value::Object(request.args.as_map().clone())
        );
    }

    #[test]
    fn the_labelled_connector_puts_the_arguments_under_the_label() {
        let request = send_request("crm", "acct-1");
        let prepared = prepared(&labelled_document(), &request);
        assert_eq!(
            prepared.describe(),
            format!("PUT /labelled/acct-1/tasks/by-label/{}", request.label)
        );
        assert!(prepared.headers.is_empty());
        assert_eq!(
            body_of(&prepared),
            Value::Object(request.args.as_map().clone())
        );
    }

    #[test]
    fn the_plain_connector_adds_the_label_and_overrides_a_forged_one() {
        let mut request = send_request("crm", "acct-1");
        request.args = ArgsSnapshot::new(
            json!({"title": "Call the client", "opledger_label": "opl-someone-else"}),
        )
        .expect("valid args");
        let prepared = prepared(&plain_document(), &request);
        assert_eq!(prepared.describe(), "POST /plain/acct-1/tasks");
        assert_eq!(
            body_of(&prepared),
            json!({"title": "Call the client", "opledger_label": request.label})
        );
    }

    #[test]
    fn lookup_requests_encode_the_key_and_label_as_one_segment_or_query_value() {
        let connector = connector(&plain_document());
        let mut lookup = lookup_request("crm", "acct-1");
        lookup.label = "opl-a&b=c".to_owned();
        let Lookup::Search(search) = &connector.actions[0].action.lookup else {
            panic!("a search");
        };
        let operation_id = lookup.operation_id.to_string();
        let context = connector.context(
            None,
            lookup.idempotency_key.as_str(),
            &lookup.label,
            "acct 1",
            &operation_id,
        );
        let prepared = prepare(&search.request, &context).expect("a request");
        assert_eq!(
            prepared.describe(),
            "GET /plain/acct%201/tasks/search?label=opl-a%26b%3Dc"
        );
        assert!(prepared.body.is_none());
    }

    #[test]
    fn a_lookup_by_key_shows_its_span_the_path_with_the_key_written_as_a_placeholder() {
        let connector = connector(&keyed_document());
        let lookup = lookup_request("crm", "acct-1");
        let Lookup::Consistent(by_key) = &connector.actions[0].action.lookup else {
            panic!("a lookup by key");
        };
        let operation_id = lookup.operation_id.to_string();
        let key = lookup.idempotency_key.as_str();
        let context = connector.context(None, key, &lookup.label, "acct-1", &operation_id);
        let by_key_request = prepare(&by_key.request, &context).expect("a request");
        assert!(by_key_request.path.contains(key), "{}", by_key_request.path);
        let shown = by_key_request
            .shown_path
            .expect("the key is hidden from the span");
        assert!(!shown.contains(key) && shown.contains("{key}"), "{shown}");
        // A send carries its key in a header, not its path: nothing to hide there.
        let send = prepared(&keyed_document(), &send_request("crm", "acct-1"));
        assert_eq!(send.shown_path, None);
    }

    #[test]
    fn a_key_that_cannot_be_a_header_is_refused_before_sending() {
        let connector = connector(&keyed_document());
        let mut request = send_request("crm", "acct-1");
        request.idempotency_key =
            opledger_domain::ids::IdempotencyKey::new("clé à molette").expect("a valid domain key");
        let action = connector
            .action(&request.action)
            .expect("create_task")
            .clone();
        assert!(matches!(
            connector.prepare_send(&action, &request),
            Err(SendOutcome::Rejected { code, .. }) if code == "local invalid_idempotency_key"
        ));
    }

    #[test]
    fn a_connector_reads_its_token_once_and_shows_only_the_fingerprint() {
        let connector = connector(&keyed_document());
        let binding = connector
            .bind(
                &acme(),
                &AccountId::new("acct-1").expect("valid"),
                &ActionName::new("create_task").expect("valid"),
            )
            .expect("bound");
        assert_eq!(
            binding.credential_fingerprint,
            Secret::new("s3cret-value").fingerprint()
        );
        let debug = format!("{connector:?}");
        assert!(!debug.contains("s3cret-value"), "{debug}");
        // Default request timeout: 10 s — a slot wait plus the request itself.
        assert_eq!(connector.longest_send_ms(), 20_000);
    }

    #[test]
    fn building_reports_every_problem_and_names_the_missing_variable() {
        let mut bad = overrides();
        bad.base_url = Some("ftp://crm".to_owned());
        bad.request_timeout_ms = Some(0);
        bad.settings.insert("nope".to_owned(), "x".to_owned());
        bad.accounts.push(bad.accounts[0].clone());
        let errors = Connector::with_env(&keyed_document(), bad, &|_| None).expect_err("invalid");
        let fields: Vec<&str> = errors.iter().map(|error| error.field.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "base_url",
                "request_timeout_ms",
                "settings.nope",
                "overrides.accounts[0].credentials",
                "overrides.accounts[1].id"
            ],
            "{errors:?}"
        );
        assert!(
            errors[3].message.contains("OPLEDGER_TEST_TOKEN"),
            "{}",
            errors[3]
        );
        let mut none = overrides();
        none.accounts.clear();
        let errors = Connector::with_env(&keyed_document(), none, &env).expect_err("no accounts");
        assert_eq!(errors[0].field, "accounts");
    }

    #[tokio::test]
    async fn an_unconfigured_or_unowned_account_is_not_sent_and_not_looked_up() {
        let connector = connector(&labelled_document());
        assert!(matches!(
            connector.execute(&send_request("crm", "acct-9")).await,
            SendOutcome::NotSent { reason, .. } if reason.contains("acct-9")
        ));
        assert!(matches!(
            connector.lookup(&lookup_request("crm", "acct-9")).await,
            LookupOutcome::Unavailable { .. }
        ));
        let mut request = send_request("crm", "acct-1");
        request.tenant = TenantId::new("globex").expect("valid");
        assert!(matches!(
            connector.execute(&request).await,
            // Said as for an account that does not exist: nothing about who owns it.
            SendOutcome::NotSent { reason, .. } if reason.contains("`acct-1` is not an account of provider `crm` that this tenant may use")
        ));
    }

    #[tokio::test]
    async fn an_unsupported_action_is_refused_before_sending() {
        let connector = connector(&plain_document());
        let mut request = send_request("crm", "acct-1");
        request.action = ActionName::new("delete_everything").expect("valid");
        assert!(matches!(
            connector.execute(&request).await,
            SendOutcome::Rejected { code, message } if code == "local unsupported_action" && message.contains("create_task")
        ));
        assert!(matches!(
            connector.bind(&acme(), &AccountId::new("acct-1").expect("valid"), &request.action),
            Err(Unbound::Action { known, .. }) if known == vec!["create_task".to_owned()]
        ));
    }

    #[test]
    fn each_dedup_and_lookup_maps_to_the_domains_contract() {
        let contract = |document: Document| document.actions[0].capabilities();
        assert_eq!(
            contract(keyed_document()),
            ProviderCapabilities {
                deduplication: Deduplication::IdempotencyKey {
                    retention_s: 86_400,
                    safety_margin_s: 3_600
                },
                lookup: LookupSupport::Consistent,
            }
        );
        assert_eq!(
            contract(labelled_document()),
            ProviderCapabilities {
                deduplication: Deduplication::UniqueLabel,
                lookup: LookupSupport::Consistent
            }
        );
        assert_eq!(
            contract(plain_document()),
            ProviderCapabilities {
                deduplication: Deduplication::None,
                lookup: LookupSupport::EventuallyConsistent { lag_ms: 2_000 }
            }
        );
        let mut document = plain_document();
        document.actions[0].dedup = Dedup::NaturallyIdempotent;
        document.actions[0].lookup = Lookup::None;
        assert_eq!(
            contract(document),
            ProviderCapabilities {
                deduplication: Deduplication::NaturallyIdempotent,
                lookup: LookupSupport::None
            }
        );
    }
}
