"""The async client against the same real server: the same answers, errors and safe repeats as
the synchronous one, awaited."""

import asyncio
import uuid

import pytest

from conftest import env
from opledger_client import IdempotencyKeyReused, Unavailable, WaitTimedOut
from opledger_client.aio import AsyncLedger


def run(coroutine):
    return asyncio.run(coroutine)


def test_the_async_client_records_executes_and_waits_for_the_object(account):
    async def scenario():
        async with AsyncLedger(env("OPLEDGER_BASE_URL"), env("OPLEDGER_TOKEN")) as ledger:
            recorded = await ledger.record("crm", account, "create_task", {"title": "Async call"})
            assert recorded.created is True and recorded.state == "pending"
            with pytest.raises(WaitTimedOut):
                await ledger.wait_for(recorded.operation_id, timeout_s=0.2)
            await ledger.execute(recorded.operation_id, wait_ms=0)
            settled = await ledger.wait_for(recorded.operation_id, timeout_s=30)
            assert settled.confirmed, settled
            assert {"crm__create_task", "crm_plain__create_task"} <= {a["name"] for a in await ledger.actions()}

    run(scenario())


def test_the_async_client_raises_the_same_typed_errors(account):
    async def scenario():
        async with AsyncLedger(env("OPLEDGER_BASE_URL"), env("OPLEDGER_TOKEN")) as ledger:
            key = str(uuid.uuid4())
            await ledger.record("crm", account, "create_task", {"title": "One"}, idempotency_key=key)
            with pytest.raises(IdempotencyKeyReused) as refused:
                await ledger.record("crm", account, "create_task", {"title": "Two"}, idempotency_key=key)
            assert refused.value.request_id == key
        async with AsyncLedger("http://127.0.0.1:9", "any-token", max_retries=1) as gone:
            gone.sleep = lambda seconds: asyncio.sleep(0)
            with pytest.raises(Unavailable) as failed:
                await gone.status(str(uuid.uuid4()))
            assert failed.value.code == "unreachable"

    run(scenario())


def test_the_async_client_repeats_a_503_with_the_same_key(proxy, account):
    async def scenario():
        async with AsyncLedger(proxy.url, env("OPLEDGER_TOKEN")) as ledger:
            ledger.sleep = lambda seconds: asyncio.sleep(0)
            proxy.faults.append("503_after")
            operation = await ledger.record("crm", account, "create_task", {"title": f"async 503 {uuid.uuid4()}"})
            assert operation.replayed and operation.created is False
            assert len(proxy.keys) == 2 and proxy.keys[0] == proxy.keys[1]

    run(scenario())


def test_the_async_outcome_feed_yields_the_operations_outcome(account):
    async def scenario():
        async with AsyncLedger(env("OPLEDGER_BASE_URL"), env("OPLEDGER_TOKEN")) as ledger:
            done = await ledger.record_and_execute("crm", account, "create_task", {"title": "Async feed"}, wait_ms=5000)
            assert done.confirmed
            async for event in ledger.outcomes(types=["succeeded"]):
                if event["operation_id"] == done.operation_id:
                    assert event["type"] == "succeeded"
                    break

    run(scenario())
