//! What the soak checks after each restart, in order: every acknowledged operation is there
//! under its id; every request delivered again maps to its operation (and one never answered
//! gets one); everything settles; the stand holds at most one object per request, and a
//! success names the object the stand holds.
//!
//! A check never stops the soak: what fails is tallied with the operation and request it is
//! about, so the result names them all.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use opledger_crm_stand::{StandAdmin, StandObject};
use tokio::task::JoinSet;

use super::api::{Answer, Api, OperationView, Request, UID_FIELD};
use super::Tally;
use crate::BenchError;

/// How often the settle step reads the operations still open, in milliseconds.
const SETTLE_POLL_MS: u64 = 100;
/// Most calls the checks make at once.
const CHECK_CALLS_MAX: usize = 16;

/// One request of the soak and what is known of it.
#[derive(Clone, Debug)]
pub struct Record {
    pub request: Request,
    /// The answer to its first delivery.
    pub first: Answer,
    /// Its operation, once any delivery was acknowledged.
    pub operation_id: Option<String>,
    /// The operation as last read.
    pub last: Option<OperationView>,
}

impl Record {
    pub fn new(request: Request, first: Answer) -> Self {
        let operation_id = match &first {
            Answer::Acked(acked) => Some(acked.operation_id.clone()),
            _ => None,
        };
        Self {
            request,
            first,
            operation_id,
            last: None,
        }
    }

    pub fn acknowledged(&self) -> bool {
        matches!(self.first, Answer::Acked(_))
    }

    /// `operation <id> (request <uid>)`, as failures name it.
    pub fn name(&self) -> String {
        format!(
            "operation {} (request {})",
            self.operation_id.as_deref().unwrap_or("none"),
            self.request.uid
        )
    }
}

/// Reads every acknowledged operation: it must exist under the id it was acknowledged with.
pub async fn presence(api: &Api, records: &mut [Record], tally: &mut Tally) {
    let asked: Vec<(usize, String)> = records
        .iter()
        .enumerate()
        .filter(|(_, record)| record.acknowledged())
        .filter_map(|(index, record)| Some((index, record.operation_id.clone()?)))
        .collect();
    let api_for = api.clone();
    let read = concurrently(asked, move |(index, id)| {
        let api = api_for.clone();
        async move { (index, id.clone(), api.operation(&id).await) }
    })
    .await;
    for (index, id, answer) in read {
        let record = &mut records[index];
        match answer {
            Ok(Some(view)) if view.operation_id == id => record.last = Some(view),
            Ok(Some(view)) => tally.lost.push(format!(
                "{}: read back as operation {}",
                record.name(),
                view.operation_id
            )),
            Ok(None) => tally
                .lost
                .push(format!("{}: not found after the restart", record.name())),
            Err(error) => tally.lost.push(format!("{}: {error}", record.name())),
        }
    }
}

/// Delivers every request again, as a client retrying after the crash would: an acknowledged
/// one must answer 200 with its operation (and `Idempotent-Replayed` when named by the key); one
/// never acknowledged must now be, whether or not its first delivery was recorded. Counts the
/// operations the kill caught before their outcome was recorded (open at the redelivery, right
/// after the restart, before any lease could run out).
pub async fn redeliver(api: &Api, records: &mut [Record], tally: &mut Tally) {
    let asked: Vec<(usize, Request)> = records
        .iter()
        .enumerate()
        .map(|(index, record)| (index, record.request.clone()))
        .collect();
    let api_for = api.clone();
    let answers = concurrently(asked, move |(index, request)| {
        let api = api_for.clone();
        // No wait: the redelivery is about identity; settling is the next step's.
        async move { (index, api.record(&request, 0).await) }
    })
    .await;
    for (index, answer) in answers {
        let record = &mut records[index];
        if let Answer::Acked(again) = &answer {
            if matches!(again.state.as_str(), "in_flight" | "unknown" | "pending") {
                tally.interrupted += 1;
            }
        }
        match (&record.operation_id, answer) {
            (Some(id), Answer::Acked(again)) => {
                let replay_shown = again.replayed || !record.request.by_header;
                if again.operation_id != *id || again.created || !replay_shown {
                    tally.mismatched.push(format!(
                        "{}: redelivered, answered operation {} (created: {}, replayed: {})",
                        record.name(),
                        again.operation_id,
                        again.created,
                        again.replayed
                    ));
                }
            }
            (None, Answer::Acked(again)) => {
                tally.recovered += 1;
                record.operation_id = Some(again.operation_id);
            }
            (_, other) => tally
                .mismatched
                .push(format!("{}: redelivered, answered {other}", record.name())),
        }
    }
}

