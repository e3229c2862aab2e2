//! The stored form of an operation's folded state (`operations.folded_state`): compact binary,
//! read back only by this crate (the runner folding an operation's next event, the work queue's
//! migration). Queries never read it; they read the row's columns.
//!
//! Why not JSON, as before schema version 4: the JSON was ~1.1 KB per operation, 60 % of each
//! row and half of a rebuilt file, and encoding it (escaping, RFC 3339 times, hyphenated UUIDs)
//! was a tenth of a rebuild's CPU. Here a UUID is its 16 bytes, a time two fixed integers, a
//! string its length and bytes: about a third of the size, and encoding is mostly copying.
//! serde's compact formats (bincode, postcard) cannot read the state's internally tagged status
//! nor the arguments' JSON values, so the layout is written out here, field by field.
//!
//! Every struct is taken apart with an exhaustive pattern, so a field added to the domain's state
//! fails to compile here until it is stored. A layout change must raise [`FORMAT`] (and the
//! read models' schema version); a value of another format is refused as corrupt, never guessed.
//!
//! Layout, in order: the format byte; the status (a tag byte, and the external id for
//! `succeeded`); then each field of [`OperationState`] in declaration order. An option is a byte
//! (0 none, 1 some) before its value; a string and a list start with their length (LEB128); a
//! `u32` is LEB128; a time is its seconds since 1970 (8 bytes, little-endian, signed) and its
//! nanoseconds (4 bytes); the arguments are their JSON text.

use chrono::{DateTime, Utc};
use opledger_domain::args::{ArgsHash, ArgsSnapshot};
use opledger_domain::event::{Executor, IntentRecorded};
use opledger_domain::ids::{
    AccountId, ActionName, AttemptId, CredentialFingerprint, ExternalObjectId, IdempotencyKey,
    OperationId, OwnerId, ProviderId, SourceId, TenantId, WorkerId,
};
use opledger_domain::state::{AttemptInfo, LookupClaim, OperationState, PendingSince, Status};

/// The layout's version, the first byte of every stored state.
pub(super) const FORMAT: u8 = 1;

/// The intent's flags byte: whether it needs an approval (the only flag format 1 had at first,
/// so states written before steps existed read exactly as before, with the ledger executing),
/// and whether the caller's own code carries it out.
const APPROVAL_FLAG: u8 = 1;
const CALLER_FLAG: u8 = 2;

/// Most elements a stored list may claim: far above the attempt limit, and it stops a corrupt
/// length from reserving gigabytes before the bytes run out.
const MAX_STORED_LIST_LEN: usize = 1 << 16;

/// Why stored bytes are not a state this build wrote.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct StateCodecError(String);

/// Appends the stored form of `state` to `out` (cleared first), so that one buffer serves every
/// row.
pub(super) fn encode_into(state: &OperationState, out: &mut Vec<u8>) {
    let OperationState {
        status,
        intent,
        pending_since,
        attempts,
        first_attempt_at,
        current_attempt,
        attempt_ids,
        retry_not_before,
        unknown_since,
        uncertain_attempts,
        reconciliations,
        next_check_not_before,
        lookup_claim,
        last_error,
        review_reason,
        duplicates,
        updated_at,
    } = state;
    out.clear();
    let mut w = Writer(out);
    w.byte(FORMAT);
    w.status(status);
    w.option(intent.as_ref(), Writer::intent);
    w.option(pending_since.as_ref(), |w, since| {
        w.byte(pending_tag(*since))
    });
    w.varint(*attempts);
    w.option(first_attempt_at.as_ref(), Writer::time);
    w.option(current_attempt.as_ref(), Writer::attempt);
    w.len(attempt_ids.len());
    for attempt_id in attempt_ids {
        w.uuid(attempt_id.as_uuid());
    }
    w.option(retry_not_before.as_ref(), Writer::time);
    w.option(unknown_since.as_ref(), Writer::time);
    w.varint(*uncertain_attempts);
    w.varint(*reconciliations);
    w.option(next_check_not_before.as_ref(), Writer::time);
    w.option(lookup_claim.as_ref(), |w, claim| {
        let LookupClaim {
            worker,
            lease_deadline,
        } = claim;
        w.str(worker.as_str());
        w.time(lease_deadline);
    });
    w.option(last_error.as_deref(), Writer::str);
    w.option(review_reason.as_deref(), Writer::str);
    w.len(duplicates.len());
    for duplicate in duplicates {
        w.str(duplicate.as_str());
    }
    w.option(updated_at.as_ref(), Writer::time);
}

