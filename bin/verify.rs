//! `opledger verify`: walk the whole log and report every event edited, removed or moved behind
//! the ledger's back, by stream and version. Exit status 4 when anything is found.
//!
//! Each event is checked against its stream (versions, id, chain link), against the leaf the
//! log's tree recorded for it when it was appended (so a rewrite with its link and id recomputed
//! is blamed on the rewritten event), and the file's own marks show a removed tail (the highest
//! position handed out, each stream's last version, the tree's size). With `--against`, the log
//! is also held to a checkpoint kept outside it: the root of its first events, computed from the
//! events themselves, must be the checkpoint's, or the first divergence is named.
//!
//! Every tenant's tree is grown from the events walked too (from the leaves the log's tree
//! recorded, so a rewritten event is named once, above): the tenants' map a kept checkpoint signs
//! (its `opledger-tenants` line) must be the one the log makes at its size, and the tenant trees
//! the store keeps must be the ones the log makes now.

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use opledger_domain::checkpoint::{self, Checkpoint};
use opledger_domain::ids::{GlobalPosition, StreamVersion};
use opledger_domain::merkle::tenants::{tenant_of_first_event, TenantMap, TenantTrees};
use opledger_domain::merkle::{self, Hash, LogTree, RootFolder};
use opledger_domain::store::StoreError;
use opledger_domain::store::{EventStore, LogStart, RecordedEvent, StreamName, MAX_READ_BATCH};
use opledger_domain::verify::{Finding, Recorded, Tampering, Verifier};
use opledger_store::postgres::PostgresStore;
use opledger_store::sqlite::LogMarks;
use opledger_store::SqliteStore;

use crate::cli::{CliError, VerifyArgs};
use crate::intent::{close, open_for_reading};

/// How often progress is shown on a terminal.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Most findings printed; the count is always exact.
const MAX_FINDINGS_SHOWN: usize = 1_000;
/// Events read from the log at a time. Smaller than the store's `MAX_READ_BATCH`: a batch in
/// memory (its events' data and metadata) is the part of the walk's peak memory that swings, and
/// with 4,096 the peak at 10M events was 10–15 % above the one at 1M; with 512 it is 8 %, for
/// the same walking speed (docs/src/performance.md).
const VERIFY_READ_BATCH: usize = 512;
const _: () = assert!(0 < VERIFY_READ_BATCH && VERIFY_READ_BATCH <= MAX_READ_BATCH);
/// Most streams whose tenant the walk remembers (about 100 bytes each); emptied when full, a
/// stream met again costs one read of its first event.
const MAX_REMEMBERED_TENANTS: usize = 65_536;

pub async fn run(args: VerifyArgs) -> Result<(), CliError> {
    let against = match (&args.against, &args.verifier_key) {
        (Some(path), Some(key)) => Some(open_kept_checkpoint(path, key, &args.witness_key)?),
        _ => None,
    };
    let findings = match &args.store {
        Some(url) => {
            let store = PostgresStore::connect(url)
                .await
                .map_err(|error| CliError::Config(error.to_string()))?;
            let result = tokio::select! {
                result = walk(&store, args.json, against.as_ref()) => result,
                _ = tokio::signal::ctrl_c() => Err(CliError::Interrupted),
            };
            let closed = store.close().await;
            let findings = result?;
            closed?;
            findings
        }
        None => {
            let ledger = open_for_reading(&args.db).await?;
            let result = tokio::select! {
                result = walk(ledger.store(), args.json, against.as_ref()) => result,
                _ = tokio::signal::ctrl_c() => Err(CliError::Interrupted),
            };
            let closed = close(&ledger).await;
            let findings = result?;
            closed?;
            findings
        }
    };
    if findings == 0 {
        Ok(())
    } else {
        Err(CliError::Tampered { findings })
    }
}

/// A store `verify` walks: its log, its tree, and what it remembers beside them.
trait Audited: EventStore + LogTree {
    fn marks(&self) -> impl std::future::Future<Output = Result<LogMarks, StoreError>> + Send;
}

impl Audited for SqliteStore {
    async fn marks(&self) -> Result<LogMarks, StoreError> {
        self.log_marks().await
    }
}

