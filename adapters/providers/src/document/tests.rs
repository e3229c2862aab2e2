//! One test per kind of problem a connector document can have, each asserting the field and the
//! line the error names.

use super::*;
use crate::error::line_of;

/// A valid document that uses every section; tests change one line of it.
const BASE: &str = r#"id = "tasks-api"
description = "The task API of Example CRM"
base_url = "https://crm.example.com/api"
request_timeout_ms = 5000
connect_timeout_ms = 1000

[auth]
kind = "bearer"

[settings]
label_property = "opledger_label"

[errors]
code_at = "/error/type"

[[errors.rules]]
status = 403
code = "RATE_LIMITED"
means = "not_sent"

[rate_limit]
reset_header = "x-ratelimit-reset"
reset_unit = "seconds"

[[accounts]]
id = "acme-main"
tenants = ["acme"]
token_env = "TASKS_TOKEN_ACME"

[[accounts]]
id = "globex"
tenants = ["globex", "acme"]
token_env = "TASKS_TOKEN_GLOBEX"

[[actions]]
name = "create_task"
description = "create a task"

[actions.input]
type = "object"
required = ["title"]
properties.title = { type = "string", maxLength = 500 }
properties.due = { type = "string" }

[actions.request]
method = "POST"
path = "/accounts/{{account}}/tasks"
query = { notify = "false" }
headers = { "X-Trace" = "{{operation_id}}" }
body_base = "args"
body = { "{{settings.label_property}}" = "{{label}}", due_at = "{{args.due}}" }

[actions.response]
id = "/id"

[actions.dedup]
kind = "idempotency_key"
retention_s = 86400
safety_margin_s = 3600
in_flight = { status = 409, code = "idempotency_in_flight" }

[actions.lookup]
kind = "by_key"
path = "/accounts/{{account}}/requests/{{key}}"
found = { status = 200, at = "/status", equals = "completed" }
not_found = { status = 404, at = "/error/type", equals = "not_found" }
"#;

/// A search action, appended to [`BASE`] by the tests that need one.
const SEARCH_ACTION: &str = r#"
[[actions]]
name = "create_note"
description = "create a note"

[actions.input]
type = "object"
properties.text = { type = "string" }

[actions.request]
method = "POST"
path = "/notes"
body = { text = "{{args.text}}", label = "{{label}}" }

[actions.response]
id = "/id"

[actions.dedup]
kind = "none"

[actions.lookup]
kind = "search"
method = "POST"
path = "/notes/search"
body = { filter = { label = "{{label}}" } }
results = "/results"
label_at = "/label"
lag_ms = 2000
"#;

fn with(old: &str, new: &str) -> String {
    assert!(BASE.contains(old), "BASE holds `{old}`");
    BASE.replacen(old, new, 1)
}

fn with_search(old: &str, new: &str) -> String {
    let text = format!("{BASE}{SEARCH_ACTION}");
    assert!(text.contains(old), "the text holds `{old}`");
    text.replacen(old, new, 1)
}

/// The line of the first occurrence of `needle` in `text`.
fn line(text: &str, needle: &str) -> usize {
    line_of(text, text.find(needle).expect("the needle is in the text"))
}

#[track_caller]
fn errors(text: &str) -> Vec<ConnectorError> {
    match parse("tasks.toml", text) {
        Ok(_) => panic!("the document was accepted"),
        Err(errors) => errors,
    }
}

/// Asserts that `text` fails with an error on `field` at the line of `needle`, whose message
/// holds `says`.
#[track_caller]
fn assert_error(text: &str, field: &str, needle: &str, says: &str) {
    let errors = errors(text);
    let Some(error) = errors.iter().find(|error| error.field == field) else {
        panic!(
            "no error on `{field}`: {}",
            crate::error::render_all(&errors)
        );
    };
    assert_eq!(error.line, Some(line(text, needle)), "{error}");
    assert!(error.message.contains(says), "{error}");
    assert_eq!(error.file, "tasks.toml");
}

