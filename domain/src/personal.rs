//! Personal data: values of a data subject (a person) stored so that they can be erased from an
//! append-only, hash-chained, Merkle-proved log without touching a single stored byte of it.
//!
//! The technique is crypto-shredding. A value named personal is replaced, *before* its event is
//! encoded, hashed and appended, by a sealed token: the value encrypted with an authenticated
//! cipher under its subject's own data key, with the operation bound as associated data. The
//! chain links, the event ids and the Merkle leaves all cover the token. Erasing the subject
//! destroys its data key; the token stays where it is, every proof still verifies, and the value
//! can never be read again: every place that shows it shows [`ERASED`].
//!
//! This module holds the pure part: what a token looks like, which values of the arguments are
//! personal, and the port ([`PersonalData`]) through which the ledger seals and opens them. The
//! keys, the cipher and the key store live in an adapter; nothing here holds a key.
//!
//! What must never happen: a personal value written to the log, a read model, a journal or an
//! export in clear; a token opened for an operation other than the one it was sealed for; an
//! argument hash that lets anyone with the log confirm a guessed personal value (the hash of a
//! sealed operation is keyed with the subject's key, see [`SealedArgs::args_hash`]).

use serde_json::{Map, Value};

use crate::args::{ArgsHash, ArgsSnapshot};
use crate::event::OperationEvent;
use crate::ids::{OperationId, TenantId};

/// Every sealed token starts with this; a string that does not is never a token.
pub const SEALED_PREFIX: &str = "opledger-sealed:v1:";

/// What a sealed value shows once its subject has been erased (or its key cannot be opened).
pub const ERASED: &str = "[erased]";

/// What a sealed value shows where no key store is at hand (a command run without the
/// key-encryption key): it may well be readable elsewhere, so it is not called erased.
pub const SEALED_SHOWN: &str = "[sealed]";

/// The longest subject name accepted, in bytes.
pub const MAX_SUBJECT_BYTES: usize = 256;

/// The most personal-field pointers one operation may declare.
pub const MAX_PERSONAL_POINTERS: usize = 64;

/// Which argument values of an operation are personal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PersonalFields {
    /// Every value of the arguments (each top-level field is sealed on its own, so the field
    /// names stay readable and an erased operation still shows its shape).
    All,
    /// Only the values at these JSON pointers (RFC 6901, e.g. `/email`); pointers that name
    /// nothing in these arguments are skipped.
    Declared(Vec<String>),
}

/// The personal data of one intent: whose it is, and which of its values are personal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Personal {
    /// The data subject, as the caller names them (an e-mail address, a customer number). It is
    /// itself personal: it is never written to the log, only to the key store, sealed.
    pub subject: String,
    /// Which values to seal.
    pub fields: PersonalFields,
}

impl Personal {
    /// Checks the subject name: non-empty after trimming, at most [`MAX_SUBJECT_BYTES`], no
    /// control characters; and the pointers: at most [`MAX_PERSONAL_POINTERS`], each empty or
    /// starting with `/`.
    pub fn check(&self) -> Result<(), crate::error::ValidationError> {
        check_subject(&self.subject)?;
        if let PersonalFields::Declared(pointers) = &self.fields {
            if pointers.len() > MAX_PERSONAL_POINTERS {
                return Err(crate::error::ValidationError::new(
                    "personal",
                    format!(
                        "names {} fields; at most {MAX_PERSONAL_POINTERS} are accepted",
                        pointers.len()
                    ),
                ));
            }
            if let Some(bad) = pointers
                .iter()
                .find(|p| !p.is_empty() && !p.starts_with('/'))
            {
                return Err(crate::error::ValidationError::new(
                    "personal",
                    format!("`{bad}` is not a JSON pointer; write it as `/field` (RFC 6901)"),
                ));
            }
        }
        Ok(())
    }
}

