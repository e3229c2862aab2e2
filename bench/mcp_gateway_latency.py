#!/usr/bin/env python3
"""The latency one MCP tools/call gains through opledger's gateway: the same call straight to an
upstream MCP server and through opledger (stdio: `opledger mcp`; HTTP: `/mcp` on `opledger
serve`), p50 and p99 at concurrency 1 and 16. Through the gateway every call is recorded (two
durable appends at least) before it reaches the upstream, and answered from the ledger's state.

The client is the current official Python SDK (`mcp>=2.3,<3`, run this script with it); the
upstream is the gateway tests' record store (tests/mcp_gateway/upstream.py, written with the SDK's
1.x API), a create per call, run by `--upstream-python` (a Python with `mcp>=1.20,<2`: the gateway
tests make one at target/tmp/mcp-upstreams). Both sides run in one sitting, their calls taking
turns in rounds, so that a machine whose speed drifts (a shared one) weighs on both alike; at
concurrency 1 the client's own time in each call is measured too.

    python3 -m venv /tmp/mcp-client && /tmp/mcp-client/bin/pip install 'mcp>=2.3,<3'
    /tmp/mcp-client/bin/python bench/mcp_gateway_latency.py --opledger target/release/opledger \
        --upstream-python target/tmp/mcp-upstreams/bin/python --calls 400
"""

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import httpx2
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

HERE = os.path.dirname(os.path.abspath(__file__))
UPSTREAM = os.path.join(HERE, "..", "tests", "mcp_gateway", "upstream.py")
TOKEN = "bench-token-0123456789abcdef"

CONNECTOR = """
id = "records"
description = "A record store"
transport = "mcp"
call_timeout_ms = 10000

{upstream}

[[accounts]]
id = "main"
tenants = ["bench"]

[[actions]]
name = "create_record"
description = "create a record"
tool = "create_record"
input = {{ type = "object", required = ["title"], properties.title = {{ type = "string" }} }}
arguments = {{ title = "{{{{args.title}}}}", label = "{{{{label}}}}" }}
result = {{ id_at = "/id" }}
dedup = {{ kind = "label_argument", argument = "label" }}

[actions.lookup]
kind = "tool"
tool = "find_records"
arguments = {{ label = "{{{{label}}}}" }}
found = "\\"id\\": \\"(\\\\d+)\\", \\"title\\": \\"[^\\"]*\\", \\"label\\": \\"{{{{label}}}}\\""
consistent = true
"""