/// Reads the open operations until every one is settled or `within` has passed; what is still
/// open then is tallied as unsettled.
pub async fn settle(api: &Api, records: &mut [Record], within: Duration, tally: &mut Tally) {
    let started = Instant::now();
    loop {
        let open: Vec<(usize, String)> = records
            .iter()
            .enumerate()
            .filter(|(_, record)| !record.last.as_ref().is_some_and(OperationView::settled))
            .filter_map(|(index, record)| Some((index, record.operation_id.clone()?)))
            .collect();
        if open.is_empty() {
            return;
        }
        if started.elapsed() >= within {
            for (index, _) in open {
                let record = &records[index];
                let state = record.last.as_ref().map_or("unread", |view| &view.state);
                tally
                    .unsettled
                    .push(format!("{}: still {state}", record.name()));
            }
            return;
        }
        let api_for = api.clone();
        let read = concurrently(open, move |(index, id)| {
            let api = api_for.clone();
            async move { (index, api.operation(&id).await) }
        })
        .await;
        for (index, answer) in read {
            if let Ok(Some(view)) = answer {
                records[index].last = Some(view);
            }
        }
        tokio::time::sleep(Duration::from_millis(SETTLE_POLL_MS)).await;
    }
}

/// The stand's ground truth against the ledger's: at most one object per request, and a
/// succeeded operation names the request's object (a rejected one has none).
pub async fn stand(
    admin: &StandAdmin,
    records: &[Record],
    tally: &mut Tally,
) -> Result<(), BenchError> {
    let objects = admin
        .objects(None)
        .await
        .map_err(|error| BenchError::Other(format!("cannot list the stand's objects: {error}")))?;
    let mut by_uid: HashMap<&str, Vec<&StandObject>> = HashMap::new();
    for object in &objects {
        if let Some(uid) = object.fields.get(UID_FIELD).and_then(|uid| uid.as_str()) {
            by_uid.entry(uid).or_default().push(object);
        }
    }
    for record in records {
        let found = by_uid
            .get(record.request.uid.as_str())
            .map_or(&[][..], Vec::as_slice);
        if found.len() > 1 {
            let ids: Vec<&str> = found.iter().map(|object| object.id.as_str()).collect();
            tally.duplicates.push(format!(
                "{}: {} objects at the stand ({})",
                record.name(),
                found.len(),
                ids.join(", ")
            ));
        }
        if let Some(problem) = outcome_problem(record.last.as_ref(), found) {
            tally
                .wrong_outcomes
                .push(format!("{}: {problem}", record.name()));
        }
    }
    Ok(())
}

/// What is wrong with a settled operation's outcome given the request's objects at the stand.
fn outcome_problem(last: Option<&OperationView>, found: &[&StandObject]) -> Option<String> {
    let view = last?;
    match view.state.as_str() {
        "succeeded" => {
            let external_id = view.external_id.as_deref().unwrap_or("none");
            (!found.iter().any(|object| object.id == external_id)).then(|| {
                format!("succeeded with object {external_id}, which the stand does not hold for it")
            })
        }
        "rejected" if !found.is_empty() => {
            Some("rejected, yet the stand holds an object for it".to_owned())
        }
        _ => None,
    }
}

