"""LangChain (``langchain-core``): tools guarded by the ledger, with the id of the ``ToolCall`` a
tool is invoked with as the request id, so invoking one tool call again finds the operation the
first one recorded. Install with the ``langchain`` extra.

``guarded_tool`` takes the place of ``@tool``: the function's name, docstring and typed
parameters describe the tool, and it returns the action's arguments (or nothing: then its
arguments are the action's). ``ledger_tools`` builds every action the tenant may use from
``GET /v1/actions``.

A refusal (409 ``idempotency_key_reused``, 422 ``invalid_input``, …) or a ledger that never
answered raises LangChain's ``ToolException`` with the API's message, and the tools handle it
(``handle_tool_error``): the ``ToolMessage`` has ``status="error"`` and the message as its content,
so the agent's loop goes on and the model reads why.
"""

from __future__ import annotations

import contextvars
from typing import Any, Callable, Dict, List, Optional

from langchain_core.tools import BaseTool, ToolException
from langchain_core.tools.base import create_schema_from_function

from . import Ledger, arguments_of

__all__ = ["GuardedTool", "Ledger", "guarded_tool", "ledger_tools"]

# The id of the ToolCall being run. LangChain hands it to `run`, but to `_run` only for tools
# whose schema declares an InjectedToolCallId, which a schema from GET /v1/actions (JSON Schema)
# cannot; `run` puts it here and `_run`, called in a copy of the same context, reads it.
_TOOL_CALL_ID: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar(
    "opledger_tool_call_id", default=None
)


class GuardedTool(BaseTool):
    """One configured action as a LangChain tool: a call records and executes it once per tool
    call id and answers the ledger's sentence (a not-confirmed outcome is an answer, not an
    error)."""

    ledger: Any
    target: Dict[str, Any]
    wait_ms: Optional[int] = None
    build_args: Optional[Callable[..., Any]] = None
    handle_tool_error: Any = True

    def run(self, *args: Any, tool_call_id: Optional[str] = None, **kwargs: Any) -> Any:
        token = _TOOL_CALL_ID.set(tool_call_id)
        try:
            return super().run(*args, tool_call_id=tool_call_id, **kwargs)
        finally:
            _TOOL_CALL_ID.reset(token)

    async def arun(self, *args: Any, tool_call_id: Optional[str] = None, **kwargs: Any) -> Any:
        token = _TOOL_CALL_ID.set(tool_call_id)
        try:
            return await super().arun(*args, tool_call_id=tool_call_id, **kwargs)
        finally:
            _TOOL_CALL_ID.reset(token)

    def _run(self, *args: Any, **kwargs: Any) -> str:
        kwargs.pop("run_manager", None)
        action_args = (
            arguments_of(self.build_args, args, kwargs) if self.build_args is not None else kwargs
        )
        text, refused = self.ledger.guarded_answer(
            self.target, action_args, request_id=_TOOL_CALL_ID.get(), wait_ms=self.wait_ms
        )
        if refused:
            raise ToolException(text)
        return text


def guarded_tool(
    ledger: Ledger, provider: str, account: str, action: str, *, wait_ms: Optional[int] = None
) -> Callable[[Callable[..., Any]], GuardedTool]:
    """A decorator making a function a ledger-guarded LangChain tool."""

    def wrap(build_args: Callable[..., Any]) -> GuardedTool:
        return GuardedTool(
            name=build_args.__name__,
            description=(build_args.__doc__ or build_args.__name__).strip(),
            args_schema=create_schema_from_function(build_args.__name__, build_args),
            ledger=ledger,
            target={"provider": provider, "account": account, "action": action},
            wait_ms=wait_ms,
            build_args=build_args,
        )

    return wrap


def ledger_tools(ledger: Ledger, *, wait_ms: Optional[int] = None) -> List[GuardedTool]:
    """Every action this tenant may use, as LangChain tools (their schemas as JSON Schema)."""
    return [
        GuardedTool(
            name=action["name"],
            description=action["description"],
            args_schema=dict(action["input_schema"]),
            ledger=ledger,
            target=action,
            wait_ms=wait_ms,
        )
        for action in ledger.actions()
    ]
