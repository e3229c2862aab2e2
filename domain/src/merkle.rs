//! The transparency log: one RFC 6962 / RFC 9162 Merkle tree over every event of the log, in
//! position order, so that a checkpoint kept outside opledger (its size and root hash) pins the
//! whole history up to it, and anyone can check that an event is in it (an inclusion proof) or
//! that a later checkpoint extends it (a consistency proof) without trusting opledger.
//!
//! The leaf of an event is its stored bytes, framed ([`leaf_bytes`]): position, stream, version,
//! event id, type, data and metadata, each exactly as the store holds it. Data and metadata are
//! taken whole, so the event's time (in its data), its chain link and its trace context (in its
//! metadata) are covered, and a value that is stored encrypted is hashed as stored. The leaf's
//! index in the tree is its rank in the log (0 for the first event): position − 1 in stores that
//! number their log 1, 2, 3… (SQLite, memory).
//!
//! The tree is kept as Go's `golang.org/x/mod/sumdb/tlog` keeps it: each leaf appended stores its
//! leaf hash and the hashes of the subtrees it completes (on average two hashes per leaf, at
//! "stored hash indexes"), so a tree head or a proof reads O(log n) stored hashes. The hashing and
//! proofs are `tlog_tiles`, a port of that package; this module adds the leaf encoding and the
//! errors. Pure: stores hand it their stored hashes through [`HashReader`].
//!
//! It must never hash anything but the stored bytes (a re-encoding would make a proof depend on
//! this build's encoder), and never accept a proof without checking it against a root.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;

pub use tlog_tiles::Error as TlogError;
pub use tlog_tiles::Tile;
pub use tlog_tiles::{stored_hash_count, stored_hash_index, Hash, HashReader, HASH_SIZE};

use crate::store::{EventView, StoreError};

pub mod tenants;

/// The domain-separation tag every leaf starts with; changing it would change every tree.
pub const LEAF_TAG: &[u8] = b"opledger-leaf-v1\0";

/// Most hashes an inclusion or consistency proof may hold: a tree of 2^64 leaves needs at most
/// 64 for inclusion and 2 × 64 for consistency. A longer "proof" is refused before any hashing.
pub const MAX_PROOF_HASHES: usize = 128;

/// The bytes of an event's leaf, in this order (all integers big-endian):
///
/// | field | encoding |
/// |---|---|
/// | tag | the 17 bytes `opledger-leaf-v1` and a zero byte |
/// | position | u64 |
/// | stream | u16 length, then the name's UTF-8 bytes |
/// | version | u64 |
/// | event id | the UUID's 16 bytes |
/// | type | u16 length, then the type name's UTF-8 bytes |
/// | data | u32 length, then the stored data bytes |
/// | metadata | u32 length, then the stored metadata bytes |
///
/// Stream names and type names are at most 256 bytes and data plus metadata at most 1 MiB (the
/// store's limits), so every length fits its field.
pub fn leaf_bytes(event: &EventView<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        LEAF_TAG.len() + 8 + 2 + event.stream.len() + 8 + 16 + 2 + event.event_type.len() + 8,
    );
    out.extend_from_slice(LEAF_TAG);
    out.extend_from_slice(&event.position.value().to_be_bytes());
    push_short(&mut out, event.stream.as_bytes());
    out.extend_from_slice(&event.version.value().to_be_bytes());
    out.extend_from_slice(event.event_id.as_uuid().as_bytes());
    push_short(&mut out, event.event_type.as_bytes());
    push_long(&mut out, event.data);
    push_long(&mut out, event.metadata);
    out
}

fn push_short(out: &mut Vec<u8>, bytes: &[u8]) {
    let length = u16::try_from(bytes.len()).expect("stream and type names are at most 256 bytes");
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(bytes);
}

fn push_long(out: &mut Vec<u8>, bytes: &[u8]) {
    let length = u32::try_from(bytes.len()).expect("an event's data is at most 1 MiB");
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(bytes);
}

