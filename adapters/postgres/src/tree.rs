//! The transparency log's tree in the database: the stored hashes of the Merkle tree over the
//! log (see `opledger_domain::merkle`), written by the writer in the same transaction as the
//! events they hash, and the signed checkpoints kept over it.
//!
//! `opledger.log_tree` holds one row per stored hash, keyed by its stored hash index (about two
//! per event), so a tree head or a proof reads O(log n) rows by primary key. Leaf `position − 1`
//! is the event at `position`: positions are handed out under the log's lock without gaps (a
//! rolled-back transaction gives its positions back with the head it moved), and the tree grows
//! under the same lock, in the same transaction, so the tree follows the log exactly whatever the
//! number of instances writing.
//!
//! Growing the tree needs, besides the new leaves, only the roots of the perfect subtrees of the
//! tree so far (its *frontier*, at most 64 hashes). The log's head row keeps them beside the
//! head (`tree_size`, `tree_frontier`), so a writer that takes the lock reads them with the head
//! and needs no other read; a writer that committed last keeps them in memory and reads nothing.
//!
//! It must never write a stored hash outside the transaction of the events it covers, never
//! rewrite one, and never grow a tree that is behind its log (events it did not see appended
//! cannot be told from events inserted behind the ledger's back).

use opledger_domain::merkle::{self, Hash, HashReader, HASH_SIZE};
use opledger_domain::store::{EventView, StoreError};
use tokio_postgres::GenericClient;

use crate::codec;

/// Events read from the log at a time while the tree is built from it.
const REBUILD_BATCH: i64 = 4_096;

/// Builds the tree of a log that has none (a database from before the tree) from the log, on
/// `client`'s transaction, under the log's lock; returns the leaves added. Stops at the first
/// position missing from the log (the tree cannot cover an event that is not there): the tree is
/// then behind its log, appends are refused and `opledger verify` names the gap.
pub(crate) async fn rebuild(client: &impl GenericClient) -> Result<u64, String> {
    let failed = |error: tokio_postgres::Error| {
        format!(
            "cannot build the log's tree from the log: {}",
            crate::describe(&error)
        )
    };
    let head: i64 = client
        .query_one(
            "SELECT last_position FROM opledger.log_head FOR UPDATE",
            &[],
        )
        .await
        .map_err(failed)?
        .get(0);
    let read = client
        .prepare(&format!(
            "SELECT {} FROM opledger.events WHERE position > $1 ORDER BY position LIMIT $2",
            codec::EVENT_COLUMNS
        ))
        .await
        .map_err(failed)?;
    let insert = client
        .prepare(
            "INSERT INTO opledger.log_tree (stored_index, hash) \
             SELECT * FROM UNNEST($1::bigint[], $2::bytea[])",
        )
        .await
        .map_err(failed)?;
    let mut frontier = Frontier::empty();
    'log: while frontier.sql_size() < head {
        let rows = client
            .query(&read, &[&frontier.sql_size(), &REBUILD_BATCH])
            .await
            .map_err(failed)?;
        if rows.is_empty() {
            break;
        }
        let mut stored = TreeRows::default();
        for row in &rows {
            let event = codec::event(row).map_err(|error| error.to_string())?;
            if event.position.value() != frontier.size() + 1 {
                tracing::warn!(
                    missing = frontier.size() + 1,
                    "the log has a position missing; its tree stops before it"
                );
                client
                    .execute(&insert, &[&stored.indexes, &stored.hashes])
                    .await
                    .map_err(failed)?;
                break 'log;
            }
            frontier
                .push(&event.view(), &mut stored)
                .map_err(|error| error.to_string())?;
        }
        client
            .execute(&insert, &[&stored.indexes, &stored.hashes])
            .await
            .map_err(failed)?;
    }
    client
        .execute(
            // The tenant trees covered the tree this replaces: they are built again after it.
            "UPDATE opledger.log_head SET tree_size = $1, tree_frontier = $2, tenants_size = NULL",
            &[&frontier.sql_size(), &frontier.encode()],
        )
        .await
        .map_err(failed)?;
    tracing::info!(
        leaves = frontier.size(),
        "the log's tree was built from the log"
    );
    Ok(frontier.size())
}

/// The tree as far as a writer needs it: its size and the roots of its perfect subtrees.
#[derive(Clone, Debug)]
pub(crate) struct Frontier {
    size: u64,
    /// One root per set bit of `size`, the highest (largest subtree) first.
    subtrees: Vec<Hash>,
}

/// The hashes one append of leaves stores: from `first` on, consecutive stored hash indexes.
#[derive(Default)]
pub(crate) struct TreeRows {
    pub(crate) indexes: Vec<i64>,
    pub(crate) hashes: Vec<Vec<u8>>,
}

impl Frontier {
    /// The empty tree's.
    pub(crate) fn empty() -> Self {
        Self {
            size: 0,
            subtrees: Vec::new(),
        }
    }

