//! Claims on review items: an operator says "I am working this one" so that two people do not
//! investigate and decide the same case. A claim has a lease and ends by itself when it runs out.
//!
//! Claims are coordination, not facts about the operation: they are kept in this server's memory,
//! never in the ledger's log (the log records the decision, with who made it, which is what an
//! auditor needs). So a claim is gone after a restart, and servers sharing one ledger do not see
//! each other's claims; the version check on every decision still refuses the second of two
//! decisions either way. What a claim must never do is stop a decision by the person holding it,
//! or outlive its lease.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Duration, Utc};
use opledger_domain::ids::OperationId;

/// The lease of a claim when the claimant names none: long enough to investigate one case.
pub const DEFAULT_CLAIM_LEASE_S: u64 = 15 * 60;
/// The longest lease a claim may ask for; renew (claim again) to keep it longer.
pub const MAX_CLAIM_LEASE_S: u64 = 60 * 60;
/// The most claims held at once; past it a new claim is refused until leases run out (the
/// expired ones are swept first). An incident of 10,000 items claimed one by one stays within it.
pub const MAX_CLAIMS: usize = 100_000;
const _: () = assert!(DEFAULT_CLAIM_LEASE_S <= MAX_CLAIM_LEASE_S);

/// Who holds an item and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The operator's name (as configured under `[[operators]]`).
    pub holder: String,
    /// When the claim ends by itself.
    pub expires_at: DateTime<Utc>,
}

/// Why a claim was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum ClaimRefused {
    /// Someone else holds it.
    Held(Claim),
    /// [`MAX_CLAIMS`] are held.
    Full,
}

/// The claims this server holds, by operation.
#[derive(Debug, Default)]
pub struct Claims {
    held: Mutex<HashMap<OperationId, Claim>>,
}

impl Claims {
    /// Claims `operation_id` for `holder` for `lease_s` seconds from `now`, or renews the
    /// holder's own claim; refused while someone else's claim runs.
    pub fn claim(
        &self,
        operation_id: OperationId,
        holder: &str,
        lease_s: u64,
        now: DateTime<Utc>,
    ) -> Result<Claim, ClaimRefused> {
        let mut held = self.lock();
        if let Some(current) = held.get(&operation_id) {
            if current.expires_at > now && current.holder != holder {
                return Err(ClaimRefused::Held(current.clone()));
            }
        }
        if held.len() >= MAX_CLAIMS && !held.contains_key(&operation_id) {
            held.retain(|_, claim| claim.expires_at > now);
            if held.len() >= MAX_CLAIMS {
                return Err(ClaimRefused::Full);
            }
        }
        let lease = Duration::seconds(i64::try_from(lease_s.min(MAX_CLAIM_LEASE_S)).unwrap_or(0));
        let claim = Claim {
            holder: holder.to_owned(),
            expires_at: now + lease,
        };
        held.insert(operation_id, claim.clone());
        Ok(claim)
    }

    /// Ends `holder`'s claim on `operation_id`; someone else's is refused (returned).
    pub fn release(
        &self,
        operation_id: OperationId,
        holder: &str,
        now: DateTime<Utc>,
    ) -> Result<(), Claim> {
        let mut held = self.lock();
        match held.get(&operation_id) {
            Some(current) if current.expires_at > now && current.holder != holder => {
                Err(current.clone())
            }
            _ => {
                held.remove(&operation_id);
                Ok(())
            }
        }
    }

    /// The running claim on `operation_id`, if any.
    pub fn of(&self, operation_id: OperationId, now: DateTime<Utc>) -> Option<Claim> {
        self.lock()
            .get(&operation_id)
            .filter(|claim| claim.expires_at > now)
            .cloned()
    }

    /// The running claim on `operation_id` held by someone other than `who`: what stops `who`
    /// from deciding it.
    pub fn held_by_other(
        &self,
        operation_id: OperationId,
        who: &str,
        now: DateTime<Utc>,
    ) -> Option<Claim> {
        self.of(operation_id, now)
            .filter(|claim| claim.holder != who)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<OperationId, Claim>> {
        // A panic while holding the lock leaves a map that is still whole (every change is one
        // insert or remove), so carry on with it.
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> OperationId {
        "0193a9a0-0000-7000-8000-000000000001"
            .parse()
            .expect("an operation id")
    }

    #[test]
    fn a_second_operator_is_refused_while_the_claim_runs_and_may_claim_once_it_expired() {
        let claims = Claims::default();
        let now = Utc::now();
        let first = claims.claim(id(), "anna", 60, now).expect("free");
        assert_eq!(
            claims.claim(id(), "boris", 60, now + Duration::seconds(59)),
            Err(ClaimRefused::Held(first.clone()))
        );
        assert_eq!(
            claims.held_by_other(id(), "boris", now),
            Some(first.clone())
        );
        assert_eq!(claims.held_by_other(id(), "anna", now), None);
        let later = now + Duration::seconds(60);
        assert_eq!(claims.of(id(), later), None, "expired by itself");
        assert!(claims.claim(id(), "boris", 60, later).is_ok());
    }

    #[test]
    fn the_holder_renews_and_releases_and_nobody_else_releases() {
        let claims = Claims::default();
        let now = Utc::now();
        claims.claim(id(), "anna", 60, now).expect("free");
        let renewed = claims
            .claim(id(), "anna", MAX_CLAIM_LEASE_S * 10, now)
            .expect("renewed");
        assert_eq!(
            renewed.expires_at,
            now + Duration::seconds(MAX_CLAIM_LEASE_S as i64),
            "a lease is capped"
        );
        assert!(claims.release(id(), "boris", now).is_err());
        assert!(claims.release(id(), "anna", now).is_ok());
        assert_eq!(claims.of(id(), now), None);
    }
}
