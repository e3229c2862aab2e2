//! `opledger export`: the log's events, one JSON object per line, with everything an auditor
//! needs to check them without opledger: each event's stream, version, position, id, type,
//! time, data and metadata (as the exact text stored, because the hash chain is over those
//! bytes), its stored chain link and the link of the event before it in its stream.
//!
//! The file is a header line, the events in position order, and a closing line with their count
//! and last position, so a file cut short is told from a complete one. It is written beside
//! `--out` under a temporary name and renamed when complete: an interrupted or failed export
//! leaves no file that looks finished. Memory is bounded whatever the log's size: one read batch,
//! and per-stream memory ([`MAX_REMEMBERED_STREAMS`]) that is emptied when full (a miss costs one
//! read of the stream).
//!
//! The export proves itself against a signed checkpoint of the transparency log (the one it is cut
//! at, in its header): an export of the whole log by its leaves, from which a verifier recomputes
//! the checkpoint's root; a slice or one tenant's export by an inclusion proof on every event,
//! plus context lines that prove its claims: the events just outside a slice's ends (their times
//! and positions show nothing at its edges was left out) and, for a tenant, the intent that opens
//! each of its operations (which names the tenant). A context line is never counted as exported.
//!
//! It must never write an event's data re-encoded: a verifier recomputes the chain over the
//! bytes it is given, and any re-encoding (key order, number formatting, escapes) would turn a
//! faithful export into a false alarm.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use chrono::{DateTime, SecondsFormat, Utc};
use opledger_domain::chain::ChainHash;
use opledger_domain::codec;
use opledger_domain::error::ValidationError;
use opledger_domain::event::OperationEvent;
use opledger_domain::ids::{GlobalPosition, StreamVersion, TenantId};
use opledger_domain::merkle::tenants::{
    tenant_leaf_hash, Frontier, RangeFolder, TenantMap, TenantTrees,
};
use opledger_domain::merkle::{self, Hash, LogTree};
use opledger_domain::store::{EventStore, LogStart, RecordedEvent, StreamName, MAX_READ_BATCH};
use opledger_domain::timestamp::at_or_before;
use serde_json::json;

use crate::cli::{CliError, ExportArgs, ExportFormat, LogBound, SigningKeyArgs};
use crate::export_parquet::ParquetSink;
use crate::intent::{close, open_for_reading};
use opledger_store::postgres::PostgresStore;

/// The export format's version, in its header; a reader refuses a version it does not know.
pub const EXPORT_FORMAT_VERSION: u64 = 2;
/// Events read from the log at a time (as `verify`, whose measurement chose it: a batch in memory
/// is the part of the walk's peak memory that swings).
const EXPORT_READ_BATCH: usize = 512;
const _: () = assert!(0 < EXPORT_READ_BATCH && EXPORT_READ_BATCH <= MAX_READ_BATCH);
/// Most streams whose last link and tenant the export remembers (under 200 bytes each: a few
/// MiB at most). Emptied when full; a stream met again costs one read. A tenant export names an
/// operation's intent again after it forgot the stream: the offline verifier remembers the
/// tenants of at least the 65,536 streams met last (half its `TENANT_STREAMS`), as many
/// as this, so it never meets an event whose intent it has forgotten and not been shown again.
const MAX_REMEMBERED_STREAMS: usize = 65_536;
/// How often progress is shown on a terminal.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// What the export wrote.
struct Exported {
    events: u64,
    first: Option<u64>,
    last: Option<u64>,
    /// Some of the tenants whose operations the walk passed (at most [`MAX_TENANTS_NAMED`]),
    /// named when the tenant asked for had none.
    tenants_seen: std::collections::BTreeSet<TenantId>,
    /// The size of the checkpoint the export was cut at, if any.
    tree_size: Option<u64>,
    /// For a whole tenant's export cut at a checkpoint that signs the tenants' map: the tenant's
    /// tree head and its proof in the map, for the closing record.
    tenant_proof: Option<serde_json::Value>,
}

/// Most tenants an export that found none of the tenant asked for names instead.
const MAX_TENANTS_NAMED: usize = 20;

