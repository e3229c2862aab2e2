"""A small typed client of opledger's HTTP API (``opledger serve``) for agent platforms.

``Ledger.record`` records an intent, ``Ledger.execute`` drives it and waits (bounded) for its
outcome, ``Ledger.record_and_execute`` does both in one call, ``Ledger.status`` reads where an
operation stands. ``Ledger.tool`` wraps a function as a ledger-guarded tool for LangChain- or
OpenAI-agents-style tool calling: the function builds the action's arguments, the ledger carries
the call out once, and the tool returns the one sentence the agent may say.

Requests are named by the ``Idempotency-Key`` header (the API maps it onto the source id): pass
the same key when retrying a call whose answer was lost, and the ledger answers the operation the
first call recorded instead of making a second one. Every record carries one (a fresh random key
when none is given), so the client repeats a record by itself after no answer, a timeout, a 503
or a 429, under the same key, a bounded number of times: a repeat is safe by construction.
``wait_for`` waits for an operation to settle; ``outcomes`` follows the outcome feed.
``Ledger.step`` guards a function of your own (a side effect no connector makes): the ledger
records it, the function runs once under a claim, and its outcome is recorded; a repeat answers
the recorded outcome, and a run whose outcome was lost goes to a person, never runs again. Failures
are typed (``IdempotencyKeyReused``, ``InvalidInput``, ``NotFound``, ``Unauthorized``,
``RateLimited``, ``Unavailable``, …), all ``LedgerError``. The field names and states follow the
OpenAPI document the server serves at ``/v1/openapi.json`` (the tests check them against it).

It must never depend on anything outside the standard library (the async client, in ``aio``,
is the one that uses httpx).
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import inspect
import json
import random
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence

__all__ = [
    "Ledger",
    "Operation",
    "LedgerError",
    "InvalidInput",
    "IdempotencyKeyReused",
    "Conflict",
    "NotFound",
    "Unauthorized",
    "RateLimited",
    "Unavailable",
    "WaitTimedOut",
    "StepError",
    "StepFailed",
    "StepNotConfirmed",
    "StepInProgress",
    "StepDidNotApply",
    "SETTLED_STATES",
    "NOT_CONFIRMED_STATES",
    "refusal_text",
    "sentence_of",
]

#: States that will not change without a person (or never).
SETTLED_STATES = frozenset({"succeeded", "rejected", "denied", "abandoned"})
#: States whose outcome is not known yet: never repeat the call, ask ``status``.
NOT_CONFIRMED_STATES = frozenset({"pending", "in_flight", "unknown", "needs_review"})
#: How long one HTTP request may take, in seconds, unless the client is told otherwise. Longer
#: than the server's largest ``wait_ms`` (30 s by default).
DEFAULT_TIMEOUT_S = 40.0
#: How many times a request that is safe to repeat is repeated after a connection error, a timeout,
#: a 503 or a 429 (Stripe's SDKs repeat twice by default). A record is repeated with the same
#: Idempotency-Key, so a repeat finds the operation the lost attempt recorded.
DEFAULT_MAX_RETRIES = 2
#: The first pause before a repeat, in seconds; each further one doubles, with full jitter.
RETRY_BASE_S = 0.5
#: The longest pause before one repeat, in seconds.
RETRY_CAP_S = 8.0
#: How many times in a row the outcome feed reconnects without receiving an event before it
#: raises (naming the position to resume from).
MAX_CONSECUTIVE_RECONNECTS = 20
#: The pause before the outcome feed reconnects, in seconds.
RECONNECT_PAUSE_S = 0.5
#: How long a step's claim holds without an outcome unless the step says otherwise, in
#: milliseconds (the server's default): make it longer than the function runs. When it runs out
#: without an outcome, the step is unknown and goes to a person.
DEFAULT_STEP_LEASE_MS = 30_000
#: The first pause between two reads of ``wait_for``, in seconds; it grows to ``WAIT_POLL_CAP_S``.
WAIT_POLL_S = 0.05
WAIT_POLL_CAP_S = 1.0


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
    """The API refused a request (``{"error": {"code", "message"}}``), or could not be reached.

    ``status`` is the HTTP status (0 when no answer came), ``code`` the API's stable code,
    ``message`` what is wrong and what to do, ``request_id`` the idempotency key the request was
    sent under (the same on every repeat), when it had one. Catch a subclass to act on one family.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        request_id: Optional[str] = None,
        fields: Sequence[Mapping[str, str]] = (),
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        #: With ``invalid_input``: every failing field (``pointer``, ``message``).
        self.fields = list(fields)

    @property
    def retryable(self) -> bool:
        """Whether the same request may be repeated as it is (the server said so, or never
        answered): what the client itself repeats, up to ``max_retries``."""
        return self.status in (0, 429, 503)


