//! The application services: load an operation, decide a command against it, append the
//! outcome at the version it was decided on. Generic over the ports, so the same code runs on the
//! memory store in tests and on SQLite or KurrentDB in production.
//!
//! The rule this module must never break: events are appended at the exact version the decision
//! saw. When another writer got there first, the decision is thrown away and made again on the
//! new state — never forced through.

use serde_json::Value;
use tracing::{debug, info, instrument, warn};

use crate::args::{ArgsHash, ArgsSnapshot};
use crate::chain::ChainHash;
use crate::codec::{self, DecodeError};
use crate::command::Command;
use crate::decider::{decide, Rejection};
use crate::error::ValidationError;
use crate::event::{Executor, IntentRecorded, OperationEvent, Principal};
use crate::ids::{
    AccountId, ActionName, ActorId, CredentialFingerprint, OperationId, OwnerId, ProviderId,
    SourceId, StreamVersion, TenantId,
};
use crate::in_span::InSpanExt;
use crate::personal::{self as personal_data, Personal, PersonalData, PersonalDataError};
use crate::ports::{Clock, IdSource};
use crate::state::{evolve, OperationState, Status};
use crate::store::{EventStore, ExpectedVersion, StoreError, StreamName, MAX_READ_BATCH};

/// How many times the same append is sent when the store cannot tell whether it was written.
pub const MAX_UNCLEAR_APPEND_TRIES: usize = 3;

/// How many times a command is decided again after losing a race for the stream version before
/// the caller is told the operation is contended.
pub const MAX_DECIDE_ROUNDS: usize = 16;

/// Why an application command did not complete.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The input was invalid; nothing was written.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The domain refused the command; nothing was written.
    #[error("operation {operation_id}: {rejection}")]
    Rejected {
        /// The operation concerned.
        operation_id: OperationId,
        /// Why.
        rejection: Rejection,
    },
    /// No such operation.
    #[error("operation {operation_id} does not exist; record an intent first")]
    NotFound {
        /// The operation asked for.
        operation_id: OperationId,
    },
    /// A source delivery id was redelivered with a different request.
    #[error("source id `{source_id}` already recorded operation {operation_id} with different {differs}; a new request needs a new source id")]
    SourceReused {
        /// The operation the source id recorded.
        operation_id: OperationId,
        /// The source id.
        source_id: SourceId,
        /// What differs.
        differs: &'static str,
    },
    /// The operation moved on past the version the caller decided on (a person looked at older
    /// evidence); nothing was written.
    #[error("operation {operation_id} is at version {} now, not {}: new evidence arrived; look again before deciding", actual.map_or(0, StreamVersion::value), seen.map_or(0, StreamVersion::value))]
    Moved {
        /// The operation concerned.
        operation_id: OperationId,
        /// The version the caller decided on.
        seen: Option<StreamVersion>,
        /// The version it is at.
        actual: Option<StreamVersion>,
    },
    /// Other writers kept winning the race for the stream.
    #[error("operation {operation_id} changed {rounds} times while deciding; try again")]
    Contended {
        /// The operation concerned.
        operation_id: OperationId,
        /// How many rounds were lost.
        rounds: usize,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored event could not be read.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// Personal data could not be sealed (the key store failed, the subject was erased, or
    /// this ledger has no key store configured).
    #[error(transparent)]
    PersonalData(#[from] crate::personal::PersonalDataError),
}

/// An operation as loaded from its stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedOperation {
    /// Its id.
    pub operation_id: OperationId,
    /// Its folded state.
    pub state: OperationState,
    /// The version of its last event (`None`: no stream).
    pub version: Option<StreamVersion>,
    /// The chain hash of its last event, which the next event links to.
    pub chain: Option<ChainHash>,
    /// The W3C `traceparent` kept with its intent (when trace export was on as it was
    /// recorded): later work on it joins that trace ([`crate::trace_context::continue_from`]).
    pub origin_traceparent: Option<String>,
    /// One sealed token of its intent, when it has personal data (see [`crate::personal`]):
    /// the free text of its later events (the request line, provider errors, evidence) is
    /// sealed under the same subject's key, since a provider may echo a personal value.
    pub sealed_with: Option<String>,
}

