//! The review queue read page by page: what an operator works through in an incident of
//! hundreds or thousands of unresolved operations.
//!
//! Pages are keyset pages on `(since, operation_id)`, the queue's own age index, read in either
//! direction: a cursor names the last row shown, not an offset, so a page costs the same at the
//! queue's end as at its start, and rows decided (removed) between two pages shift nothing. A
//! cursor carries its own `since`, so it stays valid after its row left the queue. Counts read the
//! same filter. Nothing here writes.

use chrono::{DateTime, Utc};
use opledger_domain::ids::{AccountId, OperationId, ProviderId, TenantId};
use rusqlite::types::ToSql;
use rusqlite::OptionalExtension;

use super::query::{tenant_array, RawReview, ReviewItem, REVIEW_COLUMNS};
use super::sql;
use super::{ReadModelError, ReadModelStore, MAX_QUERY_ROWS};

/// Most operations a search term may name for the queue to be read from the term's matches
/// (each found in the queue by key, then ordered); a term naming more is tested item by item
/// along the queue's age index instead. Either way a search costs at most this many or the
/// queue's length in lookups, never the ledger's size.
pub const MAX_TERM_DRIVEN_MATCHES: usize = 1_000;

/// The states an item of the review queue can be in.
pub const REVIEW_STATES: [&str; 2] = ["unknown", "needs_review"];

/// Which review items to read. Every condition set must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReviewFilter {
    /// The caller's tenants (an operator's scope); `None` for every tenant. An empty scope
    /// matches nothing.
    pub scope: Option<Vec<TenantId>>,
    /// Only this tenant's items.
    pub tenant: Option<TenantId>,
    /// Only items sent to this provider.
    pub provider: Option<ProviderId>,
    /// Only items bound to this account.
    pub account: Option<AccountId>,
    /// Only items in this state (one of [`REVIEW_STATES`]).
    pub state: Option<String>,
    /// Only items for this owner (matched as `terms.rs` normalises it).
    pub owner: Option<String>,
    /// Only items whose top-level argument (name, value) has this value (matched as `terms.rs`
    /// normalises it: whole, whatever its case and spacing).
    pub argument: Option<(String, String)>,
    /// Only items unresolved since this time or later.
    pub since: Option<DateTime<Utc>>,
    /// Only items unresolved since before this time.
    pub until: Option<DateTime<Utc>>,
}

impl ReviewFilter {
    /// The search terms the filter asks for (`terms.rs`), if any.
    pub fn terms(&self) -> Vec<String> {
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

/// The order of a review page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReviewOrder {
    /// The longest-waiting first: what must not be forgotten.
    #[default]
    OldestFirst,
    /// The latest first: what an incident is adding now.
    NewestFirst,
}

/// Where a review page ended; pass it back for the next page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReviewCursor {
    /// When the last item shown became unresolved.
    pub since: DateTime<Utc>,
    /// The last item shown.
    pub operation_id: OperationId,
}

impl ReviewCursor {
    /// The cursor as one opaque token for a URL: `since` in nanoseconds, `.`, the operation id.
    pub fn token(&self) -> String {
        let nanos = self
            .since
            .timestamp_nanos_opt()
            .unwrap_or(i64::MAX)
            .to_string();
        format!("{nanos}.{}", self.operation_id)
    }

    /// Reads a [`Self::token`] back; the error says what to pass instead.
    pub fn parse(token: &str) -> Result<Self, ReadModelError> {
        let refused = || ReadModelError::InvalidQuery {
            reason: format!(
                "after=`{token}` is not a review cursor; pass the `next` of the previous page"
            ),
        };
        let (nanos, operation) = token.split_once('.').ok_or_else(refused)?;
        let nanos: i64 = nanos.parse().map_err(|_| refused())?;
        let operation_id = operation.parse::<OperationId>().map_err(|_| refused())?;
        Ok(Self {
            since: DateTime::from_timestamp_nanos(nanos),
            operation_id,
        })
    }
}

