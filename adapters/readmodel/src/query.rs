//! The query API over the read models: what the `ops` command line, the review screen and the
//! incident tools ask.
//!
//! Every query is one read of committed data and returns at most [`MAX_QUERY_ROWS`] rows. Queries
//! return the projections' own types where one exists ([`OperationRow`], [`DetectedDuplicate`],
//! [`PossibleDuplicateIntent`]) so that a row means the same whether a fold produced it or a query
//! read it back. Nothing here writes.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use opledger_domain::args::ArgsHash;
use opledger_domain::ids::{
    AccountId, ActionName, ExternalObjectId, OperationId, ProviderId, SourceId, TenantId,
    MAX_TEXT_ID_BYTES,
};
use opledger_projections::duplicates::{DetectedDuplicate, PossibleDuplicateIntent};
use opledger_projections::id_index::ExternalIdRole;
use opledger_projections::metrics::Counter;
use opledger_projections::operations::{OperationRow, STATE_NAMES};
use opledger_projections::review_queue::{LookupEvidence, ReviewEvidence};
use rusqlite::types::{FromSql, ToSql};
use rusqlite::{params, OptionalExtension, Row};
use uuid::Uuid;

use super::sql::{self, corrupt};
use super::{apply, ReadModelError, ReadModelStore, MAX_QUERY_ROWS};

/// Which operations to list. Every condition set must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperationFilter {
    /// Only operations in this state (one of [`STATE_NAMES`]).
    pub state: Option<String>,
    /// Only this tenant's operations.
    pub tenant: Option<TenantId>,
    /// Only operations sent to this provider.
    pub provider: Option<ProviderId>,
    /// Only operations bound to this account (at any provider unless `provider` names one).
    pub account: Option<AccountId>,
    /// Only operations recorded before this time.
    pub older_than: Option<DateTime<Utc>>,
    /// Only operations recorded at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only operations of this action.
    pub action: Option<ActionName>,
    /// Only operations recorded from this delivery (a tool call's or a queue message's id).
    pub source_id: Option<SourceId>,
    /// Only operations for this owner (matched as `terms.rs` normalises it).
    pub owner: Option<String>,
    /// Only operations whose top-level argument (name, value) has this value (matched as
    /// `terms.rs` normalises it: whole, whatever its case and spacing).
    pub argument: Option<(String, String)>,
    /// The latest recorded first (else the earliest first).
    pub newest_first: bool,
}

impl OperationFilter {
    /// The search terms the filter asks for (`terms.rs`), if any.
    pub(crate) fn terms(&self) -> Vec<String> {
        let mut terms = Vec::new();
        if let Some(owner) = &self.owner {
            terms.push(crate::terms::owner_term(owner));
        }
        if let Some((name, value)) = &self.argument {
            terms.push(crate::terms::argument_term(name, value));
        }
        terms
    }
}

/// Where a page of operations ended; pass it back to get the next page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationCursor {
    /// When the last operation listed was recorded.
    pub created_at: DateTime<Utc>,
    /// The last operation listed.
    pub operation_id: OperationId,
}

/// One page of operations, oldest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationPage {
    /// The operations.
    pub operations: Vec<OperationRow>,
    /// Where the next page starts; `None` when this is the last.
    pub next: Option<OperationCursor>,
}

/// An operation in the review queue, with the evidence gathered so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReviewItem {
    /// The operation.
    pub operation_id: OperationId,
    /// `unknown` or `needs_review`.
    pub state: &'static str,
    /// When it became unresolved.
    pub since: DateTime<Utc>,
    /// Whose it is.
    pub tenant: TenantId,
    /// Where it was sent.
    pub provider: ProviderId,
    /// The account it is bound to.
    pub account: AccountId,
    /// Attempts started so far.
    pub attempts: u32,
    /// Lookups made since it last became unknown.
    pub lookups: u32,
    /// The latest error or refusal.
    pub last_error: Option<String>,
    /// The latest lookup while it has been unresolved.
    pub last_lookup: Option<LookupEvidence>,
    /// Why automation handed it over, once it did.
    pub review: Option<ReviewEvidence>,
    /// When its latest event happened.
    pub updated_at: DateTime<Utc>,
}

/// One external object named by more than one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedExternalId {
    /// The provider it lives at.
    pub provider: ProviderId,
    /// The account it lives in.
    pub account: AccountId,
    /// The object's id.
    pub external_id: ExternalObjectId,
    /// The operations naming it and how, in the order they named it.
    pub operations: Vec<(OperationId, ExternalIdRole)>,
}

/// Everything that suggests one request became two objects; each list newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DuplicatesReport {
    /// `DuplicateDetected` facts.
    pub detected: Vec<DetectedDuplicate>,
    /// External objects named by more than one operation.
    pub shared_external_ids: Vec<SharedExternalId>,
    /// Pairs of identical intents from different deliveries, flagged for a person.
    pub possible_intents: Vec<PossibleDuplicateIntent>,
}

/// Attempts per operation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttemptStats {
    /// Operations counted.
    pub operations: u64,
    /// Attempts over all of them.
    pub sum: u64,
    /// (attempts, how many operations took that many), by attempts; at most one row per
    /// possible attempt count, so bounded by the domain's attempt limit.
    pub histogram: Vec<(u32, u64)>,
}

/// The operation that has been unresolved the longest in one state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OldestUnresolved {
    /// The operation.
    pub operation_id: OperationId,
    /// Since when.
    pub since: DateTime<Utc>,
}

/// What [`ReadModelStore::scope_numbers`] finds for a tenant (or every tenant).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScopeNumbers {
    /// The unknown operation that has waited longest, if any.
    pub oldest_unknown: Option<OldestUnresolved>,
    /// Duplicate objects detected for the scope's operations.
    pub duplicates_detected: u64,
}

