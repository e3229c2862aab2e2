//! The stand's whole state behind one mutex: the in-memory CRM (tasks, keys, labels, the id
//! counter), the accounts and their tokens, the settings, the fault queue, the request log and
//! the stand clock.
//!
//! Every provider request decides everything it does in one critical section, so "atomic" in the
//! contract is literal. Nothing in here awaits, and nothing in here may panic on input: a
//! poisoned lock would take the whole stand down with it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use axum::http::StatusCode;
use serde_json::{json, Map, Value};
use tokio::sync::watch;

use super::clock::StandClock;
use super::faults::FaultQueue;
use super::wire::{LoggedRequest, Shape, StandObject, StandSettings};
use super::{StandConfig, StandError};

/// The first task id; ids are shared by all accounts and shapes.
pub const FIRST_TASK_ID: u64 = 731;
/// The most tasks the stand holds; creating one more answers 507 `stand_full`.
pub const MAX_TASKS: usize = 100_000;
/// The most provider requests the request log keeps; older ones are evicted first.
pub const MAX_LOGGED_REQUESTS: usize = 100_000;
/// The largest request body accepted; larger ones answer 413 `body_too_large`.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// The most accounts, configured and added, the stand knows.
pub const MAX_ACCOUNTS: usize = 1_000;
/// The longest account name.
pub const MAX_ACCOUNT_NAME_BYTES: usize = 64;
/// The longest bearer token.
pub const MAX_TOKEN_BYTES: usize = 512;
/// The longest `Idempotency-Key` (Stripe's limit).
pub const MAX_KEY_BYTES: usize = 255;
/// The longest label, in the path (labelled) or in `opledger_label` (plain).
pub const MAX_LABEL_BYTES: usize = 255;

/// A task id. Rendered as a decimal string on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct TaskId(pub(super) u64);

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A task in the CRM.
#[derive(Clone, Debug)]
pub(super) struct Task {
    pub(super) id: TaskId,
    pub(super) shape: Shape,
    pub(super) account: String,
    pub(super) key: Option<String>,
    pub(super) label: Option<String>,
    pub(super) fields: Map<String, Value>,
    pub(super) created_at_ms: u64,
}

impl Task {
    pub(super) fn to_object(&self) -> StandObject {
        StandObject {
            id: self.id.to_string(),
            shape: self.shape,
            account: self.account.clone(),
            key: self.key.clone(),
            label: self.label.clone(),
            fields: self.fields.clone(),
            created_at_ms: self.created_at_ms,
        }
    }
}

/// A name scoped to one account: keys and labels are per account.
pub(super) type Scoped = (String, String);

/// What the stand remembers about an `Idempotency-Key`.
#[derive(Clone, Debug)]
pub(super) struct KeyRecord {
    /// Tells this record from a later one under the same key, so that a late completion cannot
    /// complete a record that replaced the one it belongs to.
    pub(super) seq: u64,
    pub(super) fields: Map<String, Value>,
    /// The task exists from the moment the request is applied, even while the key is in flight.
    pub(super) task: TaskId,
    pub(super) first_seen_ms: u64,
    pub(super) completed: bool,
}

/// A keyed request applied but not yet completed: the key is in flight until this is handed
/// back to [`Crm::complete_key`].
#[derive(Clone, Debug)]
pub(super) struct KeyTicket {
    pub(super) account: String,
    pub(super) key: String,
    pub(super) seq: u64,
}

/// What a request did, as the request log says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    Applied,
    Replayed,
    Refused,
    Fault(&'static str),
}

impl Outcome {
    pub(super) fn render(self) -> String {
        match self {
            Outcome::Applied => "applied".to_owned(),
            Outcome::Replayed => "replayed".to_owned(),
            Outcome::Refused => "refused".to_owned(),
            Outcome::Fault(kind) => format!("fault:{kind}"),
        }
    }
}

