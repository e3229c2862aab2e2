//! The review queue searched through the API as operations are: by an argument's value, by owner
//! and by when items became unresolved, now and as of a moment, with the count, the rows' chosen
//! arguments, and a bulk decision's filter deciding exactly what the search lists.

use opledger_crm_stand::{FaultKind, Shape};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{Harness, Server, ACCOUNT, OPERATOR_TOKEN, TENANT_A_TOKEN};

/// Records a task for `owner` at the lookup-only CRM, whose request is dropped, and waits until
/// it is handed to a person; its id.
async fn waiting(server: &Server, title: &str, owner: &str) -> String {
    let body = json!({"provider": "crm-plain", "account": ACCOUNT, "action": "create_task",
        "args": {"title": title, "amount": 1200}, "owner": owner});
    let (status, recorded) = server
        .call(
            Method::POST,
            "/v1/operations",
            Some(TENANT_A_TOKEN),
            Some(&body),
        )
        .await;
    assert!(status.is_success(), "{recorded}");
    let id = recorded["operation_id"].as_str().expect("an id").to_owned();
    server.execute(TENANT_A_TOKEN, &id, 200).await;
    server
        .wait_for_state(TENANT_A_TOKEN, &id, &["needs_review"])
        .await;
    id
}

async fn review(server: &Server, query: &str) -> Value {
    let (status, page) = server
        .call(
            Method::GET,
            &format!("/v1/review?detail=none&order=oldest&{query}"),
            Some(OPERATOR_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{query}: {page}");
    page
}

fn ids(page: &Value) -> Vec<&str> {
    page["queue"]
        .as_array()
        .expect("a queue")
        .iter()
        .map(|item| item["operation_id"].as_str().expect("an id"))
        .collect()
}

#[tokio::test]
async fn the_review_queue_is_searched_by_argument_owner_and_time_now_and_as_of_a_moment() {
    let harness = Harness::new("").await;
    let server = harness.serve();
    harness.fault(Shape::Plain, FaultKind::DropRequest, 3).await;
    let anna = waiting(&server, "Call Anna", "anna").await;
    let boris = waiting(&server, "Call Boris", "boris").await;
    let invoice = waiting(&server, "Send the invoice", "anna").await;

    // By an argument's value, whatever its case and spacing, with the rows' chosen arguments.
    let found = review(&server, "arg=title:call%20%20ANNA&args=title,amount").await;
    assert_eq!(ids(&found), [anna.as_str()], "{found}");
    assert_eq!(found["total"], 1);
    assert_eq!(
        found["queue"][0]["args"],
        json!({"title": "Call Anna", "amount": 1200})
    );
    assert_eq!(found["queue"][0]["owner"], "anna");
    // By owner, a page of one at a time reaching both.
    let first = review(&server, "owner=Anna&limit=1").await;
    assert_eq!(
        (ids(&first), &first["total"]),
        (vec![anna.as_str()], &json!(2))
    );
    let next = first["next"].as_str().expect("a next page");
    let second = review(&server, &format!("owner=anna&limit=1&after={next}")).await;
    assert_eq!(ids(&second), [invoice.as_str()]);
    assert!(second["next"].is_null(), "{second}");
    assert_eq!(
        review(&server, "arg=amount:1200&owner=anna").await["total"],
        2
    );
    // A time range of when they became unresolved: from Boris's on, before the invoice's.
    let all = review(&server, "").await;
    let since = |n: usize| {
        all["queue"][n]["since"]
            .as_str()
            .expect("a time")
            .to_owned()
    };
    let range = format!(
        "since={}&until={}",
        urlencoding(&since(1)),
        urlencoding(&since(2))
    );
    assert_eq!(ids(&review(&server, &range).await), [boris.as_str()]);

    // As of the log's head, the past queue answers the same searches.
    let head = server.log_head().await;
    let past = review(&server, &format!("as_of={head}&arg=title:Call%20Anna")).await;
    assert_eq!(
        (ids(&past), &past["total"]),
        (vec![anna.as_str()], &json!(1))
    );
    let past_range = review(&server, &format!("as_of={head}&{range}")).await;
    assert_eq!(ids(&past_range), [boris.as_str()]);

    // A bulk decision's filter is the same search: it would decide exactly Anna's two.
    let (status, dry) = server
        .post(
            "/v1/review/bulk",
            OPERATOR_TOKEN,
            &json!({"decision": "abandon", "note": "asked twice", "dry_run": true,
                "filter": {"owner": "anna", "arg": "amount:1200"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    let decided: Vec<&str> = dry["decided"]
        .as_array()
        .expect("decided")
        .iter()
        .map(|d| d["operation_id"].as_str().expect("an id"))
        .collect();
    assert_eq!(decided, [anna.as_str(), invoice.as_str()]);

    // Operations list their rows' owner and chosen arguments too.
    let (_, listed) = server
        .call(
            Method::GET,
            "/v1/operations?owner=boris&args=title",
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(
        listed["operations"][0]["args"],
        json!({"title": "Call Boris"}),
        "{listed}"
    );
    assert_eq!(listed["operations"][0]["owner"], "boris");

    // Bad input names the parameter and what to write.
    for (query, field) in [
        ("arg=title", "arg"),
        ("since=yesterday", "since"),
        ("until=2026-13-01", "until"),
        ("args=a,b,c,d,e,f,g,h,i", "args"),
    ] {
        let (status, refused) = server
            .call(
                Method::GET,
                &format!("/v1/review?{query}"),
                Some(OPERATOR_TOKEN),
                None,
            )
            .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{query}: {refused}"
        );
        assert!(
            refused["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(field)),
            "{query}: {refused}"
        );
    }
}

/// `text` with the characters a query string's value must not hold raw (`+` and `:` of a time).
fn urlencoding(text: &str) -> String {
    text.replace('+', "%2B").replace(':', "%3A")
}
