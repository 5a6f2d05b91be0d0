"""What tracing costs: the relay and the consumer with tracing off and on, side by side.

Off: no tracer provider, rows and messages without a trace context. On: every row
written with a trace context of its own (as ``emit`` writes it inside a span) and
every message carrying one; the relay (its own process, as deployed) exports its
spans over OTLP/HTTP, set up by ``OTEL_EXPORTER_OTLP_ENDPOINT``, to a receiver on
loopback that reads and drops them; the consumer (in this process) runs with the
SDK's batching span processor and an exporter that drops what it is given. The pairs
run off, on, off, on; each figure is the better of its two runs, and the cost per
event is the difference of the two rates' inverses.
"""

from __future__ import annotations

import os
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from tests.benchmarks import bench_consumer, bench_relay
from tests.benchmarks.fixtures import temp_schema
from tests.benchmarks.result import BenchResult
from tests.support import traces


class _Dropped(SpanExporter):
    """Takes every batch and keeps nothing: what the SDK costs, without a network."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Drop ``spans``."""
        del spans
        return SpanExportResult.SUCCESS


@contextmanager
def _sink() -> Iterator[str]:
    """An OTLP/HTTP endpoint on loopback that reads each request and answers 200."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _relay(url: str, bootstrap: str, *, traced: bool, endpoint: str) -> float:
    with bench_relay.topics_for(bootstrap, 1) as [topic]:
        extra = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint} if traced else {}
        tag = uuid.uuid4().hex[:6]
        rate, _ = bench_relay.publish_backlog(url, bootstrap, topic, 1, tag, traced=traced, **extra)
        return rate


def _consumer(url: str, bootstrap: str, folder: Path, *, traced: bool) -> float:
    with bench_consumer.topic_for(bootstrap, traced=traced) as topic:
        if not traced:
            return bench_consumer.projection(url, bootstrap, topic, folder)
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(_Dropped()))
        with traces.installed(provider):
            return bench_consumer.projection(url, bootstrap, topic, folder)


def run() -> list[BenchResult]:
    """Relay rows/s and consumer events/s with tracing off and on; the cost per event."""
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    relay: dict[bool, float] = {False: 0.0, True: 0.0}
    consumer: dict[bool, float] = {False: 0.0, True: 0.0}
    with (
        temp_schema(os.environ["DATABASE_URL"], "bench_tracing") as url,
        tempfile.TemporaryDirectory() as folder,
        _sink() as endpoint,
    ):
        for traced in (False, True, False, True):
            rate = _relay(url, bootstrap, traced=traced, endpoint=endpoint)
            relay[traced] = max(relay[traced], rate)
            rate = _consumer(url, bootstrap, Path(folder), traced=traced)
            consumer[traced] = max(consumer[traced], rate)
    results = []
    for name, figures, unit in (("relay", relay, "rows/s"), ("consumer", consumer, "events/s")):
        off, on = figures[False], figures[True]
        results += [
            BenchResult(f"tracing_{name}_off_per_s", off, unit, "no provider, no trace context"),
            BenchResult(f"tracing_{name}_on_per_s", on, unit, "every event traced, spans exported"),
            BenchResult(f"tracing_{name}_on_vs_off", on / off, "x", "same run"),
            BenchResult(
                f"tracing_{name}_cost_us_per_event",
                max(0.0, (1 / on - 1 / off) * 1e6),
                "us",
                "1/on - 1/off",
            ),
        ]
    return results