pub async fn run(args: ExportArgs) -> Result<(), CliError> {
    let tenant = args
        .tenant
        .as_deref()
        .map(|tenant| {
            TenantId::new(tenant)
                .map_err(|error| ValidationError::new("--tenant", error.message.clone()))
        })
        .transpose()?;
    check_bounds(args.from, args.to)?;
    let partial = partial_path(&args.out)?;
    let slice = Slice {
        from: args.from,
        to: args.to,
        tenant,
    };
    let (result, closed) = match &args.store_url {
        Some(url) => {
            let store = PostgresStore::connect(url)
                .await
                .map_err(|error| CliError::Config(error.to_string()))?;
            let result = tokio::select! {
                result = write_file(&store, &slice, args.format, &args.key, &partial) => result,
                _ = tokio::signal::ctrl_c() => Err(CliError::Interrupted),
            };
            (result, store.close().await.map_err(CliError::from))
        }
        None => {
            let ledger = open_for_reading(&args.store.db).await?;
            let result = tokio::select! {
                result = write_file(ledger.store(), &slice, args.format, &args.key, &partial) => result,
                _ = tokio::signal::ctrl_c() => Err(CliError::Interrupted),
            };
            (result, close(&ledger).await)
        }
    };
    let exported = match result
        .and_then(|exported| closed.map(|()| exported))
        .and_then(|exported| tenant_found(&slice, exported))
    {
        Ok(exported) => exported,
        Err(error) => {
            let _ = std::fs::remove_file(&partial);
            return Err(error);
        }
    };
    std::fs::rename(&partial, &args.out).map_err(|error| {
        let _ = std::fs::remove_file(&partial);
        CliError::Other(format!(
            "cannot move the finished export into place at {}: {error}",
            args.out.display()
        ))
    })?;
    match (exported.first, exported.last) {
        (Some(first), Some(last)) => println!(
            "exported {} event(s), positions {first}–{last}, to {}{}",
            exported.events,
            args.out.display(),
            match exported.tree_size {
                Some(size) => format!(", with the proofs against the checkpoint of tree size {size}"),
                None => ", without proofs: the ledger keeps no checkpoint (pass --key-file or run `opledger checkpoint` first)".to_owned(),
            }
        ),
        _ => println!(
            "exported no event (nothing in the slice asked for) to {}",
            args.out.display()
        ),
    }
    Ok(())
}

/// Refuses an export for a tenant none of whose events the slice holds: a mistyped tenant is
/// then told apart from a quiet one, instead of leaving an empty file that looks like evidence
/// of "nothing happened".
fn tenant_found(slice: &Slice, exported: Exported) -> Result<Exported, CliError> {
    let Some(tenant) = slice.tenant.as_ref().filter(|_| exported.events == 0) else {
        return Ok(exported);
    };
    let seen = if exported.tenants_seen.is_empty() {
        "no operation at all".to_owned()
    } else {
        let names: Vec<String> = exported
            .tenants_seen
            .iter()
            .map(ToString::to_string)
            .collect();
        format!("operations of {}", names.join(", "))
    };
    Err(CliError::NotFound(format!(
        "no event of tenant `{tenant}` is in the slice asked for, which holds {seen}; nothing was written. Check the tenant's name (names are case-sensitive) or widen --from/--to"
    )))
}

/// Which events to export.
struct Slice {
    from: Option<LogBound>,
    to: Option<LogBound>,
    tenant: Option<TenantId>,
}

fn check_bounds(from: Option<LogBound>, to: Option<LogBound>) -> Result<(), CliError> {
    let backwards = match (from, to) {
        (Some(LogBound::Position(from)), Some(LogBound::Position(to))) => from > to,
        (Some(LogBound::Time(from)), Some(LogBound::Time(to))) => from > to,
        _ => false,
    };
    if backwards {
        return Err(ValidationError::new(
            "--from",
            "comes after --to; give the earlier end as --from".to_owned(),
        )
        .into());
    }
    Ok(())
}

