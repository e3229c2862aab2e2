//! The frozen argument snapshot of an operation and its hash over a canonical JSON form.
//!
//! The hash is a check that a request did not change (an approval covers exactly one snapshot;
//! a retry must send the same arguments). It is never an identity: two identical requests are two
//! operations. The canonical form sorts object keys and drops insignificant whitespace, so the
//! same arguments hash the same whatever order a caller wrote them in.
//!
//! # Numbers: what "the same arguments" means
//!
//! JSON leaves the meaning of a number to each implementation (RFC 8259 §6). Here a number is
//! its *value* in serde_json's model, and that value is what is recorded, hashed, stored, folded
//! back and sent to the provider; every one of those steps writes it with the same spelling and
//! reads it back to the same value (serde_json's `float_roundtrip` makes the reading exact):
//!
//! - A number written without a fraction or an exponent is an exact integer when it fits in 64
//!   bits (`-9223372036854775808` to `18446744073709551615`): `9007199254740993` (2^53 + 1) stays
//!   `9007199254740993`.
//! - Every other number is an IEEE 754 double, spelled the shortest way that reads back as the
//!   same double, always with a `.` or an exponent: `1e5`, `1E+5` and `100000.00` are one
//!   argument, recorded and sent as `100000.0`; `3.402823466e+38` stays `3.402823466e+38`;
//!   `f64::MAX` is `1.7976931348623157e+308`; the smallest subnormal is `5e-324`.
//! - `1` and `1.0` are different arguments (an integer and a double: providers check types), and
//!   hash differently.
//! - `-0.0` and `0.0` are different arguments (they are different doubles). `-0` has no integer
//!   form in serde_json: it is the double `-0.0`, and is recorded and sent as `-0.0`.
//! - A number that could not be recorded as written is refused when the intent is recorded
//!   ([`check_numbers`]), never rounded silently: an integer beyond 64 bits
//!   (`123456789012345678901234567890`, or `1` followed by 30 zeros: it would become a double),
//!   a double written with more significant digits than it needs (`0.1000000000000000000001`,
//!   `12345678901234567.89`, and `4.9e-324`, which is the double `5e-324`), and a non-zero value
//!   too small for a double (`1e-400`). Values too large for a double (`1e400`) are refused by
//!   the JSON parser. The refusal says what to send instead: the shortest spelling if that
//!   double is what is meant, or the digits as a JSON string.
//! - Every mainstream JSON writer spells doubles the shortest way, so doubles they write are
//!   accepted. Where a double has two shortest spellings (`986091830550457.3` and
//!   `986091830550457.2` are one double, exactly halfway between), both are accepted and
//!   serde_json's is recorded.
//!
//! So two argument snapshots are the same exactly when their canonical JSON texts are the same,
//! and `==` on [`ArgsSnapshot`] says so (serde_json's own `==` would call `-0.0` and `0.0` equal
//! while their hashes differ).
//!
//! Not serde_json's `arbitrary_precision` (numbers kept as their text): it would change number
//! handling for every crate in the build (the HTTP server, the KurrentDB client, the stand), make
//! spelling part of identity (a redelivery that re-serialises `1e5` as `100000.0` would look
//! like changed arguments), and accept numbers such as `1e400` that a provider reading doubles
//! cannot take as written.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::fmt;

use crate::error::ValidationError;

/// Largest argument snapshot, in bytes of its canonical JSON form.
pub const MAX_ARGS_BYTES: usize = 64 * 1024;
/// Deepest nesting of arrays and objects accepted in arguments.
pub const MAX_ARGS_DEPTH: usize = 32;

/// Longest number text quoted in a refusal; the rest is elided, so a megabyte of digits cannot
/// make a megabyte of error message.
const MAX_NUMBER_SHOWN_CHARS: usize = 48;

/// The arguments of an operation: a JSON object, validated and frozen at intent time.
///
/// Equal exactly when their canonical JSON texts (and so their hashes) are equal; see the module
/// docs on numbers.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ArgsSnapshot(Map<String, Value>);

impl PartialEq for ArgsSnapshot {
    fn eq(&self, other: &Self) -> bool {
        self.canonical_json() == other.canonical_json()
    }
}

impl Eq for ArgsSnapshot {}

