//! The audit and operator commands end to end: the real `opledger` binary against a real SQLite
//! ledger written in a temporary directory by the library (`Ledger` over `SqliteStore`), with
//! operations driven into several states by commands, no provider involved.
//!
//! What is checked: `ops list` filters (table and JSON), `ops show` and `status`, `trace` from an
//! attempt id, a source id and an external id, the review queue and a person's decision, `tail`'s
//! positions and resumption, `replay --verify`, that `replay` never replaces views another process
//! has open, and that bad input exits 2 naming the flag.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Output, Stdio};
use std::time::{Duration, Instant};

use opledger_domain::app::{IntentRequest, Ledger};
use opledger_domain::command::Command;
use opledger_domain::contract::{
    Deduplication, LookupSupport, ProviderCapabilities, RetryPolicy, SendBinding,
};
use opledger_domain::event::IntentRecorded;
use opledger_domain::ids::{AttemptId, ExternalObjectId, OperationId, WorkerId};
use opledger_domain::ports::IdSource;
use opledger_readmodel::ReadModelStore;
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_store::SqliteStore;
use serde_json::{json, Value};
use tempfile::TempDir;

/// Longer than any healthy run of one command takes; a command still running then has hung.
const COMMAND_DEADLINE: Duration = Duration::from_secs(60);
/// Events the fixture writes: 3 + 4 + 1 + 1 + 3.
const FIXTURE_EVENTS: usize = 12;

/// A ledger with one operation in each of several states.
struct Fixture {
    _dir: TempDir,
    db: PathBuf,
    succeeded: OperationId,
    succeeded_attempt: AttemptId,
    review: OperationId,
    review_attempt: AttemptId,
    pending: OperationId,
    awaiting: OperationId,
    rejected: OperationId,
}

type SqliteLedger = Ledger<SqliteStore, SystemClock, RandomIds>;

async fn record(
    ledger: &SqliteLedger,
    tenant: &str,
    source: &str,
    requires_approval: bool,
) -> IntentRecorded {
    ledger
        .record_intent(IntentRequest {
            tenant: tenant.into(),
            owner: None,
            provider: "crm".into(),
            account: "acct-1".into(),
            credential_fingerprint: "fp-1".into(),
            action: "create_task".into(),
            args: json!({"title": format!("task for {source}")}),
            source_id: Some(source.into()),
            requires_approval,
        })
        .await
        .expect("the intent is recorded")
        .intent()
        .clone()
}

/// What a send of `intent` is bound to, as the engine would build it.
fn binding_of(intent: &IntentRecorded) -> SendBinding {
    SendBinding {
        account: intent.account.clone(),
        credential_fingerprint: intent.credential_fingerprint.clone(),
        args_hash: intent.args_hash.clone(),
    }
}

/// A provider without deduplication and with a consistent lookup.
fn no_dedup_consistent_lookup() -> ProviderCapabilities {
    ProviderCapabilities {
        deduplication: Deduplication::None,
        lookup: LookupSupport::Consistent,
    }
}

async fn start(ledger: &SqliteLedger, intent: &IntentRecorded) -> AttemptId {
    let attempt_id = RandomIds.new_attempt_id();
    let command = Command::StartAttempt {
        request: None,
        budget_wait: None,
        attempt_id,
        worker: WorkerId::new("worker-1").expect("a valid worker id"),
        lease_ms: 30_000,
        binding: binding_of(intent),
        capabilities: no_dedup_consistent_lookup(),
        policy: RetryPolicy::default(),
    };
    execute(ledger, intent, command).await;
    attempt_id
}

async fn execute(ledger: &SqliteLedger, intent: &IntentRecorded, command: Command) {
    if let Err(error) = ledger.execute(intent.operation_id, &command).await {
        panic!("{} on {}: {error}", command.name(), intent.operation_id);
    }
}

/// Opens the ledger file at `db` (creating it), runs `work` on it, and closes it, so the file is
/// whole before a command reads it.
fn on_ledger<T>(db: &Path, work: impl AsyncFnOnce(&SqliteLedger) -> T) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let store = SqliteStore::open(db).await.expect("the ledger opens");
        let ledger = Ledger::new(store, SystemClock, RandomIds);
        let result = work(&ledger).await;
        ledger
            .store()
            .clone()
            .close()
            .await
            .expect("the ledger closes");
        result
    })
}