/// Where the export is written until it is complete: beside `out`, so the rename is atomic.
fn partial_path(out: &Path) -> Result<PathBuf, CliError> {
    if out.is_dir() {
        return Err(ValidationError::new(
            "--out",
            format!("{} is a directory; name a file in it", out.display()),
        )
        .into());
    }
    let Some(name) = out.file_name() else {
        return Err(ValidationError::new("--out", "name a file to write".to_owned()).into());
    };
    let parent = match out.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !parent.is_dir() {
        return Err(ValidationError::new(
            "--out",
            format!(
                "the directory {} does not exist; create it first",
                parent.display()
            ),
        )
        .into());
    }
    let mut partial = name.to_os_string();
    partial.push(format!(".partial-{}", std::process::id()));
    Ok(parent.join(partial))
}

/// The checkpoint an export is cut at: one signed now when a key is given (and kept in the
/// ledger, as `opledger checkpoint` keeps it), else the newest kept one, else none.
async fn cut_at<S: LogTree>(
    store: &S,
    key: &SigningKeyArgs,
) -> Result<Option<(u64, String)>, CliError> {
    if key.key_file.is_some() || std::env::var_os(crate::log::SIGNING_KEY_ENV).is_some() {
        let signer = crate::log::load_signer(key)?;
        return Ok(Some(crate::log::sign_and_keep_head(store, &signer).await?));
    }
    Ok(store.kept_checkpoint(None).await?)
}

/// How the export proves its events against its checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proof {
    /// No checkpoint: only the chains.
    None,
    /// Every leaf of the tree is in the export: the verifier recomputes the root.
    Root,
    /// A slice or a tenant: each event carries its inclusion proof in the tree of `size` leaves.
    Inclusion { size: u64 },
}

impl Proof {
    fn name(self) -> Option<&'static str> {
        match self {
            Self::None => None,
            Self::Root => Some("root"),
            Self::Inclusion { .. } => Some("inclusion"),
        }
    }

    /// The inclusion proof of the event at `position`, in an export that carries them.
    async fn of<S: LogTree>(self, store: &S, position: u64) -> Result<Option<Vec<Hash>>, CliError> {
        let Self::Inclusion { size } = self else {
            return Ok(None);
        };
        merkle::inclusion_proof_of(store, position - 1, size)
            .await
            .map(Some)
            .map_err(|error| CliError::Other(format!("cannot prove position {position}: {error}")))
    }
}

async fn write_file<S: EventStore + LogTree>(
    store: &S,
    slice: &Slice,
    format: ExportFormat,
    key: &SigningKeyArgs,
    partial: &Path,
) -> Result<Exported, CliError> {
    let file = File::create(partial).map_err(|error| {
        CliError::Other(format!("cannot create {}: {error}", partial.display()))
    })?;
    let cut = cut_at(store, key).await?;
    // Cut at the checkpoint: every exported event is then in the tree it signs. (SQLite numbers
    // its log 1, 2, 3… without gaps, so the tree's size is the position of its last leaf.)
    let head = match &cut {
        Some((size, _)) => *size,
        None => store.head_position().await?.map_or(0, |head| head.value()),
    };
    let whole = slice.from.is_none() && slice.to.is_none() && slice.tenant.is_none();
    let proof = match &cut {
        None => Proof::None,
        Some(_) if whole => Proof::Root,
        Some((size, _)) => Proof::Inclusion { size: *size },
    };
    let header = Header {
        opledger_export: EXPORT_FORMAT_VERSION,
        chain: "opledger-chain-v1",
        leaf: "opledger-leaf-v1",
        checkpoint: cut.as_ref().map(|(_, note)| note.clone()),
        tree_size: cut.as_ref().map(|(size, _)| *size),
        proof: proof.name(),
        exported_at: Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
        log_head: head,
        from: slice.from.map(bound_json),
        to: slice.to.map(bound_json),
        tenant: slice.tenant.as_ref().map(ToString::to_string),
        // SQLite numbers its log 1, 2, 3… without gaps, so in an export of every tenant a
        // missing position is a removed event.
        contiguous_positions: slice.tenant.is_none(),
    };
    let mut sink = match format {
        ExportFormat::Ndjson => Sink::ndjson(file, &header),
        ExportFormat::Parquet => Sink::parquet(file, &header),
    }
    .map_err(|error| CliError::Other(format!("cannot write {}: {error}", partial.display())))?;
    let tenants = match (&cut, &slice.tenant) {
        (Some((_, note)), Some(_)) => opledger_domain::checkpoint::unchecked_tenants(note)
            .map_err(|error| CliError::Other(format!("the kept checkpoint: {error}")))?,
        _ => None,
    };
    let mut exported = write_events(store, slice, head, proof, tenants, &mut sink).await?;
    exported.tree_size = cut.map(|(size, _)| size);
    let file = sink
        .finish(&exported)
        .map_err(|error| CliError::Other(format!("cannot write {}: {error}", partial.display())))?;
    // The export is evidence: it is on disk before it is announced.
    file.sync_all()
        .map_err(|error| CliError::Other(format!("cannot sync {}: {error}", partial.display())))?;
    Ok(exported)
}

