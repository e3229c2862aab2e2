//! A TOML document as a tree that keeps the byte span of every value, and a reader over its tables
//! that records a finding for every key it cannot use instead of stopping at the first.
//!
//! Why not `#[derive(Deserialize)]` with `deny_unknown_fields`: serde stops at the first unknown
//! key or wrong type, and a person fixing a connector file should see every problem at once. So
//! the file is read into this tree first (the `toml` crate's span protocol, the one behind
//! `toml::Spanned`, gives each value its place), and the document reader then takes what it knows from each table, reporting unknown
//! keys and wrong types with their lines as it goes.

use std::ops::Range;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::error::Findings;

/// The key under which the `toml` crate hands a date-time to a visitor.
const DATETIME_KEY: &str = "$__toml_private_datetime";

/// One value of the document and where it is written.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Node {
    /// The bytes of the text it was read from.
    pub span: Range<usize>,
    /// The value.
    pub value: Value,
}

/// A TOML value whose parts keep their spans.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    String(String),
    Integer(i64),
    Float(f64),
    Boolean(bool),
    /// A TOML date-time, as written.
    Datetime(String),
    Array(Vec<Node>),
    /// Keys in the order they were written.
    Table(Vec<(String, Node)>),
}

impl Value {
    /// The kind of value, as an error message names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::String(_) => "a string",
            Self::Integer(_) => "an integer",
            Self::Float(_) => "a float",
            Self::Boolean(_) => "a boolean",
            Self::Datetime(_) => "a date-time",
            Self::Array(_) => "an array",
            Self::Table(_) => "a table",
        }
    }
}

/// A span no value has: the value was written without one (an implicit table), filled in later.
const UNKNOWN: Range<usize> = usize::MAX..usize::MAX;

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde_spanned::__unstable::{END_FIELD, NAME, START_FIELD, VALUE_FIELD};
        const FIELDS: &[&str] = &[START_FIELD, END_FIELD, VALUE_FIELD];
        deserializer.deserialize_struct(NAME, FIELDS, NodeVisitor)
    }
}

