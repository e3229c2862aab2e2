"""The client against a real ``opledger serve`` and the CRM stand: typed record / execute /
status, the Idempotency-Key across a lost response, the guarded tool, and the client's fields
checked against the OpenAPI document."""

import dataclasses
import inspect
import uuid

import jsonschema
import pytest

from conftest import env, until_settled
from opledger_client import (
    NOT_CONFIRMED_STATES,
    SETTLED_STATES,
    IdempotencyKeyReused,
    InvalidInput,
    Ledger,
    LedgerError,
    NotFound,
    Operation,
    Unauthorized,
    Unavailable,
    WaitTimedOut,
)


def check(openapi: dict, schema: str, instance: dict) -> None:
    """Validates ``instance`` against the document's ``schema``, whose $refs resolve in it."""
    root = dict(openapi)
    root["$ref"] = f"#/components/schemas/{schema}"
    jsonschema.Draft202012Validator(root).validate(instance)


def test_a_recorded_intent_is_executed_and_its_status_names_the_object(ledger, account, openapi):
    recorded = ledger.record("crm", account, "create_task", {"title": "Call the client"})
    assert recorded.created is True
    assert recorded.state == "pending"
    done = ledger.execute(recorded.operation_id, wait_ms=5000)
    assert done.confirmed, done
    assert done.message.startswith("Done")
    status = ledger.status(recorded.operation_id)
    assert status.external_id == done.external_id
    for answer in (recorded, done, status):
        check(openapi, "Operation", dict(answer.raw))


def test_a_lost_response_is_not_confirmed_and_a_retry_with_the_key_finds_the_one_task(ledger, account, stand):
    title = f"Lost response {uuid.uuid4()}"
    key = str(uuid.uuid4())
    stand.drop_next_response("plain")
    first = ledger.record_and_execute("crm-plain", account, "create_task", {"title": title}, idempotency_key=key, wait_ms=100)
    assert first.not_confirmed, first
    assert "done" not in first.message.lower()
    again = ledger.record_and_execute("crm-plain", account, "create_task", {"title": title}, idempotency_key=key, wait_ms=100)
    assert again.replayed and again.created is False
    assert again.operation_id == first.operation_id
    settled = until_settled(ledger, first.operation_id)
    assert settled.confirmed, settled
    tasks = stand.objects_titled(title)
    assert len(tasks) == 1, tasks
    assert tasks[0]["id"] == settled.external_id


def test_the_same_key_with_other_arguments_is_refused(ledger, account):
    key = str(uuid.uuid4())
    ledger.record("crm", account, "create_task", {"title": "One"}, idempotency_key=key)
    with pytest.raises(LedgerError) as refused:
        ledger.record("crm", account, "create_task", {"title": "Another"}, idempotency_key=key)
    assert refused.value.status == 409
    assert refused.value.code == "idempotency_key_reused"


def test_a_guarded_tool_keeps_the_functions_face_and_does_its_action_once(ledger, account, stand):
    title = f"Guarded {uuid.uuid4()}"

    @ledger.tool("crm", account, "create_task", wait_ms=5000)
    def create_task(title: str, due: str = "") -> dict:
        """Create a task in the CRM."""
        return {"title": title, **({"due": due} if due else {})}

    assert create_task.__name__ == "create_task"
    assert create_task.__doc__ == "Create a task in the CRM."
    assert list(inspect.signature(create_task).parameters) == ["title", "due", "request_id"]
    said = create_task(title, request_id="tool-call-1")
    retried = create_task(title, request_id="tool-call-1")
    assert said.startswith("Done") and retried == said
    assert create_task.last_operation.replayed
    assert len(stand.objects_titled(title)) == 1


def test_the_clients_fields_and_states_are_the_documents(openapi):
    schemas = openapi["components"]["schemas"]
    states = set(schemas["State"]["enum"])
    assert SETTLED_STATES | NOT_CONFIRMED_STATES <= states
    fields = {f.name for f in dataclasses.fields(Operation)} - {"replayed", "raw"}
    operation = schemas["OperationFields"]
    assert schemas["Operation"]["$ref"] == "#/components/schemas/OperationFields"
    assert fields <= set(operation["properties"]), fields - set(operation["properties"])
    # Every field the client reads with [] must be one the document requires.
    assert {"operation_id", "state", "message", "attempts"} <= set(operation["required"])


# ---- typed errors, safe repeats, timeouts ----