/// What an operator watches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Operations per state; every state is present, with zero if none.
    pub by_state: BTreeMap<&'static str, u64>,
    /// The counters of recorded facts; every counter is present.
    pub counters: BTreeMap<Counter, u64>,
    /// Attempts per operation.
    pub attempts: AttemptStats,
    /// Pairs of intents flagged as possible duplicates.
    pub possible_duplicate_intents: u64,
    /// External objects named by more than one operation.
    pub shared_external_ids: u64,
    /// The operation unknown the longest.
    pub oldest_unknown: Option<OldestUnresolved>,
    /// The operation waiting for a person the longest.
    pub oldest_needs_review: Option<OldestUnresolved>,
}

impl Metrics {
    /// One counter's value.
    pub fn counter(&self, counter: Counter) -> u64 {
        self.counters.get(&counter).copied().unwrap_or(0)
    }
}

/// What a listing shows of an operation beside its row, from its intent: whose it is and the
/// values of the arguments a person chose as columns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Shown {
    /// The owner recorded with the intent.
    pub owner: Option<String>,
    /// The chosen top-level arguments the intent has, by name (missing ones left out).
    pub args: serde_json::Map<String, serde_json::Value>,
}

const OPERATION_COLUMNS: &str = "operation_id, tenant, provider, account, action, args_hash,
    source_id, state, attempts, external_id, last_error, created_at, updated_at, stream_version,
    last_position, lease_deadline, unknown_since, needs_review_reason";

pub(super) const REVIEW_COLUMNS: &str =
    "operation_id, state, since, tenant, provider, account, attempts,
    lookups, last_error, last_lookup_result, last_lookup_evidence, last_lookup_at, review_reason,
    review_evidence, updated_at";

impl ReadModelStore {
    /// One operation, if the read models have seen it.
    pub fn operation(
        &self,
        operation_id: OperationId,
    ) -> Result<Option<OperationRow>, ReadModelError> {
        let raw = self
            .connection
            .query_row(
                &format!("SELECT {OPERATION_COLUMNS} FROM operations WHERE operation_id = ?1"),
                [operation_id.to_string()],
                RawOperation::from_row,
            )
            .optional()
            .map_err(|error| ReadModelError::sqlite("reading an operation", error))?;
        raw.map(RawOperation::decode).transpose()
    }

    /// The owner and the arguments `names` of each of `ids` (at most [`MAX_QUERY_ROWS`] of them),
    /// from their stored states: one read by key each, so a page costs its own rows. An
    /// operation the read models have not seen is left out.
    pub fn shown(
        &self,
        ids: &[OperationId],
        names: &[String],
    ) -> Result<std::collections::HashMap<OperationId, Shown>, ReadModelError> {
        let mut statement = self
            .connection
            .prepare_cached("SELECT folded_state FROM operations WHERE operation_id = ?1")
            .map_err(|error| ReadModelError::sqlite("preparing to read stored states", error))?;
        let mut shown = std::collections::HashMap::with_capacity(ids.len());
        for operation_id in ids.iter().take(MAX_QUERY_ROWS) {
            let bytes: Option<Vec<u8>> = statement
                .query_row([operation_id.to_string()], |row| row.get(0))
                .optional()
                .map_err(|error| ReadModelError::sqlite("reading a stored state", error))?;
            let Some(bytes) = bytes else { continue };
            let state = super::state_codec::decode(&bytes).map_err(|error| {
                corrupt(format!(
                    "the stored state of operation {operation_id} cannot be read: {error}"
                ))
            })?;
            let Some(intent) = state.intent.as_ref() else {
                continue;
            };
            let values = intent.args.as_map();
            shown.insert(
                *operation_id,
                Shown {
                    owner: intent.owner.as_ref().map(|owner| owner.as_str().to_owned()),
                    args: names
                        .iter()
                        .filter_map(|name| {
                            values.get(name).map(|value| (name.clone(), value.clone()))
                        })
                        .collect(),
                },
            );
        }
        Ok(shown)
    }

    /// Up to `limit` (at most [`MAX_QUERY_ROWS`]) operations matching `filter`, oldest first
    /// (newest first if it says so), starting after `after`.
    pub fn list_operations(
        &self,
        filter: &OperationFilter,
        limit: usize,
        after: Option<&OperationCursor>,
    ) -> Result<OperationPage, ReadModelError> {
        let limit = limit.min(MAX_QUERY_ROWS);
        let query = Self::listing_query(filter, after, limit)?;
        let (query, conditions) = (query.0, query.1);
        let operations = self.listed_operations(&query, &conditions.values)?;
        Ok(page_of(operations, limit))
    }

    /// The statement listing a page of `filter`'s operations after `after`, with its values.
    ///
    /// A search (an owner or an argument's value) is driven by the terms' index: the first term's
    /// rows are read in the listing's order (its cursor compared on the index's own columns) and
    /// each is joined to its operation by key, so the statement reads the matching rows up to the
    /// page's end and never scans the operations. `CROSS JOIN` keeps SQLite from choosing the
    /// other order.
    fn listing_query(
        filter: &OperationFilter,
        after: Option<&OperationCursor>,
        limit: usize,
    ) -> Result<(String, Conditions), ReadModelError> {
        let terms = filter.terms();
        let order = if terms.is_empty() {
            ("created_at", "operation_id")
        } else {
            ("operation_terms.at", "operation_terms.operation")
        };
        let mut conditions = Conditions::of(filter, after, order)?;
        let mut from = "operations".to_owned();
        if let Some((first, rest)) = terms.split_first() {
            let term = conditions.bind(Box::new(first.clone()));
            from = "operation_terms CROSS JOIN operations
                 ON operations.operation_id = operation_terms.operation"
                .to_owned();
            conditions
                .texts
                .insert(0, format!("operation_terms.term = ?{term}"));
            for other in rest {
                let other = conditions.bind(Box::new(other.clone()));
                conditions.texts.push(format!(
                    "operations.operation_id IN (SELECT operation FROM operation_terms WHERE term = ?{other})"
                ));
            }
        }
        // One more than asked tells whether another page follows.
        let fetch = conditions.bind(Box::new(i64::try_from(limit + 1).unwrap_or(i64::MAX)));
        let direction = if filter.newest_first { " DESC" } else { "" };
        let query = format!(
            "SELECT {OPERATION_COLUMNS} FROM {from} {}
             ORDER BY {}{direction}, {}{direction} LIMIT ?{fetch}",
            conditions.where_clause(),
            order.0,
            order.1
        );
        Ok((query, conditions))
    }