impl ArgsSnapshot {
    /// Validates `value` as operation arguments: a JSON object within the size and depth limits.
    pub fn new(value: Value) -> Result<Self, ValidationError> {
        let depth = depth(&value);
        let Value::Object(map) = value else {
            return Err(ValidationError::new(
                "args",
                format!(
                    "must be a JSON object such as {{\"title\": \"Call the client\"}}, not {}",
                    kind(&value)
                ),
            ));
        };
        if depth > MAX_ARGS_DEPTH {
            return Err(ValidationError::new(
                "args",
                format!("nest {depth} levels deep; the limit is {MAX_ARGS_DEPTH}"),
            ));
        }
        let snapshot = Self(map);
        let size = snapshot.canonical_json().len();
        if size > MAX_ARGS_BYTES {
            return Err(ValidationError::new(
                "args",
                format!("are {size} bytes as canonical JSON; the limit is {MAX_ARGS_BYTES} bytes. Store large content elsewhere and pass a reference"),
            ));
        }
        Ok(snapshot)
    }

    /// Parses JSON `text` (the `--args` of the command line, say) as operation arguments,
    /// refusing numbers that would not be recorded as written ([`check_numbers`]).
    ///
    /// ```
    /// use opledger_domain::args::ArgsSnapshot;
    /// let args = ArgsSnapshot::parse(r#"{"x": 3.402823466e+38, "n": 1E+5}"#).unwrap();
    /// assert_eq!(args.canonical_json(), r#"{"n":100000.0,"x":3.402823466e+38}"#);
    /// let error = ArgsSnapshot::parse(r#"{"id": 123456789012345678901234567890}"#).unwrap_err();
    /// assert_eq!(error.field, "args.id");
    /// assert!(error.message.contains("as a string"));
    /// ```
    pub fn parse(text: &str) -> Result<Self, ValidationError> {
        let value: Value = serde_json::from_str(text).map_err(|error| {
            ValidationError::new(
                "args",
                format!(
                    "is not valid JSON ({error}); pass an object such as '{{\"title\": \"Call\"}}'"
                ),
            )
        })?;
        check_numbers(text.as_bytes(), "args")?;
        Self::new(value)
    }

    /// Arguments whose sealed values were opened again (see [`crate::personal::open_args`]):
    /// each opened value is the one that passed [`ArgsSnapshot::new`] when it was sealed, or
    /// the short `[erased]` text, so the limits still hold without checking them again.
    pub(crate) fn from_opened(map: Map<String, Value>) -> Self {
        Self(map)
    }

    /// The arguments as a JSON object.
    pub fn as_map(&self) -> &Map<String, Value> {
        &self.0
    }

    /// The canonical JSON text: keys sorted at every level, no whitespace.
    pub fn canonical_json(&self) -> String {
        let mut out = String::new();
        write_object(&self.0, &mut out);
        out
    }

    /// The SHA-256 of the canonical JSON text.
    ///
    /// ```
    /// use opledger_domain::args::ArgsSnapshot;
    /// let a = ArgsSnapshot::new(serde_json::json!({"title": "Call", "due": "tomorrow"})).unwrap();
    /// let b = ArgsSnapshot::new(serde_json::json!({"due": "tomorrow", "title": "Call"})).unwrap();
    /// assert_eq!(a.hash(), b.hash());
    /// ```
    pub fn hash(&self) -> ArgsHash {
        let digest = Sha256::digest(self.canonical_json().as_bytes());
        ArgsHash(format!("sha256:{}", hex(&digest)))
    }
}

/// The prefix of a keyed argument hash.
const KEYED_PREFIX: &str = "hmac-sha256:";

/// The hash of an argument snapshot, written `sha256:<64 hex digits>`; for an operation with
/// personal data, `hmac-sha256:<64 hex digits>`, keyed with its subject's data key (see
/// [`crate::personal::SealedArgs::args_hash`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ArgsHash(String);

