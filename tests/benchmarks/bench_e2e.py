"""End to end, on the demo's processes: throughput, commit-to-visible latency, audit speed.

``e2e_events_per_s``: the demo scenario (200 subscriptions x 25 operations, two relays,
two consumers with a restart, a lost event healed), events over the time from load
start to settled. Then, with those processes still running, a writer creates new
subscriptions at a steady 1,000 events/s; a row's ``seen_at`` (set when the projection
first wrote it) against the producer's commit time gives ``e2e_latency_p50_ms`` and
``p99``. ``audit_rows_per_s``: the audit over everything, in this process.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from consumer.admin.audit import Audit
from consumer.routes import parse_routes
from producer import subscriptions as subs
from tests.benchmarks.result import BenchResult
from tests.support.services import ROOT

DEMO = ROOT / "deploy" / "local" / "demo.py"
RATE_EVENTS_S = 1000
SECONDS = 10


def _demo(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, str(DEMO), *args], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"demo {args[0]} failed:\n{done.stdout}\n{done.stderr}")


def _latencies(db: str) -> list[float]:
    committed: dict[str, float] = {}
    per_tick = RATE_EVENTS_S // 100 // 2  # each creation writes two events
    with psycopg.connect(db) as conn:
        started = time.perf_counter()
        for tick in range(SECONDS * 100):
            time.sleep(max(0.0, started + tick / 100 - time.perf_counter()))
            for i in range(per_tick):
                sub_id = f"lat-{tick}-{i}"
                subs.create_subscription(conn, sub_id, "pro", topic="inorder.demo.events")
                committed[sub_id] = time.time()
    deadline = time.monotonic() + 60
    with psycopg.connect(db) as conn:
        while time.monotonic() < deadline:
            rows = conn.execute(
                "SELECT subscription_id, extract(epoch FROM seen_at) FROM billing_view "
                "WHERE subscription_id LIKE 'lat-%%'"
            ).fetchall()
            conn.rollback()
            if len(rows) == len(committed):
                return [float(seen) - committed[sub_id] for sub_id, seen in rows]
            time.sleep(0.2)
    raise RuntimeError("not every subscription became visible within 60 s")


def run() -> list[BenchResult]:
    """Demo throughput, steady-rate latency, audit speed."""
    db = f"{os.environ['DATABASE_URL']}?options=-csearch_path%3Ddemo"
    with tempfile.TemporaryDirectory() as folder:
        summary = Path(folder, "summary.json")
        try:
            _demo("up", "--entities", "200", "--events", "25", "--summary-json", str(summary))
            figures = json.loads(summary.read_text())
            delays = _latencies(db)
            routes = parse_routes(Path(ROOT, ".stack", "demo", "routes.toml").read_text())
            with psycopg.connect(db) as outbox, psycopg.connect(db, autocommit=True) as views:
                started = time.perf_counter()
                report = Audit(outbox, views).run(routes)
                audit_s = time.perf_counter() - started
        finally:
            threading.Thread(target=_demo, args=("down",)).run()
    q = statistics.quantiles(delays, n=100)
    return [
        BenchResult(
            "e2e_events_per_s",
            figures["events"] / figures["seconds_to_settled"],
            "events/s",
            f"demo: {figures['events']} events, load start to settled",
        ),
        BenchResult(
            "e2e_latency_p50_ms",
            q[49] * 1000,
            "ms",
            f"outbox commit to projection row, {RATE_EVENTS_S} events/s",
        ),
        BenchResult("e2e_latency_p99_ms", q[98] * 1000, "ms", f"{len(delays)} subscriptions"),
        BenchResult(
            "audit_rows_per_s",
            report.rows / audit_s,
            "rows/s",
            f"{report.rows} rows, {report.entities} entities",
        ),
    ]