    /// How SQLite answers a listing of `filter`'s first page: the lines of `EXPLAIN QUERY PLAN`,
    /// for tests and benchmarks that check a search reads through an index.
    pub fn listing_plan(
        &self,
        filter: &OperationFilter,
        limit: usize,
    ) -> Result<Vec<String>, ReadModelError> {
        let (query, conditions) = Self::listing_query(filter, None, limit.min(MAX_QUERY_ROWS))?;
        let mut statement = self
            .connection
            .prepare(&format!("EXPLAIN QUERY PLAN {query}"))
            .map_err(|error| ReadModelError::sqlite("preparing a query plan", error))?;
        let parameters: Vec<&dyn ToSql> = conditions
            .values
            .iter()
            .map(|value| value.as_ref())
            .collect();
        let lines = statement
            .query_map(parameters.as_slice(), |row| row.get::<_, String>(3))
            .map_err(|error| ReadModelError::sqlite("reading a query plan", error))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| ReadModelError::sqlite("reading a query plan", error))?;
        Ok(lines)
    }

    /// The operations `query` selects, with `values` bound to its numbered placeholders.
    fn listed_operations(
        &self,
        query: &str,
        values: &[Box<dyn ToSql>],
    ) -> Result<Vec<OperationRow>, ReadModelError> {
        let mut statement = self
            .connection
            .prepare(query)
            .map_err(|error| ReadModelError::sqlite("preparing to list operations", error))?;
        let parameters: Vec<&dyn ToSql> = values.iter().map(|value| value.as_ref()).collect();
        let raw = statement
            .query_map(parameters.as_slice(), RawOperation::from_row)
            .map_err(|error| ReadModelError::sqlite("listing operations", error))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| ReadModelError::sqlite("reading listed operations", error))?;
        raw.into_iter()
            .map(RawOperation::decode)
            .collect::<Result<Vec<_>, _>>()
    }

    /// Up to `limit` (at most [`MAX_QUERY_ROWS`]) unresolved operations, the longest-waiting
    /// first.
    pub fn review_queue(&self, limit: usize) -> Result<Vec<ReviewItem>, ReadModelError> {
        self.review_rows(None, limit)
    }

    /// [`Self::review_queue`] restricted to `tenants` (an operator's scope), the longest-waiting
    /// first; an empty scope lists nothing.
    pub fn review_queue_of(
        &self,
        tenants: &[TenantId],
        limit: usize,
    ) -> Result<Vec<ReviewItem>, ReadModelError> {
        self.review_rows(Some(tenants), limit)
    }

    fn review_rows(
        &self,
        tenants: Option<&[TenantId]>,
        limit: usize,
    ) -> Result<Vec<ReviewItem>, ReadModelError> {
        // The age index gives the order either way; a scope filters as the scan goes, bound as
        // one JSON array so the statement stays cached whatever the number of tenants.
        let (query, scope) = match tenants {
            None => (
                format!(
                    "SELECT {REVIEW_COLUMNS} FROM review_queue ORDER BY since, operation_id LIMIT ?1"
                ),
                None,
            ),
            Some(tenants) => (
                format!(
                    "SELECT {REVIEW_COLUMNS} FROM review_queue
                     WHERE tenant IN (SELECT value FROM json_each(?2))
                     ORDER BY since, operation_id LIMIT ?1"
                ),
                Some(tenant_array(tenants)?),
            ),
        };
        let mut statement = self
            .connection
            .prepare_cached(&query)
            .map_err(|error| ReadModelError::sqlite("preparing to read the review queue", error))?;
        let rows = match &scope {
            None => statement.query_map(params![row_limit(limit)], RawReview::from_row),
            Some(scope) => {
                statement.query_map(params![row_limit(limit), scope], RawReview::from_row)
            }
        };
        let raw = rows
            .map_err(|error| ReadModelError::sqlite("reading the review queue", error))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| ReadModelError::sqlite("reading the review queue", error))?;
        raw.into_iter().map(RawReview::decode).collect()
    }

    /// Up to `limit` (at most [`MAX_QUERY_ROWS`]) of each kind of duplicate, newest first.
    pub fn duplicates(&self, limit: usize) -> Result<DuplicatesReport, ReadModelError> {
        Ok(DuplicatesReport {
            detected: self.detected_duplicates(None, limit)?,
            shared_external_ids: self.shared_external_ids(None, limit)?,
            possible_intents: self.possible_duplicate_intents(None, limit)?,
        })
    }

    /// The duplicates that concern one operation, however old: the same report as
    /// [`Self::duplicates`], filtered in SQL rather than from the newest rows of the whole ledger.
    pub fn duplicates_of(
        &self,
        operation_id: OperationId,
        limit: usize,
    ) -> Result<DuplicatesReport, ReadModelError> {
        let operation = operation_id.to_string();
        let operation = Some(operation.as_str());
        Ok(DuplicatesReport {
            detected: self.detected_duplicates(operation, limit)?,
            shared_external_ids: self.shared_external_ids(operation, limit)?,
            possible_intents: self.possible_duplicate_intents(operation, limit)?,
        })
    }

    /// The operation an id leads to: an operation id, an attempt id, an external object id or a
    /// source (delivery) id, tried in that order. An external id named by several operations
    /// leads to the one confirmed with it (else the first to name it); a source id used by
    /// several tenants leads to the first recorded. `None` when nothing matches.
    pub fn trace(&self, id: &str) -> Result<Option<OperationId>, ReadModelError> {
        let id = id.trim();
        if id.is_empty() || id.len() > MAX_TEXT_ID_BYTES {
            return Ok(None);
        }
        // Ids are stored in their canonical (lowercase, hyphenated) form; accept any UUID form.
        if let Ok(uuid) = Uuid::parse_str(id) {
            let canonical = uuid.hyphenated().to_string();
            for query in [
                "SELECT operation_id FROM operations WHERE operation_id = ?1",
                "SELECT operation_id FROM attempts WHERE attempt_id = ?1
                 ORDER BY position LIMIT 1",
            ] {
                if let Some(found) = self.first_operation(query, &canonical)? {
                    return Ok(Some(found));
                }
            }
        }
        for query in [
            "SELECT operation_id FROM external_ids WHERE external_id = ?1
             ORDER BY role = 'confirmed' DESC, position LIMIT 1",
            "SELECT operation_id FROM sources WHERE source_id = ?1 ORDER BY position LIMIT 1",
        ] {
            if let Some(found) = self.first_operation(query, id)? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Every operation `id` may name, up to `limit`, the best match first (the order of
    /// [`Self::trace`]). An external id can name objects of several accounts or providers, and a
    /// source id is unique only within a tenant, so an incident reviewer must see them all rather
    /// than one picked silently.
    pub fn trace_candidates(
        &self,
        id: &str,
        limit: usize,
    ) -> Result<Vec<OperationId>, ReadModelError> {
        self.trace_rows(id, None, limit)
    }

    /// [`Self::trace_candidates`] restricted to `tenants` (a caller's scope); an empty scope finds
    /// nothing. The scope is applied in SQL before the limit: a short external id (`731`) or a
    /// source id repeats across tenants, and other tenants' matches must not crowd out the
    /// caller's own however many there are.
    pub fn trace_candidates_of(
        &self,
        id: &str,
        tenants: &[TenantId],
        limit: usize,
    ) -> Result<Vec<OperationId>, ReadModelError> {
        self.trace_rows(id, Some(tenants), limit)
    }

    fn trace_rows(
        &self,
        id: &str,
        tenants: Option<&[TenantId]>,
        limit: usize,
    ) -> Result<Vec<OperationId>, ReadModelError> {
        let id = id.trim();
        let limit = row_limit(limit);
        let mut found: Vec<OperationId> = Vec::new();
        if id.is_empty() || id.len() > MAX_TEXT_ID_BYTES {
            return Ok(found);
        }
        // NULL when unscoped; else one JSON array, so each statement stays cached whatever the
        // number of tenants (as in the review queue).
        let scope = tenants.map(tenant_array).transpose()?;
        let canonical = Uuid::parse_str(id)
            .map(|uuid| uuid.hyphenated().to_string())
            .ok();
        let mut queries: Vec<(&str, &str)> = Vec::new();
        if let Some(canonical) = canonical.as_deref() {
            queries.push((TRACE_BY_OPERATION_ID, canonical));
            queries.push((TRACE_BY_ATTEMPT_ID, canonical));
        }
        queries.push((TRACE_BY_EXTERNAL_ID, id));
        queries.push((TRACE_BY_SOURCE_ID, id));
        for (query, value) in queries {
            let mut statement = self
                .connection
                .prepare_cached(query)
                .map_err(|error| ReadModelError::sqlite("preparing to trace an id", error))?;
            let rows = statement
                .query_map(params![value, limit, scope], |row| row.get::<_, String>(0))
                .map_err(|error| ReadModelError::sqlite("tracing an id", error))?;
            for row in rows {
                let raw = row.map_err(|error| ReadModelError::sqlite("tracing an id", error))?;
                let operation = sql::operation_from(&raw)?;
                if !found.contains(&operation) {
                    found.push(operation);
                }
                if found.len() as i64 >= limit {
                    return Ok(found);
                }
            }
        }
        Ok(found)
    }

    /// Operations per state, every state present (zero if none), of one tenant or of all: one
    /// grouped count over the tenant's operations, where a client listing each state read up to
    /// a page of rows per state.
    pub fn count_by_state(
        &self,
        tenant: Option<&TenantId>,
    ) -> Result<BTreeMap<&'static str, u64>, ReadModelError> {
        let mut by_state: BTreeMap<&'static str, u64> =
            STATE_NAMES.iter().map(|name| (*name, 0)).collect();
        let counted = match tenant {
            // The gauges every batch keeps: a few rows, whatever the number of operations.
            None => self
                .counts::<String>("SELECT name, value FROM gauges")?
                .into_iter()
                .filter_map(|(gauge, value)| {
                    gauge
                        .strip_prefix(apply::IN_STATE_GAUGE)
                        .map(|state| (state.to_owned(), value))
                })
                .collect::<Vec<_>>(),
            Some(tenant) => {
                let mut statement = self
                    .connection
                    .prepare_cached(
                        "SELECT state, COUNT(*) FROM operations WHERE tenant = ?1 GROUP BY state",
                    )
                    .map_err(|error| ReadModelError::sqlite("preparing a count", error))?;
                let raw = statement
                    .query_map(params![tenant.as_str()], |row| {
                        Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
                    })
                    .map_err(|error| ReadModelError::sqlite("counting by state", error))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|error| ReadModelError::sqlite("counting by state", error))?;
                raw.into_iter()
                    .map(|(state, count)| Ok((state, sql::count_from(count)?)))
                    .collect::<Result<Vec<_>, ReadModelError>>()?
            }
        };
        for (state, value) in counted {
            by_state.insert(state_name(&state)?, value);
        }
        Ok(by_state)
    }

    /// The oldest unknown operation and the duplicates detected, for one tenant or (`None`)
    /// every tenant: what an overview scoped to a token shows beside the counts by state. Both
    /// read small tables (the review queue, the duplicate detections), not the operations.
    pub fn scope_numbers(&self, tenant: Option<&TenantId>) -> Result<ScopeNumbers, ReadModelError> {
        let tenant = tenant.map(TenantId::as_str);
        let oldest: Option<(String, String)> = self
            .connection
            .prepare_cached(
                "SELECT operation_id, since FROM review_queue
                 WHERE state = 'unknown' AND (?1 IS NULL OR tenant = ?1)
                 ORDER BY since, operation_id LIMIT 1",
            )
            .and_then(|mut statement| {
                statement
                    .query_row(params![tenant], |row| Ok((row.get(0)?, row.get(1)?)))
                    .optional()
            })
            .map_err(|error| ReadModelError::sqlite("finding a tenant's oldest unknown", error))?;
        let oldest_unknown = oldest
            .map(|(operation, since)| {
                Ok::<_, ReadModelError>(OldestUnresolved {
                    operation_id: sql::operation_from(&operation)?,
                    since: sql::time_from(&since)?,
                })
            })
            .transpose()?;
        let duplicates: i64 = self
            .connection
            .prepare_cached(
                "SELECT COUNT(*) FROM duplicate_detections AS d
                 JOIN operations AS o ON o.operation_id = d.operation_id
                 WHERE ?1 IS NULL OR o.tenant = ?1",
            )
            .and_then(|mut statement| statement.query_row(params![tenant], |row| row.get(0)))
            .map_err(|error| ReadModelError::sqlite("counting a tenant's duplicates", error))?;
        Ok(ScopeNumbers {
            oldest_unknown,
            duplicates_detected: sql::count_from(duplicates)?,
        })
    }

    /// Counts by state, counters, attempts per operation, duplicates and the oldest unresolved
    /// operations.
    pub fn metrics(&self) -> Result<Metrics, ReadModelError> {
        let mut metrics = Metrics {
            by_state: STATE_NAMES.iter().map(|name| (*name, 0)).collect(),
            counters: Counter::ALL.iter().map(|counter| (*counter, 0)).collect(),
            ..Metrics::default()
        };
        // The gauges, kept current by every batch: a few rows, whatever the number of
        // operations (counting them here scanned every operation).
        for (gauge, value) in self.counts::<String>("SELECT name, value FROM gauges")? {
            if let Some(state) = gauge.strip_prefix(apply::IN_STATE_GAUGE) {
                metrics.by_state.insert(state_name(state)?, value);
            } else if let Some(attempts) = gauge.strip_prefix(apply::WITH_ATTEMPTS_GAUGE) {
                let attempts: u32 = attempts
                    .parse()
                    .map_err(|_| sql::corrupt(format!("gauge `{gauge}` names no attempt count")))?;
                metrics.attempts.operations += value;
                metrics.attempts.sum += u64::from(attempts) * value;
                metrics.attempts.histogram.push((attempts, value));
            } else if gauge == apply::SHARED_EXTERNAL_IDS_GAUGE {
                metrics.shared_external_ids = value;
            }
            // Any other gauge is one a newer build wrote; left out, as counters are.
        }
        for (name, value) in self.counts::<String>("SELECT name, value FROM counters")? {
            // A counter this build does not know is one a newer build wrote; it is left out
            // rather than failing the whole report.
            if let Some(counter) = Counter::ALL.iter().find(|c| c.name() == name) {
                metrics.counters.insert(*counter, value);
            }
        }
        metrics.attempts.histogram.sort_unstable();
        metrics.possible_duplicate_intents =
            self.count("SELECT count(*) FROM possible_duplicate_intents")?;
        metrics.oldest_unknown = self.oldest_in("unknown")?;
        metrics.oldest_needs_review = self.oldest_in("needs_review")?;
        Ok(metrics)
    }

    fn first_operation(
        &self,
        query: &str,
        id: &str,
    ) -> Result<Option<OperationId>, ReadModelError> {
        let found: Option<String> = self
            .connection
            .query_row(query, [id], |row| row.get(0))
            .optional()
            .map_err(|error| ReadModelError::sqlite("tracing an id", error))?;
        found.as_deref().map(sql::operation_from).transpose()
    }

    fn detected_duplicates(
        &self,
        operation: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DetectedDuplicate>, ReadModelError> {
        let mut statement = self
            .connection
            .prepare_cached(
                "SELECT position, operation_id, provider, account, confirmed_external_id,
                     duplicate_external_id, found_by, at
                 FROM duplicate_detections WHERE ?2 IS NULL OR operation_id = ?2
                 ORDER BY position DESC LIMIT ?1",
            )
            .map_err(|error| ReadModelError::sqlite("preparing to read duplicates", error))?;
        let raw = statement
            .query_map(params![row_limit(limit), operation], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, String>(3)?,
                    row.get::<_, String>(4)?,
                    row.get::<_, String>(5)?,
                    row.get::<_, String>(6)?,
                    row.get::<_, String>(7)?,
                ))
            })
            .map_err(|error| ReadModelError::sqlite("reading duplicates", error))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| ReadModelError::sqlite("reading duplicates", error))?;
        raw.into_iter()
            .map(
                |(position, operation, provider, account, confirmed, duplicate, found_by, at)| {
                    Ok(DetectedDuplicate {
                        position: sql::position_from(position)?,
                        operation_id: sql::operation_from(&operation)?,
                        provider: sql::id_from(provider, ProviderId::new)?,
                        account: sql::id_from(account, AccountId::new)?,
                        confirmed_external_id: sql::id_from(confirmed, ExternalObjectId::new)?,
                        duplicate_external_id: sql::id_from(duplicate, ExternalObjectId::new)?,
                        found_by,
                        at: sql::time_from(&at)?,
                    })
                },
            )
            .collect()
    }

    fn shared_external_ids(
        &self,
        operation: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SharedExternalId>, ReadModelError> {
        let mut groups = self
            .connection
            .prepare_cached(
                "SELECT provider, account, external_id FROM external_ids
                 WHERE ?2 IS NULL OR (provider, account, external_id) IN
                     (SELECT provider, account, external_id FROM external_ids WHERE operation_id = ?2)
                 GROUP BY provider, account, external_id HAVING count(*) > 1
                 ORDER BY max(position) DESC LIMIT ?1",
            )
            .map_err(|error| ReadModelError::sqlite("preparing to read shared ids", error))?;
        let keys = groups
            .query_map(params![row_limit(limit), operation], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                ))
            })
            .map_err(|error| ReadModelError::sqlite("reading shared ids", error))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| ReadModelError::sqlite("reading shared ids", error))?;
        let mut members = self
            .connection
            .prepare_cached(
                "SELECT operation_id, role FROM external_ids
                 WHERE provider = ?1 AND account = ?2 AND external_id = ?3
                 ORDER BY position, operation_id LIMIT ?4",
            )
            .map_err(|error| ReadModelError::sqlite("preparing to read shared ids", error))?;
        let mut shared = Vec::with_capacity(keys.len());
        for (provider, account, external_id) in keys {
            let rows = members
                .query_map(
                    params![
                        provider,
                        account,
                        external_id,
                        row_limit(MAX_OPERATIONS_PER_SHARED_ID)
                    ],
                    |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)),
                )
                .map_err(|error| ReadModelError::sqlite("reading shared ids", error))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|error| ReadModelError::sqlite("reading shared ids", error))?;
            let operations = rows
                .into_iter()
                .map(|(operation, role)| Ok((sql::operation_from(&operation)?, role_from(&role)?)))
                .collect::<Result<Vec<_>, ReadModelError>>()?;
            shared.push(SharedExternalId {
                provider: sql::id_from(provider, ProviderId::new)?,
                account: sql::id_from(account, AccountId::new)?,
                external_id: sql::id_from(external_id, ExternalObjectId::new)?,
                operations,
            });
        }
        Ok(shared)
    }

    fn possible_duplicate_intents(
        &self,
        operation: Option<&str>,
        limit: usize,
    ) -> Result<Vec<PossibleDuplicateIntent>, ReadModelError> {
        let mut statement = self
            .connection
            .prepare_cached(
                "SELECT operation_id, earlier_operation_id, tenant, provider, account, action,
                     args_hash, source_id, earlier_source_id, gap_ms, at, position
                 FROM possible_duplicate_intents
                 WHERE ?2 IS NULL OR operation_id = ?2 OR earlier_operation_id = ?2
                 ORDER BY position DESC, earlier_operation_id LIMIT ?1",
            )
            .map_err(|error| ReadModelError::sqlite("preparing to read flagged intents", error))?;
        let raw = statement
            .query_map(
                params![row_limit(limit), operation],
                RawPossibleIntent::from_row,
            )
            .map_err(|error| ReadModelError::sqlite("reading flagged intents", error))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| ReadModelError::sqlite("reading flagged intents", error))?;
        raw.into_iter().map(RawPossibleIntent::decode).collect()
    }

    fn counts<K: FromSql>(&self, query: &str) -> Result<Vec<(K, u64)>, ReadModelError> {
        let mut statement = self
            .connection
            .prepare_cached(query)
            .map_err(|error| ReadModelError::sqlite("preparing a count", error))?;
        let raw = statement
            .query_map([], |row| Ok((row.get::<_, K>(0)?, row.get::<_, i64>(1)?)))
            .map_err(|error| ReadModelError::sqlite("counting", error))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| ReadModelError::sqlite("counting", error))?;
        raw.into_iter()
            .map(|(key, count)| Ok((key, sql::count_from(count)?)))
            .collect()
    }

    fn count(&self, query: &str) -> Result<u64, ReadModelError> {
        let count: i64 = self
            .connection
            .query_row(query, [], |row| row.get(0))
            .map_err(|error| ReadModelError::sqlite("counting", error))?;
        sql::count_from(count)
    }

    fn oldest_in(&self, state: &str) -> Result<Option<OldestUnresolved>, ReadModelError> {
        let found: Option<(String, String)> = self
            .connection
            .query_row(
                "SELECT operation_id, since FROM review_queue WHERE state = ?1
                 ORDER BY since, operation_id LIMIT 1",
                [state],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
            .map_err(|error| ReadModelError::sqlite("finding the oldest unresolved", error))?;
        found
            .map(|(operation, since)| {
                Ok(OldestUnresolved {
                    operation_id: sql::operation_from(&operation)?,
                    since: sql::time_from(&since)?,
                })
            })
            .transpose()
    }
}

