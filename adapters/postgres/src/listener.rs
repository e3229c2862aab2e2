//! Wake-ups for this instance's subscriptions when any instance commits: every commit that
//! writes events sends `NOTIFY` on [`NOTIFY_CHANNEL`] with its newest position (in the same
//! transaction, so it is delivered only if the commit happened, and after it is visible), and
//! each store keeps one connection that `LISTEN`s and moves the store's head when one arrives.
//!
//! Polling stays (`PostgresConfig::subscription_poll_ms`): a notification is lost while this
//! connection is down (a restart of the server, a cut), and then the poll finds the commits. So
//! the listener must never be what makes subscriptions correct, only prompt: it only ever moves
//! the head forward, to a position already committed and visible.

use std::sync::Arc;
use std::time::Duration;

use opledger_domain::ids::GlobalPosition;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::{codec, Connector};

/// The channel commits notify on; a PostgreSQL identifier, per database.
pub(crate) const NOTIFY_CHANNEL: &str = "opledger_log";
/// The pause before the listener connects again after its connection failed, in ms; commits
/// meanwhile are found by the subscriptions' poll.
pub const LISTEN_RETRY_PAUSE_MS: u64 = 1_000;

/// Starts the listener and returns once `LISTEN` is in effect (or its first try failed, then
/// it keeps trying in the background), so a commit after the store opened wakes subscribers.
pub(crate) async fn start(
    connector: Arc<Connector>,
    head: Arc<watch::Sender<Option<GlobalPosition>>>,
) -> JoinHandle<()> {
    let (ready, listening) = oneshot::channel();
    let listener = tokio::spawn(run(connector, head, ready));
    // An error means the task ended before answering: nothing to wait for then.
    let _ = listening.await;
    listener
}

async fn run(
    connector: Arc<Connector>,
    head: Arc<watch::Sender<Option<GlobalPosition>>>,
    ready: oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    loop {
        let reason = listen(&connector, &head, &mut ready).await;
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        }
        if head.is_closed() {
            return;
        }
        tracing::debug!(%reason, "not listening for commits; subscriptions poll until it is back");
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(LISTEN_RETRY_PAUSE_MS)) => {}
            // Every subscription and the store are gone: nobody to wake.
            () = head.closed() => return,
        }
    }
}

/// One listening connection, until it ends; returns why it ended.
async fn listen(
    connector: &Connector,
    head: &Arc<watch::Sender<Option<GlobalPosition>>>,
    ready: &mut Option<oneshot::Sender<()>>,
) -> String {
    // Checked like every connection: an older copy of the ledger is never listened to.
    let mut connection = match connector.connect().await {
        Ok(connection) => connection,
        Err(error) => return error.to_string(),
    };
    let client = &connection.client;
    let setup = async {
        client
            .batch_execute(&format!("LISTEN {NOTIFY_CHANNEL}"))
            .await
            .map_err(|error| crate::describe(&error))?;
        // Commits between the store's start (or the last connection's end) and LISTEN sent no
        // notification here: the head as it is now covers them.
        client
            .query_one("SELECT last_position FROM opledger.log_head", &[])
            .await
            .map(|row| row.get::<_, i64>(0))
            .map_err(|error| crate::describe(&error))
    };
    // Bounded like every round trip: a silent peer must not keep the listener from trying again.
    let last = tokio::time::timeout(connector.round_trip, setup)
        .await
        .unwrap_or_else(|_| Err("no answer within the round-trip timeout".to_owned()));
    match last {
        Ok(last) => advance_to(head, &last.to_string()),
        Err(reason) => return reason,
    }
    if let Some(ready) = ready.take() {
        let _ = ready.send(());
    }
    tracing::debug!("listening for commits of every instance");
    loop {
        tokio::select! {
            note = connection.notifications.recv() => match note {
                Some(payload) => advance_to(head, &payload),
                None => return "the connection closed".to_owned(),
            },
            // The store was dropped without `close` and its subscriptions are gone: dropping
            // the connection on return ends it.
            () = head.closed() => return "nobody is left to wake".to_owned(),
        }
    }
}

/// Moves the head to the position a notification (or the log's head) names, if it is newer.
fn advance_to(head: &watch::Sender<Option<GlobalPosition>>, payload: &str) {
    match payload.parse::<i64>() {
        Ok(0) => {}
        Ok(position) => match codec::position(position) {
            Ok(position) => crate::advance(head, position),
            Err(error) => tracing::debug!(%error, "a notification names no position"),
        },
        // Another program notifying on the channel: not ours to act on.
        Err(_) => tracing::debug!(payload, "a notification that is not a position; ignored"),
    }
}
