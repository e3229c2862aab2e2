use proptest::prelude::*;
use uuid::Uuid;

use super::*;
use crate::ids::{EventId, GlobalPosition, StreamVersion};

fn view<'a>(stream: &'a str, data: &'a [u8], metadata: &'a [u8]) -> EventView<'a> {
    EventView {
        stream,
        version: StreamVersion::new(2),
        position: GlobalPosition::new(9),
        event_id: EventId::from_uuid(Uuid::from_u128(0x0102)),
        event_type: "T",
        data,
        metadata,
    }
}

#[test]
fn a_leaf_is_the_tag_then_each_stored_field_length_prefixed_in_order() {
    let bytes = leaf_bytes(&view("s", b"{}", b"m"));
    let mut expected = b"opledger-leaf-v1\0".to_vec();
    expected.extend_from_slice(&9_u64.to_be_bytes());
    expected.extend_from_slice(&[0, 1, b's']);
    expected.extend_from_slice(&2_u64.to_be_bytes());
    expected.extend_from_slice(&0x0102_u128.to_be_bytes());
    expected.extend_from_slice(&[0, 1, b'T']);
    expected.extend_from_slice(&[0, 0, 0, 2, b'{', b'}']);
    expected.extend_from_slice(&[0, 0, 0, 1, b'm']);
    assert_eq!(bytes, expected);
}

#[test]
fn every_stored_field_changes_the_leaf_hash() {
    let base = view("s", b"{}", b"m");
    let hash = leaf_hash(&base);
    let changed = [
        EventView {
            position: GlobalPosition::new(10),
            ..base
        },
        EventView {
            stream: "t",
            ..base
        },
        EventView {
            version: StreamVersion::new(3),
            ..base
        },
        EventView {
            event_id: EventId::from_uuid(Uuid::from_u128(0x0103)),
            ..base
        },
        EventView {
            event_type: "U",
            ..base
        },
        EventView {
            data: b"{ }",
            ..base
        },
        EventView {
            metadata: b"n",
            ..base
        },
        // Moving a byte from one field to the next is a different leaf: fields are framed.
        EventView {
            data: b"{}m",
            metadata: b"",
            ..base
        },
    ];
    for event in changed {
        assert_ne!(leaf_hash(&event), hash, "{event:?}");
    }
}

/// RFC 6962's own test vectors (as the certificate-transparency reference code tests them): the
/// tree over these eight leaves has this root.
#[test]
fn the_tree_hash_is_rfc_6962s_on_its_test_vectors() {
    let leaves: [&[u8]; 8] = [
        b"",
        &[0x00],
        &[0x10],
        &[0x20, 0x21],
        &[0x30, 0x31],
        &[0x40, 0x41, 0x42, 0x43],
        &[0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x57],
        &[
            0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x6b, 0x6c, 0x6d,
            0x6e, 0x6f,
        ],
    ];
    let mut tree = MemoryTree::new();
    for leaf in leaves {
        tree.push(tlog_tiles::record_hash(leaf));
    }
    assert_eq!(
        hash_hex(&tree.head().root),
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"
    );
    assert_eq!(MemoryTree::new().head().root, EMPTY_TREE_HASH);
}

#[test]
fn the_size_is_found_again_from_the_count_of_stored_hashes() {
    for size in 0..2_000 {
        assert_eq!(size_from_stored_count(stored_hash_count(size)), Some(size));
    }
    // 3 leaves store 4 hashes and 4 leaves 7: no tree stores 5 or 6.
    assert_eq!(size_from_stored_count(5), None);
    assert_eq!(size_from_stored_count(6), None);
}

#[test]
fn questions_out_of_range_are_refused_not_panicked_on() {
    let mut tree = MemoryTree::new();
    tree.push(EMPTY_TREE_HASH);
    assert!(matches!(
        prove_inclusion(1, 1, &tree),
        Err(ProofError::OutOfRange { .. })
    ));
    assert!(matches!(
        prove_consistency(2, 1, &tree),
        Err(ProofError::OutOfRange { .. })
    ));
    let head = tree.head();
    assert!(check_inclusion(&[head.root; 200], head, 0, EMPTY_TREE_HASH).is_err());
    assert!(check_consistency(&[], head, TreeHead { size: 0, ..head }).is_err());
}

fn flip(hash: &Hash, bit: usize) -> Hash {
    let mut out = *hash;
    out.0[bit / 8 % HASH_SIZE] ^= 1 << (bit % 8);
    out
}

/// The leaves with their place written first, as the ledger's leaves frame their position, so no
/// two are equal. (Two equal leaves side by side have equal siblings, so the proof of one place
/// does prove the other: that is the tree's nature, and the ledger never has equal leaves.)
fn distinct_as_the_ledgers_are(leaves: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    leaves
        .into_iter()
        .enumerate()
        .map(|(place, data)| {
            let mut leaf = u32::try_from(place)
                .expect("fewer than 2^32 leaves in a test")
                .to_be_bytes()
                .to_vec();
            leaf.extend(data);
            leaf
        })
        .collect()
}

