//! `opledger demo`: the ledger's rules, shown on a fresh embedded store.
//!
//! It records a real intent in a real SQLite file and puts the rules in front of the reader:
//! redelivery finds the same operation, an approval covers one exact snapshot, exactly one of two
//! racing workers claims the send, a lost response is `unknown` (not an error and not a retry),
//! reconciliation evidence settles it, and a late second object is recorded as a duplicate. The
//! provider's answers in steps 5–7 are fed to the ledger by this demo, as a CRM adapter would;
//! real CRM traffic against the fault-injecting stand arrives with the execution engine.

use std::sync::Arc;

use opledger_domain::app::{AppError, IntentRequest};
use opledger_domain::args::ArgsSnapshot;
use opledger_domain::command::Command;
use opledger_domain::contract::{
    Deduplication, LookupSupport, ProviderCapabilities, RetryPolicy, SendBinding,
};
use opledger_domain::event::ReconciliationResult;
use opledger_domain::ids::{ActorId, ExternalObjectId, WorkerId};
use opledger_domain::ports::IdSource;

use crate::bench::fresh_path;
use crate::cli::{CliError, DemoArgs};
use crate::intent::open_ledger;

pub async fn run(args: DemoArgs) -> Result<(), CliError> {
    let path = args.db.unwrap_or_else(|| fresh_path("demo"));
    println!("opledger demo — ledger file {}", path.display());
    let ledger = Arc::new(open_ledger(&path).await?);
    let result = tokio::select! {
        result = walk(&ledger) => result,
        _ = tokio::signal::ctrl_c() => Err(CliError::Interrupted),
    };
    let closed = crate::intent::close(&ledger).await;
    if let Ok(operation_id) = &result {
        println!(
            "\nInspect it yourself:\n  opledger status --db {} {operation_id}",
            path.display()
        );
    }
    result?;
    closed
}

