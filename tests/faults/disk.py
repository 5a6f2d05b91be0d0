"""Redis and PostgreSQL servers whose files live on a small tmpfs a test can fill and free.

Each server is a test's own (its own port and folders), so filling its disk touches no
other test. ``fill`` writes a ballast file until the filesystem has no room left: Redis
then refuses writes with ``MISCONF`` (its append-only file is there) until ``free``
removes it; PostgreSQL (its WAL is there) PANICs and goes down until ``free`` removes it
and starts it again. ``close`` takes the server and the mount down whatever happened.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from tests.integration.relay_support import free_port


def _fill(ballast: Path) -> None:
    """Write ``ballast`` until its filesystem has no room left."""
    with ballast.open("ab") as sink, contextlib.suppress(OSError):
        block = b"\0" * 65536
        while True:
            sink.write(block)
            sink.flush()


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
        _fill(self._ballast)

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


class SmallDiskPostgres:
    """A PostgreSQL server of the test's own whose WAL lives on a tmpfs of ``size_mb``.

    Its folders are under a temporary folder the ``postgres`` user can reach (the test's
    own folder is root's alone). When its WAL disk fills, a write PANICs and the server
    goes down; ``free`` gives the room back and starts it again if it stopped, as an
    operator who cleared the disk would.
    """

    def __init__(self, size_mb: int = 48) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="inorder-small-pg-"))
        self.root.chmod(0o755)
        self.data, self.wal, self.run = self.root / "data", self.root / "wal", self.root / "run"
        for folder in (self.wal, self.run):
            folder.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(self.wal)], check=True
        )
        shutil.chown(self.root, "postgres")
        for folder in (self.wal, self.run):
            shutil.chown(folder, "postgres")
        self.port = free_port()
        self.database_url = f"postgresql://inorder@127.0.0.1:{self.port}/inorder"
        self._as_postgres(
            self._bin("initdb"), "-D", str(self.data), "--waldir", str(self.wal / "pg_wal"),
            "--wal-segsize=1", "-U", "inorder", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8",
        )  # fmt: skip
        self.start()
        self._as_postgres(
            self._bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "inorder",
            "-d", "postgres", "-qc", "CREATE DATABASE inorder",
        )  # fmt: skip
        self._ballast = self.wal / "ballast"

    @staticmethod
    def _bin(name: str) -> str:
        found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
        assert found, f"no {name} in /usr/lib/postgresql"
        return str(found[-1])

    def _as_postgres(self, *command: str, check: bool = True) -> int:
        done = subprocess.run(
            ["runuser", "-u", "postgres", "--", *command], capture_output=True, check=False
        )
        assert not check or done.returncode == 0, done.stderr.decode()[-2000:]
        return done.returncode

    def start(self) -> None:
        """Start the server (no-op when it runs)."""
        if self.running():
            return
        self._as_postgres(
            self._bin("pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"),
            "-w", "-t", "60", "-o",
            f"-p {self.port} -k {self.run} -c listen_addresses=127.0.0.1 -c max_connections=100 "
            "-c min_wal_size=4MB -c max_wal_size=8MB -c fsync=off",
            "start",
        )  # fmt: skip

    def running(self) -> bool:
        """Whether the server answers."""
        status = [self._bin("pg_ctl"), "-D", str(self.data), "status"]
        return self._as_postgres(*status, check=False) == 0

    def fill(self) -> None:
        """Leave the WAL's filesystem no room at all."""
        _fill(self._ballast)

    def free(self) -> None:
        """Give the room back; start the server again if the full disk stopped it."""
        self._ballast.unlink(missing_ok=True)
        self.start()

    def close(self) -> None:
        """Stop the server, take the mount down, remove every folder."""
        self._ballast.unlink(missing_ok=True)
        stop = [self._bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"]
        self._as_postgres(*stop, check=False)
        subprocess.run(["umount", "-l", str(self.wal)], check=False)
        shutil.rmtree(self.root, ignore_errors=True)
