//! OAuth2 connectors end to end: a real `opledger serve` with the `salesforce-oauth2` preset
//! against the Salesforce emulator's token endpoint and API (`emulators/oauth.rs`).

use futures_util::future::join_all;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::apis::{accounts, preset_entry, shortened, Api};
use crate::emulators::oauth::{Dialect, Setup};
use crate::emulators::salesforce::{self, Salesforce};
use crate::emulators::zendesk::Zendesk;
use crate::emulators::{Emulator, Fault};
use crate::ledger::{Ledger, ACCOUNT, TENANT_TOKEN};
use crate::scenarios::{settle, until_created, HELD_MS};
use crate::support::Server;

const CLIENT_ID: &str = "3MVG9-consumer-key";
const CLIENT_SECRET: &str = "consumer-secret-0123456789";

async fn salesforce() -> Salesforce {
    let api = Salesforce::start(salesforce::Config {
        tokens: accounts(),
        label_field: "Opledger_Label__c".to_owned(),
    })
    .await;
    // Rotation on: each renewal issues a new refresh token and invalidates the old one.
    api.core().oauth.set_up(Setup {
        dialect: Dialect::Salesforce,
        client_id: CLIENT_ID.to_owned(),
        client_secret: CLIENT_SECRET.to_owned(),
        expires_in_s: None,
        rotates: true,
    });
    api
}

/// A ledger whose one connector is `source` (a preset or a file) at the Salesforce emulator,
/// its account authenticating with the OAuth2 client and the refresh token from the environment.
fn ledger(api: &Salesforce, source: &str, files: &[(&str, String)]) -> Ledger {
    oauth_ledger("salesforce", source, &api.running.base_url, files)
}

/// The same for any provider's emulator at `base_url`.
fn oauth_ledger(provider: &str, source: &str, base_url: &str, files: &[(&str, String)]) -> Ledger {
    let entry = preset_entry(provider, source, base_url);
    let ledger = Ledger::new(&entry, "unused", files);
    ledger.rewrite(
        "token = \"unused\"",
        "client_id_env = \"SF_CLIENT_ID\"\nclient_secret_env = \"SF_CLIENT_SECRET\"\nrefresh_token_env = \"SF_REFRESH_TOKEN\"",
    );
    ledger
}

/// The `salesforce-oauth2` preset as a file whose account waits `refused_wait_ms` after the
/// token endpoint refuses, so the endpoint is asked again within a test.
fn waiting_ledger(api: &Salesforce, refused_wait_ms: u64) -> Ledger {
    let wait = format!("grant = \"refresh_token\"\nrefused_wait_ms = {refused_wait_ms}\n");
    let document = shortened(
        "salesforce-oauth2",
        &[("grant = \"refresh_token\"\n", wait.as_str())],
    );
    ledger(
        api,
        "file = \"salesforce-oauth2.toml\"",
        &[("salesforce-oauth2.toml", document)],
    )
}

fn serve(ledger: &Ledger, refresh_token: &str) -> Server {
    Server::start_with_env(
        &["serve", "--config", &ledger.config.display().to_string()],
        ledger.dir.path(),
        &[
            ("SF_CLIENT_ID", CLIENT_ID),
            ("SF_CLIENT_SECRET", CLIENT_SECRET),
            ("SF_REFRESH_TOKEN", refresh_token),
        ],
    )
}

/// Records a case and starts its execution; returns the operation id.
async fn start(server: &Server, subject: &str) -> String {
    crate::specific::start(
        server,
        "salesforce",
        "upsert_case",
        json!({"Subject": subject}),
    )
    .await
}

/// Starts `count` cases at once and waits until each has settled; returns their views.
async fn burst(server: &Server, from: usize, count: usize) -> Vec<Value> {
    let subjects: Vec<String> = (from..from + count).map(|n| format!("Case {n}")).collect();
    let ids = join_all(subjects.iter().map(|subject| start(server, subject))).await;
    join_all(ids.iter().map(|id| settle(server, id))).await
}

/// The operation's view once its first attempt came back not sent (or it left `pending`).
async fn waiting(server: &Server, id: &str) -> Value {
    let started = std::time::Instant::now();
    loop {
        let (status, view) = server
            .call(
                Method::GET,
                &format!("/v1/operations/{id}"),
                Some(TENANT_TOKEN),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{view}");
        let moving = view["state"] == "pending" || view["state"] == "in_flight";
        if !moving || !view["last_error"].is_null() {
            return view;
        }
        assert!(started.elapsed() < crate::support::DEADLINE, "{view}");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

fn logs(ledger: &Ledger) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(ledger.dir.path()).expect("the ledger dir") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|ext| ext == "log") {
            text.push_str(&std::fs::read_to_string(path).unwrap_or_default());
        }
    }
    text
}

