//! Which copy of which ledger a connection reached, checked on every connection the store opens
//! (the writer's, the read pool's, the listener's), before anything is read or written on it.
//!
//! After a failover the old primary may come back as a primary: a reconnection that takes the
//! first writable host of a multi-host URL then lands on an older copy of the ledger, and writes
//! acknowledged there never reach the read models or the subscribers, which are already past
//! its end. So a ledger has an identity, and the store a memory of what it has seen:
//! - the ledger id, one row written when the schema is created (`opledger.ledger`): a server
//!   holding another ledger is refused;
//! - the cluster's system identifier (a streaming standby shares its primary's; a dump restored
//!   elsewhere does not): another cluster is refused until opledger is restarted against it on
//!   purpose;
//! - the timeline the server writes on (a promotion starts a new one): an older timeline of the
//!   same cluster is a former primary, refused;
//! - the log's head: lower than the newest position this store has seen is a copy that went
//!   backwards, refused.
//!
//! A refused connection is closed before it is used and the next host of the URL is tried; the
//! refusal stays in force (appends answer "unavailable" with it, readiness fails with it) until a
//! connection passes the check. It must never let a connection that failed the check write or
//! read.

use std::sync::{Arc, Mutex};

use opledger_domain::ids::GlobalPosition;
use tokio::sync::watch;
use tokio_postgres::Client;

use crate::codec;

/// Reads what the check needs, in one round trip. `pg_current_wal_lsn` names the timeline a
/// primary writes on (the first 8 hex digits of its WAL file name); a standby has none (NULL).
pub(crate) const READ_IDENTITY: &str = "\
    SELECT (SELECT ledger_id::text FROM opledger.ledger), \
           (SELECT system_identifier::text FROM pg_control_system()), \
           CASE WHEN pg_is_in_recovery() THEN NULL \
                ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int::bigint END, \
           (SELECT last_position FROM opledger.log_head)";

/// How many times a head found behind the newest position seen is read again before the copy
/// is refused. A listener learns of a commit when the committing transaction is durable, a
/// moment before every new snapshot sees it (PostgreSQL marks a transaction committed before it
/// leaves the running set), so a connection opened in that moment reads an older head once.
pub(crate) const HEAD_REREADS: u32 = 5;
/// The pause before each renewed read of the head, in ms.
pub(crate) const HEAD_REREAD_PAUSE_MS: u64 = 20;

/// What one server said about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    pub(crate) ledger_id: String,
    pub(crate) system_id: String,
    /// `None` on a standby.
    pub(crate) timeline: Option<i64>,
    pub(crate) head: i64,
}

impl Found {
    pub(crate) async fn read(client: &Client) -> Result<Self, tokio_postgres::Error> {
        let row = client.query_one(READ_IDENTITY, &[]).await?;
        Ok(Self {
            ledger_id: row.get::<_, Option<String>>(0).unwrap_or_default(),
            system_id: row.get(1),
            timeline: row.get(2),
            head: row.get(3),
        })
    }
}

/// The identity this store holds to, and the refusal in force, if any.
pub(crate) struct Identity {
    known: Mutex<Option<Known>>,
    refused: Mutex<Option<String>>,
    /// The newest position this store has seen committed (its own commits and every
    /// instance's notifications move it).
    seen: Arc<watch::Sender<Option<GlobalPosition>>>,
}

#[derive(Clone, Debug)]
struct Known {
    ledger_id: String,
    system_id: String,
    timeline: i64,
}

impl Identity {
    pub(crate) fn new(seen: Arc<watch::Sender<Option<GlobalPosition>>>) -> Self {
        Self {
            known: Mutex::new(None),
            refused: Mutex::new(None),
            seen,
        }
    }

    /// The refusal in force: the last connection opened failed the check, none passed since.
    pub(crate) fn refusal(&self) -> Option<String> {
        crate::lock(&self.refused).clone()
    }

    /// Whether `found` is only behind the newest position seen, the one refusal that a renewed
    /// read may lift (see [`HEAD_REREADS`]).
    pub(crate) fn only_behind(&self, found: &Found, seen: i64) -> bool {
        found.head < seen
            && crate::lock(&self.known).as_ref().is_some_and(|held| {
                held.ledger_id == found.ledger_id
                    && held.system_id == found.system_id
                    && found
                        .timeline
                        .is_some_and(|timeline| timeline >= held.timeline)
            })
    }

    /// The newest position this store has seen committed. Taken before the identity is read:
    /// commits seen while the read is on its way may be newer than the read's snapshot.
    pub(crate) fn seen(&self) -> i64 {
        self.seen
            .borrow()
            .and_then(codec::position_to_sql)
            .unwrap_or(0)
    }