impl Audited for PostgresStore {
    async fn marks(&self) -> Result<LogMarks, StoreError> {
        self.log_marks().await
    }
}

/// The checkpoint kept in `path`, opened with the verifier key (its signature checked first).
fn open_kept_checkpoint(
    path: &Path,
    key: &str,
    witness_keys: &[String],
) -> Result<Checkpoint, CliError> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        CliError::Config(format!(
            "cannot read the checkpoint {}: {error}",
            path.display()
        ))
    })?;
    checkpoint::open_cosigned(&text, key, witness_keys).map_err(|error| {
        CliError::Config(format!(
            "the checkpoint {} is refused: {error}",
            path.display()
        ))
    })
}

/// What the walk holds the log to when given a kept checkpoint: the root of the first `size`
/// events, computed from the events themselves, and the first event that does not fit.
struct Against<'c> {
    checkpoint: &'c Checkpoint,
    folder: RootFolder,
    first_divergence: Option<Finding>,
}

impl Against<'_> {
    /// Folds in the event of rank `rank` (0-based) and notes it if it is the first that does not
    /// fit the checkpoint.
    fn fold(
        &mut self,
        rank: u64,
        event: &RecordedEvent,
        leaf: Hash,
        recorded: Recorded,
        findings: &[Finding],
    ) {
        if rank >= self.checkpoint.head.size {
            return;
        }
        self.folder.push(leaf);
        if self.first_divergence.is_some() {
            return;
        }
        let expected = rank + 1;
        let (what, detail) = if event.position.value() != expected {
            (
                "a removed event",
                format!(
                    "position {expected}, which the checkpoint covers, is missing from the log"
                ),
            )
        } else if findings
            .iter()
            .any(|finding| finding.kind == Tampering::Reordered)
        {
            (
                "a reordering",
                "this event is not in the place the checkpoint recorded it".to_owned(),
            )
        } else if recorded != Recorded::Matches || !findings.is_empty() {
            (
                "a rewritten event",
                "this event is not the one the checkpoint covers at this position".to_owned(),
            )
        } else {
            return;
        };
        self.first_divergence = Some(Finding {
            kind: Tampering::Diverged,
            stream: Some(event.stream.clone()),
            version: Some(event.version),
            position: event.position,
            detail: format!(
                "first divergence from the checkpoint of {} events, {what}: {detail}",
                self.checkpoint.head.size
            ),
        });
    }

    /// Holds the tenants' map the log's events make at the checkpoint's size to the one it signs.
    fn tenants_at_size(&self, made: &TenantMap, position: GlobalPosition) -> Option<Finding> {
        let signed = self.checkpoint.tenants?;
        let made = made.head();
        (made != signed).then(|| Finding {
            kind: Tampering::Diverged,
            stream: None,
            version: None,
            position,
            detail: format!(
                "the checkpoint of {} events signs a tenants' map of {} tenants that the log's events do not make ({} tenants, another root): an event was moved from one tenant's history to another's, or the tenant trees were forged when it was signed",
                self.checkpoint.head.size, signed.size, made.size
            ),
        })
    }

    /// The finding, if the log does not extend the checkpoint.
    fn finish(self, last_position: GlobalPosition) -> Option<Finding> {
        let size = self.checkpoint.head.size;
        if let Some(first) = self.first_divergence {
            return Some(first);
        }
        if self.folder.size() < size {
            return Some(Finding {
                kind: Tampering::Diverged,
                stream: None,
                version: None,
                position: last_position,
                detail: format!(
                    "first divergence from the checkpoint of {size} events, a removed tail: the log holds only {} of them",
                    self.folder.size(),
                ),
            });
        }
        if self.folder.head().root == self.checkpoint.head.root {
            return None;
        }
        Some(Finding {
            kind: Tampering::Diverged,
            stream: None,
            version: None,
            position: last_position,
            detail: format!(
                "the log's first {size} events do not hash to the checkpoint's root, and the file's own tree was rewritten to match them, so no single event can be named; compare with a kept export"
            ),
        })
    }
}

