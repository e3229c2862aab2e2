//! Signed checkpoints: a tree head of the transparency log ([`crate::merkle`]) in the C2SP
//! tlog-checkpoint format, signed as a C2SP signed-note with Ed25519, so Go's `note` and `tlog`
//! packages, witnesses and Sigstore's tools read it as they read any other log's.
//!
//! A checkpoint's text is three lines: the log's origin (its name, which is also the signing
//! key's name), the tree size in decimal, and the root hash in standard base64; a blank line
//! follows, then one signature line per signer: `— <key name> <base64(4-byte key id ‖ 64-byte
//! Ed25519 signature)>`. The key id is the first four bytes of SHA-256(name ‖ "\n" ‖ 0x01 ‖
//! public key).
//!
//! Pure: the signing key comes in as its text (from a file or the environment, never from the
//! ledger), and nothing here reads a clock or draws randomness. A checkpoint is accepted only
//! with a valid signature of the verifier key the caller names; other signatures (a witness's
//! cosignature) are kept and reported, never trusted.

use signed_note::{Note, Signer, StandardSigner, StandardVerifier, VerifierList};

use crate::merkle::{Hash, TreeHead};

/// Why a key or a checkpoint was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// The signing key's text is not a C2SP signed-note Ed25519 private key.
    #[error("the log's signing key is not a signed-note Ed25519 private key (`PRIVATE+KEY+<name>+<id>+<base64>`, as `opledger keys generate` writes): {reason}")]
    BadSigningKey {
        /// What is wrong.
        reason: String,
    },
    /// The verifier key's text is not a C2SP signed-note Ed25519 verifier key.
    #[error("the verifier key is not a signed-note Ed25519 verifier key (`<name>+<id>+<base64>`, as `opledger keys generate` prints): {reason}")]
    BadVerifierKey {
        /// What is wrong.
        reason: String,
    },
    /// The checkpoint's text is not a signed tlog-checkpoint.
    #[error("not a signed checkpoint: {reason}")]
    Malformed {
        /// What is wrong.
        reason: String,
    },
    /// The checkpoint is well formed but not signed by the verifier key given.
    #[error("the checkpoint is not signed by `{key}`: {reason}")]
    NotSigned {
        /// The verifier key's name.
        key: String,
        /// What the check said.
        reason: String,
    },
}

/// The log's signing key, parsed from its text.
pub struct LogSigner {
    signer: StandardSigner,
}

impl std::fmt::Debug for LogSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key itself.
        write!(f, "LogSigner({})", self.signer.name())
    }
}

impl LogSigner {
    /// Parses a signed-note Ed25519 private key (`PRIVATE+KEY+<name>+<id>+<base64>`).
    pub fn parse(text: &str) -> Result<Self, CheckpointError> {
        StandardSigner::new(text.trim())
            .map(|signer| Self { signer })
            .map_err(|error| CheckpointError::BadSigningKey {
                reason: error.to_string(),
            })
    }

    /// The key's name: the log's origin, the first line of every checkpoint it signs.
    pub fn origin(&self) -> &str {
        self.signer.name()
    }

    /// Signs the checkpoint of `head`: the note's bytes, as served and kept.
    pub fn sign(&self, head: TreeHead) -> Result<String, CheckpointError> {
        let text = checkpoint_text(self.origin(), head);
        let mut note = Note::new(text.as_bytes(), &[]).map_err(malformed)?;
        note.add_sigs(&[&self.signer as &dyn Signer])
            .map_err(|error| CheckpointError::BadSigningKey {
                reason: error.to_string(),
            })?;
        String::from_utf8(note.to_bytes()).map_err(|error| CheckpointError::Malformed {
            reason: error.to_string(),
        })
    }
}

/// Makes the log's key pair named `name` (the log's origin, e.g. `example.com/ledger`) from 32
/// random bytes: the private key's text (for the key file or environment variable) and the
/// verifier key's text (for auditors and witnesses), both in the signed-note key format.
pub fn generate_keys(name: &str, seed: [u8; 32]) -> Result<(String, String), CheckpointError> {
    use base64::Engine as _;
    if !signed_note::is_key_name_valid(name) {
        return Err(CheckpointError::BadSigningKey {
            reason: format!(
                "the name `{name}` must be non-empty, without spaces or `+` (e.g. example.com/ledger)"
            ),
        });
    }
    let signing = ed25519_dalek::SigningKey::from_bytes(&seed);
    let verifier = signed_note::new_ed25519_verifier_key(name, &signing.verifying_key());
    let mut public = vec![ED25519];
    public.extend_from_slice(signing.verifying_key().as_bytes());
    let mut private = vec![ED25519];
    private.extend_from_slice(&seed);
    let signer = format!(
        "PRIVATE+KEY+{name}+{:08x}+{}",
        signed_note::key_id(name, &public),
        base64::engine::general_purpose::STANDARD.encode(private)
    );
    Ok((signer, verifier))
}

