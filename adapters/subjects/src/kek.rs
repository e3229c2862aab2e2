//! The key-encryption key (KEK): 32 bytes from a file or an environment variable, written as 64
//! hex digits or standard base64. It wraps every data key; it is never stored by opledger.
//! Its id (a keyed hash of it, not the key) is stored with the key store, so a server started
//! with another key is refused with both ids named instead of failing on every value.

use base64::Engine as _;
use zeroize::Zeroizing;

use crate::cipher::{Key, KEY_BYTES};

/// Why a key-encryption key could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KekError {
    /// The file could not be read.
    #[error("the key-encryption key file {path} cannot be read: {reason}")]
    File {
        /// The file.
        path: String,
        /// What the system said.
        reason: String,
    },
    /// The environment variable is not set.
    #[error("the environment variable {name} holding the key-encryption key is not set; set it to 32 random bytes as 64 hex digits (e.g. `openssl rand -hex 32`)")]
    Unset {
        /// The variable.
        name: String,
    },
    /// The text is not 32 bytes in hex or base64.
    #[error("the key-encryption key from {from} is not 32 bytes written as 64 hex digits or base64; make one with `openssl rand -hex 32`")]
    Malformed {
        /// Where it came from.
        from: String,
    },
}

/// A key-encryption key.
#[derive(Clone, Debug)]
pub struct Kek {
    key: Key,
}

impl Kek {
    /// The key written in `text` (64 hex digits or base64 of 32 bytes; surrounding whitespace
    /// ignored); `from` names where it came from in the refusal.
    pub fn parse(text: &str, from: &str) -> Result<Self, KekError> {
        let text = Zeroizing::new(text.trim().to_owned());
        let bytes = decode_hex(&text)
            .or_else(|| {
                base64::engine::general_purpose::STANDARD
                    .decode(text.as_bytes())
                    .ok()
                    .map(Zeroizing::new)
            })
            .filter(|bytes| bytes.len() == KEY_BYTES)
            .ok_or_else(|| KekError::Malformed {
                from: from.to_owned(),
            })?;
        let mut key = [0_u8; KEY_BYTES];
        key.copy_from_slice(&bytes);
        Ok(Self {
            key: Key::from_bytes(key),
        })
    }

    /// The key in the file at `path`.
    pub fn from_file(path: &std::path::Path) -> Result<Self, KekError> {
        let text = std::fs::read_to_string(path).map_err(|error| KekError::File {
            path: path.display().to_string(),
            reason: error.to_string(),
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// The key in the environment variable `name`.
    pub fn from_env(name: &str) -> Result<Self, KekError> {
        let text = std::env::var(name).map_err(|_| KekError::Unset {
            name: name.to_owned(),
        })?;
        Self::parse(&text, &format!("${name}"))
    }

    /// The key's id: 16 hex digits of a keyed hash of it. It names the key in messages and in
    /// the key store without revealing it.
    pub fn id(&self) -> String {
        let digest = self.key.mac(&[b"opledger-kek-id-v1"]);
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A key of its own for sealing something other than data keys (`purpose` names it), so
    /// the key-encryption key never serves two uses directly.
    pub fn subkey(&self, purpose: &str) -> Key {
        self.key.derive(purpose)
    }

    /// The key itself.
    pub(crate) fn key(&self) -> &Key {
        &self.key
    }
}

fn decode_hex(text: &str) -> Option<Zeroizing<Vec<u8>>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let bytes = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some(Zeroizing::new(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kek_reads_as_hex_or_base64_and_refuses_anything_else() {
        let hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        let a = Kek::parse(hex, "test").unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(a.key().bytes());
        assert_eq!(
            Kek::parse(&format!(" {b64}\n"), "test").unwrap().id(),
            a.id()
        );
        assert!(Kek::parse("abcd", "test").is_err());
        assert!(Kek::parse("not a key at all", "test").is_err());
        assert_eq!(a.id().len(), 16);
    }
}
