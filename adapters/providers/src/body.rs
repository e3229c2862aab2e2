//! Request bodies: merging a body over its base, and writing it as JSON or as a form.
//!
//! A body is a [`serde_json::Value`] tree until the last step, which serializes it; nothing here
//! concatenates JSON text. Form encoding flattens nested objects and arrays with brackets the way
//! Stripe reads them (`metadata[order]=7`, `items[0][price]=p`).

use serde_json::{Map, Value};

/// How a request's body is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyEncoding {
    /// `application/json`.
    Json,
    /// `application/x-www-form-urlencoded`, nested values flattened with brackets.
    Form,
    /// No body at all.
    None,
}

impl BodyEncoding {
    /// The name written in a connector file.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Form => "form",
            Self::None => "none",
        }
    }

    /// The `Content-Type` of a body in this encoding.
    pub const fn content_type(self) -> Option<&'static str> {
        match self {
            Self::Json => Some("application/json"),
            Self::Form => Some("application/x-www-form-urlencoded"),
            Self::None => None,
        }
    }
}

/// `over` merged into `base`: objects merge key by key (recursively), anything else in `over`
/// replaces what `base` holds. So a connector's `opledger_label = "{{label}}"` always wins over a
/// field of that name the arguments bring.
pub fn merge(base: Value, over: Value) -> Value {
    match (base, over) {
        (Value::Object(mut base), Value::Object(over)) => {
            for (key, value) in over {
                let merged = match base.remove(&key) {
                    Some(old) => merge(old, value),
                    None => value,
                };
                base.insert(key, merged);
            }
            Value::Object(base)
        }
        (_, over) => over,
    }
}

/// The bytes of `body` in `encoding`; an error when a form body is not an object (a form is a
/// list of named fields). `None` encoding gives no bytes.
pub fn encode(encoding: BodyEncoding, body: &Value) -> Result<Option<Vec<u8>>, String> {
    match encoding {
        BodyEncoding::None => Ok(None),
        BodyEncoding::Json => Ok(Some(
            serde_json::to_vec(body).expect("a JSON value always serializes"),
        )),
        BodyEncoding::Form => match body {
            Value::Object(fields) => Ok(Some(form(fields).into_bytes())),
            other => Err(format!(
                "a form body must be an object of fields, not {}",
                json_kind(other)
            )),
        },
    }
}

/// `fields` as `application/x-www-form-urlencoded`, flattened with brackets.
pub fn form(fields: &Map<String, Value>) -> String {
    let mut pairs = Vec::new();
    for (key, value) in fields {
        flatten(key.clone(), value, &mut pairs);
    }
    let mut serializer = form_urlencoded::Serializer::new(String::new());
    for (key, value) in &pairs {
        serializer.append_pair(key, value);
    }
    serializer.finish()
}

/// One value's pairs: objects as `name[key]`, arrays as `name[index]`, `null` as an empty value
/// (Stripe's way of clearing a field), booleans as `true`/`false`.
fn flatten(name: String, value: &Value, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(fields) => {
            for (key, value) in fields {
                flatten(format!("{name}[{key}]"), value, out);
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                flatten(format!("{name}[{index}]"), item, out);
            }
        }
        Value::Null => out.push((name, String::new())),
        Value::String(text) => out.push((name, text.clone())),
        Value::Bool(value) => out.push((name, value.to_string())),
        Value::Number(number) => out.push((name, number.to_string())),
    }
}

/// The kind of a JSON value, as a message names it.
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_body_is_merged_over_the_arguments_and_wins_a_conflict() {
        let base = json!({"title": "Call", "opledger_label": "forged", "meta": {"a": 1, "b": 2}});
        let over = json!({"opledger_label": "opl-1", "meta": {"b": 3}});
        assert_eq!(
            merge(base, over),
            json!({"title": "Call", "opledger_label": "opl-1", "meta": {"a": 1, "b": 3}})
        );
        assert_eq!(merge(json!({"a": 1}), json!("x")), json!("x"));
    }

    #[test]
    fn a_form_flattens_nested_values_with_brackets_as_stripe_does() {
        let body = json!({
            "amount": 2000,
            "metadata": {"order": 7},
            "items": [{"price": "p_1"}, {"price": "p 2&"}],
            "capture": true,
            "description": null
        });
        let text = form(body.as_object().expect("an object"));
        assert_eq!(
            text,
            // serde_json's objects keep their keys sorted.
            "amount=2000&capture=true&description=&items%5B0%5D%5Bprice%5D=p_1&items%5B1%5D%5Bprice%5D=p+2%26&metadata%5Border%5D=7"
        );
        let decoded: Vec<(String, String)> = form_urlencoded::parse(text.as_bytes())
            .into_owned()
            .collect();
        assert!(decoded.contains(&("items[1][price]".to_owned(), "p 2&".to_owned())));
    }

    #[test]
    fn a_form_body_must_be_an_object_and_none_sends_nothing() {
        assert!(encode(BodyEncoding::Form, &json!([1])).is_err());
        assert_eq!(encode(BodyEncoding::None, &json!({"a": 1})), Ok(None));
        assert_eq!(
            encode(BodyEncoding::Json, &json!({"a": "\"x\""})),
            Ok(Some(br#"{"a":"\"x\""}"#.to_vec()))
        );
    }
}
