"""``ledger.step`` against the real server, in the synchronous and the async client: a guarded
function runs once per key with the step's key, a repeat answers the recorded outcome without
running it, a failure is recorded as what it says, and a step whose outcome is unknown is never
run again. (A process killed mid-step is tests/serve/steps.rs's.)"""

import asyncio
import uuid

import pytest

from conftest import env
from opledger_client import StepDidNotApply, StepFailed, StepNotConfirmed
from opledger_client.aio import AsyncLedger


class CardDeclined(Exception):
    pass


def test_a_guarded_function_runs_once_with_the_steps_key_and_a_repeat_answers_its_result(ledger):
    runs = []
    order = str(uuid.uuid4())

    @ledger.step(provider="billing", action="charge")
    def charge(order: str, amount_cents: int, *, idempotency_key: str) -> dict:
        runs.append(idempotency_key)
        return {"id": f"inv-{order}", "amount_cents": amount_cents}

    assert charge(order, 700) == f"inv-{order}"
    assert charge(order, 700) == f"inv-{order}"
    assert len(runs) == 1
    recorded = charge.last_operation
    assert recorded.state == "succeeded" and recorded.raw["idempotency_key"] == runs[0]
    assert recorded.raw["args"] == {"order": order, "amount_cents": 700}
    # Another amount is another step; the same arguments under another source id too.
    charge(order, 800)
    charge(order, 700, source_id=f"again-{order}")
    assert len(runs) == 3


def test_a_failure_that_applied_nothing_is_recorded_and_answered_again_without_running(ledger):
    runs = []

    @ledger.step(provider="billing", action="charge", not_applied=(CardDeclined,), key=lambda order: order)
    def charge(order: str) -> str:
        runs.append(order)
        raise CardDeclined("card declined")

    order = f"declined-{uuid.uuid4()}"
    with pytest.raises(CardDeclined):
        charge(order)
    with pytest.raises(StepFailed) as failed:
        charge(order)
    assert failed.value.operation.state == "rejected"
    assert "card declined" in failed.value.operation.message
    assert len(runs) == 1


def test_a_failure_that_may_have_applied_goes_to_a_person_and_is_never_run_again(ledger):
    runs = []

    @ledger.step(provider="mail", action="send")
    def send(to: str) -> str:
        runs.append(to)
        raise TimeoutError("the mail server did not answer")

    to = f"{uuid.uuid4()}@example.com"
    with pytest.raises(TimeoutError):
        send(to)
    with pytest.raises(StepNotConfirmed) as unknown:
        send(to)
    assert unknown.value.operation.state == "needs_review"
    assert "Please do not repeat it" in unknown.value.operation.message
    assert len(runs) == 1


def test_did_not_apply_is_the_one_exception_every_step_reads_as_nothing_applied(ledger):
    @ledger.step(provider="billing", action="refund")
    def refund(order: str) -> str:
        raise StepDidNotApply("nothing to refund")

    order = str(uuid.uuid4())
    with pytest.raises(StepDidNotApply):
        refund(order)
    assert refund.last_operation.state == "rejected"


def test_arguments_that_are_not_json_are_refused_before_anything_is_recorded(ledger):
    @ledger.step(provider="billing", action="charge")
    def charge(order: object) -> str:
        return "never"

    with pytest.raises(TypeError, match="not JSON"):
        charge(object())


def test_the_async_client_guards_async_and_plain_functions_the_same_way():
    async def scenario():
        async with AsyncLedger(env("OPLEDGER_BASE_URL"), env("OPLEDGER_TOKEN")) as ledger:
            runs = []

            @ledger.step(provider="billing", action="charge")
            async def charge(order: str, *, idempotency_key: str) -> str:
                runs.append(idempotency_key)
                await asyncio.sleep(0)
                return f"inv-{order}"

            @ledger.step(provider="mail", action="send")
            def send(to: str) -> str:
                runs.append(to)
                raise ConnectionResetError("reset")

            order = str(uuid.uuid4())
            assert await charge(order) == f"inv-{order}"
            assert await charge(order) == f"inv-{order}"
            with pytest.raises(ConnectionResetError):
                await send(order)
            with pytest.raises(StepNotConfirmed):
                await send(order)
            assert len(runs) == 2

    asyncio.run(scenario())

