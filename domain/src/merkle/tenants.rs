//! A tree per tenant beside the log's, and one map of their heads that a checkpoint signs, so a
//! tenant's export proves that it holds *every* event of the tenant up to its checkpoint, not
//! only that each of its events is in the log (see docs/src/design/tenant-export-completeness.md).
//!
//! - A tenant's tree is an RFC 6962 tree whose leaf *k* is the tenant's *k*-th event in log order:
//!   `"opledger-tenant-leaf-v1" ‖ 0x00 ‖ u64be(position) ‖ the event's leaf hash in the log's
//!   tree` ([`tenant_leaf_hash`]). An event is of a tenant when the first event of its stream is
//!   an `IntentRecorded` whose data names the tenant ([`tenant_of_first_event`]); events of other
//!   streams (an erasure's) are in no tenant's tree.
//! - The map is an RFC 6962 tree over every tenant's head, in the byte order of the tenants'
//!   names: `"opledger-tenant-head-v1" ‖ 0x00 ‖ u16be(len) tenant ‖ u64be(size) ‖ root`
//!   ([`tenant_head_leaf_hash`]). Its size and root are an extension line of the checkpoint
//!   (`opledger-tenants <size> <base64 root>`), so the log's signature covers them.
//!
//! A store keeps each tenant's tree as its [`Frontier`] (the roots of its perfect subtrees:
//! O(log n) hashes), grown in the commit of the events it covers; the map is made when a
//! checkpoint is signed. An export recomputes both from the log it walks, so what it proves never
//! depends on what the store kept. Nothing here is ever computed from re-encoded events: leaves are
//! the log's leaf hashes.

use std::collections::BTreeMap;

use super::{Hash, MemoryTree, ProofError, RootFolder, TreeHead, HASH_SIZE};

/// The domain-separation tag of a tenant tree's leaf.
pub const TENANT_LEAF_TAG: &[u8] = b"opledger-tenant-leaf-v1\0";
/// The domain-separation tag of a leaf of the tenants' map.
pub const TENANT_HEAD_TAG: &[u8] = b"opledger-tenant-head-v1\0";
/// The event type whose data names the tenant of its stream, when it is the stream's first.
pub const INTENT_EVENT_TYPE: &str = "IntentRecorded";
/// Longest tenant name a map leaf can hold (its length is a u16).
pub const MAX_TENANT_BYTES: usize = u16::MAX as usize;

/// The leaf hash, in its tenant's tree, of the event at `position` whose leaf hash in the log's
/// tree is `leaf`.
pub fn tenant_leaf_hash(position: u64, leaf: Hash) -> Hash {
    let mut bytes = Vec::with_capacity(TENANT_LEAF_TAG.len() + 8 + HASH_SIZE);
    bytes.extend_from_slice(TENANT_LEAF_TAG);
    bytes.extend_from_slice(&position.to_be_bytes());
    bytes.extend_from_slice(&leaf.0);
    tlog_tiles::record_hash(&bytes)
}

/// The leaf hash, in the tenants' map, of `tenant`'s tree head.
pub fn tenant_head_leaf_hash(tenant: &str, head: TreeHead) -> Hash {
    let name = &tenant.as_bytes()[..tenant.len().min(MAX_TENANT_BYTES)];
    let mut bytes = Vec::with_capacity(TENANT_HEAD_TAG.len() + 2 + name.len() + 8 + HASH_SIZE);
    bytes.extend_from_slice(TENANT_HEAD_TAG);
    bytes.extend_from_slice(&(name.len() as u16).to_be_bytes());
    bytes.extend_from_slice(name);
    bytes.extend_from_slice(&head.size.to_be_bytes());
    bytes.extend_from_slice(&head.root.0);
    tlog_tiles::record_hash(&bytes)
}

/// The tenant a stream belongs to, from its first event: the `tenant` member of an
/// `IntentRecorded` event's data. `None` for any other first event (and for data that does not
/// name one, which no opledger writes).
pub fn tenant_of_first_event(event_type: &str, data: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named<'a> {
        #[serde(borrow)]
        tenant: std::borrow::Cow<'a, str>,
    }
    if event_type != INTENT_EVENT_TYPE {
        return None;
    }
    serde_json::from_slice::<Named<'_>>(data)
        .ok()
        .map(|named| named.tenant.into_owned())
}