async fn walk<S: Audited>(
    store: &S,
    json: bool,
    against: Option<&Checkpoint>,
) -> Result<usize, CliError> {
    // Both stores number their log 1, 2, 3… without gaps, so a missing position is a removal.
    let mut verifier = Verifier::new(true);
    let head = store.head_position().await?.map_or(0, |head| head.value());
    let tree_size = store.tree_size().await?;
    let mut against = against.map(|checkpoint| Against {
        checkpoint,
        folder: RootFolder::new(),
        first_divergence: None,
    });
    let progress = std::io::stderr().is_terminal() && !json;
    let mut last_progress = Instant::now();
    let mut findings: Vec<Finding> = Vec::new();
    let mut found = 0;
    let mut start = LogStart::Beginning;
    let mut rank = 0_u64;
    let mut last_position = GlobalPosition::new(1);
    // Where the events end: a store's head row may remember more than its events hold.
    let mut walked_end = 0;
    let mut tenants = WalkedTenants::default();
    let mut note = |finding: Finding, found: &mut usize| {
        *found += 1;
        if findings.len() < MAX_FINDINGS_SHOWN {
            findings.push(finding);
        }
    };
    loop {
        let batch = store.read_all(start, VERIFY_READ_BATCH).await?;
        let Some(last) = batch.last() else { break };
        start = LogStart::After(last.position);
        last_position = last.position;
        walked_end = last.position.value();
        let recorded_leaves = recorded_leaves(store, &batch, tree_size).await?;
        for (event, recorded_leaf) in batch.iter().zip(recorded_leaves) {
            if verifier.needs_history(event) {
                let earlier = earlier_events(store, event).await?;
                verifier.seed(event, &earlier);
            }
            let leaf = merkle::leaf_hash(&event.view());
            let recorded = match recorded_leaf {
                Some(recorded) if recorded == leaf => Recorded::Matches,
                Some(_) => match appended_elsewhere(store, event, tree_size).await? {
                    Some(appended_at) => Recorded::Moved { appended_at },
                    None => Recorded::Differs,
                },
                None => Recorded::Unknown,
            };
            let event_findings = verifier.check_recorded(event, recorded);
            // The leaf the log's tree recorded, where it did: the tenant trees were grown from
            // it, and an event rewritten since is named by the check above, not once per tree.
            tenants
                .push(store, event, recorded_leaf.unwrap_or(leaf))
                .await?;
            if let Some(against) = against.as_mut() {
                against.fold(rank, event, leaf, recorded, &event_findings);
            }
            rank += 1;
            for finding in event_findings {
                note(finding, &mut found);
            }
            let at_checkpoint = against
                .as_ref()
                .filter(|against| against.checkpoint.head.size == rank)
                .and_then(|against| against.tenants_at_size(&tenants.trees.map(), event.position));
            if let Some(finding) = at_checkpoint {
                note(finding, &mut found);
            }
        }
        if progress && last_progress.elapsed() >= PROGRESS_EVERY {
            eprint!("\rverified {} of {head} events…", verifier.events());
            last_progress = Instant::now();
        }
    }
    for finding in tail_findings(store, walked_end, tree_size).await? {
        note(finding, &mut found);
    }
    for finding in stored_tenant_findings(store, &tenants.trees.map(), rank, last_position).await? {
        note(finding, &mut found);
    }
    if let Some(finding) = against.and_then(|against| against.finish(last_position)) {
        note(finding, &mut found);
    }
    if progress {
        eprint!("\r\x1b[2K");
    }
    if json {
        print_report_json(&verifier, &findings, found)?;
    } else {
        print_report_text(&verifier, &findings, found);
    }
    Ok(found)
}

/// Every tenant's tree as the walk grows it from the log's events, and the streams' tenants.
#[derive(Default)]
struct WalkedTenants {
    trees: TenantTrees,
    streams: std::collections::HashMap<StreamName, Option<String>>,
}

