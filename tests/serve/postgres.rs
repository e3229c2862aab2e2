//! The service with its ledger in PostgreSQL (a database of its own on the binary's private
//! cluster, `tests/postgres_server`): a start refused with a sentence when the credentials are
//! wrong, `PGPASSWORD` instead of a password in the file, and a database that goes away and
//! comes back while the service runs.

use std::time::Instant;

use reqwest::{Method, StatusCode};

use crate::postgres_server::proxy::{Mode, Proxy};
use crate::postgres_server::{self, server};
use crate::support::{Harness, Server, DEADLINE, TENANT_A_TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_a_wrong_database_password_refuses_to_start_and_says_which() {
    let database = server().database();
    let url = format!(
        "postgres://{}:not-the-password@127.0.0.1:{}/{database}",
        postgres_server::USER,
        server().port
    );
    let harness = Harness::with_store("", Some(url)).await;
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["serve", "--config"])
        .arg(&harness.config)
        .env_remove("PGPASSWORD")
        .output()
        .expect("runs");
    assert_ne!(output.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refused the credentials of user `postgres`")
            && stderr.contains("PGPASSWORD")
            && !stderr.contains("not-the-password"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_database_goes_away_answers_503_store_unavailable_and_recovers() {
    let database = server().database();
    let proxy = Proxy::start(server().port).await;
    // The password from the environment, not the file.
    let url = proxy
        .url(&database)
        .replace(&format!(":{}@", postgres_server::PASSWORD), "@");
    let harness = Harness::with_store("", Some(url)).await;
    let server = Server::start_with_env(
        &["serve", "--config", &harness.config.display().to_string()],
        harness.dir.path(),
        &[("PGPASSWORD", postgres_server::PASSWORD)],
    );
    let (status, before) = server.record(TENANT_A_TOKEN, "crm", "before", None).await;
    assert_eq!(status, StatusCode::CREATED, "{before}");

    proxy.set(Mode::Gone);
    // The first request may meet the writer's connection still open: its COMMIT goes out with
    // its statements, so a connection breaking then leaves the outcome unknown (the server
    // cannot be asked again). Either way a 503, and nothing written.
    let (status, first) = server
        .record(TENANT_A_TOKEN, "crm", "as it goes", None)
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{first}");
    assert!(
        ["store_unavailable", "outcome_unknown"]
            .contains(&first["error"]["code"].as_str().unwrap_or_default()),
        "{first}"
    );
    // Now no connection can be opened: refused before anything is sent.
    let (status, refused) = server
        .record(TENANT_A_TOKEN, "crm", "while gone", None)
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    assert_eq!(refused["error"]["code"], "store_unavailable", "{refused}");

    proxy.set(Mode::Pass);
    let started = Instant::now();
    let after = loop {
        let (status, body) = server.record(TENANT_A_TOKEN, "crm", "after", None).await;
        if status == StatusCode::CREATED {
            break body;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the service never recovered: {status} {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    // Nothing of the refused request was written: the ledger holds the two intents' streams.
    let streams = postgres_server::server().sql(&database, "SELECT count(*) FROM opledger.streams");
    assert_eq!(streams, "2", "before {before}, after {after}");
    let (status, _) = server
        .call(
            Method::GET,
            &format!(
                "/v1/operations/{}",
                after["operation_id"].as_str().expect("id")
            ),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_fails_quickly_while_the_database_path_is_silent_and_livez_stays_200() {
    let database = server().database();
    let proxy = Proxy::start(server().port).await;
    let harness = Harness::with_store("", Some(proxy.url(&database))).await;
    let server = harness.serve();
    let (status, ready) = server.call(Method::GET, "/readyz", None, None).await;
    assert_eq!(status, StatusCode::OK, "{ready}");

    proxy.set(Mode::Silent);
    let started = Instant::now();
    let (status, not_ready) = server.call(Method::GET, "/readyz", None, None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{not_ready}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "the probe took {:?}",
        started.elapsed()
    );
    assert!(
        not_ready["reasons"][0]
            .as_str()
            .unwrap_or_default()
            .starts_with("store:"),
        "{not_ready}"
    );
    let (status, _) = server.call(Method::GET, "/livez", None, None).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a silent database is no reason to restart"
    );

    proxy.set(Mode::Pass);
    let started = Instant::now();
    loop {
        let (status, body) = server.call(Method::GET, "/readyz", None, None).await;
        if status == StatusCode::OK {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "never ready again: {body}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_instance_id_names_the_instance_to_postgresql_and_in_metrics() {
    let database = server().database();
    let harness = Harness::with_store("", Some(server().url(&database))).await;
    let config = harness.instance_config(
        1,
        &[(
            "listen = \"127.0.0.1:0\"",
            "instance_id = \"east-1\"\nlisten = \"127.0.0.1:0\"",
        )],
    );
    let instance = harness.serve_with(&config);
    let connections = postgres_server::server().sql(
        &database,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'opledger east-1'",
    );
    assert_ne!(connections, "0", "PostgreSQL sees the instance by name");
    let response = reqwest::get(format!("{}/metrics", instance.base))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("a body");
    assert!(
        response.contains("opledger_instance_info{instance_id=\"east-1\"} 1"),
        "{response}"
    );
}