/// A tenant tree as a store keeps it: its size and the roots of its perfect subtrees, largest
/// first (one per bit set in the size), enough to append a leaf and to give the root.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Frontier {
    folder: RootFolder,
}

impl Frontier {
    /// An empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// Leaves in the tree.
    pub fn size(&self) -> u64 {
        self.folder.size()
    }

    /// Appends a leaf by its (tenant-tree) leaf hash.
    pub fn push(&mut self, leaf: Hash) {
        self.folder.push(leaf);
    }

    /// The tree's head.
    pub fn head(&self) -> TreeHead {
        self.folder.head()
    }

    /// The subtree roots, largest subtree first.
    pub fn hashes(&self) -> Vec<Hash> {
        self.folder.subtrees.iter().map(|(hash, _)| *hash).collect()
    }

    /// The subtree roots as stored: 32 bytes each, largest subtree first.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.folder
            .subtrees
            .iter()
            .flat_map(|(hash, _)| hash.0)
            .collect()
    }

    /// The frontier of a tree of `size` leaves from its stored bytes; `None` when they are not
    /// one 32-byte hash per bit set in `size`.
    pub fn from_bytes(size: u64, bytes: &[u8]) -> Option<Self> {
        if bytes.len() != size.count_ones() as usize * HASH_SIZE {
            return None;
        }
        let heights = (0..64_u32).rev().filter(|bit| size >> bit & 1 == 1);
        let subtrees = bytes
            .chunks_exact(HASH_SIZE)
            .zip(heights)
            .map(|(chunk, height)| {
                let mut hash = [0_u8; HASH_SIZE];
                hash.copy_from_slice(chunk);
                (Hash(hash), height)
            })
            .collect();
        Some(Self {
            folder: RootFolder { subtrees, size },
        })
    }
}

/// The leaves of a tree from index `begin` on, folded into the fewest perfect subtrees that lie
/// wholly inside the range and are aligned as the tree's own (its *compact range*): what a slice
/// of a tenant's export gives for the tenant's leaves after it, so a verifier that holds the
/// leaves before and inside the slice recomputes the tree's root with O(log n) hashes.
#[derive(Clone, Debug)]
pub struct RangeFolder {
    begin: u64,
    end: u64,
    /// (subtree root, its height), left to right.
    nodes: Vec<(Hash, u32)>,
}

impl RangeFolder {
    /// An empty range starting at leaf index `begin`.
    pub fn new(begin: u64) -> Self {
        Self {
            begin,
            end: begin,
            nodes: Vec::new(),
        }
    }

    /// Folds in leaf `end` by its hash.
    pub fn push(&mut self, leaf: Hash) {
        let (mut hash, mut height, mut start) = (leaf, 0_u32, self.end);
        while let Some(&(left, left_height)) = self.nodes.last() {
            // The left node covers [start − 2^h, start); their parent must be aligned as the
            // tree's and lie inside the range.
            let Some(parent) = start.checked_sub(1 << height) else {
                break;
            };
            if left_height != height || parent % (2 << height) != 0 || parent < self.begin {
                break;
            }
            self.nodes.pop();
            hash = tlog_tiles::node_hash(left, hash);
            height += 1;
            start = parent;
        }
        self.nodes.push((hash, height));
        self.end += 1;
    }

    /// The subtree roots, left to right; their heights are [`range_heights`]`(begin, end)`.
    pub fn hashes(&self) -> Vec<Hash> {
        self.nodes.iter().map(|(hash, _)| *hash).collect()
    }
}

/// The heights of the subtrees of the compact range of leaves `begin..end`, left to right: from
/// each index, the largest aligned subtree that fits.
pub fn range_heights(begin: u64, end: u64) -> Vec<u32> {
    let mut heights = Vec::new();
    let mut at = begin;
    while at < end {
        let mut height = if at == 0 { 63 } else { at.trailing_zeros() };
        while (1_u64 << height) > end - at {
            height -= 1;
        }
        heights.push(height);
        at += 1 << height;
    }
    heights
}

