//! A worker killed with SIGKILL after the CRM answered and before the answer was recorded.
//!
//! The worker is a real child process: this test binary re-executes itself to run the ignored
//! test [`sigkill_child_claims_sends_and_hangs`], which claims the operation in the shared ledger
//! file, sends it to the stand the parent runs, prints the task id the CRM answered and then
//! hangs until it is killed. No destructor, flush or close runs in it.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use opledger_domain::app::Ledger;
use opledger_domain::contract::RetryPolicy;
use opledger_domain::event::OperationEvent;
use opledger_domain::ids::{ExternalObjectId, OperationId};
use opledger_domain::provider::SendOutcome;
use opledger_domain::state::Status;
use opledger_runtime::system::{RandomIds, SystemClock};

use super::support::{
    claim_and_send, names, open_store, Crm, Harness, Setup, ACCOUNT, ACCOUNT_TOKEN,
};

/// The child's test name, as the test binary knows it: `crash::…` in `execution`, and
/// `execution::crash::…` in `execution_kurrentdb`, which holds the whole suite as one module.
fn child_test() -> String {
    let module = module_path!()
        .split_once("::")
        .map_or("", |(_crate, module)| module);
    format!("{module}::sigkill_child_claims_sends_and_hangs")
}
const CHILD_DB_ENV: &str = "OPLEDGER_EXECUTION_CHILD_DB";
const CHILD_STAND_ENV: &str = "OPLEDGER_EXECUTION_CHILD_STAND";
const CHILD_OPERATION_ENV: &str = "OPLEDGER_EXECUTION_CHILD_OPERATION";
const CHILD_WORKER: &str = "child-worker";
/// The child's claim: short, so the parent's sweep comes soon after the kill.
const CHILD_LEASE_MS: u64 = 1_500;
/// How long the child may take to start, claim and send (a cold start on a loaded machine).
const SENT_DEADLINE: Duration = Duration::from_secs(30);

/// Kills the child if the test fails before it does.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "entry point of the SIGKILL child; run by crash::a_worker_killed_after_the_crm_answered_leaves_an_attempt_that_reconciliation_settles_with_the_same_task"]
async fn sigkill_child_claims_sends_and_hangs() {
    let (Some(db), Some(stand), Some(operation)) = (
        std::env::var_os(CHILD_DB_ENV),
        std::env::var(CHILD_STAND_ENV).ok(),
        std::env::var(CHILD_OPERATION_ENV).ok(),
    ) else {
        return;
    };
    let operation_id: OperationId = operation
        .parse()
        .expect("the parent passes an operation id");
    let store = open_store(&db.to_string_lossy()).await;
    let ledger = Ledger::new(store, SystemClock, RandomIds);
    let providers = Setup::default().providers(&stand, &[(ACCOUNT, ACCOUNT_TOKEN)]);
    let (_, outcome) = claim_and_send(
        &ledger,
        &providers,
        operation_id,
        CHILD_WORKER,
        CHILD_LEASE_MS,
        RetryPolicy::default(),
    )
    .await;
    let SendOutcome::Confirmed { external_id, .. } = outcome else {
        panic!("the stand was to confirm the child's send: {outcome:?}");
    };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "sent {external_id}").expect("write the task id");
    stdout.flush().expect("flush the task id");
    drop(stdout);
    // The answer is never recorded: the parent kills this process while it waits here.
    std::future::pending::<()>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_after_the_crm_answered_leaves_an_attempt_that_reconciliation_settles_with_the_same_task(
) {
    let mut h = Harness::start().await;
    let recorded = h.record(h.request(Crm::Labelled, Some("toolcall-1"))).await;
    let intent = recorded.intent().clone();
    let operation_id = intent.operation_id;
    // One store per file at a time: the child owns the ledger file while it runs.
    h.close_store().await;

    let stderr_path = h.path().with_extension("child.stderr");
    let mut child = ChildGuard(
        Command::new(std::env::current_exe().expect("the test binary's path"))
            .args(["--ignored", "--exact", &child_test(), "--nocapture"])
            .env(CHILD_DB_ENV, h.store_location())
            .env(CHILD_STAND_ENV, h.base_url())
            .env(CHILD_OPERATION_ENV, operation_id.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr_path).expect("create the child's stderr file"))
            .spawn()
            .expect("start the child"),
    );
    let stdout = child.0.stdout.take().expect("the child's stdout is piped");
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let sent = tokio::task::spawn_blocking(move || wait_for_sent(&received))
        .await
        .expect("the waiting thread");
    let sent = sent.unwrap_or_else(|why| {
        panic!(
            "{why}; the child's stderr:\n{}",
            std::fs::read_to_string(&stderr_path).unwrap_or_default()
        )
    });

    // `Child::kill` is SIGKILL on Unix: the child records nothing more.
    child.0.kill().expect("SIGKILL the child");
    child.0.wait().expect("reap the child");
    h.reopen_store().await;
    let killed = h.state(operation_id).await;
    assert_eq!(
        killed.status,
        Status::InFlight,
        "the claim is all the child recorded"
    );

    let report = h.settle(operation_id).await;

    assert_eq!(
        report.state().status,
        Status::Succeeded {
            external_id: sent.clone()
        },
        "the task the child was told about"
    );
    let objects = h.objects_for(Crm::Labelled, &intent).await;
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert_eq!(objects[0].id, sent.as_str());
    assert_eq!(
        h.creates(Crm::Labelled).await.len(),
        1,
        "only the child ever sent it"
    );
    let events = h.events(operation_id).await;
    assert_eq!(
        names(&events),
        [
            "IntentRecorded",
            "AttemptStarted",
            "LeaseExpired",
            "LookupClaimed",
            "ReconciliationRecorded",
        ]
    );
    assert!(
        matches!(&events[1], OperationEvent::AttemptStarted(started) if started.worker.as_str() == CHILD_WORKER),
        "{:?}",
        events[1]
    );
    h.finish().await;
}

/// The task id from the child's `sent <id>` line, or why it never came.
fn wait_for_sent(lines: &Receiver<String>) -> Result<ExternalObjectId, String> {
    let deadline = Instant::now() + SENT_DEADLINE;
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                if let Some(id) = line.strip_prefix("sent ") {
                    return ExternalObjectId::new(id.trim())
                        .map_err(|error| format!("the child printed a bad id: {error}"));
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                return Err(format!("the child sent nothing within {SENT_DEADLINE:?}"))
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err("the child exited before it sent".to_owned())
            }
        }
    }
}
