"""A redis-server of a test's or benchmark's own, started on a free loopback port.

Used where the shared Redis must not be touched: killed with SIGKILL, its data folder
rolled back, its persistence settings changed.
"""

from __future__ import annotations

import dataclasses
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from tests.support.kafka import wait_until


@dataclasses.dataclass
class PrivateRedis:
    """A redis-server of this test's own, so it can be killed and its disk rolled back."""

    folder: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Its redis:// URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (or start again) on the same port and folder; wait until it answers."""
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.folder),
                "--appendonly",
                "yes",
                "--appendfsync",
                "no",  # what reached the disk is what the rolled-back folder holds
                "--save",
                "",
            ],
            stdout=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        wait_until(lambda: _answers(client), timeout_s=20)
        client.close()

    def crash(self) -> None:
        """SIGKILL: no shutdown, nothing flushed."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


@contextmanager
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A running private Redis (AOF on, appendfsync no) with its data under ``tmp_path``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder = tmp_path / "redis"
    folder.mkdir()
    server = PrivateRedis(folder, port)
    server.start()
    try:
        yield server
    finally:
        if server.process is not None and server.process.poll() is None:
            server.crash()