impl Fixture {
    fn build() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let db = dir.path().join("ledger.db");
        let (succeeded, succeeded_attempt, review, review_attempt, pending, awaiting, rejected) =
            on_ledger(&db, async |ledger| {
                let done = record(ledger, "acme", "src-succeeded", false).await;
                let done_attempt = start(ledger, &done).await;
                let success = Command::RecordSuccess {
                    attempt_id: done_attempt,
                    external_id: ExternalObjectId::new("obj-731").expect("a valid id"),
                    provider_request_id: None,
                };
                execute(ledger, &done, success).await;

                let review = record(ledger, "acme", "src-review", false).await;
                let review_attempt = start(ledger, &review).await;
                let unknown = Command::RecordUnknown {
                    check_not_before: None,
                    attempt_id: review_attempt,
                    error: "read timeout after 10 s".into(),
                };
                execute(ledger, &review, unknown).await;
                let hand_over = Command::RequireReview {
                    reason: "no evidence and no safe retry".into(),
                    evidence: "search by label found nothing".into(),
                };
                execute(ledger, &review, hand_over).await;

                let pending = record(ledger, "globex", "src-pending", false).await;
                let awaiting = record(ledger, "globex", "src-awaiting", true).await;

                let refused = record(ledger, "acme", "src-rejected", false).await;
                let refused_attempt = start(ledger, &refused).await;
                let rejection = Command::RecordRejection {
                    attempt_id: refused_attempt,
                    code: "422".into(),
                    message: "title too long".into(),
                };
                execute(ledger, &refused, rejection).await;
                (
                    done.operation_id,
                    done_attempt,
                    review.operation_id,
                    review_attempt,
                    pending.operation_id,
                    awaiting.operation_id,
                    refused.operation_id,
                )
            });
        Self {
            _dir: dir,
            db,
            succeeded,
            succeeded_attempt,
            review,
            review_attempt,
            pending,
            awaiting,
            rejected,
        }
    }

    /// A ledger file with a single intent, in its own temporary directory (removed when the
    /// returned handle is dropped).
    fn build_with_one_intent() -> (TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let db = dir.path().join("short.db");
        on_ledger(&db, async |ledger| {
            record(ledger, "acme", "src-short", false).await;
        });
        (dir, db)
    }

    fn db(&self) -> &str {
        self.db.to_str().expect("a UTF-8 path")
    }

    /// Runs `opledger <args> --db <ledger>` and waits for it, failing the test if it hangs.
    fn run(&self, args: &[&str]) -> Output {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--db", self.db()]);
        opledger(&all)
    }
}

fn opledger(args: &[&str]) -> Output {
    let mut child = Process::new(env!("CARGO_BIN_EXE_opledger"))
        .args(args)
        .env_remove("OPLEDGER_DB")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the opledger binary starts");
    // Drain both pipes on threads, so a chatty child never blocks on a full pipe.
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let out_thread = std::thread::spawn(move || {
        let mut buffer = Vec::new();
        out.read_to_end(&mut buffer).map(|_| buffer)
    });
    let err_thread = std::thread::spawn(move || {
        let mut buffer = Vec::new();
        err.read_to_end(&mut buffer).map(|_| buffer)
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child can be waited for") {
            break status;
        }
        if started.elapsed() > COMMAND_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`opledger {}` ran past {COMMAND_DEADLINE:?}",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: out_thread
            .join()
            .expect("the stdout reader")
            .expect("stdout is read"),
        stderr: err_thread
            .join()
            .expect("the stderr reader")
            .expect("stderr is read"),
    }
}

/// Runs `opledger <args> --db <db> --views <views>`: a ledger queried through chosen views.
fn run_with_views(args: &[&str], db: &Path, views: &Path) -> Output {
    let mut all = args.to_vec();
    all.extend([
        "--db",
        db.to_str().expect("a UTF-8 path"),
        "--read-models",
        views.to_str().expect("a UTF-8 path"),
    ]);
    opledger(&all)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn succeeded(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        stdout(output),
        stderr(output)
    );
    stdout(output)
}

