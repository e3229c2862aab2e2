"""The client against a real ``opledger serve`` and the CRM stand: typed record / execute /
status, the Idempotency-Key across a lost response, the guarded tool, and the client's fields
checked against the OpenAPI document."""

import dataclasses
import inspect
import uuid

import jsonschema
import pytest

from conftest import until_settled
from opledger_client import NOT_CONFIRMED_STATES, SETTLED_STATES, LedgerError, Operation


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