/// The RFC 6962 leaf hash of an event: SHA-256 of a zero byte and its [`leaf_bytes`].
pub fn leaf_hash(event: &EventView<'_>) -> Hash {
    tlog_tiles::record_hash(&leaf_bytes(event))
}

/// The RFC 6962 hash of an empty tree (SHA-256 of nothing).
pub const EMPTY_TREE_HASH: Hash = tlog_tiles::EMPTY_HASH;

/// A tree head: how many leaves and the root hash over them.
#[derive(Clone, Copy, PartialEq)]
pub struct TreeHead {
    /// Leaves in the tree.
    pub size: u64,
    /// The RFC 6962 root hash.
    pub root: Hash,
}

impl fmt::Debug for TreeHead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TreeHead({} {})", self.size, self.root)
    }
}

/// Why a proof could not be made or did not check.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    /// The proof does not lead to the root it was checked against.
    #[error("the proof does not match the tree head: {what}")]
    Mismatch {
        /// What was being proved.
        what: String,
    },
    /// The question itself is out of range (a leaf past the tree, an older tree larger than the
    /// newer one, a proof longer than any tree needs).
    #[error("{reason}")]
    OutOfRange {
        /// What is out of range, in a sentence.
        reason: String,
    },
    /// The stored hashes could not be read.
    #[error("cannot read the tree's stored hashes: {reason}")]
    Storage {
        /// What went wrong.
        reason: String,
    },
}

fn storage(error: tlog_tiles::Error) -> ProofError {
    ProofError::Storage {
        reason: error.to_string(),
    }
}

/// The hashes a store must keep when it appends leaf number `index` (0-based) with `leaf`, to be
/// stored from [`stored_hash_index`]`(0, index)` on; `reader` gives earlier stored hashes (at most
/// log₂ n of them).
pub fn hashes_to_store<R: HashReader>(
    index: u64,
    leaf: Hash,
    reader: &R,
) -> Result<Vec<Hash>, ProofError> {
    tlog_tiles::stored_hashes_for_record_hash(index, leaf, reader).map_err(storage)
}

/// The root hash of the tree of the first `size` leaves, from the stored hashes.
pub fn tree_hash<R: HashReader>(size: u64, reader: &R) -> Result<Hash, ProofError> {
    tlog_tiles::tree_hash(size, reader).map_err(storage)
}

/// The inclusion proof of leaf `index` in the tree of `size` leaves (RFC 6962 §2.1.1).
pub fn prove_inclusion<R: HashReader>(
    index: u64,
    size: u64,
    reader: &R,
) -> Result<Vec<Hash>, ProofError> {
    if index >= size {
        return Err(ProofError::OutOfRange {
            reason: format!("leaf {index} is not in a tree of {size} leaves"),
        });
    }
    tlog_tiles::prove_record(size, index, reader).map_err(storage)
}

/// The consistency proof that the tree of `size` leaves extends the one of `old_size` leaves
/// (RFC 6962 §2.1.2); empty when the sizes are equal.
pub fn prove_consistency<R: HashReader>(
    old_size: u64,
    size: u64,
    reader: &R,
) -> Result<Vec<Hash>, ProofError> {
    if old_size == 0 || old_size > size {
        return Err(ProofError::OutOfRange {
            reason: format!(
                "a consistency proof needs 1 ≤ older size ≤ newer size; asked for {old_size} to {size}"
            ),
        });
    }
    tlog_tiles::prove_tree(size, old_size, reader).map_err(storage)
}

/// Checks that `leaf` is leaf `index` of the tree `head`.
pub fn check_inclusion(
    proof: &[Hash],
    head: TreeHead,
    index: u64,
    leaf: Hash,
) -> Result<(), ProofError> {
    if index >= head.size || proof.len() > MAX_PROOF_HASHES {
        return Err(ProofError::OutOfRange {
            reason: format!(
                "an inclusion proof of leaf {index} in a tree of {} leaves with {} hashes cannot hold",
                head.size,
                proof.len()
            ),
        });
    }
    tlog_tiles::check_record(&proof.to_vec(), head.size, head.root, index, leaf).map_err(|_| {
        ProofError::Mismatch {
            what: format!("leaf {index} in the tree of {} leaves", head.size),
        }
    })
}