#[tokio::test]
async fn an_access_token_expiring_mid_burst_is_renewed_once_and_every_operation_succeeds_once() {
    let api = salesforce().await;
    let first_refresh = api.core().oauth.authorise("a");
    let ledger = ledger(&api, "preset = \"salesforce-oauth2\"", &[]);
    let server = serve(&ledger, &first_refresh);

    let settled = burst(&server, 0, 10).await;
    assert_eq!(
        api.core().oauth.requests(),
        1,
        "one token for the first burst"
    );
    // The org's session times out under the next burst: every send meets a 401 at once.
    api.core().oauth.expire_access_tokens();
    let later = burst(&server, 10, 20).await;
    for view in settled.iter().chain(&later) {
        assert_eq!(view["state"], "succeeded", "{view}");
    }
    assert_eq!(
        api.core().oauth.requests(),
        2,
        "one renewal per expiry, not one per operation"
    );
    let records = api.records("Case");
    assert_eq!(records.len(), 30, "every operation applied once");

    // The rotated refresh token was kept beside the ledger: a restart configured with the first
    // (consumed) refresh token still renews.
    drop(server);
    api.core().oauth.expire_access_tokens();
    let server = serve(&ledger, &first_refresh);
    let view = &burst(&server, 30, 1).await[0];
    assert_eq!(view["state"], "succeeded", "{view}");
    assert_eq!(api.records("Case").len(), 31);
    drop(server);
    let logs = logs(&ledger);
    assert!(
        !logs.contains(CLIENT_SECRET)
            && !logs.contains("refresh-a-")
            && !logs.contains("access-a-"),
        "no secret is logged"
    );
}

/// A refresh token the provider refuses (`invalid_grant`): the operations wait, saying which
/// account and what to do, nothing is sent with the stale access token, and once the
/// credentials work again (here: the admin reactivates the integration user, so the same refresh
/// token is accepted again) they proceed without a person. A refresh token replaced by a new
/// authorisation is a re-authorised account instead: its fingerprint differs, and the waiting
/// operations go to a person (design rule 4; the fingerprint's unit test).
#[tokio::test]
async fn a_refused_refresh_token_holds_operations_with_what_to_do_until_it_works_again() {
    let api = salesforce().await;
    let refresh = api.core().oauth.authorise("a");
    // A short wait after a refusal, so the endpoint is asked again within the test.
    let document = shortened(
        "salesforce-oauth2",
        &[(
            "grant = \"refresh_token\"\n",
            "grant = \"refresh_token\"\nrefused_wait_ms = 3000\n",
        )],
    );
    let ledger = ledger(
        &api,
        "file = \"salesforce-oauth2.toml\"",
        &[("salesforce-oauth2.toml", document)],
    );
    let server = serve(&ledger, &refresh);
    let first = start(&server, "Before").await;
    assert_eq!(settle(&server, &first).await["state"], "succeeded");

    // The admin deactivates the integration user: its session ends, its refresh token is refused.
    api.core().oauth.deactivate("a");
    // Five operations at once: those already on their way with the cached access token meet
    // the 401 (they could not know); one renewal is asked for and refused.
    let subjects: Vec<String> = (0..5).map(|n| format!("Call client {n}")).collect();
    let mut ids = join_all(subjects.iter().map(|subject| start(&server, subject))).await;
    // Once the refusal is known, nothing is sent with the stale token and the token endpoint is
    // not asked again by each operation: the next one waits without a request.
    let mut views = join_all(ids.iter().map(|id| waiting(&server, id))).await;
    let (refused, asked) = (api.core().oauth.refused(), api.core().oauth.requests());
    let late = start(&server, "Call the client later").await;
    views.push(waiting(&server, &late).await);
    ids.push(late);
    assert_eq!(
        api.core().oauth.refused(),
        refused,
        "nothing sent with a stale token"
    );
    assert_eq!(
        api.core().oauth.requests(),
        asked,
        "the refusal is remembered"
    );
    for view in &views {
        assert_eq!(view["state"], "pending", "it waits: {view}");
        let reason = view["last_error"].as_str().unwrap_or_default();
        assert!(
            reason.contains("account `main`")
                && reason.contains("invalid_grant: inactive user")
                && reason.contains("re-authorise"),
            "the reason names the account, the provider's word and what to do: {view}"
        );
    }
    assert_eq!(api.records("Case").len(), 1, "nothing new was created");

    api.core().oauth.reactivate("a");
    for view in join_all(ids.iter().map(|id| settle(&server, id))).await {
        assert_eq!(view["state"], "succeeded", "{view}");
    }
    assert_eq!(api.records("Case").len(), 7);
}

