//! Templates: the placeholders a connector's requests are written with, and how they are filled.
//!
//! A template is text with placeholders in double braces:
//!
//! | placeholder | value |
//! |---|---|
//! | `{{args.title}}`, `{{args.a.b}}` | a field of the call's arguments (absent: see below) |
//! | `{{args}}` | the whole arguments object |
//! | `{{key}}` | the operation's idempotency key |
//! | `{{label}}` | the operation's label (`opl-<operation id>`) |
//! | `{{account}}` | the account the call is bound to |
//! | `{{operation_id}}` | the operation's id |
//! | `{{settings.name}}` | a setting of the connector (its default, or the value the user set) |
//!
//! A string that is exactly one placeholder takes the value with its JSON type (a number stays a
//! number, `{{args}}` an object); placeholders inside other text are written as text (a string as
//! it is, a number or boolean as JSON writes it, an object or array as compact JSON). A value
//! whose placeholder names an argument the call does not carry (or carries as `null`) is left
//! out: the body field, query parameter or header is not sent, which is how optional arguments
//! work. A path segment cannot be left out, so a path may only name required arguments.
//!
//! Why not a template engine: there is no logic here on purpose (no conditions, loops or
//! filters). Every placeholder is checked when the connector is loaded — an argument against the
//! action's input schema, a setting against `[settings]` — so a typo is an error at start with
//! its line, never a request that quietly sends an empty field. That check needs a grammar small
//! enough to read statically; a general engine's expressions are not.
//!
//! Bodies are built as [`serde_json::Value`] trees and serialized afterwards: a value is never
//! spliced into JSON text, so an argument can never break out of its string.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

/// Longest template accepted, in characters.
pub const MAX_TEMPLATE_CHARS: usize = 2_048;
/// Most placeholders one template may hold.
pub const MAX_PLACEHOLDERS: usize = 32;
/// Deepest argument path a placeholder may name (`args.a.b.c` is 3).
pub const MAX_ARG_PATH_DEPTH: usize = 8;

/// What a placeholder names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ref {
    /// A field of the arguments by its path; the empty path is the whole arguments object.
    Args(Vec<String>),
    /// The operation's idempotency key.
    Key,
    /// The operation's label.
    Label,
    /// The account the call is bound to.
    Account,
    /// The operation's id.
    OperationId,
    /// A connector setting by name.
    Setting(String),
}

impl fmt::Display for Ref {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Args(path) if path.is_empty() => f.write_str("{{args}}"),
            Self::Args(path) => write!(f, "{{{{args.{}}}}}", path.join(".")),
            Self::Key => f.write_str("{{key}}"),
            Self::Label => f.write_str("{{label}}"),
            Self::Account => f.write_str("{{account}}"),
            Self::OperationId => f.write_str("{{operation_id}}"),
            Self::Setting(name) => write!(f, "{{{{settings.{name}}}}}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Text(String),
    Ref(Ref),
}

/// A parsed template (see the module docs). Its `Display` is the text it was written as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    source: String,
    parts: Vec<Part>,
}

/// What a template is filled from. Lookups carry no arguments (`args: None`).
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    /// The call's arguments; `None` for a lookup.
    pub args: Option<&'a Map<String, Value>>,
    /// The operation's idempotency key.
    pub key: &'a str,
    /// The operation's label.
    pub label: &'a str,
    /// The account.
    pub account: &'a str,
    /// The operation's id, as text.
    pub operation_id: &'a str,
    /// The connector's settings, resolved (defaults with the user's values over them).
    pub settings: &'a BTreeMap<String, String>,
}