/// A request to record an intent, as it arrives from an API or the command line: raw text,
/// validated by [`IntentRequest::validate`] before anything is written.
#[derive(Clone, Debug, PartialEq)]
pub struct IntentRequest {
    /// The tenant.
    pub tenant: String,
    /// Who asks, if known.
    pub owner: Option<String>,
    /// The provider.
    pub provider: String,
    /// The account at the provider.
    pub account: String,
    /// The fingerprint of the account's credentials.
    pub credential_fingerprint: String,
    /// The action.
    pub action: String,
    /// The arguments: a JSON object.
    pub args: Value,
    /// The delivery's id (tool-call id, queue message id), so a redelivery finds this operation.
    pub source_id: Option<String>,
    /// Whether a person must approve before sending.
    pub requires_approval: bool,
}

/// A validated intent request, ready to be recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidIntent {
    tenant: TenantId,
    owner: Option<OwnerId>,
    provider: ProviderId,
    account: AccountId,
    credential_fingerprint: CredentialFingerprint,
    action: ActionName,
    args: ArgsSnapshot,
    source_id: Option<SourceId>,
    requires_approval: bool,
}

impl IntentRequest {
    /// Checks every field; the first problem found is returned, naming its field.
    pub fn validate(self) -> Result<ValidIntent, ValidationError> {
        Ok(ValidIntent {
            tenant: TenantId::new(self.tenant)?,
            owner: self.owner.map(OwnerId::new).transpose()?,
            provider: ProviderId::new(self.provider)?,
            account: AccountId::new(self.account)?,
            credential_fingerprint: CredentialFingerprint::new(self.credential_fingerprint)?,
            action: ActionName::new(self.action)?,
            args: ArgsSnapshot::new(self.args)?,
            source_id: self.source_id.map(SourceId::new).transpose()?,
            requires_approval: self.requires_approval,
        })
    }
}

/// The result of recording an intent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedIntent {
    /// The operation, as it stands now.
    pub operation: LoadedOperation,
    /// `true` when this call created it; `false` when a redelivery found it.
    pub created: bool,
}

impl RecordedIntent {
    /// The recorded intent.
    pub fn intent(&self) -> &IntentRecorded {
        self.operation
            .state
            .intent
            .as_ref()
            .expect("a recorded operation always has its intent")
    }
}

/// The ledger's application services over an event store, a clock and an id source.
#[derive(Clone, Debug)]
pub struct Ledger<S, C, I> {
    store: S,
    clock: C,
    ids: I,
    /// The key store and cipher for personal data; without one, an intent naming a data
    /// subject is refused rather than stored in clear.
    personal: Option<std::sync::Arc<dyn PersonalData>>,
}

impl<S: EventStore, C: Clock, I: IdSource> Ledger<S, C, I> {
    /// Services over these ports.
    pub fn new(store: S, clock: C, ids: I) -> Self {
        Self {
            store,
            clock,
            ids,
            personal: None,
        }
    }

    /// These services, sealing personal data through `personal` (see [`crate::personal`]).
    pub fn with_personal_data(mut self, personal: std::sync::Arc<dyn PersonalData>) -> Self {
        self.personal = Some(personal);
        self
    }

    /// The key store and cipher for personal data, when configured.
    pub fn personal_data(&self) -> Option<&dyn PersonalData> {
        self.personal.as_deref()
    }

    /// The event store underneath.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The clock decisions are made with.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The source of fresh ids and randomness.
    pub fn ids(&self) -> &I {
        &self.ids
    }