impl ArgsHash {
    /// Parses a hash a caller sent back (e.g. with an approval).
    pub fn parse(text: &str) -> Result<Self, ValidationError> {
        let digits = text
            .strip_prefix("sha256:")
            .or_else(|| text.strip_prefix(KEYED_PREFIX));
        let valid = digits.is_some_and(|digits| {
            digits.len() == 64
                && digits
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if valid {
            Ok(Self(text.to_owned()))
        } else {
            Err(ValidationError::new(
                "args_hash",
                "must be `sha256:` (or `hmac-sha256:`) followed by 64 lowercase hex digits, as returned when the intent was recorded",
            ))
        }
    }

    /// A keyed hash from its 32 bytes (HMAC-SHA-256 under a subject's key).
    pub fn keyed(digest: &[u8; 32]) -> Self {
        Self(format!("{KEYED_PREFIX}{}", hex(digest)))
    }

    /// Whether it is keyed (an operation with personal data): only its subject's key can
    /// recompute it.
    pub fn is_keyed(&self) -> bool {
        self.0.starts_with(KEYED_PREFIX)
    }

    /// The hash as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ArgsHash {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<ArgsHash> for String {
    fn from(value: ArgsHash) -> String {
        value.0
    }
}

impl fmt::Display for ArgsHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Refuses the first number in the JSON `text` whose recorded value would be a different number
/// than the one written (see the module docs on numbers); `root` names the document in the
/// refusal's field (`args` gives `args.items[2].price`; `""` gives the path from the top).
///
/// Call it on text serde_json has parsed: it follows JSON's structure without re-checking it.
/// It reads the text, because once parsed, `123456789012345678901234567890` and the double
/// `1.2345678901234568e+29` cannot be told apart.
///
/// ```
/// use opledger_domain::args::check_numbers;
/// assert!(check_numbers(br#"{"x": 1e5, "y": [-0, 9007199254740993]}"#, "args").is_ok());
/// let error = check_numbers(br#"{"args": {"y": [1, 1e-400]}}"#, "").unwrap_err();
/// assert_eq!(error.field, "args.y[1]");
/// ```
pub fn check_numbers(text: &[u8], root: &str) -> Result<(), ValidationError> {
    walk(text, root, false)
}

/// [`check_numbers`], and refuses any object that holds one key twice, at any depth: JSON
/// parsers disagree on which of two `"title"`s counts (serde_json keeps the last, others the
/// first), so the ledger would record one value while a reader of the same request saw the
/// other. `{"a": 1, "a": 2}` is refused, naming the key's place (`args.a`).
///
/// ```
/// use opledger_domain::args::check_json;
/// assert!(check_json(br#"{"a": {"b": 1}, "c": {"b": 2}}"#, "").is_ok());
/// let error = check_json(br#"{"args": {"title": "d1", "title": "d2"}}"#, "").unwrap_err();
/// assert_eq!(error.field, "args.title");
/// ```
pub fn check_json(text: &[u8], root: &str) -> Result<(), ValidationError> {
    walk(text, root, true)
}

fn walk(text: &[u8], root: &str, unique_keys: bool) -> Result<(), ValidationError> {
    let mut stack: Vec<Frame<'_>> = Vec::new();
    let mut at = 0;
    while let Some(&byte) = text.get(at) {
        match byte {
            b'{' => stack.push(Frame::Object {
                key: None,
                awaiting_key: true,
                seen: Vec::new(),
            }),
            b'[' => stack.push(Frame::Array { index: 0 }),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Frame::Object { awaiting_key, .. }) => *awaiting_key = true,
                Some(Frame::Array { index }) => *index += 1,
                None => {}
            },
            b'"' => {
                let end = string_end(text, at);
                let mut twice = false;
                if let Some(Frame::Object {
                    key,
                    awaiting_key,
                    seen,
                }) = stack.last_mut()
                {
                    if *awaiting_key {
                        *key = text.get(at + 1..end.saturating_sub(1));
                        *awaiting_key = false;
                        if unique_keys {
                            let name = key_text(text.get(at..end).unwrap_or_default());
                            twice = seen.contains(&name);
                            seen.push(name);
                        }
                    }
                }
                if twice {
                    return Err(ValidationError::new(
                        path(root, &stack),
                        "is given twice in one object; send each key once (parsers disagree on which of the two counts)",
                    ));
                }
                at = end;
                continue;
            }
            b'-' | b'0'..=b'9' => {
                let length = text[at..]
                    .iter()
                    .position(|b| !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                    .unwrap_or(text.len() - at);
                let token = String::from_utf8_lossy(&text[at..at + length]);
                if let Err(message) = check_number(&token) {
                    return Err(ValidationError::new(path(root, &stack), message));
                }
                at += length;
                continue;
            }
            _ => {}
        }
        at += 1;
    }
    Ok(())
}

/// A key as the JSON string `quoted` (quotes included) means it: escapes undone, so
/// `"t\u0069tle"` is the key `title`.
fn key_text(quoted: &[u8]) -> String {
    serde_json::from_slice::<String>(quoted)
        .unwrap_or_else(|_| String::from_utf8_lossy(quoted).into_owned())
}

/// Where [`check_numbers`] is inside the document.
enum Frame<'a> {
    Object {
        key: Option<&'a [u8]>,
        awaiting_key: bool,
        /// The keys met so far (only when keys are checked).
        seen: Vec<String>,
    },
    Array {
        index: usize,
    },
}

/// The index just past the string that opens at `start`.
fn string_end(text: &[u8], start: usize) -> usize {
    let mut at = start + 1;
    while let Some(&byte) = text.get(at) {
        match byte {
            b'\\' => at += 2,
            b'"' => return at + 1,
            _ => at += 1,
        }
    }
    text.len()
}

