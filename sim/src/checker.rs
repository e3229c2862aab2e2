//! The invariants, checked after every step against the store, the provider's ground truth and
//! the provider's log of every send and lookup, and once more at the end.
//!
//! Each check is written from the outside: it trusts neither the engine nor the decider, only
//! what the store holds and what the provider saw. A broken one is a line naming the
//! operation and what broke; the run's report carries it with the trace before it.

use std::collections::{BTreeMap, BTreeSet};

use opledger_domain::event::{OperationEvent, ReconciliationResult, ReviewDecision};
use opledger_domain::ids::{AttemptId, OperationId};
use opledger_domain::provider::operation_label;
use opledger_domain::state::{evolve, OperationState, Status};

use crate::faults::Faults;
use crate::provider::{kinds_of, DedupKind, LookupKind, SendRecord, SimProvider};
use crate::readmodel::LogEvent;

/// The checker's own fold of every operation, and what it learnt from the history.
#[derive(Debug, Default)]
pub struct Checker {
    states: BTreeMap<OperationId, OperationState>,
    /// Reviewer retries with the duplicate risk accepted, per operation.
    accepted_risk: BTreeMap<OperationId, u32>,
    /// Attempts the ledger recorded as provably not sent.
    not_sent: BTreeSet<AttemptId>,
    /// Attempts sent so far.
    sent: BTreeSet<AttemptId>,
    /// Operations a person approved, as the log says.
    approved: BTreeSet<OperationId>,
    /// How many of the provider's objects were checked.
    objects_checked: usize,
    /// How many of the provider's sends were checked.
    sends_checked: usize,
    violations: Vec<String>,
}