/// One page of the review queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReviewPage {
    /// The items, in the page's order.
    pub items: Vec<ReviewItem>,
    /// Where the next page starts; `None` when this is the last.
    pub next: Option<ReviewCursor>,
}

impl ReadModelStore {
    /// Up to `limit` (at most [`MAX_QUERY_ROWS`]) review items matching `filter` in `order`,
    /// starting after `after`: one range read of the queue's age index.
    pub fn review_page(
        &self,
        filter: &ReviewFilter,
        order: ReviewOrder,
        limit: usize,
        after: Option<&ReviewCursor>,
    ) -> Result<ReviewPage, ReadModelError> {
        let limit = limit.min(MAX_QUERY_ROWS);
        let few = self.few_matches(filter)?;
        let mut conditions = ReviewConditions::of(filter, few)?;
        let direction = match order {
            ReviewOrder::OldestFirst => "",
            ReviewOrder::NewestFirst => " DESC",
        };
        if let Some(cursor) = after {
            let since = conditions.bind(Box::new(sql::time(cursor.since)));
            let operation = conditions.bind(Box::new(cursor.operation_id.to_string()));
            let comparison = match order {
                ReviewOrder::OldestFirst => ">",
                ReviewOrder::NewestFirst => "<",
            };
            conditions.texts.push(format!(
                "({}, operation_id) {comparison} (?{since}, ?{operation})",
                conditions.since()
            ));
        }
        // One more than asked tells whether another page follows.
        let fetch = conditions.bind(Box::new(i64::try_from(limit + 1).unwrap_or(i64::MAX)));
        let query = format!(
            "SELECT {REVIEW_COLUMNS} FROM review_queue WHERE {}
             ORDER BY {}{direction}, operation_id{direction} LIMIT ?{fetch}",
            conditions.texts.join(" AND "),
            conditions.since()
        );
        let mut items = self.reviewed(&query, &conditions.values)?;
        let next = if items.len() > limit {
            items.truncate(limit);
            items.last().map(|last| ReviewCursor {
                since: last.since,
                operation_id: last.operation_id,
            })
        } else {
            None
        };
        Ok(ReviewPage { items, next })
    }

