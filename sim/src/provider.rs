//! The simulated provider: every deduplication contract and every lookup the connectors have,
//! in several accounts, with the ground truth of what it holds.
//!
//! One provider, `sim`, with one action per combination the connectors offer
//! ([`SIM_ACTIONS`]). Each account has its own key and label namespaces (a key means nothing in
//! another account), and credentials whose generation a rotation raises: a process holds the
//! generation it was started with (as a real adapter reads its secret once), binds with its
//! fingerprint, and is refused (401) once the provider revoked it.
//!
//! The provider records everything the checker needs: every object it created (id, account,
//! key, label, when it became visible to search), every send it received (with the
//! credentials it carried, and whether it applied anything) and every lookup.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use opledger_domain::args::ArgsHash;
use opledger_domain::contract::{Deduplication, LookupSupport, ProviderCapabilities};
use opledger_domain::ids::{
    AccountId, ActionName, AttemptId, CredentialFingerprint, ExternalObjectId, IdempotencyKey,
    OperationId, ProviderId, TenantId,
};
use opledger_domain::provider::{
    ArgProblem, Binding, BindingQuery, LookupOutcome, LookupRequest, Providers, SendOutcome,
    SendRequest, Unbound,
};

use crate::clock::{yield_now, SimClock};
use crate::faults::{FaultClass, Faults};

/// The provider's id.
pub const SIM_PROVIDER: &str = "sim";

/// The client's request timeout, in simulated milliseconds: a dropped request or response is
/// noticed this long after the send.
pub const REQUEST_TIMEOUT_MS: u64 = 2_000;
/// The longest a healthy answer takes, in simulated milliseconds.
pub const MAX_LATENCY_MS: u64 = 150;

/// How an action's outcome can be looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LookupKind {
    /// By the idempotency key: consistent while the key is retained.
    ByKey,
    /// By the unique label: consistent.
    ByLabel,
    /// A search by label in an index that lags.
    Search,
    /// None at all.
    None,
}

/// The actions of the simulated provider: every deduplication contract with the lookups it
/// comes with in the connectors.
pub const SIM_ACTIONS: [(&str, DedupKind, LookupKind); 7] = [
    ("keyed_by_key", DedupKind::Key, LookupKind::ByKey),
    ("keyed_search", DedupKind::Key, LookupKind::Search),
    ("keyed_blind", DedupKind::Key, LookupKind::None),
    ("labelled", DedupKind::Label, LookupKind::ByLabel),
    ("idempotent_put", DedupKind::Natural, LookupKind::None),
    ("plain_search", DedupKind::None, LookupKind::Search),
    ("plain_blind", DedupKind::None, LookupKind::None),
];

/// A deduplication contract, without its numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DedupKind {
    /// Idempotency key with retention.
    Key,
    /// Unique label.
    Label,
    /// Naturally idempotent.
    Natural,
    /// None.
    None,
}

/// The accounts: (account, owning tenant).
pub const SIM_ACCOUNTS: [(&str, &str); 3] = [
    ("acct-a", "tenant-1"),
    ("acct-b", "tenant-1"),
    ("acct-c", "tenant-2"),
];

/// The numbers of one seed's provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProviderShape {
    /// How long a key is remembered, in seconds.
    pub key_retention_s: u64,
    /// The margin the connector declares, in seconds.
    pub key_margin_s: u64,
    /// The search lag the connector declares, in milliseconds.
    pub search_lag_ms: u64,
}

/// An object the provider holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimObject {
    /// Its id.
    pub id: ExternalObjectId,
    /// Its account.
    pub account: AccountId,
    /// The action that created it.
    pub action: ActionName,
    /// The key it was created under.
    pub key: IdempotencyKey,
    /// The operation label it carries.
    pub label: String,
    /// When it was created (simulated ms).
    pub created_ms: i64,
    /// When search shows it.
    pub visible_ms: i64,
}

