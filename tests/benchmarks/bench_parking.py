"""What durable parks cost: parked events per second with each Redis fsync policy.

A private Redis (AOF on) is run with ``appendfsync everysec`` (the default: a machine crash
may lose its last second of parks, which the sweeper repairs from the outbox) and with
``appendfsync always`` (what ``INORDER_PARK_FSYNC=always`` requires: nothing parked is
lost). Where the server has WAITAOF (Redis 7.2 and later), waiting for each batch's
append is measured too; otherwise the report says so. Two shapes, as the consumer parks:
one event per call (a quiet topic) and 100 per call (a backlog). The policies alternate
over rounds and each figure is the best round, so they are compared within one run.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

from consumer.kinds.steps.parking import ParkingLot
from schemas import encode
from tests.benchmarks.result import BenchResult
from tests.benchmarks.scale import sized
from tests.integration.step_support import step
from tests.support.redis_server import private_redis

ROUNDS = sized(3, 1)
SINGLE_PARKS = sized(400, 40)
BATCHES = sized(40, 4)
BATCH = 100
RAW = encode(step(2))


def _waitaof_supported(client: redis.Redis) -> tuple[bool, str]:
    version = str(client.info("server")["redis_version"])
    major, minor = (int(part) for part in version.split(".")[:2])
    return (major, minor) >= (7, 2), version


def _rate(lot: ParkingLot, batch: int, calls: int, after: Callable[[], None]) -> float:
    """Parked events per second over ``calls`` park calls of ``batch`` events each."""
    seq = 0
    started = time.perf_counter()
    for call in range(calls):
        items = []
        for _ in range(batch):
            seq += 1
            items.append((f"e{call % 50}", seq, RAW + str(seq).encode()))
        lot.park("bench", items, (1_000_000, 2**40), 3600)
        after()
    return batch * calls / (time.perf_counter() - started)


def run() -> list[BenchResult]:
    """Parked events/s per fsync policy, one at a time and 100 at a time."""
    with tempfile.TemporaryDirectory() as tmp, private_redis(Path(tmp)) as server:
        client = redis.Redis.from_url(server.url)
        lot = ParkingLot(client, "bench")
        waitaof, version = _waitaof_supported(client)
        policies: dict[str, tuple[str, Callable[[], None]]] = {
            "everysec": ("everysec", lambda: None),
            "always": ("always", lambda: None),
        }
        if waitaof:
            policies["waitaof"] = (
                "everysec",
                lambda: client.execute_command("WAITAOF", 1, 0, 1000),
            )
        best: dict[tuple[str, int], float] = {}
        for _ in range(ROUNDS):
            for name, (fsync, after) in policies.items():
                client.config_set("appendfsync", fsync)
                client.flushall()
                for batch, calls in ((1, SINGLE_PARKS), (BATCH, BATCHES)):
                    rate = _rate(lot, batch, calls, after)
                    best[(name, batch)] = max(best.get((name, batch), 0.0), rate)
        client.close()
    how = f"private Redis {version}, AOF on; best of {ROUNDS} alternating rounds"
    results = []
    for (name, batch), rate in best.items():
        shape = "one event per call" if batch == 1 else f"{batch} events per call"
        results.append(
            BenchResult(f"park_{name}_batch{batch}_per_s", rate, "events/s", f"{shape}; {how}")
        )
    for batch in (1, BATCH):
        results.append(
            BenchResult(
                f"park_always_vs_everysec_batch{batch}",
                best[("always", batch)] / best[("everysec", batch)],
                "ratio",
                "parked events/s with appendfsync always over everysec, same run",
            )
        )
    if not waitaof:
        print(f"park_waitaof: not measured, WAITAOF needs Redis 7.2 or later (this is {version})")
    return results