class InvalidInput(LedgerError):
    """422 ``invalid_input`` (and the other malformed-request codes): fix the request."""


class IdempotencyKeyReused(LedgerError):
    """409 ``idempotency_key_reused`` / ``source_id_reused``: the key named another request."""


class Conflict(LedgerError):
    """409: refused by the ledger's rules (``refused``, ``stale``, ``duplicate_risk_not_accepted``)."""


class NotFound(LedgerError):
    """404: no such operation (or not this tenant's)."""


class Unauthorized(LedgerError):
    """401 / 403: the token is unknown or may not do this."""


class RateLimited(LedgerError):
    """429: too many requests at once; repeated by the client up to ``max_retries``."""


class Unavailable(LedgerError):
    """503, a timeout or no answer at all: whether a record arrived is unknown, so it is repeated
    with the same idempotency key (by the client, up to ``max_retries``; then by you)."""


class WaitTimedOut(LedgerError):
    """``wait_for`` reached its timeout before the operation settled; ``operation`` is where it
    stood last."""

    def __init__(self, operation: "Operation", timeout_s: float) -> None:
        super().__init__(
            0,
            "wait_timed_out",
            f"operation {operation.operation_id} is still {operation.state} after {timeout_s} s; "
            "it is not confirmed: do not repeat it, ask its status later",
        )
        self.operation = operation


class StepError(LedgerError):
    """A guarded step did not give a result: ``operation`` is where the ledger says it stands."""

    def __init__(self, operation: "Operation", code: str, message: str) -> None:
        super().__init__(409, code, message)
        self.operation = operation


class StepFailed(StepError):
    """The step's function failed without taking effect (recorded as ``rejected``); a repeat with
    the same key answers this again without running it."""


class StepNotConfirmed(StepError):
    """Whether the step took effect is unknown (``unknown``, ``needs_review``: its process
    stopped reporting, or the function could not tell): the function is never run again for this
    key; a person checks and decides. ``operation.message`` is what to tell the user."""


class StepInProgress(StepNotConfirmed):
    """Another process holds the step's claim now (``in_flight``): do not run it here; wait for
    its outcome (``wait_for``), or for its claim to run out (then a person decides)."""


class StepDidNotApply(Exception):
    """Raise it (or an exception of a class named in ``not_applied=``) from a guarded function
    when nothing took effect: the step is recorded as failed (``rejected``), not as unknown. Any
    other exception is recorded as "may have taken effect", which a person then checks."""


_BY_CODE = {
    "idempotency_key_reused": IdempotencyKeyReused,
    "source_id_reused": IdempotencyKeyReused,
    "invalid_input": InvalidInput,
    "malformed_json": InvalidInput,
    "invalid_path": InvalidInput,
    "too_large": InvalidInput,
    "not_found": NotFound,
    "unauthorized": Unauthorized,
    "forbidden": Unauthorized,
}
_BY_STATUS = {400: InvalidInput, 401: Unauthorized, 403: Unauthorized, 404: NotFound, 409: Conflict,
              413: InvalidInput, 422: InvalidInput, 429: RateLimited, 503: Unavailable}


def error_of(status: int, code: str, message: str, **named: Any) -> LedgerError:
    """The typed error for an answer: by the API's code, else by the HTTP status."""
    kind = _BY_CODE.get(code) or _BY_STATUS.get(status) or LedgerError
    if status == 0:
        kind = Unavailable
    return kind(status, code, message, **named)


