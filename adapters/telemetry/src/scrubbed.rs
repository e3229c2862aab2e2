//! The log layer's writer: every formatted line passes through the process's one secret scrubber
//! ([`opledger_domain::redact`]) on its way to stderr, so a secret a provider echoed back into a
//! message, or one a field carries by mistake, is not written whatever the level (`-vv`
//! included).
//!
//! The fmt layer formats an event whole and writes it with one `write_all`, so each write is
//! one line and a secret is never split between two writes.

use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

/// Makes a [`ScrubbedStderr`] per line.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Stderr;

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = ScrubbedStderr;

    fn make_writer(&'a self) -> Self::Writer {
        ScrubbedStderr
    }
}

/// Writes scrubbed text to stderr.
#[derive(Debug)]
pub(crate) struct ScrubbedStderr;

impl Write for ScrubbedStderr {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(bytes);
        let scrubbed = opledger_domain::redact::scrub(&text);
        io::stderr().write_all(scrubbed.as_bytes())?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}