/// Checks that the tree `head` extends the tree `old` (every leaf of `old` is a leaf of `head`,
/// in the same place). Two heads of one size are consistent only if their roots are equal.
pub fn check_consistency(proof: &[Hash], old: TreeHead, head: TreeHead) -> Result<(), ProofError> {
    if old.size == 0 {
        return if proof.is_empty() {
            Ok(())
        } else {
            Err(ProofError::Mismatch {
                what: "an empty tree needs no proof".into(),
            })
        };
    }
    if old.size > head.size || proof.len() > MAX_PROOF_HASHES {
        return Err(ProofError::OutOfRange {
            reason: format!(
                "a tree of {} leaves cannot extend one of {} leaves",
                head.size, old.size
            ),
        });
    }
    tlog_tiles::check_tree(&proof.to_vec(), head.size, head.root, old.size, old.root).map_err(
        |_| ProofError::Mismatch {
            what: format!(
                "the tree of {} leaves extending the one of {} leaves",
                head.size, old.size
            ),
        },
    )
}

/// The port of a store that keeps the transparency log's tree beside its events: the tree grows
/// in the same commit as the log (leaf `position − 1` for the event at `position` in stores that
/// number their log without gaps), and the checkpoints signed over it are kept in the same store.
pub trait LogTree: Send + Sync {
    /// Leaves in the tree now (every committed event, once the tree has caught up with the log).
    fn tree_size(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// The stored hashes at these stored hash indexes, in the same order; every index is below
    /// [`stored_hash_count`]`(tree_size)`.
    fn stored_hashes(
        &self,
        indexes: Vec<u64>,
    ) -> impl Future<Output = Result<Vec<Hash>, StoreError>> + Send;

    /// Keeps a signed checkpoint of the tree of `size` leaves (replacing none: the first one kept
    /// for a size stays).
    fn keep_checkpoint(
        &self,
        size: u64,
        note: String,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The checkpoint kept for `size` leaves, or the newest kept when `size` is `None`.
    fn kept_checkpoint(
        &self,
        size: Option<u64>,
    ) -> impl Future<Output = Result<Option<(u64, String)>, StoreError>> + Send;

    /// Every tenant's tree head and the log's size they cover, read at one moment; `None` when
    /// the store keeps no tenant trees (or keeps them switched off), and a checkpoint then signs
    /// the log's tree alone.
    fn tenant_heads(&self) -> impl Future<Output = Result<Option<TenantHeads>, StoreError>> + Send {
        std::future::ready(Ok(None))
    }
}

/// Every tenant's tree head at one size of the log.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantHeads {
    /// Leaves of the log's tree the tenant trees cover.
    pub log_size: u64,
    /// The tenants' heads.
    pub map: tenants::TenantMap,
}

/// The heads a checkpoint signs now: the log's tree and, when the store keeps tenant trees, the
/// tenants' map at the same log size.
pub async fn heads_to_sign<L: LogTree>(
    log: &L,
) -> Result<(TreeHead, Option<TreeHead>), ProofError> {
    let tenants = log
        .tenant_heads()
        .await
        .map_err(|error| ProofError::Storage {
            reason: error.to_string(),
        })?;
    match tenants {
        Some(tenants) => {
            let head = head_of(log, Some(tenants.log_size)).await?;
            Ok((head, Some(tenants.map.head())))
        }
        None => Ok((head_of(log, None).await?, None)),
    }
}

/// Runs `work` (which makes exactly one `read_hashes` call, as every tlog function here does)
/// against a store's hashes: once to learn which stored hashes it needs, then again with them.
async fn with_stored<L: LogTree, T>(
    log: &L,
    work: impl Fn(&dyn HashReaderDyn) -> Result<T, ProofError>,
) -> Result<T, ProofError> {
    let wanted = Wanted::default();
    let _ = work(&wanted);
    let indexes = wanted.0.into_inner();
    let hashes = log
        .stored_hashes(indexes.clone())
        .await
        .map_err(|error| ProofError::Storage {
            reason: error.to_string(),
        })?;
    if hashes.len() != indexes.len() {
        return Err(ProofError::Storage {
            reason: format!(
                "asked for {} stored hashes, got {}",
                indexes.len(),
                hashes.len()
            ),
        });
    }
    work(&Given { indexes, hashes })
}

/// [`HashReader`] as an object, so one closure serves both passes of [`with_stored`].
trait HashReaderDyn {
    fn read(&self, indexes: &[u64]) -> Result<Vec<Hash>, tlog_tiles::Error>;
}

impl HashReader for &dyn HashReaderDyn {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, tlog_tiles::Error> {
        self.read(indexes)
    }
}

/// The first pass: records what is asked for and answers with placeholders.
#[derive(Default)]
struct Wanted(RefCell<Vec<u64>>);

impl HashReaderDyn for Wanted {
    fn read(&self, indexes: &[u64]) -> Result<Vec<Hash>, tlog_tiles::Error> {
        self.0.borrow_mut().extend_from_slice(indexes);
        Ok(vec![Hash([0; HASH_SIZE]); indexes.len()])
    }
}

/// The second pass: the hashes the store gave for the indexes the first pass asked for.
struct Given {
    indexes: Vec<u64>,
    hashes: Vec<Hash>,
}

impl HashReaderDyn for Given {
    fn read(&self, indexes: &[u64]) -> Result<Vec<Hash>, tlog_tiles::Error> {
        indexes
            .iter()
            .map(|index| {
                self.indexes
                    .iter()
                    .position(|given| given == index)
                    .map(|at| self.hashes[at])
                    .ok_or(tlog_tiles::Error::IndexesNotInTree)
            })
            .collect()
    }
}

/// The head of the tree of the first `size` leaves of a store's log (the whole tree when
/// `size` is `None`).
pub async fn head_of<L: LogTree>(log: &L, size: Option<u64>) -> Result<TreeHead, ProofError> {
    let now = log.tree_size().await.map_err(|error| ProofError::Storage {
        reason: error.to_string(),
    })?;
    let size = size.unwrap_or(now);
    if size > now {
        return Err(ProofError::OutOfRange {
            reason: format!("the log has {now} leaves; there is no tree of {size} yet"),
        });
    }
    let root = with_stored(log, |reader| tree_hash(size, &reader)).await?;
    Ok(TreeHead { size, root })
}

/// The inclusion proof of leaf `index` in the store's tree of `size` leaves.
pub async fn inclusion_proof_of<L: LogTree>(
    log: &L,
    index: u64,
    size: u64,
) -> Result<Vec<Hash>, ProofError> {
    check_within(log, size).await?;
    with_stored(log, |reader| prove_inclusion(index, size, &reader)).await
}

/// The consistency proof from the store's tree of `old_size` leaves to the one of `size`.
pub async fn consistency_proof_of<L: LogTree>(
    log: &L,
    old_size: u64,
    size: u64,
) -> Result<Vec<Hash>, ProofError> {
    check_within(log, size).await?;
    with_stored(log, |reader| prove_consistency(old_size, size, &reader)).await
}

async fn check_within<L: LogTree>(log: &L, size: u64) -> Result<(), ProofError> {
    let now = log.tree_size().await.map_err(|error| ProofError::Storage {
        reason: error.to_string(),
    })?;
    if size > now {
        return Err(ProofError::OutOfRange {
            reason: format!("the log has {now} leaves; there is no tree of {size} yet"),
        });
    }
    Ok(())
}

/// A whole tree's stored hashes in memory: the memory store's tree, a rebuild's, and tests'.
#[derive(Clone, Debug, Default)]
pub struct MemoryTree {
    stored: Vec<Hash>,
    size: u64,
}

impl MemoryTree {
    /// An empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// Leaves in the tree.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Appends a leaf by its hash.
    pub fn push(&mut self, leaf: Hash) {
        let hashes = hashes_to_store(self.size, leaf, self)
            .expect("a memory tree holds every hash it is asked for");
        debug_assert_eq!(self.stored.len() as u64, stored_hash_index(0, self.size));
        self.stored.extend(hashes);
        self.size += 1;
        debug_assert_eq!(self.stored.len() as u64, stored_hash_count(self.size));
    }

