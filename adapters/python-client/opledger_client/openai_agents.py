"""The OpenAI Agents SDK (``openai-agents``): function tools guarded by the ledger, with the
model's function-call id (``ToolContext.tool_call_id``) as the request id, so a repeat of one
tool call finds the operation the first one recorded. Install with the ``openai-agents`` extra.

``guarded_function_tool`` takes the place of ``@function_tool``: the function's name, docstring
and typed parameters describe the tool as ``function_tool`` reads them, and it returns the
action's arguments (or nothing: then its arguments are the action's). ``ledger_tools`` builds every
action the tenant may use from ``GET /v1/actions``.

A refusal (409 ``idempotency_key_reused``, 422 ``invalid_input``, …) or a ledger that never
answered is the tool's output, the API's message in it, as the SDK's own ``failure_error_function``
hands a failed tool to the model: the run goes on and the model reads why, instead of the
exception ending ``Runner.run``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, List, Mapping, Optional

from agents import FunctionTool
from agents.function_schema import function_schema
from agents.tool_context import ToolContext

from . import Ledger, arguments_of

__all__ = ["Ledger", "guarded_function_tool", "ledger_tools"]


def guarded_function_tool(
    ledger: Ledger, provider: str, account: str, action: str, *, wait_ms: Optional[int] = None
) -> Callable[[Callable[..., Any]], FunctionTool]:
    """A decorator making a function a ledger-guarded ``FunctionTool``."""
    target = {"provider": provider, "account": account, "action": action}

    def wrap(build_args: Callable[..., Any]) -> FunctionTool:
        schema = function_schema(build_args)

        async def invoke(context: ToolContext[Any], raw: str) -> str:
            parsed = schema.params_pydantic_model.model_validate_json(raw or "{}")
            positional, named = schema.to_call_args(parsed)
            args = arguments_of(build_args, tuple(positional), named)
            return await _answer(ledger, target, args, context.tool_call_id, wait_ms)

        return FunctionTool(
            name=schema.name,
            description=schema.description or "",
            params_json_schema=schema.params_json_schema,
            on_invoke_tool=invoke,
            strict_json_schema=schema.strict_json_schema,
        )

    return wrap


def ledger_tools(ledger: Ledger, *, wait_ms: Optional[int] = None) -> List[FunctionTool]:
    """Every action this tenant may use, as function tools. Not strict: an action's schema need
    not meet the strict mode's rules (every property required, no other properties)."""
    return [_tool_of(ledger, action, wait_ms) for action in ledger.actions()]


def _tool_of(ledger: Ledger, action: Mapping[str, Any], wait_ms: Optional[int]) -> FunctionTool:
    async def invoke(context: ToolContext[Any], raw: str) -> str:
        args = json.loads(raw or "{}")
        return await _answer(ledger, action, args, context.tool_call_id, wait_ms)

    return FunctionTool(
        name=action["name"],
        description=action["description"],
        params_json_schema=dict(action["input_schema"]),
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )


async def _answer(
    ledger: Ledger, action: Mapping[str, Any], args: Mapping[str, Any], call_id: Optional[str], wait_ms: Optional[int]
) -> str:
    # The client is synchronous (standard library only): off the event loop.
    text, _refused = await asyncio.to_thread(
        ledger.guarded_answer, action, args, request_id=call_id, wait_ms=wait_ms
    )
    return text
