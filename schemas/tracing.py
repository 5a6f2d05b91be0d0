"""OpenTelemetry trace context from the producer's transaction to the consumer, when installed.

``opentelemetry-api`` is optional (the ``otel`` extra). Without it nothing here imports
it, and every function returns at once having done nothing. With it, spans are made
only once the application has set a tracer provider (the SDK, or
``opentelemetry-instrument``); until then ``active()`` is false.

- ``carried``: ``emit`` adds the current span's context to a row's headers, in the
  format of the global propagator (W3C ``traceparent`` and ``tracestate`` unless the
  application chose another); the relay copies row headers to the Kafka message.
- ``stamp``: an event that waits (a parked step event) keeps its message's trace context
  in its stored value, under ``inorder_trace`` (a field the codec does not read), with
  when it began waiting; ``waited`` makes the span of the wait once it is over, with
  ``span_between``, and ``link_current`` links the span at work to the event.
- ``span``: one span made current for a block, with links. The relay's PRODUCER span per
  delivery and the consumer's CONSUMER span per route's share of a poll batch link to
  each message's creation context, as the messaging conventions do for batches and for
  delayed delivery: links, never parents. Database instrumentation (psycopg's) nests
  under the consumer's span, so a trace can go on to the projection's rows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import orjson

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import (
        Link,
        SpanContext,
        SpanKind,
        TraceFlags,
        TraceState,
    )
except ImportError:  # the otel extra is not installed: everything here does nothing
    trace = None  # type: ignore[assignment]

# Whether opentelemetry-api could be imported.
INSTALLED = trace is not None

# The most links one span is given: a delivery or a batch of thousands of events links to
# its first ones. The SDK's own limit, which it reads from the same variable: computing
# links it would drop is a link's whole cost for nothing.
MOST_LINKS = int(os.environ.get("OTEL_SPAN_LINK_COUNT_LIMIT", "") or 128)

# Kafka headers as a message gives them (pairs), or a row's (a mapping).
Headers = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]


def active() -> bool:
    """Whether spans are recorded: the API is installed and a tracer provider is set."""
    if trace is None:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


# The provider inorder's tracer was last taken from, and that tracer.
_tracer_of: tuple[Any, Any] = (None, None)


def _tracer() -> Any:
    """inorder's tracer from the provider set now (taken again when it changes)."""
    global _tracer_of  # noqa: PLW0603 - one cache for the process, as the provider is
    provider = trace.get_tracer_provider()
    if _tracer_of[0] is not provider:
        try:
            release = version("inorder")
        except PackageNotFoundError:  # pragma: no cover - a tree that is not installed
            release = None
        _tracer_of = (provider, provider.get_tracer("inorder", release))
    return _tracer_of[1]


def carried(headers: Mapping[str, str]) -> Mapping[str, str]:
    """``headers`` with the current span's context added (unless they carry one already)."""
    if trace is None:
        return headers
    if not trace.get_current_span().get_span_context().is_valid:
        return headers
    textmap = propagate.get_global_textmap()
    if any(name in headers for name in textmap.fields):
        return headers
    carrier = dict(headers)
    textmap.inject(carrier)
    return carrier


def creation_context(headers: Headers | None) -> Any:
    """The span context a message was created in, from its headers (None: none).

    A W3C ``traceparent`` is read directly (most of the cost of a link, otherwise);
    headers of another propagator go through the global one. Where a message carries
    two, the first is the writer's: the relay puts the row's headers first, and a Kafka
    client instrumentation adds its own send span's after them.
    """
    if trace is None or not headers:
        return None
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    parent = state = None
    for name, value in pairs:
        if name == "traceparent" and parent is None:
            parent = value
        elif name == "tracestate" and state is None:
            state = value
    if parent is not None:
        return _w3c(_text(parent), None if state is None else _text(state))
    carrier = {name: _text(value) for name, value in pairs if value is not None}
    found = trace.get_current_span(propagate.extract(carrier)).get_span_context()
    return found if found.is_valid else None


def context_of(traceparent: str | None) -> Any:
    """The span context a stored W3C ``traceparent`` names (None: none, or not valid)."""
    if trace is None or not traceparent:
        return None
    return _w3c(traceparent, None)


def traceparent_of(current: Any) -> str | None:
    """The W3C ``traceparent`` of a span or a span context (None: none)."""
    if current is None:
        return None
    found = current.get_span_context() if hasattr(current, "get_span_context") else current
    if not found.is_valid:
        return None
    return f"00-{found.trace_id:032x}-{found.span_id:016x}-{int(found.trace_flags):02x}"


@contextmanager
def continuing(context: Any) -> Iterator[None]:
    """Make a remote span context (from ``creation_context``) current for the block.

    No span is made: code in the block sees where the message it handles came from
    (``current_traceparent``), and a span it opens is a child of that context.
    """
    if trace is None or context is None:
        yield
        return
    token = otel_context.attach(trace.set_span_in_context(trace.NonRecordingSpan(context)))
    try:
        yield
    finally:
        otel_context.detach(token)


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span context (None: none)."""
    if trace is None:
        return None
    return traceparent_of(trace.get_current_span().get_span_context())


def injected() -> list[tuple[str, str | bytes | None]] | None:
    """The current span's context as Kafka headers (None: no span, or the API missing)."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    made: list[tuple[str, str | bytes | None]] = [(k, v.encode()) for k, v in carrier.items()]
    return made or None