/// The id-index lookups of a trace, best link first: `?1` the id, `?2` the limit, `?3` the
/// caller's tenants as a JSON array or NULL for every tenant. The tenant condition sits in the
/// statement, before the limit, so it cannot be starved by other tenants' rows. The joins are
/// LEFT so that an unscoped trace finds what the index holds even without its operation row.
const TRACE_BY_OPERATION_ID: &str = "SELECT operation_id FROM operations
     WHERE operation_id = ?1 AND (?3 IS NULL OR tenant IN (SELECT value FROM json_each(?3)))
     LIMIT ?2";
const TRACE_BY_ATTEMPT_ID: &str = "SELECT a.operation_id FROM attempts a
     LEFT JOIN operations o ON o.operation_id = a.operation_id
     WHERE a.attempt_id = ?1 AND (?3 IS NULL OR o.tenant IN (SELECT value FROM json_each(?3)))
     ORDER BY a.position LIMIT ?2";
const TRACE_BY_EXTERNAL_ID: &str = "SELECT e.operation_id FROM external_ids e
     LEFT JOIN operations o ON o.operation_id = e.operation_id
     WHERE e.external_id = ?1 AND (?3 IS NULL OR o.tenant IN (SELECT value FROM json_each(?3)))
     ORDER BY e.role = 'confirmed' DESC, e.position LIMIT ?2";
