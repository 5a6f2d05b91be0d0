"""The HTTP endpoints of every inorder process: /healthz, /readyz and /metrics.

One asyncio loop in one daemon thread holds every connection, so a thousand idle sockets
cost a thousand file descriptors, not a thousand threads. Each connection gets one
request and is closed. Its head must arrive whole within ``timeout_s`` and within
``MAX_HEAD_BYTES``; a slow or silent client is cut at that deadline. At most
``max_connections`` are open: the next one to arrive closes the oldest that has not sent
its request yet, so a flood of idle sockets cannot starve the kubelet's probes. The
Prometheus registry is rendered on a pool of ``RENDER_THREADS`` threads, once for every
request that arrives while it renders and within ``RENDER_REUSE_S`` after it: a flood of
scrapes makes no more renders than one scraper does, and a connection cut while it waits
costs nothing.

What the server answers is decided by ``answer``, which does no I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

from schemas.runtime.health import Health

MAX_HEAD_BYTES = 8192  # request line and headers; a probe's is under 200 bytes
RENDER_THREADS = 2
RENDER_REUSE_S = 1.0  # a page this young is served again; Prometheus scrapes every 15 s+
BACKLOG = 1024
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
REASONS |= {408: "Request Timeout", 431: "Request Header Fields Too Large"}
REASONS |= {503: "Service Unavailable"}


@dataclass(frozen=True, slots=True)
class Reply:
    """A status, a body and its content type."""

    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"

    def encode(self, head_only: bool = False) -> bytes:
        """The whole HTTP/1.1 response, closing the connection after it."""
        head = (
            f"HTTP/1.1 {self.status} {REASONS.get(self.status, '')}\r\n"
            f"Content-Type: {self.content_type}\r\n"
            f"Content-Length: {len(self.body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode("ascii")
        return head if head_only else head + self.body


@dataclass(frozen=True, slots=True)
class Request:
    """What a request head says that the endpoints read."""

    method: str
    path: str
    accept: str


def parse(head: bytes) -> Request | None:
    """The request in ``head`` (request line and headers), or None when it is not HTTP/1.x."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        return None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    method, target, _ = parts
    accept = ""
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon and name.strip().lower() == "accept":
            accept = value.strip()
    return Request(method, target.split("?", 1)[0], accept)


def answer(request: Request | None, health: Health, render: Callable[[str], Reply]) -> Reply:
    """The reply to ``request``; ``render(accept)`` makes the metrics page."""
    if request is None:
        return Reply(400, b"bad request\n")
    if request.method not in ("GET", "HEAD"):
        return Reply(405, b"only GET and HEAD\n")
    if request.path == "/healthz":
        ok = health.live
        return Reply(200 if ok else 503, b"ok\n" if ok else b"main loop stalled\n")
    if request.path == "/readyz":
        problems = health.problems
        body = "".join(f"{name}: {reason}\n" for name, reason in problems.items()) or "ready\n"
        body += "".join(f"{topic}: {text}\n" for topic, text in health.notes.items())
        return Reply(503 if problems else 200, body.encode())
    if request.path == "/metrics":
        return render(request.accept)
    return Reply(404, b"not found\n")


def render_metrics(accept: str) -> Reply:
    """The Prometheus registry, in OpenMetrics when the scraper asks for it (exemplars)."""
    encoder, content_type = choose_encoder(accept)
    return Reply(200, encoder(REGISTRY), content_type)