#[test]
fn the_base_document_and_the_search_action_are_valid() {
    let document = parse("tasks.toml", &format!("{BASE}{SEARCH_ACTION}"))
        .unwrap_or_else(|errors| panic!("{}", crate::error::render_all(&errors)));
    assert_eq!(document.actions.len(), 2);
    assert_eq!(document.accounts.len(), 2);
    assert_eq!(
        document.base_url.as_deref(),
        Some("https://crm.example.com/api")
    );
    assert!(matches!(document.actions[1].lookup, Lookup::Search(_)));
    assert_eq!(document.errors.rules.len(), 1);
    assert_eq!(
        document.rate_limit.reset.as_ref().map(|reset| reset.unit),
        Some(ResetUnit::Seconds)
    );
    assert_eq!(
        document.rate_limit.min_wait_ms,
        DEFAULT_RATE_LIMIT_MIN_WAIT_MS
    );
}

#[test]
fn a_rate_limit_table_may_be_left_out_or_declare_only_its_least_wait() {
    let text = with(
        "[rate_limit]\nreset_header = \"x-ratelimit-reset\"\nreset_unit = \"seconds\"\n",
        "",
    );
    let document = parse("tasks.toml", &text).expect("valid without [rate_limit]");
    assert_eq!(document.rate_limit, RateLimit::default());
    assert_eq!(document.rate_limit.min_wait_ms, 1_000);
    let text = with(
        "reset_header = \"x-ratelimit-reset\"\nreset_unit = \"seconds\"",
        "min_wait_ms = 10000",
    );
    let document = parse("tasks.toml", &text).expect("valid with only min_wait_ms");
    assert_eq!(document.rate_limit.reset, None);
    assert_eq!(document.rate_limit.min_wait_ms, 10_000);
}

#[test]
fn a_rate_limit_names_its_reset_header_with_its_unit_and_a_least_wait_in_range() {
    let text = with("reset_unit = \"seconds\"\n", "");
    assert_error(
        &text,
        "rate_limit.reset_unit",
        "[rate_limit]",
        "reset_unit = ",
    );
    let text = with("reset_header = \"x-ratelimit-reset\"\n", "");
    assert_error(
        &text,
        "rate_limit.reset_header",
        "[rate_limit]",
        "or remove reset_unit",
    );
    for wait in ["0", "600001"] {
        let text = with(
            "reset_unit = \"seconds\"",
            &format!("reset_unit = \"seconds\"\nmin_wait_ms = {wait}"),
        );
        assert_error(
            &text,
            "rate_limit.min_wait_ms",
            "min_wait_ms",
            &format!("is {wait}; write the least wait after a 429 in milliseconds, 1 to 600000"),
        );
    }
    let text = with(
        "reset_unit = \"seconds\"",
        "reset_unit = \"seconds\"\nmin_wait_ms = \"1s\"",
    );
    assert_error(
        &text,
        "rate_limit.min_wait_ms",
        "min_wait_ms",
        "must be an integer",
    );
}

#[test]
fn a_syntax_error_names_its_line() {
    let text = with("kind = \"bearer\"", "kind = ");
    let errors = errors(&text);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].field, "syntax");
    assert_eq!(errors[0].line, Some(line(&text, "kind = ")));
}

#[test]
fn unknown_keys_are_named_with_the_keys_allowed() {
    let text = with("request_timeout_ms = 5000", "request_timeout = 5000");
    assert_error(
        &text,
        "request_timeout",
        "request_timeout = 5000",
        "request_timeout_ms",
    );
    let text = with(
        "path = \"/accounts/{{account}}/tasks\"",
        "pathh = \"/accounts/{{account}}/tasks\"",
    );
    assert_error(&text, "actions[0].request.pathh", "pathh", "unknown key");
    assert_error(
        &text,
        "actions[0].request.path",
        "[actions.request]",
        "is missing",
    );
}

#[test]
fn a_wrong_type_is_named() {
    let text = with("retention_s = 86400", "retention_s = \"86400\"");
    assert_error(
        &text,
        "actions[0].dedup.retention_s",
        "retention_s =",
        "must be an integer",
    );
}

#[test]
fn base_urls_must_be_http_with_a_host_and_no_user_info_or_query() {
    for bad in [
        "ftp://crm.example",
        "https://user:secret@crm.example",
        "https://crm.example/api?x=1",
        "crm.example",
    ] {
        let text = with("https://crm.example.com/api", bad);
        assert_error(&text, "base_url", "base_url", "");
    }
}

#[test]
fn timeouts_are_checked_against_their_ranges_and_each_other() {
    let text = with("request_timeout_ms = 5000", "request_timeout_ms = 0");
    assert_error(
        &text,
        "request_timeout_ms",
        "request_timeout_ms",
        "1 to 120000",
    );
    let text = with("connect_timeout_ms = 1000", "connect_timeout_ms = 6000");
    assert_error(
        &text,
        "connect_timeout_ms",
        "connect_timeout_ms",
        "must not exceed",
    );
}

