//! The labelled shape (a unique external label enforced atomically, as Salesforce's External ID
//! upsert): its rules and its route, `PUT` and `GET /labelled/{account}/tasks/by-label/{label}`.
//!
//! Labels are unique per account. These rules must never create a second task under a label
//! that is already used in the account, and never change an existing task.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use axum::Extension;
use serde_json::{json, Map, Value};

use super::exchange::{self, check_label, task_fields, Call, LimitedBody, Op};
use super::server::ConnectionHandle;
use super::state::{Applied, Crm, Outcome, Reply, Shared};
use super::wire::Shape;

impl Crm {
    /// `PUT .../by-label/{label}`: create, find the same task again, or refuse.
    pub(super) fn labelled_put(
        &mut self,
        account: &str,
        label: &str,
        fields: Map<String, Value>,
        now_ms: u64,
    ) -> Applied {
        let scoped = (account.to_owned(), label.to_owned());
        if let Some(task) = self.labels.get(&scoped).and_then(|&i| self.tasks.get(i)) {
            if task.fields == fields {
                let id = task.id.to_string();
                return Applied::new(
                    Reply::json(StatusCode::OK, json!({"id": id, "created": false})),
                    Outcome::Replayed,
                );
            }
            return Applied::refused(Reply::error(
                StatusCode::CONFLICT,
                "label_conflict",
                format!(
                    "label {label:?} is used by task {} with another body",
                    task.id
                ),
            ));
        }
        match self.create_task(Shape::Labelled, account, None, Some(label), fields, now_ms) {
            Ok(index) => {
                self.labels.insert(scoped, index);
                let id = self.tasks[index].id.to_string();
                Applied::new(
                    Reply::json(StatusCode::CREATED, json!({"id": id, "created": true})),
                    Outcome::Applied,
                )
            }
            Err(reply) => Applied::refused(reply),
        }
    }

    /// `GET .../by-label/{label}`.
    pub(super) fn labelled_get(&self, account: &str, label: &str) -> Applied {
        let scoped = (account.to_owned(), label.to_owned());
        let reply = match self.labels.get(&scoped).and_then(|&i| self.tasks.get(i)) {
            Some(task) => Reply::json(StatusCode::OK, json!({"id": task.id.to_string()})),
            None => Reply::error(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no task labelled {label:?}"),
            ),
        };
        Applied::new(reply, Outcome::Applied)
    }
}

/// `PUT /labelled/{account}/tasks/by-label/{label}`.
pub(super) async fn put(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    params: Result<Path<(String, String)>, PathRejection>,
    connection: Option<Extension<ConnectionHandle>>,
    body: LimitedBody,
) -> Response {
    let (call, label) = call(method, &uri, &headers, params);
    let op = label.and_then(|label| {
        check_label(&label)?;
        Ok(Op::LabelledPut {
            label,
            fields: task_fields(body)?,
        })
    });
    exchange::run(shared, call, op, connection.map(|Extension(c)| c)).await
}

/// `GET /labelled/{account}/tasks/by-label/{label}`.
pub(super) async fn get(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    params: Result<Path<(String, String)>, PathRejection>,
    connection: Option<Extension<ConnectionHandle>>,
) -> Response {
    let (call, label) = call(method, &uri, &headers, params);
    let op = label.and_then(|label| {
        check_label(&label)?;
        Ok(Op::LabelledGet { label })
    });
    exchange::run(shared, call, op, connection.map(|Extension(c)| c)).await
}

fn call(
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    params: Result<Path<(String, String)>, PathRejection>,
) -> (Call, Result<String, Reply>) {
    let (account, label) = match params {
        Ok(Path((account, label))) => (Some(account), Ok(label)),
        Err(rejection) => (
            None,
            Err(Reply::error(
                StatusCode::BAD_REQUEST,
                "invalid_path",
                rejection.body_text(),
            )),
        ),
    };
    let mut call = Call::new(Shape::Labelled, method, uri, headers, account);
    call.label = label.as_ref().ok().cloned();
    (call, label)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(title: &str) -> Map<String, Value> {
        let mut fields = Map::new();
        fields.insert("title".to_owned(), json!(title));
        fields
    }

    #[test]
    fn a_label_creates_once_then_finds_or_refuses() {
        let mut crm = Crm::new();
        let first = crm.labelled_put("a", "L", fields("x"), 0);
        assert_eq!(first.reply.status, StatusCode::CREATED);
        let again = crm.labelled_put("a", "L", fields("x"), 1);
        assert_eq!(again.reply.status, StatusCode::OK);
        assert_eq!(again.reply.body["id"], first.reply.body["id"]);
        let changed = crm.labelled_put("a", "L", fields("y"), 2);
        assert_eq!(changed.reply.status, StatusCode::CONFLICT);
        assert_eq!(crm.tasks.len(), 1);
        assert_eq!(
            crm.tasks[0].fields,
            fields("x"),
            "a conflict changes nothing"
        );
    }

    #[test]
    fn labels_are_per_account() {
        let mut crm = Crm::new();
        crm.labelled_put("a", "L", fields("x"), 0);
        let other = crm.labelled_put("b", "L", fields("y"), 0);
        assert_eq!(other.reply.status, StatusCode::CREATED);
        assert_eq!(
            crm.labelled_get("b", "L").reply.body,
            json!({ "id": other.reply.body["id"] })
        );
    }
}
