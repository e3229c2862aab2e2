//! A 429 is waited out before the send is repeated: the real engine over an in-memory ledger,
//! a preset connector sending to a scripted API on 127.0.0.1, and a clock the test moves by hand,
//! so "not before the wait" is checked to the millisecond without sleeping.
//!
//! The engine's backoff base is 40 ms here, as in a test configuration: before the connector had
//! a least wait after a 429, HubSpot's 429 (no `Retry-After`, no reset header) was repeated after
//! that backoff, inside the window that had just refused it.

mod scripted;

use chrono::Duration;
use opledger_domain::app::{IntentRequest, Ledger};
use opledger_domain::engine::{Engine, EnginePolicy};
use opledger_domain::ids::{AccountId, ActionName, OperationId, ProviderId, TenantId, WorkerId};
use opledger_domain::provider::{BindingQuery, Providers};
use opledger_domain::state::Status;
use opledger_domain::testing::{t0, ManualClock, SequentialIds};
use opledger_providers::{AccountSpec, Connector, Credentials, HttpProviders, Overrides};
use opledger_store::MemoryStore;
use serde_json::{json, Value};

use scripted::{answer, Answer, Emulator};

/// The engine's first backoff, in milliseconds: what a test configuration uses (30–50 ms).
const TEST_BACKOFF_BASE_MS: u64 = 40;

type TestEngine = Engine<MemoryStore, ManualClock, SequentialIds, HttpProviders>;

/// The engine, its clock and the scripted API behind one preset.
struct Rig {
    api: Emulator,
    clock: ManualClock,
    engine: TestEngine,
    provider: ProviderId,
    action: &'static str,
}

fn tenant() -> TenantId {
    TenantId::new("acme").expect("a valid tenant")
}

fn account() -> AccountId {
    AccountId::new("acct-1").expect("a valid account")
}

impl Rig {
    async fn new(preset: &str, action: &'static str) -> Self {
        let api = Emulator::start().await;
        let overrides = Overrides {
            base_url: Some(api.base_url.clone()),
            accounts: vec![AccountSpec {
                id: account(),
                tenants: vec![tenant()],
                credentials: Credentials::token("token-1"),
            }],
            request_timeout_ms: Some(2_000),
            connect_timeout_ms: Some(500),
            ..Overrides::default()
        };
        let connector = Connector::from_preset(preset, overrides)
            .unwrap_or_else(|errors| panic!("{}", opledger_providers::render_all(&errors)));
        let providers = HttpProviders::new([connector]).expect("one connector");
        let clock = ManualClock::at(t0());
        let policy = EnginePolicy {
            backoff_base_ms: TEST_BACKOFF_BASE_MS,
            ..EnginePolicy::default()
        };
        let ledger = Ledger::new(MemoryStore::new(), clock.clone(), SequentialIds::new());
        let worker = WorkerId::new("rate-limit-test").expect("a valid worker id");
        Self {
            api,
            clock,
            engine: Engine::new(ledger, providers, policy, worker),
            provider: ProviderId::new(preset).expect("a valid provider id"),
            action,
        }
    }

    /// Records the intent and sends it once.
    async fn record_and_send(&self, args: Value) -> OperationId {
        let fingerprint = self
            .engine
            .providers()
            .bind(&BindingQuery {
                tenant: &tenant(),
                provider: &self.provider,
                account: &account(),
                action: &ActionName::new(self.action).expect("a valid action"),
            })
            .expect("the account is configured")
            .credential_fingerprint;
        let request = IntentRequest {
            tenant: tenant().to_string(),
            owner: None,
            provider: self.provider.to_string(),
            account: account().to_string(),
            credential_fingerprint: fingerprint.to_string(),
            action: self.action.to_owned(),
            args,
            source_id: None,
            requires_approval: false,
        };
        let (recorded, report) = self
            .engine
            .record_and_drive(request)
            .await
            .expect("the intent is recorded");
        report.expect("the drive ends");
        recorded.operation.operation_id
    }

    /// Moves the clock by `ms` and drives the operation; its status after.
    async fn after_ms(&self, ms: i64, id: OperationId) -> Status {
        self.clock.advance(Duration::milliseconds(ms));
        let report = self.engine.drive(id).await.expect("the drive ends");
        report.state().status.clone()
    }

    fn sends(&self) -> usize {
        self.api.seen().len()
    }

    /// Asserts the refused send is repeated exactly `wait_ms` after it was refused: not at
    /// `wait_ms - 1`, and then it succeeds with the object the API names.
    async fn assert_repeated_after(&self, id: OperationId, wait_ms: i64, created: &str) {
        assert_eq!(self.sends(), 1, "the first send was refused");
        let status = self.after_ms(wait_ms - 1, id).await;
        assert_eq!(status, Status::Pending, "still waiting");
        assert_eq!(
            self.sends(),
            1,
            "not sent again 1 ms before the wait is over"
        );
        let status = self.after_ms(1, id).await;
        assert_eq!(self.sends(), 2, "sent again once the wait is over");
        assert!(
            matches!(&status, Status::Succeeded { external_id } if external_id.as_str() == created),
            "{status:?}"
        );
    }
}

/// HubSpot's 429 as its usage guidelines show it: no `Retry-After`, no reset header, the policy
/// that refused the request in the body.
fn hubspot_429(policy: &str) -> Answer {
    answer(
        429,
        json!({"status": "error", "message": "You have reached your secondly limit.",
               "errorType": "RATE_LIMIT", "correlationId": "c0ffee", "policyName": policy}),
    )
}

fn hubspot_task() -> Value {
    json!({"subject": "Call the client", "due": "2026-12-01T09:00:00Z"})
}

#[tokio::test]
async fn a_429_that_names_no_wait_is_not_sent_again_for_a_second() {
    let rig = Rig::new("hubspot", "create_task").await;
    rig.api.next(hubspot_429("SECONDLY"));
    rig.api
        .next(answer(201, json!({"id": "731", "properties": {}})));
    let id = rig.record_and_send(hubspot_task()).await;
    rig.assert_repeated_after(id, 1_000, "731").await;
}

#[tokio::test]
async fn hubspots_ten_second_rolling_limit_is_waited_out_for_its_whole_window() {
    let rig = Rig::new("hubspot", "create_task").await;
    rig.api.next(hubspot_429("TEN_SECONDLY_ROLLING"));
    rig.api
        .next(answer(201, json!({"id": "732", "properties": {}})));
    let id = rig.record_and_send(hubspot_task()).await;
    rig.assert_repeated_after(id, 10_000, "732").await;
}

#[tokio::test]
async fn a_declared_reset_header_is_honoured_over_the_least_wait() {
    // Pipedrive's 429 names the seconds left in its window in `x-ratelimit-reset`.
    let rig = Rig::new("pipedrive", "create_deal").await;
    rig.api.next(
        answer(
            429,
            json!({"success": false, "error": "Request over limit", "errorCode": 429,
                   "error_info": "Too many requests", "data": null}),
        )
        .header("x-ratelimit-reset", "3"),
    );
    rig.api
        .next(answer(201, json!({"success": true, "data": {"id": 41}})));
    let id = rig.record_and_send(json!({"title": "Acme renewal"})).await;
    rig.assert_repeated_after(id, 3_000, "41").await;
}
