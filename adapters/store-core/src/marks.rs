//! What a store remembers of its log beside the events, for `opledger verify`.

/// What a store remembers of its log beside the events: the highest position it ever handed out
/// and each stream's last version. Removing events with plain SQL leaves both behind, so they show
/// a removed tail that the events alone cannot (`opledger verify`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogMarks {
    /// The highest position the store ever handed out (`None`: never any).
    pub highest_position: Option<u64>,
    /// Streams whose recorded last version has no event (at most a thousand).
    pub streams_ahead: Vec<StreamAhead>,
}

/// A stream whose recorded last version has no event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamAhead {
    /// The stream's name.
    pub stream: String,
    /// The last version the store recorded for it.
    pub last_version: u64,
    /// The newest version it still has an event for (`None`: none left).
    pub newest_stored: Option<u64>,
}
