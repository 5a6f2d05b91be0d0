"""Fixtures of the fault suite: its scale, a pipeline per test, and the report table.

``INORDER_FAULTS=full`` (``make test-faults``) runs every fault more often under a
longer load; without it the short version runs (part of ``make test``). Each
fault test adds one row to the report, printed at the end of the run and written
to ``fault-report.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest

from tests.conftest import PgSchema, TopicFactory
from tests.faults.pipeline import Pipeline
from tests.faults.verdict import Verdict
from tests.support.report import write_table
from tests.support.services import ROOT, Services

if TYPE_CHECKING:
    from tests.faults.schedule import Tally

REPORT_FILE = ROOT / "fault-report.json"


@dataclass(frozen=True)
class Scale:
    """How hard a run pushes."""

    name: str
    entities: int
    ops_per_entity: int
    rate: float  # operations per second
    consumer_kills: int
    outage_s: float
    fuzz_messages: int
    boundary_inputs: int  # per boundary with a running process (events, rows, protocol)
    routes_files: int


SHORT = Scale(
    "short",
    entities=30,
    ops_per_entity=20,
    rate=120,
    consumer_kills=3,
    outage_s=4,
    fuzz_messages=10_000,
    boundary_inputs=1_000,
    routes_files=8,
)
FULL = Scale(
    "full",
    entities=200,
    ops_per_entity=30,
    rate=200,
    consumer_kills=12,
    outage_s=15,
    fuzz_messages=30_000,
    boundary_inputs=12_500,
    routes_files=100,
)


@dataclass(frozen=True)
class Row:
    """One line of the fault report."""

    fault: str
    injected: int
    produced: int
    lost: int
    applied_twice: int
    totals_off: int
    unexplained: int
    crashed: int
    seconds: float


ROWS: list[Row] = []


@dataclass
class Boundary:
    """One line of the boundary fuzzer's table."""

    name: str
    tried: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # by reason
    taken: int = 0
    redelivered: int = 0  # handled twice after a rewind (at least once, never lost)
    # Inputs by the outcome the oracle expected, and how many of them got it.
    expected: dict[str, int] = field(default_factory=dict)
    as_expected: dict[str, int] = field(default_factory=dict)
    unaccounted: int = 0  # an outcome the oracle did not expect, or none at all
    examples: list[str] = field(default_factory=list)  # a few of those, said plainly
    exits: int = 0
    stalls: int = 0
    probe_p99_s: float = 0.0
    seconds: float = 0.0


BOUNDARIES: list[Boundary] = []
# Figures a fault test measured beside its row (how soon a cut link was noticed).
NOTES: list[str] = []
# The nemesis schedule's seed, its tallies by fault kind and what each round did.
NEMESIS: dict[str, object] = {}
NEMESIS_FILE = ROOT / "nemesis-report.json"
# The fuzz test's counts: sent, dead-lettered by reason, applied, crashes.
FUZZ: dict[str, object] = {}


@pytest.fixture(scope="session")
def scale() -> Scale:
    """The short scale unless INORDER_FAULTS=full."""
    return FULL if os.environ.get("INORDER_FAULTS") == "full" else SHORT


@pytest.fixture
def pipeline(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> Iterator[Pipeline]:
    """A pipeline of this test's own; every process it started is stopped afterwards."""
    made = Pipeline(pg_schema, services, topic_factory, tmp_path)
    yield made
    made.close()


def report(fault: str, injected: int, verdict: Verdict, seconds: float) -> None:
    """Add one row to the report."""
    ROWS.append(
        Row(
            fault,
            injected,
            verdict.produced,
            verdict.lost,
            verdict.applied_twice,
            verdict.totals_off,
            verdict.unexplained,
            len(verdict.crashed),
            round(seconds, 1),
        )
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the fault report as a table and write it to fault-report.json."""
    if NEMESIS:
        _nemesis_table(terminalreporter)
    if FUZZ:
        terminalreporter.section("fuzz report")
        for key, value in FUZZ.items():
            terminalreporter.write_line(f"{key:<14} {value}")
    if not ROWS and not FUZZ and not BOUNDARIES:
        return
    REPORT_FILE.write_text(
        json.dumps(
            {
                "faults": [asdict(r) for r in ROWS],
                "fuzz": FUZZ,
                "boundaries": [asdict(b) for b in BOUNDARIES],
            },
            indent=2,
        )
        + "\n"
    )
    if BOUNDARIES:
        _boundary_table(terminalreporter)
    if not ROWS:
        return
    headers = (
        "fault",
        "injected",
        "produced",
        "lost",
        "applied twice",
        "totals off",
        "unexplained",
        "crashed",
        "seconds",
    )
    write_table(terminalreporter, "fault report", headers, [list(asdict(r).values()) for r in ROWS])
    for note in NOTES:
        terminalreporter.write_line(note)
    terminalreporter.write_line(f"written to {REPORT_FILE.name}")


def _boundary_table(terminalreporter: pytest.TerminalReporter) -> None:
    headers = (
        "boundary",
        "tried",
        "refused",
        "taken",
        "again",
        "unaccounted",
        "exits",
        "stalls",
        "probe p99 s",
        "seconds",
    )
    rows = [
        [
            b.name,
            b.tried,
            sum(b.refused.values()),
            b.taken,
            b.redelivered,
            b.unaccounted,
            b.exits,
            b.stalls,
            b.probe_p99_s,
            b.seconds,
        ]
        for b in BOUNDARIES
    ]
    write_table(terminalreporter, "boundary fuzz", headers, rows)
    for b in BOUNDARIES:
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(b.refused.items(), key=lambda x: -x[1]))
        terminalreporter.write_line(f"{b.name} refused: {reasons or 'none'}")
    for b in (b for b in BOUNDARIES if b.expected):
        rows = [[label, n, b.as_expected.get(label, 0)] for label, n in sorted(b.expected.items())]
        write_table(
            terminalreporter,
            f"{b.name}: expected outcomes",
            ("expected", "inputs", "as expected"),
            rows,
        )
        for example in b.examples:
            terminalreporter.write_line(f"  unaccounted: {example}")


def _nemesis_table(terminalreporter: pytest.TerminalReporter) -> None:
    """The schedule's rows, its seed and its rounds; written to nemesis-report.json."""
    tallies = cast("dict[str, Tally]", NEMESIS["tallies"])
    headers = (
        "fault",
        "injected",
        "lost",
        "applied twice",
        "totals off",
        "unexplained",
        "crashed",
        "recovery s (max)",
    )
    rows = [
        [
            t.kind,
            t.injected,
            t.lost,
            t.applied_twice,
            t.totals_off,
            t.unexplained,
            t.crashed,
            round(max(t.recovery_s, default=0.0), 1),
        ]
        for t in tallies.values()
    ]
    write_table(terminalreporter, f"nemesis schedule, seed {NEMESIS['seed']}", headers, rows)
    for line in cast("list[str]", NEMESIS["log"]):
        terminalreporter.write_line(line)
    NEMESIS_FILE.write_text(
        json.dumps(
            {
                "seed": NEMESIS["seed"],
                "faults": [asdict(t) for t in tallies.values()],
                "rounds": NEMESIS["log"],
            },
            indent=2,
        )
        + "\n"
    )
    terminalreporter.write_line(
        f"written to {NEMESIS_FILE.name}; replay with INORDER_NEMESIS_SEED={NEMESIS['seed']}"
    )