def test_a_reused_key_is_an_idempotency_key_reused_error_with_the_apis_code_message_and_key(ledger, account):
    key = str(uuid.uuid4())
    ledger.record("crm", account, "create_task", {"title": "One"}, idempotency_key=key)
    with pytest.raises(IdempotencyKeyReused) as refused:
        ledger.record("crm", account, "create_task", {"title": "Another"}, idempotency_key=key)
    assert isinstance(refused.value, LedgerError)
    assert (refused.value.status, refused.value.code) == (409, "idempotency_key_reused")
    assert refused.value.request_id == key
    assert "idempotency" in refused.value.message.lower()


def test_arguments_off_the_schema_are_an_invalid_input_error_naming_the_field(ledger, account):
    with pytest.raises(InvalidInput) as refused:
        ledger.record("crm", account, "create_task", {})
    assert refused.value.status == 422
    assert any("title" in field["message"] for field in refused.value.fields), refused.value.fields


def test_an_unknown_operation_is_not_found_and_a_bad_token_unauthorized(ledger):
    with pytest.raises(NotFound):
        ledger.status(str(uuid.uuid4()))
    with pytest.raises(Unauthorized):
        Ledger(ledger.base_url, "not-a-token").actions()


def test_a_503_after_the_server_recorded_is_repeated_with_the_same_key_and_finds_the_one_operation(proxied, proxy, account):
    proxy.faults.append("503_after")
    operation = proxied.record("crm", account, "create_task", {"title": f"503 {uuid.uuid4()}"})
    assert operation.replayed and operation.created is False, operation
    assert len(proxy.keys) == 2 and proxy.keys[0] == proxy.keys[1], proxy.keys


def test_a_lost_answer_is_repeated_with_the_same_key_and_finds_the_one_operation(proxied, proxy, account, stand):
    title = f"dropped {uuid.uuid4()}"
    proxy.faults.append("drop_after")
    operation = proxied.record_and_execute("crm", account, "create_task", {"title": title}, wait_ms=5000)
    assert operation.replayed, operation
    assert len(set(proxy.keys)) == 1 and len(proxy.keys) == 2, proxy.keys
    assert until_settled(proxied, operation.operation_id).confirmed
    assert len(stand.objects_titled(title)) == 1


def test_repeats_are_bounded_and_the_last_failure_is_an_unavailable_ledger_error(proxied, proxy, account):
    proxied.max_retries = 1
    proxy.faults.extend(["503_after", "503_after"])
    with pytest.raises(Unavailable) as failed:
        proxied.record("crm", account, "create_task", {"title": "bounded"})
    assert failed.value.code == "outcome_unknown" and failed.value.retryable
    assert len(proxy.keys) == 2, "one call and one repeat"


def test_a_timeout_is_a_ledger_error_not_a_bare_timeout_error(proxy, account):
    client = Ledger(proxy.url, env("OPLEDGER_TOKEN"), timeout_s=0.2, max_retries=0)
    proxy.faults.append("slow")
    with pytest.raises(Unavailable) as failed:
        client.record("crm", account, "create_task", {"title": "slow"}, idempotency_key=str(uuid.uuid4()))
    assert isinstance(failed.value, LedgerError)
    assert failed.value.code == "timeout", failed.value


# ---- wait_for, outcomes ----


def test_wait_for_returns_the_settled_operation_and_times_out_with_where_it_stood(ledger, account):
    recorded = ledger.record("crm", account, "create_task", {"title": "Waited for"})
    with pytest.raises(WaitTimedOut) as waited:
        ledger.wait_for(recorded.operation_id, timeout_s=0.2)
    assert waited.value.operation.state == "pending"
    ledger.execute(recorded.operation_id, wait_ms=0)
    settled = ledger.wait_for(recorded.operation_id, timeout_s=30)
    assert settled.confirmed, settled


def test_outcomes_follow_the_feed_and_resume_after_a_position(ledger, account):
    first = ledger.record_and_execute("crm", account, "create_task", {"title": "Feed one"}, wait_ms=5000)
    second = ledger.record_and_execute("crm", account, "create_task", {"title": "Feed two"}, wait_ms=5000)
    assert first.confirmed and second.confirmed
    seen = []
    for event in ledger.outcomes(types=["succeeded"]):
        seen.append(event)
        if event["operation_id"] == first.operation_id:
            break
    resumed = next(
        event for event in ledger.outcomes(after=seen[-1]["position"], types=["succeeded"])
        if event["operation_id"] == second.operation_id
    )
    assert resumed["position"] > seen[-1]["position"]
