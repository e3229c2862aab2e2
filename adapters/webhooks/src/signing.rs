//! Standard Webhooks signatures (<https://www.standardwebhooks.com>): the three headers a
//! receiver verifies with the specification's own libraries.
//!
//! A secret is `whsec_` followed by standard base64 of the key bytes. The signed content is
//! `"{webhook-id}.{webhook-timestamp}.{body}"`; `webhook-signature` carries one `v1,<base64
//! HMAC-SHA256>` per active secret, separated by spaces, so a receiver that knows either the old
//! or the new secret accepts a delivery while a secret is being rotated. A secret's bytes must
//! never reach a log line, an error message or the attempt log.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use opledger_domain::ids::EventId;
use sha2::Sha256;

/// The prefix of every secret, as the specification writes them.
pub const SECRET_PREFIX: &str = "whsec_";
/// The shortest key accepted, in bytes: the specification asks for 24 to 64 random bytes.
pub const MIN_SECRET_BYTES: usize = 24;
/// The longest key accepted, in bytes.
pub const MAX_SECRET_BYTES: usize = 64;
/// Most secrets one endpoint signs with at once (the current one and those being rotated out).
pub const MAX_SECRETS_PER_ENDPOINT: usize = 4;
const _: () = assert!(MIN_SECRET_BYTES <= MAX_SECRET_BYTES);

/// One signing key, decoded from its `whsec_…` text. Its `Debug` does not show the key.
#[derive(Clone)]
pub struct Secret {
    key: Vec<u8>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(whsec_…)")
    }
}

impl Secret {
    /// Reads `whsec_<base64>`; the message says what is wrong and how to make a good one, and
    /// never repeats the text given.
    pub fn parse(text: &str) -> Result<Self, String> {
        const MAKE_ONE: &str = "make one with `echo whsec_$(openssl rand -base64 32)`";
        let Some(encoded) = text.trim().strip_prefix(SECRET_PREFIX) else {
            return Err(format!(
                "the secret does not start with `{SECRET_PREFIX}`; Standard Webhooks secrets are `{SECRET_PREFIX}` followed by base64: {MAKE_ONE}"
            ));
        };
        let key = STANDARD
            .decode(encoded)
            .map_err(|_| format!("the secret after `{SECRET_PREFIX}` is not base64; {MAKE_ONE}"))?;
        if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&key.len()) {
            return Err(format!(
                "the secret's key is {} bytes; use {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} random bytes: {MAKE_ONE}",
                key.len()
            ));
        }
        Ok(Self { key })
    }

    /// The `whsec_…` text of a key of `key` bytes (made by the caller from a secure source).
    pub fn encode(key: &[u8]) -> String {
        format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
    }

    /// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.
    fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key)
            .expect("HMAC-SHA256 takes a key of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

/// The `webhook-id` of the delivery that carries the event `event_id`: the same for every
/// attempt, every endpoint and every restart, because event ids are deterministic and stored
/// with the event. A receiver deduplicates by it.
pub fn webhook_id(event_id: EventId) -> String {
    format!("msg_{}", event_id.as_uuid().simple())
}

/// The `webhook-signature` header: one signature per secret, separated by spaces.
pub fn signature_header(secrets: &[Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
    debug_assert!(!secrets.is_empty(), "an endpoint has at least one secret");
    secrets
        .iter()
        .map(|secret| secret.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_specifications_published_example() {
        // The example of the Standard Webhooks specification's reference libraries
        // (libraries/python/standardwebhooks/tests/test_webhooks.py and the spec's README).
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("valid");
        let header = signature_header(
            &[secret],
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(header, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn every_secret_of_a_rotation_signs_and_the_header_lists_them_all() {
        let old = Secret::parse(&format!("whsec_{}", STANDARD.encode([1u8; 32]))).expect("valid");
        let new = Secret::parse(&format!("whsec_{}", STANDARD.encode([2u8; 32]))).expect("valid");
        let header = signature_header(&[old.clone(), new], "msg_1", 5, b"{}");
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], signature_header(&[old], "msg_1", 5, b"{}"));
        assert_ne!(parts[0], parts[1]);
    }

    #[test]
    fn secrets_without_the_prefix_not_base64_or_too_short_are_refused_without_echoing_them() {
        for bad in [
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_not base64!",
            "whsec_c2hvcnQ=",
        ] {
            let message = Secret::parse(bad).expect_err(bad);
            assert!(message.contains("openssl rand"), "{message}");
            assert!(!message.contains(bad), "{message}");
        }
        assert_eq!(
            format!(
                "{:?}",
                Secret::parse(&format!("whsec_{}", STANDARD.encode([7u8; 32]))).expect("valid")
            ),
            "Secret(whsec_…)"
        );
    }

    #[test]
    fn the_webhook_id_is_a_function_of_the_event_id_alone() {
        let event = EventId::from_uuid(uuid_of(7));
        assert_eq!(webhook_id(event), webhook_id(event));
        assert_ne!(
            webhook_id(event),
            webhook_id(EventId::from_uuid(uuid_of(8)))
        );
        assert!(webhook_id(event).starts_with("msg_"));
    }

    fn uuid_of(n: u128) -> uuid::Uuid {
        uuid::Uuid::from_u128(n)
    }
}
