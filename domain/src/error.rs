//! Input validation errors: what is wrong with which field, and what to do about it.

use std::fmt;

/// An input the ledger refuses before anything is written. The message names the field, says
/// what is wrong and, where it helps, what to send instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationError {
    /// The input field that is wrong, e.g. `args` or `tenant`.
    pub field: String,
    /// What is wrong with it, in a sentence a caller can act on.
    pub message: String,
}

impl ValidationError {
    /// A refusal of `field` for the stated reason.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.message)
    }
}