    /// Loads an operation by folding its whole stream; an operation never recorded loads as
    /// [`crate::state::Status::New`] with no version.
    pub async fn load(&self, operation_id: OperationId) -> Result<LoadedOperation, AppError> {
        let stream = StreamName::for_operation(operation_id);
        let mut state = OperationState::initial();
        let mut version = None;
        let mut chain = None;
        let mut origin_traceparent = None;
        let mut sealed_with = None;
        loop {
            let from = version.map_or(StreamVersion::FIRST, StreamVersion::next);
            let batch = self
                .store
                .read_stream(&stream, from, MAX_READ_BATCH)
                .await?;
            let full = batch.len() == MAX_READ_BATCH;
            for recorded in &batch {
                // The version held is the version of the last event folded, with none skipped:
                // the next append's expected version rests on it (design rule 5).
                debug_assert_eq!(
                    recorded.version,
                    version.map_or(StreamVersion::FIRST, StreamVersion::next),
                    "`{stream}` skips a version"
                );
                let mut event = codec::decode(recorded)?;
                if recorded.version == StreamVersion::FIRST {
                    origin_traceparent = codec::traceparent_of(&recorded.metadata);
                    sealed_with = personal_data::first_token(&event);
                }
                if sealed_with.is_some() {
                    personal_data::open_event(self.personal_data(), operation_id, &mut event);
                }
                state = evolve(state, &event);
                version = Some(recorded.version);
                chain = codec::chain_of(&recorded.metadata);
            }
            if !full {
                return Ok(LoadedOperation {
                    operation_id,
                    state,
                    version,
                    chain,
                    origin_traceparent,
                    sealed_with,
                });
            }
        }
    }

    /// Loads an operation that must exist.
    pub async fn get(&self, operation_id: OperationId) -> Result<LoadedOperation, AppError> {
        let loaded = self.load(operation_id).await?;
        if loaded.version.is_none() {
            return Err(AppError::NotFound { operation_id });
        }
        Ok(loaded)
    }

    /// Records an intent (design rules 1–3). With a source id the operation id is derived from
    /// (tenant, source id), and a redelivery returns the operation already recorded — decided by
    /// the store's no-stream condition, so two concurrent deliveries still make one operation.
    ///
    /// A redelivery is the same request when it asks for the same provider, account, action,
    /// arguments (by hash), approval requirement and owner; the source id reused for anything else is
    /// refused with [`AppError::SourceReused`]. The credential fingerprint is not compared: it
    /// says what the configuration held when the request arrived, not what was asked, and a
    /// token rotated between two deliveries of one tool call must not turn the second into a
    /// second task. The recorded binding is checked again before the next send.
    pub async fn record_intent(&self, request: IntentRequest) -> Result<RecordedIntent, AppError> {
        self.record_intent_then(request, |_| None).await
    }

    /// The operation an earlier delivery of `request`'s source id recorded, if there is one:
    /// what [`Ledger::record_intent`] would answer for a redelivery, found without the request's
    /// credential fingerprint, which is neither read nor checked. A redelivery must find its
    /// operation whatever changed in the configuration since — the credentials rotated, the
    /// account or the provider removed — so a caller that cannot name the credentials any more
    /// asks this first and refuses only a new intent. `None` without a source id or when the
    /// source is new; [`AppError::SourceReused`] when the recorded intent asked for something
    /// else (see [`Ledger::record_intent`]).
    pub async fn find_redelivery(
        &self,
        request: &IntentRequest,
    ) -> Result<Option<RecordedIntent>, AppError> {
        let Some(source_id) = &request.source_id else {
            return Ok(None);
        };
        let tenant = TenantId::new(request.tenant.clone())?;
        let source_id = SourceId::new(source_id.clone())?;
        let existing = self
            .load(OperationId::for_source(&tenant, &source_id))
            .await?;
        if existing.version.is_none() {
            return Ok(None);
        }
        let provider = ProviderId::new(request.provider.clone())?;
        let account = AccountId::new(request.account.clone())?;
        let action = ActionName::new(request.action.clone())?;
        let owner = request.owner.clone().map(OwnerId::new).transpose()?;
        let asked = Asked {
            source_id: &source_id,
            provider: &provider,
            account: &account,
            action: &action,
            args_hash: ArgsSnapshot::new(request.args.clone())?.hash(),
            requires_approval: request.requires_approval,
            owner: owner.as_ref(),
            executor: Executor::Ledger,
        };
        check_redelivery(existing, &asked).map(Some)
    }