    /// Checks what `host` said against what this store holds to, `seen` being [`Self::seen`]
    /// taken before `found` was read; the first check (at start) learns the identity. Records
    /// the outcome: a refusal stays in force until a check passes.
    pub(crate) fn check(&self, host: &str, found: &Found, seen: i64) -> Result<(), String> {
        let verdict = self.judge(host, found, seen);
        let mut refused = crate::lock(&self.refused);
        match &verdict {
            Ok(()) => {
                if refused.take().is_some() {
                    tracing::warn!(
                        host,
                        "PostgreSQL holds this ledger's current copy again; writes resume"
                    );
                }
            }
            Err(reason) => {
                if refused.as_deref() != Some(reason.as_str()) {
                    tracing::error!(host, "{reason}");
                }
                *refused = Some(reason.clone());
            }
        }
        verdict
    }

    fn judge(&self, host: &str, found: &Found, seen: i64) -> Result<(), String> {
        let Some(timeline) = found.timeline else {
            return Err(format!(
                "PostgreSQL at {host} is a standby (in recovery), and opledger writes to the primary; name the primary first in the URL, or add target_session_attrs=read-write to it so that a standby is passed over"
            ));
        };
        let mut known = crate::lock(&self.known);
        let Some(held) = known.as_mut() else {
            *known = Some(Known {
                ledger_id: found.ledger_id.clone(),
                system_id: found.system_id.clone(),
                timeline,
            });
            return Ok(());
        };
        if found.ledger_id != held.ledger_id {
            return Err(format!(
                "PostgreSQL at {host} holds another ledger (id {}, this instance writes ledger {}); writes answer 503 until the URL leads to this ledger's database again, or restart opledger to serve the other ledger on purpose",
                found.ledger_id, held.ledger_id
            ));
        }
        if found.system_id != held.system_id {
            return Err(format!(
                "PostgreSQL at {host} is another cluster (system identifier {}, this instance's ledger is on {}), a copy restored or replicated elsewhere that may be behind; writes answer 503. If that cluster is now the ledger's home, restart opledger to take it on purpose; otherwise lead the URL back to the primary",
                found.system_id, held.system_id
            ));
        }
        if timeline < held.timeline {
            return Err(format!(
                "PostgreSQL at {host} is a former primary of this ledger (timeline {timeline}, the current primary writes on timeline {}): an older copy. Writes answer 503 until it is out of the way: stop it, or rebuild it as a standby of the current primary (pg_rewind or pg_basebackup), or take it out of the URL",
                held.timeline
            ));
        }
        if found.head < seen {
            return Err(format!(
                "PostgreSQL at {host} holds an older copy of this ledger: its log ends at position {}, and this instance has seen position {seen} committed. Writes answer 503 until the URL leads to the current primary: stop this server or take it out of the URL (a former primary must be rebuilt as a standby), and check that the copy with position {seen} is the one running",
                found.head
            ));
        }
        held.timeline = timeline;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(ledger: &str, system: &str, timeline: Option<i64>, head: i64) -> Found {
        Found {
            ledger_id: ledger.into(),
            system_id: system.into(),
            timeline,
            head,
        }
    }

    fn identity(seen: u64) -> Identity {
        let (sender, _) = watch::channel(Some(GlobalPosition::new(seen)));
        let sender = Arc::new(sender);
        let identity = Identity::new(sender);
        identity
            .check("a", &found("L", "S", Some(2), 0), 0)
            .expect("the first check learns the identity");
        identity
    }

    #[test]
    fn another_ledger_another_cluster_an_older_timeline_or_a_lower_head_are_refused() {
        let identity = identity(40);
        let refused = |found: Found| {
            identity
                .check("b:5432", &found, identity.seen())
                .expect_err("refused")
        };
        assert!(refused(found("M", "S", Some(2), 40)).contains("another ledger"));
        assert!(refused(found("L", "T", Some(2), 40)).contains("another cluster"));
        assert!(refused(found("L", "S", Some(1), 40)).contains("former primary"));
        assert!(refused(found("L", "S", Some(2), 39)).contains("older copy"));
        assert!(refused(found("L", "S", None, 40)).contains("standby"));
        assert!(identity
            .refusal()
            .is_some_and(|reason| reason.contains("standby")));
    }

    #[test]
    fn a_newer_timeline_with_the_whole_log_passes_and_clears_a_refusal() {
        let identity = identity(40);
        identity
            .check("b", &found("L", "S", Some(1), 40), 40)
            .expect_err("an older timeline");
        identity
            .check("c", &found("L", "S", Some(3), 41), 40)
            .expect("a promoted standby with everything seen");
        assert_eq!(identity.refusal(), None);
        identity
            .check("b", &found("L", "S", Some(2), 41), 41)
            .expect_err("the timeline before the promotion is now older");
    }
}
