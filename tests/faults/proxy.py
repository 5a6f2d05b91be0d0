"""A fault proxy on loopback between one program and one service: pass, blackhole, slow, cut.

The program is given the proxy's port instead of the service's. Every accepted
connection is forwarded to the service by two pump threads, one per direction, so a
fault acts on this program's link only while every other program talks to the service
directly:

- ``blackhole``: connections stay open and bytes are taken, but nothing is forwarded
  either way (a peer that accepts and never answers);
- ``slow``: every chunk waits ``latency`` seconds plus up to ``jitter`` more;
- ``cut``: every connection is reset and new ones are reset at once until ``heal``.

Lost packets are the firewall's (``tests.faults.firewall``), on the proxy's port. The
program's side of each connection carries the keepalives and user timeout a PostgreSQL
server is given, so a program that vanished behind a dropped link is noticed and its
connection to the service closed, as the server itself would close it.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import struct
import threading
import time

_KEEPALIVE = (
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 5),
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5),
    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3),
    (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 20_000),
)


def _reset(sock: socket.socket) -> None:
    """Close with a RST, as a link that is torn down does, not a polite FIN.

    Shut down first: a pump thread blocked reading the socket keeps it open through a
    bare close, and the link would live on unseen by both ends.
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def kafka_faulty() -> tuple[str, int] | None:
    """The broker's FAULTY listener and the port it advertises, when the stack has one.

    Returns the listener's URL and the port the proxy in front of it must take.
    """
    listener = os.environ.get("INORDER_KAFKA_FAULTY_PORT")
    advertised = os.environ.get("INORDER_KAFKA_FAULTY_PROXY_PORT")
    if not listener or not advertised:
        return None
    try:
        socket.create_connection(("127.0.0.1", int(listener)), timeout=2).close()
    except OSError:
        return None  # a broker started before it had the listener: restart the stack
    return f"kafka://127.0.0.1:{listener}", int(advertised)


def host_port(url: str) -> tuple[str, int]:
    """The ``host:port`` a service URL names (``scheme://user@host:port/...``)."""
    rest = url.split("@", 1)[-1].split("://", 1)[-1]
    host, port = rest.split("/", 1)[0].split("?", 1)[0].rsplit(":", 1)
    return host, int(port)


class FaultProxy:
    """Forwards ``127.0.0.1:port`` to the service ``url`` names; faults are set and healed.

    ``port``: a fixed one, where the service advertises it (the broker's FAULTY listener
    advertises its proxy's port, so a client's every connection goes through the proxy).
    """

    def __init__(self, url: str, *, seed: int = 0, port: int = 0) -> None:
        self.target = host_port(url)
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self._listener.getsockname()[1]
        self.mode = "pass"
        self.latency = 0.0
        self.jitter = 0.0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    def address(self, url: str) -> str:
        """``url`` with the service's ``host:port`` replaced by the proxy's."""
        host, port = self.target
        assert f"{host}:{port}" in url, url
        return url.replace(f"{host}:{port}", f"127.0.0.1:{self.port}")

    # ------------------------------------------------------------ faults

    def blackhole(self) -> None:
        """Accept and keep every connection, forward nothing."""
        self.mode = "blackhole"

    def slow(self, latency: float, jitter: float = 0.0) -> None:
        """Delay every chunk by ``latency`` plus up to ``jitter`` seconds."""
        self.latency, self.jitter = latency, jitter

    def cut(self) -> None:
        """Reset every connection now and every new one until healed."""
        self.mode = "cut"
        with self._lock:
            doomed = list(self._open)
            self._open.clear()
        for sock in doomed:
            _reset(sock)

    def heal(self) -> None:
        """Forward everything again, at once."""
        self.mode, self.latency, self.jitter = "pass", 0.0, 0.0

    def close(self) -> None:
        """Stop listening and reset every connection."""
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()

    # ------------------------------------------------------------ forwarding

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.mode == "cut":
                _reset(client)
                continue
            for level, option, value in _KEEPALIVE:
                client.setsockopt(level, option, value)
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                while self.mode == "blackhole" and not self._closed:
                    time.sleep(0.05)
                if self.mode == "cut" or self._closed:
                    break
                if self.latency or self.jitter:
                    time.sleep(self.latency + self._rng.uniform(0, self.jitter))
                sink.sendall(data)
        except OSError:
            pass
        finally:  # one side gone: the other follows, as a real link's peer would see it
            with self._lock:
                self._open.difference_update((source, sink))
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
