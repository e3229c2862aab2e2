//! Shared test fixtures for the domain and for every crate that tests against it (the
//! `testing` feature; the domain's own tests get it unconditionally): a fixed clock origin and a
//! clock tests move by hand, a deterministic id source, the standard intent (recorded, and as a
//! request), provider shapes, a retry policy and claim commands, and a given / when / then
//! harness over the decider.
//!
//! Never a normal dependency of a production crate: enable it under `[dev-dependencies]`
//! (`opledger-domain = { workspace = true, features = ["testing"] }`). Fixtures panic on bad
//! input, with `#[track_caller]` so a failure points at the test, not here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Duration, TimeZone, Utc};
use serde_json::json;
use uuid::Uuid;

use crate::app::IntentRequest;
use crate::args::ArgsSnapshot;
use crate::command::{Command, DEFAULT_LEASE_MS};
use crate::contract::{
    Deduplication, LookupSupport, ProviderCapabilities, RetryPolicy, SendBinding,
};
use crate::decider::{decide, Rejection};
use crate::event::{IntentRecorded, OperationEvent};
use crate::ids::{
    AccountId, ActionName, ActorId, AttemptId, CredentialFingerprint, ExternalObjectId,
    IdempotencyKey, OperationId, ProviderId, TenantId, WorkerId,
};
use crate::ports::{Clock, IdSource};
use crate::state::{fold, OperationState};

// ----- time -----------------------------------------------------------------------------------

/// The fixed origin of test time: 2026-11-30 09:00:00 UTC.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0)
        .single()
        .expect("a valid fixed date")
}

/// `seconds` after [`t0`].
pub fn at_s(seconds: i64) -> DateTime<Utc> {
    t0() + Duration::seconds(seconds)
}

/// A clock that stands still until a test moves it, optionally ticking forward by a fixed step
/// on every reading (so events get distinct, ordered times). Clones share one time.
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<Mutex<DateTime<Utc>>>,
    tick: Duration,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn at(start: DateTime<Utc>) -> Self {
        Self::ticking(start, Duration::zero())
    }

    /// A clock at `start` that moves `tick` forward after every reading.
    pub fn ticking(start: DateTime<Utc>, tick: Duration) -> Self {
        Self {
            now: Arc::new(Mutex::new(start)),
            tick,
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) += by;
    }
}

impl Default for ManualClock {
    /// A clock standing at [`t0`].
    fn default() -> Self {
        Self::at(t0())
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        let reading = *now;
        *now += self.tick;
        reading
    }
}

// ----- ids ------------------------------------------------------------------------------------

/// Ids from counters and "random" numbers from a fixed sequence, so a test's ids and jitter are
/// the same on every run. Never for production: keys from it are guessable by design.
#[derive(Debug, Default)]
pub struct SequentialIds {
    next: AtomicU64,
}

impl SequentialIds {
    /// A source whose first id is number 1.
    pub fn new() -> Self {
        Self::default()
    }

    fn next(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }
}

impl IdSource for SequentialIds {
    fn new_operation_id(&self) -> OperationId {
        OperationId::from_uuid(Uuid::from_u128(0x0b_0000_0000 + u128::from(self.next())))
    }

    fn new_attempt_id(&self) -> AttemptId {
        attempt(u128::from(self.next()))
    }

    fn new_idempotency_key(&self) -> IdempotencyKey {
        IdempotencyKey::new(format!("opk_test_{}", self.next()))
            .expect("a prefixed counter is a valid idempotency key")
    }

    fn random_below(&self, bound: u64) -> u64 {
        // SplitMix64 over the counter: spread out, yet the same on every run.
        let mut z = self.next().wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        z.checked_rem(bound).unwrap_or(0)
    }
}

// ----- identities and the standard intent -----------------------------------------------------

/// Attempt id number `n`.
pub fn attempt(n: u128) -> AttemptId {
    AttemptId::from_uuid(Uuid::from_u128(0xa77e_0000 + n))
}

/// An external object id; panics if `id` is not a valid one.
#[track_caller]
pub fn external(id: &str) -> ExternalObjectId {
    ExternalObjectId::new(id).expect("a valid external id")
}

/// An actor (approver, reviewer); panics if `name` is not a valid one.
#[track_caller]
pub fn actor(name: &str) -> ActorId {
    ActorId::new(name).expect("a valid actor")
}

/// A worker id; panics if `name` is not a valid one.
#[track_caller]
pub fn worker(name: &str) -> WorkerId {
    WorkerId::new(name).expect("a valid worker")
}

/// The arguments of the standard intent: the article's "call the client tomorrow" task.
pub fn standard_args() -> serde_json::Value {
    json!({"title": "Call the client", "due": "tomorrow"})
}