impl WalkedTenants {
    /// Adds `event` (log leaf hash `leaf`) to its tenant's tree, if it has a tenant.
    async fn push<S: EventStore>(
        &mut self,
        store: &S,
        event: &RecordedEvent,
        leaf: Hash,
    ) -> Result<(), CliError> {
        let tenant = match self.streams.get(&event.stream) {
            Some(known) => known.clone(),
            None => {
                let tenant = if event.version == StreamVersion::FIRST {
                    tenant_of_first_event(&event.event_type, &event.data)
                } else {
                    store
                        .read_stream(&event.stream, StreamVersion::FIRST, 1)
                        .await?
                        .first()
                        .filter(|first| first.version == StreamVersion::FIRST)
                        .and_then(|first| tenant_of_first_event(&first.event_type, &first.data))
                };
                if self.streams.len() >= MAX_REMEMBERED_TENANTS {
                    self.streams.clear();
                }
                self.streams.insert(event.stream.clone(), tenant.clone());
                tenant
            }
        };
        if let Some(tenant) = tenant {
            self.trees.push(&tenant, event.position.value(), leaf);
        }
        Ok(())
    }
}

/// The tenants whose tree the store keeps is not the tree their events in the log make, when the
/// store's trees cover the `walked` events (a store that keeps none, or is catching up, is not
/// judged).
async fn stored_tenant_findings<S: Audited>(
    store: &S,
    made: &TenantMap,
    walked: u64,
    position: GlobalPosition,
) -> Result<Vec<Finding>, CliError> {
    let Some(stored) = store.tenant_heads().await? else {
        return Ok(Vec::new());
    };
    if stored.log_size != walked || stored.map == *made {
        return Ok(Vec::new());
    }
    let mut names: Vec<String> = Vec::new();
    for tenant in made.tenants().chain(stored.map.tenants()) {
        if made.get(tenant) != stored.map.get(tenant) && !names.iter().any(|name| name == tenant) {
            names.push(tenant.to_owned());
        }
    }
    Ok(names
        .into_iter()
        .map(|tenant| Finding {
            kind: Tampering::Edited,
            stream: None,
            version: None,
            position,
            detail: format!(
                "the ledger's stored tree of tenant `{tenant}` ({} leaves) is not the tree of the tenant's events in the log ({} leaves); the next checkpoint would sign it",
                stored.map.get(&tenant).map_or(0, |head| head.size),
                made.get(&tenant).map_or(0, |head| head.size),
            ),
        })
        .collect())
}

/// The leaf hashes the log's tree recorded for these events when they were appended (`None`
/// for an event past the tree).
async fn recorded_leaves<S: Audited>(
    store: &S,
    batch: &[RecordedEvent],
    tree_size: u64,
) -> Result<Vec<Option<Hash>>, CliError> {
    let indexes: Vec<u64> = batch
        .iter()
        .filter(|event| event.position.value() <= tree_size)
        .map(|event| merkle::stored_hash_index(0, event.position.value() - 1))
        .collect();
    let mut hashes = store.stored_hashes(indexes).await?.into_iter();
    Ok(batch
        .iter()
        .map(|event| {
            (event.position.value() <= tree_size)
                .then(|| hashes.next())
                .flatten()
        })
        .collect())
}

/// How far around its position a differing event is looked for in the tree, as moved there.
const MOVED_SEARCH_POSITIONS: u64 = 16;

/// The position near its own at which the tree recorded `event` (as it is now), if any: a
/// reordered event. Asked only of events whose own leaf differs, which an untouched log has none of.
async fn appended_elsewhere<S: Audited>(
    store: &S,
    event: &RecordedEvent,
    tree_size: u64,
) -> Result<Option<GlobalPosition>, CliError> {
    let position = event.position.value();
    let low = position.saturating_sub(MOVED_SEARCH_POSITIONS).max(1);
    let high = position
        .saturating_add(MOVED_SEARCH_POSITIONS)
        .min(tree_size);
    let candidates: Vec<u64> = (low..=high)
        .filter(|candidate| *candidate != position)
        .collect();
    let indexes = candidates
        .iter()
        .map(|candidate| merkle::stored_hash_index(0, candidate - 1))
        .collect();
    let recorded = store.stored_hashes(indexes).await?;
    let mut moved = event.clone();
    for (candidate, recorded) in candidates.into_iter().zip(recorded) {
        moved.position = GlobalPosition::new(candidate);
        if merkle::leaf_hash(&moved.view()) == recorded {
            return Ok(Some(moved.position));
        }
    }
    Ok(None)
}