impl Template {
    /// Parses `text`; the error says what is wrong and what to write instead.
    pub fn parse(text: &str) -> Result<Self, String> {
        let length = text.chars().count();
        if length > MAX_TEMPLATE_CHARS {
            return Err(format!(
                "is {length} characters long; a template holds at most {MAX_TEMPLATE_CHARS}"
            ));
        }
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find("{{") {
            push_text(&mut parts, &rest[..open])?;
            let after = &rest[open + 2..];
            let close = after.find("}}").ok_or_else(|| {
                format!(
                    "a `{{{{` at `{}` is never closed; write `{{{{name}}}}`",
                    shorten(&rest[open..])
                )
            })?;
            parts.push(Part::Ref(parse_ref(after[..close].trim())?));
            rest = &after[close + 2..];
        }
        push_text(&mut parts, rest)?;
        let placeholders = parts
            .iter()
            .filter(|part| matches!(part, Part::Ref(_)))
            .count();
        if placeholders > MAX_PLACEHOLDERS {
            return Err(format!(
                "holds {placeholders} placeholders; a template holds at most {MAX_PLACEHOLDERS}"
            ));
        }
        Ok(Self {
            source: text.to_owned(),
            parts,
        })
    }

    /// The text the template was written as.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Every placeholder, in order.
    pub fn refs(&self) -> impl Iterator<Item = &Ref> {
        self.parts.iter().filter_map(|part| match part {
            Part::Ref(reference) => Some(reference),
            Part::Text(_) => None,
        })
    }

    /// Whether it holds a placeholder equal to `wanted`.
    pub fn uses(&self, wanted: &Ref) -> bool {
        self.refs().any(|reference| reference == wanted)
    }

    /// The literal text around the placeholders, in order (for checks of what may be written).
    pub fn literal_parts(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|part| match part {
            Part::Text(text) => Some(text.as_str()),
            Part::Ref(_) => None,
        })
    }

    /// The template as a JSON value: a lone placeholder keeps its type, anything else is text.
    /// `None` when a placeholder names an absent argument (the value is left out).
    pub fn render_value(&self, context: &Context<'_>) -> Option<Value> {
        if let [Part::Ref(reference)] = self.parts.as_slice() {
            return resolve(reference, context).filter(|value| !value.is_null());
        }
        self.render_text(context).map(Value::String)
    }

    /// The template as a URL path: literal text as written (it was checked at load), each
    /// placeholder's text percent-encoded as one segment value. A placeholder without a value is
    /// an error: a path segment cannot be left out.
    pub fn render_path(&self, context: &Context<'_>) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Ref(reference) => {
                    let text = resolve(reference, context)
                        .as_ref()
                        .and_then(text_of)
                        .ok_or_else(|| {
                            format!(
                                "`{reference}` has no value, and a path segment cannot be left out"
                            )
                        })?;
                    if is_dot_segment(&text) {
                        return Err(format!(
                            "`{reference}` is `{}`, which a server reads as a move up or across the path, not as a value; a path value may not be `.` or `..` (nor their percent-encoded forms)",
                            crate::http::shorten(&text, 20)
                        ));
                    }
                    out.push_str(&crate::http::encode_component(&text));
                }
            }
        }
        Ok(out)
    }

    /// The argument paths this path template takes whole path segments from, with what each
    /// holds when `args` has a dot segment there (`.`, `..` or an encoded form): the problems a
    /// call's arguments must be refused for before anything is recorded.
    pub fn dot_segment_args(&self, args: &Value) -> Vec<(Vec<String>, String)> {
        let Some(args) = args.as_object() else {
            return Vec::new();
        };
        let context = Context {
            args: Some(args),
            key: "",
            label: "",
            account: "",
            operation_id: "",
            settings: &EMPTY_SETTINGS,
        };
        self.parts
            .iter()
            .filter_map(|part| match part {
                Part::Ref(reference @ Ref::Args(path)) => {
                    let text = resolve(reference, &context).as_ref().and_then(text_of)?;
                    is_dot_segment(&text).then(|| (path.clone(), text))
                }
                _ => None,
            })
            .collect()
    }

    /// The template as text; `None` when a placeholder names an absent argument.
    pub fn render_text(&self, context: &Context<'_>) -> Option<String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Ref(reference) => out.push_str(&text_of(&resolve(reference, context)?)?),
            }
        }
        Some(out)
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

