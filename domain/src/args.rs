//! The frozen argument snapshot of an operation and its hash over a canonical JSON form.
//!
//! The hash is a check that a request did not change (an approval covers exactly one snapshot;
//! a retry must send the same arguments). It is never an identity: two identical requests are two
//! operations. The canonical form sorts object keys and drops insignificant whitespace, so the
//! same arguments hash the same whatever order a caller wrote them in.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::fmt;

use crate::error::ValidationError;

/// Largest argument snapshot, in bytes of its canonical JSON form.
pub const MAX_ARGS_BYTES: usize = 64 * 1024;
/// Deepest nesting of arrays and objects accepted in arguments.
pub const MAX_ARGS_DEPTH: usize = 32;

/// The arguments of an operation: a JSON object, validated and frozen at intent time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ArgsSnapshot(Map<String, Value>);

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

/// The hash of an argument snapshot, written `sha256:<64 hex digits>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ArgsHash(String);

impl ArgsHash {
    /// Parses a hash a caller sent back (e.g. with an approval).
    pub fn parse(text: &str) -> Result<Self, ValidationError> {
        let valid = text.strip_prefix("sha256:").is_some_and(|digits| {
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
                "must be `sha256:` followed by 64 lowercase hex digits, as returned when the intent was recorded",
            ))
        }
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

    #[test]
    fn malformed_hashes_are_refused() {
        assert!(ArgsHash::parse("sha256:abc").is_err());
        assert!(ArgsHash::parse(&format!("md5:{}", "a".repeat(64))).is_err());
        assert!(ArgsHash::parse(&format!("sha256:{}", "A".repeat(64))).is_err());
    }
}