/// The export's first line (in Parquet: its footer's key-value metadata).
#[derive(serde::Serialize)]
pub struct Header {
    pub opledger_export: u64,
    pub chain: &'static str,
    /// The leaf encoding of the transparency log (docs/src/auditors/transparency-log.md).
    pub leaf: &'static str,
    /// The signed checkpoint the export was cut at (C2SP tlog-checkpoint), if the ledger has one.
    pub checkpoint: Option<String>,
    /// Its tree size: no exported event lies past it.
    pub tree_size: Option<u64>,
    /// `root` (every leaf is here: recompute the root), `inclusion` (each event carries its
    /// inclusion proof), or none.
    pub proof: Option<&'static str>,
    pub exported_at: String,
    pub log_head: u64,
    pub from: Option<serde_json::Value>,
    pub to: Option<serde_json::Value>,
    pub tenant: Option<String>,
    pub contiguous_positions: bool,
}

/// Where the events go.
enum Sink {
    Ndjson(BufWriter<File>),
    Parquet(Box<ParquetSink>),
}

impl Sink {
    fn ndjson(file: File, header: &Header) -> std::io::Result<Self> {
        let mut out = BufWriter::new(file);
        serde_json::to_writer(&mut out, header)?;
        out.write_all(b"\n")?;
        Ok(Self::Ndjson(out))
    }

    fn parquet(file: File, header: &Header) -> std::io::Result<Self> {
        Ok(Self::Parquet(Box::new(ParquetSink::new(file, header)?)))
    }

    fn event(&mut self, event: &ExportedEvent<'_>) -> std::io::Result<()> {
        match self {
            Self::Ndjson(out) => write_event(out, event),
            Self::Parquet(sink) => sink.event(event),
        }
    }

    fn finish(self, exported: &Exported) -> std::io::Result<File> {
        let mut end = json!({
            "events": exported.events,
            "first_position": exported.first,
            "last_position": exported.last,
        });
        if let Some(tenant_proof) = &exported.tenant_proof {
            end["tenant_tree"] = tenant_proof.clone();
        }
        match self {
            Self::Ndjson(mut out) => {
                writeln!(out, "{}", json!({ "end": end }))?;
                out.into_inner().map_err(|error| error.into_error())
            }
            Self::Parquet(sink) => sink.finish(&end),
        }
    }
}

/// One event as exported: the stored event, its time and the link before it, its inclusion proof
/// (in an export that carries them), and why it is there if it is only context.
pub struct ExportedEvent<'a> {
    pub event: &'a RecordedEvent,
    pub time: Option<DateTime<Utc>>,
    pub previous: Option<ChainHash>,
    pub inclusion: Option<Vec<Hash>>,
    /// `before` / `after`: the event just outside a slice's first / last end; `intent`: the event
    /// that opens an operation of a tenant export, named before the operation's first event in
    /// the file when the slice does not hold it. `None`: an exported event.
    pub context: Option<&'static str>,
}

fn bound_json(bound: LogBound) -> serde_json::Value {
    match bound {
        LogBound::Position(position) => json!(position),
        LogBound::Time(time) => json!(time.to_rfc3339_opts(SecondsFormat::Millis, true)),
    }
}

