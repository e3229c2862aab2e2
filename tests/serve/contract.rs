//! The OpenAPI document as the contract every serve test holds the server to: each JSON answer
//! the test client receives is checked against the document's schema for its route, method and
//! status, and a status the document does not list for the route fails the test. The document is
//! the one compiled into the server (`include_str!`), so a schema looser or stricter than what the
//! server answers is found by whichever test first meets the difference.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use jsonschema::Validator;
use serde_json::Value;

const DOCUMENT: &str = include_str!("../../adapters/http-api/src/openapi.json");

/// The document, parsed once.
pub fn document() -> &'static Value {
    static PARSED: OnceLock<Value> = OnceLock::new();
    PARSED.get_or_init(|| serde_json::from_str(DOCUMENT).expect("the OpenAPI document is JSON"))
}

/// The documented path template that `path` (its query aside) falls under, if any.
pub fn template_of(path: &str) -> Option<&'static str> {
    let path = path.split('?').next().unwrap_or(path);
    let segments: Vec<&str> = path.split('/').collect();
    document()["paths"]
        .as_object()?
        .keys()
        .find(|template| {
            let parts: Vec<&str> = template.split('/').collect();
            parts.len() == segments.len()
                && parts.iter().zip(&segments).all(|(part, segment)| {
                    part == segment || (part.starts_with('{') && !segment.is_empty())
                })
        })
        .map(String::as_str)
}

/// A JSON pointer token: `~` and `/` escaped (RFC 6901).
fn token(text: &str) -> String {
    text.replace('~', "~0").replace('/', "~1")
}