def refusal_text(error: LedgerError) -> str:
    """What a guarded tool hands the model when the ledger refuses a call or cannot be reached:
    the API's own message, and what the model should do. Never "done"."""
    if isinstance(error, Unavailable):
        return (
            f"The ledger did not answer ({error.code}: {error.message}). The call is not confirmed: "
            "do not repeat it with other arguments; ask for its status later."
        )
    return f"The ledger refused the call ({error.code}): {error.message}"


@dataclass(frozen=True)
class _Request:
    """One API request as data, the same for the synchronous and the async client: each sends it
    its own way, and repeats it when ``retry`` says it is safe (a read, or a request named by an
    Idempotency-Key)."""

    method: str
    path: str
    query: Dict[str, str] = field(default_factory=dict)
    body: Optional[Dict[str, Any]] = None
    headers: Dict[str, str] = field(default_factory=dict)
    retry: bool = False

    @property
    def key(self) -> Optional[str]:
        return self.headers.get("Idempotency-Key")


def _record_request(
    body: Dict[str, Any], idempotency_key: Optional[str], *, execute: bool, wait_ms: Optional[int]
) -> _Request:
    """``POST /v1/operations``. Every record carries a key (a fresh one when none is given), so a
    record whose answer was lost can be repeated safely."""
    query = {"execute": "true"} if execute else {}
    if wait_ms is not None:
        query["wait_ms"] = str(wait_ms)
    key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
    return _Request("POST", "/v1/operations", query, body, {"Idempotency-Key": key}, retry=True)


def _operation_path(operation_id: str) -> str:
    return f"/v1/operations/{urllib.parse.quote(operation_id, safe='')}"


def _execute_request(operation_id: str, wait_ms: Optional[int]) -> _Request:
    """``POST …/execute``: idempotent by the operation's id (a repeat drives the same operation)."""
    query = {} if wait_ms is None else {"wait_ms": str(wait_ms)}
    return _Request("POST", _operation_path(operation_id) + "/execute", query, retry=True)


def _status_request(operation_id: str) -> _Request:
    return _Request("GET", _operation_path(operation_id), retry=True)


_ACTIONS_REQUEST = _Request("GET", "/v1/actions", retry=True)


def _events_request(last: Optional[int], types: Optional[Sequence[str]]) -> _Request:
    """``GET /v1/events`` resumed after ``last`` (``Last-Event-ID``)."""
    headers = {"Accept": "text/event-stream"}
    if last is not None:
        headers["Last-Event-ID"] = str(last)
    query = {"types": ",".join(types)} if types else {}
    return _Request("GET", "/v1/events", query, headers=headers)


def _step_request(body: Dict[str, Any], key: str) -> _Request:
    """``POST /v1/steps`` under ``key`` (the step's source id): a repeat finds the same step."""
    return _Request("POST", "/v1/steps", body=body, headers={"Idempotency-Key": key}, retry=True)


def _claim_request(operation_id: str, attempt_id: str, lease_ms: int, caller: Optional[str]) -> _Request:
    """``POST …/claim`` under an attempt id chosen here, so a claim whose answer was lost is
    repeated as the same claim."""
    body: Dict[str, Any] = {"attempt_id": attempt_id, "lease_ms": lease_ms}
    if caller is not None:
        body["caller"] = caller
    return _Request("POST", _operation_path(operation_id) + "/claim", body=body, retry=True)


def _outcome_request(operation_id: str, attempt_id: str, body: Dict[str, Any]) -> _Request:
    """``POST …/attempts/{attempt_id}/outcome``: the same report again records nothing new."""
    path = _operation_path(operation_id) + f"/attempts/{urllib.parse.quote(attempt_id, safe='')}/outcome"
    return _Request("POST", path, body=body, retry=True)