impl Checker {
    /// The violations found so far.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    fn violate(&mut self, faults: &Faults, operation_id: OperationId, what: String) {
        let line = format!("{}: {what}", faults.op_name(operation_id));
        if !self.violations.contains(&line) {
            self.violations.push(line);
        }
    }

    /// Checks each new event of the log, in order: no regression, unknown left only by
    /// evidence, a valid contract or a person, a lookup before every automatic retry.
    pub fn check_events(&mut self, events: &[LogEvent], provider: &SimProvider, faults: &Faults) {
        for logged in events {
            let id = logged.operation_id;
            let before = self
                .states
                .remove(&id)
                .unwrap_or_else(OperationState::initial);
            let after = evolve(before.clone(), &logged.event);
            self.check_step(id, &before, &after, &logged.event, provider, faults);
            self.states.insert(id, after);
        }
    }

    fn check_step(
        &mut self,
        id: OperationId,
        before: &OperationState,
        after: &OperationState,
        event: &OperationEvent,
        provider: &SimProvider,
        faults: &Faults,
    ) {
        if !before.status.may_become(&after.status) {
            self.violate(
                faults,
                id,
                format!(
                    "state regression: {} → {} by {}",
                    before.status.name(),
                    after.status.name(),
                    event.type_name()
                ),
            );
        }
        if before.status == Status::Unknown && after.status != Status::Unknown {
            let left_rightly = matches!(
                event,
                OperationEvent::ReconciliationRecorded(recorded)
                    if matches!(recorded.result, ReconciliationResult::Found { .. })
            ) || matches!(
                event,
                OperationEvent::RetryScheduled(_)
                    | OperationEvent::ReviewRequired(_)
                    | OperationEvent::ReviewResolved(_)
                    | OperationEvent::LateResponseReceived(_)
            );
            if !left_rightly {
                self.violate(
                    faults,
                    id,
                    format!(
                        "left unknown for {} without evidence, contract or person",
                        after.status.name()
                    ),
                );
            }
        }
        match event {
            OperationEvent::RetryScheduled(retry) => {
                self.check_retry(id, before, retry.at.timestamp_millis(), provider, faults);
            }
            OperationEvent::ReviewResolved(resolved)
                if resolved.decision == ReviewDecision::Retry && resolved.accept_duplicate_risk =>
            {
                *self.accepted_risk.entry(id).or_default() += 1;
            }
            OperationEvent::AttemptNotSent(not_sent) => {
                self.not_sent.insert(not_sent.attempt_id);
            }
            // A lookup of an action that has none can only say so: claiming one spends the
            // lookup budget (and its backoff) before the retry or the person that must follow.
            OperationEvent::LookupClaimed(_)
                if after.intent.as_ref().is_some_and(|intent| {
                    kinds_of(intent.action.as_str())
                        .is_some_and(|(_, lookup)| lookup == LookupKind::None)
                }) =>
            {
                self.violate(
                    faults,
                    id,
                    "a lookup claimed for an action that cannot be looked up".into(),
                );
            }
            OperationEvent::ApprovalGranted(_) => {
                self.approved.insert(id);
            }
            OperationEvent::AttemptStarted(_) if !self.may_be_sent(id, after) => {
                self.violate(
                    faults,
                    id,
                    "an attempt claimed without the approval its intent requires".into(),
                );
            }
            _ => {}
        }
        if let (Some(external_id), false) = (after.external_id(), before.external_id().is_some()) {
            let intent = after
                .intent
                .as_ref()
                .expect("a succeeded operation has its intent");
            match provider.object(external_id) {
                None => self.violate(
                    faults,
                    id,
                    format!("succeeded with {external_id}, which the provider does not hold"),
                ),
                Some(object)
                    if object.account != intent.account || object.label != operation_label(id) =>
                {
                    self.violate(
                        faults,
                        id,
                        format!(
                            "succeeded with {external_id}, an object of account {} carrying {}",
                            object.account, object.label
                        ),
                    );
                }
                Some(_) => {}
            }
        }
    }

    /// An automatic retry after an unknown: a lookup since it became unknown (unless the action
    /// cannot be looked up, when none can be made), and a contract that makes the retry safe at
    /// the time it was scheduled.
    fn check_retry(
        &mut self,
        id: OperationId,
        before: &OperationState,
        at_ms: i64,
        provider: &SimProvider,
        faults: &Faults,
    ) {
        let since = before
            .unknown_since
            .map_or(i64::MIN, |at| at.timestamp_millis());
        let can_look_up = before
            .intent
            .as_ref()
            .and_then(|intent| kinds_of(intent.action.as_str()))
            .is_some_and(|(_, lookup)| lookup != LookupKind::None);
        if can_look_up
            && provider
                .last_lookup_ms(id)
                .is_none_or(|looked| looked < since)
        {
            self.violate(
                faults,
                id,
                "an automatic retry without a lookup since the outcome became unknown".into(),
            );
        }
        let Some(intent) = before.intent.as_ref() else {
            return;
        };
        let shape = provider.shape();
        match kinds_of(intent.action.as_str()).map(|(dedup, _)| dedup) {
            Some(DedupKind::Label | DedupKind::Natural) => {}
            Some(DedupKind::Key) => {
                let usable_ms =
                    i64::try_from((shape.key_retention_s - shape.key_margin_s) * 1000).unwrap_or(0);
                let first = before
                    .first_attempt_at
                    .map_or(at_ms, |at| at.timestamp_millis());
                if at_ms >= first + usable_ms {
                    self.violate(faults, id, format!("an automatic retry {} s after the key was first sent, past its retention minus margin", (at_ms - first) / 1000));
                }
            }
            Some(DedupKind::None) | None => {
                self.violate(
                    faults,
                    id,
                    "an automatic retry under no deduplication contract".into(),
                );
            }
        }
    }

    /// Checks the sends the provider received since the last call: each one bound to its
    /// intent (key, account, credentials, arguments) and the one attempt in flight.
    pub fn check_sends(&mut self, provider: &SimProvider, faults: &Faults) {
        let sends = provider.sends_from(self.sends_checked);
        self.sends_checked += sends.len();
        for send in &sends {
            self.check_send(send, faults);
        }
    }

    fn check_send(&mut self, send: &SendRecord, faults: &Faults) {
        let id = send.operation_id;
        if !self.sent.insert(send.attempt_id) {
            self.violate(
                faults,
                id,
                format!("attempt {} sent twice", send.attempt_id),
            );
        }
        let Some(state) = self.states.get(&id).cloned() else {
            self.violate(faults, id, "sent before its intent was recorded".into());
            return;
        };
        // One attempt in flight: what is sent is the operation's current claim, in flight.
        if !(state.status == Status::InFlight && state.is_current_attempt(send.attempt_id)) {
            let status = state.status.name();
            self.violate(faults, id, format!("sent attempt {} while the ledger has it {status}, not its one attempt in flight", send.attempt_id));
        }
        if !self.may_be_sent(id, &state) {
            self.violate(
                faults,
                id,
                "sent without the approval its intent requires".into(),
            );
        }
        let Some(intent) = state.intent.clone() else {
            return;
        };
        let mut differs = Vec::new();
        if send.key != intent.idempotency_key {
            differs.push("key");
        }
        if send.account != intent.account || send.tenant != intent.tenant {
            differs.push("account");
        }
        if send.fingerprint != intent.credential_fingerprint {
            differs.push("credentials");
        }
        if send.args_hash != intent.args_hash {
            differs.push("arguments");
        }
        if send.label != operation_label(id) {
            differs.push("label");
        }
        if !differs.is_empty() {
            self.violate(
                faults,
                id,
                format!("a send whose {} differ from the intent", differs.join(", ")),
            );
        }
    }

    /// Whether the operation may be sent at all: its intent asked for no approval, or a person
    /// granted it (a denied one never may).
    fn may_be_sent(&self, id: OperationId, state: &OperationState) -> bool {
        let required = state
            .intent
            .as_ref()
            .is_some_and(|intent| intent.requires_approval);
        !required || self.approved.contains(&id)
    }

    /// Checks the provider's new objects: one per operation under a key, label or natural
    /// contract; under none, more only after a person's retry with the risk accepted.
    pub fn check_objects(&mut self, provider: &SimProvider, faults: &Faults) {
        let new = provider.objects_from(self.objects_checked);
        self.objects_checked += new.len();
        let labels: BTreeSet<String> = new.into_iter().map(|object| object.label).collect();
        for label in labels {
            let Some(id) = label
                .strip_prefix("opl-")
                .and_then(|id| id.parse::<OperationId>().ok())
            else {
                continue;
            };
            let Some(action) = self
                .states
                .get(&id)
                .and_then(|state| state.intent.as_ref())
                .map(|intent| intent.action.clone())
            else {
                self.violate(
                    faults,
                    id,
                    "the provider holds an object of an operation never recorded".into(),
                );
                continue;
            };
            let objects = provider.objects_with_label(&label);
            let allowed = match kinds_of(action.as_str()).map(|(dedup, _)| dedup) {
                Some(DedupKind::None) | None => {
                    1 + self.accepted_risk.get(&id).copied().unwrap_or(0) as usize
                }
                Some(_) => 1,
            };
            if objects.len() > allowed {
                let names: Vec<String> =
                    objects.iter().map(|object| object.id.to_string()).collect();
                self.violate(
                    faults,
                    id,
                    format!(
                        "the provider holds {} objects for it ({}), {allowed} allowed",
                        objects.len(),
                        names.join(", ")
                    ),
                );
            }
        }
    }

    /// The end-of-run checks of the history: no attempt recorded as not sent was applied.
    pub fn check_not_sent_honest(&mut self, provider: &SimProvider, faults: &Faults) {
        for send in provider.sends() {
            if send.applied && self.not_sent.contains(&send.attempt_id) {
                self.violate(
                    faults,
                    send.operation_id,
                    format!(
                        "attempt {} recorded as not sent, but the provider applied it",
                        send.attempt_id
                    ),
                );
            }
        }
    }

    /// How many of the provider's sends were checked so far.
    pub fn sends_checked(&self) -> usize {
        self.sends_checked
    }

    /// The status of every operation the checker folded.
    pub fn status_of(&self, id: OperationId) -> Option<&Status> {
        self.states.get(&id).map(|state| &state.status)
    }

    /// Records a violation found elsewhere (the end checks, a liveness bound).
    pub fn record(&mut self, line: String) {
        if !self.violations.contains(&line) {
            self.violations.push(line);
        }
    }
}
