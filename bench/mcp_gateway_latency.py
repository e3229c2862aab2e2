#!/usr/bin/env python3
"""The latency one MCP tools/call gains through opledger's gateway: the same call straight to an
upstream MCP server and through opledger (stdio: `opledger mcp`; HTTP: `/mcp` on `opledger
serve`), p50 and p99 at concurrency 1 and 16. Through the gateway every call is recorded (two
durable appends at least) before it reaches the upstream, and answered from the ledger's state.

The upstream is the gateway tests' record store (tests/mcp_gateway/upstream.py, on the official
Python SDK), a create per call. Needs Python with `mcp>=1.20,<2` and a built `opledger`.

    bench/mcp_gateway_latency.py --opledger target/release/opledger --calls 400
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

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

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
def upstream_over_http(records_file):
    """The record store over Streamable HTTP, keeping its records in `records_file`; yields its
    URL."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, UPSTREAM, records_file, "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.kill()
        server.wait()


async def measure(session, tool, make_args, calls, concurrency):
    """Latencies in milliseconds of `calls` calls, `concurrency` at a time."""
    latencies = []
    queue = asyncio.Queue()
    for _ in range(calls):
        queue.put_nowait(None)

    async def worker():
        while not queue.empty():
            queue.get_nowait()
            started = time.perf_counter()
            result = await session.call_tool(tool, make_args())
            latencies.append((time.perf_counter() - started) * 1000)
            if result.isError:
                raise SystemExit(f"{tool} failed: {result.content}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


def direct_args():
    return {"title": "bench", "label": str(uuid.uuid4())}


def gateway_args():
    return {"title": "bench", "request_id": str(uuid.uuid4())}


async def run_session(session, tool, make_args, calls, label, results):
    await session.initialize()
    await measure(session, tool, make_args, min(20, calls), 1)  # warm up
    for concurrency in (1, 16):
        latencies = await measure(session, tool, make_args, calls, concurrency)
        results[(label, concurrency)] = latencies
    results[(label, "check")] = await answer_check_ms(session, tool, make_args)


async def answer_check_ms(client, tool, make_args):
    """How long the Python SDK's client takes, per call, to check an answer's structuredContent
    against the tool's outputSchema (`jsonschema.validate`, which checks the schema itself each
    time too): client-side time inside every latency measured here, direct and gateway alike."""
    from jsonschema import validate
    from referencing import Registry

    listed = await client.list_tools()
    schema = next(listed_tool.outputSchema for listed_tool in listed.tools if listed_tool.name == tool)
    answer = (await client.call_tool(tool, make_args())).structuredContent
    if schema is None or answer is None:
        return 0.0
    timings = []
    for _ in range(200):
        started = time.perf_counter()
        validate(answer, schema, registry=Registry())
        timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


async def gateway_tool(session):
    tools = await session.list_tools()
    return next(tool.name for tool in tools.tools if tool.name.endswith("create_record"))


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opledger", default="target/release/opledger")
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args()
    opledger = os.path.abspath(args.opledger)
    results = {}
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ, BENCH_TOKEN=TOKEN)
        # stdio, straight
        direct = StdioServerParameters(
            command=sys.executable, args=[UPSTREAM, os.path.join(work, "direct.json"), "stdio"]
        )
        async with stdio_client(direct) as (read, write):
            async with ClientSession(read, write) as session:
                await run_session(session, "create_record", direct_args, args.calls, "stdio direct", results)
        # stdio, through `opledger mcp`
        stdio_upstream = '[upstream]\ncommand = "{}"\nargs = ["{}", "{}", "stdio"]'.format(
            sys.executable, UPSTREAM, os.path.join(work, "gateway-stdio.json")
        )
        with open(os.path.join(work, "records.toml"), "w") as out:
            out.write(CONNECTOR.format(upstream=stdio_upstream))
        with open(os.path.join(work, "opledger.toml"), "w") as out:
            out.write(SERVICE.format(port=free_port(), db=os.path.join(work, "stdio.db")))
        through = StdioServerParameters(
            command=opledger,
            args=["mcp", "--config", os.path.join(work, "opledger.toml"), "--tenant", "bench"],
            env=env,
            cwd=work,
        )
        async with stdio_client(through) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tool = await gateway_tool(session)
                await run_session(session, tool, gateway_args, args.calls, "stdio gateway", results)
        # HTTP, straight and through `/mcp` on `opledger serve`, each side with an upstream of its
        # own (as on stdio): the record store reads and rewrites its whole file on every create,
        # so an upstream shared with the direct run would make every gateway call pay for the
        # records the direct run left (820 of them, several ms per call in Python).
        with upstream_over_http(os.path.join(work, "http-direct.json")) as url:
            async with streamablehttp_client(url) as (read, write, _):
                async with ClientSession(read, write) as session:
                    await run_session(session, "create_record", direct_args, args.calls, "http direct", results)
        with upstream_over_http(os.path.join(work, "http-gateway.json")) as url:
            with open(os.path.join(work, "records.toml"), "w") as out:
                out.write(CONNECTOR.format(upstream=f'[upstream]\nurl = "{url}"'))
            port = free_port()
            with open(os.path.join(work, "opledger.toml"), "w") as out:
                out.write(SERVICE.format(port=port, db=os.path.join(work, "http.db")))
            service = subprocess.Popen(
                [opledger, "serve", "--config", "opledger.toml"],
                cwd=work,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                wait_for(port)
                headers = {"Authorization": f"Bearer {TOKEN}"}
                async with streamablehttp_client(f"http://127.0.0.1:{port}/mcp", headers=headers) as (read, write, _):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        tool = await gateway_tool(session)
                        await run_session(session, tool, gateway_args, args.calls, "http gateway", results)
            finally:
                service.terminate()
                service.wait()

    print(f"{'wire':6} {'conc':>4} {'direct p50':>11} {'p99':>8} {'gateway p50':>12} {'p99':>8} {'added p50':>10} {'p99':>8}  (ms)")
    for wire in ("stdio", "http"):
        for concurrency in (1, 16):
            direct = sorted(results[(f"{wire} direct", concurrency)])
            gateway = sorted(results[(f"{wire} gateway", concurrency)])
            p = lambda values, q: values[min(len(values) - 1, int(q * len(values)))]
            d50, d99 = statistics.median(direct), p(direct, 0.99)
            g50, g99 = statistics.median(gateway), p(gateway, 0.99)
            print(f"{wire:6} {concurrency:>4} {d50:>11.2f} {d99:>8.2f} {g50:>12.2f} {g99:>8.2f} {g50 - d50:>10.2f} {g99 - d99:>8.2f}")
    print(
        "of which the client's outputSchema check of each answer (ms per call): "
        + ", ".join(
            f"{wire} direct {results[(f'{wire} direct', 'check')]:.2f} gateway {results[(f'{wire} gateway', 'check')]:.2f}"
            for wire in ("stdio", "http")
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