@dataclass(frozen=True)
class _Step:
    """One guarded function: what it records, how its result is named, which failures mean
    nothing took effect. Shared by the synchronous and the async client."""

    function: Callable[..., Any]
    provider: str
    action: str
    key: Optional[Callable[..., str]]
    result_id: Callable[[Any], Any]
    not_applied: "tuple[type, ...]"
    lease_ms: int
    caller: Optional[str]

    def takes_key(self) -> bool:
        parameters = inspect.signature(self.function).parameters
        return "idempotency_key" in parameters or any(
            parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values()
        )

    def arguments(self, args: "tuple[Any, ...]", kwargs: Mapping[str, Any]) -> Dict[str, Any]:
        """The function's arguments by name (the key it is given left out), as JSON values."""
        bound = inspect.signature(self.function).bind_partial(*args, **kwargs)
        bound.apply_defaults()
        named = {name: value for name, value in bound.arguments.items() if name != "idempotency_key"}
        for name, value in named.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                raise TypeError(
                    f"argument `{name}` of step {self.provider}.{self.action} is a "
                    f"{type(value).__name__}, which is not JSON; the ledger records the arguments, "
                    "so pass plain values (str, int, float, bool, None, lists, dicts)"
                ) from None
        return named

    def key_of(self, args: "tuple[Any, ...]", kwargs: Mapping[str, Any], named: Mapping[str, Any]) -> str:
        """The step's source id: ``key(...)`` when given, else one derived from the provider, the
        action and the arguments, so a repeat of the same call finds the same step (and two calls
        with the same arguments are one step: pass ``source_id=`` to tell them apart)."""
        if self.key is not None:
            return str(self.key(*args, **kwargs))
        canonical = json.dumps([self.provider, self.action, named], sort_keys=True, separators=(",", ":"))
        return "step-" + hashlib.sha256(canonical.encode()).hexdigest()[:40]

    def body(self, named: Mapping[str, Any]) -> Dict[str, Any]:
        return {"provider": self.provider, "action": self.action, "args": dict(named)}

    def success(self, result: Any) -> Dict[str, Any]:
        return {"outcome": "succeeded", "external_id": str(self.result_id(result))}

    def failure(self, error: BaseException) -> Dict[str, Any]:
        applied = "no" if isinstance(error, (StepDidNotApply, *self.not_applied)) else "unknown"
        message = f"{type(error).__name__}: {error}"[:4000]
        return {"outcome": "failed", "applied": applied, "code": type(error).__name__, "message": message}


def _result_id(result: Any) -> Any:
    """What a guarded function's result is recorded as: itself when it is a str or an int, else
    its ``id`` (a mapping's key or an attribute)."""
    if isinstance(result, (str, int)) and not isinstance(result, bool):
        return result
    if isinstance(result, Mapping) and "id" in result:
        return result["id"]
    if getattr(result, "id", None) is not None:
        return result.id
    raise TypeError(
        f"a guarded step must return what it made (an id: a str or an int, or something with an "
        f"`id`), or be given result_id= to name it; it returned a {type(result).__name__}"
    )


def _recorded_answer(operation: "Operation") -> Optional[str]:
    """What a step already recorded answers, if it is settled or not to be run here: its result
    (``succeeded``), else the typed error. ``None`` when it is pending: claim it and run it."""
    state = operation.state
    if state == "succeeded":
        return operation.external_id
    if state == "pending":
        return None
    if state == "rejected":
        raise StepFailed(operation, "step_failed", operation.message)
    if state == "in_flight":
        raise StepInProgress(operation, "step_in_progress", operation.message)
    if state in ("unknown", "needs_review"):
        raise StepNotConfirmed(operation, "step_not_confirmed", operation.message)
    raise StepFailed(operation, f"step_{state}", operation.message)


def _step_decorator(
    provider: str,
    action: str,
    key: Optional[Callable[..., str]],
    result_id: Optional[Callable[[Any], Any]],
    not_applied: Sequence[type],
    lease_ms: Optional[int],
    caller: Optional[str],
) -> Callable[[Callable[..., Any]], _Step]:
    def describe(function: Callable[..., Any]) -> _Step:
        return _Step(
            function=function,
            provider=provider,
            action=action,
            key=key,
            result_id=result_id or _result_id,
            not_applied=tuple(not_applied),
            lease_ms=DEFAULT_STEP_LEASE_MS if lease_ms is None else lease_ms,
            caller=caller,
        )

    return describe


