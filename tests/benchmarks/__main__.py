"""Run benchmarks, merge their figures into bench-results.json and print them as a table.

``python -m tests.benchmarks`` runs all; ``python -m tests.benchmarks codec emit`` runs some.
Figures are compared side by side within one run; the machine is shared and noisy.
"""

from __future__ import annotations

import importlib
import os
import platform
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from tests.benchmarks.baseline import checked_out
from tests.benchmarks.machine import CpuTimes, during
from tests.benchmarks.result import BenchResult, median_figures, medians
from tests.benchmarks.scale import SHORT, SUITE_LIMIT_S

ROOT = Path(__file__).resolve().parents[2]
# A short run's figures are not judged: they go to a file of their own.
OUTPUT = ROOT / ("bench-results.short.json" if SHORT else "bench-results.json")
SUITES = (
    "stack",
    "codec",
    "emit",
    "relay",
    "consumer",
    "steps",
    "steps_external",
    "batches",
    "sweeper",
    "parking",
    "e2e",
    "latency",
    "scaleout",
    "share",
    "tracing",
    "debezium",
)


def _machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "system": platform.platform(),
    }


def _merge(results: list[BenchResult], before: dict[str, float], commit: str) -> dict[str, object]:
    existing = orjson.loads(OUTPUT.read_bytes()) if OUTPUT.exists() else {}
    figures = dict(existing.get("results", {}))
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    for result in results:
        figures[result.name] = {**asdict(result), "measured_at": stamp}
        if result.name in before:
            figures[result.name] |= {"baseline": before[result.name], "baseline_commit": commit}
    return {"machine": _machine(), "results": dict(sorted(figures.items()))}


def _figure(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:,.3g}"


def _table(results: list[BenchResult], before: dict[str, float], commit: str) -> Table:
    table = Table(title="inorder benchmarks" + (f" (baseline {commit})" if commit else ""))
    columns = ("benchmark", "value", *(("baseline", "ratio") if commit else ()), "unit", "how")
    for column in columns:
        table.add_column(column, justify="right" if column in columns[1:-2] else "left")
    for r in results:
        then = before.get(r.name)
        compared = (
            (_figure(then), f"{r.value / then:.2f}" if then else "-")
            if then is not None
            else ("-", "-")
        )
        table.add_row(r.name, _figure(r.value), *(compared if commit else ()), r.unit, r.note)
    return table


@contextmanager
def limited(suite: str, seconds: int) -> Iterator[None]:
    """Fail the run, naming the suite, when it runs past ``seconds`` (a wait that never ends)."""

    def expired(_signum: int, _frame: object) -> None:
        raise TimeoutError(f"benchmark suite {suite} ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def main(argv: list[str]) -> None:
    """Run the named suites (all by default) and report."""
    chosen = argv or list(SUITES)
    unknown = set(chosen) - set(SUITES)
    if unknown:
        raise SystemExit(f"unknown benchmark suite(s) {sorted(unknown)}; choose from {SUITES}")
    results: list[BenchResult] = []
    then: dict[str, float] = {}
    with checked_out() as baseline:
        commit = baseline.commit if baseline else ""
        for suite in chosen:
            module = importlib.import_module(f"tests.benchmarks.bench_{suite}")
            # A suite whose figures sit near its baseline's asks for rounds: the
            # baseline's and its own alternate, and each side reports its medians.
            theirs: list[dict[str, float]] = []
            ours: list[list[BenchResult]] = []
            for _ in range(getattr(module, "ROUNDS", 1)):
                if baseline is not None:  # just before, so both are measured minutes apart
                    theirs.append(baseline.run(suite))
                before = CpuTimes.now()
                with limited(suite, SUITE_LIMIT_S):
                    measured = module.run()
                ours.append([*measured, *during(suite, before, CpuTimes.now())])
            then |= median_figures(theirs)
            results.extend(medians(ours))
    OUTPUT.write_bytes(orjson.dumps(_merge(results, then, commit), option=orjson.OPT_INDENT_2))
    Console(width=160).print(_table(results, then, commit))
    print(f"written to {OUTPUT}")


if __name__ == "__main__":
    main(sys.argv[1:])
