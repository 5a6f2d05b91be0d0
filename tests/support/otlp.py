"""An OTLP/HTTP trace receiver on loopback: what programs export, decoded from the protobuf."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span


@dataclass(frozen=True, slots=True)
class Received:
    """One exported span: the exporting service, and the span as sent."""

    service: str
    span: Span


@dataclass(slots=True)
class Receiver:
    """Where the receiver listens, and every span it got."""

    endpoint: str
    spans: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, service: str, prefix: str) -> list[Span]:
        """The spans ``service`` exported whose name starts with ``prefix``."""
        with self.lock:
            return [
                r.span
                for r in self.spans
                if r.service == service and r.span.name.startswith(prefix)
            ]


@contextmanager
def receiving() -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 answering ``POST /v1/traces`` as a collector does."""
    receiver = Receiver("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            got = []
            for resource_spans in request.resource_spans:
                names = [
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                ]
                for scope_spans in resource_spans.scope_spans:
                    got += [Received(names[0] if names else "", s) for s in scope_spans.spans]
            with receiver.lock:
                receiver.spans += got
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_args: object) -> None:
            """Quiet: the test reads what was received."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
