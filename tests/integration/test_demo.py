"""The demo's scenario at small scale: reordering, a rebalance, a lost event, and a clean audit."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import psycopg

from tests.support.services import ROOT, Services

DEMO = ROOT / "deploy" / "local" / "demo.py"


def _demo(services: Services, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DATABASE_URL": services.database_url,
        "KAFKA_BOOTSTRAP_SERVERS": services.kafka_bootstrap,
        "REDIS_URL": services.redis_url,
        "COLUMNS": "120",
    }
    return subprocess.run(
        [sys.executable, str(DEMO), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_demo_scenario_heals_the_lost_event_and_audits_clean(services: Services) -> None:
    """Relays, consumers (one restarted), sweeper, worker: gap heals, batches end, audit clean."""
    try:
        done = _demo(
            services, "up", "--entities", "20", "--events", "6", "--writers", "4", "--batches", "4"
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "not settled" not in done.stdout
        assert "gaps escalated / healed" in done.stdout
        line = next(row for row in done.stdout.splitlines() if "gaps escalated / healed" in row)
        assert "1 / 1" in line
        assert "0 divergences, 0 unexplained" in done.stdout.replace("\n│", "").replace("  ", " ")
        batches = next(row for row in done.stdout.splitlines() if "batches: complete" in row)
        complete, incomplete, other = (int(n) for n in re.findall(r"(\d+) */? *", batches)[-3:])
        assert (complete + incomplete, other) == (4, 0)
        # The lost event's entity told by `inorder-admin explain` (TSV: not a terminal).
        story = done.stdout.split("# seat_ledger:sub-000007 (step route)\n", 1)[1]
        assert story.splitlines()[1].endswith("\tconsistent with the outbox")
        gaps = story.split("# gaps\n", 1)[1].splitlines()
        assert "\thealed\t" in gaps[1]
        # Every item came back from the worker (a few fail on purpose); none was given up on
        # because its deadline passed with no result.
        with psycopg.connect(services.database_url) as conn:
            states = dict(
                conn.execute(
                    "SELECT state, count(*) FROM demo.inorder_batch_items GROUP BY state"
                ).fetchall()
            )
        assert sum(states.values()) == 40
        assert states.get("done", 0) >= 30, states
        assert not {"pending", "abandoned"} & set(states), states
    finally:
        _demo(services, "down")