    /// Reads the frontier as the head row stores it; refuses bytes that are not one hash per set
    /// bit of the size.
    pub(crate) fn decode(size: i64, bytes: &[u8]) -> Result<Self, StoreError> {
        let size = u64::try_from(size).map_err(|_| corrupt("the log tree's size is negative"))?;
        let count = size.count_ones() as usize;
        if bytes.len() != count * HASH_SIZE {
            return Err(corrupt(&format!(
                "the log tree's frontier holds {} bytes, but a tree of {size} leaves has {count} subtree roots of {HASH_SIZE} bytes",
                bytes.len()
            )));
        }
        let subtrees = bytes
            .chunks_exact(HASH_SIZE)
            .map(|chunk| Hash(<[u8; HASH_SIZE]>::try_from(chunk).expect("chunks of HASH_SIZE")))
            .collect();
        Ok(Self { size, subtrees })
    }

    /// The bytes the head row stores.
    pub(crate) fn encode(&self) -> Vec<u8> {
        self.subtrees.iter().flat_map(|hash| hash.0).collect()
    }

    /// Leaves in the tree.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// The size as stored.
    pub(crate) fn sql_size(&self) -> i64 {
        i64::try_from(self.size).expect("a tree has at most one leaf per bigint position")
    }

    /// Appends the leaf of `event`, which must be the event at position `size + 1`, adding the
    /// hashes to store to `rows`; returns the leaf's hash (its tenant's tree grows by it).
    pub(crate) fn push(
        &mut self,
        event: &EventView<'_>,
        rows: &mut TreeRows,
    ) -> Result<Hash, StoreError> {
        let index = self.size;
        if event.position.value() != index + 1 {
            return Err(corrupt(&format!(
                "the log tree has {index} leaves, so its next leaf is the event at position {}, but the event being added is at position {}",
                index + 1,
                event.position
            )));
        }
        let leaf = merkle::leaf_hash(event);
        let hashes = merkle::hashes_to_store(index, leaf, &*self)
            .map_err(|error| corrupt(&error.to_string()))?;
        let first = merkle::stored_hash_index(0, index);
        for (offset, hash) in (0_u64..).zip(&hashes) {
            let stored = i64::try_from(first + offset)
                .map_err(|_| corrupt("the log tree outgrew what a bigint indexes"))?;
            rows.indexes.push(stored);
            rows.hashes.push(hash.0.to_vec());
        }
        // The leaf merged the `trailing_ones` smallest subtrees into one.
        let merged = index.trailing_ones() as usize;
        self.subtrees.truncate(self.subtrees.len() - merged);
        self.subtrees
            .push(*hashes.last().expect("a leaf stores at least its own hash"));
        self.size += 1;
        debug_assert_eq!(self.subtrees.len(), self.size.count_ones() as usize);
        Ok(leaf)
    }
}

/// A frontier answers exactly the reads `hashes_to_store` makes for the next leaf: the roots of
/// the subtrees it merges with, at stored index `stored_hash_index(level, (size >> level) − 1)`.
impl HashReader for Frontier {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, merkle::TlogError> {
        let levels = (0..64_u8)
            .rev()
            .filter(|level| self.size >> level & 1 == 1)
            .zip(&self.subtrees);
        let known: Vec<(u64, Hash)> = levels
            .map(|(level, hash)| {
                (
                    merkle::stored_hash_index(level, (self.size >> level) - 1),
                    *hash,
                )
            })
            .collect();
        indexes
            .iter()
            .map(|index| {
                known
                    .iter()
                    .find(|(stored, _)| stored == index)
                    .map(|(_, hash)| *hash)
                    .ok_or(merkle::TlogError::IndexesNotInTree)
            })
            .collect()
    }
}

pub(crate) fn corrupt(reason: &str) -> StoreError {
    StoreError::Corrupt {
        reason: format!("{reason}: the ledger's tables were changed behind opledger's back; run `opledger verify`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_domain::ids::{EventId, GlobalPosition, StreamVersion};
    use opledger_domain::merkle::MemoryTree;

    fn view(position: u64, data: &[u8]) -> EventView<'_> {
        EventView {
            position: GlobalPosition::new(position),
            stream: "operation-x",
            version: StreamVersion::new(position),
            event_id: EventId::from_uuid(uuid::Uuid::from_u128(u128::from(position))),
            event_type: "Tested",
            data,
            metadata: b"",
        }
    }

    #[test]
    fn a_frontier_stores_what_a_whole_tree_stores_and_survives_its_encoding() {
        let mut whole = MemoryTree::new();
        let mut frontier = Frontier::empty();
        let mut rows = TreeRows::default();
        for position in 1..=300_u64 {
            let data = position.to_be_bytes();
            let event = view(position, &data);
            frontier.push(&event, &mut rows).expect("the next position");
            whole.push(merkle::leaf_hash(&event));
            frontier = Frontier::decode(frontier.sql_size(), &frontier.encode()).expect("decodes");
            assert_eq!(frontier.size(), whole.size());
        }
        let stored: Vec<Vec<u8>> = whole.stored().iter().map(|hash| hash.0.to_vec()).collect();
        assert_eq!(rows.hashes, stored);
        assert_eq!(rows.indexes, (0..stored.len() as i64).collect::<Vec<_>>());
    }

    #[test]
    fn a_leaf_out_of_step_with_the_tree_or_a_frontier_of_the_wrong_length_is_refused() {
        let mut frontier = Frontier::empty();
        let mut rows = TreeRows::default();
        assert!(frontier.push(&view(2, b""), &mut rows).is_err());
        assert!(rows.indexes.is_empty());
        assert!(Frontier::decode(3, &[0; HASH_SIZE]).is_err());
        assert!(Frontier::decode(-1, &[]).is_err());
    }
}