/// The validator of the schema at `pointer` in the document, built once per pointer. The root is
/// the whole document with a `$ref` to the pointer, so the schema's own `$ref`s
/// (`#/components/schemas/…`) resolve inside the same document.
fn validate_at(pointer: &str, instance: &Value) -> Result<(), Vec<String>> {
    static VALIDATORS: OnceLock<Mutex<HashMap<String, &'static Validator>>> = OnceLock::new();
    let validator = {
        let mut cache = VALIDATORS
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *cache.entry(pointer.to_owned()).or_insert_with(|| {
            let mut root = document().clone();
            // A URI fragment: the braces of path templates percent-encoded.
            let fragment = pointer.replace('{', "%7B").replace('}', "%7D");
            root["$ref"] = Value::String(format!("#{fragment}"));
            let validator = jsonschema::options()
                .with_draft(jsonschema::Draft::Draft202012)
                .should_validate_formats(true)
                .build(&root)
                .unwrap_or_else(|error| {
                    panic!("the schema at {pointer} does not compile: {error}")
                });
            Box::leak(Box::new(validator))
        })
    };
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|error| format!("at {}: {error}", error.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Checks an answer against the document: `json` is the parsed body (`None` when it was not
/// JSON). Panics, failing the test, on an undocumented status or a body off its schema.
#[track_caller]
pub fn check_answer(method: &str, path: &str, status: u16, json: Option<&Value>, text: &str) {
    let method = method.to_ascii_lowercase();
    let operation = template_of(path).and_then(|template| {
        let operation = &document()["paths"][template][&method];
        operation.is_object().then_some((template, operation))
    });
    let Some((template, operation)) = operation else {
        // Not a documented route: the router's fallbacks answer, in the error shape.
        assert!(
            status == 404 || status == 405,
            "{method} {path} is not a documented route, yet it answered {status}: {text}"
        );
        let body =
            json.unwrap_or_else(|| panic!("{method} {path}: a {status} that is not JSON: {text}"));
        if let Err(errors) = validate_at("/components/schemas/Error", body) {
            panic!("{method} {path} {status}: not the error shape: {errors:?}\n{text}");
        }
        return;
    };
    let status_key = status.to_string();
    let mut response = &operation["responses"][&status_key];
    let mut pointer = format!("/paths/{}/{method}/responses/{status_key}", token(template));
    assert!(
        response.is_object(),
        "{method} {template} answered {status}, a status the OpenAPI document does not list for it: {text}"
    );
    if let Some(reference) = response["$ref"].as_str() {
        pointer = reference.trim_start_matches('#').to_owned();
        response = document()
            .pointer(&pointer)
            .unwrap_or_else(|| panic!("{reference} is not in the document"));
    }
    let content = &response["content"];
    if content["application/json"].is_object() {
        let body = json.unwrap_or_else(|| {
            panic!("{method} {template} {status}: documented as JSON, answered otherwise: {text}")
        });
        let schema_pointer = format!("{pointer}/content/application~1json/schema");
        if let Err(errors) = validate_at(&schema_pointer, body) {
            panic!(
                "{method} {path} {status}: the answer does not match the OpenAPI schema:\n  {}\n{text}",
                errors.join("\n  ")
            );
        }
    }
}

/// Whether `body` is valid under the document's request schema `name` (`RecordRequest`, …).
pub fn request_is_valid(name: &str, body: &Value) -> bool {
    validate_at(&format!("/components/schemas/{name}"), body).is_ok()
}

/// Checks the `data` of one Server-Sent Event against the document's `OutcomeEvent`, and against
/// the event catalog's schema for its type.
#[track_caller]
pub fn check_outcome_event(data: &Value) {
    if let Err(errors) = validate_at("/components/schemas/OutcomeEvent", data) {
        panic!("an event's data does not match OutcomeEvent: {errors:?}\n{data}");
    }
    check_catalog(data);
}

/// The event catalog: one JSON Schema per event type, a page of the book
/// (`docs/src/subscribers/events/<type>.schema.json`).
fn catalog_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/subscribers/events")
}

/// The catalog's validator for event type `kind`, built once per type.
fn catalog_validator(kind: &str) -> &'static Validator {
    static VALIDATORS: OnceLock<Mutex<HashMap<String, &'static Validator>>> = OnceLock::new();
    let mut cache = VALIDATORS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    cache.entry(kind.to_owned()).or_insert_with(|| {
        let path = catalog_dir().join(format!("{kind}.schema.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("the event catalog has no {}: {error}", path.display()));
        let schema: Value = serde_json::from_str(&text).expect("a catalog schema is JSON");
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&schema)
            .unwrap_or_else(|error| panic!("{} does not compile: {error}", path.display()));
        Box::leak(Box::new(validator))
    })
}

/// Checks an event payload (an SSE event's or a webhook's `data`) against the event catalog's
/// schema for its `type`.
#[track_caller]
pub fn check_catalog(data: &Value) {
    let kind = data["type"].as_str().expect("an event payload has a type");
    let errors: Vec<String> = catalog_validator(kind)
        .iter_errors(data)
        .map(|error| format!("at {}: {error}", error.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "an event does not match the catalog's {kind}.schema.json: {errors:?}\n{data}"
    );
}

#[test]
fn the_event_catalog_has_one_schema_per_event_type_each_with_an_example_it_accepts() {
    let types: std::collections::BTreeSet<String> = document()["components"]["schemas"]
        ["OutcomeEvent"]["properties"]["type"]["enum"]
        .as_array()
        .expect("the types")
        .iter()
        .map(|kind| kind.as_str().expect("a name").to_owned())
        .collect();
    let files: std::collections::BTreeSet<String> = std::fs::read_dir(catalog_dir())
        .expect("the catalog's folder")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter_map(|name| name.strip_suffix(".schema.json").map(str::to_owned))
        .collect();
    assert_eq!(files, types);
    for kind in &types {
        let path = catalog_dir().join(format!("{kind}.schema.json"));
        let schema: Value = serde_json::from_str(
            &std::fs::read_to_string(&path).expect("the catalog's schema is readable"),
        )
        .expect("a catalog schema is JSON");
        let examples = schema["examples"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        assert!(
            !examples.is_empty(),
            "{} has no example: give it one under `examples`",
            path.display()
        );
        for example in examples {
            assert_eq!(
                example["type"],
                kind.as_str(),
                "{}'s example",
                path.display()
            );
            check_catalog(example);
        }
    }
}

#[test]
#[should_panic(expected = "does not match the OpenAPI schema")]
fn an_answer_off_its_schema_fails_the_test() {
    // Health without its lag fields.
    let body = serde_json::json!({"status": "ok"});
    check_answer("GET", "/healthz", 200, Some(&body), "");
}

#[test]
#[should_panic(expected = "does not list")]
fn an_undocumented_status_fails_the_test() {
    let body = serde_json::json!({"error": {"code": "not_found", "message": "x"}});
    check_answer("GET", "/healthz", 404, Some(&body), "");
}

#[test]
fn a_path_falls_under_its_template() {
    assert_eq!(
        template_of("/v1/operations/abc/execute?wait_ms=0"),
        Some("/v1/operations/{id}/execute")
    );
    assert_eq!(
        template_of("/v1/operations?limit=1"),
        Some("/v1/operations")
    );
    assert_eq!(template_of("/v1/nothing-here"), None);
}
