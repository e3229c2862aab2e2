//! The transparency log's commands: `keys generate`, `checkpoint`, `prove` and `witness`.
//!
//! The signing key is read from a file or the environment, never from the ledger; the witness
//! trusts nothing the server says without checking it (the checkpoint's signature, and a
//! consistency proof from the checkpoint it kept before).

use std::io::{Read, Write};
use std::path::Path;

use opledger_domain::checkpoint::{self, LogSigner};
use opledger_domain::ids::{GlobalPosition, OperationId, StreamVersion};
use opledger_domain::merkle::{self, Hash, LogTree, TreeHead};
use opledger_domain::store::{EventStore, LogStart, RecordedEvent, StreamName, MAX_READ_BATCH};
use serde_json::{json, Value};

use crate::cli::{
    CheckpointArgs, CliError, KeysGenerateArgs, ProveArgs, SigningKeyArgs, WitnessArgs,
};
use crate::intent::{close, open_for_reading};

/// The environment variable that may hold the signing key itself (when no file is given).
pub const SIGNING_KEY_ENV: &str = "OPLEDGER_LOG_KEY";
/// Largest checkpoint or answer the witness reads from a server, in bytes.
const MAX_WITNESS_ANSWER_BYTES: usize = 64 * 1024;

/// `opledger keys generate`.
pub fn generate_keys(args: KeysGenerateArgs) -> Result<(), CliError> {
    let mut seed = [0_u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut seed))
        .map_err(|error| CliError::Other(format!("cannot read random bytes: {error}")))?;
    let (signer, verifier) = checkpoint::generate_keys(&args.name, seed)
        .map_err(|error| CliError::Config(error.to_string()))?;
    write_new_private(&args.out, &signer)?;
    println!("{verifier}");
    eprintln!(
        "the signing key is in {} (keep it secret, outside the ledger); the line above is the verifier key to give auditors and witnesses",
        args.out.display()
    );
    Ok(())
}

