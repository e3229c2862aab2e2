"""Each framework adapter through the framework's own invocation entry point, with no real
model: Pydantic AI's ``Agent.run_sync`` over its ``FunctionModel``, the OpenAI Agents SDK's
``Runner.run_sync`` over a scripted ``Model``, LangChain's ``tool.invoke`` with a ``ToolCall``.
Each plays a response lost at the CRM: the first tool call answers "not confirmed, do not
repeat" (an answer, not an exception), the framework's repeat of the same tool call (same
tool-call id) finds the same operation, the CRM holds one object, and the answer is
"Done: … object N"."""

import json
import re
import uuid
from typing import Any, Callable, List

from agents import Agent as OpenAIAgent
from agents import Runner, set_tracing_disabled
from agents.items import ModelResponse as OpenAIModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, RetryPromptPart, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from conftest import until_settled
from opledger_client import Ledger
from opledger_client import langchain as lc_adapter
from opledger_client import openai_agents as oa_adapter
from opledger_client import pydantic_ai as pa_adapter

# The SDK would export traces to OpenAI; these tests reach only 127.0.0.1.
set_tracing_disabled(True)

#: A short wait: the first answer comes before the plain CRM's search (lag 200 ms) shows the task.
SHORT_WAIT_MS = 100
WAIT_MS = 5000


def create_task(title: str) -> None:
    """Create a task in the CRM."""
    # As the book shows it: no body, so the tool's arguments are the action's.


def assert_not_confirmed(text: str) -> None:
    assert not text.startswith("Done"), text
    assert "not confirmed" in text.lower(), text
    assert "do not repeat" in text.lower(), text


def assert_done(text: str, object_id: str) -> None:
    assert re.fullmatch(rf"Done: .* object {re.escape(object_id)}\.", text), text


def lost_response_then_retry(ledger: Ledger, account: str, stand, task: str, call: Callable[[str], str]) -> None:
    """``call(id)`` is one framework-driven tool call with the tool-call id ``id``."""
    call_id = f"call-{uuid.uuid4()}"
    stand.drop_next_response("plain")
    first = call(call_id)
    assert_not_confirmed(first)
    operation = ledger.record("crm-plain", account, "create_task", {"title": task}, idempotency_key=call_id)
    assert operation.replayed, "the tool call was recorded under its tool-call id"
    until_settled(ledger, operation.operation_id)
    again = call(call_id)
    objects = stand.objects_titled(task)
    assert len(objects) == 1, objects
    assert_done(again, objects[0]["id"])


# ---- Pydantic AI ----


def tool_calling_model(tool_name: str, call_id: str, args: dict) -> FunctionModel:
    """Calls ``tool_name`` once with ``call_id``, then answers with the tool's return."""

    def respond(messages: List[ModelMessage], info: AgentInfo) -> ModelResponse:
        for message in messages:
            for part in message.parts:
                if isinstance(part, (ToolReturnPart, RetryPromptPart)):
                    return ModelResponse(parts=[TextPart(content=str(part.content))])
        return ModelResponse(parts=[ToolCallPart(tool_name=tool_name, args=args, tool_call_id=call_id)])

    return FunctionModel(respond)


def test_pydantic_ai_a_lost_response_then_the_agents_repeat_of_the_tool_call_makes_one_task(ledger, account, stand):
    task = f"pydantic-ai {uuid.uuid4()}"
    tool = pa_adapter.guarded_tool(ledger, "crm-plain", account, "create_task", wait_ms=SHORT_WAIT_MS)(create_task)

    def call(call_id: str) -> str:
        agent = PydanticAgent(tool_calling_model("create_task", call_id, {"title": task}), tools=[tool])
        return agent.run_sync("Set a task").output

    lost_response_then_retry(ledger, account, stand, task, call)


def test_pydantic_ai_tools_from_get_actions_act_in_the_account_the_model_names(ledger, account, stand):
    tools = pa_adapter.ledger_tools(ledger, wait_ms=WAIT_MS)
    assert {"crm__create_task", "crm_plain__create_task"} <= {t.name for t in tools}
    task = f"pydantic-ai-actions {uuid.uuid4()}"
    model = tool_calling_model("crm__create_task", "actions-1", {"title": task, "account": account})
    said = PydanticAgent(model, tools=tools).run_sync("Set a task").output
    assert_done(said, stand.objects_titled(task)[0]["id"])