fn tree_of(leaves: &[Vec<u8>]) -> MemoryTree {
    let mut tree = MemoryTree::new();
    for leaf in leaves {
        tree.push(tlog_tiles::record_hash(leaf));
    }
    tree
}

/// The head of the tree of the first `size` leaves, from the whole tree's stored hashes.
fn head_at(tree: &MemoryTree, size: u64) -> TreeHead {
    TreeHead {
        size,
        root: tree_hash(size, tree).unwrap(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn a_root_folded_leaf_by_leaf_is_the_stored_trees_root(
        leaves in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..4), 0..300),
    ) {
        let mut folder = RootFolder::new();
        let mut tree = MemoryTree::new();
        for leaf in &leaves {
            folder.push(tlog_tiles::record_hash(leaf));
            tree.push(tlog_tiles::record_hash(leaf));
            prop_assert_eq!(folder.head(), tree.head());
        }
        prop_assert_eq!(folder.head(), tree.head());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_inclusion_proof_verifies_and_every_one_bit_change_fails(
        leaves in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..8), 1..300)
            .prop_map(distinct_as_the_ledgers_are),
        pick in any::<(u64, u64, usize)>(),
    ) {
        let tree = tree_of(&leaves);
        let size = 1 + pick.0 % tree.size();
        let index = pick.1 % size;
        let head = head_at(&tree, size);
        // The head from the stored hashes equals one made from the first `size` leaves alone.
        prop_assert_eq!(head, tree_of(&leaves[..size as usize]).head());
        let leaf = tlog_tiles::record_hash(&leaves[index as usize]);
        let proof = prove_inclusion(index, size, &tree).unwrap();
        prop_assert!(check_inclusion(&proof, head, index, leaf).is_ok());

        let bit = pick.2 % (HASH_SIZE * 8);
        prop_assert!(check_inclusion(&proof, head, index, flip(&leaf, bit)).is_err());
        let flipped = TreeHead { root: flip(&head.root, bit), ..head };
        prop_assert!(check_inclusion(&proof, flipped, index, leaf).is_err());
        for position in 0..proof.len() {
            let mut changed = proof.clone();
            changed[position] = flip(&changed[position], bit);
            prop_assert!(check_inclusion(&changed, head, index, leaf).is_err());
        }
        // A leaf's data changed by one bit is another leaf.
        let mut data = leaves[index as usize].clone();
        data.push(0);
        prop_assert!(check_inclusion(&proof, head, index, tlog_tiles::record_hash(&data)).is_err());
        if let Some(first) = leaves[index as usize].first() {
            let mut data = leaves[index as usize].clone();
            data[0] = first ^ (1 << (bit % 8));
            prop_assert!(check_inclusion(&proof, head, index, tlog_tiles::record_hash(&data)).is_err());
        }
        // The proof of one leaf does not prove another place.
        if size > 1 {
            prop_assert!(check_inclusion(&proof, head, (index + 1) % size, leaf).is_err());
        }
    }

    #[test]
    fn every_consistency_proof_verifies_and_every_one_bit_change_fails(
        leaves in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..8), 1..300),
        pick in any::<(u64, u64, usize)>(),
    ) {
        let tree = tree_of(&leaves);
        let size = 1 + pick.0 % tree.size();
        let old_size = 1 + pick.1 % size;
        let (old, head) = (head_at(&tree, old_size), head_at(&tree, size));
        let proof = prove_consistency(old_size, size, &tree).unwrap();
        prop_assert!(check_consistency(&proof, old, head).is_ok());

        let bit = pick.2 % (HASH_SIZE * 8);
        let (old_flipped, head_flipped) = (TreeHead { root: flip(&old.root, bit), ..old }, TreeHead { root: flip(&head.root, bit), ..head });
        prop_assert!(check_consistency(&proof, old_flipped, head).is_err());
        prop_assert!(check_consistency(&proof, old, head_flipped).is_err());
        for position in 0..proof.len() {
            let mut changed = proof.clone();
            changed[position] = flip(&changed[position], bit);
            prop_assert!(check_consistency(&changed, old, head).is_err());
        }
        // A tree whose history was rewritten (one leaf of the old tree changed) is not consistent.
        let mut rewritten = leaves.clone();
        rewritten[(pick.1 % old_size) as usize].push(1);
        let other = tree_of(&rewritten);
        let other_head = head_at(&other, size);
        let other_proof = prove_consistency(old_size, size, &other).unwrap();
        prop_assert!(check_consistency(&other_proof, old, other_head).is_err());
    }
}
