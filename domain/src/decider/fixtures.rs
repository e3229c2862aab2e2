//! Shared fixtures for the decider's tests: a fixed clock origin, a standard intent, provider
//! shapes, and a given / when / then harness.

use chrono::{DateTime, Duration, TimeZone, Utc};
use serde_json::json;
use uuid::Uuid;

use crate::args::ArgsSnapshot;
use crate::command::Command;
use crate::contract::{
    Deduplication, LookupSupport, ProviderCapabilities, RetryPolicy, SendBinding,
};
use crate::decider::{decide, Rejection};
use crate::event::{IntentRecorded, OperationEvent};
use crate::ids::{
    AccountId, ActionName, ActorId, AttemptId, CredentialFingerprint, ExternalObjectId,
    IdempotencyKey, OperationId, ProviderId, TenantId, WorkerId,
};
use crate::state::{fold, OperationState};

pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0)
        .single()
        .expect("a valid fixed date")
}

pub fn at_s(seconds: i64) -> DateTime<Utc> {
    t0() + Duration::seconds(seconds)
}

pub fn attempt(n: u128) -> AttemptId {
    AttemptId::from_uuid(Uuid::from_u128(0xa77e_0000 + n))
}

pub fn external(id: &str) -> ExternalObjectId {
    ExternalObjectId::new(id).expect("a valid external id")
}

pub fn actor(name: &str) -> ActorId {
    ActorId::new(name).expect("a valid actor")
}

pub fn intent(requires_approval: bool) -> IntentRecorded {
    let args = ArgsSnapshot::new(json!({"title": "Call the client", "due": "tomorrow"}))
        .expect("valid args");
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
        at: t0(),
    }
}

pub fn binding() -> SendBinding {
    let intent = intent(false);
    SendBinding {
        account: intent.account,
        credential_fingerprint: intent.credential_fingerprint,
        args_hash: intent.args_hash,
    }
}

pub fn keyed() -> ProviderCapabilities {
    ProviderCapabilities {
        deduplication: Deduplication::IdempotencyKey {
            retention_s: 24 * 3600,
            safety_margin_s: 3600,
        },
        lookup: LookupSupport::None,
    }
}

pub fn labelled() -> ProviderCapabilities {
    ProviderCapabilities {
        deduplication: Deduplication::UniqueLabel,
        lookup: LookupSupport::Consistent,
    }
}

pub fn lookup_only() -> ProviderCapabilities {
    ProviderCapabilities {
        deduplication: Deduplication::None,
        lookup: LookupSupport::EventuallyConsistent { lag_ms: 5_000 },
    }
}

pub fn policy() -> RetryPolicy {
    RetryPolicy {
        max_reconciliations: 3,
        max_attempts: 3,
        max_total_ms: 3_600_000,
    }
}

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
        attempt_id: attempt(n),
        worker: WorkerId::new("worker-1").expect("valid"),
        lease_ms,
        binding,
        capabilities,
        policy: policy(),
    }
}

/// A given / when / then scenario over the decider.
pub struct Scenario {
    pub history: Vec<OperationEvent>,
}

pub fn given(history: Vec<OperationEvent>) -> Scenario {
    Scenario { history }
}

impl Scenario {
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

pub struct Outcome {
    pub result: Result<Vec<OperationEvent>, Rejection>,
    pub scenario: Scenario,
}

impl Outcome {
    /// The events the command produced; fails the test on a rejection.
    pub fn events(&self) -> &[OperationEvent] {
        match &self.result {
            Ok(events) => events,
            Err(rejection) => panic!("expected events, got the rejection: {rejection}"),
        }
    }

    /// The event type names the command produced.
    pub fn then_types(&self) -> Vec<&'static str> {
        self.events()
            .iter()
            .map(OperationEvent::type_name)
            .collect()
    }

    /// The rejection; fails the test if the command was accepted.
    pub fn rejection(&self) -> &Rejection {
        match &self.result {
            Ok(events) => panic!("expected a rejection, got {events:?}"),
            Err(rejection) => rejection,
        }
    }

    pub fn status(&self) -> &'static str {
        self.scenario.state().status.name()
    }

    /// Continues the scenario with another command.
    pub fn and(self, command: &Command, now: DateTime<Utc>) -> Outcome {
        let _ = self.events();
        self.scenario.when(command, now)
    }
}

pub fn grant() -> Command {
    Command::GrantApproval {
        approver: actor("boss"),
        args_hash: intent(true).args_hash,
    }
}

pub fn success(n: u128, id: &str) -> Command {
    Command::RecordSuccess {
        attempt_id: attempt(n),
        external_id: external(id),
        provider_request_id: None,
    }
}

pub fn unknown(n: u128) -> Command {
    Command::RecordUnknown {
        attempt_id: attempt(n),
        error: "read timed out after 10 s".into(),
    }
}