/// Checks a subject name as [`Personal::check`] does.
pub fn check_subject(subject: &str) -> Result<(), crate::error::ValidationError> {
    let problem = if subject.trim().is_empty() {
        Some("is empty; name the person the data is about, e.g. their e-mail address".to_owned())
    } else if subject.len() > MAX_SUBJECT_BYTES {
        Some(format!(
            "is {} bytes long; at most {MAX_SUBJECT_BYTES} are accepted",
            subject.len()
        ))
    } else if subject.chars().any(char::is_control) {
        Some("contains a control character".to_owned())
    } else {
        None
    };
    match problem {
        Some(message) => Err(crate::error::ValidationError::new("subject", message)),
        None => Ok(()),
    }
}

/// An intent's arguments with their personal values sealed, and the keyed hash approvals bind to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealedArgs {
    /// The arguments as stored: each personal value replaced by its token.
    pub args: ArgsSnapshot,
    /// HMAC-SHA-256 of the *plaintext* arguments' canonical JSON under a key derived from the
    /// subject's data key. It binds an approval to exactly the arguments sent, as the plain
    /// hash does, but without the key nobody can test a guess against it; once the key is
    /// destroyed, nobody can at all.
    pub args_hash: ArgsHash,
}

/// Why personal data could not be sealed or the key store not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PersonalDataError {
    /// The subject was erased: nothing new may be recorded under its name.
    #[error("the data subject was erased; nothing more can be recorded for them")]
    Erased,
    /// The key the values were sealed under was not stored: another server stored the
    /// subject's key at the same moment (or its write failed and a later seal made another). The
    /// values must be sealed again, under the key now stored.
    #[error("the data subject's key was stored by another server at the same moment; seal again under it")]
    KeyReplaced,
    /// The key store failed.
    #[error("the key store failed: {0}")]
    KeyStore(String),
    /// The request is not valid.
    #[error(transparent)]
    Invalid(#[from] crate::error::ValidationError),
}

/// The port to the key store and the cipher. Implementations keep the data keys wrapped by a
/// key-encryption key, beside the ledger and never in it.
pub trait PersonalData: Send + Sync + std::fmt::Debug {
    /// Seals one value for `operation` under `subject`'s data key (created on first use,
    /// remembered as belonging to `tenant` and linked to `operation`); returns the token.
    /// `value_json` is the value's JSON text.
    fn seal(
        &self,
        tenant: &TenantId,
        subject: &str,
        operation: OperationId,
        value_json: &str,
    ) -> Result<String, PersonalDataError>;

    /// The keyed argument hash of `args` under `subject`'s data key (see
    /// [`SealedArgs::args_hash`]); created if new, like [`PersonalData::seal`].
    fn keyed_hash(
        &self,
        tenant: &TenantId,
        subject: &str,
        args: &ArgsSnapshot,
    ) -> Result<ArgsHash, PersonalDataError>;

    /// Opens a token sealed for `operation`: the value's JSON text, or `None` when its key is
    /// destroyed (erased), unknown, or the token was not sealed for this operation.
    fn open(&self, operation: OperationId, token: &str) -> Option<String>;

    /// Seals `value_json` for `operation` under the key that sealed `token`; `None` when that
    /// key is destroyed or unknown.
    fn seal_like(&self, token: &str, operation: OperationId, value_json: &str) -> Option<String>;

    /// The keyed argument hash of `args` under the key that sealed `token`; `None` when that
    /// key is destroyed or unknown.
    fn keyed_hash_like(&self, token: &str, args: &ArgsSnapshot) -> Option<ArgsHash>;

    /// Resolves once `subject`'s data key in `tenant` is durable. A key made by a seal may be
    /// written a moment later, together with other new keys (one sync for many); the ledger
    /// awaits this before it appends a value sealed under the key, so that a crash can never
    /// leave a value in the log under a key that was lost. Ready at once for a key written
    /// before (nearly always). `sealed` is a token the seals made: refused when the subject's
    /// stored key is not the one that sealed it.
    fn key_durable(&self, tenant: &TenantId, subject: &str, sealed: Option<&str>) -> Durable<'_>;