class Endpoints:
    """The server: bound when made, serving once ``start`` is called, until ``shutdown``."""

    def __init__(
        self,
        health: Health,
        host: str,
        port: int,
        *,
        max_connections: int = 256,
        timeout_s: float = 5.0,
        render: Callable[[str], Reply] = render_metrics,
    ) -> None:
        self.health = health
        self._render = render
        # Per content type: the render in flight or the last one, and when it finished.
        self._pages: dict[str, tuple[asyncio.Future[Reply], float]] = {}
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self._socket = socket.create_server((host, port), backlog=BACKLOG)
        self.server_address: tuple[str, int] = self._socket.getsockname()[:2]
        self._pool = ThreadPoolExecutor(RENDER_THREADS, thread_name_prefix="metrics")
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._waiting: dict[asyncio.StreamWriter, None] = {}  # oldest first, head not read
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)

    def start(self) -> Endpoints:
        """Serve in the daemon thread."""
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop serving and close every connection."""
        if self._thread.is_alive():
            closing = asyncio.run_coroutine_threadsafe(self._close(), self._loop)
            with contextlib.suppress(Exception):
                closing.result(timeout=5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(OSError):
            self._socket.close()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(
                self._connection, sock=self._socket, limit=MAX_HEAD_BYTES, backlog=BACKLOG
            )
        )
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _close(self) -> None:
        """Stop accepting, abort every connection and let their handlers end."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for _ in range(3):  # connection_lost, then each handler's finally
            await asyncio.sleep(0)

    def _make_room(self, arriving: asyncio.StreamWriter) -> bool:
        """Close the oldest connection still waiting for its head; False if none is."""
        for writer in self._waiting:
            if writer is not arriving:
                del self._waiting[writer]
                writer.transport.abort()
                return True
        return False

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        self._waiting[writer] = None
        try:
            if len(self._writers) > self.max_connections and not self._make_room(writer):
                return
            reply, head_only = await self._reply(reader)
            self._waiting.pop(writer, None)
            if reply is not None:
                writer.write(reply.encode(head_only))
                await asyncio.wait_for(writer.drain(), self.timeout_s)
                writer.close()  # the reply is in the kernel's hands: a plain FIN after it
        except (OSError, TimeoutError):
            pass  # the client went, or read too slowly: nothing more to send it
        finally:
            self._writers.discard(writer)
            self._waiting.pop(writer, None)
            if not writer.transport.is_closing():
                writer.transport.abort()

    async def _reply(self, reader: asyncio.StreamReader) -> tuple[Reply | None, bool]:
        """The reply to the connection's request, and whether to send its head only."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout_s)
        except asyncio.LimitOverrunError:
            return Reply(431, b"request head too large\n"), False
        except TimeoutError:
            return Reply(408, b"request head not received in time\n"), False
        except asyncio.IncompleteReadError:
            return None, False
        request = parse(head[:-4])
        head_only = request is not None and request.method == "HEAD"
        if request is not None and request.path == "/metrics" and request.method in ("GET", "HEAD"):
            return await self._page(request.accept), head_only
        return answer(request, self.health, self._render), head_only

    async def _page(self, accept: str) -> Reply:
        """The metrics page: the render in flight, or one finished within ``RENDER_REUSE_S``,
        else a new one (rendering takes a while: on the pool, off the loop)."""
        kind = choose_encoder(accept)[1]
        now = time.monotonic()
        found = self._pages.get(kind)
        if found is not None:
            page, finished = found
            if not page.done() or now - finished < RENDER_REUSE_S:
                return await asyncio.shield(page)
        loop = asyncio.get_running_loop()
        page = loop.run_in_executor(self._pool, self._render, accept)
        self._pages[kind] = (page, float("inf"))
        page.add_done_callback(lambda _: self._finished(kind, page))
        return await asyncio.shield(page)

    def _finished(self, kind: str, page: asyncio.Future[Reply]) -> None:
        if self._pages.get(kind, (None, 0.0))[0] is page:
            self._pages[kind] = (page, time.monotonic())


def serve(
    health: Health, host: str, port: int, *, max_connections: int = 256, timeout_s: float = 5.0
) -> Endpoints:
    """Bind ``host:port`` (0 picks a free port) and serve in a daemon thread.

    A port that cannot be bound raises ``OSError`` here, in the caller's thread.
    """
    return Endpoints(
        health, host, port, max_connections=max_connections, timeout_s=timeout_s
    ).start()
