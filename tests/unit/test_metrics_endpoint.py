"""The health server's /metrics: Prometheus text, or OpenMetrics (with exemplars) on request."""

from __future__ import annotations

import http.client
from collections.abc import Iterator

import pytest
from prometheus_client import Histogram

from schemas.runtime.endpoints import serve
from schemas.runtime.health import Health

LATENCY = Histogram("endpoint_test_latency_seconds", "A histogram this test observes")


@pytest.fixture
def base() -> Iterator[int]:
    server = serve(Health(), "127.0.0.1", 0)
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()


def _get(port: int, accept: str | None) -> tuple[str, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/metrics", headers={"Accept": accept} if accept else {})
        response = connection.getresponse()
        return response.getheader("Content-Type") or "", response.read().decode()
    finally:
        connection.close()


def test_a_scraper_asking_for_openmetrics_gets_it_with_the_exemplars(base: int) -> None:
    """Accept: openmetrics gives that format, where an observation's trace id shows."""
    LATENCY.observe(0.2, exemplar={"trace_id": "0af7651916cd43dd8448eb211c80319c"})
    kind, body = _get(base, "application/openmetrics-text; version=1.0.0,text/plain;q=0.5")
    assert kind.startswith("application/openmetrics-text")
    assert body.endswith("# EOF\n")
    assert 'trace_id="0af7651916cd43dd8448eb211c80319c"' in body


def test_a_plain_scrape_gets_prometheus_text(base: int) -> None:
    """No Accept header: the Prometheus text format, as before."""
    kind, body = _get(base, None)
    assert kind.startswith("text/plain")
    assert "endpoint_test_latency_seconds_bucket" in body
    assert "# EOF" not in body