#[test]
fn a_key_retention_must_lie_within_a_year_and_exceed_its_margin() {
    let text = with("retention_s = 86400", "retention_s = 0");
    assert_error(
        &text,
        "actions[0].dedup.retention_s",
        "retention_s",
        "1 to 31622400",
    );
    let text = with("safety_margin_s = 3600", "safety_margin_s = 86400");
    assert_error(
        &text,
        "actions[0].dedup.safety_margin_s",
        "safety_margin_s",
        "smaller than retention_s",
    );
}

#[test]
fn a_search_lag_is_at_most_a_day_and_a_search_names_its_label_field() {
    let text = with_search("lag_ms = 2000", "lag_ms = 86400001");
    assert_error(&text, "actions[1].lookup.lag_ms", "lag_ms", "a day");
    let text = with_search("label_at = \"/label\"", "");
    assert_error(
        &text,
        "actions[1].lookup.label_at",
        "[actions.lookup]\nkind = \"search\"",
        "a title is never evidence",
    );
}

#[test]
fn a_search_may_match_its_label_at_any_element_of_an_array() {
    let text = with_search(
        "label_at = \"/label\"",
        "label_at = \"/item/custom_fields/*\"\naccount_at = \"/item/accounts/*/id\"",
    );
    let document = parse("tasks.toml", &text)
        .unwrap_or_else(|errors| panic!("{}", crate::error::render_all(&errors)));
    let Lookup::Search(search) = &document.actions[1].lookup else {
        panic!("a search lookup");
    };
    assert_eq!(search.label_at, "/item/custom_fields/*");
    assert_eq!(search.account_at.as_deref(), Some("/item/accounts/*/id"));
}

#[test]
fn an_any_element_step_is_checked_at_load_with_what_to_write() {
    for (written, says) in [
        (
            "/item/custom_fields[*]",
            "must be a whole step, e.g. \"/item/custom_fields/*\"",
        ),
        ("/item/*fields", "the step `*fields`"),
        ("/*/*/*", "has 3 `*` steps; at most 2"),
    ] {
        let text = with_search(
            "label_at = \"/label\"",
            &format!("label_at = \"{written}\""),
        );
        assert_error(&text, "actions[1].lookup.label_at", "label_at = ", says);
        let text = with_search(
            "label_at = \"/label\"",
            &format!("label_at = \"/label\"\naccount_at = \"{written}\""),
        );
        assert_error(&text, "actions[1].lookup.account_at", "account_at = ", says);
    }
    // A result has one id and a search one results array: `*` names neither.
    let text = with_search("results = \"/results\"", "results = \"/pages/*\"");
    assert_error(
        &text,
        "actions[1].lookup.results",
        "results = \"/pages",
        "only label_at and account_at may hold",
    );
    let text = with_search("lag_ms = 2000", "lag_ms = 2000\nid = \"/ids/*\"");
    assert_error(
        &text,
        "actions[1].lookup.id",
        "id = \"/ids",
        "only label_at and account_at may hold",
    );
}

#[test]
fn a_search_pointer_may_name_a_setting_but_only_a_declared_one() {
    let text = with_search(
        "label_at = \"/label\"",
        "label_at = \"/properties/{{settings.label_property}}\"",
    );
    let document = parse("tasks.toml", &text)
        .unwrap_or_else(|errors| panic!("{}", crate::error::render_all(&errors)));
    let Lookup::Search(search) = &document.actions[1].lookup else {
        panic!("a search lookup");
    };
    // Kept as written: the installation's settings are written in when the connector is built.
    assert_eq!(search.label_at, "/properties/{{settings.label_property}}");
    let text = with_search(
        "label_at = \"/label\"",
        "label_at = \"/properties/{{settings.label_prop}}\"",
    );
    assert_error(
        &text,
        "actions[1].lookup.label_at",
        "label_at = \"/properties/",
        "declared: label_property",
    );
}

#[test]
fn action_names_and_account_ids_are_unique() {
    let text = with_search("name = \"create_note\"", "name = \"create_task\"");
    assert_error(
        &text,
        "actions[1].name",
        "name = \"create_task\"\ndescription = \"create a note\"",
        "declared twice",
    );
    let text = with("id = \"globex\"", "id = \"acme-main\"");
    assert_error(
        &text,
        "accounts[1].id",
        "id = \"acme-main\"\ntenants = [\"globex\"",
        "listed twice",
    );
}