fn json_of(output: &Output) -> Value {
    serde_json::from_str(&succeeded(output)).expect("the output is JSON")
}

/// The operation ids of an `ops list --json` answer, in order.
fn listed(output: &Output) -> Vec<String> {
    json_of(output)["operations"]
        .as_array()
        .expect("an operations array")
        .iter()
        .map(|row| row["operation_id"].as_str().expect("an id").to_owned())
        .collect()
}

/// The leading global position of every line.
fn positions(text: &str) -> Vec<u64> {
    text.lines()
        .map(|line| {
            line.split_whitespace()
                .next()
                .and_then(|first| first.parse().ok())
                .unwrap_or_else(|| panic!("a line without a leading position: {line}"))
        })
        .collect()
}

#[test]
fn ops_list_filters_by_state_and_tenant_as_a_table_and_as_json() {
    let fixture = Fixture::build();

    let all = listed(&fixture.run(&["ops", "list", "--json"]));
    assert_eq!(all.len(), 5, "{all:?}");

    let review = listed(&fixture.run(&["ops", "list", "--state", "needs_review", "--json"]));
    assert_eq!(review, vec![fixture.review.to_string()]);

    let globex = listed(&fixture.run(&["ops", "list", "--tenant", "globex", "--json"]));
    assert_eq!(
        globex,
        vec![fixture.pending.to_string(), fixture.awaiting.to_string()]
    );

    let both = listed(&fixture.run(&[
        "ops", "list", "--tenant", "acme", "--state", "rejected", "--json",
    ]));
    assert_eq!(both, vec![fixture.rejected.to_string()]);

    let old = listed(&fixture.run(&["ops", "list", "--older-than", "1d", "--json"]));
    assert!(old.is_empty(), "nothing was recorded a day ago: {old:?}");

    let table = succeeded(&fixture.run(&["ops", "list", "--state", "succeeded"]));
    assert!(table.starts_with("OPERATION"), "{table}");
    assert!(table.contains(&fixture.succeeded.to_string()), "{table}");
    assert!(table.contains("obj-731"), "{table}");
    assert!(!table.contains(&fixture.review.to_string()), "{table}");
    assert!(table.contains("1 operation(s)"), "{table}");

    // The default views file sits next to the ledger and was created on first use.
    assert!(PathBuf::from(format!("{}.views", fixture.db())).exists());
}

