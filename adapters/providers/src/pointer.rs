//! The pointers a search result is recognised by (`label_at`, `account_at`): JSON pointers
//! (RFC 6901) in which a step written `*` means "any element of this array".
//!
//! A provider may list the label among other values in an array whose order it does not document
//! (Pipedrive's deal search lists the matching custom fields' values in `item.custom_fields`):
//! `/item/custom_fields/0` finds the label only when it happens to come first, so a search that
//! holds the object would read as "not found" and the operation would go to a person for nothing.
//! `/item/custom_fields/*` finds it at any position.
//!
//! It must never widen what counts as evidence beyond the value the pointer names: `*` reaches
//! the elements of an array and nothing else (over an object, a string or a number it reaches
//! nothing), and the value reached must still equal the label exactly. A member literally named
//! `*` cannot be named in these two pointers; JSON pointer has no escape for it. The work is
//! bounded by the answer: each element is visited at most once per `*` step, in a body already
//! capped at [`crate::http::MAX_RESPONSE_BODY_BYTES`].

use serde_json::Value;

/// The step that reaches every element of an array.
pub const ANY_ELEMENT_STEP: &str = "*";
/// Most `*` steps one pointer may hold: one array of values per result is what the providers
/// documented here return; two allow an array of objects that each hold an array.
pub const MAX_ANY_STEPS_PER_POINTER: usize = 2;

/// Checks the `*` steps of a pointer that may hold them (`text` is already a JSON pointer):
/// `*` stands alone as a step, at most [`MAX_ANY_STEPS_PER_POINTER`] times.
pub fn check_any_steps(text: &str) -> Result<(), String> {
    let mut any_steps = 0;
    for step in text.split('/').skip(1) {
        if step == ANY_ELEMENT_STEP {
            any_steps += 1;
        } else if step.contains('*') {
            return Err(format!(
                "`{text}` has the step `{step}`; `*` (any element of an array) must be a whole step, e.g. \"/item/custom_fields/*\""
            ));
        }
    }
    if any_steps > MAX_ANY_STEPS_PER_POINTER {
        return Err(format!(
            "`{text}` has {any_steps} `*` steps; at most {MAX_ANY_STEPS_PER_POINTER}"
        ));
    }
    Ok(())
}

/// Refuses a `*` step in a pointer that must name one value (a search's `results` and `id`).
pub fn check_no_any_step(text: &str) -> Result<(), String> {
    if text.split('/').skip(1).any(|step| step.contains('*')) {
        return Err(format!(
            "`{text}` has a `*` step, which only label_at and account_at may hold (a result has one id and a search one results array); name the one value, e.g. \"/data/items\""
        ));
    }
    Ok(())
}

/// Whether any value `pointer` reaches in `json` reads as `wanted` (a string as it is, a number
/// or boolean as JSON writes it).
pub fn any_text_is(json: &Value, pointer: &str, wanted: &str) -> bool {
    reached(json, pointer)
        .into_iter()
        .any(|value| text_equals(value, wanted))
}

/// Every value `pointer` reaches in `json`: one at most without a `*` step.
pub fn reached<'v>(json: &'v Value, pointer: &str) -> Vec<&'v Value> {
    let mut values = vec![json];
    if pointer.is_empty() {
        return values;
    }
    for step in pointer.split('/').skip(1) {
        let next: Vec<&Value> = if step == ANY_ELEMENT_STEP {
            values
                .into_iter()
                .filter_map(Value::as_array)
                .flatten()
                .collect()
        } else {
            let key = step.replace("~1", "/").replace("~0", "~");
            values
                .into_iter()
                .filter_map(|value| member(value, &key))
                .collect()
        };
        if next.is_empty() {
            return next;
        }
        values = next;
    }
    values
}