/// Walks the log from the slice's start to its end (at most `head`, the head when the export
/// began, so an export of a busy ledger ends), writing each event the slice admits.
///
/// With `tenants` (the tenants' map its checkpoint signs; a whole tenant's export), every
/// tenant's tree is grown from the events walked, the map they make must be the signed one, and
/// the tenant's head and its proof in the map go in the closing record.
async fn write_events<S: EventStore + LogTree>(
    store: &S,
    slice: &Slice,
    head: u64,
    proof: Proof,
    tenants: Option<merkle::TreeHead>,
    sink: &mut Sink,
) -> Result<Exported, CliError> {
    let mut streams = StreamMemory::default();
    let mut exported = Exported {
        events: 0,
        first: None,
        last: None,
        tenants_seen: std::collections::BTreeSet::new(),
        tree_size: None,
        tenant_proof: None,
    };
    let mut trees = tenants.map(|_| TenantTrees::new());
    // A tenant's export whose checkpoint signs the tenants' map walks the whole log up to it:
    // every tenant's tree is grown to check the signed map, and a slice's ends are proved by the
    // tenant's own tree (see `TenantSlice`).
    let walk_all = trees.is_some();
    let mut edges = match (&slice.tenant, walk_all) {
        (Some(_), true) if slice.from.is_some() || slice.to.is_some() => {
            Some(TenantSlice::default())
        }
        _ => None,
    };
    let bounded = slice.tenant.is_none() && proof != Proof::None;
    let mut started = match slice.from {
        Some(LogBound::Time(_)) => false,
        Some(LogBound::Position(_)) => !walk_all,
        None => true,
    };
    let mut ended = false;
    let mut start = match slice.from {
        // Reads start after the position named, so a slice from position `from` reads after
        // the one before it.
        Some(LogBound::Position(from)) if !walk_all => {
            LogStart::After(GlobalPosition::new(from - 1))
        }
        _ => LogStart::Beginning,
    };
    let progress = std::io::stderr().is_terminal();
    let mut last_progress = Instant::now();
    'log: loop {
        let batch = store.read_all(start, EXPORT_READ_BATCH).await?;
        let Some(last) = batch.last() else { break };
        start = LogStart::After(last.position);
        for event in &batch {
            let position = event.position.value();
            let time = time_of(event);
            if position > head {
                break 'log;
            }
            if past_the_end(slice.to, position, time) {
                if !walk_all {
                    break 'log;
                }
                ended = true;
            }
            if !started {
                // At or after `from`, to the millisecond, as every bound on time is compared.
                started = match slice.from {
                    Some(LogBound::Time(from)) => {
                        time.is_some_and(|time| time.timestamp_millis() >= from.timestamp_millis())
                    }
                    Some(LogBound::Position(from)) => position >= from,
                    None => true,
                };
                if !started && !walk_all {
                    continue;
                }
            }
            let previous = streams.previous_chain(store, event).await?;
            let admitted = match &slice.tenant {
                Some(tenant) => {
                    let of = streams.tenant(store, event).await?;
                    if let Some(of) = of
                        .as_ref()
                        .filter(|_| exported.tenants_seen.len() < MAX_TENANTS_NAMED)
                    {
                        exported.tenants_seen.insert(of.clone());
                    }
                    let leaf = merkle::leaf_hash(&event.view());
                    if let (Some(trees), Some(of)) = (trees.as_mut(), of.as_ref()) {
                        trees.push(of.as_str(), position, leaf);
                    }
                    let of_tenant = of.as_ref() == Some(tenant);
                    if let (Some(edges), true) = (edges.as_mut(), of_tenant) {
                        let outside = !started || ended;
                        if let Some(after) = edges.pass(event, leaf, !started, ended) {
                            write_context(store, sink, after, "tenant_after", proof, &mut streams)
                                .await?;
                        }
                        if outside {
                            streams.remember_chain(event);
                            continue;
                        }
                    }
                    of_tenant && started && !ended
                }
                None => true,
            };
            streams.remember_chain(event);
            if !admitted {
                continue;
            }
            if let Some(before) = edges.as_mut().and_then(TenantSlice::take_before) {
                write_context(store, sink, &before, "tenant_before", proof, &mut streams).await?;
            }
            if bounded && slice.from.is_some() && exported.first.is_none() && position > 1 {
                let before = event_at(store, position - 1).await?;
                write_context(store, sink, &before, "before", proof, &mut streams).await?;
            }
            if slice.tenant.is_some() && proof != Proof::None && streams.first_shown(event) {
                let intent = store
                    .read_stream(&event.stream, StreamVersion::FIRST, 1)
                    .await?;
                if let Some(intent) = intent.first() {
                    write_context(store, sink, intent, "intent", proof, &mut streams).await?;
                }
            }
            let exported_event = ExportedEvent {
                event,
                time,
                previous,
                inclusion: proof.of(store, position).await?,
                context: None,
            };
            sink.event(&exported_event)
                .map_err(|error| CliError::Other(format!("cannot write the export: {error}")))?;
            exported.events += 1;
            exported.first.get_or_insert(position);
            exported.last = Some(position);
        }
        if progress && last_progress.elapsed() >= PROGRESS_EVERY {
            eprint!(
                "\rexported {} event(s), at position {} of {head}…",
                exported.events, last.position
            );
            last_progress = Instant::now();
        }
    }
    if progress {
        eprint!("\r\x1b[2K");
    }
    if let Some(last) = exported
        .last
        .filter(|last| bounded && slice.to.is_some() && *last < head)
    {
        let after = event_at(store, last + 1).await?;
        write_context(store, sink, &after, "after", proof, &mut streams).await?;
    }
    if let (Some(signed), Some(trees), Some(tenant)) = (tenants, trees, &slice.tenant) {
        exported.tenant_proof = tenant_proof(&trees.map(), signed, head, tenant.as_str())?;
        if let (Some(proof), Some(edges)) = (exported.tenant_proof.as_mut(), edges) {
            edges.close(proof);
        }
    }
    Ok(exported)
}

