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
//! A checkpoint of a store that keeps tenant trees has one extension line after the root hash
//! (C2SP tlog-checkpoint allows them; generic tools read the first three lines and ignore it):
//! `opledger-tenants <map size> <base64 map root>`, the head of the tenants' map
//! ([`crate::merkle::tenants`]), so one signature covers the log and every tenant's history.
//!
//! Pure: the signing key comes in as its text (from a file or the environment, never from the
//! ledger), and nothing here reads a clock or draws randomness. A checkpoint is accepted only
//! with a valid signature of the verifier key the caller names; other signatures (a witness's
//! cosignature) are kept and reported, never trusted; a witness's cosignature (C2SP
//! tlog-cosignature) is checked when its key is given ([`open_cosigned`]).

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

    /// Signs the checkpoint of `head` and, when given, of the tenants' map at the same log size:
    /// the note's bytes, as served and kept.
    pub fn sign(
        &self,
        head: TreeHead,
        tenants: Option<TreeHead>,
    ) -> Result<String, CheckpointError> {
        let text = checkpoint_text(self.origin(), head, tenants);
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

/// The first word of the extension line that carries the tenants' map.
pub const TENANTS_EXTENSION: &str = "opledger-tenants";

/// The unsigned body of a checkpoint: origin, size and base64 root hash, each on its own line,
/// then the tenants' map line when there is one.
pub fn checkpoint_text(origin: &str, head: TreeHead, tenants: Option<TreeHead>) -> String {
    let mut text = format!("{origin}\n{}\n{}\n", head.size, head.root);
    if let Some(map) = tenants {
        text.push_str(&format!("{TENANTS_EXTENSION} {} {}\n", map.size, map.root));
    }
    text
}

/// The tenants' map head a checkpoint's text names, read without checking its signature: for the
/// log's own use of a checkpoint it keeps (a verifier uses [`open`]).
pub fn unchecked_tenants(note: &str) -> Result<Option<TreeHead>, CheckpointError> {
    let text = note.split("\n\n").next().unwrap_or_default().to_owned() + "\n";
    let body = tlog_tiles::Checkpoint::from_bytes(text.as_bytes()).map_err(malformed)?;
    tenants_of(body.extension())
}

/// The tenants' map head in a checkpoint's extension lines, if one names it.
fn tenants_of(extension: &str) -> Result<Option<TreeHead>, CheckpointError> {
    let Some(line) = extension
        .lines()
        .find(|line| line.split(' ').next() == Some(TENANTS_EXTENSION))
    else {
        return Ok(None);
    };
    let bad = || CheckpointError::Malformed {
        reason: format!("the line `{line}` is not `{TENANTS_EXTENSION} <size> <base64 root>`"),
    };
    let mut words = line.split(' ').skip(1);
    let (Some(size), Some(root), None) = (words.next(), words.next(), words.next()) else {
        return Err(bad());
    };
    let size = size
        .parse::<u64>()
        .ok()
        .filter(|parsed| parsed.to_string() == size)
        .ok_or_else(bad)?;
    let root = Hash::parse_hash(root).map_err(|_| bad())?;
    Ok(Some(TreeHead { size, root }))
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
    /// The head of the tenants' map it commits to, if it carries one.
    pub tenants: Option<TreeHead>,
    /// Names of the other signers (witnesses' cosignatures) whose keys were not given, so not
    /// checked.
    pub other_signers: Vec<String>,
    /// Witnesses whose cosignature was checked, with the time (Unix seconds) each cosigned at.
    pub cosigned_by: Vec<(String, u64)>,
}

/// Parses `note` and checks it is a checkpoint signed by `verifier_key`, whose name must be the
/// checkpoint's origin.
pub fn open(note: &str, verifier_key: &str) -> Result<Checkpoint, CheckpointError> {
    open_cosigned(note, verifier_key, &[])
}

/// [`open`], and each witness in `witness_keys` (C2SP tlog-cosignature verifier keys,
/// `<name>+<id>+<base64(0x04 ‖ public key)>`) must have cosigned it: a missing or bad
/// cosignature of a named witness refuses the checkpoint.
pub fn open_cosigned(
    note: &str,
    verifier_key: &str,
    witness_keys: &[String],
) -> Result<Checkpoint, CheckpointError> {
    let verifier = StandardVerifier::new(verifier_key.trim()).map_err(|error| {
        CheckpointError::BadVerifierKey {
            reason: error.to_string(),
        }
    })?;
    let key_name = signed_note::Verifier::name(&verifier).to_owned();
    let mut verifiers: Vec<Box<dyn signed_note::Verifier>> = vec![Box::new(verifier)];
    for key in witness_keys {
        verifiers.push(Box::new(CosignatureVerifier::new(key)?));
    }
    let parsed = Note::from_bytes(note.as_bytes()).map_err(malformed)?;
    let (verified, unverified) = parsed
        .verify(&VerifierList::new(verifiers))
        .map_err(|error| CheckpointError::NotSigned {
            key: key_name.clone(),
            reason: error.to_string(),
        })?;
    if !verified
        .iter()
        .any(|signature| signature.name() == key_name)
    {
        return Err(CheckpointError::NotSigned {
            key: key_name,
            reason: "only witnesses signed it".to_owned(),
        });
    }
    let mut cosigned_by = Vec::new();
    for key in witness_keys {
        let witness = key.split('+').next().unwrap_or_default();
        let Some(signature) = verified
            .iter()
            .find(|signature| signature.name() == witness)
        else {
            return Err(CheckpointError::NotSigned {
                key: witness.to_owned(),
                reason: "the witness's cosignature is missing".to_owned(),
            });
        };
        let time = signature
            .signature()
            .get(..8)
            .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
            .map_or(0, u64::from_be_bytes);
        cosigned_by.push((witness.to_owned(), time));
    }
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
        tenants: tenants_of(body.extension())?,
        other_signers: unverified
            .iter()
            .map(|signature| signature.name().to_owned())
            .collect(),
        cosigned_by,
    })
}