/// Creates `path` with `text`, readable by its owner only; an existing file is never replaced.
fn write_new_private(path: &Path, text: &str) -> Result<(), CliError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(|error| {
        CliError::Other(format!(
            "cannot create {}: {error} (an existing key is never overwritten; choose another --out)",
            path.display()
        ))
    })?;
    file.write_all(format!("{text}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|error| CliError::Other(format!("cannot write {}: {error}", path.display())))
}

/// The signing key from `--key-file` (or `OPLEDGER_LOG_KEY_FILE`), else from `OPLEDGER_LOG_KEY`.
pub fn load_signer(args: &SigningKeyArgs) -> Result<LogSigner, CliError> {
    let text = match &args.key_file {
        Some(path) => std::fs::read_to_string(path).map_err(|error| {
            CliError::Config(format!(
                "cannot read the signing key file {}: {error}",
                path.display()
            ))
        })?,
        None => std::env::var(SIGNING_KEY_ENV).map_err(|_| {
            CliError::Config(format!(
                "no signing key: pass --key-file FILE or set {SIGNING_KEY_ENV} (make one with `opledger keys generate --name NAME --out FILE`)"
            ))
        })?,
    };
    LogSigner::parse(&text).map_err(|error| CliError::Config(error.to_string()))
}

fn proof_error(error: merkle::ProofError) -> CliError {
    CliError::Other(error.to_string())
}

/// `opledger checkpoint`.
pub async fn checkpoint(args: CheckpointArgs) -> Result<(), CliError> {
    let signer = load_signer(&args.key)?;
    let ledger = open_for_reading(&args.store.db).await?;
    let result = sign_and_keep(ledger.store(), &signer).await;
    let closed = close(&ledger).await;
    let note = result?;
    closed?;
    if let Some(out) = &args.out {
        std::fs::write(out, &note)
            .map_err(|error| CliError::Other(format!("cannot write {}: {error}", out.display())))?;
    }
    print!("{note}");
    Ok(())
}

/// Signs the tree head as it is now and keeps the checkpoint in the store; returns the note.
async fn sign_and_keep<L: LogTree>(store: &L, signer: &LogSigner) -> Result<String, CliError> {
    Ok(sign_and_keep_head(store, signer).await?.1)
}

/// [`sign_and_keep`], with the tree size signed. The note returned is the one just signed (a
/// store that already keeps a checkpoint of that size, by another key, keeps its first).
pub async fn sign_and_keep_head<L: LogTree>(
    store: &L,
    signer: &LogSigner,
) -> Result<(u64, String), CliError> {
    let (head, tenants) = merkle::heads_to_sign(store).await.map_err(proof_error)?;
    let note = signer
        .sign(head, tenants)
        .map_err(|error| CliError::Config(error.to_string()))?;
    store.keep_checkpoint(head.size, note.clone()).await?;
    Ok((head.size, note))
}

/// `opledger prove`.
pub async fn prove(args: ProveArgs) -> Result<(), CliError> {
    let ledger = open_for_reading(&args.store.db).await?;
    let result = prove_in(ledger.store(), &args).await;
    let closed = close(&ledger).await;
    let proof = result?;
    closed?;
    println!(
        "{}",
        serde_json::to_string_pretty(&proof).map_err(|error| CliError::Other(error.to_string()))?
    );
    Ok(())
}

async fn prove_in<S: EventStore + LogTree>(store: &S, args: &ProveArgs) -> Result<Value, CliError> {
    let Some((size, note)) = store.kept_checkpoint(args.size).await? else {
        return Err(CliError::NotFound(match args.size {
            Some(size) => format!("no checkpoint of tree size {size} is kept in this ledger"),
            None => {
                "no checkpoint is kept in this ledger yet; run `opledger checkpoint` first".into()
            }
        }));
    };
    let events = events_named(store, &args.what).await?;
    let mut proved = Vec::with_capacity(events.len());
    for event in &events {
        let index = event.position.value() - 1;
        if index >= size {
            proved.push(json!({
                "position": event.position.value(),
                "stream": event.stream.as_str(),
                "version": event.version.value(),
                "event_type": event.event_type,
                "covered": false,
            }));
            continue;
        }
        let proof = merkle::inclusion_proof_of(store, index, size)
            .await
            .map_err(proof_error)?;
        proved.push(event_proof(event, index, &proof));
    }
    let root = merkle::head_of(store, Some(size))
        .await
        .map_err(proof_error)?
        .root;
    Ok(json!({
        "checkpoint": note,
        "tree_size": size,
        "root_hash": root.to_string(),
        "events": proved,
    }))
}

/// An event's leaf and its inclusion proof, every hash in standard base64.
pub fn event_proof(event: &RecordedEvent, index: u64, proof: &[Hash]) -> Value {
    use base64::Engine as _;
    let leaf = merkle::leaf_bytes(&event.view());
    json!({
        "position": event.position.value(),
        "stream": event.stream.as_str(),
        "version": event.version.value(),
        "event_type": event.event_type,
        "covered": true,
        "leaf_index": index,
        "leaf": base64::engine::general_purpose::STANDARD.encode(&leaf),
        "leaf_hash": merkle::leaf_hash(&event.view()).to_string(),
        "inclusion_proof": proof.iter().map(ToString::to_string).collect::<Vec<_>>(),
    })
}

/// The events `what` names: every event of an operation, or the event at a position.
async fn events_named<S: EventStore>(
    store: &S,
    what: &str,
) -> Result<Vec<RecordedEvent>, CliError> {
    if let Ok(position) = what.parse::<u64>() {
        let start = match position.checked_sub(1) {
            Some(0) | None => LogStart::Beginning,
            Some(before) => LogStart::After(GlobalPosition::new(before)),
        };
        let found = store.read_all(start, 1).await?;
        return match found.into_iter().next() {
            Some(event) if event.position.value() == position => Ok(vec![event]),
            _ => Err(CliError::NotFound(format!(
                "no event at position {position}"
            ))),
        };
    }
    let operation: OperationId = what.parse().map_err(|_| {
        CliError::Config(format!(
            "`{what}` is neither a global position nor an operation id"
        ))
    })?;
    let stream = StreamName::for_operation(operation);
    let mut events = Vec::new();
    let mut from = StreamVersion::FIRST;
    loop {
        let batch = store.read_stream(&stream, from, MAX_READ_BATCH).await?;
        let Some(last) = batch.last() else { break };
        from = last.version.next();
        events.extend(batch);
    }
    if events.is_empty() {
        return Err(CliError::NotFound(format!(
            "no operation {operation} in this ledger"
        )));
    }
    Ok(events)
}

/// `opledger witness`.
pub async fn witness(args: WitnessArgs) -> Result<(), CliError> {
    let client = reqwest::Client::new();
    let base = args.url.trim_end_matches('/');
    let served = fetch_text(&client, &format!("{base}/v1/log/checkpoint")).await?;
    let new = checkpoint::open(&served, &args.verifier_key)
        .map_err(|error| witness_failed(format!("the served checkpoint is refused: {error}")))?;
    let kept = match std::fs::read_to_string(&args.state) {
        Ok(text) => Some(
            checkpoint::open(&text, &args.verifier_key).map_err(|error| {
                CliError::Other(format!(
                    "the kept checkpoint in {} does not open: {error}",
                    args.state.display()
                ))
            })?,
        ),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => {
            return Err(CliError::Other(format!(
                "cannot read {}: {error}",
                args.state.display()
            )))
        }
    };
    if let Some(old) = &kept {
        check_extends(&client, base, old.head, new.head).await?;
    }
    keep_state(&args.state, &served)?;
    println!(
        "witness: {} at tree size {} ({}){}",
        new.origin,
        new.head.size,
        new.head.root,
        match &kept {
            Some(old) => format!(", consistent with the kept tree size {}", old.head.size),
            None => ", kept as the first checkpoint".into(),
        }
    );
    Ok(())
}

fn witness_failed(detail: String) -> CliError {
    eprintln!("witness: {detail}");
    CliError::Tampered { findings: 1 }
}

/// Checks with a served consistency proof that `new` extends `old`.
async fn check_extends(
    client: &reqwest::Client,
    base: &str,
    old: TreeHead,
    new: TreeHead,
) -> Result<(), CliError> {
    if new.size < old.size {
        return Err(witness_failed(format!(
            "the log shrank: the served checkpoint has {} leaves, the kept one {}",
            new.size, old.size
        )));
    }
    if old.size == 0 || new.size == old.size {
        return if new.root == old.root || old.size == 0 {
            Ok(())
        } else {
            Err(witness_failed(format!(
                "two different roots for tree size {}: the history was rewritten",
                new.size
            )))
        };
    }
    let answer = fetch_text(
        client,
        &format!(
            "{base}/v1/log/proof/consistency?from={}&to={}",
            old.size, new.size
        ),
    )
    .await?;
    let proof = parse_proof(&answer, "consistency_proof")?;
    merkle::check_consistency(&proof, old, new).map_err(|error| {
        witness_failed(format!(
            "the served tree of {} leaves does not extend the kept one of {}: {error}",
            new.size, old.size
        ))
    })
}

/// The hashes under `key` of a JSON answer.
pub fn parse_proof(answer: &str, key: &str) -> Result<Vec<Hash>, CliError> {
    let value: Value = serde_json::from_str(answer)
        .map_err(|error| CliError::Other(format!("the server's proof is not JSON: {error}")))?;
    value[key]
        .as_array()
        .ok_or_else(|| CliError::Other(format!("the server's answer has no `{key}`")))?
        .iter()
        .map(|hash| {
            hash.as_str()
                .and_then(merkle::parse_hash)
                .ok_or_else(|| CliError::Other(format!("`{key}` holds something not a hash")))
        })
        .collect()
}

async fn fetch_text(client: &reqwest::Client, url: &str) -> Result<String, CliError> {
    let response = client
        .get(url)
        .send()
        .await
        .map_err(|error| CliError::Other(format!("cannot fetch {url}: {error}")))?;
    let status = response.status();
    let body = response
        .bytes()
        .await
        .map_err(|error| CliError::Other(format!("cannot read {url}: {error}")))?;
    if body.len() > MAX_WITNESS_ANSWER_BYTES {
        return Err(CliError::Other(format!(
            "{url} answered more than {MAX_WITNESS_ANSWER_BYTES} bytes"
        )));
    }
    let text = String::from_utf8_lossy(&body).into_owned();
    if !status.is_success() {
        return Err(CliError::Other(format!("{url} answered {status}: {text}")));
    }
    Ok(text)
}

/// Replaces the witness's state file atomically (write beside it, then rename).
fn keep_state(path: &Path, note: &str) -> Result<(), CliError> {
    let temporary = path.with_extension("new");
    std::fs::write(&temporary, note)
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|error| CliError::Other(format!("cannot keep {}: {error}", path.display())))
}