fn shorten(text: &str) -> String {
    crate::http::shorten(text, 40)
}

fn push_text(parts: &mut Vec<Part>, text: &str) -> Result<(), String> {
    if text.contains("}}") {
        return Err(format!(
            "`}}}}` in `{}` closes no placeholder; placeholders are written `{{{{name}}}}`",
            shorten(text)
        ));
    }
    if !text.is_empty() {
        parts.push(Part::Text(text.to_owned()));
    }
    Ok(())
}

const KNOWN: &str = "args, args.<field>, key, label, account, operation_id, settings.<name>";

fn parse_ref(name: &str) -> Result<Ref, String> {
    let simple = match name {
        "args" => Some(Ref::Args(Vec::new())),
        "key" => Some(Ref::Key),
        "label" => Some(Ref::Label),
        "account" => Some(Ref::Account),
        "operation_id" => Some(Ref::OperationId),
        _ => None,
    };
    if let Some(reference) = simple {
        return Ok(reference);
    }
    if let Some(path) = name.strip_prefix("args.") {
        let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
        if segments.len() > MAX_ARG_PATH_DEPTH {
            return Err(format!(
                "`{{{{{name}}}}}` is {} levels deep; at most {MAX_ARG_PATH_DEPTH}",
                segments.len()
            ));
        }
        if segments.iter().all(|segment| is_field_name(segment)) {
            return Ok(Ref::Args(segments));
        }
        return Err(format!(
            "`{{{{{name}}}}}` is no argument path; write `{{{{args.field}}}}` or `{{{{args.a.b}}}}` (letters, digits, `_` and `-` between the dots)"
        ));
    }
    if let Some(setting) = name.strip_prefix("settings.") {
        if is_setting_name(setting) {
            return Ok(Ref::Setting(setting.to_owned()));
        }
        return Err(format!(
            "`{{{{{name}}}}}` is no setting name; write `{{{{settings.name}}}}` (lower-case letters, digits and `_`)"
        ));
    }
    Err(format!(
        "`{{{{{name}}}}}` is no placeholder; the placeholders are: {KNOWN}"
    ))
}

fn is_field_name(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-'))
}

/// A JSON pointer that may name settings (`/properties/{{settings.label_property}}`), with each
/// setting's value written in as one escaped reference token (`~` as `~0`, `/` as `~1`), so a
/// property the user named `a/b` is still one step of the pointer. Only settings may appear: a
/// pointer reads an answer, and an answer's shape cannot depend on the call's arguments.
pub fn resolve_pointer(text: &str, settings: &BTreeMap<String, String>) -> Result<String, String> {
    let template = Template::parse(text)?;
    let mut out = String::new();
    for part in &template.parts {
        match part {
            Part::Text(text) => out.push_str(text),
            Part::Ref(Ref::Setting(name)) => {
                let value = settings.get(name).ok_or_else(|| {
                    let declared: Vec<&str> = settings.keys().map(String::as_str).collect();
                    format!(
                        "`{{{{settings.{name}}}}}` names no setting of this connector (declared: {}); declare it under [settings]",
                        if declared.is_empty() { "none".to_owned() } else { declared.join(", ") }
                    )
                })?;
                out.push_str(&value.replace('~', "~0").replace('/', "~1"));
            }
            Part::Ref(other) => {
                return Err(format!(
                    "`{other}` cannot be used in a JSON pointer; a pointer may name only settings, e.g. \"/properties/{{{{settings.label_property}}}}\""
                ))
            }
        }
    }
    check_pointer(&out)?;
    Ok(out)
}