/// The signed-note algorithm byte of C2SP tlog-cosignature/v1 (Ed25519 over a timestamped
/// checkpoint).
const COSIGNATURE_V1: u8 = 4;

/// A witness's key for C2SP tlog-cosignature/v1: the signature is an 8-byte big-endian Unix time
/// and an Ed25519 signature of `cosignature/v1\ntime <time>\n` followed by the checkpoint's text.
struct CosignatureVerifier {
    name: String,
    id: u32,
    key: ed25519_dalek::VerifyingKey,
}

impl CosignatureVerifier {
    fn new(text: &str) -> Result<Self, CheckpointError> {
        use base64::Engine as _;
        let bad = |reason: String| CheckpointError::BadVerifierKey { reason };
        let mut parts = text.trim().splitn(3, '+');
        let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad(format!(
                "the witness key `{text}` is not `<name>+<id>+<base64>`"
            )));
        };
        let raw = base64::engine::general_purpose::STANDARD
            .decode(key)
            .map_err(|error| bad(format!("the witness key's base64: {error}")))?;
        let (Some(&COSIGNATURE_V1), Ok(public)) = (
            raw.first(),
            <[u8; 32]>::try_from(raw.get(1..).unwrap_or_default()),
        ) else {
            return Err(bad(
                "a witness key is a tlog-cosignature/v1 key (algorithm 0x04 and 32 bytes)".into(),
            ));
        };
        let computed = signed_note::key_id(name, &raw);
        if u32::from_str_radix(id, 16).ok() != Some(computed) {
            return Err(bad(format!(
                "the witness key's id {id} is not its name's and key's"
            )));
        }
        let key = ed25519_dalek::VerifyingKey::from_bytes(&public)
            .map_err(|error| bad(format!("the witness key: {error}")))?;
        Ok(Self {
            name: name.to_owned(),
            id: computed,
            key,
        })
    }
}

impl signed_note::Verifier for CosignatureVerifier {
    fn name(&self) -> &str {
        &self.name
    }

    fn key_id(&self) -> u32 {
        self.id
    }