def _backoff_s(attempt: int) -> float:
    """The pause before repeat number ``attempt`` (from 1): exponential, capped, full jitter."""
    return random.uniform(0, min(RETRY_CAP_S, RETRY_BASE_S * 2 ** (attempt - 1)))


def _refusal_of(status: int, text: "str | bytes", key: Optional[str]) -> LedgerError:
    """The typed error for an answer of ``status`` >= 400 whose body is ``text``."""
    try:
        detail = json.loads(text)["error"]
        return error_of(status, detail["code"], detail["message"], request_id=key, fields=detail.get("fields") or ())
    except (ValueError, KeyError, TypeError):
        shown = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        return error_of(status, "http_error", shown[:500], request_id=key)


def _unreachable_of(request: _Request, reason: object, timed_out: bool) -> Unavailable:
    """No answer (a timeout, a refused or reset connection): whether a POST arrived is unknown,
    so it is repeated with the same key."""
    return Unavailable(
        0,
        "timeout" if timed_out else "unreachable",
        f"{request.method} {request.path}: {reason}; repeat the call with the same idempotency key",
        request_id=request.key,
    )


class _EventReader:
    """Reads a Server-Sent Events stream line by line, as the WHATWG rules read it: ``feed``
    answers ``(id, data)`` when a line ends an event."""

    def __init__(self) -> None:
        self._id: Optional[str] = None
        self._data: List[str] = []

    def feed(self, line: str) -> "Optional[tuple[Optional[str], str]]":
        line = line.rstrip("\r\n")
        if line == "":
            event = (self._id, "\n".join(self._data)) if self._data else None
            self._id, self._data = None, []
            return event
        if not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                self._data.append(value)
            elif name == "id":
                self._id = value
        return None


def _outcome_of(event: "tuple[Optional[str], str]") -> "tuple[int, Dict[str, Any]]":
    """An outcome feed event's position (its id, else its own ``position``) and body."""
    event_id, data = event
    outcome = json.loads(data)
    return (int(event_id) if event_id is not None else outcome["position"]), outcome


def _feed_broke(reconnects: int, max_reconnects: int, last: Optional[int]) -> None:
    """Raises once the outcome feed has ended more often in a row than it may."""
    if reconnects > max_reconnects:
        raise Unavailable(0, "unreachable", f"the outcome feed ended {reconnects} times in a row; resume with after={last}")


