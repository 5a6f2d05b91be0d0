"""A Redis whose append-only file lives on a small tmpfs that a test can fill and free.

The server is a test's own (its own port and folder, AOF on as the stack's), so filling
its disk touches no other test. ``fill`` writes a ballast file until the filesystem has
no room left; Redis then refuses writes with ``MISCONF`` until ``free`` removes it. The
mount and the server are taken down by ``close`` whatever happened.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

import redis

from tests.integration.relay_support import free_port


class SmallDiskRedis:
    """redis-server with its data folder on a tmpfs of ``size_mb``."""

    def __init__(self, folder: Path, size_mb: int = 16) -> None:
        self.mount = folder / "disk"
        self.mount.mkdir(parents=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(self.mount)],
            check=True,
        )
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._server = subprocess.Popen(
            [
                shutil.which("redis-server") or "redis-server",
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.mount),
                "--appendonly", "yes",
                "--appendfsync", "everysec",
                "--save", "",
                "--logfile", str(folder / "small-redis.log"),
            ],
        )  # fmt: skip
        client = redis.Redis(port=self.port)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    assert time.monotonic() < deadline, "the small-disk Redis did not start"
                    time.sleep(0.1)
        finally:
            client.close()
        self._ballast = self.mount / "ballast"

    def fill(self) -> None:
        """Leave the filesystem no room at all."""
        with self._ballast.open("ab") as sink, contextlib.suppress(OSError):
            block = b"\0" * 65536
            while True:
                sink.write(block)
                sink.flush()

    def free(self) -> None:
        """Give the room back; Redis takes writes again once its next AOF write works."""
        self._ballast.unlink(missing_ok=True)

    def refusing(self) -> bool:
        """Whether the server refuses writes now (its last AOF write failed)."""
        client = redis.Redis(port=self.port)
        try:
            info = client.info("persistence")
        finally:
            client.close()
        return info.get("aof_last_write_status") == "err"

    def close(self) -> None:
        """Stop the server and take the mount down."""
        self.free()
        self._server.terminate()
        try:
            self._server.wait(15)
        except subprocess.TimeoutExpired:
            self._server.kill()
            self._server.wait(5)
        subprocess.run(["umount", "-l", str(self.mount)], check=False)
