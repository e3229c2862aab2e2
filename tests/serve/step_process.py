"""A process that charges an order through a function guarded by ``Ledger.step``, for
tests/serve/steps.rs, which kills it with SIGKILL at a chosen point and runs it again.

    python3 step_process.py MODE RUNS_FILE

The guarded function appends the step's idempotency key to RUNS_FILE (one line per run of the
function: what the test counts) and returns an invoice id. MODE:

- ``run``: runs the step and prints ``result <id>``, or ``error <class> <state>`` for a typed
  step error;
- ``hang-after-run``: the function does its work, prints ``ran`` and then hangs, so the process
  dies after the side effect and before the outcome is reported;
- ``hang-before-claim``: the step is recorded, then the process prints ``recorded`` and hangs
  before it claims the step, so it dies before the function could run.

The server and token come from OPLEDGER_BASE_URL and OPLEDGER_TOKEN; the claim's lease from
STEP_LEASE_MS.
"""

import os
import sys
import time

from opledger_client import Ledger, StepError

MODE, RUNS_FILE = sys.argv[1], sys.argv[2]
ledger = Ledger(os.environ["OPLEDGER_BASE_URL"], os.environ["OPLEDGER_TOKEN"])


@ledger.step(provider="billing", action="charge", lease_ms=int(os.environ["STEP_LEASE_MS"]))
def charge(order: str, amount_cents: int, *, idempotency_key: str) -> str:
    with open(RUNS_FILE, "a", encoding="utf-8") as runs:
        runs.write(idempotency_key + "\n")
    if MODE == "hang-after-run":
        print("ran", flush=True)
        time.sleep(3600)
    return f"inv-{order}"


if MODE == "hang-before-claim":
    claim_path = "/claim"
    send = ledger._call

    def stop_before_claim(request):
        if request.path.endswith(claim_path):
            print("recorded", flush=True)
            time.sleep(3600)
        return send(request)

    ledger._call = stop_before_claim

try:
    print(f"result {charge('A-1', 700)}", flush=True)
except StepError as error:
    print(f"error {type(error).__name__} {error.operation.state}", flush=True)
