"""A loopback OTLP/gRPC trace receiver for tests/serve/telemetry.rs: the OpenTelemetry protocol's
own service definition (the `opentelemetry-proto` package's TraceService) served by grpcio, as a
collector serves it. Nothing of opledger's exporter is imitated.

It prints `port <n>` once it listens on 127.0.0.1, then one JSON object a line for each span it
receives (name, ids, attributes, and the request's gRPC metadata), and stops when its standard
input closes.
"""

import json
import sys
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        metadata = {key: text for key, text in context.invocation_metadata()}
        for resource_spans in request.resource_spans:
            resource = {a.key: value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    line = {
                        "name": span.name,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "attributes": {a.key: value(a.value) for a in span.attributes},
                        "service": resource.get("service.name"),
                        "metadata": metadata,
                    }
                    print(json.dumps(line), flush=True)
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"port {port}", flush=True)
    sys.stdin.read()
    server.stop(0)


if __name__ == "__main__":
    main()
