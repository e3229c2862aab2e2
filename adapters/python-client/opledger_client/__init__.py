"""A small typed client of opledger's HTTP API (``opledger serve``) for agent platforms.

``Ledger.record`` records an intent, ``Ledger.execute`` drives it and waits (bounded) for its
outcome, ``Ledger.record_and_execute`` does both in one call, ``Ledger.status`` reads where an
operation stands. ``Ledger.tool`` wraps a function as a ledger-guarded tool for LangChain- or
OpenAI-agents-style tool calling: the function builds the action's arguments, the ledger carries
the call out once, and the tool returns the one sentence the agent may say.

Requests are named by the ``Idempotency-Key`` header (the API maps it onto the source id): pass
the same key when retrying a call whose answer was lost, and the ledger answers the operation the
first call recorded instead of making a second one. The field names and states follow the
OpenAPI document the server serves at ``/v1/openapi.json`` (the tests check them against it).
"""

from __future__ import annotations

import functools
import inspect
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional

__all__ = [
    "Ledger",
    "Operation",
    "LedgerError",
    "SETTLED_STATES",
    "NOT_CONFIRMED_STATES",
    "sentence_of",
]

#: States that will not change without a person (or never).
SETTLED_STATES = frozenset({"succeeded", "rejected", "denied", "abandoned"})
#: States whose outcome is not known yet: never repeat the call, ask ``status``.
NOT_CONFIRMED_STATES = frozenset({"pending", "in_flight", "unknown", "needs_review"})
#: How long one HTTP request may take, in seconds, unless the client is told otherwise. Longer
#: than the server's largest ``wait_ms`` (30 s by default).
DEFAULT_TIMEOUT_S = 40.0


@dataclass(frozen=True)
class Operation:
    """Where one operation stands, as the API answered (schema ``Operation``)."""

    operation_id: str
    state: str
    #: The agent's sentence for the state: the only thing to tell the user.
    message: str
    external_id: Optional[str]
    attempts: int
    source_id: Optional[str]
    #: Recording: whether this call created the operation (``False``: a retry found it).
    created: Optional[bool] = None
    #: Whether the answer carried ``Idempotent-Replayed: true``.
    replayed: bool = False
    #: The whole JSON answer.
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def confirmed(self) -> bool:
        """The provider confirmed it and named the object."""
        return self.state == "succeeded" and self.external_id is not None

    @property
    def not_confirmed(self) -> bool:
        """Its outcome is not known yet: do not repeat it; ask ``status`` later."""
        return self.state in NOT_CONFIRMED_STATES

    @classmethod
    def from_json(cls, body: Mapping[str, Any], replayed: bool = False) -> "Operation":
        return cls(
            operation_id=body["operation_id"],
            state=body["state"],
            message=body["message"],
            external_id=body.get("external_id"),
            attempts=body["attempts"],
            source_id=body.get("source_id"),
            created=body.get("created"),
            replayed=replayed,
            raw=dict(body),
        )


def sentence_of(operation: Operation) -> str:
    """What a guarded tool answers: the ledger's sentence, and for a send not confirmed yet (its
    sentence says so but gives no advice) that it must not be repeated, as the MCP tools say. An
    outcome that is not confirmed is an answer, never an exception that invites a retry."""
    if operation.state in ("pending", "in_flight"):
        return (
            f"{operation.message} Not confirmed yet: do not repeat the call "
            f"(operation {operation.operation_id})."
        )
    return operation.message