/// The state stored as `bytes` by [`encode_into`].
pub(super) fn decode(bytes: &[u8]) -> Result<OperationState, StateCodecError> {
    let mut r = Reader { bytes, at: 0 };
    let format = r.byte()?;
    if format != FORMAT {
        return Err(StateCodecError(format!(
            "stored state format {format}, this build reads {FORMAT}"
        )));
    }
    let state = OperationState {
        status: r.status()?,
        intent: r.option(Reader::intent)?,
        pending_since: r.option(|r| pending_from(r.byte()?))?,
        attempts: r.varint()?,
        first_attempt_at: r.option(Reader::time)?,
        current_attempt: r.option(Reader::attempt)?,
        attempt_ids: r.list(|r| Ok(AttemptId::from_uuid(r.uuid()?)))?,
        retry_not_before: r.option(Reader::time)?,
        unknown_since: r.option(Reader::time)?,
        uncertain_attempts: r.varint()?,
        reconciliations: r.varint()?,
        next_check_not_before: r.option(Reader::time)?,
        lookup_claim: r.option(|r| {
            Ok(LookupClaim {
                worker: r.id(WorkerId::new)?,
                lease_deadline: r.time()?,
            })
        })?,
        last_error: r.option(Reader::string)?,
        review_reason: r.option(Reader::string)?,
        duplicates: r.list(|r| r.id(ExternalObjectId::new))?,
        updated_at: r.option(Reader::time)?,
    };
    if r.at != bytes.len() {
        return Err(StateCodecError(format!(
            "{} bytes after the stored state",
            bytes.len() - r.at
        )));
    }
    Ok(state)
}

fn pending_tag(since: PendingSince) -> u8 {
    match since {
        PendingSince::Recorded => 0,
        PendingSince::RetryScheduled => 1,
        PendingSince::ReviewerRetry => 2,
    }
}

fn pending_from(tag: u8) -> Result<PendingSince, StateCodecError> {
    Ok(match tag {
        0 => PendingSince::Recorded,
        1 => PendingSince::RetryScheduled,
        2 => PendingSince::ReviewerRetry,
        other => return Err(StateCodecError(format!("unknown pending tag {other}"))),
    })
}

struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn byte(&mut self, value: u8) {
        self.0.push(value);
    }

    fn varint(&mut self, value: u32) {
        self.varint64(u64::from(value));
    }

    fn varint64(&mut self, mut value: u64) {
        while value >= 0x80 {
            // The low seven bits, with the high bit saying more follow.
            self.0.push((value & 0x7f) as u8 | 0x80);
            value >>= 7;
        }
        self.0.push(value as u8);
    }

    fn len(&mut self, len: usize) {
        self.varint64(len as u64);
    }

    fn str(&mut self, value: &str) {
        self.len(value.len());
        self.0.extend_from_slice(value.as_bytes());
    }

    fn uuid(&mut self, value: uuid::Uuid) {
        self.0.extend_from_slice(value.as_bytes());
    }

    fn time(&mut self, value: &DateTime<Utc>) {
        self.0.extend_from_slice(&value.timestamp().to_le_bytes());
        self.0
            .extend_from_slice(&value.timestamp_subsec_nanos().to_le_bytes());
    }

    fn option<T>(&mut self, value: Option<T>, write: impl FnOnce(&mut Self, T)) {
        match value {
            None => self.byte(0),
            Some(value) => {
                self.byte(1);
                write(self, value);
            }
        }
    }

    fn status(&mut self, status: &Status) {
        let tag = match status {
            Status::New => 0,
            Status::AwaitingApproval => 1,
            Status::Denied => 2,
            Status::Pending => 3,
            Status::InFlight => 4,
            Status::Succeeded { .. } => 5,
            Status::Rejected => 6,
            Status::Unknown => 7,
            Status::NeedsReview => 8,
            Status::Abandoned => 9,
        };
        self.byte(tag);
        if let Status::Succeeded { external_id } = status {
            self.str(external_id.as_str());
        }
    }

    fn intent(&mut self, intent: &IntentRecorded) {
        let IntentRecorded {
            operation_id,
            tenant,
            owner,
            provider,
            account,
            credential_fingerprint,
            action,
            args,
            args_hash,
            idempotency_key,
            source_id,
            requires_approval,
            executor,
            at,
        } = intent;
        self.uuid(operation_id.as_uuid());
        self.str(tenant.as_str());
        self.option(owner.as_ref().map(OwnerId::as_str), Writer::str);
        self.str(provider.as_str());
        self.str(account.as_str());
        self.str(credential_fingerprint.as_str());
        self.str(action.as_str());
        // The arguments are JSON values; their JSON text is already compact.
        let json = serde_json::to_string(args).expect("a JSON object always serializes to text");
        self.str(&json);
        self.str(args_hash.as_str());
        self.str(idempotency_key.as_str());
        self.option(source_id.as_ref().map(SourceId::as_str), Writer::str);
        let approval = if *requires_approval { APPROVAL_FLAG } else { 0 };
        let caller = if executor.is_ledger() { 0 } else { CALLER_FLAG };
        self.byte(approval | caller);
        self.time(at);
    }

    fn attempt(&mut self, attempt: &AttemptInfo) {
        let AttemptInfo {
            attempt_id,
            number,
            worker,
            lease_deadline,
            started_at,
            claimed_from,
        } = attempt;
        self.uuid(attempt_id.as_uuid());
        self.varint(*number);
        self.str(worker.as_str());
        self.time(lease_deadline);
        self.time(started_at);
        self.byte(pending_tag(*claimed_from));
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], StateCodecError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len());
        let Some(end) = end else {
            return Err(StateCodecError(format!(
                "the stored state ends at byte {} inside a value of {n} bytes",
                self.bytes.len()
            )));
        };
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn byte(&mut self) -> Result<u8, StateCodecError> {
        Ok(self.take(1)?[0])
    }

    fn varint64(&mut self) -> Result<u64, StateCodecError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(StateCodecError("a stored number is too long".to_string()))
    }

    fn varint(&mut self) -> Result<u32, StateCodecError> {
        let value = self.varint64()?;
        u32::try_from(value)
            .map_err(|_| StateCodecError(format!("stored number {value} is beyond 32 bits")))
    }

    fn len(&mut self) -> Result<usize, StateCodecError> {
        let len = self.varint64()?;
        usize::try_from(len)
            .ok()
            .filter(|len| *len <= self.bytes.len() - self.at)
            .ok_or_else(|| StateCodecError(format!("a stored length {len} runs past the end")))
    }

    fn string(&mut self) -> Result<String, StateCodecError> {
        let len = self.len()?;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| StateCodecError("a stored string is not UTF-8".to_string()))
    }

    fn id<T, E: std::fmt::Display>(
        &mut self,
        make: impl FnOnce(String) -> Result<T, E>,
    ) -> Result<T, StateCodecError> {
        make(self.string()?).map_err(|error| StateCodecError(format!("stored id: {error}")))
    }

    fn uuid(&mut self) -> Result<uuid::Uuid, StateCodecError> {
        let bytes: [u8; 16] = self
            .take(16)?
            .try_into()
            .expect("take returned exactly 16 bytes");
        Ok(uuid::Uuid::from_bytes(bytes))
    }

    fn time(&mut self) -> Result<DateTime<Utc>, StateCodecError> {
        let seconds = i64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes taken"));
        let nanos = u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes taken"));
        DateTime::from_timestamp(seconds, nanos).ok_or_else(|| {
            StateCodecError(format!("stored time {seconds}.{nanos} is out of range"))
        })
    }

    fn option<T>(
        &mut self,
        read: impl FnOnce(&mut Self) -> Result<T, StateCodecError>,
    ) -> Result<Option<T>, StateCodecError> {
        match self.byte()? {
            0 => Ok(None),
            1 => read(self).map(Some),
            other => Err(StateCodecError(format!("unknown option tag {other}"))),
        }
    }

    fn list<T>(
        &mut self,
        mut read: impl FnMut(&mut Self) -> Result<T, StateCodecError>,
    ) -> Result<Vec<T>, StateCodecError> {
        let len = self.len()?;
        if len > MAX_STORED_LIST_LEN {
            return Err(StateCodecError(format!(
                "a stored list of {len} elements is beyond {MAX_STORED_LIST_LEN}"
            )));
        }
        (0..len).map(|_| read(self)).collect()
    }

    fn status(&mut self) -> Result<Status, StateCodecError> {
        Ok(match self.byte()? {
            0 => Status::New,
            1 => Status::AwaitingApproval,
            2 => Status::Denied,
            3 => Status::Pending,
            4 => Status::InFlight,
            5 => Status::Succeeded {
                external_id: self.id(ExternalObjectId::new)?,
            },
            6 => Status::Rejected,
            7 => Status::Unknown,
            8 => Status::NeedsReview,
            9 => Status::Abandoned,
            other => return Err(StateCodecError(format!("unknown status tag {other}"))),
        })
    }

    fn intent(&mut self) -> Result<IntentRecorded, StateCodecError> {
        let operation_id = OperationId::from_uuid(self.uuid()?);
        let tenant = self.id(TenantId::new)?;
        let owner = self.option(|r| r.id(OwnerId::new))?;
        let provider = self.id(ProviderId::new)?;
        let account = self.id(AccountId::new)?;
        let credential_fingerprint = self.id(CredentialFingerprint::new)?;
        let action = self.id(ActionName::new)?;
        let len = self.len()?;
        let args = serde_json::from_slice::<ArgsSnapshot>(self.take(len)?).map_err(|error| {
            StateCodecError(format!("stored arguments are not a JSON object: {error}"))
        })?;
        let text = self.string()?;
        let args_hash = ArgsHash::parse(&text)
            .map_err(|error| StateCodecError(format!("stored args hash: {error}")))?;
        let idempotency_key = self.id(IdempotencyKey::new)?;
        let source_id = self.option(|r| r.id(SourceId::new))?;
        let flags = self.byte()?;
        if flags & !(APPROVAL_FLAG | CALLER_FLAG) != 0 {
            return Err(StateCodecError(format!("unknown flag {flags}")));
        }
        Ok(IntentRecorded {
            operation_id,
            tenant,
            owner,
            provider,
            account,
            credential_fingerprint,
            action,
            args,
            args_hash,
            idempotency_key,
            source_id,
            requires_approval: flags & APPROVAL_FLAG != 0,
            executor: if flags & CALLER_FLAG != 0 {
                Executor::Caller
            } else {
                Executor::Ledger
            },
            at: self.time()?,
        })
    }

    fn attempt(&mut self) -> Result<AttemptInfo, StateCodecError> {
        Ok(AttemptInfo {
            attempt_id: AttemptId::from_uuid(self.uuid()?),
            number: self.varint()?,
            worker: self.id(WorkerId::new)?,
            lease_deadline: self.time()?,
            started_at: self.time()?,
            claimed_from: pending_from(self.byte()?)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(seconds: i64, nanos: u32) -> DateTime<Utc> {
        Utc.timestamp_opt(1_796_000_000 + seconds, nanos)
            .single()
            .expect("a valid time")
    }

    /// A state with every optional part present and every list non-empty.
    fn full_state(status: Status) -> OperationState {
        let args = ArgsSnapshot::parse(
            r#"{"title": "Call \"the\" client", "n": 1.5, "nested": {"a": [1, null]}}"#,
        )
        .expect("valid arguments");
        let uuid = |n: u128| uuid::Uuid::from_u128(n);
        OperationState {
            status,
            intent: Some(IntentRecorded {
                operation_id: OperationId::from_uuid(uuid(1)),
                tenant: TenantId::new("tenant-ä").expect("valid"),
                owner: Some(OwnerId::new("owner").expect("valid")),
                provider: ProviderId::new("crm").expect("valid"),
                account: AccountId::new("acct").expect("valid"),
                credential_fingerprint: CredentialFingerprint::new("fp").expect("valid"),
                action: ActionName::new("create_task").expect("valid"),
                args_hash: args.hash(),
                args,
                idempotency_key: IdempotencyKey::new("opk_1").expect("valid"),
                source_id: Some(SourceId::new("call-1").expect("valid")),
                requires_approval: true,
                executor: Executor::Caller,
                at: at(0, 123_456_789),
            }),
            pending_since: Some(PendingSince::ReviewerRetry),
            attempts: 300,
            first_attempt_at: Some(at(1, 0)),
            current_attempt: Some(AttemptInfo {
                attempt_id: AttemptId::from_uuid(uuid(3)),
                number: 2,
                worker: WorkerId::new("worker-1").expect("valid"),
                lease_deadline: at(31, 5),
                started_at: at(1, 5),
                claimed_from: PendingSince::RetryScheduled,
            }),
            attempt_ids: vec![AttemptId::from_uuid(uuid(2)), AttemptId::from_uuid(uuid(3))],
            retry_not_before: Some(at(-5, 1)),
            unknown_since: Some(at(40, 0)),
            uncertain_attempts: 1,
            reconciliations: u32::MAX,
            next_check_not_before: Some(at(50, 999_999_999)),
            lookup_claim: Some(LookupClaim {
                worker: WorkerId::new("worker-2").expect("valid"),
                lease_deadline: at(60, 0),
            }),
            last_error: Some("timed out after 30 s".to_string()),
            review_reason: Some("no evidence".to_string()),
            duplicates: vec![ExternalObjectId::new("task-2").expect("valid")],
            updated_at: Some(at(61, 0)),
        }
    }

    fn round_trip(state: &OperationState) -> OperationState {
        let mut stored = Vec::new();
        encode_into(state, &mut stored);
        decode(&stored).expect("a stored state decodes")
    }

    #[test]
    fn every_status_and_every_part_of_a_state_comes_back_exactly() {
        let statuses = [
            Status::New,
            Status::AwaitingApproval,
            Status::Denied,
            Status::Pending,
            Status::InFlight,
            Status::Succeeded {
                external_id: ExternalObjectId::new("task-1").expect("valid"),
            },
            Status::Rejected,
            Status::Unknown,
            Status::NeedsReview,
            Status::Abandoned,
        ];
        for status in statuses {
            let full = full_state(status);
            assert_eq!(round_trip(&full), full);
        }
        let initial = OperationState::initial();
        assert_eq!(round_trip(&initial), initial);
    }

    #[test]
    fn a_stored_state_is_a_third_of_its_json() {
        let state = full_state(Status::Succeeded {
            external_id: ExternalObjectId::new("task-1").expect("valid"),
        });
        let mut stored = Vec::new();
        encode_into(&state, &mut stored);
        let json = serde_json::to_string(&state).expect("serializes");
        assert!(
            stored.len() * 2 < json.len(),
            "{} bytes stored, {} as JSON",
            stored.len(),
            json.len()
        );
    }

    #[test]
    fn truncated_extended_or_foreign_bytes_are_refused_not_guessed() {
        let state = full_state(Status::Unknown);
        let mut stored = Vec::new();
        encode_into(&state, &mut stored);
        for cut in 0..stored.len() {
            assert!(decode(&stored[..cut]).is_err(), "cut at {cut} is refused");
        }
        let mut longer = stored.clone();
        longer.push(0);
        assert!(decode(&longer).is_err(), "a trailing byte is refused");
        let mut other_format = stored.clone();
        other_format[0] = FORMAT + 1;
        let error = decode(&other_format).expect_err("another format is refused");
        assert!(error.to_string().contains("format"), "{error}");
        let json = serde_json::to_vec(&state).expect("serializes");
        assert!(
            decode(&json).is_err(),
            "the JSON of versions 1-3 is refused"
        );
    }
}