const TRACE_BY_SOURCE_ID: &str = "SELECT operation_id FROM sources
     WHERE source_id = ?1 AND (?3 IS NULL OR tenant IN (SELECT value FROM json_each(?3)))
     ORDER BY position LIMIT ?2";

/// The conditions of an operation listing and the values bound to their placeholders.
struct Conditions {
    texts: Vec<String>,
    values: Vec<Box<dyn ToSql>>,
}

impl Conditions {
    /// The conditions `filter` and the cursor `after` set; an unknown state is refused.
    fn of(
        filter: &OperationFilter,
        after: Option<&OperationCursor>,
        order: (&str, &str),
    ) -> Result<Self, ReadModelError> {
        let mut conditions = Self {
            texts: Vec::new(),
            values: Vec::new(),
        };
        if let Some(state) = &filter.state {
            if !STATE_NAMES.contains(&state.as_str()) {
                return Err(ReadModelError::InvalidQuery {
                    reason: format!(
                        "`{state}` is not a state; use one of {}",
                        STATE_NAMES.join(", ")
                    ),
                });
            }
            let state = conditions.bind(Box::new(state.clone()));
            conditions.texts.push(format!("state = ?{state}"));
        }
        if let Some(tenant) = &filter.tenant {
            let tenant = conditions.bind(Box::new(tenant.as_str().to_owned()));
            conditions.texts.push(format!("tenant = ?{tenant}"));
        }
        if let Some(provider) = &filter.provider {
            let provider = conditions.bind(Box::new(provider.as_str().to_owned()));
            conditions.texts.push(format!("provider = ?{provider}"));
        }
        if let Some(account) = &filter.account {
            let account = conditions.bind(Box::new(account.as_str().to_owned()));
            conditions.texts.push(format!("account = ?{account}"));
        }
        if let Some(older_than) = filter.older_than {
            let older_than = conditions.bind(Box::new(sql::time(older_than)));
            conditions.texts.push(format!("created_at < ?{older_than}"));
        }
        if let Some(since) = filter.since {
            let since = conditions.bind(Box::new(sql::time(since)));
            conditions.texts.push(format!("created_at >= ?{since}"));
        }
        if let Some(action) = &filter.action {
            let action = conditions.bind(Box::new(action.as_str().to_owned()));
            conditions.texts.push(format!("action = ?{action}"));
        }
        if let Some(source_id) = &filter.source_id {
            // Through the id index's own index on the source id: a delivery names one operation
            // (per tenant), so this reads a row or two, not a scan of the operations.
            let source_id = conditions.bind(Box::new(source_id.as_str().to_owned()));
            conditions.texts.push(format!(
                "operations.operation_id IN (SELECT operation_id FROM sources WHERE source_id = ?{source_id})"
            ));
        }
        if let Some(cursor) = after {
            let created = conditions.bind(Box::new(sql::time(cursor.created_at)));
            let operation = conditions.bind(Box::new(cursor.operation_id.to_string()));
            let comparison = if filter.newest_first { "<" } else { ">" };
            conditions.texts.push(format!(
                "({}, {}) {comparison} (?{created}, ?{operation})",
                order.0, order.1
            ));
        }
        Ok(conditions)
    }