class LedgerError(Exception):
    """The API refused a request (``{"error": {"code", "message"}}``), or could not be reached."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class Ledger:
    """A client of one ``opledger serve`` as one tenant (its bearer token)."""

    def __init__(self, base_url: str, token: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not token:
            raise ValueError("token is required: a tenant's token from the server's [[tenants]]")
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s

    def record(
        self,
        provider: str,
        account: str,
        action: str,
        args: Mapping[str, Any],
        *,
        idempotency_key: Optional[str] = None,
        owner: Optional[str] = None,
        requires_approval: bool = False,
    ) -> Operation:
        """Records an intent without sending anything."""
        body = _intent(provider, account, action, args, owner, requires_approval)
        return self._record(body, idempotency_key, query={})

    def record_and_execute(
        self,
        provider: str,
        account: str,
        action: str,
        args: Mapping[str, Any],
        *,
        idempotency_key: Optional[str] = None,
        wait_ms: Optional[int] = None,
        owner: Optional[str] = None,
    ) -> Operation:
        """Records an intent and executes it in the same call, waiting at most ``wait_ms``."""
        body = _intent(provider, account, action, args, owner, False)
        query = {"execute": "true"}
        if wait_ms is not None:
            query["wait_ms"] = str(wait_ms)
        return self._record(body, idempotency_key, query=query)

    def execute(self, operation_id: str, *, wait_ms: Optional[int] = None) -> Operation:
        """Drives a recorded operation and waits (at most ``wait_ms``) for its outcome."""
        query = {} if wait_ms is None else {"wait_ms": str(wait_ms)}
        path = f"/v1/operations/{urllib.parse.quote(operation_id, safe='')}/execute"
        body, _ = self._call("POST", path, query=query)
        return Operation.from_json(body)

    def status(self, operation_id: str) -> Operation:
        """Where an operation stands now."""
        body, _ = self._call("GET", f"/v1/operations/{urllib.parse.quote(operation_id, safe='')}")
        return Operation.from_json(body)

    def actions(self) -> "list[Dict[str, Any]]":
        """The configured actions this tenant may use, each described as a tool
        (``GET /v1/actions``: name, provider, action, accounts, description, input_schema,
        deduplication, idempotent_hint, destructive)."""
        body, _ = self._call("GET", "/v1/actions")
        return list(body["actions"])

    def guarded_call(
        self,
        action: Mapping[str, Any],
        args: Mapping[str, Any],
        *,
        request_id: Optional[str],
        wait_ms: Optional[int] = None,
    ) -> str:
        """Records and executes one tool call of ``action`` (an entry of :meth:`actions`, or a
        mapping with ``provider``, ``account`` and ``action``) under ``request_id`` (the agent
        framework's tool-call id, the same on a retry) and returns what the agent may say. With
        several accounts at the provider, ``args`` names one as ``account``."""
        account, rest = _account_of(action, args)
        operation = self.record_and_execute(
            action["provider"],
            account,
            action["action"],
            rest,
            idempotency_key=request_id,
            wait_ms=wait_ms,
        )
        return sentence_of(operation)

    def tool(
        self, provider: str, account: str, action: str, *, wait_ms: Optional[int] = None
    ) -> Callable[[Callable[..., Mapping[str, Any]]], Callable[..., str]]:
        """Wraps a function as a ledger-guarded tool.

        The function takes the tool's parameters and returns the action's arguments. The tool
        takes the same parameters plus an optional ``request_id`` (pass the agent framework's
        tool-call id, the same on a retry): it records and executes the action once under that
        key and returns the ledger's sentence. Name, docstring and signature are kept, so a
        framework that reads them (LangChain's ``@tool``, OpenAI agents' ``function_tool``)
        offers the tool as the function describes it.
        """

        def wrap(build_args: Callable[..., Mapping[str, Any]]) -> Callable[..., str]:
            @functools.wraps(build_args)
            def guarded(*args: Any, request_id: Optional[str] = None, **kwargs: Any) -> str:
                operation = self.record_and_execute(
                    provider,
                    account,
                    action,
                    build_args(*args, **kwargs),
                    idempotency_key=request_id,
                    wait_ms=wait_ms,
                )
                guarded.last_operation = operation  # type: ignore[attr-defined]
                return sentence_of(operation)

            signature = inspect.signature(build_args)
            request_id = inspect.Parameter(
                "request_id", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Optional[str]
            )
            guarded.__signature__ = signature.replace(  # type: ignore[attr-defined]
                parameters=[*signature.parameters.values(), request_id], return_annotation=str
            )
            return guarded

        return wrap

    def _record(
        self, body: Dict[str, Any], idempotency_key: Optional[str], query: Dict[str, str]
    ) -> Operation:
        headers = {} if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        answer, replayed = self._call("POST", "/v1/operations", query=query, body=body, headers=headers)
        return Operation.from_json(answer, replayed=replayed)

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Dict[str, str]] = None,
        body: Optional[Dict[str, Any]] = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> "tuple[Dict[str, Any], bool]":
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        request = urllib.request.Request(url, method=method)
        request.add_header("Authorization", f"Bearer {self._token}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, data=data, timeout=self.timeout_s) as response:
                replayed = response.headers.get("Idempotent-Replayed") == "true"
                return json.loads(response.read()), replayed
        except urllib.error.HTTPError as error:
            raise _api_error(error) from None
        except urllib.error.URLError as error:
            # Whether a POST reached the server is unknown: repeat it with the same key.
            raise LedgerError(0, "unreachable", f"{url}: {error.reason}; repeat the call with the same idempotency key") from None


def _intent(
    provider: str,
    account: str,
    action: str,
    args: Mapping[str, Any],
    owner: Optional[str],
    requires_approval: bool,
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"provider": provider, "account": account, "action": action, "args": dict(args)}
    if owner is not None:
        body["owner"] = owner
    if requires_approval:
        body["requires_approval"] = True
    return body


def arguments_of(
    build_args: Callable[..., Optional[Mapping[str, Any]]], args: "tuple[Any, ...]", kwargs: Mapping[str, Any]
) -> Dict[str, Any]:
    """The action's arguments for one call of a guarded function: what it returns, or, when it
    returns nothing (a function that only declares the tool), its own arguments by name."""
    built = build_args(*args, **kwargs)
    if built is None:
        bound = inspect.signature(build_args).bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)
    if not isinstance(built, Mapping):
        raise TypeError(
            f"{getattr(build_args, '__name__', 'the function')} must return the action's arguments "
            f"(a mapping) or nothing (its arguments are the action's); it returned {type(built).__name__}"
        )
    return dict(built)


def _account_of(action: Mapping[str, Any], args: Mapping[str, Any]) -> "tuple[str, Dict[str, Any]]":
    """The account a tool call acts in, and the action's own arguments."""
    rest = dict(args)
    if "accounts" not in action:
        return action["account"], rest
    accounts = list(action["accounts"])
    if len(accounts) == 1:
        return accounts[0], rest
    named = rest.pop("account", None)
    if named not in accounts:
        raise LedgerError(
            422,
            "invalid_input",
            f"`account` must be one of {', '.join(accounts)} (got {named!r}); nothing was recorded",
        )
    return named, rest


def _api_error(error: urllib.error.HTTPError) -> LedgerError:
    try:
        detail = json.loads(error.read())["error"]
        return LedgerError(error.code, detail["code"], detail["message"])
    except (ValueError, KeyError, TypeError):
        return LedgerError(error.code, "http_error", str(error))
