//! The transparency log over HTTP: the newest signed checkpoint (C2SP tlog-checkpoint), the
//! tree's hash tiles (C2SP tlog-tiles, height 8), and inclusion and consistency proofs.
//!
//! These answers carry sizes and hashes only, never an event's content, so they need no token:
//! a witness or an auditor's tlog client follows the log as it follows any other. They are
//! served from the stored tree (O(log n) reads per proof) and never from anything computed on
//! trust: a tile or proof past the tree is a 404, not a guess.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use opledger_domain::ids::{GlobalPosition, OperationId, StreamVersion};
use opledger_domain::merkle::{self, LogTree, ProofError};
use opledger_domain::store::{EventStore, LogStart, StreamName};
use serde::Deserialize;
use serde_json::json;

use super::{json_reply, ApiError, Shared};

/// The height of a tile: 8 levels, 256 hashes wide (C2SP tlog-tiles).
const TILE_HEIGHT: u8 = 8;

fn proof_error(error: ProofError) -> ApiError {
    match error {
        ProofError::OutOfRange { reason } => {
            ApiError::new(StatusCode::NOT_FOUND, "not_in_tree", reason)
        }
        other => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!("{other}; try again shortly"),
        ),
    }
}

fn text(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

/// `GET /v1/log/checkpoint`: the newest kept checkpoint; with a signing key configured and none
/// kept yet, one is signed now.
pub(super) async fn checkpoint(State(shared): State<Arc<Shared>>) -> Result<Response, ApiError> {
    let store = shared.engine.ledger().store();
    if let Some((_, note)) = store.kept_checkpoint(None).await? {
        return Ok(text(note));
    }
    let Some(signer) = &shared.log_signer else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_checkpoint",
            "no checkpoint is kept yet and this server has no signing key; configure [log] signing_key_file (or OPLEDGER_LOG_KEY), or run `opledger checkpoint`",
        ));
    };
    let (_, note) = crate::log::publish(store, signer).await.map_err(|reason| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", reason)
    })?;
    Ok(text(note))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct InclusionQuery {
    position: u64,
    size: Option<u64>,
}

/// `GET /v1/log/proof/inclusion?position=…&size=…`: the inclusion proof of the event at
/// `position` in the tree of `size` leaves (default: the newest kept checkpoint's, else the tree's).
pub(super) async fn inclusion(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<InclusionQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    // A missing or malformed parameter is answered as JSON, as every route's error is.
    let Query(query) = query?;
    let store = shared.engine.ledger().store();
    let kept = store.kept_checkpoint(query.size).await?;
    let size = match (query.size, &kept) {
        (Some(size), _) => size,
        (None, Some((size, _))) => *size,
        (None, None) => store.tree_size().await?,
    };
    let Some(index) = query.position.checked_sub(1).filter(|index| *index < size) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_in_tree",
            format!(
                "position {} is not in the tree of {size} events (positions start at 1)",
                query.position
            ),
        ));
    };
    let start = match index {
        0 => LogStart::Beginning,
        before => LogStart::After(GlobalPosition::new(before)),
    };
    let event = store
        .read_all(start, 1)
        .await?
        .into_iter()
        .next()
        .filter(|event| event.position.value() == query.position);
    let proof = merkle::inclusion_proof_of(store, index, size)
        .await
        .map_err(proof_error)?;
    let head = merkle::head_of(store, Some(size))
        .await
        .map_err(proof_error)?;
    Ok(json_reply(
        StatusCode::OK,
        &json!({
            "position": query.position,
            "leaf_index": index,
            "tree_size": size,
            "root_hash": head.root.to_string(),
            "leaf_hash": event.as_ref().map(|event| merkle::leaf_hash(&event.view()).to_string()),
            "inclusion_proof": proof.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "checkpoint": kept.filter(|(kept, _)| *kept == size).map(|(_, note)| note),
        }),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ConsistencyQuery {
    from: u64,
    to: u64,
}

/// `GET /v1/log/proof/consistency?from=…&to=…`: the proof that the tree of `to` leaves extends
/// the one of `from` leaves.
pub(super) async fn consistency(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<ConsistencyQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    // A missing or malformed parameter is answered as JSON, as every route's error is.
    let Query(query) = query?;
    let store = shared.engine.ledger().store();
    let proof = merkle::consistency_proof_of(store, query.from, query.to)
        .await
        .map_err(proof_error)?;
    Ok(json_reply(
        StatusCode::OK,
        &json!({
            "from": query.from,
            "to": query.to,
            "consistency_proof": proof.iter().map(ToString::to_string).collect::<Vec<_>>(),
        }),
    ))
}

/// `GET /v1/log/tile/{L}/{N}[.p/{W}]`: the hash tile (C2SP tlog-tiles): `W` (default 256)
/// hashes of level `8·L`, from index `256·N` on, 32 bytes each.
pub(super) async fn tile(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path(path): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let bad = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no_such_tile",
            format!(
                "`{path}` is not a hash tile path (`<level>/<index>[.p/<width>]`, C2SP tlog-tiles)"
            ),
        )
    };
    if path.starts_with("entries/") || path.starts_with("data/") {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_such_tile",
            "entry bundles are not served (an event may exceed their 64 KiB entries); `opledger prove` and /v1/log/proof/inclusion give each event's leaf",
        ));
    }
    let tile = merkle::Tile::from_path(&format!("tile/{TILE_HEIGHT}/{path}")).map_err(|_| bad())?;
    let store = shared.engine.ledger().store();
    let size = store.tree_size().await?;
    let level = u32::from(tile.level()) * u32::from(TILE_HEIGHT);
    let first = tile.level_index() << TILE_HEIGHT;
    let width = u64::from(tile.width());
    // The hashes at this level exist for the first `size >> level` subtrees.
    let available = size.checked_shr(level).unwrap_or(0);
    if first + width > available {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_in_tree",
            format!("the tree of {size} events has no such tile yet"),
        ));
    }
    let level = u8::try_from(level).map_err(|_| bad())?;
    let indexes: Vec<u64> = (first..first + width)
        .map(|index| merkle::stored_hash_index(level, index))
        .collect();
    let hashes = store.stored_hashes(indexes).await?;
    let body: Vec<u8> = hashes.iter().flat_map(|hash| hash.0).collect();
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response())
}

