"""Step routes whose handler calls outside PostgreSQL: steps per second by lane count.

Events: 2,000 entities x 3 steps, each step's handler an API stand-in that answers in
50 ms (declared ``external`` and ``idempotent``), one consumer process on six
partitions. Each lane setting runs on a fresh topic and fresh tables; one lane gets 100
entities (it would take five minutes for 2,000). After each run every step must be
applied once, in seq order per entity. Time runs from the first call to the end of the
last (the consumer's start and group join are left out).

Each run also reports the CPU time one external step costs: the consumer process and
its PostgreSQL backends (sampled from ``/proc`` while it runs), over the same span.

A run at 32 lanes makes one entity in 100 answer in 1 s instead: the slow ones should
hold their own lanes only, so the figure stays near what the same work would take
spread evenly (the ratio to the even 32-lane figure, and the steps/s).

Last, the same 50 ms call made by an ``async def`` handler (``asyncio.sleep``, the step
recorded on its async connection) at 32 and 128 lanes: its steps run on the lanes' one
event loop, each lane's run of them handed over once. A lane then holds two PostgreSQL
connections (its own, and the loop's for the run): 128 lanes need more than 256.

Every lane setting keeps its lanes' connections open from the consumer's start
(``keep_lanes_open``), as a route tuned for bursts does; one more run at the widest
setting opens them as lanes first need them (the default), its connections' start
inside the measured span.

Beside them, at the widest setting, the leanest lanes that make the same calls and
write the same rows (``lean_lanes``: threads, then one event loop; no Kafka, no plan):
what the machine allows any lanes at that width, and the consumer's figure as a share
of it.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import psycopg

from tests.benchmarks import lean_lanes
from tests.benchmarks.bench_steps import _event, _fresh_tables, _topic
from tests.benchmarks.fixtures import consume_until, consumer_settings, temp_schema
from tests.benchmarks.machine import SessionsCpu
from tests.benchmarks.result import BenchResult
from tests.benchmarks.scale import sized
from tests.integration import step_handlers

ENTITIES = sized(2_000, 100)
ONE_LANE_ENTITIES = sized(100, 10)
STEPS = 3
LANES = sized((1, 8, 32, 128), (1, 8, 32))
ASYNC_LANES = sized((32, 128), (8, 32))
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
keep_lanes_open = {kept}
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
    url: str,
    lanes: int,
    entities: int,
    folder: Path,
    function: str = "slow_call",
    *,
    kept: bool = True,
) -> tuple[float, float]:
    """Steps per second, and CPU milliseconds per step (``kept``: ``keep_lanes_open``)."""
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    routes = Path(folder, f"lanes{lanes}-{function}-{kept}.toml")
    routes.write_text(ROUTES.format(lanes=lanes, function=function, kept=str(kept).lower()))
    events = [_event(e, s) for s in range(1, STEPS + 1) for e in range(entities)]
    _fresh_tables(url)
    with _topic(bootstrap, events) as topic:
        prefix = f"bench.{uuid.uuid4().hex[:6]}"
        settings = consumer_settings(url, topic, routes, redis_key_prefix=prefix)
        made = (
            step_handlers.ASYNC_CALLS if function.endswith("_async") else step_handlers.SLOW_CALLS
        )
        made.clear()
        with SessionsCpu(url, "inorder%") as cpu:
            consume_until(settings, url, _DONE, entities)
        calls = list(made)
    # From the first call to the end of the last, as a user timing their API would see it
    # (the consumer's start and group join are left out).
    first, last = min(start for _, _, start, _ in calls), max(end for *_, end in calls)
    seconds = last - first
    with psycopg.connect(url) as conn:
        out_of_order, twice = conn.execute(_CHECK).fetchone() or (0, 0)
        total = conn.execute("SELECT count(*) FROM applied_steps").fetchone()
    if out_of_order or twice or not total or total[0] != entities * STEPS:
        raise RuntimeError(
            f"lanes={lanes}: {out_of_order} steps out of order, {twice} applied twice, "
            f"{total} rows for {entities * STEPS} steps"
        )
    return entities * STEPS / seconds, cpu.between(first, last) * 1000 / (entities * STEPS)


def run() -> list[BenchResult]:
    """Steps per second with 1, 8, 32 and 128 lanes; the best against one lane."""
    figures: dict[int, float] = {}
    cpu_ms: dict[int, float] = {}
    with (
        temp_schema(os.environ["DATABASE_URL"], "bench_lanes") as url,
        tempfile.TemporaryDirectory() as folder,
    ):
        for lanes in LANES:
            entities = ONE_LANE_ENTITIES if lanes == 1 else ENTITIES
            figures[lanes], cpu_ms[lanes] = _steps_per_s(url, lanes, entities, Path(folder))
        on_demand = _steps_per_s(url, max(LANES), ENTITIES, Path(folder), kept=False)
        uneven, _ = _steps_per_s(url, SLOW_LANES, ENTITIES, Path(folder), "slow_now_and_then")
        awaited = {
            n: _steps_per_s(url, n, ENTITIES, Path(folder), "slow_call_async") for n in ASYNC_LANES
        }
        widest = max(LANES)
        lean = {
            kind: lean_lanes.steps_per_s(url, widest, ENTITIES, awaited=kind == "async")
            for kind in ("threads", "async")
        }
    best = max(figures, key=lambda n: figures[n])
    how = f"{ENTITIES:,} entities x {STEPS} steps, 50 ms external handler"
    spent = "the consumer process and its PostgreSQL backends, first call to last"
    results = []
    for n, v in figures.items():
        results += _lane_figures(
            (
                f"steps_external_lanes_{n}_per_s",
                f"steps_external_lanes_{n}_vs_ideal",
                f"steps_external_cpu_ms_per_step.lanes_{n}",
            ),
            n,
            (v, cpu_ms[n]),
            how if n > 1 else f"{ONE_LANE_ENTITIES} entities x {STEPS} steps, same handler",
            spent,
        )
    results += _lane_figures(
        (
            f"steps_external_lanes_{widest}_on_demand_per_s",
            f"steps_external_lanes_{widest}_on_demand_vs_ideal",
            f"steps_external_cpu_ms_per_step.lanes_{widest}_on_demand",
        ),
        widest,
        on_demand,
        f"{widest} lanes connecting as they are first needed (keep_lanes_open off)",
        spent,
    )
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
    mine = {"threads": figures[widest], "async": awaited.get(widest, (0.0, 0.0))[0]}
    for kind, (rate, cpu) in lean.items():
        results += _lane_figures(
            (
                f"steps_external_lean_{kind}_{widest}_per_s",
                f"steps_external_lean_{kind}_{widest}_vs_ideal",
                f"steps_external_lean_{kind}_cpu_ms_per_step",
            ),
            widest,
            (rate, cpu),
            f"{widest} leanest lanes ({kind}): the same calls and rows, no consumer",
            "the lanes' process and its PostgreSQL backends",
        )
        if mine[kind]:
            results.append(
                BenchResult(
                    f"steps_external_{kind}_{widest}_vs_lean",
                    mine[kind] / rate,
                    "x",
                    f"the consumer's {widest} lanes against the leanest, same run",
                )
            )
    for n, measured in awaited.items():
        results += _lane_figures(
            (
                f"steps_external_async_lanes_{n}_per_s",
                f"steps_external_async_lanes_{n}_vs_ideal",
                f"steps_external_async_cpu_ms_per_step.lanes_{n}",
            ),
            n,
            measured,
            f"{ENTITIES:,} entities x {STEPS} steps, async def handler awaiting 50 ms",
            spent,
        )
    return results


def _lane_figures(
    names: tuple[str, str, str], lanes: int, measured: tuple[float, float], how: str, spent: str
) -> list[BenchResult]:
    """One lane setting's steps/s, its share of the ideal (lanes x 20 calls/s) and its CPU
    milliseconds a step (``spent``: whose), under ``names`` in that order."""
    rate, cpu = measured
    return [
        BenchResult(names[0], rate, "steps/s", how),
        BenchResult(names[1], rate / (lanes / 0.05), "x", "of lanes x 20 calls/s"),
        BenchResult(names[2], cpu, "ms", spent),
    ]
