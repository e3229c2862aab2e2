//! The cipher: XChaCha20-Poly1305 with a random 192-bit nonce per sealing, and HMAC-SHA-256 for
//! subkeys and keyed hashes. Every key here is 32 bytes and wiped when dropped.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

/// Bytes of a key.
pub const KEY_BYTES: usize = 32;
/// Bytes of a nonce, stored in front of each ciphertext.
const NONCE_BYTES: usize = 24;

/// A 32-byte secret key, wiped from memory when dropped.
#[derive(Clone)]
pub struct Key(Zeroizing<[u8; KEY_BYTES]>);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(…)")
    }
}

impl Key {
    /// A key from its bytes.
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// A fresh random key from the operating system.
    pub fn generate() -> Result<Self, getrandom::Error> {
        let mut bytes = Zeroizing::new([0_u8; KEY_BYTES]);
        getrandom::fill(&mut bytes[..])?;
        Ok(Self(bytes))
    }

    /// The key's bytes (to wrap it).
    pub fn bytes(&self) -> &[u8; KEY_BYTES] {
        &self.0
    }

    /// HMAC-SHA-256 of `parts` (each length-prefixed, so no two lists collide) under this key.
    pub fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0[..])
            .expect("HMAC takes a key of any length");
        for part in parts {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }

    /// A subkey for one purpose, so one data key never serves two algorithms.
    pub fn derive(&self, purpose: &str) -> Key {
        Key::from_bytes(self.mac(&[b"opledger-subkey-v1", purpose.as_bytes()]))
    }

    /// `nonce || ciphertext || tag` of `plaintext`, authenticated with `aad`.
    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Result<Vec<u8>, getrandom::Error> {
        let mut nonce = [0_u8; NONCE_BYTES];
        getrandom::fill(&mut nonce)?;
        let cipher = XChaCha20Poly1305::new((&*self.0).into());
        let sealed = cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad,
                },
            )
            .expect("XChaCha20-Poly1305 encrypts any message below 256 GiB");
        let mut out = Vec::with_capacity(NONCE_BYTES + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// The plaintext of what [`Key::seal`] made with this key and `aad`; `None` for anything
    /// else (another key, other associated data, a changed byte).
    pub fn open(&self, sealed: &[u8], aad: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
        if sealed.len() < NONCE_BYTES {
            return None;
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_BYTES);
        let cipher = XChaCha20Poly1305::new((&*self.0).into());
        cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad,
                },
            )
            .ok()
            .map(Zeroizing::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_with_its_key_and_associated_data_only() {
        let key = Key::generate().unwrap();
        let sealed = key.seal(b"ann@example.com", b"operation 1").unwrap();
        assert_eq!(
            &key.open(&sealed, b"operation 1").unwrap()[..],
            b"ann@example.com"
        );
        assert!(
            key.open(&sealed, b"operation 2").is_none(),
            "other associated data"
        );
        assert!(
            Key::generate()
                .unwrap()
                .open(&sealed, b"operation 1")
                .is_none(),
            "another key"
        );
        let mut changed = sealed.clone();
        *changed.last_mut().unwrap() ^= 1;
        assert!(
            key.open(&changed, b"operation 1").is_none(),
            "a changed byte"
        );
        assert_ne!(
            key.seal(b"x", b"").unwrap(),
            key.seal(b"x", b"").unwrap(),
            "fresh nonces"
        );
    }
}