/// The signed-note algorithm byte of Ed25519 keys.
const ED25519: u8 = 1;

/// The unsigned body of a checkpoint: origin, size and base64 root hash, each on its own line.
pub fn checkpoint_text(origin: &str, head: TreeHead) -> String {
    format!("{origin}\n{}\n{}\n", head.size, head.root)
}

fn malformed(error: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Malformed {
        reason: error.to_string(),
    }
}

/// A checkpoint whose signature by the log's key was checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The log's origin (the first line).
    pub origin: String,
    /// The tree head it commits to.
    pub head: TreeHead,
    /// Names of the other signers (witnesses' cosignatures) whose keys were not given, so not
    /// checked.
    pub other_signers: Vec<String>,
}

/// Parses `note` and checks it is a checkpoint signed by `verifier_key`, whose name must be the
/// checkpoint's origin.
pub fn open(note: &str, verifier_key: &str) -> Result<Checkpoint, CheckpointError> {
    let verifier = StandardVerifier::new(verifier_key.trim()).map_err(|error| {
        CheckpointError::BadVerifierKey {
            reason: error.to_string(),
        }
    })?;
    let key_name = signed_note::Verifier::name(&verifier).to_owned();
    let parsed = Note::from_bytes(note.as_bytes()).map_err(malformed)?;
    let (_, unverified) = parsed
        .verify(&VerifierList::new(vec![Box::new(verifier)]))
        .map_err(|error| CheckpointError::NotSigned {
            key: key_name.clone(),
            reason: error.to_string(),
        })?;
    let body = tlog_tiles::Checkpoint::from_bytes(parsed.text()).map_err(malformed)?;
    if body.origin() != key_name {
        return Err(CheckpointError::NotSigned {
            key: key_name,
            reason: format!("the checkpoint is of the log `{}`", body.origin()),
        });
    }
    Ok(Checkpoint {
        origin: body.origin().to_owned(),
        head: TreeHead {
            size: body.size(),
            root: Hash(body.hash().0),
        },
        other_signers: unverified
            .iter()
            .map(|signature| signature.name().to_owned())
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merkle::EMPTY_TREE_HASH;

    fn keys() -> (LogSigner, String) {
        let (signer, verifier) = generate_keys("example.com/log", [7; 32]).unwrap();
        (
            LogSigner::parse(&signer).expect("a generated key parses"),
            verifier,
        )
    }

    #[test]
    fn a_signed_checkpoint_opens_with_its_verifier_key() {
        let (signer, verifier) = keys();
        let head = TreeHead {
            size: 7,
            root: EMPTY_TREE_HASH,
        };
        let note = signer.sign(head).unwrap();
        assert!(note.starts_with("example.com/log\n7\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n\n— example.com/log "));
        let opened = open(&note, &verifier).unwrap();
        assert_eq!(opened.head, head);
        assert_eq!(opened.origin, "example.com/log");
    }

    #[test]
    fn a_checkpoint_with_a_changed_size_or_hash_is_refused() {
        let (signer, verifier) = keys();
        let note = signer
            .sign(TreeHead {
                size: 7,
                root: EMPTY_TREE_HASH,
            })
            .unwrap();
        let edited = note.replacen("\n7\n", "\n8\n", 1);
        assert!(matches!(
            open(&edited, &verifier),
            Err(CheckpointError::NotSigned { .. })
        ));
    }

    #[test]
    fn a_malformed_key_is_named_as_such() {
        assert!(matches!(
            LogSigner::parse("not a key"),
            Err(CheckpointError::BadSigningKey { .. })
        ));
        assert!(matches!(
            open("x\n1\nAAAA\n\n", "nope"),
            Err(CheckpointError::BadVerifierKey { .. })
        ));
    }
}
