"""stack_up_s: how long the local stack takes to come up cold, warm, and when already up.

Runs a second stack in a temporary state folder on other ports, so the one the
tests use is left alone. Cold includes initdb and Kafka storage format; the Kafka
jars come from the cache (the first ever run also downloads them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

from tests.benchmarks.result import BenchResult
from tests.support.services import STACK_SCRIPT

PORTS = {
    "INORDER_PG_PORT": "55532",
    "INORDER_REDIS_PORT": "56479",
    "INORDER_KAFKA_PORT": "59192",
    "INORDER_KAFKA_CONTROLLER_PORT": "59193",
}


def _timed(command: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([str(STACK_SCRIPT), command], env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def run() -> list[BenchResult]:
    """Measure cold, warm and no-op ``stack up`` on a throw-away stack."""
    state = tempfile.mkdtemp(prefix="inorder-bench-stack-")
    # The main stack's settings stay out (its ports, the faulty listener's among them):
    # the throw-away stack takes only the ports named here and its defaults beside them.
    own = {k: v for k, v in os.environ.items() if not k.startswith("INORDER_")}
    env = {**own, **PORTS, "INORDER_STACK_DIR": state}
    try:
        cold = _timed("up", env)
        noop = _timed("up", env)
        _timed("down", env)
        warm = _timed("up", env)
    finally:
        subprocess.run([str(STACK_SCRIPT), "down"], env=env, check=False, capture_output=True)
        shutil.rmtree(state, ignore_errors=True)
    note = "deploy/local/stack up: PostgreSQL, Redis, Kafka answering"
    return [
        BenchResult("stack_up_s.cold", cold, "s", f"{note}; fresh state folder"),
        BenchResult("stack_up_s.warm", warm, "s", f"{note}; after down"),
        BenchResult("stack_up_s.noop", noop, "s", "up while already up"),
    ]
