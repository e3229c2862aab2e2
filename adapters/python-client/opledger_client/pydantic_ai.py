"""Pydantic AI (``pydantic-ai-slim``): tools guarded by the ledger, with the model's tool-call id
(``RunContext.tool_call_id``) as the request id, so a repeat of one tool call finds the operation
the first one recorded. Install with the ``pydantic-ai`` extra.

``guarded_tool`` turns a function into a ``pydantic_ai.Tool`` for ``Agent(tools=[...])``: the
function's name, docstring and typed parameters describe the tool, and it returns the action's
arguments (or nothing: then its arguments are the action's). ``ledger_tools`` builds every action
the tenant may use from ``GET /v1/actions``.

A refusal (409 ``idempotency_key_reused``, 422 ``invalid_input``, …) or a ledger that never
answered raises Pydantic AI's ``ModelRetry`` with the API's message: the agent hands it to the
model as a retry prompt (within the tool's ``retries``), instead of the exception ending the run.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import typing
from typing import Any, Callable, List, Mapping, Optional

from pydantic_ai import ModelRetry, RunContext, Tool

from . import Ledger, arguments_of

__all__ = ["Ledger", "guarded_tool", "ledger_tools"]


def guarded_tool(
    ledger: Ledger, provider: str, account: str, action: str, *, wait_ms: Optional[int] = None
) -> Callable[[Callable[..., Any]], Tool[Any]]:
    """A decorator making a function a ledger-guarded Pydantic AI tool."""
    target = {"provider": provider, "account": account, "action": action}

    def wrap(build_args: Callable[..., Any]) -> Tool[Any]:
        @functools.wraps(build_args)
        async def guarded(ctx: RunContext[Any], *args: Any, **kwargs: Any) -> str:
            action_args = arguments_of(build_args, args, kwargs)
            return await _answer(ledger, target, action_args, ctx.tool_call_id, wait_ms)

        # Pydantic AI reads the tool's parameters from the signature and type hints: the
        # function's own, behind the RunContext that carries the tool-call id.
        signature = inspect.signature(build_args)
        context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=RunContext[Any])
        guarded.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[context, *signature.parameters.values()], return_annotation=str
        )
        hints = typing.get_type_hints(build_args, include_extras=True)
        hints.pop("return", None)
        guarded.__annotations__ = {"ctx": RunContext[Any], **hints, "return": str}
        del guarded.__wrapped__  # type: ignore[attr-defined]
        return Tool(guarded, takes_ctx=True)

    return wrap


def ledger_tools(ledger: Ledger, *, wait_ms: Optional[int] = None) -> List[Tool[Any]]:
    """Every action this tenant may use, as Pydantic AI tools (their schemas as JSON Schema)."""
    return [_tool_of(ledger, action, wait_ms) for action in ledger.actions()]


def _tool_of(ledger: Ledger, action: Mapping[str, Any], wait_ms: Optional[int]) -> Tool[Any]:
    async def call(ctx: RunContext[Any], **args: Any) -> str:
        return await _answer(ledger, action, args, ctx.tool_call_id, wait_ms)

    return Tool.from_schema(
        call,
        name=action["name"],
        description=action["description"],
        json_schema=dict(action["input_schema"]),
        takes_ctx=True,
    )


async def _answer(
    ledger: Ledger, action: Mapping[str, Any], args: Mapping[str, Any], call_id: Optional[str], wait_ms: Optional[int]
) -> str:
    # The client is synchronous (standard library only): off the event loop.
    text, refused = await asyncio.to_thread(
        ledger.guarded_answer, action, args, request_id=call_id, wait_ms=wait_ms
    )
    if refused:
        raise ModelRetry(text)
    return text
