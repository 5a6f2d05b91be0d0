"""The nemesis schedule: seeded random faults, one per round, under load; nothing lost.

``INORDER_NEMESIS_S`` sets how long it runs (``make test-nemesis``: 20 minutes, a new seed
each run); without it a short schedule strikes once with each kind of fault, seed 1.
``INORDER_NEMESIS_SEED`` replays a schedule; the seed is printed with the report.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.faults.conftest import NEMESIS, Scale
from tests.faults.pipeline import Pipeline
from tests.faults.schedule import Nemesis, Tally


def test_a_seeded_schedule_of_faults_loses_nothing(
    pipeline: Pipeline, scale: Scale, tmp_path: Path
) -> None:
    """Each round: fresh load, one fault, healed, settled, judged; every row must be clean."""
    budget = float(os.environ.get("INORDER_NEMESIS_S") or 0)
    # The short schedule has one seed, so every run of it strikes alike; a long one a new one.
    drawn = time.time_ns() % 1_000_000 if budget else 1
    seed = int(os.environ.get("INORDER_NEMESIS_SEED") or drawn)
    nemesis = Nemesis(pipeline, tmp_path, seed)
    tallies: dict[str, Tally] = {kind: Tally(kind) for kind in nemesis.kinds()}
    NEMESIS.update(seed=seed, tallies=tallies, log=[])
    log: list[str] = NEMESIS["log"]  # type: ignore[assignment]
    log.append("clocks at start: " + ", ".join(f"{n} {c}" for n, c in nemesis.clocks.items()))
    started = time.monotonic()
    try:
        nemesis.start()
        for name in pipeline.processes:
            pipeline.wait_for(f"{name} up", lambda n=name: pipeline.http(n, "/healthz")[0] == 200)
        before = pipeline.verdict()
        kinds = list(tallies)
        nemesis.rng.shuffle(kinds)
        rounds = 0
        while rounds < len(kinds) or time.monotonic() - started < budget:
            kind = kinds[rounds] if rounds < len(kinds) else nemesis.rng.choice(kinds)
            load = pipeline.load(  # long enough to run through the fault
                scale.entities, 2 * scale.ops_per_entity, scale.rate, seed=seed + rounds,
                prefix=f"r{rounds}-",
            )  # fmt: skip
            pipeline.wait_for("load under way", lambda on=load: on.written > scale.entities)
            if rounds % 2 == 0:
                pipeline.lose_one_event(f"lost-r{rounds}")
            with nemesis.strike(kind) as did:
                log.append(f"round {rounds}: {did}")
            healed = time.monotonic()
            load.join()
            pipeline.settle(timeout=300)
            after = pipeline.verdict()
            tally = tallies[kind]
            tally.injected += 1
            tally.recovery_s.append(time.monotonic() - healed)
            tally.lost += after.lost - before.lost
            tally.applied_twice += after.applied_twice - before.applied_twice
            tally.totals_off += after.totals_off - before.totals_off
            tally.unexplained += after.unexplained - before.unexplained
            tally.crashed += len(after.crashed) - len(before.crashed)
            before = after
            rounds += 1
            assert after.clean, f"seed {seed}, {log[-1]}: {after}; logs in {pipeline.logs}"
    finally:
        nemesis.close()
    assert rounds >= len(kinds)


# The long run gets its budget on top of the short schedule's time.
pytestmark = [
    pytest.mark.faults,
    pytest.mark.services,
    pytest.mark.timeout(int(float(os.environ.get("INORDER_NEMESIS_S") or 0)) + 1200),
]