/// What a slice of one tenant's export proves its ends with, from the tenant's own tree: the
/// tenant's event just before the slice (context `tenant_before`) and the frontier of the tree's
/// leaves before that one (`left`), the tenant's event just after it (context `tenant_after`) and
/// the compact range of the tree's leaves after that one (`right`). A verifier folds
/// `left`, those two events' and the exported events' leaves, and `right` into the tenant's root,
/// which the checkpoint's tenants' map signs: no event of the tenant between the two edges can
/// be left out, and the edges' positions and times show they lie outside the slice's bounds.
#[derive(Default)]
struct TenantSlice {
    /// The tenant's tree as the walk grew it, up to its first event after the slice.
    tree: Frontier,
    /// The tenant's last event before the slice, and the frontier of the leaves before it.
    before: Option<(RecordedEvent, Frontier)>,
    before_written: bool,
    /// The compact range of the tenant's leaves after its first event past the slice.
    after: Option<RangeFolder>,
}

impl TenantSlice {
    /// Passes an event of the tenant (log leaf hash `leaf`) before the slice, inside it, or after
    /// its end; returns it when it is the first after the end (to write as `tenant_after`).
    fn pass<'e>(
        &mut self,
        event: &'e RecordedEvent,
        leaf: Hash,
        before: bool,
        ended: bool,
    ) -> Option<&'e RecordedEvent> {
        let tenant_leaf = tenant_leaf_hash(event.position.value(), leaf);
        if let Some(after) = self.after.as_mut() {
            after.push(tenant_leaf);
            return None;
        }
        if before {
            self.before = Some((event.clone(), self.tree.clone()));
        }
        self.tree.push(tenant_leaf);
        if ended {
            self.after = Some(RangeFolder::new(self.tree.size()));
            return Some(event);
        }
        None
    }

    /// The tenant's event before the slice, once, for the slice's first event.
    fn take_before(&mut self) -> Option<RecordedEvent> {
        if std::mem::replace(&mut self.before_written, true) {
            return None;
        }
        self.before.as_ref().map(|(event, _)| event.clone())
    }

    /// Adds the slice's proof of its ends to the closing record's `tenant_tree`.
    fn close(self, proof: &mut serde_json::Value) {
        let text =
            |hashes: Vec<Hash>| -> Vec<String> { hashes.iter().map(ToString::to_string).collect() };
        let left = self.before.map(|(_, left)| left).unwrap_or_default();
        let right = self.after.map(|after| after.hashes()).unwrap_or_default();
        proof["left_size"] = json!(left.size());
        proof["left"] = json!(text(left.hashes()));
        proof["right"] = json!(text(right));
    }
}