    /// How SQLite answers the first page of `filter`'s items: the lines of `EXPLAIN QUERY PLAN`,
    /// for tests that check a search tests each item by key.
    pub fn review_plan(&self, filter: &ReviewFilter) -> Result<Vec<String>, ReadModelError> {
        let few = self.few_matches(filter)?;
        let conditions = ReviewConditions::of(filter, few)?;
        let query = format!(
            "EXPLAIN QUERY PLAN SELECT {REVIEW_COLUMNS} FROM review_queue WHERE {}
             ORDER BY {} DESC, operation_id DESC LIMIT 51",
            conditions.texts.join(" AND "),
            conditions.since()
        );
        let parameters: Vec<&dyn ToSql> = conditions.values.iter().map(AsRef::as_ref).collect();
        let mut statement = self
            .connection
            .prepare(&query)
            .map_err(|error| ReadModelError::sqlite("preparing a query plan", error))?;
        let lines = statement
            .query_map(parameters.as_slice(), |row| row.get::<_, String>(3))
            .map_err(|error| ReadModelError::sqlite("reading a query plan", error))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| ReadModelError::sqlite("reading a query plan", error))?;
        Ok(lines)
    }

    /// How many review items match `filter`, whatever their number (the queue holds only what is
    /// unresolved, so this counts rows of that small table, not operations).
    pub fn review_count(&self, filter: &ReviewFilter) -> Result<u64, ReadModelError> {
        let few = self.few_matches(filter)?;
        let conditions = ReviewConditions::of(filter, few)?;
        let query = format!(
            "SELECT COUNT(*) FROM review_queue WHERE {}",
            conditions.texts.join(" AND ")
        );
        let parameters: Vec<&dyn ToSql> = conditions.values.iter().map(AsRef::as_ref).collect();
        let count: i64 = self
            .connection
            .prepare_cached(&query)
            .and_then(|mut statement| statement.query_row(parameters.as_slice(), |row| row.get(0)))
            .map_err(|error| ReadModelError::sqlite("counting the review queue", error))?;
        sql::count_from(count)
    }

    /// One item of the review queue, if the operation waits there and is in `scope` (`None`: every
    /// tenant).
    pub fn review_item(
        &self,
        operation_id: OperationId,
        scope: Option<&[TenantId]>,
    ) -> Result<Option<ReviewItem>, ReadModelError> {
        let scope = scope.map(tenant_array).transpose()?;
        let raw = self
            .connection
            .prepare_cached(&format!(
                "SELECT {REVIEW_COLUMNS} FROM review_queue WHERE operation_id = ?1
                 AND (?2 IS NULL OR tenant IN (SELECT value FROM json_each(?2)))"
            ))
            .and_then(|mut statement| {
                statement
                    .query_row(
                        rusqlite::params![operation_id.to_string(), scope],
                        RawReview::from_row,
                    )
                    .optional()
            })
            .map_err(|error| ReadModelError::sqlite("reading a review item", error))?;
        raw.map(RawReview::decode).transpose()
    }

    /// The operations the filter's first search term names, as a JSON array, when they are at
    /// most [`MAX_TERM_DRIVEN_MATCHES`] (a title, a customer id): the queue is then read from
    /// them. `None` without a term or when it names more (an owner of thousands).
    fn few_matches(&self, filter: &ReviewFilter) -> Result<Option<String>, ReadModelError> {
        let Some(term) = filter.terms().into_iter().next() else {
            return Ok(None);
        };
        let mut statement = self
            .connection
            .prepare_cached("SELECT operation FROM operation_terms WHERE term = ?1 LIMIT ?2")
            .map_err(|error| ReadModelError::sqlite("preparing to read a term's matches", error))?;
        let limit = i64::try_from(MAX_TERM_DRIVEN_MATCHES + 1).unwrap_or(i64::MAX);
        let operations = statement
            .query_map(rusqlite::params![term, limit], |row| {
                row.get::<_, String>(0)
            })
            .map_err(|error| ReadModelError::sqlite("reading a term's matches", error))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| ReadModelError::sqlite("reading a term's matches", error))?;
        if operations.len() > MAX_TERM_DRIVEN_MATCHES {
            return Ok(None);
        }
        serde_json::to_string(&operations)
            .map(Some)
            .map_err(|error| {
                sql::corrupt(format!("operation ids cannot be written as JSON: {error}"))
            })
    }

    fn reviewed(
        &self,
        query: &str,
        values: &[Box<dyn ToSql>],
    ) -> Result<Vec<ReviewItem>, ReadModelError> {
        let mut statement = self
            .connection
            .prepare_cached(query)
            .map_err(|error| ReadModelError::sqlite("preparing to read the review queue", error))?;
        let parameters: Vec<&dyn ToSql> = values.iter().map(AsRef::as_ref).collect();
        let raw = statement
            .query_map(parameters.as_slice(), RawReview::from_row)
            .map_err(|error| ReadModelError::sqlite("reading the review queue", error))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| ReadModelError::sqlite("reading the review queue", error))?;
        raw.into_iter().map(RawReview::decode).collect()
    }
}

/// The conditions of a review read and the values bound to their placeholders; never empty, so
/// the statement always has a `WHERE`.
struct ReviewConditions {
    texts: Vec<String>,
    values: Vec<Box<dyn ToSql>>,
    /// The items are read by key from a term's few matches, not along the age index.
    by_key: bool,
}

impl ReviewConditions {
    /// The column the page is ordered and its cursor compared on: `+since` (an expression, which
    /// no index serves) when the items are read by key, so SQLite sorts those few rather than
    /// walking the whole age index to avoid the sort.
    fn since(&self) -> &'static str {
        if self.by_key {
            "+since"
        } else {
            "since"
        }
    }
}