    fn verify(&self, msg: &[u8], sig: &[u8]) -> bool {
        let (Some(time), Some(signature)) = (sig.get(..8), sig.get(8..)) else {
            return false;
        };
        let (Ok(time), Ok(signature)) =
            (<[u8; 8]>::try_from(time), <[u8; 64]>::try_from(signature))
        else {
            return false;
        };
        let mut message =
            format!("cosignature/v1\ntime {}\n", u64::from_be_bytes(time)).into_bytes();
        message.extend_from_slice(msg);
        ed25519_dalek::Verifier::verify(
            &self.key,
            &message,
            &ed25519_dalek::Signature::from_bytes(&signature),
        )
        .is_ok()
    }
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
        let note = signer.sign(head, None).unwrap();
        assert!(note.starts_with("example.com/log\n7\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n\n— example.com/log "));
        let opened = open(&note, &verifier).unwrap();
        assert_eq!(opened.head, head);
        assert_eq!(opened.origin, "example.com/log");
    }

    #[test]
    fn a_checkpoint_with_a_changed_size_or_hash_is_refused() {
        let (signer, verifier) = keys();
        let note = signer
            .sign(
                TreeHead {
                    size: 7,
                    root: EMPTY_TREE_HASH,
                },
                None,
            )
            .unwrap();
        let edited = note.replacen("\n7\n", "\n8\n", 1);
        assert!(matches!(
            open(&edited, &verifier),
            Err(CheckpointError::NotSigned { .. })
        ));
    }

    /// A witness's cosignature line (C2SP tlog-cosignature/v1) for `note`, made here with the
    /// witness's Ed25519 key as a witness would.
    fn cosign(note: &str, name: &str, seed: [u8; 32], time: u64) -> (String, String) {
        use base64::Engine as _;
        use ed25519_dalek::Signer as _;
        let key = ed25519_dalek::SigningKey::from_bytes(&seed);
        let mut public = vec![COSIGNATURE_V1];
        public.extend_from_slice(key.verifying_key().as_bytes());
        let id = signed_note::key_id(name, &public);
        let text = note.split("\n\n").next().expect("a body").to_owned() + "\n";
        let signature = key.sign(format!("cosignature/v1\ntime {time}\n{text}").as_bytes());
        let mut raw = id.to_be_bytes().to_vec();
        raw.extend_from_slice(&time.to_be_bytes());
        raw.extend_from_slice(&signature.to_bytes());
        let engine = base64::engine::general_purpose::STANDARD;
        (
            format!("{note}— {name} {}\n", engine.encode(raw)),
            format!("{name}+{id:08x}+{}", engine.encode(public)),
        )
    }

    #[test]
    fn a_witness_cosignature_is_checked_when_its_key_is_given() {
        let (signer, verifier) = keys();
        let note = signer
            .sign(
                TreeHead {
                    size: 7,
                    root: EMPTY_TREE_HASH,
                },
                None,
            )
            .unwrap();
        let (cosigned, witness) = cosign(&note, "witness.example.org", [9; 32], 1_700_000_000);
        let opened = open_cosigned(&cosigned, &verifier, std::slice::from_ref(&witness)).unwrap();
        assert_eq!(
            opened.cosigned_by,
            vec![("witness.example.org".to_owned(), 1_700_000_000)]
        );
        // Without the witness's key, its cosignature is only reported.
        assert_eq!(
            open(&cosigned, &verifier).unwrap().other_signers,
            vec!["witness.example.org".to_owned()]
        );
        // A cosignature whose time was changed, or that is missing, refuses the checkpoint.
        let line = cosigned.lines().last().unwrap().to_owned();
        let (_, encoded) = line.rsplit_once(' ').unwrap();
        use base64::Engine as _;
        let engine = base64::engine::general_purpose::STANDARD;
        let mut raw = engine.decode(encoded).unwrap();
        raw[11] ^= 1;
        let forged = cosigned.replace(encoded, &engine.encode(raw));
        assert!(matches!(
            open_cosigned(&forged, &verifier, std::slice::from_ref(&witness)),
            Err(CheckpointError::NotSigned { .. })
        ));
        assert!(matches!(
            open_cosigned(&note, &verifier, std::slice::from_ref(&witness)),
            Err(CheckpointError::NotSigned { key, .. }) if key == "witness.example.org"
        ));
    }

    #[test]
    fn the_tenants_map_is_an_extension_line_the_signature_covers() {
        let (signer, verifier) = keys();
        let map = TreeHead {
            size: 3,
            root: Hash([5; 32]),
        };
        let note = signer
            .sign(
                TreeHead {
                    size: 7,
                    root: EMPTY_TREE_HASH,
                },
                Some(map),
            )
            .unwrap();
        let text = note.split("\n\n").next().unwrap();
        assert_eq!(
            text.lines().nth(3),
            Some(format!("opledger-tenants 3 {}", map.root).as_str())
        );
        // Generic tlog tools read the first three lines and the extension beside them.
        let body = tlog_tiles::Checkpoint::from_bytes(format!("{text}\n").as_bytes()).unwrap();
        assert_eq!(body.size(), 7);
        assert_eq!(open(&note, &verifier).unwrap().tenants, Some(map));
        // A changed map is not what was signed.
        let edited = note.replacen("opledger-tenants 3", "opledger-tenants 2", 1);
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