#[test]
fn every_account_is_owned_by_at_least_one_tenant() {
    let text = with("tenants = [\"acme\"]", "tenants = []");
    assert_error(
        &text,
        "accounts[0].tenants",
        "tenants = []",
        "at least one tenant",
    );
    let text = with("tenants = [\"acme\"]\n", "");
    assert_error(
        &text,
        "accounts[0].tenants",
        "[[accounts]]",
        "at least one tenant",
    );
    let text = with(
        "tenants = [\"globex\", \"acme\"]",
        "tenants = [\"acme\", \"acme\"]",
    );
    assert_error(
        &text,
        "accounts[1].tenants[1]",
        "tenants = [\"acme\", \"acme\"]",
        "twice",
    );
}

#[test]
fn a_secret_written_in_the_file_is_refused() {
    let text = with(
        "token_env = \"TASKS_TOKEN_ACME\"",
        "token = \"sk_live_123\"",
    );
    assert_error(
        &text,
        "accounts[0].token",
        "token = ",
        "never written in a connector file",
    );
    let errors = errors(&text);
    assert!(errors
        .iter()
        .all(|error| !error.message.contains("sk_live_123")));
    let text = with(
        "token_env = \"TASKS_TOKEN_ACME\"",
        "token_env = \"not a name\"",
    );
    assert_error(
        &text,
        "accounts[0].token_env",
        "token_env = \"not a name\"",
        "no environment variable name",
    );
}

#[test]
fn basic_auth_needs_a_username_and_password_variable() {
    let text = with("kind = \"bearer\"", "kind = \"basic\"");
    assert_error(
        &text,
        "accounts[0].username_env",
        "[[accounts]]",
        "basic auth",
    );
    assert_error(
        &text,
        "accounts[0].token_env",
        "token_env = \"TASKS_TOKEN_ACME\"",
        "means nothing with basic auth",
    );
}

#[test]
fn an_invalid_json_schema_is_named_at_its_keyword() {
    let text = with(
        "properties.due = { type = \"string\" }",
        "properties.due = { type = \"strin\" }",
    );
    assert_error(
        &text,
        "actions[0].input.properties.due.type",
        "type = \"strin\"",
        "JSON Schema 2020-12",
    );
    let text = with("type = \"object\"\nrequired", "type = \"array\"\nrequired");
    assert_error(
        &text,
        "actions[0].input",
        "[actions.input]",
        "must describe an object",
    );
}

#[test]
fn a_placeholder_must_name_an_argument_the_schema_defines() {
    let text = with("due_at = \"{{args.due}}\"", "due_at = \"{{args.titel}}\"");
    assert_error(
        &text,
        "actions[0].request.body.due_at",
        "{{args.titel}}",
        "defined there: due, title",
    );
    // A path segment cannot be left out, so a path names required arguments only.
    let text = with(
        "path = \"/accounts/{{account}}/tasks\"",
        "path = \"/accounts/{{args.due}}/tasks\"",
    );
    assert_error(
        &text,
        "actions[0].request.path",
        "{{args.due}}",
        "input.required",
    );
    // A lookup carries no arguments.
    let text = with(
        "path = \"/accounts/{{account}}/requests/{{key}}\"",
        "path = \"/accounts/{{args.title}}/requests/{{key}}\"",
    );
    assert_error(
        &text,
        "actions[0].lookup.path",
        "{{args.title}}/requests",
        "carries no arguments",
    );
}

#[test]
fn an_unknown_placeholder_or_setting_is_refused() {
    let text = with(
        "\"X-Trace\" = \"{{operation_id}}\"",
        "\"X-Trace\" = \"{{title}}\"",
    );
    assert_error(
        &text,
        "actions[0].request.headers.X-Trace",
        "{{title}}",
        "no placeholder",
    );
    let text = with(
        "\"{{settings.label_property}}\" = \"{{label}}\"",
        "\"{{settings.label_prop}}\" = \"{{label}}\"",
    );
    assert_error(
        &text,
        "actions[0].request.body.{{settings.label_prop}}",
        "{{settings.label_prop}}",
        "declared: label_property",
    );
    let long = format!(
        "\"X-Trace\" = \"{}\"",
        "x".repeat(crate::template::MAX_TEMPLATE_CHARS + 1)
    );
    let text = with("\"X-Trace\" = \"{{operation_id}}\"", &long);
    assert_error(
        &text,
        "actions[0].request.headers.X-Trace",
        "\"X-Trace\"",
        "at most 2048",
    );
}