    /// [`Ledger::record_intent`], and in the same append whatever `then` asks for on the state the
    /// new intent leaves (the engine's claim of the first attempt): one durable write instead of
    /// two, and still nothing sent before the intent is on disk, since the send comes after the
    /// append. If the decider refuses the follow-up, or `then` asks for nothing, only the intent
    /// is appended; a redelivery appends nothing and answers the existing operation.
    pub async fn record_intent_then(
        &self,
        request: IntentRequest,
        then: impl FnOnce(&OperationState) -> Option<Command>,
    ) -> Result<RecordedIntent, AppError> {
        self.record_personal_then(request, None, then).await
    }

    /// [`Ledger::record_intent_then`] for an intent with personal data: the values `personal`
    /// names are sealed under its subject's key before anything is hashed or appended, and the
    /// argument hash approvals bind to is keyed with that key (see [`crate::personal`]). The
    /// operation's state, as returned and as loaded later, holds the values opened again.
    pub async fn record_personal_then(
        &self,
        request: IntentRequest,
        personal: Option<Personal>,
        then: impl FnOnce(&OperationState) -> Option<Command>,
    ) -> Result<RecordedIntent, AppError> {
        // The span `#[instrument]` would make, by hand: its future would be an `Instrumented`,
        // which enters the span once more to drop the finished recording (`in_span.rs`).
        let span = tracing::info_span!(
            "record",
            tenant = %request.tenant,
            provider = %request.provider,
            account = %request.account,
            action = %request.action,
            operation_id = tracing::field::Empty,
        );
        self.record_in_span(request, personal, Executor::Ledger, then)
            .in_span(span)
            .await
    }

    /// Records the intent of a step the caller's own code carries out (see
    /// [`crate::event::Executor::Caller`]): the same rules as [`Ledger::record_intent`] — the
    /// same source id finds the same operation, a reused one asking for something else is
    /// refused — but the ledger never sends it. The caller claims each attempt
    /// ([`Command::ClaimStep`]) and reports what its function did.
    pub async fn record_step(&self, request: IntentRequest) -> Result<RecordedIntent, AppError> {
        let span = tracing::info_span!(
            "record_step",
            tenant = %request.tenant,
            provider = %request.provider,
            action = %request.action,
            operation_id = tracing::field::Empty,
        );
        self.record_in_span(request, None, Executor::Caller, |_| None)
            .in_span(span)
            .await
    }