async fn walk(ledger: &Arc<crate::intent::SqliteLedger>) -> Result<String, CliError> {
    let args = serde_json::json!({"title": "Call the client", "due": "2026-12-01"});
    let request = IntentRequest {
        tenant: "acme".into(),
        owner: Some("manager-anna".into()),
        provider: "crm".into(),
        account: "acme-crm-eu".into(),
        credential_fingerprint: "fp-2026-11".into(),
        action: "create_task".into(),
        args: args.clone(),
        source_id: Some("toolcall-0001".into()),
        requires_approval: true,
    };

    println!("\n1. The agent's tool call asks for a task; the intent is recorded before anything is sent.");
    let recorded = ledger.record_intent(request.clone()).await?;
    let intent = recorded.intent().clone();
    let operation_id = intent.operation_id;
    println!(
        "   operation {operation_id}  key {}  state {}",
        intent.idempotency_key,
        recorded.operation.state.status.name()
    );

    println!("\n2. The same tool call is delivered again, 32 times at once: still one operation.");
    let mut redeliveries = Vec::new();
    for _ in 0..32 {
        let ledger = Arc::clone(ledger);
        let request = request.clone();
        redeliveries.push(tokio::spawn(
            async move { ledger.record_intent(request).await },
        ));
    }
    let mut created = 0;
    for redelivery in redeliveries {
        let again = redelivery
            .await
            .map_err(|error| CliError::Other(error.to_string()))??;
        if again.intent().operation_id != operation_id {
            return Err(CliError::Other(
                "a redelivery found another operation; the ledger is broken".into(),
            ));
        }
        created += usize::from(again.created);
    }
    println!("   new operations created by the redeliveries: {created}");

    println!("\n3. An approval for changed arguments (due today) is refused; the recorded snapshot is approved.");
    let changed =
        ArgsSnapshot::new(serde_json::json!({"title": "Call the client", "due": "2026-11-30"}))?
            .hash();
    match ledger
        .approve(operation_id, ActorId::new("lead-boris")?, changed)
        .await
    {
        Err(AppError::Rejected { rejection, .. }) => println!("   refused: {rejection}"),
        other => {
            return Err(CliError::Other(format!(
                "the changed approval was not refused: {other:?}"
            )))
        }
    }
    let approved = ledger
        .approve(
            operation_id,
            ActorId::new("lead-boris")?,
            intent.args_hash.clone(),
        )
        .await?;
    println!("   approved → {}", approved.state.status.name());

    println!("\n4. Two workers race to claim the send: exactly one wins.");
    let capabilities = ProviderCapabilities {
        deduplication: Deduplication::None,
        lookup: LookupSupport::EventuallyConsistent { lag_ms: 2_000 },
    };
    let binding = SendBinding {
        account: intent.account.clone(),
        credential_fingerprint: intent.credential_fingerprint.clone(),
        args_hash: intent.args_hash.clone(),
    };
    let mut claims = Vec::new();
    for worker in ["worker-a", "worker-b"] {
        let ledger = Arc::clone(ledger);
        let command = Command::StartAttempt {
            attempt_id: opledger_adapters::system::RandomIds.new_attempt_id(),
            worker: WorkerId::new(worker)?,
            lease_ms: 30_000,
            binding: binding.clone(),
            capabilities,
            policy: RetryPolicy::default(),
        };
        claims.push(tokio::spawn(async move {
            (worker, ledger.execute(operation_id, &command).await)
        }));
    }
    let mut winner = None;
    for claim in claims {
        let (worker, result) = claim
            .await
            .map_err(|error| CliError::Other(error.to_string()))?;
        match result {
            Ok(claimed) => {
                let attempt = claimed
                    .state
                    .current_attempt
                    .clone()
                    .ok_or_else(|| CliError::Other("a claim without an attempt".into()))?;
                println!(
                    "   {worker}: claimed attempt {} (#{})",
                    attempt.attempt_id, attempt.number
                );
                winner = Some(attempt.attempt_id);
            }
            Err(AppError::Rejected { rejection, .. }) => {
                println!("   {worker}: refused — {rejection}")
            }
            Err(error) => return Err(error.into()),
        }
    }
    let attempt_id =
        winner.ok_or_else(|| CliError::Other("no worker claimed the operation".into()))?;

    println!("\n5. The CRM creates task 731 but the response is lost: the outcome is unknown, not failed.");
    let unknown = Command::RecordUnknown {
        attempt_id,
        error: "read timed out after 10 s; the request was sent".into(),
    };
    let after = ledger.execute(operation_id, &unknown).await?;
    println!(
        "   state {} — no automatic retry: this CRM has no idempotency keys",
        after.state.status.name()
    );

    println!("\n6. Reconciliation asks the CRM by the operation's label and finds task 731 in the same account.");
    let reconcile = Command::RecordReconciliation {
        result: ReconciliationResult::Found {
            external_id: ExternalObjectId::new("731")?,
            account: intent.account.clone(),
        },
        evidence: format!(
            "search label={operation_id} → task 731 in {}",
            intent.account
        ),
        binding,
        capabilities,
        policy: RetryPolicy::default(),
        retry_not_before: chrono::Utc::now(),
        next_check_not_before: chrono::Utc::now(),
    };
    let settled = ledger.execute(operation_id, &reconcile).await?;
    println!(
        "   state {} with external id {}",
        settled.state.status.name(),
        settled.state.external_id().map_or("?", |id| id.as_str())
    );

    println!(
        "\n7. A late response names task 732: recorded as a duplicate; the outcome stays 731."
    );
    let late = Command::RecordSuccess {
        attempt_id,
        external_id: ExternalObjectId::new("732")?,
        provider_request_id: None,
    };
    let last = ledger.execute(operation_id, &late).await?;
    println!(
        "   state {} with external id {}, duplicates {:?}",
        last.state.status.name(),
        last.state.external_id().map_or("?", |id| id.as_str()),
        last.state
            .duplicates
            .iter()
            .map(ExternalObjectId::as_str)
            .collect::<Vec<_>>()
    );
    println!(
        "\nThe stream holds {} events, each appended at the version it was decided on.",
        last.version.map_or(0, |v| v.value() + 1)
    );
    Ok(operation_id.to_string())
}