/// The standard intent, as recorded: operation 7 of tenant `acme`, provider `crm`, account
/// `acct-1` (credentials `fp-1`), action `create_task`, key `opk_test`, recorded at [`t0`].
pub fn intent(requires_approval: bool) -> IntentRecorded {
    let args = ArgsSnapshot::new(standard_args()).expect("valid args");
    IntentRecorded {
        operation_id: OperationId::from_uuid(Uuid::from_u128(7)),
        tenant: TenantId::new("acme").expect("valid"),
        owner: None,
        provider: ProviderId::new("crm").expect("valid"),
        account: AccountId::new("acct-1").expect("valid"),
        credential_fingerprint: CredentialFingerprint::new("fp-1").expect("valid"),
        action: ActionName::new("create_task").expect("valid"),
        args_hash: args.hash(),
        args,
        idempotency_key: IdempotencyKey::new("opk_test").expect("valid"),
        source_id: None,
        requires_approval,
        executor: Default::default(),
        at: t0(),
    }
}

/// The standard intent as a request to the ledger, before validation (owner `anna`, no
/// approval); change fields with struct update syntax.
pub fn intent_request(source_id: Option<&str>) -> IntentRequest {
    IntentRequest {
        tenant: "acme".into(),
        owner: Some("anna".into()),
        provider: "crm".into(),
        account: "acct-1".into(),
        credential_fingerprint: "fp-1".into(),
        action: "create_task".into(),
        args: standard_args(),
        source_id: source_id.map(str::to_owned),
        requires_approval: false,
    }
}

/// The binding a send of `intent` uses: its own account, credentials and arguments.
pub fn binding_of(intent: &IntentRecorded) -> SendBinding {
    SendBinding {
        account: intent.account.clone(),
        credential_fingerprint: intent.credential_fingerprint.clone(),
        args_hash: intent.args_hash.clone(),
    }
}

/// The binding of the standard intent.
pub fn binding() -> SendBinding {
    binding_of(&intent(false))
}

// ----- provider shapes and policy -------------------------------------------------------------

/// A provider that honours idempotency keys for a day (an hour of it kept as margin), with no
/// lookup.
pub fn keyed() -> ProviderCapabilities {
    ProviderCapabilities {
        deduplication: Deduplication::IdempotencyKey {
            retention_s: 24 * 3600,
            safety_margin_s: 3600,
        },
        lookup: LookupSupport::None,
    }
}

/// A provider that enforces a unique label, with a consistent lookup by it.
pub fn labelled() -> ProviderCapabilities {
    ProviderCapabilities {
        deduplication: Deduplication::UniqueLabel,
        lookup: LookupSupport::Consistent,
    }
}

/// A provider that deduplicates nothing and can only be searched, with a 5 s index lag.
pub fn lookup_only() -> ProviderCapabilities {
    ProviderCapabilities {
        deduplication: Deduplication::None,
        lookup: LookupSupport::EventuallyConsistent { lag_ms: 5_000 },
    }
}

/// A small retry budget that tests exhaust quickly: 3 attempts, 3 lookups, one hour.
pub fn policy() -> RetryPolicy {
    RetryPolicy {
        max_reconciliations: 3,
        max_attempts: 3,
        max_total_ms: 3_600_000,
    }
}

// ----- commands -------------------------------------------------------------------------------

/// The claim of attempt `n` of the standard intent by `worker-1`, with a 30 s lease.
pub fn start(n: u128, capabilities: ProviderCapabilities) -> Command {
    start_with(n, capabilities, binding(), 30_000)
}

/// A claim of attempt `n` with the given binding and lease.
pub fn start_with(
    n: u128,
    capabilities: ProviderCapabilities,
    binding: SendBinding,
    lease_ms: u64,
) -> Command {
    Command::StartAttempt {
        request: None,
        budget_wait: None,
        attempt_id: attempt(n),
        worker: worker("worker-1"),
        lease_ms,
        binding,
        capabilities,
        policy: policy(),
    }
}

/// A claim of `intent` as `attempt_id` by `worker`, bound to the intent, to a unique-label
/// provider, with the default lease and retry policy: what a ledger test appends after the intent.
pub fn claim_of(intent: &IntentRecorded, attempt_id: AttemptId, worker: WorkerId) -> Command {
    Command::StartAttempt {
        request: None,
        budget_wait: None,
        attempt_id,
        worker,
        lease_ms: DEFAULT_LEASE_MS,
        binding: binding_of(intent),
        capabilities: labelled(),
        policy: RetryPolicy::default(),
    }
}

/// `boss` approves the standard intent's arguments.
pub fn grant() -> Command {
    Command::GrantApproval {
        principal: None,
        approver: actor("boss"),
        args_hash: intent(true).args_hash,
    }
}