fn path(root: &str, stack: &[Frame<'_>]) -> String {
    let mut out = root.to_owned();
    for frame in stack {
        match frame {
            Frame::Object { key: Some(key), .. } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&String::from_utf8_lossy(key));
            }
            Frame::Object { key: None, .. } => {}
            Frame::Array { index } => out.push_str(&format!("[{index}]")),
        }
    }
    out
}

/// Whether the JSON number `written` is recorded as the number written; if not, what to send.
///
/// An integer must stay an exact integer. A double must be written with no more significant
/// digits than the double needs (the shortest spelling that reads back as it, which every
/// mainstream JSON writer produces): more digits than that are digits the double cannot hold,
/// and recording it would silently drop them. Two shortest spellings of one double (a tie such
/// as `986091830550457.3` and `.2`) are the same argument; serde_json's is recorded.
fn check_number(written: &str) -> Result<(), String> {
    let shown = elide(written);
    let number = written.parse::<serde_json::Number>().map_err(|_| {
        format!(
            "holds the number {shown}, which is beyond the range of a double; send it as a string"
        )
    })?;
    let recorded = number.to_string();
    let digits = significant_digits(written);
    let integer = !written.contains(['.', 'e', 'E']);
    // `-0` is the exception the module docs state: it has no integer form and is the double -0.0.
    if integer && !(number.is_i64() || number.is_u64() || digits == 0) {
        return Err(format!(
            "holds the integer {shown}, outside the 64-bit range kept exactly ({} to {}); it would be recorded as the double {recorded}. Send it as a string, e.g. \"{shown}\"",
            i64::MIN,
            u64::MAX
        ));
    }
    let needed = significant_digits(&recorded);
    if digits <= needed {
        return Ok(());
    }
    Err(if needed == 0 {
        format!(
            "holds the number {shown}, too small for a double: it would be recorded as {recorded}. Send {recorded} if that is what you mean, or the digits as a string"
        )
    } else {
        format!(
            "holds the number {shown}, with more digits than a double holds: it would be recorded as {recorded}. Send {recorded} if that is what you mean, or the digits as a string"
        )
    })
}

fn elide(text: &str) -> String {
    if text.len() <= MAX_NUMBER_SHOWN_CHARS {
        text.to_owned()
    } else {
        // Number text is ASCII, so any byte index is a character boundary.
        format!("{}…", &text[..MAX_NUMBER_SHOWN_CHARS])
    }
}

/// How many significant digits a JSON number's text has: its digits before any exponent without
/// leading or trailing zeros (0 for zero).
fn significant_digits(text: &str) -> usize {
    let mantissa = text.split(['e', 'E']).next().unwrap_or_default();
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    digits.trim_start_matches('0').trim_end_matches('0').len()
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn depth(value: &Value) -> usize {
    // Iterative, so hostile input cannot overflow the stack before the limit is checked.
    let mut deepest = 0;
    let mut stack = vec![(value, 1_usize)];
    while let Some((value, level)) = stack.pop() {
        deepest = deepest.max(level);
        match value {
            Value::Array(items) => stack.extend(items.iter().map(|item| (item, level + 1))),
            Value::Object(map) => stack.extend(map.values().map(|item| (item, level + 1))),
            _ => {}
        }
    }
    deepest
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => write_object(map, out),
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        // Scalars have one serde_json spelling (shortest round-trip for floats).
        scalar => out.push_str(&scalar.to_string()),
    }
}

