//! The decider's test fixtures: the domain's shared ones ([`crate::testing`]), under the name
//! the decider's tests have always used.

pub use crate::testing::*;