    /// [`Ledger::record_personal_then`] inside its `record` span.
    async fn record_in_span(
        &self,
        request: IntentRequest,
        personal: Option<Personal>,
        executor: Executor,
        then: impl FnOnce(&OperationState) -> Option<Command>,
    ) -> Result<RecordedIntent, AppError> {
        let valid = request.validate()?;
        let operation_id = match &valid.source_id {
            Some(source) => OperationId::for_source(&valid.tenant, source),
            None => self.ids.new_operation_id(),
        };
        tracing::Span::current().record("operation_id", tracing::field::display(operation_id));
        let mut intent = self.frozen_intent(operation_id, &valid);
        intent.executor = executor;
        let sealed = match &personal {
            None => None,
            Some(personal) => {
                let port = self.personal.as_deref().ok_or_else(|| {
                    ValidationError::new(
                        "subject",
                        "names a data subject, but this ledger keeps no personal data: configure [personal_data] with a key-encryption key, or record without a subject",
                    )
                })?;
                let mut sealed_again = false;
                let sealed = loop {
                    let sealed = personal_data::seal_args(
                        port,
                        &valid.tenant,
                        operation_id,
                        personal,
                        &intent.args,
                    )?;
                    // A new subject's key is written with other new keys, one sync for many: it
                    // must be durable before a value sealed under it is. The link of the
                    // operation to its subject is not awaited: it is an index of what the log
                    // holds (each token names its key and operation), written a moment later
                    // with many others, and an erasure writes what is queued before it reads.
                    let token = personal_data::first_token_in(&sealed.args);
                    match port
                        .key_durable(&valid.tenant, &personal.subject, token.as_deref())
                        .await
                    {
                        // Another server stored the new subject's key at the same moment: once
                        // more, under the key it stored (the seal finds it now).
                        Err(PersonalDataError::KeyReplaced) if !sealed_again => {
                            sealed_again = true;
                        }
                        durable => break durable.map(|()| sealed)?,
                    }
                };
                // The state holds the plaintext (it is what is sent); only the stored intent
                // holds the tokens. Both carry the keyed hash.
                intent.args_hash = sealed.args_hash.clone();
                Some(sealed)
            }
        };
        let asked_hash = intent.args_hash.clone();
        // Decide on "nothing recorded yet" without reading: if a redelivery got there first, the
        // no-stream append conflicts, and the existing intent is the answer.
        let fresh = LoadedOperation {
            operation_id,
            state: OperationState::initial(),
            version: None,
            chain: None,
            origin_traceparent: None,
            sealed_with: sealed
                .as_ref()
                .and_then(|sealed| personal_data::first_token_in(&sealed.args)),
        };
        let mut events = self.decide_on(&Command::RecordIntent(intent), &fresh)?;
        let recorded = events.iter().fold(OperationState::initial(), evolve);
        if let Some(follow_up) = then(&recorded) {
            // A refusal is not an error here: the intent alone is recorded, and whoever drives
            // it next meets the refusal with the state that explains it.
            match decide(&follow_up, &recorded, self.clock.now()) {
                Ok(more) => events.extend(more),
                Err(rejection) => {
                    debug!(
                        command = follow_up.name(),
                        ?rejection,
                        "follow-up refused; recording the intent alone"
                    );
                }
            }
        }
        let sealed_args = sealed.map(|sealed| sealed.args);
        match self
            .append_sealed(fresh, &events, sealed_args.as_ref())
            .await
        {
            Ok(operation) => {
                info!(events = events.len(), "intent recorded");
                Ok(RecordedIntent {
                    operation,
                    created: true,
                })
            }
            // Only an operation id derived from a source id can exist already; a fresh random
            // one that does is a store fault, reported as the conflict it is.
            Err(conflict @ StoreError::VersionConflict { .. }) => {
                let Some(source_id) = &valid.source_id else {
                    return Err(conflict.into());
                };
                let operation = self.get(operation_id).await?;
                let mut asked = Asked::of(&valid, source_id, executor);
                asked.args_hash = asked_hash;
                let found = check_redelivery(operation, &asked)?;
                debug!("redelivered source found the existing operation");
                Ok(found)
            }
            Err(error) => Err(error.into()),
        }
    }

    /// The intent `valid` freezes as `operation_id`: a fresh random key, the time now.
    fn frozen_intent(&self, operation_id: OperationId, valid: &ValidIntent) -> IntentRecorded {
        IntentRecorded {
            operation_id,
            tenant: valid.tenant.clone(),
            owner: valid.owner.clone(),
            provider: valid.provider.clone(),
            account: valid.account.clone(),
            credential_fingerprint: valid.credential_fingerprint.clone(),
            action: valid.action.clone(),
            args: valid.args.clone(),
            args_hash: valid.args.hash(),
            idempotency_key: self.ids.new_idempotency_key(),
            source_id: valid.source_id.clone(),
            requires_approval: valid.requires_approval,
            executor: Default::default(),
            at: self.clock.now(),
        }
    }

