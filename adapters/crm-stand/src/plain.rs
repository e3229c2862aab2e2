//! The plain shape (lookup-only, as HubSpot tasks, Kommo or Bitrix24): its rules and its routes,
//! `POST /plain/{account}/tasks` and `GET /plain/{account}/tasks/search?label=...`.
//!
//! Every create creates; the `opledger_label` field is only a custom field, and the search index
//! lags `search_lag_ms` behind creation on the stand clock. These rules must never refuse a
//! duplicate label, and never show a task in search before its lag has passed.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::exchange::{self, check_label, task_fields, Call, LimitedBody, Op};
use super::server::ConnectionHandle;
use super::state::{Applied, Crm, Outcome, Reply, Shared, MAX_LABEL_BYTES};
use super::wire::Shape;

/// The custom field that carries a plain task's label.
pub(super) const LABEL_FIELD: &str = "opledger_label";

impl Crm {
    /// `POST /plain/{account}/tasks`: always creates.
    pub(super) fn plain_create(
        &mut self,
        account: &str,
        label: Option<&str>,
        fields: Map<String, Value>,
        now_ms: u64,
    ) -> Applied {
        match self.create_task(Shape::Plain, account, None, label, fields, now_ms) {
            Ok(index) => {
                if let Some(label) = label {
                    self.plain_labels
                        .entry((account.to_owned(), label.to_owned()))
                        .or_default()
                        .push(index);
                }
                let id = self.tasks[index].id.to_string();
                Applied::new(
                    Reply::json(StatusCode::CREATED, json!({ "id": id })),
                    Outcome::Applied,
                )
            }
            Err(reply) => Applied::refused(reply),
        }
    }

    /// `GET /plain/{account}/tasks/search?label=...`: the tasks created at least `lag_ms` ago.
    pub(super) fn plain_search(
        &self,
        account: &str,
        label: &str,
        now_ms: u64,
        lag_ms: u64,
    ) -> Applied {
        let scoped = (account.to_owned(), label.to_owned());
        let results: Vec<Value> = self
            .plain_labels
            .get(&scoped)
            .into_iter()
            .flatten()
            .filter_map(|&i| self.tasks.get(i))
            .filter(|task| task.created_at_ms.saturating_add(lag_ms) <= now_ms)
            .map(|task| {
                json!({"id": task.id.to_string(), LABEL_FIELD: label, "account": task.account})
            })
            .collect();
        Applied::new(
            Reply::json(StatusCode::OK, json!({ "results": results })),
            Outcome::Applied,
        )
    }
}

/// `POST /plain/{account}/tasks`.
pub(super) async fn create(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    account: Result<Path<String>, PathRejection>,
    connection: Option<Extension<ConnectionHandle>>,
    body: LimitedBody,
) -> Response {
    let mut call = Call::new(
        Shape::Plain,
        method,
        &uri,
        &headers,
        account.ok().map(|Path(account)| account),
    );
    let op = task_fields(body).and_then(|fields| {
        let label = label_of(&fields)?;
        Ok(Op::PlainCreate { label, fields })
    });
    if let Ok(Op::PlainCreate { label, .. }) = &op {
        call.label = label.clone();
    }
    exchange::run(shared, call, op, connection.map(|Extension(c)| c)).await
}

#[derive(Debug, Deserialize)]
pub(super) struct SearchQuery {
    label: Option<String>,
}

/// `GET /plain/{account}/tasks/search?label=...`.
pub(super) async fn search(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    account: Result<Path<String>, PathRejection>,
    query: Result<Query<SearchQuery>, QueryRejection>,
    connection: Option<Extension<ConnectionHandle>>,
) -> Response {
    let mut call = Call::new(
        Shape::Plain,
        method,
        &uri,
        &headers,
        account.ok().map(|Path(account)| account),
    );
    let label = match query {
        Ok(Query(SearchQuery { label: Some(label) })) => check_label(&label).map(|()| label),
        Ok(Query(SearchQuery { label: None })) => Err(Reply::error(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "the label query parameter is required",
        )),
        Err(rejection) => Err(Reply::error(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            rejection.body_text(),
        )),
    };
    call.label = label.as_ref().ok().cloned();
    let op = label.map(|label| Op::PlainSearch { label });
    exchange::run(shared, call, op, connection.map(|Extension(c)| c)).await
}

/// The `opledger_label` field: absent (the task is then never found by search) or a valid label.
fn label_of(fields: &Map<String, Value>) -> Result<Option<String>, Reply> {
    match fields.get(LABEL_FIELD) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(label)) => {
            check_label(label).map_err(|_| invalid_label_field())?;
            Ok(Some(label.clone()))
        }
        Some(_) => Err(invalid_label_field()),
    }
}

fn invalid_label_field() -> Reply {
    Reply::error(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_body",
        format!("{LABEL_FIELD} must be a non-empty string of at most {MAX_LABEL_BYTES} bytes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(label: &str) -> Map<String, Value> {
        let mut fields = Map::new();
        fields.insert(LABEL_FIELD.to_owned(), json!(label));
        fields
    }

    #[test]
    fn search_shows_a_task_only_once_its_lag_has_passed() {
        let mut crm = Crm::new();
        crm.plain_create("a", Some("L"), labelled("L"), 1_000);
        let before = crm.plain_search("a", "L", 1_999, 1_000);
        assert_eq!(before.reply.body, json!({"results": []}));
        let after = crm.plain_search("a", "L", 2_000, 1_000);
        assert_eq!(
            after.reply.body,
            json!({"results": [{"id": "731", "opledger_label": "L", "account": "a"}]})
        );
    }

    #[test]
    fn duplicate_labels_create_again_and_stay_per_account() {
        let mut crm = Crm::new();
        crm.plain_create("a", Some("L"), labelled("L"), 0);
        crm.plain_create("a", Some("L"), labelled("L"), 0);
        crm.plain_create("b", Some("L"), labelled("L"), 0);
        let found = crm.plain_search("a", "L", 0, 0);
        assert_eq!(
            found.reply.body["results"].as_array().map(Vec::len),
            Some(2)
        );
    }
}
