#!/usr/bin/env python3
"""Resident memory of `opledger serve` under a flood of half-open connections.

Starts `opledger serve` on a fresh SQLite file, opens N connections spread over loopback
addresses 127.0.0.2.. (Linux routes all of 127.0.0.0/8 to lo), each sending half a request
header and then nothing, and reads the server's VmRSS from /proc: at rest, with the flood held,
and after the flood has closed (at once, after a pause, and after a little ordinary traffic,
which lets the allocator return what its idle threads freed). Two rounds, so a leak (RSS growing
round after round) is told from an allocator keeping freed memory for reuse (RSS flat).

    python3 bench/connections/rss.py --binary target/release/opledger [--limits 'key = value' ...]

`--limits` lines go into the configuration's [limits] table (a binary older than the
connection limits knows none of the connection keys: give none to it). Prints one line per measurement.
"""

import argparse
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HALF_A_HEADER = b"GET /healthz HTTP/1.1\r\nhost: opledger\r\n"


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def descriptors(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def start(binary, limits, directory):
    config = os.path.join(directory, "serve.toml")
    with open(config, "w") as file:
        file.write(
            f'listen = "127.0.0.1:0"\nstore = "sqlite://{directory}/ledger.db"\n'
            f'views = "{directory}/ledger.views"\n\n[limits]\n' + "\n".join(limits) + "\n\n"
            '[[tenants]]\nid = "acme"\ntoken = "acme-token-0123456789"\n'
        )
    server = subprocess.Popen(
        [binary, "serve", "--config", config],
        stdout=subprocess.PIPE,
        stderr=open(os.path.join(directory, "serve.log"), "w"),
        text=True,
    )
    for line in server.stdout:
        if "listening on http://" in line:
            host, port = line.split("listening on http://")[1].split()[0].rsplit(":", 1)
            return server, (host, int(port))
    raise RuntimeError("the server did not start; see serve.log in " + directory)


def healthz(address):
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/healthz", timeout=10) as answer:
            status = answer.status
    except urllib.error.HTTPError as error:
        status = error.code
    except OSError as error:
        status = f"error ({error})"
    return status, (time.monotonic() - started) * 1000


def settle(pid, seconds=1.0):
    """Waits until the server's descriptor count stops changing (it has accepted or closed)."""
    last, steady_since = -1, time.monotonic()
    while time.monotonic() - steady_since < seconds:
        now = descriptors(pid)
        if now != last:
            last, steady_since = now, time.monotonic()
        time.sleep(0.1)
    return last


def flood(address, count, addresses):
    sockets = []
    for number in range(count):
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.bind((f"127.0.0.{2 + number % addresses}", 0))
        client.connect(address)
        try:
            client.sendall(HALF_A_HEADER)
        except OSError:
            pass  # refused and closed already
        sockets.append(client)
    return sockets


def still_open(sockets):
    open_count = 0
    for client in sockets:
        try:
            peeked = client.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            open_count += 0 if peeked == b"" or peeked.startswith(b"H") else 1
        except BlockingIOError:
            open_count += 1
        except OSError:
            pass
    return open_count


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--addresses", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--limits", action="append", default=[])
    arguments = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < arguments.connections + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as directory:
        server, address = start(arguments.binary, arguments.limits, directory)
        pid = server.pid
        try:
            healthz(address)
            settle(pid)
            print(f"rest: rss {rss_kib(pid) / 1024:.1f} MiB, fds {descriptors(pid)}")
            for round_number in range(1, arguments.rounds + 1):
                started = time.monotonic()
                sockets = flood(address, arguments.connections, arguments.addresses)
                opened_s = time.monotonic() - started
                fds = settle(pid)
                status, took = healthz(address)
                print(
                    f"round {round_number} flood of {arguments.connections} (opened in {opened_s:.1f} s): rss {rss_kib(pid) / 1024:.1f} MiB,"
                    f" server fds {fds}, held open {still_open(sockets)}, /healthz from 127.0.0.1 {status} in {took:.0f} ms"
                )
                for client in sockets:
                    client.close()
                settle(pid)
                print(f"round {round_number} closed: rss {rss_kib(pid) / 1024:.1f} MiB")
                time.sleep(10)
                print(f"round {round_number} closed +10 s: rss {rss_kib(pid) / 1024:.1f} MiB")
                for _ in range(200):
                    healthz(address)
                print(f"round {round_number} closed +200 requests: rss {rss_kib(pid) / 1024:.1f} MiB")
        finally:
            server.terminate()
            server.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