/// Reads a spanned value, or — when the deserializer has no span for it — the bare value.
struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a TOML value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        use serde_spanned::__unstable::{END_FIELD, START_FIELD, VALUE_FIELD};
        let Some(first) = map.next_key::<String>()? else {
            return Ok(Node {
                span: UNKNOWN,
                value: Value::Table(Vec::new()),
            });
        };
        if first != START_FIELD {
            // A table without a span: `first` is its first key.
            let value = ValueVisitor::table(first, map)?;
            return Ok(Node {
                span: UNKNOWN,
                value,
            });
        }
        let start: usize = map.next_value()?;
        let mut end = None;
        let mut value = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == END_FIELD {
                end = Some(map.next_value::<usize>()?);
            } else if key == VALUE_FIELD {
                value = Some(map.next_value::<Value>()?);
            } else {
                return Err(de::Error::unknown_field(&key, &[END_FIELD, VALUE_FIELD]));
            }
        }
        match (end, value) {
            (Some(end), Some(value)) => Ok(Node {
                span: start..end,
                value,
            }),
            _ => Err(de::Error::custom(
                "a spanned value without its end or value",
            )),
        }
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Node, E> {
        ValueVisitor.visit_str(value).map(Node::unplaced)
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Node, E> {
        ValueVisitor.visit_string(value).map(Node::unplaced)
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Node, E> {
        ValueVisitor.visit_i64(value).map(Node::unplaced)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Node, E> {
        ValueVisitor.visit_u64(value).map(Node::unplaced)
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Node, E> {
        ValueVisitor.visit_f64(value).map(Node::unplaced)
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Node, E> {
        ValueVisitor.visit_bool(value).map(Node::unplaced)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Node, A::Error> {
        ValueVisitor.visit_seq(seq).map(Node::unplaced)
    }
}

impl Node {
    fn unplaced(value: Value) -> Self {
        Self {
            span: UNKNOWN,
            value,
        }
    }

    /// Gives every value without a span one from nearby: a table takes its first placed
    /// child's, anything still without one its parent's.
    fn place(&mut self, parent: &Range<usize>) {
        let children: Vec<&mut Node> = match &mut self.value {
            Value::Array(items) => items.iter_mut().collect(),
            Value::Table(entries) => entries.iter_mut().map(|(_, node)| node).collect(),
            _ => Vec::new(),
        };
        let own = if self.span == UNKNOWN {
            parent.clone()
        } else {
            self.span.clone()
        };
        let mut first_child = None;
        for child in children {
            child.place(&own);
            first_child.get_or_insert_with(|| child.span.clone());
        }
        if self.span == UNKNOWN {
            self.span = first_child
                .filter(|span| *span != *parent)
                .unwrap_or_else(|| parent.clone());
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a TOML value")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Value, E> {
        Ok(Value::Integer(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Value, E> {
        i64::try_from(value)
            .map(Value::Integer)
            .map_err(|_| E::custom("an integer above i64::MAX"))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Value, E> {
        Ok(Value::Float(value))
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Boolean(value))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        match map.next_key::<String>()? {
            Some(first) => Self::table(first, map),
            None => Ok(Value::Table(Vec::new())),
        }
    }
}

impl ValueVisitor {
    /// The rest of a table whose first key was already read (or a date-time, which the `toml`
    /// crate hands over as a one-key table).
    fn table<'de, A: MapAccess<'de>>(first: String, mut map: A) -> Result<Value, A::Error> {
        if first == DATETIME_KEY {
            return Ok(Value::Datetime(map.next_value::<String>()?));
        }
        let mut entries = vec![(first, map.next_value::<Node>()?)];
        while let Some(key) = map.next_key::<String>()? {
            entries.push((key, map.next_value::<Node>()?));
        }
        Ok(Value::Table(entries))
    }
}

/// Parses a whole document; a syntax error is returned with its span and the parser's message.
pub(crate) fn parse(text: &str) -> Result<Node, (Option<Range<usize>>, String)> {
    match toml::from_str::<Value>(text) {
        Ok(value) => {
            let mut root = Node { span: 0..0, value };
            root.place(&(0..0));
            Ok(root)
        }
        Err(error) => Err((error.span(), error.message().trim().to_owned())),
    }
}

/// A value read from the document with its place: the span, and the dotted field it is at.
#[derive(Clone, Debug)]
pub(crate) struct Found<'n, T> {
    pub value: T,
    pub span: &'n Range<usize>,
    pub field: String,
}

/// One table of the document, read key by key.
#[derive(Clone, Debug)]
pub(crate) struct Table<'n> {
    path: String,
    span: &'n Range<usize>,
    entries: &'n [(String, Node)],
}

/// `prefix.key`, or `key` at the top.
pub(crate) fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

impl<'n> Table<'n> {
    /// The table `node` is, at the dotted `path`; `None` (and a finding) when it is no table.
    pub fn of(node: &'n Node, path: String, findings: &mut Findings<'_>) -> Option<Self> {
        match &node.value {
            Value::Table(entries) => Some(Self {
                path,
                span: &node.span,
                entries,
            }),
            other => {
                findings.add(
                    Some(&node.span),
                    &path,
                    format!("must be a table, not {}", other.kind()),
                );
                None
            }
        }
    }

    /// Where the table itself is written.
    pub fn span(&self) -> &'n Range<usize> {
        self.span
    }

    /// The dotted path of `key` in this table.
    pub fn field(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// The value under `key`, if written.
    pub fn get(&self, key: &str) -> Option<&'n Node> {
        self.entries
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, node)| node)
    }

    /// Whether `key` is written.
    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Every entry, in the order written.
    pub fn entries(&self) -> &'n [(String, Node)] {
        self.entries
    }

    /// Records a finding for each key not in `known`.
    pub fn only(&self, known: &[&str], findings: &mut Findings<'_>) {
        for (key, node) in self.entries {
            if !known.contains(&key.as_str()) {
                findings.add(
                    Some(&node.span),
                    &self.field(key),
                    format!(
                        "unknown key `{key}`; the keys allowed here are: {}",
                        known.join(", ")
                    ),
                );
            }
        }
    }

    /// Records that `key` is missing, with `hint` saying what to write.
    pub fn missing(&self, key: &str, hint: &str, findings: &mut Findings<'_>) {
        findings.add(
            Some(self.span),
            &self.field(key),
            format!("is missing; {hint}"),
        );
    }

    fn wrong(&self, key: &str, node: &Node, wanted: &str, findings: &mut Findings<'_>) {
        findings.add(
            Some(&node.span),
            &self.field(key),
            format!("must be {wanted}, not {}", node.value.kind()),
        );
    }

    /// The string under `key`, if written as one.
    pub fn string(&self, key: &str, findings: &mut Findings<'_>) -> Option<Found<'n, &'n str>> {
        let node = self.get(key)?;
        match &node.value {
            Value::String(text) => Some(Found {
                value: text.as_str(),
                span: &node.span,
                field: self.field(key),
            }),
            _ => {
                self.wrong(key, node, "a string (text in quotes)", findings);
                None
            }
        }
    }

    /// The string under `key`; a finding with `hint` when it is missing.
    pub fn required_string(
        &self,
        key: &str,
        hint: &str,
        findings: &mut Findings<'_>,
    ) -> Option<Found<'n, &'n str>> {
        if !self.has(key) {
            self.missing(key, hint, findings);
            return None;
        }
        self.string(key, findings)
    }

    /// The non-negative integer under `key`, if written as one.
    pub fn unsigned(&self, key: &str, findings: &mut Findings<'_>) -> Option<Found<'n, u64>> {
        let node = self.get(key)?;
        match &node.value {
            Value::Integer(number) => match u64::try_from(*number) {
                Ok(value) => Some(Found {
                    value,
                    span: &node.span,
                    field: self.field(key),
                }),
                Err(_) => {
                    findings.add(
                        Some(&node.span),
                        &self.field(key),
                        format!("is {number}; it must not be negative"),
                    );
                    None
                }
            },
            _ => {
                self.wrong(key, node, "an integer", findings);
                None
            }
        }
    }

    /// The boolean under `key`, if written as one.
    pub fn boolean(&self, key: &str, findings: &mut Findings<'_>) -> Option<bool> {
        let node = self.get(key)?;
        match &node.value {
            Value::Boolean(value) => Some(*value),
            _ => {
                self.wrong(key, node, "true or false", findings);
                None
            }
        }
    }

    /// The dotted path of the table itself (empty at the top).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The sub-table under `key`, if written as one.
    pub fn table(&self, key: &str, findings: &mut Findings<'_>) -> Option<Self> {
        let node = self.get(key)?;
        Table::of(node, self.field(key), findings)
    }

    /// The tables of the array under `key` (`[[key]]`); items that are no tables are findings.
    pub fn tables(&self, key: &str, findings: &mut Findings<'_>) -> Vec<Self> {
        let Some(items) = self.array(key, findings) else {
            return Vec::new();
        };
        let field = self.field(key);
        items
            .iter()
            .enumerate()
            .filter_map(|(index, item)| Table::of(item, format!("{field}[{index}]"), findings))
            .collect()
    }

    /// The array under `key`, if written as one.
    pub fn array(&self, key: &str, findings: &mut Findings<'_>) -> Option<&'n [Node]> {
        let node = self.get(key)?;
        match &node.value {
            Value::Array(items) => Some(items),
            _ => {
                self.wrong(key, node, "an array ([…])", findings);
                None
            }
        }
    }

    /// The strings of the array under `key`; items that are no strings are findings.
    pub fn strings(
        &self,
        key: &str,
        findings: &mut Findings<'_>,
    ) -> Option<Vec<Found<'n, &'n str>>> {
        let items = self.array(key, findings)?;
        let mut strings = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let field = format!("{}[{index}]", self.field(key));
            match &item.value {
                Value::String(text) => strings.push(Found {
                    value: text.as_str(),
                    span: &item.span,
                    field,
                }),
                other => findings.add(
                    Some(&item.span),
                    &field,
                    format!("must be a string, not {}", other.kind()),
                ),
            }
        }
        Some(strings)
    }

    /// The non-negative integers of the array under `key`; other items are findings.
    pub fn unsigneds(&self, key: &str, findings: &mut Findings<'_>) -> Option<Vec<Found<'n, u64>>> {
        let items = self.array(key, findings)?;
        let mut numbers = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let field = format!("{}[{index}]", self.field(key));
            match &item.value {
                Value::Integer(number) if *number >= 0 => numbers.push(Found {
                    value: number.unsigned_abs(),
                    span: &item.span,
                    field,
                }),
                other => findings.add(
                    Some(&item.span),
                    &field,
                    format!("must be a non-negative integer, not {}", other.kind()),
                ),
            }
        }
        Some(numbers)
    }
}

/// A node as JSON: tables become objects (in the order written), date-times strings. Floats that
/// JSON cannot hold (NaN, infinities) become `null`.
pub(crate) fn to_json(node: &Node) -> serde_json::Value {
    use serde_json::Value as Json;
    match &node.value {
        Value::String(text) | Value::Datetime(text) => Json::String(text.clone()),
        Value::Integer(number) => Json::from(*number),
        Value::Float(number) => {
            serde_json::Number::from_f64(*number).map_or(Json::Null, Json::Number)
        }
        Value::Boolean(value) => Json::Bool(*value),
        Value::Array(items) => Json::Array(items.iter().map(to_json).collect()),
        Value::Table(entries) => Json::Object(
            entries
                .iter()
                .map(|(key, value)| (key.clone(), to_json(value)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::line_of;

    const TEXT: &str = r#"
id = "crm"
count = 3

[auth]
kind = "bearer"

[[actions]]
name = "create_task"
[actions.request]
path = "/tasks"
when = 1979-05-27T07:32:00Z

[actions.input]
type = "object"
properties.title = { type = "string" }
"#;

    fn line(node: &Node) -> usize {
        line_of(TEXT, node.span.start)
    }

    #[test]
    fn every_value_keeps_its_line_even_in_arrays_of_tables_and_sub_tables() {
        let root = parse(TEXT).expect("valid TOML");
        let mut findings = Findings::new("t.toml", TEXT);
        let top = Table::of(&root, String::new(), &mut findings).expect("a table");
        assert_eq!(line(top.get("id").expect("id")), 2);
        assert_eq!(line(top.get("count").expect("count")), 3);
        let actions = top.tables("actions", &mut findings);
        let action = &actions[0];
        assert_eq!(action.path(), "actions[0]");
        assert_eq!(line(action.get("name").expect("name")), 9);
        let request = action.table("request", &mut findings).expect("request");
        assert_eq!(request.field("path"), "actions[0].request.path");
        // `properties` is an implicit table (no span of its own): it takes its child's line.
        let input = action.table("input", &mut findings).expect("input");
        let properties = input.get("properties").expect("properties");
        assert_eq!(line(properties), 16);
        assert_eq!(line(request.get("path").expect("path")), 11);
        assert_eq!(
            request.get("when").map(|node| &node.value),
            Some(&Value::Datetime("1979-05-27T07:32:00Z".to_owned()))
        );
        assert!(findings.is_empty());
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_each_a_finding() {
        let root = parse(TEXT).expect("valid TOML");
        let mut findings = Findings::new("t.toml", TEXT);
        let top = Table::of(&root, String::new(), &mut findings).expect("a table");
        top.only(&["id", "auth", "actions"], &mut findings);
        assert!(top.string("count", &mut findings).is_none());
        assert!(top.unsigned("id", &mut findings).is_none());
        let errors = findings.into_errors();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert_eq!(errors[0].field, "count");
        assert_eq!(errors[0].line, Some(3));
        assert!(errors[0].message.contains("unknown key"), "{}", errors[0]);
        assert!(
            errors[1].message.contains("must be a string"),
            "{}",
            errors[1]
        );
        assert_eq!(errors[2].line, Some(2));
    }

    #[test]
    fn a_syntax_error_has_a_span() {
        let (span, message) = parse("a = \n").expect_err("invalid");
        assert!(span.is_some());
        assert!(!message.is_empty());
    }
}