    /// Adds a value and returns its placeholder's number. Placeholders are numbered in the order
    /// values are added, so each condition names the one it just added.
    fn bind(&mut self, value: Box<dyn ToSql>) -> usize {
        self.values.push(value);
        self.values.len()
    }

    /// `WHERE` and the conditions joined, or nothing when there are none.
    fn where_clause(&self) -> String {
        if self.texts.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", self.texts.join(" AND "))
        }
    }
}

/// The page of up to `limit` of `operations` (fetched one more than asked) and, when there were
/// more, the cursor of the next page.
pub(crate) fn page_of(mut operations: Vec<OperationRow>, limit: usize) -> OperationPage {
    let next = if operations.len() > limit {
        operations.truncate(limit);
        operations.last().map(|last| OperationCursor {
            created_at: last.created_at,
            operation_id: last.operation_id,
        })
    } else {
        None
    };
    OperationPage { operations, next }
}

/// `tenants` as the JSON array the scoped queries bind (at most [`MAX_QUERY_ROWS`] of them).
pub(super) fn tenant_array(tenants: &[TenantId]) -> Result<String, ReadModelError> {
    let names: Vec<&str> = tenants
        .iter()
        .take(MAX_QUERY_ROWS)
        .map(TenantId::as_str)
        .collect();
    serde_json::to_string(&names)
        .map_err(|error| corrupt(format!("a tenant list cannot be written as JSON: {error}")))
}

