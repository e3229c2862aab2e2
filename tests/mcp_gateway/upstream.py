"""A fault-injecting MCP server written with the official Python SDK (FastMCP), for the gateway's
fault matrix over stdio and Streamable HTTP: a record store kept in a JSON file.

`create_record(title, label)` is an upsert by label (a second call with the same label makes
nothing and answers the first record's id), so the gateway may declare `label_argument`.
`find_records(label)` lists the records with that label. One fault, read from the file named by
OPLEDGER_FAULT_FILE and consumed by the create it fires on:

- `die_before`: SIGKILL before anything is stored (the request was lost);
- `die_after`: SIGKILL after the record is stored, before the answer (the answer was lost);
- `late MS`: store, then answer MS milliseconds later (after the gateway's timeout);
- `error_after`: store, then fail with an internal error;
- `error_before`: fail with "validation failed" before storing.

With OPLEDGER_TOKENS_FILE set (HTTP only), every request must carry `Authorization: Bearer` with a
token listed there and not expired (`token expiry` lines, written by `token_server.py`); any
other answers 401.

Usage: python upstream.py STORE stdio | python upstream.py STORE http PORT
       | python upstream.py STORE https PORT CERT_FILE KEY_FILE
"""

import json
import os
import signal
import sys
import time

import anyio
from mcp.server.fastmcp import FastMCP

STORE = sys.argv[1]
FAULT_FILE = os.environ.get("OPLEDGER_FAULT_FILE", STORE + ".fault")
PORT = int(sys.argv[3]) if len(sys.argv) > 3 else 8000

server = FastMCP("records", host="127.0.0.1", port=PORT, log_level="WARNING")


def load():
    try:
        with open(STORE) as store:
            return json.load(store)
    except FileNotFoundError:
        return []


def save(records):
    with open(STORE + ".tmp", "w") as store:
        json.dump(records, store)
    os.replace(STORE + ".tmp", STORE)


def take_fault():
    try:
        with open(FAULT_FILE) as armed:
            fault = armed.read().strip()
    except FileNotFoundError:
        return ""
    os.remove(FAULT_FILE)
    return fault


@server.tool()
async def create_record(title: str, label: str) -> str:
    """Create a record, or answer the one that already carries this label."""
    fault = take_fault()
    if fault == "die_before":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "error_before":
        raise ValueError("validation failed: nothing was stored")
    records = load()
    existing = [record for record in records if record["label"] == label]
    if existing:
        return json.dumps({"id": existing[0]["id"], "created": False})
    record = {"id": str(731 + len(records)), "title": title, "label": label}
    save(records + [record])
    if fault == "die_after":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.startswith("late "):
        await anyio.sleep(int(fault.split()[1]) / 1000)
    if fault == "error_after":
        raise RuntimeError("internal error after the record was stored")
    return json.dumps({"id": record["id"], "created": True})


@server.tool()
def find_records(label: str) -> str:
    """The records that carry this label."""
    return json.dumps([record for record in load() if record["label"] == label])


def bearer_only(app, tokens_file):
    """The app behind a check of the request's bearer token against the tokens file."""

    def accepted(token):
        try:
            with open(tokens_file) as tokens:
                for line in tokens:
                    known, _, expiry = line.strip().partition(" ")
                    if known == token and time.time() < float(expiry):
                        return True
        except FileNotFoundError:
            pass
        return False

    async def guarded(scope, receive, send):
        if scope["type"] == "http":
            sent = dict(scope["headers"]).get(b"authorization", b"").decode()
            if not (sent.startswith("Bearer ") and accepted(sent[len("Bearer ") :])):
                await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": b'{"error": "invalid_token"}'})
                return
        await app(scope, receive, send)

    return guarded


if __name__ == "__main__":
    tokens_file = os.environ.get("OPLEDGER_TOKENS_FILE")
    if sys.argv[2] == "https" or (sys.argv[2] == "http" and tokens_file):
        # The SDK's own Streamable HTTP app, served by uvicorn (which the SDK runs on), over TLS
        # or behind the bearer check.
        import uvicorn

        app = server.streamable_http_app()
        if tokens_file:
            app = bearer_only(app, tokens_file)
        tls = {"ssl_certfile": sys.argv[4], "ssl_keyfile": sys.argv[5]} if sys.argv[2] == "https" else {}
        uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning", **tls)
    else:
        server.run(transport="streamable-http" if sys.argv[2] == "http" else "stdio")
