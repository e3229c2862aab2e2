//! The Python environments the other test binaries make, shared (the upstreams' is made here).

#[path = "../python_venv/mod.rs"]
pub mod python_venv;