/// Most operations listed for one external id named by several: an object shared by more than
/// this is listed with its first ones, which is enough to investigate and keeps a duplicates
/// query within `limit × this` rows instead of `limit × MAX_QUERY_ROWS`.
pub const MAX_OPERATIONS_PER_SHARED_ID: usize = 16;

fn row_limit(limit: usize) -> i64 {
    i64::try_from(limit.min(MAX_QUERY_ROWS)).unwrap_or(0)
}

fn state_name(text: &str) -> Result<&'static str, ReadModelError> {
    STATE_NAMES
        .iter()
        .find(|name| **name == text)
        .copied()
        .ok_or_else(|| corrupt(format!("`{text}` is not a state")))
}

fn role_from(text: &str) -> Result<ExternalIdRole, ReadModelError> {
    [
        ExternalIdRole::Confirmed,
        ExternalIdRole::Duplicate,
        ExternalIdRole::Reported,
    ]
    .into_iter()
    .find(|role| role.name() == text)
    .ok_or_else(|| corrupt(format!("`{text}` is not an external id role")))
}

/// An operations row as SQLite returned it, before its values are checked.
struct RawOperation {
    operation_id: String,
    tenant: String,
    provider: String,
    account: String,
    action: String,
    args_hash: String,
    source_id: Option<String>,
    state: String,
    attempts: i64,
    external_id: Option<String>,
    last_error: Option<String>,
    created_at: String,
    updated_at: String,
    stream_version: i64,
    last_position: i64,
    lease_deadline: Option<String>,
    unknown_since: Option<String>,
    needs_review_reason: Option<String>,
}