/// Whether `text` may name a setting: lower-case letters, digits and `_`, starting with a letter.
pub fn is_setting_name(text: &str) -> bool {
    text.bytes()
        .next()
        .is_some_and(|byte| byte.is_ascii_lowercase())
        && text
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_')
}

static EMPTY_SETTINGS: BTreeMap<String, String> = BTreeMap::new();

/// Whether a path value is a dot segment (RFC 3986 §5.2.4) once percent-decoding is undone, as
/// often as a server or a proxy in between might undo it: `.`, `..`, `%2e`, `.%2E`, `%252e`.
/// Percent-encoding the dots would not help, since servers normalise `%2E` to `.` too.
pub fn is_dot_segment(text: &str) -> bool {
    let mut text = text.to_owned();
    for _ in 0..4 {
        if text == "." || text == ".." {
            return true;
        }
        let decoded = percent_decoded(&text);
        if decoded == text {
            return false;
        }
        text = decoded;
    }
    // Still changing after four decodings: nothing a path value should look like.
    true
}

/// `text` with each `%XX` decoded (bytes that are no UTF-8 kept as they were).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = |byte: u8| char::from(byte).to_digit(16);
        if bytes[at] == b'%' && at + 2 < bytes.len() {
            if let (Some(high), Some(low)) = (hex(bytes[at + 1]), hex(bytes[at + 2])) {
                out.push(u8::try_from(high * 16 + low).unwrap_or(b'%'));
                at += 3;
                continue;
            }
        }
        out.push(bytes[at]);
        at += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| text.to_owned())
}

fn resolve(reference: &Ref, context: &Context<'_>) -> Option<Value> {
    let text = |value: &str| Some(Value::String(value.to_owned()));
    match reference {
        Ref::Args(path) => {
            let mut value = context.args?;
            let Some((last, parents)) = path.split_last() else {
                return Some(Value::Object(value.clone()));
            };
            for segment in parents {
                value = value.get(segment)?.as_object()?;
            }
            value.get(last).cloned()
        }
        Ref::Key => text(context.key),
        Ref::Label => text(context.label),
        Ref::Account => text(context.account),
        Ref::OperationId => text(context.operation_id),
        Ref::Setting(name) => context.settings.get(name).and_then(|value| text(value)),
    }
}

/// A JSON value as text: a string as it is, `null` as absent, anything else as compact JSON.
fn text_of(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(text) => Some(text.clone()),
        other => Some(other.to_string()),
    }
}

/// A body written with templates: string leaves (and object keys) are templates, other scalars
/// are taken as they are.
#[derive(Clone, Debug, PartialEq)]
pub enum Tree {
    /// A string leaf.
    Template(Template),
    /// A number, boolean or date-time leaf, as written.
    Literal(Value),
    /// An array; absent elements are left out.
    Array(Vec<Tree>),
    /// A table; an entry whose key or value is absent is left out.
    Object(Vec<(Template, Tree)>),
}

impl Tree {
    /// The value for `context`; `None` when it is absent (a leaf naming an absent argument).
    pub fn render(&self, context: &Context<'_>) -> Option<Value> {
        match self {
            Self::Template(template) => template.render_value(context),
            Self::Literal(value) => Some(value.clone()),
            Self::Array(items) => Some(Value::Array(
                items
                    .iter()
                    .filter_map(|item| item.render(context))
                    .collect(),
            )),
            Self::Object(entries) => Some(Value::Object(
                entries
                    .iter()
                    .filter_map(|(key, value)| {
                        Some((key.render_text(context)?, value.render(context)?))
                    })
                    .collect(),
            )),
        }
    }

    /// Every template in the tree, keys included, with the dotted path below the tree's root.
    pub fn templates(&self) -> Vec<(String, &Template)> {
        let mut out = Vec::new();
        self.collect(String::new(), &mut out);
        out
    }