    /// Approves exactly the snapshot with `args_hash`, with no token named (see
    /// [`Ledger::approve_as`]).
    pub async fn approve(
        &self,
        operation_id: OperationId,
        approver: ActorId,
        args_hash: ArgsHash,
    ) -> Result<LoadedOperation, AppError> {
        self.approve_as(operation_id, approver, None, args_hash)
            .await
    }

    /// Approves exactly the snapshot with `args_hash`, recording the token that decided.
    #[instrument(skip_all, fields(operation_id = %operation_id))]
    pub async fn approve_as(
        &self,
        operation_id: OperationId,
        approver: ActorId,
        principal: Option<Principal>,
        args_hash: ArgsHash,
    ) -> Result<LoadedOperation, AppError> {
        self.execute(
            operation_id,
            &Command::GrantApproval {
                approver,
                principal,
                args_hash,
            },
        )
        .await
    }

    /// Denies the snapshot with `args_hash`, with no token named (see [`Ledger::deny_as`]).
    pub async fn deny(
        &self,
        operation_id: OperationId,
        approver: ActorId,
        args_hash: ArgsHash,
        reason: String,
    ) -> Result<LoadedOperation, AppError> {
        self.deny_as(operation_id, approver, None, args_hash, reason)
            .await
    }

    /// Denies the snapshot with `args_hash`, recording the token that decided; the operation
    /// will never be sent.
    #[instrument(skip_all, fields(operation_id = %operation_id))]
    pub async fn deny_as(
        &self,
        operation_id: OperationId,
        approver: ActorId,
        principal: Option<Principal>,
        args_hash: ArgsHash,
        reason: String,
    ) -> Result<LoadedOperation, AppError> {
        self.execute(
            operation_id,
            &Command::DenyApproval {
                approver,
                principal,
                args_hash,
                reason,
            },
        )
        .await
    }

    /// Decides `command` on the operation's current state and appends the events at the version
    /// decided on; after losing a race, reloads and decides again (up to [`MAX_DECIDE_ROUNDS`]).
    /// Returns the operation as it stands after the command.
    pub async fn execute(
        &self,
        operation_id: OperationId,
        command: &Command,
    ) -> Result<LoadedOperation, AppError> {
        let loaded = self.load(operation_id).await?;
        self.execute_from(loaded, command).await
    }

    /// Like [`Ledger::execute`], but decides first on a state the caller already holds (from the
    /// previous command), saving a read. A stale state costs nothing but a lost race: the append
    /// is conditional on the version, and the next round reloads.
    pub async fn execute_from(
        &self,
        loaded: LoadedOperation,
        command: &Command,
    ) -> Result<LoadedOperation, AppError> {
        let operation_id = loaded.operation_id;
        let mut held = Some(loaded);
        for _ in 0..MAX_DECIDE_ROUNDS {
            // The first round decides on the state handed in; every later one on a fresh load.
            let current = match held.take() {
                Some(current) => current,
                None => self.load(operation_id).await?,
            };
            let events = self.decide_on(command, &current)?;
            if events.is_empty() {
                return Ok(current);
            }
            match self.append_decided(current, &events).await {
                Ok(appended) => {
                    debug!(%operation_id, command = command.name(), events = events.len(), "appended");
                    return Ok(appended);
                }
                Err(StoreError::VersionConflict { actual, .. }) => {
                    debug!(%operation_id, command = command.name(), ?actual, "lost the race for the stream; deciding again");
                }
                Err(error) => return Err(error.into()),
            }
        }
        warn!(%operation_id, command = command.name(), "operation kept changing while deciding");
        Err(AppError::Contended {
            operation_id,
            rounds: MAX_DECIDE_ROUNDS,
        })
    }