    /// Resolves once everything the seals made so far asked to be written is durable: the keys
    /// and the links of operations to their subjects (which an erasure and retention follow).
    /// The ledger does not await the links: a link lost to a crash costs no data (the key alone
    /// seals the values, and an erased subject's operation is held back by its unreadable
    /// arguments at its next step), so links are written a moment later, many in one commit.
    fn all_durable(&self) -> Durable<'_>;
}

/// A wait for the key store's writes (see [`PersonalData::key_durable`]).
pub type Durable<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), PersonalDataError>> + Send + 'a>>;

/// A wait that is over: nothing is pending.
pub fn durable_now<'a>() -> Durable<'a> {
    Box::pin(std::future::ready(Ok(())))
}

/// The first token in an intent's stored arguments, which names the subject's key.
pub fn first_token_in(args: &ArgsSnapshot) -> Option<String> {
    fn find(value: &Value) -> Option<&str> {
        match value {
            Value::String(text) if text.starts_with(SEALED_PREFIX) => Some(text),
            Value::Array(items) => items.iter().find_map(find),
            Value::Object(fields) => fields.values().find_map(find),
            _ => None,
        }
    }
    args.as_map().values().find_map(find).map(str::to_owned)
}

/// The first token of a stored event, when it is an intent with personal data.
pub fn first_token(event: &OperationEvent) -> Option<String> {
    match event {
        OperationEvent::IntentRecorded(intent) => first_token_in(&intent.args),
        _ => None,
    }
}

/// The free text of an event that may repeat what the provider was sent or answered: the
/// request line, errors, evidence, reasons and notes. Ids, times and codes are not in it.
fn texts_mut(event: &mut OperationEvent) -> Vec<&mut String> {
    use OperationEvent as E;
    match event {
        E::AttemptStarted(e) => e.request.iter_mut().collect(),
        E::AttemptRejected(e) => vec![&mut e.message],
        E::OutcomeUnknown(e) => vec![&mut e.error],
        E::AttemptNotSent(e) => vec![&mut e.reason],
        E::ReconciliationRecorded(e) => vec![&mut e.evidence],
        E::RetryScheduled(e) => vec![&mut e.reason],
        E::ReviewRequired(e) => vec![&mut e.reason, &mut e.evidence],
        E::ReviewResolved(e) => vec![&mut e.note],
        E::ApprovalDenied(e) => vec![&mut e.reason],
        E::DuplicateDetected(e) => vec![&mut e.found_by],
        _ => Vec::new(),
    }
}

/// The event as it is stored for an operation with personal data: the intent with
/// `sealed_args` in place of its arguments, every free text sealed under the key that sealed
/// `token` (or [`ERASED`] when that key is gone: a text that cannot be sealed is never stored
/// in clear). Empty texts stay empty.
pub fn seal_event(
    port: &dyn PersonalData,
    operation: OperationId,
    token: &str,
    sealed_args: Option<&ArgsSnapshot>,
    event: &OperationEvent,
) -> OperationEvent {
    let mut stored = event.clone();
    if let (OperationEvent::IntentRecorded(intent), Some(sealed)) = (&mut stored, sealed_args) {
        intent.args = sealed.clone();
    }
    for text in texts_mut(&mut stored) {
        if text.is_empty() || text.starts_with(SEALED_PREFIX) || text == ERASED_REASON {
            continue;
        }
        let json = serde_json::to_string(&*text).expect("a string always serializes");
        *text = port
            .seal_like(token, operation, &json)
            .unwrap_or_else(|| ERASED.to_owned());
    }
    stored
}