    fn collect<'t>(&'t self, path: String, out: &mut Vec<(String, &'t Template)>) {
        match self {
            Self::Template(template) => out.push((path, template)),
            Self::Literal(_) => {}
            Self::Array(items) => {
                for (index, item) in items.iter().enumerate() {
                    item.collect(format!("{path}[{index}]"), out);
                }
            }
            Self::Object(entries) => {
                for (key, value) in entries {
                    let below = format!("{path}.{}", key.source());
                    out.push((below.clone(), key));
                    value.collect(below, out);
                }
            }
        }
    }

    /// Whether the tree is a table (or a lone placeholder, which may be one).
    pub fn may_be_object(&self) -> bool {
        match self {
            Self::Object(_) => true,
            Self::Template(template) => matches!(
                template.parts.as_slice(),
                [Part::Ref(Ref::Args(_) | Ref::Setting(_))]
            ),
            Self::Literal(_) | Self::Array(_) => false,
        }
    }
}

/// Checks that `path` names an argument the input `schema` defines, through nested
/// `properties`; `Ok(required)` says whether it (and every level above it) is required.
pub fn check_arg_path(path: &[String], schema: &Value) -> Result<bool, String> {
    let mut level = schema;
    let mut required = true;
    let mut pointer = String::new();
    for segment in path {
        let properties = level.get("properties").and_then(Value::as_object);
        let Some(properties) = properties else {
            return Err(format!(
                "names `{segment}`, but the input schema declares no `properties` at `{}`; declare `{segment}` there (input.properties.{segment})",
                if pointer.is_empty() { "/" } else { &pointer }
            ));
        };
        let Some(below) = properties.get(segment) else {
            let known: Vec<&str> = properties.keys().map(String::as_str).collect();
            return Err(format!(
                "names `{segment}`, which the input schema does not define at `{}`; defined there: {}",
                if pointer.is_empty() { "/" } else { &pointer },
                if known.is_empty() { "nothing".to_owned() } else { known.join(", ") }
            ));
        };
        let listed = level
            .get("required")
            .and_then(Value::as_array)
            .is_some_and(|names| names.iter().any(|name| name.as_str() == Some(segment)));
        required &= listed;
        pointer.push('/');
        pointer.push_str(segment);
        level = below;
    }
    Ok(required)
}

