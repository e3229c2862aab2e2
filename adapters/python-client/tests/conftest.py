"""What every test stands on: the running ``opledger serve`` and CRM stand the Rust test
(tests/serve/python.rs) started, named by environment variables. A missing one fails the run:
these tests never skip."""

import json
import os
import time
import urllib.request

import pytest

from opledger_client import Ledger

REQUIRED = ("OPLEDGER_BASE_URL", "OPLEDGER_TOKEN", "OPLEDGER_STAND_URL", "OPLEDGER_OPENAPI", "OPLEDGER_ACCOUNT")
#: How long a test waits for an outcome before it fails, in seconds.
DEADLINE_S = 30.0


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run these tests through `cargo test --test serve python`")
    return value


@pytest.fixture(scope="session")
def ledger() -> Ledger:
    for name in REQUIRED:
        env(name)
    return Ledger(env("OPLEDGER_BASE_URL"), env("OPLEDGER_TOKEN"))


@pytest.fixture(scope="session")
def account() -> str:
    return env("OPLEDGER_ACCOUNT")


@pytest.fixture(scope="session")
def openapi() -> dict:
    with open(env("OPLEDGER_OPENAPI"), encoding="utf-8") as file:
        return json.load(file)


class Stand:
    """The CRM stand's admin API: queue a fault, list what it holds."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def _call(self, method: str, path: str, body=None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def drop_next_response(self, shape: str) -> None:
        self._call("POST", "/admin/faults", {"shape": shape, "method": "POST", "kind": "drop_response"})

    def objects_titled(self, title: str) -> list:
        objects = self._call("GET", "/admin/objects")["objects"]
        return [o for o in objects if o["fields"].get("title") == title]


@pytest.fixture(scope="session")
def stand() -> Stand:
    return Stand(env("OPLEDGER_STAND_URL"))


def until_settled(ledger: Ledger, operation_id: str):
    """Reads the operation until it settles; fails after the deadline."""
    started = time.monotonic()
    while True:
        operation = ledger.status(operation_id)
        if not operation.not_confirmed:
            return operation
        assert time.monotonic() - started < DEADLINE_S, f"{operation_id} stayed {operation.state}"
        time.sleep(0.025)