/// The closing record's proof that `tenant`'s tree, as the walk grew it, is the one the
/// checkpoint of `size` events signs in its tenants' map `signed`; `None` when the tenant has no
/// event (the export is then refused as empty). Refuses an export whose walk does not make the
/// signed map: the ledger's tenant trees disagree with its log.
fn tenant_proof(
    map: &TenantMap,
    signed: merkle::TreeHead,
    size: u64,
    tenant: &str,
) -> Result<Option<serde_json::Value>, CliError> {
    if map.head() != signed {
        return Err(CliError::Other(format!(
            "the checkpoint of {size} events signs a tenants' map ({} tenants) that the log's events do not make ({} tenants): the ledger was changed behind opledger's back; run `opledger verify`",
            signed.size,
            map.len()
        )));
    }
    let (Some(head), Some((index, proof))) = (map.get(tenant), map.prove(tenant)) else {
        return Ok(None);
    };
    Ok(Some(json!({
        "size": head.size,
        "root": head.root.to_string(),
        "map_index": index,
        "map_proof": proof.iter().map(ToString::to_string).collect::<Vec<_>>(),
    })))
}

/// The event at `position` (the log has it: it lies inside the checkpoint's tree).
async fn event_at<S: EventStore>(store: &S, position: u64) -> Result<RecordedEvent, CliError> {
    let start = match position - 1 {
        0 => LogStart::Beginning,
        before => LogStart::After(GlobalPosition::new(before)),
    };
    store
        .read_all(start, 1)
        .await?
        .into_iter()
        .next()
        .filter(|event| event.position.value() == position)
        .ok_or_else(|| {
            CliError::Other(format!(
                "the log has no event at position {position}, inside its checkpoint's tree; run `opledger verify`"
            ))
        })
}

/// Writes `event` as a context line of `kind`, with its own inclusion proof.
async fn write_context<S: EventStore + LogTree>(
    store: &S,
    sink: &mut Sink,
    event: &RecordedEvent,
    kind: &'static str,
    proof: Proof,
    streams: &mut StreamMemory,
) -> Result<(), CliError> {
    let previous = streams.previous_chain(store, event).await?;
    let line = ExportedEvent {
        event,
        time: time_of(event),
        previous,
        inclusion: proof.of(store, event.position.value()).await?,
        context: Some(kind),
    };
    sink.event(&line)
        .map_err(|error| CliError::Other(format!("cannot write the export: {error}")))
}

/// Whether an event at `position` and `time` lies after the slice's end.
fn past_the_end(to: Option<LogBound>, position: u64, time: Option<DateTime<Utc>>) -> bool {
    match to {
        None => false,
        Some(LogBound::Position(to)) => position > to,
        Some(LogBound::Time(to)) => time.is_some_and(|time| !at_or_before(time, to)),
    }
}

/// When the event happened, as the ledger recorded it (`None` if it cannot be decoded: a
/// tampered or unknown event is still exported, for the verifier to judge).
fn time_of(event: &RecordedEvent) -> Option<DateTime<Utc>> {
    codec::decode(event).ok().map(|decoded| decoded.at())
}

/// One event's line, its members in the order a reader scans them.
#[derive(serde::Serialize)]
struct EventLine<'a> {
    position: u64,
    stream: &'a str,
    version: u64,
    event_id: String,
    #[serde(rename = "type")]
    event_type: &'a str,
    time: Option<String>,
    chain: Option<String>,
    previous_chain: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data_base64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata_base64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    inclusion_proof: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    context: Option<&'static str>,
}