/// The head of a tree of `left.size() + leaves + right` leaves from the frontier of its first
/// leaves, the leaves after them, and the compact range of the rest (its hashes, left to right:
/// [`RangeFolder::hashes`]); `None` when `right` is not one hash per subtree of that range.
pub fn head_from_slice(
    left: &Frontier,
    leaves: &[Hash],
    right: &[Hash],
    size: u64,
) -> Option<TreeHead> {
    let mut folder = left.folder.clone();
    for leaf in leaves {
        folder.push(*leaf);
    }
    let heights = range_heights(folder.size, size);
    if heights.len() != right.len() {
        return None;
    }
    for (hash, height) in right.iter().zip(heights) {
        let (mut hash, mut height, subtree) = (*hash, height, 1_u64 << height);
        while let Some(&(left, left_height)) = folder.subtrees.last() {
            if left_height != height {
                break;
            }
            folder.subtrees.pop();
            hash = tlog_tiles::node_hash(left, hash);
            height += 1;
        }
        folder.subtrees.push((hash, height));
        folder.size += subtree;
    }
    Some(folder.head())
}

/// Every tenant's tree head at one log size: what a checkpoint's `opledger-tenants` line signs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantMap {
    heads: BTreeMap<String, TreeHead>,
}

impl TenantMap {
    /// A map of these heads (tenants whose tree is empty are left out: a tenant has a tree from
    /// its first event on).
    pub fn new(heads: impl IntoIterator<Item = (String, TreeHead)>) -> Self {
        Self {
            heads: heads
                .into_iter()
                .filter(|(_, head)| head.size > 0)
                .collect(),
        }
    }

    /// Tenants in the map.
    pub fn len(&self) -> usize {
        self.heads.len()
    }

    /// Whether no tenant has an event yet.
    pub fn is_empty(&self) -> bool {
        self.heads.is_empty()
    }

    /// The tenants in the map, in its order.
    pub fn tenants(&self) -> impl Iterator<Item = &str> {
        self.heads.keys().map(String::as_str)
    }

    /// The head of `tenant`'s tree, if it has one.
    pub fn get(&self, tenant: &str) -> Option<TreeHead> {
        self.heads.get(tenant).copied()
    }

    fn tree(&self) -> MemoryTree {
        let mut tree = MemoryTree::new();
        for (tenant, head) in &self.heads {
            tree.push(tenant_head_leaf_hash(tenant, *head));
        }
        tree
    }

    /// The map's own head: its size is the number of tenants.
    pub fn head(&self) -> TreeHead {
        self.tree().head()
    }

    /// `tenant`'s index in the map and the inclusion proof of its head's leaf; `None` when the
    /// tenant has no event.
    pub fn prove(&self, tenant: &str) -> Option<(u64, Vec<Hash>)> {
        let index = self.heads.keys().position(|name| name == tenant)? as u64;
        let tree = self.tree();
        let proof = super::prove_inclusion(index, tree.size(), &tree)
            .expect("a memory tree holds every hash a proof needs");
        Some((index, proof))
    }
}

/// Checks that `tenant`'s tree `head` is leaf `index` of the tenants' map `map`.
pub fn check_tenant_head(
    proof: &[Hash],
    map: TreeHead,
    index: u64,
    tenant: &str,
    head: TreeHead,
) -> Result<(), ProofError> {
    super::check_inclusion(proof, map, index, tenant_head_leaf_hash(tenant, head))
}

/// Tenant trees grown event by event: what a store's writer and an export's walk keep, one
/// [`Frontier`] per tenant and each stream's tenant.
#[derive(Clone, Debug, Default)]
pub struct TenantTrees {
    trees: BTreeMap<String, Frontier>,
}

impl TenantTrees {
    /// No tenant yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends the event at `position` (log leaf hash `leaf`) to `tenant`'s tree.
    pub fn push(&mut self, tenant: &str, position: u64, leaf: Hash) {
        self.trees
            .entry(tenant.to_owned())
            .or_default()
            .push(tenant_leaf_hash(position, leaf));
    }