# ---- OpenAI Agents SDK ----


class ScriptedModel(Model):
    """Calls ``tool_name`` once with ``call_id``, then ends the turn with the tool's output."""

    def __init__(self, tool_name: str, call_id: str, args: dict) -> None:
        self.tool_name, self.call_id, self.args = tool_name, call_id, args

    async def get_response(self, system_instructions, input, *rest: Any, **named: Any) -> OpenAIModelResponse:
        items = input if isinstance(input, list) else []
        outputs = [item for item in items if isinstance(item, dict) and item.get("type") == "function_call_output"]
        if outputs:
            text = ResponseOutputText(type="output_text", text=str(outputs[-1]["output"]), annotations=[])
            message = ResponseOutputMessage(id="msg-1", type="message", role="assistant", status="completed", content=[text])
            return OpenAIModelResponse(output=[message], usage=Usage(), response_id=None)
        call = ResponseFunctionToolCall(
            type="function_call", id="fc-1", call_id=self.call_id, name=self.tool_name,
            arguments=json.dumps(self.args), status="completed",
        )
        return OpenAIModelResponse(output=[call], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any):
        raise NotImplementedError("not streamed in these tests")


def test_openai_agents_a_lost_response_then_the_runs_repeat_of_the_function_call_makes_one_task(ledger, account, stand):
    task = f"openai-agents {uuid.uuid4()}"
    tool = oa_adapter.guarded_function_tool(ledger, "crm-plain", account, "create_task", wait_ms=SHORT_WAIT_MS)(create_task)

    def call(call_id: str) -> str:
        agent = OpenAIAgent(name="assistant", model=ScriptedModel("create_task", call_id, {"title": task}), tools=[tool])
        return str(Runner.run_sync(agent, "Set a task").final_output)

    lost_response_then_retry(ledger, account, stand, task, call)


def test_openai_agents_tools_from_get_actions_act_in_the_account_the_model_names(ledger, account, stand):
    tools = oa_adapter.ledger_tools(ledger, wait_ms=WAIT_MS)
    task = f"openai-agents-actions {uuid.uuid4()}"
    model = ScriptedModel("crm__create_task", "actions-2", {"title": task, "account": account})
    said = str(Runner.run_sync(OpenAIAgent(name="assistant", model=model, tools=tools), "Set a task").final_output)
    assert_done(said, stand.objects_titled(task)[0]["id"])


# ---- LangChain ----


def test_langchain_a_lost_response_then_invoking_the_same_tool_call_again_makes_one_task(ledger, account, stand):
    task = f"langchain {uuid.uuid4()}"
    tool = lc_adapter.guarded_tool(ledger, "crm-plain", account, "create_task", wait_ms=SHORT_WAIT_MS)(create_task)

    def call(call_id: str) -> str:
        message = tool.invoke({"type": "tool_call", "id": call_id, "name": "create_task", "args": {"title": task}})
        assert message.tool_call_id == call_id
        return str(message.content)

    lost_response_then_retry(ledger, account, stand, task, call)


def test_langchain_tools_from_get_actions_act_in_the_account_the_model_names(ledger, account, stand):
    tools = {t.name: t for t in lc_adapter.ledger_tools(ledger, wait_ms=WAIT_MS)}
    task = f"langchain-actions {uuid.uuid4()}"
    message = tools["crm__create_task"].invoke(
        {"type": "tool_call", "id": "actions-3", "name": "crm__create_task", "args": {"title": task, "account": account}}
    )
    assert_done(str(message.content), stand.objects_titled(task)[0]["id"])


# ---- refusals and repeats, through each framework ----


def refused_then(ledger: Ledger, account: str, call: Callable[[str, str], str]) -> None:
    """``call(id, title)`` is one framework-driven tool call; under an id that already named
    another request the ledger refuses it (409), and the framework hands the API's message to the
    model instead of ending the run."""
    call_id = f"reused-{uuid.uuid4()}"
    ledger.record("crm-plain", account, "create_task", {"title": "the first request"}, idempotency_key=call_id)
    said = call(call_id, "another request")
    assert "idempotency_key_reused" in said, said
    assert "other arguments" in said or "another request" in said or "idempotency" in said.lower(), said
    assert not said.startswith("Done"), said


