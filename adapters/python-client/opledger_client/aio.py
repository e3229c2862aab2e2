"""The async client: :class:`AsyncLedger` is :class:`opledger_client.Ledger` with ``async`` /
``await``, over httpx (install the ``async`` extra). The same requests, the same typed errors,
the same safe repeats: a read, or a request named by an Idempotency-Key, repeated with that key
after no answer, a timeout, a 503 or a 429, up to ``max_retries`` times with jittered backoff.

It must never be what the synchronous client depends on: that one stays on the standard library.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
import uuid
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Sequence

import httpx

from . import (
    _ACTIONS_REQUEST,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT_S,
    MAX_CONSECUTIVE_RECONNECTS,
    RECONNECT_PAUSE_S,
    SETTLED_STATES,
    WAIT_POLL_CAP_S,
    WAIT_POLL_S,
    LedgerError,
    Operation,
    Unavailable,
    WaitTimedOut,
    Conflict,
    StepNotConfirmed,
    _account_of,
    _claim_request,
    _outcome_request,
    _recorded_answer,
    _Step,
    _step_decorator,
    _step_request,
    _backoff_s,
    _EventReader,
    _events_request,
    _execute_request,
    _feed_broke,
    _intent,
    _outcome_of,
    _record_request,
    _refusal_of,
    _Request,
    _status_request,
    _unreachable_of,
    refusal_text,
    sentence_of,
)

__all__ = ["AsyncLedger"]


class AsyncLedger:
    """A client of one ``opledger serve`` as one tenant (its bearer token), for asyncio code.
    Use it as ``async with AsyncLedger(...) as ledger:`` or call :meth:`aclose` at the end."""

    def __init__(
        self,
        base_url: str,
        token: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        max_retries: int = DEFAULT_MAX_RETRIES,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        if not token:
            raise ValueError("token is required: a tenant's token from the server's [[tenants]]")
        if max_retries < 0:
            raise ValueError("max_retries must be 0 or more")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        #: How the client pauses between repeats (a test may make it instant).
        self.sleep = asyncio.sleep
        self._http = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s, transport=transport
        )

    async def __aenter__(self) -> "AsyncLedger":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def record(
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
        return await self._record(_record_request(body, idempotency_key, execute=False, wait_ms=None))

    async def record_and_execute(
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
        return await self._record(_record_request(body, idempotency_key, execute=True, wait_ms=wait_ms))

    async def execute(self, operation_id: str, *, wait_ms: Optional[int] = None) -> Operation:
        """Drives a recorded operation and waits (at most ``wait_ms``) for its outcome."""
        body, _ = await self._call(_execute_request(operation_id, wait_ms))
        return Operation.from_json(body)

    async def status(self, operation_id: str) -> Operation:
        """Where an operation stands now."""
        body, _ = await self._call(_status_request(operation_id))
        return Operation.from_json(body)

    async def actions(self) -> List[Dict[str, Any]]:
        """The configured actions this tenant may use, each described as a tool."""
        body, _ = await self._call(_ACTIONS_REQUEST)
        return list(body["actions"])

    async def wait_for(self, operation_id: str, timeout_s: float = 30.0) -> Operation:
        """Waits until the operation settles and returns it; raises :class:`WaitTimedOut`."""
        deadline = time.monotonic() + timeout_s
        pause = WAIT_POLL_S
        while True:
            operation = await self.status(operation_id)
            if operation.state in SETTLED_STATES:
                return operation
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimedOut(operation, timeout_s)
            await self.sleep(min(pause, left))
            pause = min(pause * 2, WAIT_POLL_CAP_S)

    async def outcomes(
        self,
        *,
        after: Optional[int] = None,
        types: Optional[Sequence[str]] = None,
        max_reconnects: int = MAX_CONSECUTIVE_RECONNECTS,
        reconnect_s: float = RECONNECT_PAUSE_S,
    ) -> AsyncIterator[Dict[str, Any]]:
        """The outcome feed, resumed with ``Last-Event-ID`` after a break (see
        :meth:`opledger_client.Ledger.outcomes`)."""
        last = after
        reconnects = 0
        while True:
            request = _events_request(last, types)
            try:
                async with self._http.stream(
                    "GET", self.base_url + request.path, params=request.query, headers=request.headers, timeout=None
                ) as response:
                    if response.status_code >= 400:
                        raise _refusal_of(response.status_code, await response.aread(), None)
                    reader = _EventReader()
                    async for line in response.aiter_lines():
                        event = reader.feed(line)
                        if event is not None:
                            last, outcome = _outcome_of(event)
                            reconnects = 0
                            yield outcome
            except LedgerError as error:
                if not error.retryable:
                    raise
            except httpx.TransportError:
                pass  # a broken stream is resumed from the last event yielded
            reconnects += 1
            _feed_broke(reconnects, max_reconnects, last)
            await self.sleep(reconnect_s)

    async def guarded_call(
        self,
        action: Mapping[str, Any],
        args: Mapping[str, Any],
        *,
        request_id: Optional[str],
        wait_ms: Optional[int] = None,
    ) -> str:
        """Records and executes one tool call of ``action`` under ``request_id`` and returns what
        the agent may say (see :meth:`opledger_client.Ledger.guarded_call`)."""
        account, rest = _account_of(action, args)
        operation = await self.record_and_execute(
            action["provider"], account, action["action"], rest, idempotency_key=request_id, wait_ms=wait_ms
        )
        return sentence_of(operation)

    async def guarded_answer(
        self,
        action: Mapping[str, Any],
        args: Mapping[str, Any],
        *,
        request_id: Optional[str],
        wait_ms: Optional[int] = None,
    ) -> "tuple[str, bool]":
        """``(text, refused)``, as :meth:`opledger_client.Ledger.guarded_answer`."""
        try:
            return await self.guarded_call(action, args, request_id=request_id, wait_ms=wait_ms), False
        except Unavailable as error:
            return refusal_text(error), False
        except LedgerError as error:
            return refusal_text(error), True

    def step(
        self,
        provider: str,
        action: str,
        *,
        key: Optional[Callable[..., str]] = None,
        result_id: Optional[Callable[[Any], Any]] = None,
        not_applied: Sequence[type] = (),
        lease_ms: Optional[int] = None,
        caller: Optional[str] = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Guards a function of your own (``async def`` or plain) as
        :meth:`opledger_client.Ledger.step` does; the guarded function is a coroutine function."""

        describe = _step_decorator(provider, action, key, result_id, not_applied, lease_ms, caller)

        def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
            step = describe(function)

            @functools.wraps(function)
            async def guarded(*args: Any, source_id: Optional[str] = None, **kwargs: Any) -> Any:
                return await self._run_step(step, args, kwargs, source_id, guarded)

            return guarded

        return wrap

    async def _run_step(
        self, step: _Step, args: "tuple[Any, ...]", kwargs: Dict[str, Any], source_id: Optional[str], guarded: Any
    ) -> Any:
        named = step.arguments(args, kwargs)
        name = source_id if source_id is not None else step.key_of(args, kwargs, named)
        operation = await self._record(_step_request(step.body(named), name))
        guarded.last_operation = operation
        recorded = _recorded_answer(operation)
        if recorded is not None:
            return recorded
        claim_request = _claim_request(operation.operation_id, str(uuid.uuid4()), step.lease_ms, step.caller)
        try:
            claim, _ = await self._call(claim_request)
        except Conflict:
            operation = await self.status(operation.operation_id)
            guarded.last_operation = operation
            return _recorded_answer(operation) or _not_claimed(operation)
        attempt_id = claim["attempt_id"]
        if step.takes_key():
            kwargs = {**kwargs, "idempotency_key": claim["idempotency_key"]}
        try:
            result = step.function(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except BaseException as error:
            try:
                guarded.last_operation = await self._report(operation.operation_id, attempt_id, step.failure(error))
            except LedgerError:
                pass  # unreported, its claim runs out: the step becomes unknown, and a person decides
            raise
        operation = await self._report(operation.operation_id, attempt_id, step.success(result))
        guarded.last_operation = operation
        answer = _recorded_answer(operation)
        return answer if answer is not None else _not_claimed(operation)

    async def _report(self, operation_id: str, attempt_id: str, report: Dict[str, Any]) -> Operation:
        body, _ = await self._call(_outcome_request(operation_id, attempt_id, report))
        return Operation.from_json(body)

    async def _record(self, request: _Request) -> Operation:
        answer, replayed = await self._call(request)
        return Operation.from_json(answer, replayed=replayed)

    async def _call(self, request: _Request) -> "tuple[Dict[str, Any], bool]":
        """One request and its JSON answer, repeated as :meth:`opledger_client.Ledger._call`
        repeats it."""
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    request.method,
                    self.base_url + request.path,
                    params=request.query or None,
                    json=request.body,
                    headers=request.headers,
                )
                if response.status_code >= 400:
                    raise _refusal_of(response.status_code, response.content, request.key)
                return response.json(), response.headers.get("Idempotent-Replayed") == "true"
            except httpx.TransportError as error:
                failure: LedgerError = _unreachable_of(
                    request, repr(error), isinstance(error, httpx.TimeoutException)
                )
            except LedgerError as error:
                failure = error
            if not (request.retry and failure.retryable and attempt < self.max_retries):
                raise failure
            attempt += 1
            await self.sleep(_backoff_s(attempt))


def _not_claimed(operation: Operation) -> Any:
    raise StepNotConfirmed(operation, "step_not_confirmed", operation.message)
