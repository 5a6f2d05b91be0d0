"""A service's HTTP port under a flood of idle connections: probes answered, threads bounded."""

from __future__ import annotations

import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import PgSchema
from tests.integration import relay_support as rs
from tests.support.kafka import wait_until
from tests.support.services import Services

pytestmark = pytest.mark.services

IDLE = 5000


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no thread count")


def _probe(port: int, path: str) -> tuple[int, float]:
    started = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        response.read()
        return response.status, time.monotonic() - started


def _ready(port: int) -> bool:
    try:
        return _probe(port, "/readyz")[0] == 200
    except OSError:  # not listening yet, or 503 (HTTPError is an OSError)
        return False


def test_five_thousand_idle_connections_neither_starve_probes_nor_pin_threads(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, tmp_path: Path
) -> None:
    """5,000 sockets that never send: /healthz still answers, the thread count stays put."""
    port = rs.free_port()
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics, http_port=port)
    process = rs.spawn(rs.relay_env(settings), tmp_path / "relay.log")
    idle: list[socket.socket] = []
    try:
        wait_until(lambda: _ready(port), timeout_s=60)
        before = _threads(process.pid)
        for _ in range(IDLE):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        status, seconds = _probe(port, "/healthz")  # the probe's 5 s timeout: a hang guard
        assert status == 200
        print(f"http: /healthz answered in {seconds:.3f} s beside {IDLE} idle sockets")
        assert _probe(port, "/metrics")[0] == 200
        assert _threads(process.pid) <= before + 2  # the metrics render pool, at most
    finally:
        for conn in idle:
            conn.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