def repeated_after_a_503(proxied: Ledger, proxy, stand, call: Callable[[Ledger, str, str], str]) -> None:
    """``call(ledger, id, title)`` through ``proxy``, whose first record is answered 503 after the
    server recorded it: the client repeats it under the same key, and the CRM holds one task."""
    task = f"after a 503 {uuid.uuid4()}"
    proxy.faults.append("503_after")
    said = call(proxied, f"call-{uuid.uuid4()}", task)
    objects = stand.objects_titled(task)
    assert len(objects) == 1, objects
    assert_done(said, objects[0]["id"])
    assert len(proxy.keys) == 2 and proxy.keys[0] == proxy.keys[1], proxy.keys


def pydantic_call(ledger: Ledger, account: str, call_id: str, title: str) -> str:
    tool = pa_adapter.guarded_tool(ledger, "crm-plain", account, "create_task", wait_ms=WAIT_MS)(create_task)
    agent = PydanticAgent(tool_calling_model("create_task", call_id, {"title": title}), tools=[tool])
    return agent.run_sync("Set a task").output


def openai_call(ledger: Ledger, account: str, call_id: str, title: str) -> str:
    tool = oa_adapter.guarded_function_tool(ledger, "crm-plain", account, "create_task", wait_ms=WAIT_MS)(create_task)
    agent = OpenAIAgent(name="assistant", model=ScriptedModel("create_task", call_id, {"title": title}), tools=[tool])
    return str(Runner.run_sync(agent, "Set a task").final_output)


def langchain_call(ledger: Ledger, account: str, call_id: str, title: str, status: str = "success") -> str:
    tool = lc_adapter.guarded_tool(ledger, "crm-plain", account, "create_task", wait_ms=WAIT_MS)(create_task)
    message = tool.invoke({"type": "tool_call", "id": call_id, "name": "create_task", "args": {"title": title}})
    assert message.status == status, message
    return str(message.content)


def test_pydantic_ai_a_refusal_is_a_retry_prompt_with_the_apis_message(ledger, account):
    refused_then(ledger, account, lambda call_id, title: pydantic_call(ledger, account, call_id, title))


def test_openai_agents_a_refusal_is_the_tools_output_and_the_run_goes_on(ledger, account):
    refused_then(ledger, account, lambda call_id, title: openai_call(ledger, account, call_id, title))


def test_langchain_a_refusal_is_an_error_tool_message_with_the_apis_message(ledger, account):
    refused_then(ledger, account, lambda call_id, title: langchain_call(ledger, account, call_id, title, "error"))


def test_pydantic_ai_a_503_is_repeated_with_the_same_key(proxied, proxy, account, stand):
    repeated_after_a_503(proxied, proxy, stand, lambda client, i, t: pydantic_call(client, account, i, t))


def test_openai_agents_a_503_is_repeated_with_the_same_key(proxied, proxy, account, stand):
    repeated_after_a_503(proxied, proxy, stand, lambda client, i, t: openai_call(client, account, i, t))


def test_langchain_a_503_is_repeated_with_the_same_key(proxied, proxy, account, stand):
    repeated_after_a_503(proxied, proxy, stand, lambda client, i, t: langchain_call(client, account, i, t))


# ---- the book's framework examples (docs/src/agents/clients.md) ----


def readme_examples() -> List[str]:
    from conftest import env

    with open(env("OPLEDGER_CLIENTS_PAGE"), encoding="utf-8") as file:
        readme = file.read()
    start = readme.index("### From TypeScript, and from agent frameworks")
    section = readme[start : readme.index("\n## ", start)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_every_framework_example_in_the_book_compiles_and_imports_only_what_the_package_exports():
    import importlib

    examples = readme_examples()
    assert len(examples) == 3, "one example per framework"
    for example in examples:
        compile(example, "<framework example>", "exec")
        imports = re.findall(r"^from (opledger_client[\w.]*) import (.+)$", example, re.M)
        assert imports, example
        for module_name, names in imports:
            module = importlib.import_module(module_name)
            for name in (n.strip() for n in names.split("#")[0].split(",")):
                assert callable(getattr(module, name, None)), f"{module_name} exports {name}"
