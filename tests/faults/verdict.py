"""Judging a settled pipeline: lost and doubled effects, wrong totals, and the audit."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from typing import Any

from tests.conftest import PgSchema
from tests.integration.sweeper_support import tool
from tests.support.services import ROOT

# Lost: an outbox row of an entity's current generation with no effect (steps), or a
# projection row behind the newest outbox row. Old generations may be superseded.
LOST_STEPS = """
SELECT count(*) FROM outbox o
WHERE o.entity_type = 'seat_ledger' AND o.failed_at IS NULL
  AND o.generation = (SELECT max(generation) FROM outbox m
                      WHERE m.entity_type = o.entity_type AND m.entity_id = o.entity_id)
  AND NOT EXISTS (SELECT 1 FROM fault_effects e WHERE e.entity_id = o.entity_id
                  AND e.generation = o.generation AND e.seq = o.seq)
"""
LOST_PROJECTION = """
SELECT count(*) FROM (
  SELECT entity_id, max(ARRAY[generation, seq]) AS newest FROM outbox
  WHERE entity_type = 'subscription' AND failed_at IS NULL GROUP BY entity_id
) o LEFT JOIN billing_view v ON v.subscription_id = o.entity_id
WHERE v.subscription_id IS NULL OR ARRAY[v.generation, v.seq] < o.newest
"""
APPLIED_TWICE = """
SELECT count(*) FROM (SELECT 1 FROM fault_effects
                      GROUP BY entity_id, generation, seq HAVING count(*) > 1) twice
"""
# Rows the relay marked failed, by entity: in a run that wrote only valid rows, each one
# is an event lost, whatever reason the relay gave and however the audit explains it.
FAILED = "SELECT entity_id FROM outbox WHERE failed_at IS NOT NULL"
# The producer's seat totals against the consumer's, for ledgers in the same generation.
TOTALS_OFF = """
SELECT count(*) FROM seat_ledgers l JOIN seat_totals t ON t.subscription_id = l.id
WHERE t.generation = l.generation AND t.seats <> l.seats
"""


@dataclass(frozen=True)
class Verdict:
    """What a settled pipeline shows."""

    produced: int
    lost: int
    applied_twice: int
    totals_off: int
    unexplained: int
    audit: dict[str, Any]
    crashed: list[str]

    @property
    def clean(self) -> bool:
        """Nothing lost, nothing doubled, nothing unexplained, no process died by itself."""
        return not (
            self.lost or self.applied_twice or self.totals_off or self.unexplained or self.crashed
        )


def audit(env: dict[str, str]) -> dict[str, Any]:
    """``inorder-admin --json audit``: its summary line, its lines, and its exit code."""
    run = subprocess.run(
        [tool("inorder-admin"), "--json", "audit"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    summary = next((line for line in reversed(lines) if "unexplained" in line), None)
    assert summary is not None, f"no audit summary: {run.stdout[-2000:]} {run.stderr[-2000:]}"
    return {**summary, "exit": run.returncode, "lines": lines}


def judge(
    db: PgSchema, env: dict[str, str], crashed: list[str], refused: frozenset[str] = frozenset()
) -> Verdict:
    """Counts from the effect log, the state comparison and the audit.

    ``refused``: the entities whose rows the test wrote to be failed; any other row
    marked failed counts as lost (a valid row wrongly failed during a fault).
    """
    with db.connect() as conn:

        def one(query: str) -> int:
            row = conn.execute(query).fetchone()
            return int(row[0]) if row else 0

        produced = one("SELECT count(*) FROM outbox")
        failed = [row[0] for row in conn.execute(FAILED).fetchall()]
        lost = one(LOST_STEPS) + one(LOST_PROJECTION) + sum(e not in refused for e in failed)
        twice = one(APPLIED_TWICE)
        totals_off = one(TOTALS_OFF)
    report = audit(env)
    # An audit that fails without naming a divergence still counts as one.
    unexplained = int(report["unexplained"]) or int(report["exit"] != 0)
    return Verdict(produced, lost, twice, totals_off, unexplained, report, crashed)