#[test]
fn ops_list_as_of_each_position_lists_what_the_ledger_held_then() {
    let fixture = Fixture::build();
    let states_at = |as_of: &str, extra: &[&str]| -> Vec<(String, String)> {
        let mut args = vec!["ops", "list", "--json", "--as-of", as_of];
        args.extend_from_slice(extra);
        json_of(&fixture.run(&args))["operations"]
            .as_array()
            .expect("rows")
            .iter()
            .map(|row| {
                (
                    row["operation_id"].as_str().expect("an id").to_owned(),
                    row["state"].as_str().expect("a state").to_owned(),
                )
            })
            .collect()
    };
    let review = fixture.review.to_string();
    let mut counts = Vec::new();
    let mut review_states = Vec::new();
    for position in 1..=12 {
        let rows = states_at(&position.to_string(), &[]);
        counts.push(rows.len());
        if let Some((_, state)) = rows.iter().find(|(id, _)| *id == review) {
            review_states.push(state.clone());
        }
    }
    assert!(counts.is_sorted(), "operations only ever join: {counts:?}");
    assert_eq!(counts.first(), Some(&1), "{counts:?}");
    review_states.dedup();
    assert_eq!(
        review_states,
        ["pending", "in_flight", "unknown", "needs_review"],
        "the operation in review, position by position"
    );
    // At the head, the listing now.
    let now: Vec<(String, String)> = json_of(&fixture.run(&["ops", "list", "--json"]))
        ["operations"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|row| {
            (
                row["operation_id"].as_str().expect("an id").to_owned(),
                row["state"].as_str().expect("a state").to_owned(),
            )
        })
        .collect();
    assert_eq!(states_at("12", &[]), now);
    assert_eq!(states_at("1000", &["--tenant", "globex"]).len(), 2);
    assert!(states_at("3", &["--tenant", "globex"]).is_empty());

    let refused = fixture.run(&["ops", "list", "--as-of", "yesterday"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("--as-of"), "{}", stderr(&refused));
}

#[test]
fn ops_show_and_status_print_the_sentence_and_the_timeline() {
    let fixture = Fixture::build();
    let id = fixture.succeeded.to_string();
    for command in [&["ops", "show"][..], &["status"][..]] {
        let mut args = command.to_vec();
        args.push(&id);
        let text = succeeded(&fixture.run(&args));
        assert!(text.contains("state           succeeded"), "{text}");
        assert!(text.contains("Done: the system confirmed"), "{text}");
        assert!(text.contains("object obj-731"), "{text}");
        for event in ["IntentRecorded", "AttemptStarted", "AttemptSucceeded"] {
            assert!(text.contains(event), "{event} missing:\n{text}");
        }
    }
    // `--json` is the API's operation object: its state, object and sentence.
    let json = json_of(&fixture.run(&["ops", "show", &id, "--json"]));
    assert_eq!(json["state"], "succeeded", "{json}");
    assert_eq!(json["external_id"], "obj-731", "{json}");
    assert!(
        json["message"]
            .as_str()
            .is_some_and(|s| s.contains("obj-731")),
        "{json}"
    );
}

#[test]
fn trace_finds_the_operation_from_an_attempt_id_a_source_id_and_an_external_id() {
    let fixture = Fixture::build();

    let from_attempt = succeeded(&fixture.run(&["trace", &fixture.review_attempt.to_string()]));
    assert!(
        from_attempt.contains("matched         attempt_id"),
        "{from_attempt}"
    );
    assert!(
        from_attempt.contains(&format!("operation_id    {}", fixture.review)),
        "{from_attempt}"
    );
    for event in [
        "IntentRecorded",
        "AttemptStarted",
        "OutcomeUnknown",
        "ReviewRequired",
    ] {
        assert!(from_attempt.contains(event), "{event}:\n{from_attempt}");
    }

    let from_source = json_of(&fixture.run(&["trace", "src-succeeded", "--json"]));
    assert_eq!(from_source["matched"]["link"], "source_id");
    assert_eq!(from_source["operation_id"], fixture.succeeded.to_string());

    let from_external = json_of(&fixture.run(&["trace", "obj-731", "--json"]));
    assert_eq!(from_external["matched"]["link"], "external_id");
    assert_eq!(from_external["operation_id"], fixture.succeeded.to_string());

    let from_attempt_of_success =
        json_of(&fixture.run(&["trace", &fixture.succeeded_attempt.to_string(), "--json"]));
    assert_eq!(from_attempt_of_success["matched"]["link"], "attempt_id");

    let unknown = fixture.run(&["trace", "no-such-id"]);
    assert_eq!(unknown.status.code(), Some(3), "{}", stderr(&unknown));
    assert!(stderr(&unknown).contains("nothing in the ledger matches `no-such-id`"));
}

#[test]
fn review_list_shows_the_operation_in_review_with_its_reason_and_evidence() {
    let fixture = Fixture::build();
    let table = succeeded(&fixture.run(&["review", "list"]));
    assert!(table.contains(&fixture.review.to_string()), "{table}");
    assert!(table.contains("needs_review"), "{table}");
    assert!(table.contains("no evidence and no safe retry"), "{table}");
    assert!(table.contains("search by label found nothing"), "{table}");

    let json = json_of(&fixture.run(&["review", "list", "--json"]));
    let queue = json["queue"].as_array().expect("a queue");
    assert_eq!(queue.len(), 1, "{json}");
    assert_eq!(queue[0]["operation_id"], fixture.review.to_string());
    assert_eq!(queue[0]["reason"], "no evidence and no safe retry");
    assert_eq!(queue[0]["attempts"], 1);

    let shown = succeeded(&fixture.run(&["review", "show", &fixture.review.to_string()]));
    assert!(shown.contains("handed to a person"), "{shown}");
    assert!(shown.contains("read timeout after 10 s"), "{shown}");
}

#[test]
fn review_resolve_abandon_records_the_decision_and_a_second_resolve_is_refused() {
    let fixture = Fixture::build();
    let id = fixture.review.to_string();
    let resolve = [
        "review",
        "resolve",
        &id,
        "--reviewer",
        "anna",
        "--abandon",
        "--note",
        "checked the CRM: nothing there",
    ];
    let first = succeeded(&fixture.run(&resolve));
    assert!(first.contains("ReviewResolved"), "{first}");
    assert!(first.contains("state           abandoned"), "{first}");

    let shown = succeeded(&fixture.run(&["ops", "show", &id]));
    assert!(shown.contains("ReviewResolved"), "{shown}");
    assert!(
        shown.contains("anna (as the local account ") && shown.contains(") decided: abandoned"),
        "the decision names who wrote it and the account that made it: {shown}"
    );

    // No token on the file's host: the decision names the account that ran the command.
    let export = tempfile::NamedTempFile::new().expect("a file for the export");
    let out = export.path().to_str().expect("UTF-8").to_owned();
    succeeded(&fixture.run(&["export", "--out", &out]));
    let decided = std::fs::read_to_string(&out)
        .expect("the export")
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|event| event["type"] == "ReviewResolved")
        .expect("the decision is exported");
    let data = match &decided["data"] {
        serde_json::Value::String(text) => serde_json::from_str(text).expect("the event's data"),
        object => object.clone(),
    };
    assert_eq!(data["principal"]["kind"], "local", "{decided}");
    assert!(
        data["principal"]["name"]
            .as_str()
            .is_some_and(|name| !name.is_empty()),
        "{decided}"
    );

    let again = fixture.run(&resolve);
    assert_eq!(again.status.code(), Some(3), "{}", stderr(&again));
    assert!(stderr(&again).contains("abandoned"), "{}", stderr(&again));

    // The queue no longer holds it.
    let queue = json_of(&fixture.run(&["review", "list", "--json"]));
    assert_eq!(queue["queue"].as_array().map(Vec::len), Some(0), "{queue}");

    // A retry says who sends it, since this command sends nothing.
    let not_in_review = fixture.run(&[
        "review",
        "resolve",
        &fixture.pending.to_string(),
        "--reviewer",
        "anna",
        "--retry",
        "--note",
        "try again",
    ]);
    assert_eq!(not_in_review.status.code(), Some(3));
}