/// An answer the stand means to give, before it becomes an HTTP response.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Reply {
    pub(super) status: StatusCode,
    pub(super) body: Value,
    /// Adds `Idempotent-Replayed: true`.
    pub(super) replayed: bool,
    /// The `Retry-After` value, already rendered.
    pub(super) retry_after: Option<String>,
}

impl Reply {
    pub(super) fn json(status: StatusCode, body: Value) -> Self {
        Self {
            status,
            body,
            replayed: false,
            retry_after: None,
        }
    }

    /// A 200 with `body` serialized; a 500 if it cannot be (it always can: the admin types
    /// are plain structs with string keys).
    pub(super) fn serialized(body: &impl serde::Serialize) -> Self {
        match serde_json::to_value(body) {
            Ok(body) => Self::json(StatusCode::OK, body),
            Err(e) => Self::error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
        }
    }

    /// The contract's error format: `{"error":{"type":..., "message":...}}`.
    pub(super) fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Self {
        Self::json(
            status,
            json!({"error": {"type": kind, "message": message.into()}}),
        )
    }
}

/// What one shape's rules answered, before any fault is laid over it.
#[derive(Debug)]
pub(super) struct Applied {
    pub(super) reply: Reply,
    pub(super) outcome: Outcome,
    /// Set when a keyed request created a task whose key is now in flight.
    pub(super) ticket: Option<KeyTicket>,
}

impl Applied {
    pub(super) fn new(reply: Reply, outcome: Outcome) -> Self {
        Self {
            reply,
            outcome,
            ticket: None,
        }
    }

    pub(super) fn refused(reply: Reply) -> Self {
        Self::new(reply, Outcome::Refused)
    }
}

/// The CRM itself: tasks and the indexes the three shapes need.
#[derive(Debug, Default)]
pub(super) struct Crm {
    next_task_id: u64,
    next_key_seq: u64,
    /// In creation order, which is also id order.
    pub(super) tasks: Vec<Task>,
    pub(super) keys: HashMap<Scoped, KeyRecord>,
    /// Labelled tasks by label: an index into `tasks`.
    pub(super) labels: HashMap<Scoped, usize>,
    /// Plain tasks by `opledger_label`, in creation order: indexes into `tasks`.
    pub(super) plain_labels: HashMap<Scoped, Vec<usize>>,
}

impl Crm {
    pub(super) fn new() -> Self {
        Self {
            next_task_id: FIRST_TASK_ID,
            ..Self::default()
        }
    }

    /// Creates a task and returns its index in `tasks`, or a 507 when the stand is full.
    pub(super) fn create_task(
        &mut self,
        shape: Shape,
        account: &str,
        key: Option<&str>,
        label: Option<&str>,
        fields: Map<String, Value>,
        now_ms: u64,
    ) -> Result<usize, Reply> {
        if self.tasks.len() >= MAX_TASKS {
            return Err(Reply::error(
                StatusCode::INSUFFICIENT_STORAGE,
                "stand_full",
                format!("the stand holds {MAX_TASKS} tasks; reset it"),
            ));
        }
        let id = TaskId(self.next_task_id);
        self.next_task_id += 1;
        self.tasks.push(Task {
            id,
            shape,
            account: account.to_owned(),
            key: key.map(str::to_owned),
            label: label.map(str::to_owned),
            fields,
            created_at_ms: now_ms,
        });
        Ok(self.tasks.len() - 1)
    }

    pub(super) fn next_key_seq(&mut self) -> u64 {
        self.next_key_seq += 1;
        self.next_key_seq
    }

    /// Forgets every task, key and label, and restarts ids at [`FIRST_TASK_ID`]. Key sequence
    /// numbers go on, so a late response held across a reset completes nothing.
    pub(super) fn reset(&mut self) {
        let next_key_seq = self.next_key_seq;
        *self = Self::new();
        self.next_key_seq = next_key_seq;
    }
}

