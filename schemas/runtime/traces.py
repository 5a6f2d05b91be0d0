"""Exporting a program's spans over OTLP when the standard environment variables ask for it.

The application's own set-up comes first: a tracer provider already set (by
``opentelemetry-instrument``, say) is used as it is. Otherwise, with
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` set (and neither
``OTEL_SDK_DISABLED=true`` nor ``OTEL_TRACES_EXPORTER=none``), the program sets up the
OpenTelemetry SDK with a batching OTLP/HTTP exporter; the exporter reads the rest of
the ``OTEL_EXPORTER_OTLP_*`` variables itself, and the service name is the program's
unless ``OTEL_SERVICE_NAME`` gives one. Without the SDK or the exporter installed, one
warning says what to install; nothing stops.
"""

from __future__ import annotations

import os
from typing import Any

import structlog

from schemas import tracing

log = structlog.get_logger(__name__)

ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
INSTALL = "pip install 'inorder[otel]' opentelemetry-sdk opentelemetry-exporter-otlp-proto-http"


def wanted() -> bool:
    """Whether the environment asks for OTLP export of traces."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower() == "none":
        return False
    return any(os.environ.get(name) for name in ENDPOINTS)


def configure(program: str) -> Any:
    """Set up OTLP export for ``program`` when asked; the provider to ``shutdown`` (or None)."""
    if not wanted() or tracing.active():
        return None
    try:
        from opentelemetry import trace  # noqa: PLC0415 - optional, and only when asked for
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
    except ImportError:
        log.warning("tracing_not_installed", hint=INSTALL)
        return None
    named = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: program}
    provider = TracerProvider(resource=Resource.create(named))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("tracing_exported", exporter="otlp/http", service=named.get(SERVICE_NAME, "from env"))
    return provider


def shutdown(provider: Any) -> None:
    """Send the spans still queued and stop exporting (``provider`` from ``configure``)."""
    if provider is not None:
        provider.shutdown()