/// Opens a stored event of `operation` in place: its intent's arguments and its free text
/// (see [`seal_event`]); what cannot be opened shows [`ERASED`].
pub fn open_event(
    port: Option<&dyn PersonalData>,
    operation: OperationId,
    event: &mut OperationEvent,
) {
    if let OperationEvent::IntentRecorded(intent) = event {
        if let Some(opened) = open_args(port, operation, &intent.args) {
            intent.args = opened;
        }
    }
    for text in texts_mut(event) {
        if text.starts_with(SEALED_PREFIX) {
            *text = port
                .and_then(|port| port.open(operation, text))
                .and_then(|json| serde_json::from_str::<String>(&json).ok())
                .unwrap_or_else(|| unreadable(port).to_owned());
        }
    }
}

/// Seals `args` as `personal` says; the token of each sealed value replaces it.
pub fn seal_args(
    port: &dyn PersonalData,
    tenant: &TenantId,
    operation: OperationId,
    personal: &Personal,
    args: &ArgsSnapshot,
) -> Result<SealedArgs, PersonalDataError> {
    personal.check()?;
    let args_hash = port.keyed_hash(tenant, &personal.subject, args)?;
    let mut map = args.as_map().clone();
    let seal = |value: &mut Value| -> Result<(), PersonalDataError> {
        let text = serde_json::to_string(&*value).expect("a JSON value always serializes");
        *value = Value::String(port.seal(tenant, &personal.subject, operation, &text)?);
        Ok(())
    };
    match &personal.fields {
        PersonalFields::All => {
            for value in map.values_mut() {
                seal(value)?;
            }
        }
        PersonalFields::Declared(pointers) => {
            let mut root = Value::Object(map);
            for pointer in pointers {
                if let Some(value) = root.pointer_mut(pointer) {
                    if !is_token(value) {
                        seal(value)?;
                    }
                }
            }
            let Value::Object(sealed) = root else {
                unreachable!("the root stays an object")
            };
            map = sealed;
        }
    }
    // A sealed value is a string no longer than the limits the plaintext passed, plus a
    // bounded overhead; re-checking keeps the snapshot's own invariants in one place.
    let args = ArgsSnapshot::new(Value::Object(map)).map_err(PersonalDataError::Invalid)?;
    Ok(SealedArgs { args, args_hash })
}

fn is_token(value: &Value) -> bool {
    matches!(value, Value::String(text) if text.starts_with(SEALED_PREFIX))
}

/// Opens every token in `value` that was sealed for `operation`: the plaintext value where its
/// key is alive, [`ERASED`] where it is not. Returns whether any token was met.
pub fn open_value(
    port: Option<&dyn PersonalData>,
    operation: OperationId,
    value: &mut Value,
) -> bool {
    match value {
        Value::String(text) if text.starts_with(SEALED_PREFIX) => {
            let opened = port.and_then(|port| port.open(operation, text));
            *value = opened
                .and_then(|json| serde_json::from_str(&json).ok())
                .unwrap_or_else(|| Value::String(unreadable(port).to_owned()));
            true
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |met, item| open_value(port, operation, item) | met),
        Value::Object(fields) => fields
            .values_mut()
            .fold(false, |met, field| open_value(port, operation, field) | met),
        _ => false,
    }
}

/// Opens the tokens anywhere in a JSON document whose operations are not known in advance (a
/// listing, an event page, a timeline): each token names the operation it was sealed for, and is
/// opened for that one only. A string that is a token becomes its value; a token inside a longer
/// text (a timeline line quoting the arguments) is replaced by its value's text.
pub fn open_anywhere(port: Option<&dyn PersonalData>, value: &mut Value) -> bool {
    match value {
        Value::String(text) if text.starts_with(SEALED_PREFIX) && token_len(text) == text.len() => {
            *value = open_token(port, text)
                .and_then(|json| serde_json::from_str::<Value>(&json).ok())
                .unwrap_or_else(|| Value::String(unreadable(port).to_owned()));
            true
        }
        Value::String(text) if text.contains(SEALED_PREFIX) => {
            *text = open_in_text(port, text);
            true
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |met, item| open_anywhere(port, item) | met),
        Value::Object(fields) => fields
            .values_mut()
            .fold(false, |met, field| open_anywhere(port, field) | met),
        _ => false,
    }
}