#[test]
fn tail_prints_positions_and_resumes_from_the_last_one_without_repeats() {
    let fixture = Fixture::build();
    let first = succeeded(&fixture.run(&["tail", "--from", "0", "--type", "all", "--limit", "5"]));
    let first_positions = positions(&first);
    assert_eq!(first_positions, vec![1, 2, 3, 4, 5], "{first}");
    let last = first_positions[4].to_string();
    let rest_count = (FIXTURE_EVENTS - 5).to_string();
    let rest = succeeded(&fixture.run(&[
        "tail",
        "--from",
        &last,
        "--type",
        "all",
        "--limit",
        &rest_count,
    ]));
    let rest_positions = positions(&rest);
    assert_eq!(rest_positions, (6..=12).collect::<Vec<u64>>(), "{rest}");

    // By default only outcomes: the first is the success at position 3.
    let outcomes = succeeded(&fixture.run(&["tail", "--limit", "3"]));
    let lines: Vec<&str> = outcomes.lines().collect();
    assert!(
        lines[0].starts_with("3 ") && lines[0].contains("succeeded"),
        "{outcomes}"
    );
    assert!(lines[1].contains("unknown"), "{outcomes}");
    assert!(lines[2].contains("needs_review"), "{outcomes}");

    let json = succeeded(&fixture.run(&[
        "tail", "--from", "0", "--type", "rejected", "--limit", "1", "--json",
    ]));
    let event: Value = serde_json::from_str(json.trim()).expect("a JSON line");
    assert_eq!(event["type"], "rejected");
    assert_eq!(event["position"], 12);
    assert_eq!(event["operation_id"], fixture.rejected.to_string());
}

