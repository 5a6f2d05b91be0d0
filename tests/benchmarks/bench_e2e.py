"""End to end, on the demo's processes: throughput and audit speed.

``e2e_events_per_s``: the demo scenario (200 subscriptions x 25 operations, two relays,
two consumers with a restart, a lost event healed), events over the time from load
start to settled. ``audit_rows_per_s``: the audit over everything, in this process.
Commit-to-visible latency has its own suite (``bench_latency``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from consumer.kinds import KINDS
from consumer.kinds._audit import Audit
from consumer.routes import parse_routes
from tests.benchmarks.result import BenchResult
from tests.support.services import ROOT

DEMO = ROOT / "deploy" / "local" / "demo.py"
# Where the demo keeps its state: the running stack's folder, which a baseline's tree
# (``make bench BASELINE=...``, a worktree of its own) shares with this one.
DEMO_STATE = Path(os.environ.get("INORDER_STACK_DIR", ROOT / ".stack")) / "demo"


def _demo(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, str(DEMO), *args], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"demo {args[0]} failed:\n{done.stdout}\n{done.stderr}")


def run() -> list[BenchResult]:
    """Demo throughput and audit speed."""
    db = f"{os.environ['DATABASE_URL']}?options=-csearch_path%3Ddemo"
    with tempfile.TemporaryDirectory() as folder:
        summary = Path(folder, "summary.json")
        try:
            _demo("up", "--entities", "200", "--events", "25", "--summary-json", str(summary))
            figures = json.loads(summary.read_text())
            routes = parse_routes(Path(DEMO_STATE, "routes.toml").read_text())
            with psycopg.connect(db) as outbox, psycopg.connect(db, autocommit=True) as views:
                started = time.perf_counter()
                report = Audit(outbox, views, KINDS).run(routes)
                audit_s = time.perf_counter() - started
        finally:
            threading.Thread(target=_demo, args=("down",)).run()
    return [
        BenchResult(
            "e2e_events_per_s",
            figures["events"] / figures["seconds_to_settled"],
            "events/s",
            f"demo: {figures['events']} events, load start to settled",
        ),
        BenchResult(
            "audit_rows_per_s",
            report.rows / audit_s,
            "rows/s",
            f"{report.rows} rows, {report.entities} entities",
        ),
    ]