    /// The tree head of the whole tree.
    pub fn head(&self) -> TreeHead {
        TreeHead {
            size: self.size,
            root: tree_hash(self.size, self).expect("a memory tree holds every hash it needs"),
        }
    }

    /// The stored hashes, in stored-hash-index order.
    pub fn stored(&self) -> &[Hash] {
        &self.stored
    }
}

impl HashReader for MemoryTree {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, tlog_tiles::Error> {
        indexes
            .iter()
            .map(|&index| {
                usize::try_from(index)
                    .ok()
                    .and_then(|index| self.stored.get(index).copied())
                    .ok_or(tlog_tiles::Error::IndexesNotInTree)
            })
            .collect()
    }
}

/// The root of a tree computed leaf by leaf in O(log n) memory: what a verifier that streams a
/// log keeps (the roots of the perfect subtrees of the leaves so far, largest first).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RootFolder {
    /// (subtree root, its height): heights strictly decrease along the vector.
    subtrees: Vec<(Hash, u32)>,
    size: u64,
}

impl RootFolder {
    /// No leaves yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Leaves folded so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Folds in the next leaf by its hash.
    pub fn push(&mut self, leaf: Hash) {
        let mut hash = leaf;
        let mut height = 0;
        while let Some(&(left, left_height)) = self.subtrees.last() {
            if left_height != height {
                break;
            }
            self.subtrees.pop();
            hash = tlog_tiles::node_hash(left, hash);
            height += 1;
        }
        self.subtrees.push((hash, height));
        self.size += 1;
    }

