//! Tamper evidence: each event's metadata carries a hash chained to the previous event of its
//! stream, so an event edited, removed or moved behind the ledger's back no longer fits its
//! neighbours.
//!
//! `link(previous, version, type, data)` is SHA-256 over a fixed tag, the previous event's chain
//! hash (zeros for a stream's first event), the event's version and its content. The version is
//! in it so that two events swapped between versions do not verify. What a chain cannot show on
//! its own: an attacker who rewrites an event *and* every later chain hash of its stream, or who
//! cuts a stream's newest events. The verifier therefore also checks the event ids (which bind the
//! content to its version) and, where the store numbers its log without gaps, that no position
//! is missing. Anchoring chain heads outside the ledger is the next step, not done here.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::args::hex;
use crate::ids::StreamVersion;

/// A link of a stream's hash chain.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChainHash([u8; 32]);

/// The domain-separation tag of the chain; changing it would break every stored chain.
const CHAIN_TAG: &[u8] = b"opledger-chain-v1\0";

/// The chain hash of the event at `version` with this type and data, following `previous`.
pub fn link(
    previous: Option<&ChainHash>,
    version: StreamVersion,
    event_type: &str,
    data: &[u8],
) -> ChainHash {
    let mut hasher = Sha256::new();
    hasher.update(CHAIN_TAG);
    hasher.update(previous.map_or([0_u8; 32], |previous| previous.0));
    hasher.update(version.value().to_be_bytes());
    hasher.update(event_type.as_bytes());
    hasher.update([0]);
    hasher.update(data);
    ChainHash(hasher.finalize().into())
}

impl ChainHash {
    /// Parses 64 lowercase hex digits.
    pub fn parse_hex(text: &str) -> Option<Self> {
        let bytes = text.as_bytes();
        if bytes.len() != 64 {
            return None;
        }
        let mut out = [0_u8; 32];
        for (index, pair) in bytes.chunks_exact(2).enumerate() {
            out[index] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
        }
        Some(Self(out))
    }

    /// The hash as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

fn nibble(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

impl fmt::Debug for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChainHash({})", self.to_hex())
    }
}

impl fmt::Display for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_depends_on_the_previous_link_the_version_and_the_content() {
        let v0 = StreamVersion::FIRST;
        let first = link(None, v0, "T", b"{}");
        assert_eq!(first, link(None, v0, "T", b"{}"));
        assert_ne!(first, link(None, v0.next(), "T", b"{}"));
        assert_ne!(first, link(None, v0, "U", b"{}"));
        assert_ne!(first, link(None, v0, "T", b"{ }"));
        assert_ne!(link(Some(&first), v0, "T", b"{}"), first);
        assert_eq!(ChainHash::parse_hex(&first.to_hex()), Some(first));
        assert_eq!(ChainHash::parse_hex("zz"), None);
    }
}
