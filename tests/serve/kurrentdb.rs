//! The same service with its ledger in KurrentDB (the protocol stand on loopback): the lifecycle
//! and a restart that finds everything where it was.

use opledger_kurrentdb_stand::KurrentDbStand;
use reqwest::{Method, StatusCode};

use crate::support::{Harness, TENANT_A_TOKEN};

// Multi-threaded: the KurrentDB stand lives on this runtime and must answer while the test
// thread waits for the child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_on_kurrentdb_records_executes_and_finds_it_all_again_after_a_restart() {
    let kurrentdb = KurrentDbStand::start()
        .await
        .expect("the KurrentDB stand starts");
    let harness = Harness::with_store("", Some(kurrentdb.connection_string())).await;
    let server = harness.serve();
    let (status, recorded) = server
        .record(TENANT_A_TOKEN, "crm", "via KurrentDB", Some("kdb-call-1"))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    let id = recorded["operation_id"].as_str().expect("id").to_owned();
    let (_, executed) = server.execute(TENANT_A_TOKEN, &id, 5_000).await;
    assert_eq!(executed["state"], "succeeded", "{executed}");
    assert_eq!(harness.objects().await.len(), 1);
    let (code, _) = server.terminate();
    assert_eq!(code, Some(0));

    let server = harness.serve();
    let (status, again) = server
        .record(TENANT_A_TOKEN, "crm", "via KurrentDB", Some("kdb-call-1"))
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a redelivery after the restart: {again}"
    );
    assert_eq!(again["operation_id"], id.as_str());
    assert_eq!(again["state"], "succeeded");
    let (_, listed) = server
        .call(
            Method::GET,
            "/v1/operations?state=succeeded",
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(
        listed["operations"][0]["operation_id"],
        id.as_str(),
        "{listed}"
    );
    assert_eq!(harness.objects().await.len(), 1);
}