/// A send the provider received (or that left the client toward it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendRecord {
    /// When (simulated ms).
    pub at_ms: i64,
    /// The operation.
    pub operation_id: OperationId,
    /// The attempt.
    pub attempt_id: AttemptId,
    /// The tenant the request named.
    pub tenant: TenantId,
    /// The account it went to.
    pub account: AccountId,
    /// The action.
    pub action: ActionName,
    /// The key it carried.
    pub key: IdempotencyKey,
    /// The label it carried.
    pub label: String,
    /// The hash of the arguments it carried.
    pub args_hash: ArgsHash,
    /// The fingerprint of the credentials it carried.
    pub fingerprint: CredentialFingerprint,
    /// Whether the provider applied it (an object created or replayed), now or when it arrived.
    pub applied: bool,
}

/// A lookup the provider answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupRecord {
    /// When (simulated ms).
    pub at_ms: i64,
    /// The operation.
    pub operation_id: OperationId,
}

#[derive(Debug)]
struct Account {
    tenant: TenantId,
    generation: u32,
    /// Key → (object, first seen ms).
    keys: BTreeMap<IdempotencyKey, (ExternalObjectId, i64)>,
    labels: BTreeMap<String, ExternalObjectId>,
}

/// A request that reaches the provider later than it was sent.
#[derive(Debug)]
struct LateArrival {
    arrive_ms: i64,
    send_index: usize,
    request: SendRequest,
}

#[derive(Debug)]
struct World {
    clock: SimClock,
    faults: Faults,
    shape: ProviderShape,
    accounts: BTreeMap<AccountId, Account>,
    objects: Vec<SimObject>,
    by_id: BTreeMap<ExternalObjectId, usize>,
    sends: Vec<SendRecord>,
    lookups: Vec<LookupRecord>,
    late: Vec<LateArrival>,
    /// The lease the engines take, to make a late response outlast it.
    lease_ms: u64,
    /// While a late request is applied: the time it arrived (the clock may have moved past it
    /// in one jump, but the network does not pause with a process).
    arriving_at: Option<i64>,
}

/// The provider's shared state: ground truth and logs.
#[derive(Clone, Debug)]
pub struct SimProvider {
    world: Arc<Mutex<World>>,
}

/// One process's view of the provider: the credentials it was started with.
#[derive(Clone, Debug)]
pub struct SimProviders {
    provider: SimProvider,
    generations: BTreeMap<AccountId, u32>,
    clock: SimClock,
}

/// The fingerprint of `account`'s credentials of generation `generation`.
pub fn fingerprint(account: &AccountId, generation: u32) -> CredentialFingerprint {
    CredentialFingerprint::new(format!("fp-{account}-g{generation}"))
        .expect("a fingerprint from an account id is valid")
}

/// The capabilities of action `name` under `shape`, if the provider has it.
pub fn capabilities_of(name: &str, shape: &ProviderShape) -> Option<ProviderCapabilities> {
    let (_, dedup, lookup) = SIM_ACTIONS.iter().find(|(action, _, _)| *action == name)?;
    let deduplication = match dedup {
        DedupKind::Key => Deduplication::IdempotencyKey {
            retention_s: shape.key_retention_s,
            safety_margin_s: shape.key_margin_s,
        },
        DedupKind::Label => Deduplication::UniqueLabel,
        DedupKind::Natural => Deduplication::NaturallyIdempotent,
        DedupKind::None => Deduplication::None,
    };
    let lookup = match lookup {
        LookupKind::ByKey | LookupKind::ByLabel => LookupSupport::Consistent,
        LookupKind::Search => LookupSupport::EventuallyConsistent {
            lag_ms: shape.search_lag_ms,
        },
        LookupKind::None => LookupSupport::None,
    };
    Some(ProviderCapabilities {
        deduplication,
        lookup,
    })
}

/// The contract kinds of action `name`.
pub fn kinds_of(name: &str) -> Option<(DedupKind, LookupKind)> {
    SIM_ACTIONS
        .iter()
        .find(|(action, _, _)| *action == name)
        .map(|(_, dedup, lookup)| (*dedup, *lookup))
}

/// What the provider does with a send: answer now, or after a wait.
enum Answer {
    Now(SendOutcome),
    After(i64, SendOutcome),
}

