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

/// A configured limit outside the range its owning constants allow: which field, its value and
/// the range, so every entry point (a config file, a flag, a test) reports it the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{field}` is {value}; it must be between {min} and {max}")]
pub struct OutOfRange {
    /// The field, as configuration names it (`lease_ms`, `max_attempts`, …).
    pub field: &'static str,
    /// The value refused.
    pub value: u64,
    /// The smallest value allowed.
    pub min: u64,
    /// The largest value allowed.
    pub max: u64,
}

impl OutOfRange {
    /// Checks that `value` of `field` lies in `min..=max`.
    pub fn check(field: &'static str, value: u64, min: u64, max: u64) -> Result<(), Self> {
        if (min..=max).contains(&value) {
            Ok(())
        } else {
            Err(Self {
                field,
                value,
                min,
                max,
            })
        }
    }
}

impl From<OutOfRange> for ValidationError {
    fn from(error: OutOfRange) -> Self {
        Self::new(
            error.field,
            format!(
                "is {}; it must be between {} and {}",
                error.value, error.min, error.max
            ),
        )
    }
}