/// Reads operations settled in earlier cycles again: each must still be there, in the state and
/// with the object it settled with (a terminal state stays terminal; a success keeps its id).
pub async fn recheck(api: &Api, earlier: &[Record], tally: &mut Tally) {
    let asked: Vec<(usize, String)> = earlier
        .iter()
        .enumerate()
        .filter_map(|(index, record)| Some((index, record.operation_id.clone()?)))
        .collect();
    let api_for = api.clone();
    let read = concurrently(asked, move |(index, id)| {
        let api = api_for.clone();
        async move { (index, api.operation(&id).await) }
    })
    .await;
    for (index, answer) in read {
        let record = &earlier[index];
        let before = record.last.as_ref();
        match answer {
            Ok(Some(now)) => {
                let same = before.is_some_and(|before| {
                    before.state == now.state && before.external_id == now.external_id
                });
                if !same && before.is_some_and(OperationView::settled) {
                    tally.wrong_outcomes.push(format!(
                        "{}: settled as {:?}, later read as {} {:?}",
                        record.name(),
                        before.map(|view| (&view.state, &view.external_id)),
                        now.state,
                        now.external_id
                    ));
                }
            }
            Ok(None) => tally
                .lost
                .push(format!("{}: gone in a later cycle", record.name())),
            Err(error) => tally.lost.push(format!("{}: {error}", record.name())),
        }
    }
}

/// Runs `call` on every item, at most [`CHECK_CALLS_MAX`] at once; the results in any order.
async fn concurrently<T, R, F, Fut>(items: Vec<T>, call: F) -> Vec<R>
where
    F: Fn(T) -> Fut,
    Fut: Future<Output = R> + Send + 'static,
    R: Send + 'static,
{
    let mut results = Vec::with_capacity(items.len());
    let mut running = JoinSet::new();
    for item in items {
        if running.len() >= CHECK_CALLS_MAX {
            if let Some(done) = running.join_next().await {
                results.push(done.expect("a soak check's call does not panic"));
            }
        }
        running.spawn(call(item));
    }
    while let Some(done) = running.join_next().await {
        results.push(done.expect("a soak check's call does not panic"));
    }
    results
}

#[cfg(test)]
mod tests {
    use opledger_crm_stand::Shape;

    use super::*;

    fn object(id: &str) -> StandObject {
        StandObject {
            id: id.to_owned(),
            shape: Shape::Keyed,
            account: "acct-1".to_owned(),
            key: None,
            label: None,
            fields: serde_json::Map::new(),
            created_at_ms: 0,
        }
    }

    fn view(state: &str, external_id: Option<&str>) -> OperationView {
        OperationView {
            operation_id: "op".to_owned(),
            state: state.to_owned(),
            external_id: external_id.map(str::to_owned),
        }
    }

    #[test]
    fn a_success_naming_the_requests_object_is_right() {
        let held = object("731");
        assert_eq!(
            outcome_problem(Some(&view("succeeded", Some("731"))), &[&held]),
            None
        );
    }

    #[test]
    fn a_success_naming_an_object_the_stand_does_not_hold_for_the_request_is_wrong() {
        let held = object("731");
        assert!(outcome_problem(Some(&view("succeeded", Some("732"))), &[&held]).is_some());
        assert!(outcome_problem(Some(&view("succeeded", Some("731"))), &[]).is_some());
    }

    #[test]
    fn a_rejection_with_an_object_at_the_stand_is_wrong_and_a_review_is_not() {
        let held = object("731");
        assert!(outcome_problem(Some(&view("rejected", None)), &[&held]).is_some());
        assert_eq!(outcome_problem(Some(&view("rejected", None)), &[]), None);
        assert_eq!(
            outcome_problem(Some(&view("needs_review", None)), &[&held]),
            None
        );
    }
}