/// Checks that `text` is a JSON pointer (RFC 6901): empty (the whole document) or `/`-separated
/// tokens in which `~` is only ever `~0` or `~1`.
pub fn check_pointer(text: &str) -> Result<(), String> {
    if !text.is_empty() && !text.starts_with('/') {
        return Err(format!(
            "`{text}` is not a JSON pointer; a pointer starts with `/`, e.g. \"/id\" or \"/data/0/id\""
        ));
    }
    let mut chars = text.chars();
    while let Some(char) = chars.next() {
        if char == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(format!(
                "`{text}` has a `~` that is not `~0` (for `~`) or `~1` (for `/`)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn settings() -> BTreeMap<String, String> {
        BTreeMap::from([("label_property".to_owned(), "opledger_label".to_owned())])
    }

    #[test]
    fn a_pointer_names_a_setting_as_one_escaped_step() {
        let mut settings = settings();
        assert_eq!(
            resolve_pointer("/properties/{{settings.label_property}}", &settings),
            Ok("/properties/opledger_label".to_owned())
        );
        settings.insert("label_property".to_owned(), "odd/name~x".to_owned());
        assert_eq!(
            resolve_pointer("/properties/{{settings.label_property}}", &settings),
            Ok("/properties/odd~1name~0x".to_owned())
        );
        assert_eq!(resolve_pointer("/id", &settings), Ok("/id".to_owned()));
    }

    #[test]
    fn a_pointer_refuses_unknown_settings_and_anything_but_settings() {
        let settings = settings();
        let unknown = resolve_pointer("/properties/{{settings.nope}}", &settings)
            .expect_err("an undeclared setting");
        assert!(unknown.contains("declared: label_property"), "{unknown}");
        let label = resolve_pointer("/{{label}}", &settings).expect_err("not a setting");
        assert!(label.contains("only settings"), "{label}");
        let broken = resolve_pointer("{{settings.label_property}}", &settings)
            .expect_err("not a pointer once resolved");
        assert!(broken.contains("starts with `/`"), "{broken}");
    }

    pub(crate) fn context<'a>(
        args: Option<&'a Map<String, Value>>,
        settings: &'a BTreeMap<String, String>,
    ) -> Context<'a> {
        Context {
            args,
            key: "opk_1",
            label: "opl-1",
            account: "acct 1",
            operation_id: "6f1c",
            settings,
        }
    }

    fn args() -> Map<String, Value> {
        json!({"title": "Call", "count": 3, "done": false, "meta": {"order": 7}, "none": null})
            .as_object()
            .cloned()
            .expect("an object")
    }

    fn render(text: &str) -> Option<Value> {
        let args = args();
        let settings = settings();
        Template::parse(text)
            .expect("a valid template")
            .render_value(&context(Some(&args), &settings))
    }

    #[test]
    fn a_lone_placeholder_keeps_its_type_and_text_interpolates() {
        assert_eq!(render("{{args.count}}"), Some(json!(3)));
        assert_eq!(render("{{ args.done }}"), Some(json!(false)));
        assert_eq!(render("{{args.meta}}"), Some(json!({"order": 7})));
        assert_eq!(render("{{args.meta.order}}"), Some(json!(7)));
        assert_eq!(render("n={{args.count}}"), Some(json!("n=3")));
        assert_eq!(render("{{args.meta}}!"), Some(json!(r#"{"order":7}!"#)));
        assert_eq!(
            render("{{key}} {{label}} {{account}} {{operation_id}} {{settings.label_property}}"),
            Some(json!("opk_1 opl-1 acct 1 6f1c opledger_label"))
        );
        assert_eq!(render("plain"), Some(json!("plain")));
        assert_eq!(render(""), Some(json!("")));
        assert_eq!(render("{{args}}"), Some(Value::Object(args())));
    }

    #[test]
    fn an_absent_or_null_argument_leaves_the_value_out() {
        assert_eq!(render("{{args.missing}}"), None);
        assert_eq!(render("due {{args.missing}}"), None);
        assert_eq!(render("{{args.none}}"), None);
        assert_eq!(render("{{args.title.deeper}}"), None);
        let settings = settings();
        let lookup = context(None, &settings);
        assert_eq!(
            Template::parse("{{args.title}}")
                .expect("valid")
                .render_value(&lookup),
            None
        );
    }

    #[test]
    fn a_dot_segment_is_refused_however_it_is_encoded_and_dots_inside_a_value_are_not() {
        for dots in [".", "..", "%2e", "%2E%2e", ".%2E", "%252e%252e", "%25252e"] {
            assert!(is_dot_segment(dots), "{dots}");
        }
        for value in ["a..b", "...", ".a", "%2e%2e%2e", "v1.2", "%zz", "%"] {
            assert!(!is_dot_segment(value), "{value}");
        }
        let path = Template::parse("/deals/{{args.deal}}/notes").expect("valid");
        let args = serde_json::json!({"deal": ".."});
        assert_eq!(
            path.dot_segment_args(&args),
            vec![(vec!["deal".to_owned()], "..".to_owned())]
        );
        let settings = BTreeMap::new();
        let context = Context {
            args: args.as_object(),
            key: "",
            label: "",
            account: "",
            operation_id: "",
            settings: &settings,
        };
        assert!(path
            .render_path(&context)
            .is_err_and(|message| message.contains("`..`")));
    }

    #[test]
    fn a_path_encodes_each_placeholder_as_one_segment_and_cannot_drop_one() {
        let args = args();
        let settings = settings();
        let context = context(Some(&args), &settings);
        let path = Template::parse("/a/{{account}}/t/{{args.title}}/{{label}}").expect("valid");
        assert_eq!(
            path.render_path(&context),
            Ok("/a/acct%201/t/Call/opl-1".to_owned())
        );
        let slash = Template::parse("/x/{{args.meta}}").expect("valid");
        assert_eq!(
            slash.render_path(&context),
            Ok("/x/%7B%22order%22%3A7%7D".to_owned())
        );
        let absent = Template::parse("/x/{{args.missing}}").expect("valid");
        assert!(absent.render_path(&context).is_err());
    }

    #[test]
    fn malformed_placeholders_are_refused_with_what_to_write() {
        for (text, expected) in [
            ("{{title}}", "is no placeholder"),
            ("{{args.}}", "no argument path"),
            ("{{args.a b}}", "no argument path"),
            ("{{settings.Label}}", "no setting name"),
            ("{{label", "never closed"),
            ("label}}", "closes no placeholder"),
        ] {
            let error = Template::parse(text).expect_err(text);
            assert!(error.contains(expected), "{text}: {error}");
        }
        let long = "x".repeat(MAX_TEMPLATE_CHARS + 1);
        assert!(Template::parse(&long).is_err());
        let many = "{{key}}".repeat(MAX_PLACEHOLDERS + 1);
        assert!(Template::parse(&many).is_err());
    }

    #[test]
    fn a_tree_renders_keys_and_leaves_and_drops_absent_parts() {
        let tree = Tree::Object(vec![
            (
                Template::parse("{{settings.label_property}}").expect("valid"),
                Tree::Template(Template::parse("{{label}}").expect("valid")),
            ),
            (
                Template::parse("due").expect("valid"),
                Tree::Template(Template::parse("{{args.missing}}").expect("valid")),
            ),
            (
                Template::parse("items").expect("valid"),
                Tree::Array(vec![
                    Tree::Literal(json!(1)),
                    Tree::Template(Template::parse("{{args.missing}}").expect("valid")),
                    Tree::Template(Template::parse("{{args.title}}").expect("valid")),
                ]),
            ),
        ]);
        let args = args();
        let settings = settings();
        assert_eq!(
            tree.render(&context(Some(&args), &settings)),
            Some(json!({"opledger_label": "opl-1", "items": [1, "Call"]}))
        );
        let paths: Vec<String> = tree.templates().into_iter().map(|(path, _)| path).collect();
        assert!(paths.contains(&".items[2]".to_owned()), "{paths:?}");
    }

    #[test]
    fn argument_paths_are_checked_against_the_schema() {
        let schema = json!({
            "type": "object",
            "required": ["title", "meta"],
            "properties": {
                "title": {"type": "string"},
                "due": {"type": "string"},
                "meta": {"type": "object", "required": ["order"], "properties": {"order": {}}}
            }
        });
        let path = |text: &str| text.split('.').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(check_arg_path(&path("title"), &schema), Ok(true));
        assert_eq!(check_arg_path(&path("due"), &schema), Ok(false));
        assert_eq!(check_arg_path(&path("meta.order"), &schema), Ok(true));
        let error = check_arg_path(&path("titel"), &schema).expect_err("a typo");
        assert!(
            error.contains("titel") && error.contains("due, meta, title"),
            "{error}"
        );
        let error = check_arg_path(&path("title.x"), &schema).expect_err("no properties");
        assert!(error.contains("/title"), "{error}");
        assert!(check_arg_path(&[], &schema).is_ok());
    }

    #[test]
    fn pointers_start_with_a_slash_and_escape_tildes() {
        for good in ["", "/id", "/data/0/id", "/a~1b", "/m~0n"] {
            assert!(check_pointer(good).is_ok(), "{good}");
        }
        for bad in ["id", "data/id", "/a~2", "/a~"] {
            assert!(check_pointer(bad).is_err(), "{bad}");
        }
    }
}