/// The bounded log of provider requests.
#[derive(Debug)]
pub(super) struct RequestLog {
    next_n: u64,
    pub(super) entries: VecDeque<LoggedRequest>,
    pub(super) evicted: u64,
}

impl RequestLog {
    fn new() -> Self {
        Self {
            next_n: 1,
            entries: VecDeque::new(),
            evicted: 0,
        }
    }

    /// The next request number, for `Request-Id: req_<n>`.
    pub(super) fn next_n(&mut self) -> u64 {
        let n = self.next_n;
        self.next_n += 1;
        n
    }

    pub(super) fn push(&mut self, entry: LoggedRequest) {
        if self.entries.len() >= MAX_LOGGED_REQUESTS {
            self.entries.pop_front();
            self.evicted += 1;
        }
        self.entries.push_back(entry);
    }
}

/// Everything behind the stand's one lock.
#[derive(Debug)]
pub(super) struct StandState {
    pub(super) crm: Crm,
    pub(super) settings: StandSettings,
    pub(super) accounts: HashMap<String, String>,
    pub(super) faults: FaultQueue,
    pub(super) log: RequestLog,
    pub(super) clock: StandClock,
}

impl StandState {
    pub(super) fn new(config: &StandConfig) -> Result<Self, StandError> {
        if config.accounts.len() > MAX_ACCOUNTS {
            return Err(StandError::TooManyAccounts {
                count: config.accounts.len(),
                max: MAX_ACCOUNTS,
            });
        }
        let mut accounts = HashMap::new();
        for (account, token) in &config.accounts {
            check_account(account, token).map_err(|reason| StandError::InvalidAccount {
                account: account.clone(),
                reason,
            })?;
            if accounts.insert(account.clone(), token.clone()).is_some() {
                return Err(StandError::InvalidAccount {
                    account: account.clone(),
                    reason: "configured twice",
                });
            }
        }
        Ok(Self {
            crm: Crm::new(),
            settings: StandSettings {
                key_retention_s: config.key_retention_s,
                search_lag_ms: config.search_lag_ms,
            },
            accounts,
            faults: FaultQueue::default(),
            log: RequestLog::new(),
            clock: StandClock::start(),
        })
    }

    /// Key retention in milliseconds, saturating rather than overflowing for absurd settings.
    pub(super) fn key_retention_ms(&self) -> u64 {
        self.settings.key_retention_s.saturating_mul(1_000)
    }

    /// Forgets objects, keys, faults and the request log; keeps config, tokens and the clock.
    pub(super) fn reset(&mut self) {
        self.crm.reset();
        self.faults.clear();
        self.log = RequestLog::new();
    }
}

/// Whether an account name and token can be used. Account names are path segments, so they are
/// kept to characters that need no escaping.
pub(super) fn check_account(account: &str, token: &str) -> Result<(), &'static str> {
    if account.is_empty() || account.len() > MAX_ACCOUNT_NAME_BYTES {
        return Err("an account name is not empty and has at most MAX_ACCOUNT_NAME_BYTES bytes");
    }
    if !account
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err("an account name has only ASCII letters, digits, '-', '_' and '.'");
    }
    if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
        return Err("a token is not empty and has at most MAX_TOKEN_BYTES bytes");
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("a token has only visible ASCII characters");
    }
    Ok(())
}

/// The state the handlers share, and the signal that the stand is shutting down.
#[derive(Debug)]
pub(super) struct Shared {
    state: Mutex<StandState>,
    pub(super) shutdown: watch::Receiver<bool>,
}

impl Shared {
    pub(super) fn new(state: StandState, shutdown: watch::Receiver<bool>) -> Self {
        Self {
            state: Mutex::new(state),
            shutdown,
        }
    }

    /// Locks the state. A poisoned lock is taken over rather than propagated: nothing in the
    /// critical sections panics by design, and a test stand that limps on after a bug is more
    /// useful than one that answers every later request with a panic.
    pub(super) fn lock(&self) -> MutexGuard<'_, StandState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
