//! The run's trace: a hash of every choice and line (two runs of a seed must agree on it), and
//! the last lines in readable form, for the report of a broken invariant.

use std::collections::VecDeque;

/// How many readable lines a trace keeps: enough to see the steps before a broken invariant.
pub const TRACE_TAIL_LINES: usize = 40;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// The trace of one run.
#[derive(Clone, Debug)]
pub struct Trace {
    hash: u64,
    tail: VecDeque<String>,
    lines: u64,
    /// Every line, when asked for (a reproduction run prints them all).
    full: Option<Vec<String>>,
}

impl Trace {
    /// An empty trace; `keep_all` keeps every line, not just the tail.
    pub fn new(keep_all: bool) -> Self {
        Self {
            hash: FNV_OFFSET,
            tail: VecDeque::with_capacity(TRACE_TAIL_LINES),
            lines: 0,
            full: keep_all.then(Vec::new),
        }
    }

    /// Mixes a choice into the hash without a readable line (which task was polled).
    pub fn mix(&mut self, value: u64) {
        for byte in value.to_le_bytes() {
            self.hash = (self.hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME);
        }
    }

    /// Adds a readable line.
    pub fn line(&mut self, at_ms: i64, text: String) {
        let line = format!("[{:>9.3}s] {text}", at_ms as f64 / 1000.0);
        for byte in line.bytes() {
            self.hash = (self.hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME);
        }
        self.lines += 1;
        if self.tail.len() == TRACE_TAIL_LINES {
            self.tail.pop_front();
        }
        if let Some(full) = &mut self.full {
            full.push(line.clone());
        }
        self.tail.push_back(line);
    }

    /// The hash of everything traced so far.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// The last lines.
    pub fn tail(&self) -> Vec<String> {
        self.tail.iter().cloned().collect()
    }

    /// Every line, if they were kept.
    pub fn full(&self) -> Option<&[String]> {
        self.full.as_deref()
    }
}