    /// The tree head of the leaves folded so far.
    pub fn head(&self) -> TreeHead {
        let root = self
            .subtrees
            .iter()
            .rev()
            .map(|(hash, _)| *hash)
            .reduce(|right, left| tlog_tiles::node_hash(left, right))
            .unwrap_or(EMPTY_TREE_HASH);
        TreeHead {
            size: self.size,
            root,
        }
    }
}

/// The leaf count of a tree whose stored hashes number `count` (the inverse of
/// [`stored_hash_count`]); `None` when no tree stores exactly that many (an interrupted write).
pub fn size_from_stored_count(count: u64) -> Option<u64> {
    // stored_hash_count(n) lies between n and 2n, so the size is in [count / 2, count].
    let (mut low, mut high) = (count / 2, count);
    while low < high {
        let middle = low + (high - low) / 2;
        if stored_hash_count(middle) < count {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    (stored_hash_count(low) == count).then_some(low)
}

/// Parses a hash written as 64 lowercase hex digits or as standard base64 (as checkpoints write it).
pub fn parse_hash(text: &str) -> Option<Hash> {
    if text.len() == 2 * HASH_SIZE {
        let mut out = [0_u8; HASH_SIZE];
        for (index, pair) in text.as_bytes().chunks_exact(2).enumerate() {
            let digits = std::str::from_utf8(pair).ok()?;
            out[index] = u8::from_str_radix(digits, 16).ok()?;
        }
        return Some(Hash(out));
    }
    Hash::parse_hash(text).ok()
}

/// A hash as 64 lowercase hex digits.
pub fn hash_hex(hash: &Hash) -> String {
    crate::args::hex(&hash.0)
}

#[cfg(test)]
mod tests;
