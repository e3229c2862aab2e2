"""What every test stands on: the running ``opledger serve`` and CRM stand the Rust test
(tests/serve/python.rs) started, named by environment variables. A missing one fails the run:
these tests never skip."""

import json
import urllib.error
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


class FaultyProxy:
    """A real HTTP server on 127.0.0.1 in front of ``opledger serve``: it passes requests on, and
    plays the faults queued for the next POSTs to ``/v1/operations`` — ``"503_after"`` (the
    server records it, then the answer is replaced by a 503 ``outcome_unknown``), ``"drop_after"``
    (the server records it, then the connection closes without an answer), ``"slow"`` (no answer
    for ``slow_s``). It keeps the Idempotency-Key of every POST it saw."""

    def __init__(self, target: str, slow_s: float = 2.0) -> None:
        import http.server
        import threading

        self.target = target.rstrip("/")
        self.faults: list = []
        self.keys: list = []
        self.slow_s = slow_s
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                self.forward()

            def do_POST(self) -> None:
                self.forward()

            def forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                fault = None
                if self.command == "POST" and self.path.split("?")[0] == "/v1/operations":
                    proxy.keys.append(self.headers.get("Idempotency-Key"))
                    fault = proxy.faults.pop(0) if proxy.faults else None
                if fault == "slow":
                    time.sleep(proxy.slow_s)
                request = urllib.request.Request(proxy.target + self.path, data=body, method=self.command)
                for name in ("Authorization", "Content-Type", "Idempotency-Key", "Accept", "Last-Event-ID"):
                    if self.headers.get(name):
                        request.add_header(name, self.headers[name])
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        status, headers, answer = response.status, response.headers, response.read()
                except urllib.error.HTTPError as error:
                    status, headers, answer = error.code, error.headers, error.read()
                if fault == "drop_after":
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault == "503_after":
                    status, headers = 503, {}
                    answer = json.dumps({"error": {"code": "outcome_unknown", "message": "the append's outcome is unknown; repeat the same request: it is idempotent"}}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if headers.get("Idempotent-Replayed"):
                    self.send_header("Idempotent-Replayed", headers["Idempotent-Replayed"])
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy():
    faulty = FaultyProxy(env("OPLEDGER_BASE_URL"))
    yield faulty
    faulty.close()


@pytest.fixture
def proxied(proxy) -> Ledger:
    """A client whose requests pass through ``proxy``; its pauses between repeats are short."""
    client = Ledger(proxy.url, env("OPLEDGER_TOKEN"))
    client.sleep = lambda seconds: time.sleep(min(seconds, 0.05))
    return client