/// The proof of an answer as of a moment: the checkpoint it is proved against (the newest kept
/// one; one is signed now when none kept covers the events and this server has the key) and,
/// for each event folded (versions 0 to `version` of the operation's stream), its position, its
/// leaf (base64 of the bytes the book's leaf encoding gives), leaf hash and inclusion proof. The
/// events are read again from the log, so the answer's fold can be checked event by event.
pub(super) async fn operation_proof(
    shared: &Shared,
    operation_id: OperationId,
    version: Option<StreamVersion>,
) -> Result<serde_json::Value, ApiError> {
    use base64::Engine as _;
    let store = shared.engine.ledger().store();
    let count = version.map_or(0, |version| version.value() + 1);
    let events = store
        .read_stream(
            &StreamName::for_operation(operation_id),
            StreamVersion::FIRST,
            usize::try_from(count).unwrap_or(usize::MAX),
        )
        .await?;
    let highest = events
        .iter()
        .map(|event| event.position.value())
        .max()
        .unwrap_or(0);
    let (size, note) = covering_checkpoint(shared, highest).await?;
    let mut proved = Vec::with_capacity(events.len());
    for event in events.iter().filter(|event| event.version.value() < count) {
        let index = event.position.value() - 1;
        let proof = merkle::inclusion_proof_of(store, index, size)
            .await
            .map_err(proof_error)?;
        let leaf = merkle::leaf_bytes(&event.view());
        proved.push(json!({
            "position": event.position.value(),
            "version": event.version.value(),
            "leaf_index": index,
            "leaf": base64::engine::general_purpose::STANDARD.encode(&leaf),
            "leaf_hash": merkle::leaf_hash(&event.view()).to_string(),
            "inclusion_proof": proof.iter().map(ToString::to_string).collect::<Vec<_>>(),
        }));
    }
    Ok(json!({"tree_size": size, "checkpoint": note, "events": proved}))
}

/// The newest kept checkpoint if it covers the leaf at `position`, else one signed now.
async fn covering_checkpoint(shared: &Shared, position: u64) -> Result<(u64, String), ApiError> {
    let store = shared.engine.ledger().store();
    if let Some((size, note)) = store.kept_checkpoint(None).await? {
        if size >= position {
            return Ok((size, note));
        }
    }
    let Some(signer) = &shared.log_signer else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "no_checkpoint",
            format!("no kept checkpoint covers position {position} yet and this server has no signing key; ask again after the next `opledger checkpoint`"),
        ));
    };
    crate::log::publish(store, signer).await.map_err(|reason| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", reason)
    })
}
