"""The HTTP endpoints hold up: slow, idle, oversized and flooding clients cannot starve probes."""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from schemas.runtime.endpoints import (
    MAX_HEAD_BYTES,
    RENDER_REUSE_S,
    Endpoints,
    Reply,
    parse,
    serve,
)
from schemas.runtime.health import Health


@pytest.fixture
def health() -> Health:
    ready = Health()
    ready.cleared("starting")
    return ready


@pytest.fixture
def server(health: Health) -> Iterator[Endpoints]:
    running = serve(health, "127.0.0.1", 0, max_connections=64, timeout_s=0.5)
    try:
        yield running
    finally:
        running.shutdown()


def _get(server: Endpoints, path: str, method: str = "GET") -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(*server.server_address, timeout=5)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _raw(server: Endpoints, data: bytes) -> bytes:
    with socket.create_connection(server.server_address, timeout=5) as conn:
        conn.sendall(data)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_probes_answer_and_readiness_names_each_problem(server: Endpoints, health: Health) -> None:
    """/healthz and /readyz answer 200, then /readyz 503 with one line per dependency."""
    assert _get(server, "/healthz") == (200, b"ok\n")
    assert _get(server, "/readyz?verbose=1") == (200, b"ready\n")
    health.blocked("postgres", "connection_failed")
    assert _get(server, "/readyz") == (503, b"postgres: connection_failed\n")
    assert _get(server, "/nope")[0] == 404


def test_only_get_and_head_are_served(server: Endpoints) -> None:
    """POST is refused with 405; HEAD gets the head with the length of a GET's body, no body."""
    assert _get(server, "/healthz", "POST")[0] == 405
    reply = _raw(server, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Length: 3\r\n" in reply
    assert reply.endswith(b"\r\n\r\n")


def test_garbage_and_oversized_heads_are_refused(server: Endpoints) -> None:
    """A head that is not HTTP gets 400; one past the size limit gets 431; neither stops it."""
    assert _raw(server, b"\x00\xff garbage\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    big = b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n"
    assert _raw(server, big).startswith(b"HTTP/1.1 431 ")
    assert _get(server, "/healthz")[0] == 200


def test_a_client_that_never_finishes_its_head_is_cut_at_the_deadline(server: Endpoints) -> None:
    """Half a request line, then silence: 408 and closed after the timeout, not held for ever."""
    with socket.create_connection(server.server_address, timeout=5) as conn:
        conn.sendall(b"GET /heal")
        # Past the client's own 5 s, recv raises: a reply means the server cut it first.
        reply = conn.recv(65536)
    assert reply.startswith(b"HTTP/1.1 408 ")


def test_a_flood_of_idle_connections_leaves_probes_answered_by_a_fixed_set_of_threads(
    server: Endpoints,
) -> None:
    """1,000 idle sockets over a cap of 64: the oldest idle are closed, /healthz still answers."""
    before = threading.active_count()
    idle = [socket.create_connection(server.server_address, timeout=5) for _ in range(1000)]
    try:
        assert _get(server, "/healthz") == (200, b"ok\n")
        assert threading.active_count() <= before + 2  # the render pool, at most
        closed = 0
        for conn in idle[:900]:
            conn.settimeout(2)
            try:
                closed += conn.recv(1) == b""
            except (ConnectionResetError, TimeoutError):
                closed += 1
        assert closed >= 900 - 64
    finally:
        for conn in idle:
            conn.close()


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"GET /metrics HTTP/1.1\r\nAccept: text/plain", ("GET", "/metrics", "text/plain")),
        (b"GET /readyz?x=1 HTTP/1.0", ("GET", "/readyz", "")),
        (b"HEAD / HTTP/1.1\r\naccept :  a/b ", ("HEAD", "/", "a/b")),
        (b"GET /healthz", None),
        (b"GET  /healthz HTTP/1.1", None),
        (b"GET /healthz SPDY/3", None),
        (b"", None),
    ],
)
def test_request_heads_are_read_strictly(
    head: bytes, expected: tuple[str, str, str] | None
) -> None:
    """A request line of three parts ending in HTTP/1.x, and its Accept header, or nothing."""
    request = parse(head)
    got = None if request is None else (request.method, request.path, request.accept)
    assert got == expected


def test_concurrent_scrapes_share_one_render_and_a_young_page_is_served_again() -> None:
    """A hundred scrapes at once cause one render; after the reuse window, a fresh one."""
    renders: list[float] = []

    def render(_accept: str) -> Reply:
        renders.append(time.monotonic())
        time.sleep(0.3)
        return Reply(200, f"page {len(renders)}\n".encode())

    server = Endpoints(Health(), "127.0.0.1", 0, render=render).start()
    port = int(server.server_address[1])
    try:
        with ThreadPoolExecutor(100) as pool:
            bodies = list(pool.map(lambda _: _metrics(port), range(100)))
        assert bodies == ["page 1\n"] * 100
        assert len(renders) == 1
        time.sleep(RENDER_REUSE_S + 0.1)
        assert _metrics(port) == "page 2\n"
    finally:
        server.shutdown()


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())