#[test]
fn a_unique_label_contract_needs_the_label_in_the_request() {
    let text = with(
        "kind = \"idempotency_key\"\nretention_s = 86400\nsafety_margin_s = 3600\nin_flight = { status = 409, code = \"idempotency_in_flight\" }",
        "kind = \"unique_label\"\n\n\n",
    )
    .replacen("\"{{settings.label_property}}\" = \"{{label}}\", ", "", 1)
    .replacen("kind = \"by_key\"", "kind = \"none\"", 1)
    .replacen("path = \"/accounts/{{account}}/requests/{{key}}\"\nfound = { status = 200, at = \"/status\", equals = \"completed\" }\nnot_found = { status = 404, at = \"/error/type\", equals = \"not_found\" }\n", "", 1);
    assert_error(
        &text,
        "actions[0].dedup.kind",
        "[actions.dedup]",
        "never sends {{label}}",
    );
}

#[test]
fn a_key_lookup_must_send_the_key() {
    let text = with(
        "/accounts/{{account}}/requests/{{key}}",
        "/accounts/{{account}}/requests",
    );
    assert_error(
        &text,
        "actions[0].lookup",
        "[actions.lookup]",
        "never sends {{key}}",
    );
}

#[test]
fn json_pointers_must_be_pointers() {
    let text = with("id = \"/id\"", "id = \"id\"");
    assert_error(
        &text,
        "actions[0].response.id",
        "id = \"id\"",
        "not a JSON pointer",
    );
    let text = with("code_at = \"/error/type\"", "code_at = \"/error~2type\"");
    assert_error(&text, "errors.code_at", "code_at", "~0");
}

#[test]
fn a_response_names_its_id_in_exactly_one_place() {
    let text = with(
        "[actions.response]\nid = \"/id\"",
        "[actions.response]\nid = \"/id\"\nid_header = \"location\"",
    );
    assert_error(&text, "actions[0].response.id", "id_header", "not both");
    let text = with(
        "[actions.response]\nid = \"/id\"",
        "[actions.response]\nsuccess = [201]",
    );
    assert_error(
        &text,
        "actions[0].response.id",
        "[actions.response]",
        "is missing",
    );
    let text = with(
        "[actions.response]\nid = \"/id\"",
        "[actions.response]\nsuccess = [404]\nid = \"/id\"",
    );
    assert_error(
        &text,
        "actions[0].response.success[0]",
        "success = [404]",
        "2xx",
    );
}

#[test]
fn a_method_is_one_of_five_in_upper_case() {
    for bad in ["TRACE", "post"] {
        let text = with("method = \"POST\"", &format!("method = \"{bad}\""));
        assert_error(
            &text,
            "actions[0].request.method",
            "method = ",
            "GET, POST, PUT, PATCH or DELETE",
        );
    }
}

#[test]
fn a_request_without_body_encoding_carries_no_body() {
    let text = with(
        "body_base = \"args\"",
        "body_encoding = \"none\"\nbody_base = \"args\"",
    );
    assert_error(
        &text,
        "actions[0].request.body_encoding",
        "body_encoding",
        "is \"none\"",
    );
    let text = with(
        "body_base = \"args\"",
        "body_encoding = \"form\"\nbody_base = \"args\"",
    );
    assert!(
        parse("tasks.toml", &text).is_ok(),
        "a form body from the arguments is fine"
    );
}

#[test]
fn credential_and_framing_headers_cannot_be_set_by_a_request() {
    let text = with(
        "\"X-Trace\" = \"{{operation_id}}\"",
        "\"Authorization\" = \"Bearer x\"",
    );
    assert_error(
        &text,
        "actions[0].request.headers.Authorization",
        "\"Authorization\"",
        "set by the connector itself",
    );
    let text = with(
        "query = { notify = \"false\" }",
        "query = { notify = \"false\" }\nheaders = { \"Idempotency-Key\" = \"{{key}}\" }",
    )
    .replacen("headers = { \"X-Trace\" = \"{{operation_id}}\" }\n", "", 1);
    assert_error(
        &text,
        "actions[0].request.headers",
        "[actions.request]",
        "sends itself",
    );
}

