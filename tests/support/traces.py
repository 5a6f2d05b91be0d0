"""Recording the spans this test process makes, with the OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


@contextmanager
def installed(provider: TracerProvider) -> Iterator[TracerProvider]:
    """``provider`` set globally for the block, then shut down.

    The API lets a process set its provider once; a test or a benchmark sets one for a
    while and puts back what was there (none, for everything else).
    """
    before = trace._TRACER_PROVIDER  # the API's one global, put back after
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(provider)
    try:
        yield provider
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER_SET_ONCE = Once()
        trace._TRACER_PROVIDER = before


@contextmanager
def recording() -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider set globally for the block, keeping every finished span."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with installed(provider):
        yield exporter


def named(spans: Sequence[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    """The spans whose name starts with ``prefix``."""
    return [s for s in spans if s.name.startswith(prefix)]


def linked_to(span: ReadableSpan, context: Any) -> list[Any]:
    """The links of ``span`` that point at ``context`` (a span context)."""
    return [
        link
        for link in span.links
        if (link.context.trace_id, link.context.span_id) == (context.trace_id, context.span_id)
    ]
