#!/usr/bin/env python3
"""A local OTLP/HTTP sink for `opledger bench http` with trace export on (docs/src/performance.md).

It answers every POST with 200 and an empty ExportTraceServiceResponse, counting requests and
bytes, and prints the totals when stopped (SIGTERM or Ctrl-C). It does not decode the spans: the
bench measures what exporting costs opledger, not what a collector does with them (the test
tests/serve/telemetry.rs decodes them).

It shares the bench's two cores, so what it spends is taken from opledger's throughput: it reads
each body into one reused buffer and parses only the request line's end and `content-length`
(http.server's header parser and buffered reads cost ~250 µs a request, 4.5 µs per operation of
`bench http`, about 2 % of the machine). One thread per connection; keep-alive as HTTP/1.1 asks.

    python3 bench/otlp_sink.py 4318 &
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 opledger bench http --concurrency 64
"""

import signal
import socket
import sys
import threading

ANSWER = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: application/x-protobuf\r\n"
    b"content-length: 0\r\n\r\n"
)
# Most bytes of one request's head; a longer head closes the connection.
MAX_HEAD_BYTES = 64 * 1024

counts = {"requests": 0, "bytes": 0}
lock = threading.Lock()


def content_length(head):
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def serve(connection):
    body = bytearray(1 << 20)
    view = memoryview(body)
    pending = b""
    with connection:
        while True:
            while b"\r\n\r\n" not in pending:
                chunk = connection.recv(65536)
                if not chunk or len(pending) > MAX_HEAD_BYTES:
                    return
                pending += chunk
            head, _, pending = pending.partition(b"\r\n\r\n")
            length = content_length(head)
            if length > len(body):
                body = bytearray(length)
                view = memoryview(body)
            have = min(len(pending), length)
            rest = pending[length:]
            while have < length:
                got = connection.recv_into(view[have:length])
                if got == 0:
                    return
                have += got
            pending = rest
            with lock:
                counts["requests"] += 1
                counts["bytes"] += length
            connection.sendall(ANSWER)


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 4318
    listener = socket.create_server(("127.0.0.1", port), reuse_port=False)
    listener.settimeout(0.2)
    stopping = threading.Event()

    def stop(*_):
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping.is_set():
        try:
            connection, _ = listener.accept()
        except (socket.timeout, InterruptedError):
            continue
        connection.settimeout(None)
        threading.Thread(target=serve, args=(connection,), daemon=True).start()
    print(f"otlp_sink: requests={counts['requests']} bytes={counts['bytes']}", flush=True)


if __name__ == "__main__":
    main()