#[test]
fn replay_verify_finds_no_differences_in_untouched_views_and_replay_replaces_them() {
    let fixture = Fixture::build();
    let views = fixture.db.with_extension("db.views");
    succeeded(&fixture.run(&["ops", "list"]));
    assert!(views.exists());

    let verified = succeeded(&fixture.run(&["replay", "--verify"]));
    assert!(
        verified.contains(&format!("replayed {FIXTURE_EVENTS} events in")),
        "{verified}"
    );
    assert!(verified.contains("events/s"), "{verified}");
    assert!(verified.contains("verified"), "{verified}");

    let replaced = succeeded(&fixture.run(&["replay"]));
    assert!(replaced.contains("replaced"), "{replaced}");
    let leftovers: Vec<_> = std::fs::read_dir(fixture.db.parent().expect("a directory"))
        .expect("the directory lists")
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("replay"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert_eq!(
        listed(&fixture.run(&["ops", "list", "--json"])).len(),
        5,
        "the replaced views answer queries"
    );
    let again = json_of(&fixture.run(&["replay", "--verify", "--json"]));
    assert_eq!(again["differences"].as_array().map(Vec::len), Some(0));
}

#[test]
fn replay_never_replaces_views_another_process_has_open_and_does_once_it_closes() {
    let fixture = Fixture::build();
    succeeded(&fixture.run(&["ops", "list"]));
    let views = fixture.db.with_extension("db.views");
    // This test process is the other process: a reader with the views open, as a worker or a
    // query would have them.
    let reader = ReadModelStore::open(&views).expect("the views open");
    let before = reader.checkpoint().expect("a checkpoint");
    let output = fixture.run(&["replay"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("is open in another process"),
        "{}",
        stderr(&output)
    );
    assert_eq!(reader.checkpoint().expect("still readable"), before);
    drop(reader);
    let replaced = succeeded(&fixture.run(&["replay"]));
    assert!(replaced.contains("replaced"), "{replaced}");
    assert_eq!(
        listed(&fixture.run(&["ops", "list", "--json"])).len(),
        5,
        "the replaced views answer queries"
    );
}

#[test]
fn bad_inputs_exit_2_with_a_message_naming_the_flag() {
    let fixture = Fixture::build();
    let id = fixture.review.to_string();
    let cases: [(&[&str], &str); 7] = [
        (&["ops", "list", "--state", "done"], "--state"),
        (
            &["ops", "list", "--older-than", "10 minutes"],
            "--older-than",
        ),
        (&["ops", "list", "--older-than", "-3d"], "--older-than"),
        (&["ops", "list", "--limit", "0"], "--limit"),
        (&["ops", "show", "not-a-uuid"], "operation_id"),
        (&["tail", "--type", "finished", "--limit", "1"], "--type"),
        (
            &[
                "review",
                "resolve",
                &id,
                "--reviewer",
                "anna",
                "--confirm",
                "",
                "--note",
                "x",
            ],
            "--confirm",
        ),
    ];
    for (args, flag) in cases {
        let output = fixture.run(args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(flag),
            "{args:?} does not name {flag}: {}",
            stderr(&output)
        );
    }
    // Bad input creates no views file.
    assert!(!Path::new(&format!("{}.views", fixture.db())).exists());
}

#[test]
fn replay_verify_reports_a_table_that_differs_and_exits_1() {
    let fixture = Fixture::build();
    succeeded(&fixture.run(&["ops", "list"]));
    let views = PathBuf::from(format!("{}.views", fixture.db()));
    let connection = rusqlite::Connection::open(&views).expect("the views open");
    let removed = connection
        .execute(
            "DELETE FROM operations WHERE operation_id = ?1",
            [fixture.pending.to_string()],
        )
        .expect("a row is removed");
    assert_eq!(removed, 1);
    drop(connection);

    let output = fixture.run(&["replay", "--verify"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(
        text.contains("table operations: live 4 rows, replayed 5 rows"),
        "{text}"
    );
    assert!(stderr(&output).contains("differ"), "{}", stderr(&output));
}

#[test]
fn replay_verify_json_says_not_verified_beside_its_differences_and_carries_the_error() {
    let fixture = Fixture::build();
    succeeded(&fixture.run(&["ops", "list"]));
    let clean = json_of(&fixture.run(&["replay", "--verify", "--json"]));
    assert_eq!(clean["verified"], true, "{clean}");
    assert_eq!(clean["differences"], json!([]));
    assert!(clean.get("error").is_none(), "{clean}");

    let views = PathBuf::from(format!("{}.views", fixture.db()));
    let connection = rusqlite::Connection::open(&views).expect("the views open");
    connection
        .execute(
            "DELETE FROM operations WHERE operation_id = ?1",
            [fixture.pending.to_string()],
        )
        .expect("a row is removed");
    drop(connection);
    let output = fixture.run(&["replay", "--verify", "--json"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("one JSON object ({error}): {}", stdout(&output)));
    assert_eq!(report["verified"], false, "{report}");
    assert_eq!(report["differences"][0]["table"], "operations", "{report}");
    assert_eq!(report["error"]["code"], "read_models_differ", "{report}");
}

#[test]
fn tail_reports_a_lookup_that_finds_a_second_object_as_a_duplicate_not_a_second_success() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("ledger.db");
    on_ledger(&db, async |ledger| {
        let intent = record(ledger, "acme", "src-dup", false).await;
        let attempt_id = start(ledger, &intent).await;
        let success = Command::RecordSuccess {
            attempt_id,
            external_id: ExternalObjectId::new("obj-1").expect("a valid id"),
            provider_request_id: None,
        };
        execute(ledger, &intent, success).await;
        let second_object = Command::RecordReconciliation {
            duplicates: Vec::new(),
            result: opledger_domain::event::ReconciliationResult::Found {
                external_id: ExternalObjectId::new("obj-2").expect("a valid id"),
                account: intent.account.clone(),
            },
            evidence: "search found obj-2 with this label".into(),
            binding: binding_of(&intent),
            capabilities: no_dedup_consistent_lookup(),
            policy: RetryPolicy::default(),
            retry_not_before: chrono::Utc::now(),
            next_check_not_before: chrono::Utc::now(),
            in_progress: false,
        };
        execute(ledger, &intent, second_object).await;
    });
    let output = opledger(&[
        "tail",
        "--db",
        db.to_str().expect("a UTF-8 path"),
        "--from",
        "0",
        "--type",
        "succeeded,duplicate",
        "--limit",
        "2",
    ]);
    let text = succeeded(&output);
    let kinds: Vec<&str> = text
        .lines()
        .filter_map(|line| line.split_whitespace().nth(3))
        .collect();
    assert_eq!(kinds, ["succeeded", "duplicate"], "{text}");
}

#[test]
fn replay_refuses_to_replace_a_views_path_that_is_not_a_read_model_file() {
    let fixture = Fixture::build();
    let other = Fixture::build();
    let before = std::fs::read(&other.db).expect("the other ledger reads");
    let output = fixture.run(&["replay", "--views", other.db()]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("is not a read-model file"),
        "{}",
        stderr(&output)
    );
    assert_eq!(
        std::fs::read(&other.db).expect("the other ledger still reads"),
        before,
        "the file named by --views is left untouched"
    );
}

#[test]
fn views_built_from_another_ledger_are_refused_instead_of_answering() {
    let fixture = Fixture::build();
    succeeded(&fixture.run(&["ops", "list"]));
    let views = fixture.db.with_extension("db.views");
    // A much shorter ledger, queried with the first ledger's views.
    let (_short_dir, short) = Fixture::build_with_one_intent();
    let output = run_with_views(&["ops", "list"], &short, &views);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("another ledger"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn replay_verify_refuses_views_that_are_ahead_of_the_ledger() {
    let fixture = Fixture::build();
    succeeded(&fixture.run(&["ops", "list"]));
    let views = fixture.db.with_extension("db.views");
    let before = std::fs::read(&views).expect("the views read");
    let (_short_dir, short) = Fixture::build_with_one_intent();
    let output = run_with_views(&["replay", "--verify"], &short, &views);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("belong to another ledger file"),
        "{}",
        stderr(&output)
    );
    assert_eq!(std::fs::read(&views).expect("the views still read"), before);
}

#[test]
fn trace_of_a_source_id_used_by_two_tenants_names_both_operations() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("ledger.db");
    let (first, second) = on_ledger(&db, async |ledger| {
        let first = record(ledger, "acme", "call-shared", false).await;
        let second = record(ledger, "globex", "call-shared", false).await;
        (first.operation_id, second.operation_id)
    });
    assert_ne!(
        first, second,
        "a source id is unique only within its tenant"
    );
    let db_arg = db.to_str().expect("a UTF-8 path");
    let text = succeeded(&opledger(&["trace", "call-shared", "--db", db_arg]));
    assert!(text.contains(&first.to_string()), "{text}");
    assert!(
        text.contains(&format!("also matched    {second}")),
        "{text}"
    );
    let json = json_of(&opledger(&[
        "trace",
        "call-shared",
        "--json",
        "--db",
        db_arg,
    ]));
    assert_eq!(json["operation_id"], first.to_string());
    assert_eq!(json["other_matches"], json!([second.to_string()]));
}

#[test]
fn trace_with_a_tenant_finds_that_tenants_operation_behind_more_matches_of_other_tenants_than_it_lists(
) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("ledger.db");
    // More tenants than trace lists matches name the short id first.
    let own = on_ledger(&db, async |ledger| {
        for n in 0..12 {
            record(ledger, &format!("tenant-{n}"), "731", false).await;
        }
        record(ledger, "globex", "731", false).await.operation_id
    });
    let db_arg = db.to_str().expect("a UTF-8 path");
    let unscoped = json_of(&opledger(&["trace", "731", "--json", "--db", db_arg]));
    assert_ne!(unscoped["operation_id"], own.to_string());
    let scoped = json_of(&opledger(&[
        "trace", "731", "--tenant", "globex", "--json", "--db", db_arg,
    ]));
    assert_eq!(scoped["operation_id"], own.to_string());
    assert_eq!(scoped["other_matches"], json!([]));
    let elsewhere = opledger(&["trace", "731", "--tenant", "initech", "--db", db_arg]);
    assert_eq!(elsewhere.status.code(), Some(3), "{}", stderr(&elsewhere));
    assert!(
        stderr(&elsewhere).contains("initech"),
        "{}",
        stderr(&elsewhere)
    );
}

#[test]
fn ops_list_pages_with_after_cover_every_operation_once() {
    let fixture = Fixture::build();
    let all = listed(&fixture.run(&["ops", "list", "--json"]));
    assert_eq!(all.len(), 5);
    let mut paged = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..5 {
        let mut args = vec!["ops", "list", "--json", "--limit", "2"];
        if let Some(after) = after.as_deref() {
            args.extend(["--after", after]);
        }
        let page = json_of(&fixture.run(&args));
        paged.extend(
            page["operations"]
                .as_array()
                .expect("operations")
                .iter()
                .map(|row| row["operation_id"].as_str().expect("an id").to_owned()),
        );
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(paged, all, "the pages, in order, are the whole list");
    let bad = fixture.run(&["ops", "list", "--after", "not-a-uuid"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("--after"), "{}", stderr(&bad));
}

#[test]
fn views_of_another_ledger_of_the_same_length_are_refused() {
    let first = Fixture::build();
    succeeded(&first.run(&["ops", "list"]));
    let views = first.db.with_extension("db.views");
    // Another ledger as long as the first: the checkpoint alone cannot tell them apart.
    let second = Fixture::build();
    let output = run_with_views(&["ops", "list"], &second.db, &views);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("were built from another ledger"),
        "{}",
        stderr(&output)
    );
    // Its own ledger still reads its views.
    assert_eq!(listed(&first.run(&["ops", "list", "--json"])).len(), 5);
}