/// One step as RFC 6901 takes it: an object's member, or an array's element by a decimal index
/// without leading zeros.
fn member<'v>(value: &'v Value, key: &str) -> Option<&'v Value> {
    match value {
        Value::Object(members) => members.get(key),
        Value::Array(elements) => {
            let canonical = key == "0" || (!key.starts_with('0') && !key.is_empty());
            if !canonical || !key.bytes().all(|byte| byte.is_ascii_digit()) {
                return None;
            }
            elements.get(key.parse::<usize>().ok()?)
        }
        _ => None,
    }
}

fn text_equals(value: &Value, wanted: &str) -> bool {
    match value {
        Value::String(text) => text == wanted,
        Value::Number(number) => number.to_string() == wanted,
        Value::Bool(flag) => flag.to_string() == wanted,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_star_step_finds_the_label_at_any_position_of_the_array() {
        let hit = json!({"item": {"id": 7, "custom_fields": ["Acme", "opl-1", "north"]}});
        assert!(any_text_is(&hit, "/item/custom_fields/*", "opl-1"));
        assert!(!any_text_is(&hit, "/item/custom_fields/0", "opl-1"));
        assert!(any_text_is(&hit, "/item/custom_fields/1", "opl-1"));
        assert!(!any_text_is(&hit, "/item/custom_fields/*", "opl-2"));
        assert!(!any_text_is(&hit, "/item/custom_fields/*", "opl"));
    }

    #[test]
    fn a_star_step_reaches_array_elements_only() {
        let hit = json!({"fields": {"a": "opl-1", "*": "opl-2"}, "text": "opl-1", "list": []});
        assert!(!any_text_is(&hit, "/fields/*", "opl-1"));
        assert!(!any_text_is(&hit, "/fields/*", "opl-2"));
        assert!(!any_text_is(&hit, "/text/*", "opl-1"));
        assert!(reached(&hit, "/list/*").is_empty());
        assert!(reached(&hit, "/missing/*").is_empty());
    }

    #[test]
    fn two_star_steps_reach_arrays_inside_arrays_and_numbers_read_as_json_writes_them() {
        let hit = json!({"groups": [{"values": [1, "x"]}, {"values": [731]}, {"other": true}]});
        assert!(any_text_is(&hit, "/groups/*/values/*", "731"));
        assert_eq!(reached(&hit, "/groups/*/values/*").len(), 3);
        assert!(any_text_is(&hit, "/groups/*/other", "true"));
    }

    #[test]
    fn without_a_star_a_pointer_reads_as_rfc_6901_says() {
        let hit = json!({"a/b": {"m~n": ["x", "y"]}, "list": ["p", "q"]});
        assert!(any_text_is(&hit, "/a~1b/m~0n/1", "y"));
        for index in ["01", "-", "", "1x", "+1"] {
            assert!(
                reached(&hit, &format!("/list/{index}")).is_empty(),
                "{index}"
            );
        }
        assert!(any_text_is(&hit, "/list/0", "p"));
        assert_eq!(reached(&hit, ""), vec![&hit]);
    }

    #[test]
    fn a_star_must_be_a_whole_step_and_appear_at_most_twice() {
        assert_eq!(check_any_steps("/item/custom_fields/*"), Ok(()));
        assert_eq!(check_any_steps("/a/*/b/*"), Ok(()));
        assert_eq!(check_any_steps("/label"), Ok(()));
        let error = check_any_steps("/item/custom_fields[*]").expect_err("refused");
        assert!(
            error.contains("the step `custom_fields[*]`")
                && error.contains("\"/item/custom_fields/*\""),
            "{error}"
        );
        assert!(check_any_steps("/a/**").is_err());
        let error = check_any_steps("/*/*/*").expect_err("refused");
        assert!(error.contains("3 `*` steps; at most 2"), "{error}");
        assert!(check_no_any_step("/data/items").is_ok());
        let error = check_no_any_step("/data/*/id").expect_err("refused");
        assert!(error.contains("only label_at and account_at"), "{error}");
    }
}
