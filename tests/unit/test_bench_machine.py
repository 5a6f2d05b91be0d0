"""The machine figures written next to each benchmark suite's."""

from __future__ import annotations

import time

import pytest

from tests.benchmarks import machine
from tests.benchmarks.machine import CpuTimes, during


def test_shares_are_of_all_cpu_time_between_two_readings() -> None:
    """Busy and stolen time are reported as percentages of everything that passed."""
    figures = {
        r.name: r.value for r in during("relay", CpuTimes(100, 50, 0), CpuTimes(160, 80, 10))
    }
    assert figures == {"machine.relay.busy_pct": 60.0, "machine.relay.steal_pct": 10.0}


def test_no_time_passed_gives_no_figures() -> None:
    """Readings that did not move (no /proc/stat) report nothing rather than dividing by zero."""
    assert during("codec", CpuTimes(0, 0, 0), CpuTimes(0, 0, 0)) == []


def test_the_live_reading_only_grows() -> None:
    """Two readings of this machine's /proc/stat a moment apart never go backwards."""
    first = CpuTimes.now()
    sum(range(100_000))
    second = CpuTimes.now()
    assert second.busy >= first.busy > 0
    assert second.idle >= first.idle
    assert second.steal >= first.steal


def test_the_sampler_leaves_its_own_cpu_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU the sampling thread spends is not counted as the measured program's."""

    def spinning(url: str, app: str) -> set[int]:
        started = time.thread_time()
        while time.thread_time() - started < 0.05:  # a sample that costs 50 ms of CPU
            pass
        return set()

    monkeypatch.setattr(machine, "backends", spinning)
    with machine.SessionsCpu("postgresql://unused", "nobody%") as cpu:
        start = time.monotonic()
        time.sleep(1.1)  # this thread idle: about five samples taken meanwhile
        end = time.monotonic()
    assert len(cpu.samples) >= 4
    assert cpu.between(start, end) < 0.05