    /// Decides `command` once, on exactly `loaded` — the version a person looked at — and appends
    /// only if the stream is still there: if anything was appended meanwhile, nothing is written
    /// and [`AppError::Moved`] says so. Unlike [`Ledger::execute_from`] it never decides again on
    /// evidence the caller has not seen.
    pub async fn execute_on_seen(
        &self,
        loaded: LoadedOperation,
        command: &Command,
    ) -> Result<LoadedOperation, AppError> {
        let operation_id = loaded.operation_id;
        let seen = loaded.version;
        let events = self.decide_on(command, &loaded)?;
        if events.is_empty() {
            return Ok(loaded);
        }
        match self.append_decided(loaded, &events).await {
            Ok(appended) => Ok(appended),
            Err(StoreError::VersionConflict { actual, .. }) => Err(AppError::Moved {
                operation_id,
                seen,
                actual,
            }),
            Err(error) => Err(error.into()),
        }
    }

    /// The decider's events for `command` on `loaded`, or its refusal.
    fn decide_on(
        &self,
        command: &Command,
        loaded: &LoadedOperation,
    ) -> Result<Vec<OperationEvent>, AppError> {
        decide(command, &loaded.state, self.clock.now()).map_err(|rejection| AppError::Rejected {
            operation_id: loaded.operation_id,
            rejection,
        })
    }

    /// Appends `events`, decided on `loaded`, at exactly its version; returns the operation as
    /// it then stands. A version conflict means another writer got there first.
    async fn append_decided(
        &self,
        loaded: LoadedOperation,
        events: &[OperationEvent],
    ) -> Result<LoadedOperation, StoreError> {
        self.append_sealed(loaded, events, None).await
    }

    /// [`Ledger::append_decided`], storing the intent with `sealed_args` in place of its
    /// arguments, and the free text of an operation with personal data sealed (see
    /// [`crate::personal::seal_event`]). The state folds the events as decided, in clear.
    async fn append_sealed(
        &self,
        mut loaded: LoadedOperation,
        events: &[OperationEvent],
        sealed_args: Option<&ArgsSnapshot>,
    ) -> Result<LoadedOperation, StoreError> {
        let expected = ExpectedVersion::from_last(loaded.version);
        // Design rule 5 holds only if the append is conditional on exactly the stream the
        // decision folded: no stream for an operation with no events, its last event otherwise.
        debug_assert_eq!(
            expected == ExpectedVersion::NoStream,
            loaded.state.status == Status::New,
            "operation {}: appending at {expected:?} to a state folded as {}",
            loaded.operation_id,
            loaded.state.status.name()
        );
        debug_assert!(!events.is_empty(), "an empty decision is never appended");
        if loaded.version.is_none() {
            // What `encode_all` is about to keep with the intent, for the drive that follows.
            loaded.origin_traceparent = crate::trace_context::current();
        }
        let stored;
        let to_store = match (&loaded.sealed_with, self.personal.as_deref()) {
            (Some(token), Some(port)) => {
                stored = events
                    .iter()
                    .map(|event| {
                        personal_data::seal_event(
                            port,
                            loaded.operation_id,
                            token,
                            sealed_args,
                            event,
                        )
                    })
                    .collect::<Vec<_>>();
                &stored[..]
            }
            _ => events,
        };
        let (data, chain) = encode_all(
            loaded.operation_id,
            expected,
            to_store,
            loaded.chain.as_ref(),
        );
        let stream = StreamName::for_operation(loaded.operation_id);
        let outcome = self
            .append_resolving_unclear(&stream, expected, data)
            .await?;
        debug_assert_eq!(
            outcome.next_expected.value(),
            expected.first_new_version().value() + events.len() as u64 - 1,
            "the store placed the events of `{stream}` elsewhere than the expected version said"
        );
        loaded.state = events.iter().fold(loaded.state, evolve);
        loaded.version = Some(outcome.next_expected);
        loaded.chain = chain;
        Ok(loaded)
    }