impl SimProvider {
    /// A provider with every account at credential generation 1.
    pub fn new(clock: SimClock, faults: Faults, shape: ProviderShape, lease_ms: u64) -> Self {
        let accounts = SIM_ACCOUNTS
            .iter()
            .map(|(account, tenant)| {
                (
                    AccountId::new(*account).expect("valid"),
                    Account {
                        tenant: TenantId::new(*tenant).expect("valid"),
                        generation: 1,
                        keys: BTreeMap::new(),
                        labels: BTreeMap::new(),
                    },
                )
            })
            .collect();
        Self {
            world: Arc::new(Mutex::new(World {
                clock,
                faults,
                shape,
                accounts,
                objects: Vec::new(),
                by_id: BTreeMap::new(),
                sends: Vec::new(),
                lookups: Vec::new(),
                late: Vec::new(),
                lease_ms,
                arriving_at: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The view of a process started now: the credentials configured now.
    pub fn for_process(&self, clock: SimClock) -> SimProviders {
        let generations = self
            .lock()
            .accounts
            .iter()
            .map(|(id, account)| (id.clone(), account.generation))
            .collect();
        SimProviders {
            provider: self.clone(),
            generations,
            clock,
        }
    }

    /// Rotates `account`'s credentials: the old ones are revoked at once.
    pub fn rotate(&self, account: &AccountId) -> u32 {
        let mut world = self.lock();
        let Some(account) = world.accounts.get_mut(account) else {
            return 0;
        };
        account.generation += 1;
        account.generation
    }

    /// The fingerprint the provider accepts for `account` now.
    pub fn current_fingerprint(&self, account: &AccountId) -> Option<CredentialFingerprint> {
        let world = self.lock();
        let generation = world.accounts.get(account)?.generation;
        Some(fingerprint(account, generation))
    }

    /// Applies the requests whose late arrival time is at or before `until_ms`, each as of the
    /// time it arrives; returns a line for each.
    pub fn deliver_late(&self, until_ms: i64) -> Vec<String> {
        let mut world = self.lock();
        let (mut due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut world.late)
            .into_iter()
            .partition(|late| late.arrive_ms <= until_ms);
        world.late = later;
        due.sort_by_key(|late| late.arrive_ms);
        due.into_iter()
            .map(|late| {
                world.arriving_at = Some(late.arrive_ms);
                let id = world.apply(&late.request);
                world.arriving_at = None;
                world.sends[late.send_index].applied = true;
                let op = world.faults.op_name(late.request.operation_id);
                format!("provider: late request of {op} arrived, holds {id}")
            })
            .collect()
    }

    /// When the next late request arrives.
    pub fn next_late_ms(&self) -> Option<i64> {
        self.lock().late.iter().map(|late| late.arrive_ms).min()
    }

    /// Every object, in creation order.
    pub fn objects(&self) -> Vec<SimObject> {
        self.lock().objects.clone()
    }

    /// The objects carrying `label`.
    pub fn objects_with_label(&self, label: &str) -> Vec<SimObject> {
        self.lock()
            .objects
            .iter()
            .filter(|object| object.label == label)
            .cloned()
            .collect()
    }

    /// The object `id`, if the provider holds it.
    pub fn object(&self, id: &ExternalObjectId) -> Option<SimObject> {
        let world = self.lock();
        world
            .by_id
            .get(id)
            .map(|index| world.objects[*index].clone())
    }

    /// Objects from index `from` on, in creation order.
    pub fn objects_from(&self, from: usize) -> Vec<SimObject> {
        self.lock().objects.get(from..).unwrap_or_default().to_vec()
    }

    /// Sends from index `from` on.
    pub fn sends_from(&self, from: usize) -> Vec<SendRecord> {
        self.lock().sends.get(from..).unwrap_or_default().to_vec()
    }

    /// Every send so far.
    pub fn sends(&self) -> Vec<SendRecord> {
        self.lock().sends.clone()
    }

    /// The last lookup of `operation_id`, when there was one.
    pub fn last_lookup_ms(&self, operation_id: OperationId) -> Option<i64> {
        self.lock()
            .lookups
            .iter()
            .rev()
            .find(|lookup| lookup.operation_id == operation_id)
            .map(|lookup| lookup.at_ms)
    }

    /// The numbers of this provider.
    pub fn shape(&self) -> ProviderShape {
        self.lock().shape
    }
}

impl World {
    fn now(&self) -> i64 {
        self.arriving_at.unwrap_or_else(|| self.clock.now_ms())
    }

    fn create(
        &mut self,
        request: &SendRequest,
        dedup: DedupKind,
        lookup: LookupKind,
    ) -> ExternalObjectId {
        let id = ExternalObjectId::new(format!("obj-{}", self.objects.len() + 1))
            .expect("a numbered id is valid");
        let now = self.now();
        let mut lag = i64::try_from(self.shape.search_lag_ms).unwrap_or(i64::MAX / 4);
        if lookup == LookupKind::Search && self.faults.fire(FaultClass::SearchLagExceeded) {
            lag *= i64::try_from(self.faults.between(2, 5)).unwrap_or(2);
            let op = self.faults.op_name(request.operation_id);
            self.faults.note(format!(
                "fault: search will show {id} of {op} only after {lag} ms"
            ));
        }
        let _ = dedup;
        self.by_id.insert(id.clone(), self.objects.len());
        self.objects.push(SimObject {
            id: id.clone(),
            account: request.account.clone(),
            action: request.action.clone(),
            key: request.idempotency_key.clone(),
            label: request.label.clone(),
            created_ms: now,
            visible_ms: now + lag,
        });
        id
    }

    /// Does what the request asks, under the action's contract; returns the object it names.
    fn apply(&mut self, request: &SendRequest) -> ExternalObjectId {
        let (dedup, lookup) =
            kinds_of(request.action.as_str()).unwrap_or((DedupKind::None, LookupKind::None));
        let now = self.now();
        let retention_ms = i64::try_from(self.shape.key_retention_s * 1000).unwrap_or(i64::MAX / 4);
        match dedup {
            DedupKind::Key => {
                let remembered = self
                    .accounts
                    .get(&request.account)
                    .and_then(|account| account.keys.get(&request.idempotency_key))
                    .filter(|(_, first_seen)| now < first_seen + retention_ms)
                    .map(|(id, _)| id.clone());
                if let Some(id) = remembered {
                    return id;
                }
                let id = self.create(request, dedup, lookup);
                if let Some(account) = self.accounts.get_mut(&request.account) {
                    account
                        .keys
                        .insert(request.idempotency_key.clone(), (id.clone(), now));
                }
                id
            }
            DedupKind::Label | DedupKind::Natural => {
                let existing = self
                    .accounts
                    .get(&request.account)
                    .and_then(|account| account.labels.get(&request.label))
                    .cloned();
                if let Some(id) = existing {
                    return id;
                }
                let id = self.create(request, dedup, lookup);
                if let Some(account) = self.accounts.get_mut(&request.account) {
                    account.labels.insert(request.label.clone(), id.clone());
                }
                id
            }
            DedupKind::None => self.create(request, dedup, lookup),
        }
    }

    fn receive(&mut self, request: &SendRequest, generation: u32) -> Answer {
        let now = self.now();
        let send_index = self.sends.len();
        self.sends.push(SendRecord {
            at_ms: now,
            operation_id: request.operation_id,
            attempt_id: request.attempt_id,
            tenant: request.tenant.clone(),
            account: request.account.clone(),
            action: request.action.clone(),
            key: request.idempotency_key.clone(),
            label: request.label.clone(),
            args_hash: request.args.hash(),
            fingerprint: fingerprint(&request.account, generation),
            applied: false,
        });
        let latency = self.faults_latency();
        let Some(account) = self.accounts.get(&request.account) else {
            return Answer::Now(SendOutcome::NotSent {
                reason: format!("no account {}", request.account),
                retry_after_ms: None,
            });
        };
        if account.tenant != request.tenant {
            return Answer::Now(SendOutcome::NotSent {
                reason: "the tenant does not own the account".into(),
                retry_after_ms: None,
            });
        }
        if account.generation != generation {
            return Answer::After(
                now + latency,
                SendOutcome::Rejected {
                    code: "401 unauthorized".into(),
                    message: "the credentials were revoked".into(),
                },
            );
        }
        let op = self.faults.op_name(request.operation_id);
        let timeout = now + i64::try_from(REQUEST_TIMEOUT_MS).unwrap_or(0);
        let uncertain = |error: &str, retry_after_ms| SendOutcome::Uncertain {
            error: error.to_owned(),
            retry_after_ms,
        };
        if self.faults.fire(FaultClass::RateLimited) {
            let wait = self.faults.between(100, 30_000);
            self.faults
                .note(format!("fault: 429 for {op}, retry after {wait} ms"));
            return Answer::After(
                now + latency,
                SendOutcome::NotSent {
                    reason: "429 too many requests".into(),
                    retry_after_ms: Some(wait),
                },
            );
        }
        if self.faults.fire(FaultClass::RequestDropped) {
            self.faults.note(format!("fault: request of {op} dropped"));
            return Answer::After(timeout, uncertain("timeout: no answer", None));
        }
        if self.faults.fire(FaultClass::ServerErrorBeforeCommit) {
            let wait = (self.faults.between(0, 1) == 1).then(|| self.faults.between(100, 20_000));
            self.faults
                .note(format!("fault: 503 before commit for {op}"));
            return Answer::After(now + latency, uncertain("503 service unavailable", wait));
        }
        if self.faults.fire(FaultClass::ResponseLate) {
            if self.faults.between(0, 1) == 0 {
                let arrive_ms =
                    timeout + i64::try_from(self.faults.between(1, 20_000)).unwrap_or(0);
                self.faults.note(format!(
                    "fault: request of {op} will reach the provider at +{} ms, after the client's timeout",
                    arrive_ms - now
                ));
                self.late.push(LateArrival {
                    arrive_ms,
                    send_index,
                    request: request.clone(),
                });
                return Answer::After(timeout, uncertain("timeout: no answer", None));
            }
            let id = self.apply(request);
            self.sends[send_index].applied = true;
            let delay = self.faults.between(self.lease_ms + 1, 3 * self.lease_ms);
            self.faults.note(format!(
                "fault: {op} applied as {id}; its response comes back in {delay} ms, past the lease"
            ));
            return Answer::After(
                now + i64::try_from(delay).unwrap_or(0),
                SendOutcome::Confirmed {
                    external_id: id,
                    provider_request_id: None,
                },
            );
        }
        let id = self.apply(request);
        self.sends[send_index].applied = true;
        if self.faults.fire(FaultClass::ServerErrorAfterCommit) {
            self.faults
                .note(format!("fault: 500 after {op} was committed as {id}"));
            return Answer::After(now + latency, uncertain("500 internal server error", None));
        }
        if self.faults.fire(FaultClass::ResponseDropped) {
            self.faults.note(format!(
                "fault: response to {op} dropped after it was applied as {id}"
            ));
            return Answer::After(timeout, uncertain("timeout: connection reset", None));
        }
        Answer::After(
            now + latency,
            SendOutcome::Confirmed {
                external_id: id,
                provider_request_id: None,
            },
        )
    }

    fn faults_latency(&self) -> i64 {
        i64::try_from(self.faults.between(1, MAX_LATENCY_MS)).unwrap_or(1)
    }

    fn lookup(&mut self, request: &LookupRequest, generation: u32) -> LookupOutcome {
        let now = self.now();
        self.lookups.push(LookupRecord {
            at_ms: now,
            operation_id: request.operation_id,
        });
        let Some(account) = self.accounts.get(&request.account) else {
            return unavailable("no such account");
        };
        if account.generation != generation {
            return LookupOutcome::Refused {
                reason: "401: the credentials were revoked".into(),
            };
        }
        let op = self.faults.op_name(request.operation_id);
        if self.faults.fire(FaultClass::LookupUnavailable) {
            self.faults
                .note(format!("fault: lookup of {op} unavailable"));
            return unavailable("503 service unavailable");
        }
        let retention_ms = i64::try_from(self.shape.key_retention_s * 1000).unwrap_or(i64::MAX / 4);
        let found = |id: &ExternalObjectId, how: &str| LookupOutcome::Found {
            external_id: id.clone(),
            account: request.account.clone(),
            duplicates: Vec::new(),
            evidence: format!("{how}: {id}"),
        };
        match kinds_of(request.action.as_str()).map(|(_, lookup)| lookup) {
            Some(LookupKind::ByKey) => match account
                .keys
                .get(&request.idempotency_key)
                .filter(|(_, first_seen)| now < first_seen + retention_ms)
            {
                Some((id, _)) => found(id, "by key"),
                None => LookupOutcome::NotFound {
                    authoritative: true,
                    evidence: "by key: not found (or forgotten)".into(),
                },
            },
            Some(LookupKind::ByLabel) => match account.labels.get(&request.label) {
                Some(id) => found(id, "by label"),
                None => LookupOutcome::NotFound {
                    authoritative: true,
                    evidence: "by label: not found".into(),
                },
            },
            Some(LookupKind::Search) => {
                let mut hits: Vec<&SimObject> = self
                    .objects
                    .iter()
                    .filter(|object| {
                        object.account == request.account
                            && object.label == request.label
                            && object.visible_ms <= now
                    })
                    .collect();
                hits.sort_by_key(|object| object.created_ms);
                match hits.split_first() {
                    Some((first, rest)) => LookupOutcome::Found {
                        external_id: first.id.clone(),
                        account: request.account.clone(),
                        duplicates: rest.iter().map(|object| object.id.clone()).collect(),
                        evidence: format!("search: {} result(s)", hits.len()),
                    },
                    None => LookupOutcome::NotFound {
                        authoritative: false,
                        evidence: "search: no result".into(),
                    },
                }
            }
            Some(LookupKind::None) | None => unavailable("the action declares no lookup"),
        }
    }
}

fn unavailable(reason: &str) -> LookupOutcome {
    LookupOutcome::Unavailable {
        reason: reason.to_owned(),
        retry_after_ms: None,
    }
}

impl Providers for SimProviders {
    fn bind(&self, query: &BindingQuery<'_>) -> Result<Binding, Unbound> {
        if query.provider.as_str() != SIM_PROVIDER {
            return Err(Unbound::Provider {
                provider: query.provider.clone(),
            });
        }
        let shape = self.provider.shape();
        let Some(capabilities) = capabilities_of(query.action.as_str(), &shape) else {
            return Err(Unbound::Action {
                provider: query.provider.clone(),
                action: query.action.clone(),
                known: SIM_ACTIONS
                    .iter()
                    .map(|(name, _, _)| (*name).to_owned())
                    .collect(),
            });
        };
        let Some(generation) = self.generations.get(query.account) else {
            return Err(Unbound::Account {
                provider: query.provider.clone(),
                account: query.account.clone(),
            });
        };
        let owner = SIM_ACCOUNTS
            .iter()
            .find(|(account, _)| *account == query.account.as_str())
            .map(|(_, tenant)| *tenant);
        if owner != Some(query.tenant.as_str()) {
            return Err(Unbound::NotOwned {
                provider: query.provider.clone(),
                account: query.account.clone(),
                tenant: query.tenant.clone(),
            });
        }
        Ok(Binding {
            capabilities,
            credential_fingerprint: fingerprint(query.account, *generation),
            earlier_fingerprints: Vec::new(),
        })
    }

    fn check_args(
        &self,
        _provider: &ProviderId,
        _action: &ActionName,
        _args: &serde_json::Value,
    ) -> Result<(), Vec<ArgProblem>> {
        Ok(())
    }

    fn action_description(&self, provider: &ProviderId, action: &ActionName) -> Option<String> {
        (provider.as_str() == SIM_PROVIDER && kinds_of(action.as_str()).is_some())
            .then(|| "create a task".to_owned())
    }

    async fn execute(&self, request: &SendRequest) -> SendOutcome {
        // No yield before the request leaves: calling `execute` is the send, so the engine's
        // last check before it is the last thing that happens before the provider sees it (a
        // pause there would be a network delivering a request minutes late, which the key's
        // margin exists for, not a stall of the engine). The answer comes after a wait.
        let generation = self.generations.get(&request.account).copied().unwrap_or(0);
        let answer = self.provider.lock().receive(request, generation);
        match answer {
            Answer::Now(outcome) => outcome,
            Answer::After(at_ms, outcome) => {
                self.clock.sleep_until(at_ms).await;
                outcome
            }
        }
    }

    async fn lookup(&self, request: &LookupRequest) -> LookupOutcome {
        yield_now().await;
        let generation = self.generations.get(&request.account).copied().unwrap_or(0);
        self.provider.lock().lookup(request, generation)
    }
}