def _text(value: str | bytes | None) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value or ""


def _w3c(parent: str, state: str | None) -> Any:
    """The span context a ``traceparent`` (and ``tracestate``) header names; None if invalid."""
    parts = parent.strip().split("-")
    if len(parts) < 4 or parts[0] == "ff" or (parts[0] == "00" and len(parts) != 4):
        return None
    version, trace_hex, span_hex, flags_hex = parts[:4]
    if (len(version), len(trace_hex), len(span_hex), len(flags_hex)) != (2, 32, 16, 2):
        return None
    try:
        trace_id, span_id, flags = int(trace_hex, 16), int(span_hex, 16), int(flags_hex, 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    trace_state = TraceState.from_header([state]) if state else None
    return SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags), trace_state=trace_state
    )


def links(items: Iterable[tuple[Headers | None, Mapping[str, Any]]]) -> list[Any]:
    """A link to each item's creation context that has one, with the item's attributes."""
    made: list[Any] = []
    for headers, attributes in items:
        context = creation_context(headers)
        if context is not None:
            made.append(Link(context, dict(attributes)))
            if len(made) == MOST_LINKS:
                break
    return made


# The field of a stored event value holding its trace context while it waits.
STAMP_FIELD = "inorder_trace"
# A header longer than W3C's 512 characters for a tracestate is left out of a stamp
# (vendors may cut it; a traceparent is 55), so what a stamp adds to a value is bounded:
# at most this, escapes included.
_MAX_CONTEXT = 512
STAMP_ROOM = 8192
_STAMP_KEY = b'"inorder_trace":{'


def stamp(value: bytes, headers: Headers | None) -> bytes:
    """``value`` (a JSON object) with its message's trace context and the time; as it was
    when the message has none."""
    if trace is None or not headers or _STAMP_KEY in value:
        return value
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    context = {
        name: _text(v)
        for name, v in pairs
        if name in ("traceparent", "tracestate") and len(v or "") <= _MAX_CONTEXT
    }
    body = value.rstrip()
    if "traceparent" not in context or not body.endswith(b"}"):
        return value
    context["at"] = time.time()  # type: ignore[assignment]
    return body[:-1] + b',"' + STAMP_FIELD.encode() + b'":' + orjson.dumps(context) + b"}"


def with_distance(value: bytes, distance: int) -> bytes:
    """A stamped ``value`` that also says how far ahead of its entity it came."""
    if _STAMP_KEY not in value:
        return value
    return value.replace(_STAMP_KEY, _STAMP_KEY + b'"distance":%d,' % distance, 1)


def waited(value: bytes) -> tuple[Any, float, int | None] | None:
    """From a stamped value: the creation context, when the wait began, the distance."""
    if trace is None or _STAMP_KEY not in value:
        return None
    try:
        found = orjson.loads(value).get(STAMP_FIELD)
        context = _w3c(str(found["traceparent"]), found.get("tracestate"))
        began = float(found["at"])
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
        return None
    if context is None:
        return None
    distance = found.get("distance")
    return context, began, distance if isinstance(distance, int) else None


def span_between(
    name: str, began: float, attributes: Mapping[str, Any], made_links: Sequence[Any]
) -> None:
    """A span from ``began`` (seconds since the epoch) to now, already over."""
    if not active():
        return
    made = _tracer().start_span(
        name,
        attributes=dict(attributes),
        links=list(made_links),
        start_time=int(began * 1e9),
    )
    made.end()


def link_current(context: Any, attributes: Mapping[str, Any]) -> None:
    """Link the span at work (if one records) to ``context``."""
    if trace is None or context is None:
        return
    current = trace.get_current_span()
    if current.is_recording():
        current.add_link(context, dict(attributes))


def links_to(contexts: Iterable[Any], attributes: Mapping[str, Any]) -> list[Any]:
    """Links to span contexts already known, each with ``attributes``."""
    if trace is None:
        return []
    return [Link(context, dict(attributes)) for context in contexts]


def exemplar(context: Any) -> dict[str, str] | None:
    """The labels of a Prometheus exemplar naming ``context`` (a span context; None: none)."""
    if context is None or not context.is_valid:
        return None
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def current_exemplar() -> dict[str, str] | None:
    """An exemplar naming the span at work, when one records."""
    if trace is None:
        return None
    current = trace.get_current_span()
    return exemplar(current.get_span_context()) if current.is_recording() else None


_KINDS = {"producer": "PRODUCER", "consumer": "CONSUMER", "internal": "INTERNAL"}


@contextmanager
def span(
    name: str,
    kind: str,
    attributes: Mapping[str, Any],
    made_links: Sequence[Any] = (),
    *,
    began: float | None = None,
) -> Iterator[Any]:
    """A span current for the block; None when inactive.

    ``kind``: ``producer``, ``consumer`` or ``internal``; ``began``: when it started, if
    before the block (seconds since the epoch). An exception leaving the block is
    recorded on the span, which ends with an error status.
    """
    if not active():
        yield None
        return
    with _tracer().start_as_current_span(
        name,
        kind=getattr(SpanKind, _KINDS[kind]),
        attributes=dict(attributes),
        links=list(made_links),
        start_time=None if began is None else int(began * 1e9),
        record_exception=True,
        set_status_on_exception=True,
    ) as current:
        yield current
