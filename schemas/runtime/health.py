"""Liveness, readiness and Prometheus metrics over HTTP, shared by every inorder process.

``/healthz`` answers 200 while the main loop keeps beating, ``/readyz`` 200 while
the process says it can do its work (dependencies reachable), ``/metrics`` the
Prometheus registry. The server runs in a daemon thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder


class Health:
    """What the main loop reports: a heartbeat, and whether it is ready (and if not, why)."""

    def __init__(self, stale_after_s: float = 60.0) -> None:
        self._stale_after_s = stale_after_s
        self._beat = time.monotonic()
        self._not_ready: dict[str, str] = {"starting": "not started yet"}
        self._lock = threading.Lock()

    def beat(self) -> None:
        """The main loop is alive."""
        self._beat = time.monotonic()

    def blocked(self, dependency: str, why: str) -> None:
        """Mark not ready because ``dependency`` is unusable."""
        with self._lock:
            self._not_ready[dependency] = why

    def cleared(self, dependency: str) -> None:
        """``dependency`` works again."""
        with self._lock:
            self._not_ready.pop(dependency, None)

    def sleep(self, seconds: float, stopping: Callable[[], bool], tick_s: float = 0.2) -> None:
        """Wait ``seconds`` while beating; return early once ``stopping()`` is true."""

        def nap(deadline: float) -> None:
            time.sleep(min(tick_s, max(0.0, deadline - time.monotonic())))

        self.wait(seconds, stopping, nap)

    def wait(
        self, seconds: float, stopping: Callable[[], bool], step: Callable[[float], None]
    ) -> None:
        """Call ``step(deadline)`` while beating, until ``seconds`` passed or ``stopping()``."""
        deadline = time.monotonic() + seconds
        while not stopping() and time.monotonic() < deadline:
            self.beat()
            step(deadline)

    @property
    def live(self) -> bool:
        """True while the main loop beat recently."""
        return time.monotonic() - self._beat < self._stale_after_s

    @property
    def problems(self) -> dict[str, str]:
        """Why the process is not ready; empty when it is."""
        with self._lock:
            return dict(self._not_ready)


def _handler(health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                # OpenMetrics when the scraper asks for it: the format exemplars need.
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._send(200, encoder(REGISTRY), content_type)
            elif self.path == "/healthz":
                ok = health.live
                self._send(200 if ok else 503, b"ok\n" if ok else b"main loop stalled\n")
            elif self.path == "/readyz":
                problems = health.problems
                body = "".join(f"{k}: {v}\n" for k, v in problems.items()) or "ready\n"
                self._send(503 if problems else 200, body.encode())
            else:
                self._send(404, b"not found\n")

        def _send(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Probes are frequent; they are not logged."""

    return Handler


def serve(health: Health, host: str, port: int) -> ThreadingHTTPServer:
    """Start the HTTP server in a daemon thread; ``port`` 0 picks a free one."""
    server = ThreadingHTTPServer((host, port), _handler(health))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