impl ReviewConditions {
    /// The conditions of `filter`; with `few` (the first term's operations, a JSON array), that
    /// term is matched by key against them instead of item by item.
    fn of(filter: &ReviewFilter, few: Option<String>) -> Result<Self, ReadModelError> {
        let mut conditions = Self {
            texts: vec!["1".to_owned()],
            values: Vec::new(),
            by_key: few.is_some(),
        };
        if let Some(state) = &filter.state {
            if !REVIEW_STATES.contains(&state.as_str()) {
                return Err(ReadModelError::InvalidQuery {
                    reason: format!(
                        "`{state}` is not a state of the review queue; use one of {}",
                        REVIEW_STATES.join(", ")
                    ),
                });
            }
            let state = conditions.bind(Box::new(state.clone()));
            conditions.texts.push(format!("state = ?{state}"));
        }
        if let Some(scope) = &filter.scope {
            let scope = conditions.bind(Box::new(tenant_array(scope)?));
            conditions
                .texts
                .push(format!("tenant IN (SELECT value FROM json_each(?{scope}))"));
        }
        for (column, value) in [
            ("tenant", filter.tenant.as_ref().map(TenantId::as_str)),
            ("provider", filter.provider.as_ref().map(ProviderId::as_str)),
            ("account", filter.account.as_ref().map(AccountId::as_str)),
        ] {
            if let Some(value) = value {
                let placeholder = conditions.bind(Box::new(value.to_owned()));
                conditions.texts.push(format!("{column} = ?{placeholder}"));
            }
        }
        if let Some(since) = filter.since {
            let since = conditions.bind(Box::new(sql::time(since)));
            let column = conditions.since();
            conditions.texts.push(format!("{column} >= ?{since}"));
        }
        if let Some(until) = filter.until {
            let until = conditions.bind(Box::new(sql::time(until)));
            let column = conditions.since();
            conditions.texts.push(format!("{column} < ?{until}"));
        }
        // A search by owner or argument asks the terms' index about each item it reads: the
        // item's operation gives the recorded time the index is ordered by, so each test is one
        // point lookup (term, time, operation) however many operations share the term. The time
        // is a scalar subquery, not a join, so SQLite cannot choose to walk the term's rows for
        // each item instead (it did: 9.5 s a page for an owner of 3,400 operations). The queue
        // holds only what is unresolved, so this reads at most the queue, never the ledger's
        // operations.
        let mut terms = filter.terms().into_iter();
        if let Some(few) = few {
            // The first term's few operations, each found in the queue by its key (`+since`
            // elsewhere keeps SQLite from preferring to walk the age index and test each item).
            terms.next();
            let few = conditions.bind(Box::new(few));
            conditions.texts.push(format!(
                "review_queue.operation_id IN (SELECT value FROM json_each(?{few}))"
            ));
        }
        for term in terms {
            let term = conditions.bind(Box::new(term));
            conditions.texts.push(format!(
                "EXISTS (SELECT 1 FROM operation_terms AS found
                 WHERE found.term = ?{term}
                 AND found.at = (SELECT created_at FROM operations
                                 WHERE operations.operation_id = review_queue.operation_id)
                 AND found.operation = review_queue.operation_id)"
            ));
        }
        Ok(conditions)
    }

    fn bind(&mut self, value: Box<dyn ToSql>) -> usize {
        self.values.push(value);
        self.values.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_token_reads_back_as_the_same_cursor() {
        let cursor = ReviewCursor {
            since: DateTime::from_timestamp_nanos(1_765_000_000_123_456_789),
            operation_id: "0193a9a0-0000-7000-8000-000000000001"
                .parse()
                .expect("an operation id"),
        };
        assert_eq!(ReviewCursor::parse(&cursor.token()).ok(), Some(cursor));
    }

    #[test]
    fn a_cursor_that_is_not_one_is_refused_naming_what_to_pass() {
        for token in ["", "12", "x.y", "12.not-an-id"] {
            let refused = ReviewCursor::parse(token).expect_err(token);
            assert!(refused.to_string().contains("pass the `next`"), "{refused}");
        }
    }
}
