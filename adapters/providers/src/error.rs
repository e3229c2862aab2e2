//! The one error type of loading and building a connector: where the problem is (file, line,
//! field) and what to write instead.
//!
//! Loading never stops at the first problem: every check runs and each finding becomes one
//! [`ConnectorError`], so a person fixing a connector file sees the whole list at once. Nothing
//! here may carry a secret: messages name environment variables, never their values.

use std::fmt;
use std::ops::Range;

/// One problem in a connector document or in what a connector is built with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectorError {
    /// The document's name (its file name, e.g. `crm-stand-keyed.toml`), or `overrides` for a
    /// value given in code or by the serve configuration.
    pub file: String,
    /// The 1-based line the problem is on, when it is at a place in the file.
    pub line: Option<usize>,
    /// The field, as a dotted path: `actions[0].request.path`, `accounts[1].token_env`.
    pub field: String,
    /// What is wrong and what to write instead.
    pub message: String,
}

impl fmt::Display for ConnectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}: {}", self.file, self.field, self.message),
            None => write!(f, "{}: {}: {}", self.file, self.field, self.message),
        }
    }
}

impl std::error::Error for ConnectorError {}

/// Every problem found, one per line (for a log or a terminal).
pub fn render_all(errors: &[ConnectorError]) -> String {
    errors
        .iter()
        .map(ConnectorError::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Collects the problems of one document while it is read, turning byte spans into lines.
#[derive(Debug)]
pub(crate) struct Findings<'a> {
    file: &'a str,
    text: &'a str,
    errors: Vec<ConnectorError>,
}

impl<'a> Findings<'a> {
    /// An empty list for the document `file` whose text is `text` (used to find lines).
    pub fn new(file: &'a str, text: &'a str) -> Self {
        Self {
            file,
            text,
            errors: Vec::new(),
        }
    }

    /// Records one problem at `span` (a byte range in the text), or at no place.
    pub fn add(&mut self, span: Option<&Range<usize>>, field: &str, message: impl Into<String>) {
        self.errors.push(ConnectorError {
            file: self.file.to_owned(),
            line: span.map(|span| line_of(self.text, span.start)),
            field: field.to_owned(),
            message: message.into(),
        });
    }

    /// Whether nothing was found so far.
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// How many problems were found so far.
    pub fn len(&self) -> usize {
        self.errors.len()
    }

    /// The problems found, in the order they were found.
    pub fn into_errors(self) -> Vec<ConnectorError> {
        self.errors
    }
}

/// The 1-based line of byte `offset` in `text`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&byte| byte == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_reads_file_line_field_message() {
        let mut findings = Findings::new("x.toml", "a = 1\nb = 2\n");
        findings.add(Some(&(6..7)), "b", "is wrong; write 3");
        findings.add(None, "overrides.base_url", "is empty");
        let errors = findings.into_errors();
        assert_eq!(errors[0].to_string(), "x.toml:2: b: is wrong; write 3");
        assert_eq!(
            errors[1].to_string(),
            "x.toml: overrides.base_url: is empty"
        );
        assert_eq!(render_all(&errors).lines().count(), 2);
    }

    #[test]
    fn lines_count_from_one() {
        assert_eq!(line_of("abc", 0), 1);
        assert_eq!(line_of("a\nb\nc", 4), 3);
        assert_eq!(line_of("a\n", 99), 2);
    }
}