/// The length of the token at the start of `text`: the prefix and the characters a token is
/// written with (hex, digits, `-`, `_`, `:` and base64url letters).
fn token_len(text: &str) -> usize {
    SEALED_PREFIX.len()
        + text[SEALED_PREFIX.len()..]
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':'))
            .count()
}

/// The JSON text of the value a token holds, opened for the operation it names.
fn open_token(port: Option<&dyn PersonalData>, token: &str) -> Option<String> {
    let operation = token_operation(token)?;
    port?.open(operation, token)
}

/// `text` with every token in it replaced by its value's text (a string's characters, any
/// other value's JSON), or by [`ERASED`].
pub fn open_in_text(port: Option<&dyn PersonalData>, text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(SEALED_PREFIX) {
        out.push_str(&rest[..start]);
        let token_text = &rest[start..];
        let len = token_len(token_text);
        let shown = open_token(port, &token_text[..len]).map(|json| {
            match serde_json::from_str::<Value>(&json) {
                Ok(Value::String(plain)) => plain,
                _ => json,
            }
        });
        out.push_str(shown.as_deref().unwrap_or(unreadable(port)));
        rest = &token_text[len..];
    }
    out.push_str(rest);
    out
}

/// A JSON document's text with every token in it opened, as [`open_anywhere`] would on its
/// parsed value, without parsing it: a token that is a whole string becomes its value's JSON,
/// one inside a longer string its value's text (escaped for the string), one that does not
/// open [`ERASED`] (or [`SEALED_SHOWN`]). `None` when `json` holds no token. Answers are opened
/// this way on their way out: a parse and a serialization of every answer cost more than the
/// sealing itself.
pub fn open_in_json(port: Option<&dyn PersonalData>, json: &str) -> Option<String> {
    let first = json.find(SEALED_PREFIX)?;
    let mut out = String::with_capacity(json.len() + json.len() / 4);
    let mut copied = 0;
    let mut at = first;
    loop {
        let len = token_len(&json[at..]);
        let token = &json[at..at + len];
        let opened = open_token(port, token);
        let before = &json.as_bytes()[..at];
        let after = &json[at + len..];
        let whole = before.last() == Some(&b'"')
            && before[..before.len() - 1]
                .iter()
                .rev()
                .take_while(|b| **b == b'\\')
                .count()
                % 2
                == 0
            && after.starts_with('"');
        if whole && after[1..].trim_start().starts_with(':') {
            // A name, never opened (no name is sealed).
            out.push_str(&json[copied..at + len]);
            copied = at + len;
        } else if whole {
            // `"token"` becomes the value's JSON, quotes and all.
            out.push_str(&json[copied..at - 1]);
            match opened.filter(|text| serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok())
            {
                Some(value_json) => out.push_str(&value_json),
                None => out.push_str(&Value::String(unreadable(port).to_owned()).to_string()),
            }
            copied = at + len + 1;
        } else {
            out.push_str(&json[copied..at]);
            let shown = opened.map(|text| match serde_json::from_str::<Value>(&text) {
                Ok(Value::String(plain)) => plain,
                _ => text,
            });
            let escaped =
                Value::String(shown.unwrap_or_else(|| unreadable(port).to_owned())).to_string();
            out.push_str(&escaped[1..escaped.len() - 1]);
            copied = at + len;
        }
        match json[copied..].find(SEALED_PREFIX) {
            Some(next) => at = copied + next,
            None => break,
        }
    }
    out.push_str(&json[copied..]);
    Some(out)
}

/// The arguments with every token opened for `operation` (see [`open_value`]).
pub fn open_args(
    port: Option<&dyn PersonalData>,
    operation: OperationId,
    args: &ArgsSnapshot,
) -> Option<ArgsSnapshot> {
    let mut value = Value::Object(args.as_map().clone());
    if !open_value(port, operation, &mut value) {
        return None;
    }
    let Value::Object(map) = value else {
        unreachable!("the root stays an object")
    };
    Some(ArgsSnapshot::from_opened(map))
}

