#!/usr/bin/env python3
"""A local OTLP/HTTP sink for `opledger bench http` with trace export on (README, "Trace export").

It answers every POST to /v1/traces with 200 and an empty ExportTraceServiceResponse, counting
requests and bytes, and prints the totals when stopped (SIGTERM or Ctrl-C). It does not decode the
spans: the bench measures what exporting costs opledger, not what a collector does with them (the
test tests/serve/telemetry.rs decodes them).

    python3 bench/otlp_sink.py 4318 &
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 opledger bench http --concurrency 64
"""

import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

counts = {"requests": 0, "bytes": 0}
lock = threading.Lock()


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        self.rfile.read(length)
        with lock:
            counts["requests"] += 1
            counts["bytes"] += length
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 4318
    server = ThreadingHTTPServer(("127.0.0.1", port), Sink)

    def stop(*_):
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()
    print(f"otlp_sink: requests={counts['requests']} bytes={counts['bytes']}", flush=True)


if __name__ == "__main__":
    main()