/// The provider confirmed attempt `n` with object `id`.
pub fn success(n: u128, id: &str) -> Command {
    Command::RecordSuccess {
        attempt_id: attempt(n),
        external_id: external(id),
        provider_request_id: None,
    }
}

/// Attempt `n` timed out.
pub fn unknown(n: u128) -> Command {
    Command::RecordUnknown {
        attempt_id: attempt(n),
        error: "read timed out after 10 s".into(),
        check_not_before: None,
    }
}

// ----- the given / when / then harness --------------------------------------------------------

/// A given / when / then scenario over the decider.
///
/// Typestate keeps it from being misused: a [`Scenario`] only has `when`, and only its
/// [`Outcome`] has the `then` side, so a test cannot assert before it decided anything.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The events so far, oldest first.
    pub history: Vec<OperationEvent>,
}

/// A scenario starting from `history` (empty: an operation never recorded).
pub fn given(history: Vec<OperationEvent>) -> Scenario {
    Scenario { history }
}

impl Scenario {
    /// The state the history folds to.
    pub fn state(&self) -> OperationState {
        fold(&self.history)
    }

    /// Decides `command` at `now` and returns the result together with the resulting history.
    pub fn when(mut self, command: &Command, now: DateTime<Utc>) -> Outcome {
        let result = decide(command, &self.state(), now);
        if let Ok(events) = &result {
            self.history.extend(events.iter().cloned());
        }
        Outcome {
            result,
            scenario: self,
        }
    }
}

/// What a command did to a [`Scenario`]: its result, and the scenario with its events appended.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The decider's answer.
    pub result: Result<Vec<OperationEvent>, Rejection>,
    /// The scenario, with the events appended when the command was accepted.
    pub scenario: Scenario,
}

impl Outcome {
    /// The events the command produced; fails the test (at its line) on a rejection.
    #[track_caller]
    pub fn events(&self) -> &[OperationEvent] {
        match &self.result {
            Ok(events) => events,
            Err(rejection) => panic!("expected events, got the rejection: {rejection}"),
        }
    }

    /// The event type names the command produced; fails the test on a rejection.
    #[track_caller]
    pub fn then_types(&self) -> Vec<&'static str> {
        self.events()
            .iter()
            .map(OperationEvent::type_name)
            .collect()
    }

    /// The rejection; fails the test (at its line) if the command was accepted.
    #[track_caller]
    pub fn rejection(&self) -> &Rejection {
        match &self.result {
            Ok(events) => panic!("expected a rejection, got {events:?}"),
            Err(rejection) => rejection,
        }
    }

    /// The name of the status the scenario is in now.
    pub fn status(&self) -> &'static str {
        self.scenario.state().status.name()
    }

    /// Continues the scenario with another command; fails the test if this one was refused.
    #[track_caller]
    pub fn and(self, command: &Command, now: DateTime<Utc>) -> Outcome {
        let _ = self.events();
        self.scenario.when(command, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_stands_still_until_moved_and_clones_share_it() {
        let clock = ManualClock::default();
        let shared = clock.clone();
        assert_eq!(clock.now(), t0());
        assert_eq!(clock.now(), t0());
        shared.advance(Duration::seconds(5));
        assert_eq!(clock.now(), at_s(5));
    }

    #[test]
    fn a_ticking_clock_gives_every_reading_its_own_time() {
        let clock = ManualClock::ticking(t0(), Duration::seconds(1));
        assert_eq!([clock.now(), clock.now()], [t0(), at_s(1)]);
    }

    #[test]
    fn sequential_ids_are_fresh_and_the_same_on_every_run() {
        let (one, two) = (SequentialIds::new(), SequentialIds::new());
        assert_eq!(one.new_idempotency_key(), two.new_idempotency_key());
        assert_ne!(one.new_attempt_id(), one.new_attempt_id());
        let draws: Vec<u64> = (0..50).map(|_| one.random_below(10)).collect();
        assert!(draws.iter().all(|draw| *draw < 10));
        assert!(draws.iter().any(|draw| *draw != draws[0]), "{draws:?}");
        assert_eq!(one.random_below(0), 0);
    }

    #[test]
    fn the_standard_request_is_valid_and_carries_the_standard_arguments() {
        intent_request(None)
            .validate()
            .expect("the standard request is valid");
        let hash = ArgsSnapshot::new(intent_request(None).args)
            .expect("valid")
            .hash();
        assert_eq!(hash, intent(false).args_hash);
    }

    #[test]
    fn a_claim_of_an_intent_is_accepted_on_it() {
        let recorded = intent(false);
        let claim = claim_of(&recorded, attempt(1), worker("w-1"));
        let outcome = given(vec![OperationEvent::IntentRecorded(recorded)]).when(&claim, t0());
        assert_eq!(outcome.then_types(), ["AttemptStarted"]);
        assert_eq!(outcome.status(), "in_flight");
    }
}
