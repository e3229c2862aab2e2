//! Search terms: what an operation can be found by besides its binding — its owner and the value
//! of each top-level argument (a task's title, an amount, a customer id). One row per term in
//! `operation_terms`, written with the operation's row when its intent is first folded (batches
//! and the rebuild write it in the same place, `apply::StoredOperation::write`, so both hold the
//! same terms), and indexed by (term, recorded time, operation): a search reads the matching
//! rows in the listing's order and stops at the page's end, however many operations there are.
//!
//! A value is matched whole, normalised (trimmed, lower case, runs of white space as one space)
//! and cut to [`MAX_TERM_VALUE_BYTES`]: "Call  the client" finds "call the client". It must never
//! index a nested object or array (only scalars are values a person types), nor more than
//! [`MAX_TERMS_PER_OPERATION`] terms for one operation, nor a sealed personal value: the log
//! holds it as a token no search text can match (and the read model must hold no plaintext of
//! it), and each token is random, so its term would be a scattered insert of 200 bytes into the
//! index for nothing.

use opledger_domain::personal::SEALED_PREFIX;
use opledger_domain::state::OperationState;
use serde_json::Value;

/// The longest value kept in a term, in bytes; longer values are matched on their first this
/// many bytes (a search is cut the same way).
pub const MAX_TERM_VALUE_BYTES: usize = 200;
/// The longest argument name indexed, in bytes; arguments with longer names are not searchable.
pub const MAX_TERM_NAME_BYTES: usize = 64;
/// The most terms one operation has: its owner and up to this many minus one arguments (in the
/// arguments' name order).
pub const MAX_TERMS_PER_OPERATION: usize = 32;

/// The term of an owner.
pub fn owner_term(owner: &str) -> String {
    format!("owner:{}", normalise(owner))
}

/// The term of argument `name` having `value` (a person's search text, or a stored string).
pub fn argument_term(name: &str, value: &str) -> String {
    format!("arg:{name}={}", normalise(value))
}

/// The terms of an operation, from its intent (none without one).
pub fn terms_of(state: &OperationState) -> Vec<String> {
    let Some(intent) = state.intent.as_ref() else {
        return Vec::new();
    };
    let mut terms = Vec::new();
    if let Some(owner) = &intent.owner {
        terms.push(owner_term(owner.as_str()));
    }
    for (name, value) in intent.args.as_map() {
        if terms.len() >= MAX_TERMS_PER_OPERATION {
            break;
        }
        terms.extend(value_term(name, value));
    }
    terms.sort_unstable();
    terms.dedup();
    debug_assert!(terms.len() <= MAX_TERMS_PER_OPERATION);
    terms
}

/// The term of one top-level argument: none for a name too long, a nested value or a sealed
/// value.
fn value_term(name: &str, value: &Value) -> Option<String> {
    if name.len() > MAX_TERM_NAME_BYTES {
        return None;
    }
    let text = match value {
        Value::String(text) if text.starts_with(SEALED_PREFIX) => return None,
        Value::String(text) => text.clone(),
        Value::Number(number) => number.to_string(),
        Value::Bool(flag) => flag.to_string(),
        Value::Null | Value::Array(_) | Value::Object(_) => return None,
    };
    Some(argument_term(name, &text))
}

/// Trimmed, lower case, white space runs as one space, cut to [`MAX_TERM_VALUE_BYTES`] on a
/// character boundary.
fn normalise(text: &str) -> String {
    let mut normal = String::with_capacity(text.len().min(MAX_TERM_VALUE_BYTES));
    for word in text.split_whitespace() {
        if !normal.is_empty() {
            normal.push(' ');
        }
        for c in word.chars().flat_map(char::to_lowercase) {
            if normal.len() + c.len_utf8() > MAX_TERM_VALUE_BYTES {
                return normal;
            }
            normal.push(c);
        }
    }
    normal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_text_matches_the_stored_value_whatever_its_case_and_spacing() {
        assert_eq!(
            argument_term("title", "  Call  the CLIENT\t"),
            argument_term("title", "call the client")
        );
        assert_ne!(
            argument_term("title", "call the client"),
            argument_term("subject", "call the client")
        );
        let long = "é".repeat(MAX_TERM_VALUE_BYTES);
        let term = argument_term("title", &long);
        assert!(term.len() <= "arg:title=".len() + MAX_TERM_VALUE_BYTES);
        assert_eq!(term, argument_term("title", &format!("{long}and more")));
    }

    #[test]
    fn a_sealed_personal_value_is_no_search_term_while_a_plain_one_is() {
        let sealed = Value::String(format!(
            "{SEALED_PREFIX}0a1b:0190c0de-0000-7000-8000-000000000000:c2VhbGVk"
        ));
        assert_eq!(value_term("email", &sealed), None);
        assert_eq!(
            value_term("title", &Value::String("Call the client".into())),
            Some(argument_term("title", "call the client"))
        );
        assert_eq!(
            value_term("amount", &serde_json::json!(12)),
            Some(argument_term("amount", "12"))
        );
        assert_eq!(value_term("nested", &serde_json::json!({"a": 1})), None);
    }
}