    /// Every tenant's head now.
    pub fn map(&self) -> TenantMap {
        TenantMap::new(
            self.trees
                .iter()
                .map(|(tenant, tree)| (tenant.clone(), tree.head())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(byte: u8) -> Hash {
        Hash([byte; HASH_SIZE])
    }

    #[test]
    fn a_frontier_round_trips_through_its_bytes_at_every_size() {
        let mut frontier = Frontier::new();
        for index in 0..70_u8 {
            let stored = Frontier::from_bytes(frontier.size(), &frontier.to_bytes())
                .expect("a frontier's own bytes");
            assert_eq!(stored, frontier);
            assert_eq!(stored.head(), frontier.head());
            frontier.push(leaf(index));
        }
        assert!(Frontier::from_bytes(3, &[0; 32]).is_none());
    }

    #[test]
    fn a_frontier_gives_the_root_a_whole_tree_gives() {
        let mut frontier = Frontier::new();
        let mut tree = MemoryTree::new();
        for index in 0..33_u8 {
            frontier.push(leaf(index));
            tree.push(leaf(index));
            assert_eq!(frontier.head(), tree.head());
        }
    }

    #[test]
    fn a_tenant_head_is_proved_in_the_map_and_no_other_head_is() {
        let mut trees = TenantTrees::new();
        for position in 1..=20_u64 {
            let tenant = ["acme", "globex", "initech"][(position % 3) as usize];
            trees.push(tenant, position, leaf(position as u8));
        }
        let map = trees.map();
        let head = map.head();
        assert_eq!(head.size, 3);
        let acme = map.get("acme").unwrap();
        let (index, proof) = map.prove("acme").unwrap();
        check_tenant_head(&proof, head, index, "acme", acme).unwrap();
        // A tree cut short, or another tenant's head, is not what the map holds.
        let cut = TreeHead {
            size: acme.size - 1,
            ..acme
        };
        assert!(check_tenant_head(&proof, head, index, "acme", cut).is_err());
        assert!(check_tenant_head(&proof, head, index, "globex", acme).is_err());
        assert!(map.prove("nobody").is_none());
    }

    #[test]
    fn a_slice_between_a_frontier_and_a_compact_range_gives_the_whole_trees_root() {
        for size in 1..40_u64 {
            let leaves: Vec<Hash> = (0..size).map(|index| leaf(index as u8)).collect();
            let mut whole = MemoryTree::new();
            leaves.iter().for_each(|leaf| whole.push(*leaf));
            for first in 0..size {
                for end in first..=size {
                    let mut left = Frontier::new();
                    leaves[..first as usize]
                        .iter()
                        .for_each(|leaf| left.push(*leaf));
                    let mut right = RangeFolder::new(end);
                    leaves[end as usize..]
                        .iter()
                        .for_each(|leaf| right.push(*leaf));
                    assert_eq!(right.nodes.len(), range_heights(end, size).len());
                    let middle = &leaves[first as usize..end as usize];
                    let head = head_from_slice(&left, middle, &right.hashes(), size);
                    assert_eq!(
                        head,
                        Some(whole.head()),
                        "size {size}, slice {first}..{end}"
                    );
                    // A leaf of the slice left out is not the tree.
                    if end > first {
                        let cut = &middle[..middle.len() - 1];
                        let cut = head_from_slice(&left, cut, &right.hashes(), size);
                        assert_ne!(cut, Some(whole.head()));
                    }
                }
            }
        }
    }

    #[test]
    fn the_tenant_is_read_from_an_intent_only() {
        let data = br#"{"operation_id":"x","tenant":"acme","at":"2026-01-01T00:00:00Z"}"#;
        assert_eq!(
            tenant_of_first_event("IntentRecorded", data).as_deref(),
            Some("acme")
        );
        assert_eq!(tenant_of_first_event("SubjectErased", data), None);
        assert_eq!(tenant_of_first_event("IntentRecorded", b"not json"), None);
    }
}