/// Whether any value of `args` is a sealed token.
pub fn has_tokens(args: &ArgsSnapshot) -> bool {
    fn any(value: &Value) -> bool {
        match value {
            Value::String(_) => is_token(value),
            Value::Array(items) => items.iter().any(any),
            Value::Object(fields) => fields.values().any(any),
            _ => false,
        }
    }
    args.as_map().values().any(any)
}

/// What a token that does not open shows: [`ERASED`] where a key store was asked,
/// [`SEALED_SHOWN`] where there is none.
fn unreadable(port: Option<&dyn PersonalData>) -> &'static str {
    if port.is_some() {
        ERASED
    } else {
        SEALED_SHOWN
    }
}

/// Whether any value of `args` did not open ([`ERASED`], or [`SEALED_SHOWN`] without a key
/// store): the operation cannot be sent with them, and never is.
pub fn is_erased(args: &Map<String, Value>) -> bool {
    fn any(value: &Value) -> bool {
        match value {
            Value::String(text) => text == ERASED || text == SEALED_SHOWN,
            Value::Array(items) => items.iter().any(any),
            Value::Object(fields) => fields.values().any(any),
            _ => false,
        }
    }
    args.values().any(any)
}

/// The token's layout: `opledger-sealed:v1:<key id>:<operation id>:<base64url sealed bytes>`.
/// The key id and the operation are in the clear (neither is personal: the key id is random);
/// the operation is also the associated data the cipher authenticates, so a token copied into
/// another operation does not open.
pub fn token_parts(token: &str) -> Option<(&str, &str, &str)> {
    let rest = token.strip_prefix(SEALED_PREFIX)?;
    let mut parts = rest.splitn(3, ':');
    Some((parts.next()?, parts.next()?, parts.next()?))
}

/// The first token anywhere in `value`: a string that is one, or one inside a longer text (a
/// sentence quoting a sealed reason).
pub fn first_token_anywhere(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => text.find(SEALED_PREFIX).map(|start| {
            let token = &text[start..];
            token[..token_len(token)].to_owned()
        }),
        Value::Array(items) => items.iter().find_map(first_token_anywhere),
        Value::Object(fields) => fields.values().find_map(first_token_anywhere),
        _ => None,
    }
}

/// The operation a token was sealed for.
pub fn token_operation(token: &str) -> Option<OperationId> {
    let (_, operation, _) = token_parts(token)?;
    operation
        .parse::<uuid::Uuid>()
        .ok()
        .map(OperationId::from_uuid)
}

/// The event type of an erasure.
pub const SUBJECT_ERASED: &str = "SubjectErased";

/// Why an operation whose data subject was erased goes to a person instead of being sent.
/// Stored in clear (it holds nothing personal), so the person reads why.
pub const ERASED_REASON: &str = "the data subject of this operation was erased: its personal arguments can no longer be read, so it can never be sent; resolve it as given up (or confirm the object the provider already made)";

/// A data subject was erased: their data key was destroyed, and every value sealed under it
/// reads [`ERASED`] from now on. The fact carries no personal data: not the subject's name,
/// not a value; only the random id of the destroyed key. It is the first and only event of its
/// own stream, `subject-<key id>`, so it is hashed, chained and proved like every other event.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SubjectErased {
    /// The destroyed key's id (random; not personal).
    pub key_id: String,
    /// The tenant whose subject it was.
    pub tenant: TenantId,
    /// Who erased: an operator's token, or the retention worker.
    pub erased_by: crate::event::Principal,
    /// Why, in the operator's words (a request's reference, not the person's name), or the
    /// retention rule.
    pub reason: String,
    /// How many operations had values sealed under the key.
    pub operations: u64,
    /// When.
    #[serde(with = "crate::timestamp")]
    pub at: chrono::DateTime<chrono::Utc>,
}