fn write_object(map: &Map<String, Value>, out: &mut String) {
    // Sorted explicitly: serde_json's map order depends on a feature another crate may enable.
    let mut entries: Vec<_> = map.iter().collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out.push('{');
    for (index, (key, value)) in entries.into_iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        out.push_str(&Value::String(key.clone()).to_string());
        out.push(':');
        write_value(value, out);
    }
    out.push('}');
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let args =
            ArgsSnapshot::new(json!({"b": {"y": 1, "x": [2, {"d": 1, "c": 0}]}, "a": "é\n"}))
                .unwrap();
        assert_eq!(
            args.canonical_json(),
            r#"{"a":"é\n","b":{"x":[2,{"c":0,"d":1}],"y":1}}"#
        );
    }

    #[test]
    fn different_arguments_hash_differently() {
        let a = ArgsSnapshot::new(json!({"title": "Call"})).unwrap();
        let b = ArgsSnapshot::new(json!({"title": "Call "})).unwrap();
        assert_ne!(a.hash(), b.hash());
        assert!(ArgsHash::parse(a.hash().as_str()).is_ok());
    }

    #[test]
    fn arguments_that_are_not_an_object_are_refused_with_an_example() {
        let error = ArgsSnapshot::new(json!(["title"])).unwrap_err();
        assert_eq!(error.field, "args");
        assert!(error.message.contains("JSON object"), "{error}");
    }

    #[test]
    fn oversized_and_overdeep_arguments_are_refused() {
        let big = ArgsSnapshot::new(json!({"body": "x".repeat(MAX_ARGS_BYTES)})).unwrap_err();
        assert!(big.message.contains("limit"), "{big}");
        let mut deep = json!(1);
        for _ in 0..MAX_ARGS_DEPTH + 1 {
            deep = json!({ "n": deep });
        }
        assert!(ArgsSnapshot::new(deep).is_err());
    }

    fn recorded(number: &str) -> Result<String, ValidationError> {
        let args = ArgsSnapshot::parse(&format!(r#"{{"n": {number}}}"#))?;
        let canonical = args.canonical_json();
        Ok(canonical["{\"n\":".len()..canonical.len() - 1].to_owned())
    }

    #[test]
    fn numbers_are_recorded_as_the_same_number_in_one_spelling() {
        for (written, spelled) in [
            ("3.402823466e+38", "3.402823466e+38"),
            ("1e5", "100000.0"),
            ("1E+5", "100000.0"),
            ("100000.00", "100000.0"),
            ("1", "1"),
            ("1.0", "1.0"),
            ("-0", "-0.0"),
            ("-0.0", "-0.0"),
            ("0", "0"),
            ("0e999999999999999999999", "0.0"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("5e-324", "5e-324"),
            ("2.2250738585072014E-308", "2.2250738585072014e-308"),
            ("0.30000000000000004", "0.30000000000000004"),
            ("986091830550457.3", "986091830550457.2"),
            ("9007199254740993", "9007199254740993"),
            ("18446744073709551615", "18446744073709551615"),
            ("-9223372036854775808", "-9223372036854775808"),
        ] {
            assert_eq!(recorded(written).as_deref(), Ok(spelled), "{written}");
        }
    }

    #[test]
    fn numbers_that_would_change_are_refused_with_what_to_send() {
        for (written, hint) in [
            ("18446744073709551616", "as a string"),
            ("-9223372036854775809", "as a string"),
            ("1000000000000000000000000000000", "as a string"),
            ("123456789012345678901234567890", "as a string"),
            ("0.1000000000000000000001", "Send 0.1 if"),
            ("12345678901234567.89", "Send 1.2345678901234568e+16 if"),
            ("1e-400", "Send 0.0 if"),
            ("4.9e-324", "Send 5e-324 if"),
        ] {
            let error = recorded(written).unwrap_err();
            assert_eq!(error.field, "args.n", "{written}");
            assert!(error.message.contains(hint), "{written}: {error}");
        }
        let long = format!(
            r#"{{"a": [{{"b": 1}}, {{"c": 0.1{}1}}]}}"#,
            "0".repeat(5000)
        );
        let error = ArgsSnapshot::parse(&long).unwrap_err();
        assert_eq!(error.field, "args.a[1].c");
        assert!(error.message.len() < 400, "{error}");
    }

    #[test]
    fn the_same_arguments_are_equal_exactly_when_their_hashes_are() {
        let parse = |text: &str| ArgsSnapshot::parse(text).unwrap();
        assert_eq!(parse(r#"{"n": 1e5}"#), parse(r#"{"n": 100000.0}"#));
        assert_eq!(
            parse(r#"{"n": 1e5}"#).hash(),
            parse(r#"{"n": 100000.0}"#).hash()
        );
        for (a, b) in [
            (r#"{"n": 1}"#, r#"{"n": 1.0}"#),
            (r#"{"n": -0.0}"#, r#"{"n": 0.0}"#),
            (r#"{"n": -0}"#, r#"{"n": 0}"#),
        ] {
            assert_ne!(parse(a), parse(b), "{a} {b}");
            assert_ne!(parse(a).hash(), parse(b).hash(), "{a} {b}");
        }
    }

    #[test]
    fn numbers_inside_strings_and_keys_are_not_numbers() {
        let text = r#"{"123456789012345678901234567890": "1e-400 \" 4.9e-324", "x": [true, null]}"#;
        assert!(ArgsSnapshot::parse(text).is_ok());
    }

    #[test]
    fn malformed_hashes_are_refused() {
        assert!(ArgsHash::parse("sha256:abc").is_err());
        assert!(ArgsHash::parse(&format!("md5:{}", "a".repeat(64))).is_err());
        assert!(ArgsHash::parse(&format!("sha256:{}", "A".repeat(64))).is_err());
    }
}
