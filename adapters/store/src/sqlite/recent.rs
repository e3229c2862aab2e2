//! The events this process's writer committed last, kept in memory for caught-up subscriptions.
//!
//! A subscription that follows the head (the read-model runner, an event stream) used to read
//! every group commit back from the file: a blocking task, a query and the pages of the WAL, at
//! about 700 commits a second under load. The writer already holds those events when it
//! commits, so it keeps the newest [`RECENT_EVENTS`] of them here and a subscription that is
//! within that window takes them from memory.
//!
//! What makes it safe is one invariant: the window holds *every* event of the log after
//! `after` up to its newest one, with no gap. The writer checks, inside each write transaction
//! and so under the file's write lock, that the log's last position is the window's newest; when
//! another process (a CLI beside the service) committed in between, the window restarts after
//! that position instead of spanning events it never saw. A read it cannot answer whole, one
//! from before the window or one that would come back empty (the other process may have
//! committed past the window), goes to the file as before.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use opledger_domain::ids::GlobalPosition;
use opledger_domain::store::{LogStart, RecordedEvent};

/// Most events kept: about 0.4 s of log at 10,000 events a second, and a few MiB of memory
/// (events are ~0.5 KiB each). A subscription further behind reads the file, as it always did.
pub(super) const RECENT_EVENTS: usize = 4_096;

/// The newest committed events, shared by the writer (which adds) and the subscriptions (which
/// read).
#[derive(Debug)]
pub(super) struct RecentEvents {
    window: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    /// Where the window starts: every event after it, up to the newest in `events`, is here.
    after: LogStart,
    /// In position order; at most [`RECENT_EVENTS`].
    events: VecDeque<RecordedEvent>,
}

impl Window {
    /// The position of the newest event the window accounts for (`None`: none, the log empty).
    fn newest(&self) -> Option<GlobalPosition> {
        match self.events.back() {
            Some(event) => Some(event.position),
            None => match self.after {
                LogStart::Beginning => None,
                LogStart::After(position) => Some(position),
            },
        }
    }
}

impl RecentEvents {
    /// An empty window that starts at the log's current head.
    pub(super) fn new(head: Option<GlobalPosition>) -> Self {
        Self {
            window: Mutex::new(Window {
                after: head.map_or(LogStart::Beginning, LogStart::After),
                events: VecDeque::new(),
            }),
        }
    }

    /// Adds what one commit wrote. `log_head_before` is the log's last position as read inside
    /// that commit's transaction, before its inserts: when it is not the window's newest,
    /// someone else wrote in between and the window starts again after it.
    pub(super) fn committed(
        &self,
        log_head_before: Option<GlobalPosition>,
        events: Vec<RecordedEvent>,
    ) {
        let mut window = self.lock();
        if window.newest() != log_head_before {
            window.after = log_head_before.map_or(LogStart::Beginning, LogStart::After);
            window.events.clear();
        }
        for event in events {
            debug_assert!(
                window.newest() < Some(event.position),
                "a commit's events come after everything before it"
            );
            window.events.push_back(event);
        }
        while window.events.len() > RECENT_EVENTS {
            if let Some(dropped) = window.events.pop_front() {
                window.after = LogStart::After(dropped.position);
            }
        }
    }

    /// Up to `max_count` events after `start`, if the window holds every event after `start`
    /// that it knows of and at least one of them; `None` sends the read to the file.
    pub(super) fn after(&self, start: LogStart, max_count: usize) -> Option<Vec<RecordedEvent>> {
        let window = self.lock();
        let covered = match (window.after, start) {
            (LogStart::Beginning, _) => true,
            (LogStart::After(_), LogStart::Beginning) => false,
            (LogStart::After(from), LogStart::After(start)) => start >= from,
        };
        if !covered {
            return None;
        }
        // Positions only grow, so the events after `start` are a suffix of the window.
        let first = window
            .events
            .partition_point(|event| !start.admits(event.position));
        let found: Vec<RecordedEvent> = window
            .events
            .range(first..)
            .take(max_count)
            .cloned()
            .collect();
        (!found.is_empty()).then_some(found)
    }

    fn lock(&self) -> MutexGuard<'_, Window> {
        // Every change leaves the window whole (a clear, then pushes in order), so a panic
        // elsewhere cannot leave it with a gap; a poisoned lock is still safe to use.
        self.window.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use opledger_domain::ids::{EventId, OperationId, StreamVersion};
    use opledger_domain::store::StreamName;

    use super::*;

    fn event(position: u64) -> RecordedEvent {
        RecordedEvent {
            stream: StreamName::for_operation(OperationId::from_uuid(uuid::Uuid::from_u128(1))),
            version: StreamVersion::new(position),
            position: GlobalPosition::new(position),
            event_id: EventId::from_uuid(uuid::Uuid::from_u128(u128::from(position))),
            event_type: "Test".into(),
            data: b"{}".to_vec(),
            metadata: b"{}".to_vec(),
        }
    }

    fn positions(events: Option<Vec<RecordedEvent>>) -> Option<Vec<u64>> {
        events.map(|events| events.iter().map(|e| e.position.value()).collect())
    }

    fn after(position: u64) -> LogStart {
        LogStart::After(GlobalPosition::new(position))
    }

    fn at(position: u64) -> Option<GlobalPosition> {
        Some(GlobalPosition::new(position))
    }

    #[test]
    fn a_subscription_inside_the_window_reads_what_the_writer_committed_from_memory() {
        let recent = RecentEvents::new(None);
        recent.committed(None, vec![event(1), event(2)]);
        recent.committed(at(2), vec![event(3)]);
        assert_eq!(
            positions(recent.after(LogStart::Beginning, 10)),
            Some(vec![1, 2, 3])
        );
        assert_eq!(positions(recent.after(after(1), 10)), Some(vec![2, 3]));
        assert_eq!(positions(recent.after(after(1), 1)), Some(vec![2]));
    }

    #[test]
    fn a_read_from_before_the_window_or_past_its_newest_goes_to_the_file() {
        let recent = RecentEvents::new(at(10));
        recent.committed(at(10), vec![event(11), event(12)]);
        assert_eq!(positions(recent.after(LogStart::Beginning, 10)), None);
        assert_eq!(positions(recent.after(after(9), 10)), None);
        assert_eq!(positions(recent.after(after(10), 10)), Some(vec![11, 12]));
        // Nothing newer in memory: another process may have committed since, so ask the file.
        assert_eq!(positions(recent.after(after(12), 10)), None);
    }

    #[test]
    fn a_commit_by_another_process_restarts_the_window_instead_of_leaving_a_gap() {
        let recent = RecentEvents::new(None);
        recent.committed(None, vec![event(1)]);
        // Events 2 and 3 were written by someone else; this writer found the log at 3.
        recent.committed(at(3), vec![event(4)]);
        assert_eq!(positions(recent.after(after(1), 10)), None);
        assert_eq!(positions(recent.after(after(3), 10)), Some(vec![4]));
    }

    #[test]
    fn the_window_keeps_the_newest_events_up_to_its_limit() {
        let recent = RecentEvents::new(None);
        let total = RECENT_EVENTS as u64 + 5;
        for position in 1..=total {
            recent.committed(
                at(position - 1).filter(|_| position > 1),
                vec![event(position)],
            );
        }
        assert_eq!(recent.lock().events.len(), RECENT_EVENTS);
        assert_eq!(positions(recent.after(after(4), 1)), None);
        assert_eq!(positions(recent.after(after(5), 1)), Some(vec![6]));
        assert_eq!(
            positions(recent.after(after(total - 1), 10)),
            Some(vec![total])
        );
    }
}