impl SubjectErased {
    /// The stream of the erasure of key `key_id`.
    pub fn stream(key_id: &str) -> Result<crate::store::StreamName, crate::store::StoreError> {
        crate::store::StreamName::new(format!("subject-{key_id}"))
    }

    /// The uuid a `subject-<key id>` stream is named by, as an operation stream is by its
    /// operation's.
    pub fn stream_uuid(stream: &str) -> Option<uuid::Uuid> {
        uuid::Uuid::parse_str(stream.strip_prefix("subject-")?).ok()
    }

    /// The event as stored: its id derived as an operation event's is (the key id in the
    /// operation's place), so `opledger verify` and the offline verifier check it the same way;
    /// its chain link as the first event of its stream.
    pub fn encode(&self) -> crate::store::EventData {
        let data = serde_json::to_vec(self).expect("plain data always serializes");
        let chain = crate::chain::link(
            None,
            crate::ids::StreamVersion::FIRST,
            SUBJECT_ERASED,
            &data,
        );
        let metadata = crate::codec::EventMetadata {
            schema_version: crate::codec::SCHEMA_VERSION,
            chain: Some(chain.to_hex()),
            traceparent: None,
        };
        let key = uuid::Uuid::parse_str(&self.key_id).unwrap_or_else(|_| {
            uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, self.key_id.as_bytes())
        });
        crate::store::EventData {
            event_id: crate::ids::EventId::for_operation_event(
                OperationId::from_uuid(key),
                crate::ids::StreamVersion::FIRST,
                self.at,
                SUBJECT_ERASED,
                &data,
            ),
            event_type: SUBJECT_ERASED.to_owned(),
            data,
            metadata: serde_json::to_vec(&metadata).expect("plain data always serializes"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// A toy port: "seals" by remembering the value under a counter; erasing forgets them all.
    #[derive(Debug, Default)]
    struct Remembering(Mutex<HashMap<String, String>>);

    impl PersonalData for Remembering {
        fn seal(
            &self,
            _: &TenantId,
            _: &str,
            operation: OperationId,
            json: &str,
        ) -> Result<String, PersonalDataError> {
            let mut values = self.0.lock().unwrap();
            let token = format!("{SEALED_PREFIX}k:{operation}:{}", values.len());
            values.insert(token.clone(), json.to_owned());
            Ok(token)
        }
        fn keyed_hash(
            &self,
            _: &TenantId,
            _: &str,
            _: &ArgsSnapshot,
        ) -> Result<ArgsHash, PersonalDataError> {
            Ok(ArgsHash::keyed(&[0xab; 32]))
        }
        fn open(&self, operation: OperationId, token: &str) -> Option<String> {
            (token_operation(token) == Some(operation))
                .then(|| self.0.lock().unwrap().get(token).cloned())?
        }
        fn seal_like(&self, _: &str, operation: OperationId, json: &str) -> Option<String> {
            self.seal(&TenantId::new("t").unwrap(), "s", operation, json)
                .ok()
        }
        fn keyed_hash_like(&self, _: &str, _: &ArgsSnapshot) -> Option<ArgsHash> {
            None
        }
        fn key_durable(&self, _: &TenantId, _: &str, _: Option<&str>) -> Durable<'_> {
            durable_now()
        }
        fn all_durable(&self) -> Durable<'_> {
            durable_now()
        }
    }

    fn args(text: &str) -> ArgsSnapshot {
        ArgsSnapshot::parse(text).unwrap()
    }