#[test]
fn a_path_holds_only_characters_a_url_path_carries() {
    let text = with(
        "path = \"/accounts/{{account}}/tasks\"",
        "path = \"/accounts/{{account}}/tasks?x=1\"",
    );
    assert_error(&text, "actions[0].request.path", "tasks?x=1", "query = {");
    let text = with(
        "path = \"/accounts/{{account}}/tasks\"",
        "path = \"accounts/{{account}}\"",
    );
    assert_error(
        &text,
        "actions[0].request.path",
        "path = \"accounts",
        "must start with `/`",
    );
}

#[test]
fn limits_are_named_with_their_numbers() {
    let mut text = BASE.to_owned();
    let action = &BASE[BASE.find("[[actions]]").expect("an action")..];
    for index in 0..MAX_ACTIONS_PER_CONNECTOR {
        text.push_str(&action.replacen("create_task", &format!("task_{index}"), 1));
    }
    let errors = errors(&text);
    assert!(
        errors
            .iter()
            .any(|error| error.field == "actions" && error.message.contains("at most 256")),
        "{errors:?}"
    );
    let big = format!(
        "properties.due = {{ type = \"string\", description = \"{}\" }}",
        "d".repeat(MAX_SCHEMA_BYTES)
    );
    let text = with("properties.due = { type = \"string\" }", &big);
    assert_error(
        &text,
        "actions[0].input",
        "[actions.input]",
        "at most 65536 bytes",
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = with("kind = \"bearer\"", "kind = \"oauth\"")
        .replacen("retention_s = 86400", "retention_s = 0", 1)
        .replacen("tenants = [\"acme\"]", "tenants = []", 1)
        .replacen("method = \"POST\"", "method = \"TRACE\"", 1);
    let errors = errors(&text);
    let fields: Vec<&str> = errors.iter().map(|error| error.field.as_str()).collect();
    for field in [
        "auth.kind",
        "accounts[0].tenants",
        "actions[0].request.method",
        "actions[0].dedup.retention_s",
    ] {
        assert!(fields.contains(&field), "{field} missing from {fields:?}");
    }
    assert!(
        errors.iter().all(|error| error.line.is_some()),
        "{errors:?}"
    );
}

#[test]
fn an_oauth2_auth_is_read_with_its_grant_and_token_url() {
    let oauth = "kind = \"oauth2\"\ngrant = \"refresh_token\"\ntoken_url = \"/oauth/token\"\nscopes = [\"tasks:write\"]\nrefused_wait_ms = 5000";
    let text = with("kind = \"bearer\"", oauth)
        .replace(
            "token_env = \"TASKS_TOKEN_ACME\"",
            "client_id_env = \"ID\"\nclient_secret_env = \"SECRET\"\nrefresh_token_env = \"REFRESH_ACME\"",
        )
        .replace(
            "token_env = \"TASKS_TOKEN_GLOBEX\"",
            "client_id_env = \"ID\"\nclient_secret_env = \"SECRET\"\nrefresh_token_env = \"REFRESH_GLOBEX\"",
        );
    let document = parse("tasks.toml", &text).unwrap_or_else(|errors| {
        panic!("{}", crate::error::render_all(&errors));
    });
    let Auth::OAuth2(spec) = &document.auth else {
        panic!("oauth2: {:?}", document.auth);
    };
    assert_eq!(spec.grant, crate::oauth::Grant::RefreshToken);
    assert_eq!(
        spec.token_url_on("https://crm.example.com/api"),
        "https://crm.example.com/oauth/token"
    );
    assert_eq!(
        (spec.scopes.clone(), spec.refused_wait_ms),
        (vec!["tasks:write".to_owned()], 5000)
    );
    assert!(matches!(
        &document.accounts[0].credentials,
        Credentials::OAuth2 {
            refresh_token: Some(_),
            ..
        }
    ));
}

#[test]
fn a_bad_oauth2_auth_is_refused_at_its_line() {
    let oauth = |rest: &str| with("kind = \"bearer\"", &format!("kind = \"oauth2\"\n{rest}"));
    assert_error(
        &oauth("grant = \"password\"\ntoken_url = \"/t\""),
        "auth.grant",
        "grant = \"password\"",
        "no grant opledger can use unattended",
    );
    assert_error(
        &oauth("grant = \"refresh_token\"\ntoken_url = \"ftp://x/t\""),
        "auth.token_url",
        "token_url",
        "no token endpoint",
    );
    assert_error(
        &oauth("token_url = \"/t\""),
        "auth.grant",
        "[auth]",
        "grant =",
    );
    assert_error(
        &oauth("grant = \"client_credentials\"\ntoken_url = \"/t\"\nscopes = [\"a b\"]"),
        "auth.scopes[0]",
        "scopes",
        "no scope",
    );
    assert_error(
        &oauth("grant = \"client_credentials\"\ntoken_url = \"/t\"\nrefused_wait_ms = 0"),
        "auth.refused_wait_ms",
        "refused_wait_ms",
        "is 0",
    );
    // An account of an oauth2 connector names its client, never a token.
    assert_error(
        &oauth("grant = \"refresh_token\"\ntoken_url = \"/t\""),
        "accounts[0].token_env",
        "token_env = \"TASKS_TOKEN_ACME\"",
        "means nothing with oauth2 auth",
    );
    assert_error(
        &oauth("grant = \"refresh_token\"\ntoken_url = \"/t\""),
        "accounts[0].client_id_env",
        "[[accounts]]",
        "oauth2 auth",
    );
}

#[test]
fn a_request_budget_is_read_per_kind_and_checked_at_its_line() {
    let text = with(
        "reset_unit = \"seconds\"",
        "reset_unit = \"seconds\"\nrequests_per_s = 10\nburst = 100\n\n[rate_limit.lookups]\nrequests_per_s = 5",
    );
    let document = parse("tasks.toml", &text).unwrap_or_else(|errors| {
        panic!("{}", crate::error::render_all(&errors));
    });
    let budget = |requests_per_s, burst| {
        Some(crate::budget::Budget {
            requests_per_s,
            burst,
        })
    };
    assert_eq!(document.rate_limit.sends, budget(10, 100));
    assert_eq!(
        document.rate_limit.lookups,
        budget(5, 5),
        "a burst defaults to the rate"
    );
    assert_error(
        &with(
            "reset_unit = \"seconds\"",
            "reset_unit = \"seconds\"\nrequests_per_s = 0",
        ),
        "rate_limit.requests_per_s",
        "requests_per_s = 0",
        "is 0; write 1 to",
    );
    assert_error(
        &with(
            "reset_unit = \"seconds\"",
            "reset_unit = \"seconds\"\nburst = 3",
        ),
        "rate_limit.requests_per_s",
        "[rate_limit]",
        "a burst needs its rate",
    );
}

#[test]
fn a_probe_is_a_get_and_may_name_the_account() {
    let text = format!("{BASE}\n[probe]\npath = \"/accounts/{{{{account}}}}/me\"\n");
    let document = parse("tasks.toml", &text).unwrap_or_else(|errors| {
        panic!("{}", crate::error::render_all(&errors));
    });
    assert_eq!(document.probe.map(|probe| probe.method), Some(Method::GET));
    let text = format!("{BASE}\n[probe]\nmethod = \"POST\"\npath = \"/me\"\n");
    assert_error(
        &text,
        "probe.method",
        "method = \"POST\"\npath = \"/me\"",
        "a probe only reads",
    );
    let text = format!("{BASE}\n[probe]\npath = \"/me/{{{{args.title}}}}\"\n");
    assert!(errors(&text)
        .iter()
        .any(|error| error.field == "probe.path"));
}

#[test]
fn an_action_declares_its_data_subject_and_personal_fields_as_pointers_into_its_arguments() {
    let text = with(
        "name = \"create_task\"\ndescription = \"create a task\"\n",
        "name = \"create_task\"\ndescription = \"create a task\"\nsubject = \"/email\"\npersonal = [\"/email\", \"/title\"]\n",
    );
    let document = parse("tasks.toml", &text)
        .unwrap_or_else(|errors| panic!("{}", crate::error::render_all(&errors)));
    assert_eq!(document.actions[0].subject.as_deref(), Some("/email"));
    assert_eq!(document.actions[0].personal, ["/email", "/title"]);
    let bad = with(
        "name = \"create_task\"\ndescription = \"create a task\"\n",
        "name = \"create_task\"\ndescription = \"create a task\"\npersonal = [\"email\"]\n",
    );
    assert_error(
        &bad,
        "actions[0].personal[0]",
        "personal = [\"email\"]",
        "not a JSON pointer",
    );
}