/// What the events alone cannot show: a removed tail. The file remembers the highest position
/// it handed out, each stream's last version and, in its tree, every event it appended; events
/// deleted from the end leave all three behind. And events the tree never recorded were added
/// behind its back.
async fn tail_findings<S: Audited>(
    store: &S,
    head: u64,
    tree_size: u64,
) -> Result<Vec<Finding>, CliError> {
    let marks = store.marks().await?;
    let mut findings = Vec::new();
    let removed_to = marks.highest_position.unwrap_or(0).max(tree_size);
    if removed_to > head {
        findings.push(Finding {
            kind: Tampering::Removed,
            stream: None,
            version: None,
            position: GlobalPosition::new(removed_to),
            detail: format!(
                "the log ends at position {head}, but the file handed out positions up to {} and its tree recorded {tree_size} events: positions {}..{removed_to} were removed",
                marks.highest_position.unwrap_or(0),
                head + 1
            ),
        });
    }
    for ahead in marks.streams_ahead {
        let first_missing = ahead.newest_stored.map_or(0, |newest| newest + 1);
        findings.push(Finding {
            kind: Tampering::Removed,
            stream: StreamName::new(ahead.stream).ok(),
            version: Some(StreamVersion::new(first_missing)),
            position: GlobalPosition::new(head.max(1)),
            detail: format!(
                "the stream's last version is recorded as {}, but versions {first_missing}..{} have no event",
                ahead.last_version, ahead.last_version
            ),
        });
    }
    if head > tree_size && tree_size > 0 {
        findings.push(Finding {
            kind: Tampering::Inserted,
            stream: None,
            version: None,
            position: GlobalPosition::new(tree_size + 1),
            detail: format!(
                "the log's tree recorded {tree_size} events, but the log goes on to position {head}: positions {}..{head} were added behind the ledger's back",
                tree_size + 1
            ),
        });
    }
    Ok(findings)
}

/// The stored events of `event`'s stream before its version: what the verifier needs for a
/// stream it no longer tracks (its memory is bounded). One operation's stream is short.
async fn earlier_events<S: EventStore>(
    store: &S,
    event: &RecordedEvent,
) -> Result<Vec<RecordedEvent>, CliError> {
    let mut earlier: Vec<RecordedEvent> = Vec::new();
    let mut from = StreamVersion::FIRST;
    while from < event.version {
        let batch = store
            .read_stream(&event.stream, from, MAX_READ_BATCH)
            .await?;
        let Some(last) = batch.last() else { break };
        from = last.version.next();
        earlier.extend(
            batch
                .into_iter()
                .filter(|stored| stored.version < event.version),
        );
    }
    Ok(earlier)
}

fn print_report_json(
    verifier: &Verifier,
    findings: &[Finding],
    found: usize,
) -> Result<(), CliError> {
    let rows: Vec<_> = findings
        .iter()
        .map(|finding| {
            serde_json::json!({
                "kind": finding.kind.name(),
                "stream": finding.stream.as_ref().map(ToString::to_string),
                "version": finding.version.map(|v| v.value()),
                "position": finding.position.value(),
                "detail": finding.detail,
            })
        })
        .collect();
    let mut out = serde_json::json!({"events": verifier.events(), "streams": verifier.streams(), "findings": found, "shown": rows});
    if found > 0 {
        // The findings are also the error, in the shape every `--json` error has.
        out["error"] =
            crate::cli::error_json(&CliError::Tampered { findings: found })["error"].take();
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&out).map_err(|error| CliError::Other(error.to_string()))?
    );
    Ok(())
}

/// Prints the findings shown, how many more there were, and the walk's counts.
fn print_report_text(verifier: &Verifier, findings: &[Finding], found: usize) {
    for finding in findings {
        println!("{finding}");
    }
    if found > findings.len() {
        println!("… and {} more", found - findings.len());
    }
    println!(
        "verified {} events in {} streams: {}",
        verifier.events(),
        verifier.streams(),
        if found == 0 {
            "no tampering found".to_owned()
        } else {
            format!("{found} finding(s)")
        }
    );
}