    #[test]
    fn declared_fields_are_sealed_and_open_again_while_the_key_lives() {
        let port = Remembering::default();
        let operation = OperationId::from_uuid(uuid::Uuid::from_u128(1));
        let tenant = TenantId::new("acme").unwrap();
        let personal = Personal {
            subject: "ann@example.com".into(),
            fields: PersonalFields::Declared(vec!["/email".into(), "/missing".into()]),
        };
        let plain = args(r#"{"email":"ann@example.com","title":"call"}"#);
        let sealed = seal_args(&port, &tenant, operation, &personal, &plain).unwrap();
        assert!(
            !sealed.args.canonical_json().contains("ann@"),
            "{}",
            sealed.args.canonical_json()
        );
        assert!(sealed.args.canonical_json().contains(r#""title":"call""#));
        assert!(has_tokens(&sealed.args));
        assert_eq!(open_args(Some(&port), operation, &sealed.args), Some(plain));
        let other = OperationId::from_uuid(uuid::Uuid::from_u128(2));
        let moved = open_args(Some(&port), other, &sealed.args).unwrap();
        assert!(
            is_erased(moved.as_map()),
            "a token opens for its own operation only"
        );
        port.0.lock().unwrap().clear();
        let erased = open_args(Some(&port), operation, &sealed.args).unwrap();
        assert_eq!(
            erased.canonical_json(),
            r#"{"email":"[erased]","title":"call"}"#
        );
    }

    #[test]
    fn all_fields_seals_each_top_level_value_and_keeps_the_names() {
        let port = Remembering::default();
        let operation = OperationId::from_uuid(uuid::Uuid::from_u128(1));
        let personal = Personal {
            subject: "s".into(),
            fields: PersonalFields::All,
        };
        let sealed = seal_args(
            &port,
            &TenantId::new("t").unwrap(),
            operation,
            &personal,
            &args(r#"{"a":{"b":1},"c":[2]}"#),
        )
        .unwrap();
        let map = sealed.args.as_map();
        assert!(map.values().all(is_token));
        assert_eq!(map.keys().collect::<Vec<_>>(), ["a", "c"]);
    }

    #[test]
    fn a_subject_must_name_someone() {
        assert!(check_subject("  ").is_err());
        assert!(check_subject(&"x".repeat(MAX_SUBJECT_BYTES + 1)).is_err());
        assert!(check_subject("line\nbreak").is_err());
        assert!(check_subject("ann@example.com").is_ok());
    }

    #[test]
    fn an_answers_text_opens_as_its_parsed_value_would_whatever_the_tokens_place() {
        let port = Remembering::default();
        let tenant = TenantId::new("t").unwrap();
        let operation = OperationId::from_uuid(uuid::Uuid::from_u128(1));
        let email = port
            .seal(&tenant, "s", operation, r#""ann \"a\" @example.com""#)
            .unwrap();
        let amount = port.seal(&tenant, "s", operation, "12.5").unwrap();
        let gone = format!("{SEALED_PREFIX}k:{operation}:99");
        let answers = [
            format!(r#"{{"args":{{"email":"{email}","amount":"{amount}","note":"plain"}}}}"#),
            format!(
                r#"{{"error":"the CRM refused {email} (amount {amount})","list":["{gone}", 3]}}"#
            ),
            format!(r#"{{"quoted":"said \"{email}\" twice: {email}", "ends": "x{email}"}}"#),
            format!(r#"{{ "{email}" : "{email}" }}"#),
            r#"{"nothing":"sealed here"}"#.to_owned(),
        ];
        for answer in &answers {
            let mut parsed: Value = serde_json::from_str(answer).unwrap();
            let met = open_anywhere(Some(&port), &mut parsed);
            match open_in_json(Some(&port), answer) {
                Some(opened) => {
                    assert!(met, "{answer}");
                    let reparsed: Value = serde_json::from_str(&opened)
                        .unwrap_or_else(|error| panic!("{opened} is not JSON: {error}"));
                    assert_eq!(reparsed, parsed, "{answer}");
                }
                None => assert!(!met, "{answer}"),
            }
        }
        let opened = open_in_json(Some(&port), &answers[0]).unwrap();
        assert!(opened.contains(r#""amount":12.5"#), "{opened}");
        assert!(open_in_json(Some(&port), &answers[1])
            .unwrap()
            .contains(ERASED));
        assert!(open_in_json(None, &answers[0])
            .unwrap()
            .contains(SEALED_SHOWN));
    }
}
