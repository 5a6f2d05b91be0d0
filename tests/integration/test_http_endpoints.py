"""A service's HTTP port under a flood of idle connections or of scrapes: probes answered,
threads and memory bounded."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import PgSchema
from tests.integration import relay_support as rs
from tests.support.kafka import wait_until
from tests.support.services import Services

pytestmark = pytest.mark.services

IDLE = 5000


def _status(pid: int, field: str) -> int:
    """One number of the process's /proc status (``Threads``, ``VmHWM`` in KiB ...)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@contextmanager
def _relay(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A relay process serving its HTTP port (ready), and the port; it must end with 0."""
    port = rs.free_port()
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics, http_port=port)
    process = rs.spawn(rs.relay_env(settings), tmp_path / "relay.log")
    try:
        wait_until(lambda: _ready(port), timeout_s=60)
        yield process, port
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0


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
    idle: list[socket.socket] = []
    with _relay(outbox, services, topics, tmp_path) as (process, port):
        try:
            before = _status(process.pid, "Threads")
            for _ in range(IDLE):
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            status, seconds = _probe(port, "/healthz")  # the probe's 5 s timeout: a hang guard
            assert status == 200
            print(f"http: /healthz answered in {seconds:.3f} s beside {IDLE} idle sockets")
            assert _probe(port, "/metrics")[0] == 200
            # the metrics render pool, at most
            assert _status(process.pid, "Threads") <= before + 2
        finally:
            for conn in idle:
                conn.close()


async def _scrape(port: int, *, cut: bool) -> bool:
    """One GET /metrics on loopback; with ``cut``, the connection is dropped unread."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    if cut:
        writer.transport.abort()
        return True
    status = await asyncio.wait_for(reader.readline(), 10)
    await reader.read()
    writer.close()
    return status.startswith(b"HTTP/1.1 200")


async def _flood(port: int, rounds: int, width: int) -> int:
    """``rounds`` waves of ``width`` scrapes at once (a third cut unread); the answered."""
    answered = 0
    for _ in range(rounds):
        done = await asyncio.gather(
            *(_scrape(port, cut=n % 3 == 0) for n in range(width)), return_exceptions=True
        )
        answered += sum(1 for n, ok in enumerate(done) if ok is True and n % 3)
    return answered


FLOOD_ROUNDS, FLOOD_WIDTH = 30, 200


def test_a_metrics_flood_leaves_the_process_memory_flat_and_renders_bounded(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, tmp_path: Path
) -> None:
    """6,000 scrapes in waves of 200, a third cut unread: the rest answered, peak RSS flat."""
    with _relay(outbox, services, topics, tmp_path) as (process, port):
        asyncio.run(_flood(port, 3, FLOOD_WIDTH))  # warm: the pool and buffers made once
        before = _status(process.pid, "VmHWM")  # peak RSS, KiB
        started = time.monotonic()
        answered = asyncio.run(_flood(port, FLOOD_ROUNDS, FLOOD_WIDTH))
        seconds = time.monotonic() - started
        after = _status(process.pid, "VmHWM")
        expected = sum(1 for n in range(FLOOD_WIDTH) if n % 3) * FLOOD_ROUNDS
        print(f"http: {answered} scrapes in {seconds:.1f} s, RSS {before} -> {after} KiB")
        assert answered == expected
        assert after - before < 8 * 1024, (before, after)
        assert _probe(port, "/healthz")[0] == 200