class Ledger:
    """A client of one ``opledger serve`` as one tenant (its bearer token)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        max_retries: int = DEFAULT_MAX_RETRIES,
    ) -> None:
        if not token:
            raise ValueError("token is required: a tenant's token from the server's [[tenants]]")
        if max_retries < 0:
            raise ValueError("max_retries must be 0 or more")
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        #: How the client pauses between repeats (a test may make it instant).
        self.sleep: Callable[[float], None] = time.sleep

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
        return self._record(_record_request(body, idempotency_key, execute=False, wait_ms=None))

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
        return self._record(_record_request(body, idempotency_key, execute=True, wait_ms=wait_ms))

    def execute(self, operation_id: str, *, wait_ms: Optional[int] = None) -> Operation:
        """Drives a recorded operation and waits (at most ``wait_ms``) for its outcome."""
        body, _ = self._call(_execute_request(operation_id, wait_ms))
        return Operation.from_json(body)

    def status(self, operation_id: str) -> Operation:
        """Where an operation stands now."""
        body, _ = self._call(_status_request(operation_id))
        return Operation.from_json(body)

    def actions(self) -> "list[Dict[str, Any]]":
        """The configured actions this tenant may use, each described as a tool
        (``GET /v1/actions``: name, provider, action, accounts, description, input_schema,
        deduplication, idempotent_hint, destructive)."""
        body, _ = self._call(_ACTIONS_REQUEST)
        return list(body["actions"])

    def wait_for(self, operation_id: str, timeout_s: float = 30.0) -> Operation:
        """Waits until the operation settles (succeeded, rejected, denied, abandoned) and returns
        it, like Temporal's ``handle.result()``; raises :class:`WaitTimedOut` (with where it
        stood) after ``timeout_s``. An operation with a person (``needs_review``) waits for them."""
        deadline = time.monotonic() + timeout_s
        pause = WAIT_POLL_S
        while True:
            operation = self.status(operation_id)
            if operation.state in SETTLED_STATES:
                return operation
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimedOut(operation, timeout_s)
            self.sleep(min(pause, left))
            pause = min(pause * 2, WAIT_POLL_CAP_S)

    def outcomes(
        self,
        *,
        after: Optional[int] = None,
        types: Optional[Sequence[str]] = None,
        max_reconnects: int = MAX_CONSECUTIVE_RECONNECTS,
        reconnect_s: float = RECONNECT_PAUSE_S,
    ) -> Iterator[Dict[str, Any]]:
        """The outcome feed (``GET /v1/events``, Server-Sent Events) as an iterator of events. It
        resumes by itself: when the stream ends or breaks it reconnects with ``Last-Event-ID`` set
        to the last event it yielded, so no event is skipped or repeated; pass the last
        ``position`` you processed as ``after`` to resume across restarts. After
        ``max_reconnects`` reconnections in a row without an event it raises :class:`Unavailable`
        naming the position to resume from."""
        last = after
        reconnects = 0
        while True:
            try:
                with self._open(_events_request(last, types), timeout=None) as response:
                    reader = _EventReader()
                    for raw in response:
                        event = reader.feed(raw.decode("utf-8"))
                        if event is not None:
                            last, outcome = _outcome_of(event)
                            reconnects = 0
                            yield outcome
            except LedgerError as error:
                if not error.retryable:
                    raise
            except (OSError, http.client.HTTPException):
                pass  # a broken stream is resumed from the last event yielded
            reconnects += 1
            _feed_broke(reconnects, max_reconnects, last)
            self.sleep(reconnect_s)

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
        """Guards a function of your own that has a side effect (a charge, an e-mail): the ledger
        records the call as a step (``provider``, ``action``, the arguments), the function runs
        once while this process holds the step's claim (``lease_ms``), and what it made is
        recorded. The wrapper returns the recorded result (``str``: what ``result_id`` names).

        The call is named by ``key(*args, **kwargs)``, by a ``source_id=`` keyword at the call,
        or else by its arguments. A repeat under the same name returns the recorded result
        without running the function; a recorded failure raises :class:`StepFailed`; a step
        whose outcome is unknown (the process was killed after the function ran, before it
        reported) raises :class:`StepNotConfirmed` and is never run again: a person decides. A
        function with an ``idempotency_key`` parameter is given the step's key, the same on every
        attempt, to pass on to its own system.

        An exception from the function is recorded and raised again: as "nothing took effect"
        for :class:`StepDidNotApply` and the classes in ``not_applied``, else as unknown.
        """

        describe = _step_decorator(provider, action, key, result_id, not_applied, lease_ms, caller)

        def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
            step = describe(function)

            @functools.wraps(function)
            def guarded(*args: Any, source_id: Optional[str] = None, **kwargs: Any) -> Any:
                return self._run_step(step, args, kwargs, source_id, guarded)

            return guarded

        return wrap

    def _run_step(
        self, step: _Step, args: "tuple[Any, ...]", kwargs: Dict[str, Any], source_id: Optional[str], guarded: Any
    ) -> Any:
        named = step.arguments(args, kwargs)
        name = source_id if source_id is not None else step.key_of(args, kwargs, named)
        operation = self._record(_step_request(step.body(named), name))
        guarded.last_operation = operation
        recorded = _recorded_answer(operation)
        if recorded is not None:
            return recorded
        try:
            claim, _ = self._call(_claim_request(operation.operation_id, str(uuid.uuid4()), step.lease_ms, step.caller))
        except Conflict:
            # Another process claimed it first, or it moved on: answer where it stands.
            operation = self.status(operation.operation_id)
            guarded.last_operation = operation
            return _recorded_answer(operation) or self._not_claimed(operation)
        attempt_id = claim["attempt_id"]
        if step.takes_key():
            kwargs = {**kwargs, "idempotency_key": claim["idempotency_key"]}
        try:
            result = step.function(*args, **kwargs)
        except BaseException as error:
            try:
                guarded.last_operation = self._report(operation.operation_id, attempt_id, step.failure(error))
            except LedgerError:
                pass  # unreported, its claim runs out: the step becomes unknown, and a person decides
            raise
        report = step.success(result)
        operation = self._report(operation.operation_id, attempt_id, report)
        guarded.last_operation = operation
        answer = _recorded_answer(operation)
        return answer if answer is not None else self._not_claimed(operation)

    def _report(self, operation_id: str, attempt_id: str, report: Dict[str, Any]) -> Operation:
        body, _ = self._call(_outcome_request(operation_id, attempt_id, report))
        return Operation.from_json(body)

    @staticmethod
    def _not_claimed(operation: Operation) -> Any:
        raise StepNotConfirmed(operation, "step_not_confirmed", operation.message)

    def guarded_answer(
        self,
        action: Mapping[str, Any],
        args: Mapping[str, Any],
        *,
        request_id: Optional[str],
        wait_ms: Optional[int] = None,
    ) -> "tuple[str, bool]":
        """:meth:`guarded_call` for a framework adapter: ``(text, refused)``. A refusal is the
        API's message as text (``refused``), which the adapter hands to the model as the
        framework's tool error. A ledger that never answered, even after the client's own
        repeats, is an answer like an unknown outcome ("not confirmed: do not repeat it"), never
        an error inviting the model to call again under a new tool-call id."""
        try:
            return self.guarded_call(action, args, request_id=request_id, wait_ms=wait_ms), False
        except Unavailable as error:
            return refusal_text(error), False
        except LedgerError as error:
            return refusal_text(error), True

    def _record(self, request: _Request) -> Operation:
        answer, replayed = self._call(request)
        return Operation.from_json(answer, replayed=replayed)

    def _call(self, request: _Request) -> "tuple[Dict[str, Any], bool]":
        """One request and its JSON answer, repeated up to ``max_retries`` times when that is
        safe: a read, or a request named by an Idempotency-Key (``retry``), after no answer, a
        timeout, a 503 or a 429. Pauses grow exponentially with full jitter, capped."""
        attempt = 0
        while True:
            try:
                with self._open(request) as response:
                    replayed = response.headers.get("Idempotent-Replayed") == "true"
                    return json.loads(response.read()), replayed
            except LedgerError as error:
                failure = error
            except (OSError, http.client.HTTPException) as error:
                # The answer broke off while it was being read: as unknown as no answer at all.
                failure = _unreachable(request, error)
            if not (request.retry and failure.retryable and attempt < self.max_retries):
                raise failure from None
            attempt += 1
            self.sleep(_backoff_s(attempt))

    def _open(self, request: _Request, *, timeout: "Optional[float] | str" = "default") -> Any:
        """Sends one request and returns the open response; a refusal is a typed LedgerError."""
        url = self.base_url + request.path
        if request.query:
            url += "?" + urllib.parse.urlencode(request.query)
        sent = urllib.request.Request(url, method=request.method)
        sent.add_header("Authorization", f"Bearer {self._token}")
        for name, value in request.headers.items():
            sent.add_header(name, value)
        data = None
        if request.body is not None:
            data = json.dumps(request.body).encode()
            sent.add_header("Content-Type", "application/json")
        limit = self.timeout_s if timeout == "default" else timeout
        try:
            return urllib.request.urlopen(sent, data=data, timeout=limit)
        except urllib.error.HTTPError as error:
            try:
                text = error.read()
            except OSError:
                text = str(error).encode()
            raise _refusal_of(error.code, text, request.key) from None
        except (OSError, http.client.HTTPException) as error:
            # URLError, a timeout (TimeoutError, socket.timeout), a reset connection.
            raise _unreachable(request, error) from None


def _unreachable(request: _Request, error: BaseException) -> Unavailable:
    reason = getattr(error, "reason", None) or error
    timed_out = isinstance(reason, TimeoutError) or "timed out" in str(reason)
    return _unreachable_of(request, reason or type(error).__name__, timed_out)


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
        raise InvalidInput(
            422,
            "invalid_input",
            f"`account` must be one of {', '.join(accounts)} (got {named!r}); nothing was recorded",
        )
    return named, rest