impl RawOperation {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            operation_id: row.get(0)?,
            tenant: row.get(1)?,
            provider: row.get(2)?,
            account: row.get(3)?,
            action: row.get(4)?,
            args_hash: row.get(5)?,
            source_id: row.get(6)?,
            state: row.get(7)?,
            attempts: row.get(8)?,
            external_id: row.get(9)?,
            last_error: row.get(10)?,
            created_at: row.get(11)?,
            updated_at: row.get(12)?,
            stream_version: row.get(13)?,
            last_position: row.get(14)?,
            lease_deadline: row.get(15)?,
            unknown_since: row.get(16)?,
            needs_review_reason: row.get(17)?,
        })
    }

    fn decode(self) -> Result<OperationRow, ReadModelError> {
        Ok(OperationRow {
            operation_id: sql::operation_from(&self.operation_id)?,
            tenant: sql::id_from(self.tenant, TenantId::new)?,
            provider: sql::id_from(self.provider, ProviderId::new)?,
            account: sql::id_from(self.account, AccountId::new)?,
            action: sql::id_from(self.action, ActionName::new)?,
            args_hash: ArgsHash::parse(&self.args_hash)
                .map_err(|error| corrupt(format!("stored args hash: {error}")))?,
            source_id: self
                .source_id
                .map(|id| sql::id_from(id, SourceId::new))
                .transpose()?,
            state: state_name(&self.state)?,
            attempts: sql::small_count_from(self.attempts)?,
            external_id: self
                .external_id
                .map(|id| sql::id_from(id, ExternalObjectId::new))
                .transpose()?,
            last_error: self.last_error,
            created_at: sql::time_from(&self.created_at)?,
            updated_at: sql::time_from(&self.updated_at)?,
            stream_version: sql::version_from(self.stream_version)?,
            last_position: sql::position_from(self.last_position)?,
            lease_deadline: sql::opt_time_from(self.lease_deadline)?,
            unknown_since: sql::opt_time_from(self.unknown_since)?,
            needs_review_reason: self.needs_review_reason,
        })
    }
}

/// A review-queue row as SQLite returned it.
pub(super) struct RawReview {
    operation_id: String,
    state: String,
    since: String,
    tenant: String,
    provider: String,
    account: String,
    attempts: i64,
    lookups: i64,
    last_error: Option<String>,
    lookup_result: Option<String>,
    lookup_evidence: Option<String>,
    lookup_at: Option<String>,
    review_reason: Option<String>,
    review_evidence: Option<String>,
    updated_at: String,
}

impl RawReview {
    pub(super) fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            operation_id: row.get(0)?,
            state: row.get(1)?,
            since: row.get(2)?,
            tenant: row.get(3)?,
            provider: row.get(4)?,
            account: row.get(5)?,
            attempts: row.get(6)?,
            lookups: row.get(7)?,
            last_error: row.get(8)?,
            lookup_result: row.get(9)?,
            lookup_evidence: row.get(10)?,
            lookup_at: row.get(11)?,
            review_reason: row.get(12)?,
            review_evidence: row.get(13)?,
            updated_at: row.get(14)?,
        })
    }

    pub(super) fn decode(self) -> Result<ReviewItem, ReadModelError> {
        let last_lookup = match (self.lookup_result, self.lookup_at) {
            (Some(result), Some(at)) => Some(LookupEvidence {
                result,
                evidence: self.lookup_evidence.unwrap_or_default(),
                at: sql::time_from(&at)?,
            }),
            _ => None,
        };
        Ok(ReviewItem {
            operation_id: sql::operation_from(&self.operation_id)?,
            state: state_name(&self.state)?,
            since: sql::time_from(&self.since)?,
            tenant: sql::id_from(self.tenant, TenantId::new)?,
            provider: sql::id_from(self.provider, ProviderId::new)?,
            account: sql::id_from(self.account, AccountId::new)?,
            attempts: sql::small_count_from(self.attempts)?,
            lookups: sql::small_count_from(self.lookups)?,
            last_error: self.last_error,
            last_lookup,
            review: self.review_reason.map(|reason| ReviewEvidence {
                reason,
                evidence: self.review_evidence.unwrap_or_default(),
            }),
            updated_at: sql::time_from(&self.updated_at)?,
        })
    }
}

/// A flagged pair of intents as SQLite returned it.
struct RawPossibleIntent {
    operation_id: String,
    earlier_operation_id: String,
    tenant: String,
    provider: String,
    account: String,
    action: String,
    args_hash: String,
    source_id: Option<String>,
    earlier_source_id: Option<String>,
    gap_ms: i64,
    at: String,
    position: i64,
}

impl RawPossibleIntent {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            operation_id: row.get(0)?,
            earlier_operation_id: row.get(1)?,
            tenant: row.get(2)?,
            provider: row.get(3)?,
            account: row.get(4)?,
            action: row.get(5)?,
            args_hash: row.get(6)?,
            source_id: row.get(7)?,
            earlier_source_id: row.get(8)?,
            gap_ms: row.get(9)?,
            at: row.get(10)?,
            position: row.get(11)?,
        })
    }

    fn decode(self) -> Result<PossibleDuplicateIntent, ReadModelError> {
        Ok(PossibleDuplicateIntent {
            operation_id: sql::operation_from(&self.operation_id)?,
            earlier_operation_id: sql::operation_from(&self.earlier_operation_id)?,
            tenant: sql::id_from(self.tenant, TenantId::new)?,
            provider: sql::id_from(self.provider, ProviderId::new)?,
            account: sql::id_from(self.account, AccountId::new)?,
            action: sql::id_from(self.action, ActionName::new)?,
            args_hash: ArgsHash::parse(&self.args_hash)
                .map_err(|error| corrupt(format!("stored args hash: {error}")))?,
            source_id: self
                .source_id
                .map(|id| sql::id_from(id, SourceId::new))
                .transpose()?,
            earlier_source_id: self
                .earlier_source_id
                .map(|id| sql::id_from(id, SourceId::new))
                .transpose()?,
            gap_ms: self.gap_ms,
            at: sql::time_from(&self.at)?,
            position: sql::position_from(self.position)?,
        })
    }
}