fn write_event(out: &mut impl Write, exported: &ExportedEvent<'_>) -> std::io::Result<()> {
    let ExportedEvent {
        event,
        time,
        previous,
        inclusion,
        context,
    } = exported;
    // The exact stored bytes, as text when they are UTF-8 (a JSON string carries any text
    // losslessly), else as base64 under another name, so nothing is silently replaced.
    let (data, data_base64) = text_or_base64(&event.data);
    let (metadata, metadata_base64) = text_or_base64(&event.metadata);
    let line = EventLine {
        position: event.position.value(),
        stream: event.stream.as_str(),
        version: event.version.value(),
        event_id: event.event_id.to_string(),
        event_type: &event.event_type,
        time: time.map(|time| time.to_rfc3339_opts(SecondsFormat::Millis, true)),
        chain: codec::chain_of(&event.metadata).map(|chain| chain.to_hex()),
        previous_chain: previous.as_ref().map(ChainHash::to_hex),
        data,
        data_base64,
        metadata,
        metadata_base64,
        inclusion_proof: inclusion
            .as_ref()
            .map(|proof| proof.iter().map(ToString::to_string).collect()),
        context: *context,
    };
    serde_json::to_writer(&mut *out, &line)?;
    out.write_all(b"\n")
}

fn text_or_base64(bytes: &[u8]) -> (Option<&str>, Option<String>) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (Some(text), None),
        Err(_) => (None, Some(STANDARD.encode(bytes))),
    }
}

/// What the export remembers of recent streams: the stored chain link and version of the last
/// event it passed, and the stream's tenant.
#[derive(Default)]
struct StreamMemory {
    links: HashMap<StreamName, (StreamVersion, Option<ChainHash>)>,
    tenants: HashMap<StreamName, Option<TenantId>>,
    /// Streams of a tenant export whose intent the file already holds (emptied when full: the
    /// intent is then named again, which a verifier accepts).
    shown: std::collections::HashSet<StreamName>,
}

impl StreamMemory {
    /// Whether `event` is the first of its stream in a tenant export without the stream's intent
    /// before it in the file (so the intent must be written as context first).
    fn first_shown(&mut self, event: &RecordedEvent) -> bool {
        if self.shown.len() >= MAX_REMEMBERED_STREAMS {
            self.shown.clear();
        }
        let new = self.shown.insert(event.stream.clone());
        new && event.version != StreamVersion::FIRST
    }

    /// The stored chain link of the event before `event` in its stream (`None` for a first
    /// event, or one whose predecessor carries no link).
    async fn previous_chain<S: EventStore>(
        &mut self,
        store: &S,
        event: &RecordedEvent,
    ) -> Result<Option<ChainHash>, CliError> {
        let Some(before) = event.version.value().checked_sub(1) else {
            return Ok(None);
        };
        if let Some((version, chain)) = self.links.get(&event.stream) {
            if version.value() == before {
                return Ok(*chain);
            }
        }
        let before = StreamVersion::new(before);
        let stored = store.read_stream(&event.stream, before, 1).await?;
        Ok(stored
            .first()
            .filter(|stored| stored.version == before)
            .and_then(|stored| codec::chain_of(&stored.metadata)))
    }

    fn remember_chain(&mut self, event: &RecordedEvent) {
        if self.links.len() >= MAX_REMEMBERED_STREAMS {
            self.links.clear();
        }
        self.links.insert(
            event.stream.clone(),
            (event.version, codec::chain_of(&event.metadata)),
        );
    }

    /// The tenant of `event`'s operation, from the intent that opens its stream.
    async fn tenant<S: EventStore>(
        &mut self,
        store: &S,
        event: &RecordedEvent,
    ) -> Result<&Option<TenantId>, CliError> {
        if !self.tenants.contains_key(&event.stream) {
            let first = if event.version == StreamVersion::FIRST {
                Some(event.clone())
            } else {
                store
                    .read_stream(&event.stream, StreamVersion::FIRST, 1)
                    .await?
                    .into_iter()
                    .next()
            };
            let tenant = first.and_then(|first| match codec::decode(&first) {
                Ok(OperationEvent::IntentRecorded(intent)) => Some(intent.tenant),
                _ => None,
            });
            if self.tenants.len() >= MAX_REMEMBERED_STREAMS {
                self.tenants.clear();
            }
            self.tenants.insert(event.stream.clone(), tenant);
        }
        Ok(&self.tenants[&event.stream])
    }
}