    /// Appends, and when the store cannot say whether the append was written, sends the very
    /// same events again at the same expected version: their ids are deterministic, so the store
    /// answers "already written" or a version conflict, never writes twice. Bounded; if the
    /// outcome stays unclear the caller gets the error and nothing is assumed.
    async fn append_resolving_unclear(
        &self,
        stream: &StreamName,
        expected: ExpectedVersion,
        events: Vec<crate::store::EventData>,
    ) -> Result<crate::store::AppendOutcome, StoreError> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.store.append(stream, expected, events.clone()).await {
                Err(StoreError::AppendOutcomeUnknown { reason, .. })
                    if tries < MAX_UNCLEAR_APPEND_TRIES =>
                {
                    warn!(%stream, %reason, "append outcome unknown; sending the same events again");
                }
                other => return other,
            }
        }
    }
}

/// Encodes `events` to follow `expected` (whose last event has the chain hash `previous`), each
/// with its deterministic id and chain link; returns them and the chain hash of the last one.
pub fn encode_all(
    operation_id: OperationId,
    expected: ExpectedVersion,
    events: &[OperationEvent],
    previous: Option<&ChainHash>,
) -> (Vec<crate::store::EventData>, Option<ChainHash>) {
    let mut version = expected.first_new_version();
    let mut chain = previous.copied();
    let encoded = events
        .iter()
        .map(|event| {
            let (data, link) = codec::encode(operation_id, version, event, chain.as_ref());
            chain = Some(link);
            version = version.next();
            data
        })
        .collect();
    (encoded, chain)
}

/// What a delivery asks for, compared with the intent an earlier delivery of the same source
/// recorded: everything the caller says (provider, account, action, arguments, approval), and
/// nothing the configuration says. The credentials are configuration: a token rotated since the
/// first delivery does not make a redelivery a new request, and the binding is checked again
/// before the next send anyway (design rule 4).
struct Asked<'a> {
    source_id: &'a SourceId,
    provider: &'a ProviderId,
    account: &'a AccountId,
    action: &'a ActionName,
    args_hash: ArgsHash,
    requires_approval: bool,
    owner: Option<&'a OwnerId>,
    executor: Executor,
}

impl<'a> Asked<'a> {
    fn of(valid: &'a ValidIntent, source_id: &'a SourceId, executor: Executor) -> Self {
        Self {
            source_id,
            provider: &valid.provider,
            account: &valid.account,
            action: &valid.action,
            args_hash: valid.args.hash(),
            requires_approval: valid.requires_approval,
            owner: valid.owner.as_ref(),
            executor,
        }
    }
}

/// The recorded operation a redelivery asking for `asked` finds, or why the source id cannot be
/// reused for it.
fn check_redelivery(
    existing: LoadedOperation,
    asked: &Asked<'_>,
) -> Result<RecordedIntent, AppError> {
    let Some(intent) = existing.state.intent.as_ref() else {
        return Err(AppError::NotFound {
            operation_id: existing.operation_id,
        });
    };
    let differs = if intent.provider != *asked.provider || intent.account != *asked.account {
        Some("provider or account")
    } else if intent.action != *asked.action {
        Some("action")
    } else if intent.args_hash != asked.args_hash {
        Some("arguments")
    } else if intent.requires_approval != asked.requires_approval {
        Some("approval requirement")
    } else if intent.owner.as_ref() != asked.owner {
        // The owner is part of what was asked (whose task it is): an HTTP client replaying an
        // Idempotency-Key with another owner sent another request (Stripe compares the body).
        Some("owner")
    } else if intent.executor != asked.executor {
        // A step the caller carries out and a connector's operation are different requests,
        // whatever else they share: one sender per side effect.
        Some("executor (a caller's step or a connector's operation)")
    } else {
        None
    };
    match differs {
        Some(differs) => Err(AppError::SourceReused {
            operation_id: existing.operation_id,
            source_id: asked.source_id.clone(),
            differs,
        }),
        None => Ok(RecordedIntent {
            operation: existing,
            created: false,
        }),
    }
}
