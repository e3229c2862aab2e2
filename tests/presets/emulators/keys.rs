//! The idempotency-key memory the keyed emulators (Stripe, Zendesk) share: which keys were used,
//! with which request, whether the first request still runs, and the answer saved for a replay.
//! Keys are per account, forgotten `retention_ms` after their first use.

use std::collections::BTreeMap;

use super::Reply;

/// What a request with a key meets.
#[derive(Debug)]
pub enum Claim {
    /// A new key: this request runs; [`Keys::save`] or [`Keys::release`] must follow.
    New,
    /// The first request with the key finished: its answer again.
    Replay(Reply),
    /// The first request with the key still runs.
    InFlight,
    /// The key was first used with another request.
    Mismatch,
}

#[derive(Debug)]
struct Entry {
    request: String,
    saved: Option<Reply>,
    first_ms: u64,
}

/// Keys by (account, key).
#[derive(Debug, Default)]
pub struct Keys(BTreeMap<(String, String), Entry>);

impl Keys {
    /// Claims `slot` for a request whose parameters read `request`, at `now_ms`.
    pub fn claim(
        &mut self,
        slot: &(String, String),
        request: &str,
        now_ms: u64,
        retention_ms: u64,
    ) -> Claim {
        self.0
            .retain(|_, entry| now_ms.saturating_sub(entry.first_ms) < retention_ms);
        match self.0.get(slot) {
            Some(entry) if entry.request != request => Claim::Mismatch,
            Some(Entry { saved: None, .. }) => Claim::InFlight,
            Some(Entry {
                saved: Some(reply), ..
            }) => Claim::Replay(reply.clone()),
            None => {
                let entry = Entry {
                    request: request.to_owned(),
                    saved: None,
                    first_ms: now_ms,
                };
                self.0.insert(slot.clone(), entry);
                Claim::New
            }
        }
    }

    /// Saves the answer a claimed key replays from now on.
    pub fn save(&mut self, slot: &(String, String), reply: &Reply) {
        if let Some(entry) = self.0.get_mut(slot) {
            entry.saved = Some(reply.clone());
        }
    }

    /// Forgets a claimed key whose request was not applied (nothing is saved for it).
    pub fn release(&mut self, slot: &(String, String)) {
        self.0.remove(slot);
    }
}
