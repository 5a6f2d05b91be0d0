"""Step routes whose handler calls outside PostgreSQL: steps per second by lane count.

Events: 2,000 entities x 3 steps, each step's handler an API stand-in that answers in
50 ms (declared ``external`` and ``idempotent``), one consumer process on six
partitions. Each lane setting runs on a fresh topic and fresh tables; one lane gets 100
entities (it would take five minutes for 2,000). After each run every step must be
applied once, in seq order per entity. Time runs from the first call to the end of the
last (the consumer's start and group join are left out).

A last run at 32 lanes makes one entity in 100 answer in 1 s instead: the slow ones
should hold their own lanes only, so the figure stays near what the same work would
take spread evenly (the ratio to the even 32-lane figure, and the steps/s).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import psycopg

from tests.benchmarks.bench_steps import _event, _fresh_tables, _topic
from tests.benchmarks.fixtures import consume_until, consumer_settings, temp_schema
from tests.benchmarks.result import BenchResult
from tests.benchmarks.scale import sized
from tests.integration import step_handlers

ENTITIES = sized(2_000, 100)
ONE_LANE_ENTITIES = sized(100, 10)
STEPS = 3
LANES = sized((1, 8, 32, 128), (1, 8, 32))
SLOW_LANES = 32
# Call time of the uneven run over the even one's (the same 6,000 steps): what its
# steps/s would be if every lane stayed busy, as a share of the even figure.
_EVEN_SHARE = 1 / (
    (1 - 1 / step_handlers.SLOW_EVERY)
    + step_handlers.SLOW_NOW_AND_THEN_S / 0.05 / step_handlers.SLOW_EVERY
)
ROUTES = """[[route]]
stream = "ledger"
kind = "step"
lanes = {lanes}
[route.handlers."ledger.added"]
function = "tests.integration.step_handlers:{function}"
external = true
idempotent = true
"""
_DONE = "SELECT count(*) FROM inorder_step_progress WHERE last_applied = 3"  # = STEPS
# Rows written out of seq order within an entity, and steps written more than once.
_CHECK = """
SELECT count(*) FILTER (WHERE seq <> rn), count(*) - count(DISTINCT (entity_id, seq))
FROM (SELECT entity_id, seq, row_number() OVER (PARTITION BY entity_id ORDER BY n) AS rn
      FROM applied_steps) AS t
"""


def _steps_per_s(
    url: str, lanes: int, entities: int, folder: Path, function: str = "slow_call"
) -> float:
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    routes = Path(folder, f"lanes{lanes}-{function}.toml")
    routes.write_text(ROUTES.format(lanes=lanes, function=function))
    events = [_event(e, s) for s in range(1, STEPS + 1) for e in range(entities)]
    _fresh_tables(url)
    with _topic(bootstrap, events) as topic:
        prefix = f"bench.{uuid.uuid4().hex[:6]}"
        settings = consumer_settings(url, topic, routes, redis_key_prefix=prefix)
        step_handlers.SLOW_CALLS.clear()
        consume_until(settings, url, _DONE, entities)
        calls = list(step_handlers.SLOW_CALLS)
    # From the first call to the end of the last, as a user timing their API would see it
    # (the consumer's start and group join are left out).
    seconds = max(end for *_, end in calls) - min(start for _, _, start, _ in calls)
    with psycopg.connect(url) as conn:
        out_of_order, twice = conn.execute(_CHECK).fetchone() or (0, 0)
        total = conn.execute("SELECT count(*) FROM applied_steps").fetchone()
    if out_of_order or twice or not total or total[0] != entities * STEPS:
        raise RuntimeError(
            f"lanes={lanes}: {out_of_order} steps out of order, {twice} applied twice, "
            f"{total} rows for {entities * STEPS} steps"
        )
    return entities * STEPS / seconds


def run() -> list[BenchResult]:
    """Steps per second with 1, 8, 32 and 128 lanes; the best against one lane."""
    figures: dict[int, float] = {}
    with (
        temp_schema(os.environ["DATABASE_URL"], "bench_lanes") as url,
        tempfile.TemporaryDirectory() as folder,
    ):
        for lanes in LANES:
            entities = ONE_LANE_ENTITIES if lanes == 1 else ENTITIES
            figures[lanes] = _steps_per_s(url, lanes, entities, Path(folder))
        uneven = _steps_per_s(url, SLOW_LANES, ENTITIES, Path(folder), "slow_now_and_then")
    best = max(figures, key=lambda n: figures[n])
    how = f"{ENTITIES:,} entities x {STEPS} steps, 50 ms external handler"
    results = [
        BenchResult(
            f"steps_external_lanes_{n}_per_s",
            v,
            "steps/s",
            how if n > 1 else f"{ONE_LANE_ENTITIES} entities x {STEPS} steps, same handler",
        )
        for n, v in figures.items()
    ]
    results += [
        BenchResult(
            "steps_external_per_s", figures[best], "steps/s", f"best: {best} lanes; goal >= 1,000"
        ),
        BenchResult(
            "steps_external_vs_one_lane", figures[best] / figures[1], "x", f"{best} lanes against 1"
        ),
        BenchResult(
            "steps_external_slow_few_per_s",
            uneven,
            "steps/s",
            f"{SLOW_LANES} lanes; 1 entity in {step_handlers.SLOW_EVERY} answers in "
            f"{step_handlers.SLOW_NOW_AND_THEN_S:g} s, the rest in 50 ms",
        ),
        BenchResult(
            "steps_external_slow_few_vs_even",
            uneven / figures[SLOW_LANES] / _EVEN_SHARE,
            "x",
            "against the even 32-lane figure scaled to the same call time (1.0: slow "
            "entities hold only their lanes)",
        ),
    ]
    return results
