"""The inorder-producer command: migrate, loadgen, and one-line errors for bad configuration."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.conftest import PgSchema


def _producer(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
    return subprocess.run(
        [sys.executable, "-m", "producer", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_loadgen_migrates_and_reports_its_rate(pg_schema: PgSchema) -> None:
    """loadgen creates the tables it needs, writes the events and prints how many and how fast."""
    done = _producer(
        "loadgen",
        "--entities",
        "5",
        "--events",
        "4",
        "--writers",
        "2",
        "--no-progress",
        DATABASE_URL=pg_schema.url,
    )
    assert done.returncode == 0, done.stderr
    with pg_schema.connect() as conn:
        rows = conn.execute("SELECT count(*) FROM outbox").fetchone()
    assert rows is not None
    assert f"wrote {rows[0]} events from 20 operations" in done.stderr


def test_missing_database_url_stops_with_one_line() -> None:
    """Without DATABASE_URL the command exits 2 with one line naming the setting."""
    done = _producer("migrate")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "inorder-producer: bad configuration: DATABASE_URL: Field required"
    ]


def test_unreachable_database_stops_with_one_line() -> None:
    """A database that does not answer gives exit 2 and one line, not a traceback."""
    done = _producer("migrate", DATABASE_URL="postgresql://nobody@127.0.0.1:1/none")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("inorder-producer: cannot use PostgreSQL:")


def test_batches_and_worker_commands_start(pg_schema: PgSchema, topic_factory) -> None:
    """batches writes manifests and work items; worker runs until SIGTERM and exits 0."""
    work, events = topic_factory("work"), topic_factory("events")
    env = {
        "DATABASE_URL": pg_schema.url,
        "INORDER_WORK_TOPIC": work,
        "INORDER_EVENTS_TOPIC": events,
    }
    done = _producer("batches", "--count", "2", "--items", "3", **env)
    assert done.returncode == 0, done.stderr
    with pg_schema.connect() as conn:
        rows = conn.execute("SELECT event_type, count(*) FROM outbox GROUP BY 1").fetchall()
    assert dict(rows) == {"batch.accepted": 2, "batch.work_item": 6}
    base = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "producer", "worker"],
        env={**base, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)
        assert worker.poll() is None, worker.communicate()[1][-2000:]
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err[-2000:]