/// Credentials refused for longer than the retry budget lasts (the ledger here allows three
/// attempts): a refusal starts no attempt, so the operations wait — one token request per
/// account at each step, not one per operation, and not one request to the API — and once the
/// credentials work again every one succeeds once, none goes to a person.
#[tokio::test]
async fn credentials_refused_for_longer_than_the_retry_budget_hold_operations_without_using_attempts(
) {
    const REFUSED_WAIT_MS: u64 = 400;
    let api = salesforce().await;
    let refresh = api.core().oauth.authorise("a");
    let ledger = waiting_ledger(&api, REFUSED_WAIT_MS);
    let server = serve(&ledger, &refresh);
    let first = start(&server, "Before").await;
    assert_eq!(settle(&server, &first).await["state"], "succeeded");

    api.core().oauth.deactivate("a");
    // The first operation after it still holds the cached token and meets the 401: one attempt,
    // which it could not have known better than to make.
    let learner = start(&server, "Learns of it").await;
    waiting(&server, &learner).await;
    let (refused, asked) = (api.core().oauth.refused(), api.core().oauth.requests());
    let since = std::time::Instant::now();
    let subjects: Vec<String> = (0..5).map(|n| format!("Call client {n}")).collect();
    let held = join_all(subjects.iter().map(|subject| start(&server, subject))).await;
    // Several of the account's steps go by: more than the three attempts the ledger allows.
    let steps = 6;
    while api.core().oauth.requests() < asked + steps {
        assert!(
            since.elapsed() < crate::support::DEADLINE,
            "the token endpoint is asked again at each step"
        );
        for id in held.iter().chain([&learner]) {
            let view = waiting(&server, id).await;
            assert_eq!(view["state"], "pending", "it still waits: {view}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let elapsed_ms = u64::try_from(since.elapsed().as_millis()).expect("short");
    let asked_meanwhile = api.core().oauth.requests() - asked;
    assert!(
        asked_meanwhile <= elapsed_ms / REFUSED_WAIT_MS + 2,
        "{asked_meanwhile} token requests in {elapsed_ms} ms: one per step for the account, not one per operation"
    );
    assert_eq!(
        api.core().oauth.refused(),
        refused,
        "no request reached the API"
    );
    assert_eq!(api.records("Case").len(), 1, "nothing was created");
    for id in &held {
        let view = waiting(&server, id).await;
        assert_eq!(view["state"], "pending", "it waits: {view}");
        assert_eq!(view["attempts"], 0, "no attempt used up: {view}");
        let reason = view["last_error"].as_str().unwrap_or_default();
        assert!(
            reason.contains("account `main`")
                && reason.contains("invalid_grant: inactive user")
                && reason.contains("re-authorise"),
            "the reason names the account, the provider's word and what to do: {view}"
        );
    }

    api.core().oauth.reactivate("a");
    let all: Vec<&String> = held.iter().chain([&learner]).collect();
    for view in join_all(all.iter().map(|id| settle(&server, id))).await {
        assert_eq!(view["state"], "succeeded", "none went to a person: {view}");
    }
    assert_eq!(api.records("Case").len(), 7, "each applied once");
}

/// The types of an operation's events, in order, as `/v1/trace` shows them.
async fn event_types(server: &Server, id: &str) -> Vec<String> {
    let (status, traced) = server
        .call(
            Method::GET,
            &format!("/v1/trace/{id}"),
            Some(TENANT_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{traced}");
    traced["events"]
        .as_array()
        .expect("the events")
        .iter()
        .map(|event| event["type"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// An operation whose answer was lost just as its account's credentials stopped working stays
/// unknown for longer than its lookup budget (the ledger here allows two lookups): each due
/// lookup finds no token, asks nothing and counts no lookup, so nothing goes to a person or is
/// retried blind; once the credentials work again the first lookup finds the one object.
#[tokio::test]
async fn an_unknown_operation_outlasts_a_credentials_outage_longer_than_its_lookup_budget() {
    const REFUSED_WAIT_MS: u64 = 400;
    let api = salesforce().await;
    let refresh = api.core().oauth.authorise("a");
    let ledger = waiting_ledger(&api, REFUSED_WAIT_MS);
    ledger.rewrite("max_reconciliations = 30", "max_reconciliations = 2");
    let server = serve(&ledger, &refresh);
    let first = start(&server, "Before").await;
    assert_eq!(settle(&server, &first).await["state"], "succeeded");

    // Applied at once, its answer held past the request timeout: the outcome is unknown. The
    // integration user is deactivated while the answer is held, so every lookup meets it.
    api.fault(Fault::LateResponse { ms: HELD_MS }, 1);
    let id = start(&server, "Answer lost").await;
    until_created(&api, 2).await;
    api.core().oauth.deactivate("a");

    let since = std::time::Instant::now();
    let postponed = loop {
        let types = event_types(&server, &id).await;
        let postponed = types
            .iter()
            .filter(|kind| *kind == "LookupPostponed")
            .count();
        // Twice the lookups the budget allows, each at the end of the account's wait.
        if postponed >= 4 {
            break types;
        }
        assert!(
            since.elapsed() < crate::support::DEADLINE,
            "the lookups are put off at each of the account's steps: {types:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(
        !postponed.iter().any(|kind| kind == "ReconciliationRecorded"
            || kind == "RetryScheduled"
            || kind == "ReviewRequired"),
        "no lookup counted, no blind retry, no person: {postponed:?}"
    );
    let view = waiting(&server, &id).await;
    assert_eq!(view["state"], "unknown", "{view}");
    let reason = view["last_error"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("lookup waiting: account `main`")
            && reason.contains("invalid_grant: inactive user")
            && reason.contains("nothing was asked"),
        "the reason says the lookup waits for the account's token, and why: {view}"
    );

    api.core().oauth.reactivate("a");
    let settled = settle(&server, &id).await;
    assert_eq!(settled["state"], "succeeded", "{settled}");
    let created = api.created("a");
    assert_eq!(
        created.len(),
        2,
        "the lost answer's object, found: {created:?}"
    );
    assert_eq!(settled["external_id"], created[1].as_str(), "{settled}");
    let types = event_types(&server, &id).await;
    assert_eq!(
        types
            .iter()
            .filter(|kind| *kind == "AttemptStarted")
            .count(),
        1,
        "sent once: {types:?}"
    );
}

/// Runs `opledger connectors test` on the ledger's configuration with `refresh_token`, off the
/// test's runtime (which serves the emulator meanwhile).
async fn connectors_test(ledger: &Ledger, refresh_token: &str) -> (bool, String) {
    let config = ledger.config.clone();
    let refresh_token = refresh_token.to_owned();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_opledger"))
            .args(["connectors", "test", "--config"])
            .arg(&config)
            .env("SF_CLIENT_ID", CLIENT_ID)
            .env("SF_CLIENT_SECRET", CLIENT_SECRET)
            .env("SF_REFRESH_TOKEN", refresh_token)
            .output()
            .expect("opledger runs")
    })
    .await
    .expect("the command ran");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[tokio::test]
async fn connectors_test_says_which_account_works_and_what_the_token_endpoint_refused() {
    let api = salesforce().await;
    let refresh = api.core().oauth.authorise("a");
    let ledger = ledger(&api, "preset = \"salesforce-oauth2\"", &[]);
    let (passed, text) = connectors_test(&ledger, &refresh).await;
    assert!(passed, "{text}");
    assert!(
        text.contains("salesforce/main  works: an access token was issued and GET /services/data/v62.0/limits answered 200"),
        "{text}"
    );
    assert!(
        api.records("Case").is_empty() && api.records("Contact").is_empty(),
        "nothing is created"
    );

    api.core().oauth.deactivate("a");
    let (passed, text) = connectors_test(&ledger, &refresh).await;
    assert!(!passed, "a failing account fails the command: {text}");
    assert!(
        text.contains("salesforce/main  FAILS: account `main` has no access token: the token endpoint answered 400: invalid_grant: inactive user"),
        "{text}"
    );
    assert!(
        !text.contains(&refresh) && !text.contains(CLIENT_SECRET),
        "no secret shown: {text}"
    );
    assert!(
        !text.contains("asked again in"),
        "a probe asks once; a retry delay is `serve`'s to name: {text}"
    );
    assert_eq!(
        text.matches("inactive user").count(),
        1,
        "the refusal is said once, in the account's line, not again in a warning: {text}"
    );
}

/// Zendesk: access tokens with a lifetime (`expires_in`) and a refresh token rotated on every
/// renewal. A token is renewed before it expires, so no request goes out with an expired one;
/// a revoked grant holds the next operation with the provider's word.
#[tokio::test]
async fn a_zendesk_token_is_renewed_before_it_expires_and_a_revoked_grant_holds_operations() {
    let api = <Zendesk as Api>::start().await;
    api.core().oauth.set_up(Setup {
        dialect: Dialect::Zendesk,
        client_id: CLIENT_ID.to_owned(),
        client_secret: CLIENT_SECRET.to_owned(),
        expires_in_s: Some(2),
        rotates: true,
    });
    let refresh = api.core().oauth.authorise("a");
    let ledger = oauth_ledger(
        "zendesk",
        "preset = \"zendesk-oauth2\"",
        &api.running.base_url,
        &[],
    );
    let server = serve(&ledger, &refresh);
    let ticket = |title: &str| {
        json!({"provider": "zendesk", "account": ACCOUNT, "action": "create_ticket",
            "args": <Zendesk as Api>::args(title)})
    };
    let first = record_and_run(&server, &ticket("First")).await;
    assert_eq!(settle(&server, &first).await["state"], "succeeded");
    // The emulator's token lives 2 s; opledger renews it once half of that is left. Waiting
    // out the whole lifetime (real time: the emulator's clock runs beside a real server) means
    // a client that renewed only on a 401 would send the next ticket with a dead token.
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    let second = record_and_run(&server, &ticket("Second")).await;
    assert_eq!(settle(&server, &second).await["state"], "succeeded");
    assert_eq!(
        api.core().oauth.refused(),
        0,
        "no request with an expired token"
    );
    assert_eq!(
        api.core().oauth.requests(),
        2,
        "renewed once, with the rotated refresh token"
    );
    assert_eq!(api.created("a").len(), 2);

    api.core().oauth.revoke("a");
    let held = record_and_run(&server, &ticket("Third")).await;
    let view = waiting(&server, &held).await;
    assert_eq!(view["state"], "pending", "{view}");
    let reason = view["last_error"].as_str().unwrap_or_default();
    assert!(
        reason.contains("account `main`") && reason.contains("invalid_grant"),
        "{view}"
    );
    assert_eq!(api.created("a").len(), 2);
}

async fn record_and_run(server: &Server, body: &Value) -> String {
    let (status, recorded) = server
        .call(
            Method::POST,
            "/v1/operations",
            Some(TENANT_TOKEN),
            Some(body),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{recorded}");
    let id = recorded["operation_id"].as_str().expect("an id").to_owned();
    let (status, started) = server.execute(TENANT_TOKEN, &id, 0).await;
    assert!(status.is_success(), "{started}");
    id
}

/// HubSpot's OAuth2 form end to end: the refresh-token grant at `/oauth/v1/token`, access tokens
/// that live `expires_in` seconds, a refresh token that stays the same, and HubSpot's own error
/// body (`{"status":"BAD_REFRESH_TOKEN","message":…}`, not RFC 6749's) reaching the operator.
#[tokio::test]
async fn hubspots_oauth2_form_renews_its_token_and_names_hubspots_own_refusal() {
    use crate::apis::{HUBSPOT_LABEL_PROPERTY, LEDGER_SEARCH_LAG_MS};
    use crate::emulators::hubspot::HubSpot;
    let api = <HubSpot as Api>::start().await;
    api.core().oauth.set_up(Setup {
        dialect: Dialect::HubSpot,
        client_id: CLIENT_ID.to_owned(),
        client_secret: CLIENT_SECRET.to_owned(),
        expires_in_s: Some(1800),
        rotates: false,
    });
    let refresh = api.core().oauth.authorise("a");
    let lag = format!("lag_ms = {LEDGER_SEARCH_LAG_MS}");
    let wait = "grant = \"refresh_token\"\nrefused_wait_ms = 300\n";
    let text = shortened(
        "hubspot-oauth2",
        &[
            ("lag_ms = 30000", lag.as_str()),
            ("grant = \"refresh_token\"\n", wait),
        ],
    );
    let source = format!(
        "file = \"hubspot-oauth2.toml\"\nsettings = {{ label_property = \"{HUBSPOT_LABEL_PROPERTY}\" }}"
    );
    let ledger = oauth_ledger(
        "hubspot",
        &source,
        &api.running.base_url,
        &[("hubspot-oauth2.toml", text)],
    );
    let server = serve(&ledger, &refresh);
    let task = |title: &str| {
        json!({"provider": "hubspot", "account": ACCOUNT, "action": "create_task",
            "args": <HubSpot as Api>::args(title)})
    };
    let first = record_and_run(&server, &task("First")).await;
    assert_eq!(settle(&server, &first).await["state"], "succeeded");
    let second = record_and_run(&server, &task("Second")).await;
    assert_eq!(settle(&server, &second).await["state"], "succeeded");
    assert_eq!(api.core().oauth.requests(), 1, "one token for both");

    // The token is taken back before its lifetime ends: the 401 renews it once, with the same
    // refresh token (HubSpot does not rotate it).
    api.core().oauth.expire_access_tokens();
    let third = record_and_run(&server, &task("Third")).await;
    assert_eq!(settle(&server, &third).await["state"], "succeeded");
    assert_eq!(api.core().oauth.requests(), 2);

    // The portal's user is deactivated: HubSpot refuses the refresh token in its own words.
    api.core().oauth.deactivate("a");
    let held = record_and_run(&server, &task("Fourth")).await;
    let view = waiting(&server, &held).await;
    assert_eq!(view["state"], "pending", "{view}");
    let reason = view["last_error"].as_str().unwrap_or_default();
    assert!(
        reason.contains("account `main`")
            && reason.contains("BAD_REFRESH_TOKEN: missing or invalid refresh token")
            && reason.contains("re-authorise"),
        "HubSpot's own code and message, the account and what to do: {view}"
    );
    assert_eq!(api.created("a").len(), 3);
    api.core().oauth.reactivate("a");
    assert_eq!(settle(&server, &held).await["state"], "succeeded");
    assert_eq!(api.created("a").len(), 4, "each applied once");
}

/// The client credentials grant end to end (Salesforce's server-to-server flow): no refresh
/// token anywhere, the connected app's Run As user's access, a renewal after the session ends;
/// an app without a Run As user is refused with Salesforce's own words.
#[tokio::test]
async fn the_client_credentials_grant_gets_and_renews_a_token_without_any_refresh_token() {
    let api = salesforce().await;
    let document = shortened(
        "salesforce-oauth2",
        &[(
            "grant = \"refresh_token\"\n",
            "grant = \"client_credentials\"\nrefused_wait_ms = 300\n",
        )],
    );
    let entry = preset_entry(
        "salesforce",
        "file = \"salesforce-cc.toml\"",
        &api.running.base_url,
    );
    let ledger = Ledger::new(&entry, "unused", &[("salesforce-cc.toml", document)]);
    ledger.rewrite(
        "token = \"unused\"",
        "client_id_env = \"SF_CLIENT_ID\"\nclient_secret_env = \"SF_CLIENT_SECRET\"",
    );
    // The app has no Run As user yet.
    let server = serve(&ledger, "unused");
    let held = start(&server, "Before the Run As user").await;
    let view = waiting(&server, &held).await;
    assert_eq!(view["state"], "pending", "{view}");
    let reason = view["last_error"].as_str().unwrap_or_default();
    assert!(
        reason.contains("account `main`")
            && reason.contains("invalid_grant: no client credentials user enabled"),
        "{view}"
    );
    // That grant has no refresh token, and it recovers by itself once the provider grants again
    // (below, without a restart): the text says so and never asks for a refresh token.
    assert!(
        !reason.contains("refresh token") && reason.contains("go on by themselves"),
        "{reason}"
    );
    assert!(api.records("Case").is_empty());

    api.core().oauth.enable_client_credentials("a");
    assert_eq!(settle(&server, &held).await["state"], "succeeded");
    let asked = api.core().oauth.requests();
    api.core().oauth.expire_access_tokens();
    for view in burst(&server, 0, 5).await {
        assert_eq!(view["state"], "succeeded", "{view}");
    }
    assert_eq!(
        api.core().oauth.requests(),
        asked + 1,
        "one renewal for the burst"
    );
    assert_eq!(api.records("Case").len(), 6, "each applied once");
}