SERVICE = """
listen = "127.0.0.1:{port}"
store = "sqlite://{db}"

[[tenants]]
id = "bench"
token_env = "BENCH_TOKEN"

[[connectors]]
file = "records.toml"
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(port, deadline_s=30):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


@contextlib.contextmanager
def upstream_over_http(python, records_file):
    """The record store over Streamable HTTP, keeping its records in `records_file`; yields its
    URL."""
    port = free_port()
    server = subprocess.Popen(
        [python, UPSTREAM, records_file, "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.kill()
        server.wait()


class Timed:
    """A session's transport stream that notes when each message passes: the request handed to
    the transport, and the answer handed back, parsed, before the client checks it."""

    def __init__(self, inner, seen):
        self.inner, self.seen = inner, seen

    async def __aenter__(self):
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self.inner.__aexit__(*exc)

    def __aiter__(self):
        return self

    async def __anext__(self):
        message = await self.inner.__anext__()
        self.seen.append(time.perf_counter())
        return message

    async def send(self, message):
        self.seen.append(time.perf_counter())
        return await self.inner.send(message)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Side:
    """One way to call the tool (straight to the upstream, or through the gateway) and what its
    calls measured."""

    def __init__(self, label, read, write, make_args):
        self.label, self.make_args = label, make_args
        self.seen = []
        self.session = ClientSession(Timed(read, self.seen), Timed(write, self.seen))
        self.tool = None
        self.latencies = {1: [], 16: []}
        self.client_ms = []  # at concurrency 1: the client's own time in a call
        self.check_ms = 0.0  # the client's check of one answer, measured after the calls

    async def call(self):
        started = time.perf_counter()
        result = await self.session.call_tool(self.tool, self.make_args())
        return started, result

    async def measure(self, calls, concurrency):
        """`calls` calls, `concurrency` at a time; at concurrency 1 also how much of each was the
        client's: before the request reached the transport and after the answer came back from it
        (parsing it as JSON-RPC is before; its checks, `outputSchema` among them, after)."""
        queue = asyncio.Queue()
        for _ in range(calls):
            queue.put_nowait(None)

        async def worker():
            while not queue.empty():
                queue.get_nowait()
                self.seen.clear()
                started, result = await self.call()
                ended = time.perf_counter()
                self.latencies[concurrency].append((ended - started) * 1000)
                if concurrency == 1:
                    if len(self.seen) < 2:
                        raise SystemExit(f"{self.label}: a call passed its transport unseen")
                    self.client_ms.append(((self.seen[0] - started) + (ended - self.seen[-1])) * 1000)
                if result.is_error:
                    raise SystemExit(f"{self.label}: {self.tool} failed: {result.content}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def alternate(direct, gateway, calls, rounds):
    """Both sides measured in one sitting, rounds taking turns (direct, gateway, direct, ...), so
    a machine that slows down or speeds up during the run weighs on both alike."""
    for side in (direct, gateway):
        await side.measure(20, 1)  # warm up
        side.latencies[1].clear()
        side.client_ms.clear()
    for concurrency in (1, 16):
        per_round = max(concurrency, calls // rounds)
        done = 0
        while done < calls:
            for side in (direct, gateway):
                await side.measure(min(per_round, calls - done), concurrency)
            done += per_round


async def answer_check_ms(session, tool, make_args):
    """How long the client takes, per call, to check an answer's structured content against the
    tool's outputSchema (`validate_tool_result`, which `call_tool` runs on every answer; the
    current SDK compiles each tool's schema once): client-side time inside every latency
    measured here, direct and gateway alike."""
    answer = await session.call_tool(tool, make_args())
    timings = []
    for _ in range(200):
        started = time.perf_counter()
        await session.validate_tool_result(tool, answer)
        timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


async def gateway_tool(session):
    tools = await session.list_tools()
    return next(tool.name for tool in tools.tools if tool.name.endswith("create_record"))


def direct_args():
    return {"title": "bench", "label": str(uuid.uuid4())}


def gateway_args():
    return {"title": "bench", "request_id": str(uuid.uuid4())}


def write_gateway(work, upstream, db):
    """The gateway's configuration in `work`, its connector sending to `upstream`; the port it
    would listen on."""
    with open(os.path.join(work, "records.toml"), "w") as out:
        out.write(CONNECTOR.format(upstream=upstream))
    port = free_port()
    with open(os.path.join(work, "opledger.toml"), "w") as out:
        out.write(SERVICE.format(port=port, db=os.path.join(work, db)))
    return port


async def measure_wire(straight, through, args):
    """The direct side on the `straight` transport's streams and the gateway's on `through`'s,
    measured in turns; the two sides."""
    direct = Side("direct", *straight, direct_args)
    gateway = Side("gateway", *through, gateway_args)
    async with direct.session, gateway.session:
        await direct.session.initialize()
        await gateway.session.initialize()
        direct.tool = "create_record"
        gateway.tool = await gateway_tool(gateway.session)
        await alternate(direct, gateway, args.calls, args.rounds)
        for side in (direct, gateway):
            side.check_ms = await answer_check_ms(side.session, side.tool, side.make_args)
    return direct, gateway


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opledger", default="target/release/opledger")
    parser.add_argument(
        "--upstream-python",
        default="target/tmp/mcp-upstreams/bin/python",
        help="a Python with mcp>=1.20,<2, which runs the upstream",
    )
    parser.add_argument("--calls", type=int, default=400, help="calls per side and concurrency")
    parser.add_argument("--rounds", type=int, default=8, help="turns each side takes per concurrency")
    args = parser.parse_args()
    if args.calls < 16 or args.rounds < 1:
        raise SystemExit("--calls must be at least 16 and --rounds at least 1")
    opledger = os.path.abspath(args.opledger)
    upstream_python = os.path.abspath(args.upstream_python)
    for path, what in ((opledger, "--opledger: build it with `cargo build --release`"), (upstream_python, "--upstream-python: make it with `python3 -m venv DIR && DIR/bin/pip install 'mcp>=1.20,<2'`")):
        if not os.access(path, os.X_OK):
            raise SystemExit(f"{path} is not there; {what}")
    results = {}
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ, BENCH_TOKEN=TOKEN)
        # stdio: the upstream straight, and through `opledger mcp` (with an upstream of its own)
        write_gateway(
            work,
            '[upstream]\ncommand = "{}"\nargs = ["{}", "{}", "stdio"]'.format(
                upstream_python, UPSTREAM, os.path.join(work, "gateway-stdio.json")
            ),
            "stdio.db",
        )
        straight = StdioServerParameters(
            command=upstream_python, args=[UPSTREAM, os.path.join(work, "direct.json"), "stdio"]
        )
        through = StdioServerParameters(
            command=opledger,
            args=["mcp", "--config", os.path.join(work, "opledger.toml"), "--tenant", "bench"],
            env=env,
            cwd=work,
        )
        async with stdio_client(straight) as (read, write), stdio_client(through) as (g_read, g_write):
            results["stdio"] = await measure_wire((read, write), (g_read, g_write), args)
        # HTTP: each side with an upstream of its own, as on stdio: the record store reads and
        # rewrites its whole file on every create, so a shared one would make each side pay for
        # the other's records.
        with upstream_over_http(upstream_python, os.path.join(work, "http-direct.json")) as direct_url, upstream_over_http(
            upstream_python, os.path.join(work, "http-gateway.json")
        ) as gateway_url:
            port = write_gateway(work, f'[upstream]\nurl = "{gateway_url}"', "http.db")
            service = subprocess.Popen(
                [opledger, "serve", "--config", "opledger.toml"],
                cwd=work,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                wait_for(port)
                tenant = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
                async with tenant, streamable_http_client(direct_url) as (read, write), streamable_http_client(
                    f"http://127.0.0.1:{port}/mcp", http_client=tenant
                ) as (g_read, g_write):
                    results["http"] = await measure_wire((read, write), (g_read, g_write), args)
            finally:
                service.terminate()
                service.wait()

    p = lambda values, q: sorted(values)[min(len(values) - 1, int(q * len(values)))]
    print(f"direct and gateway calls alternated in {args.rounds} rounds per row, {args.calls} calls per side and row")
    print(f"{'wire':6} {'conc':>4} {'direct p50':>11} {'p99':>8} {'gateway p50':>12} {'p99':>8} {'added p50':>10} {'p99':>8}  (ms)")
    for wire in ("stdio", "http"):
        direct, gateway = results[wire]
        for concurrency in (1, 16):
            d, g = direct.latencies[concurrency], gateway.latencies[concurrency]
            d50, d99, g50, g99 = statistics.median(d), p(d, 0.99), statistics.median(g), p(g, 0.99)
            print(f"{wire:6} {concurrency:>4} {d50:>11.2f} {d99:>8.2f} {g50:>12.2f} {g99:>8.2f} {g50 - d50:>10.2f} {g99 - d99:>8.2f}")
    print("at concurrency 1, the client's own time in a call (p50: before its request reached the transport, and after the answer came back from it, parsed: its checks, the outputSchema's among them), and the added latency without it:")
    for wire in ("stdio", "http"):
        direct, gateway = results[wire]
        d_client, g_client = statistics.median(direct.client_ms), statistics.median(gateway.client_ms)
        d_server = statistics.median([t - c for t, c in zip(direct.latencies[1], direct.client_ms)])
        g_server = statistics.median([t - c for t, c in zip(gateway.latencies[1], gateway.client_ms)])
        print(
            f"  {wire}: client direct {d_client:.2f} gateway {g_client:.2f} ms (the outputSchema check alone: {direct.check_ms:.2f} / {gateway.check_ms:.2f}); "
            f"transport to transport direct {d_server:.2f} gateway {g_server:.2f}: added {g_server - d_server:.2f} ms"
        )


if __name__ == "__main__":
    asyncio.run(main())
