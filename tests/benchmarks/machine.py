"""How busy the machine was while a suite ran, and how much CPU its hypervisor took.

Figures here move with everything else on the machine. On a virtual machine, CPU time
taken by the hypervisor for other guests (``steal`` in ``/proc/stat``) shows up as
longer waits everywhere, and latency tails most of all; each suite's share is written
next to its figures, so a slow run can be told from a slow change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.benchmarks.result import BenchResult

STAT = Path("/proc/stat")


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """The machine's CPU time so far (all CPUs, in clock ticks): busy, idle, stolen."""

    busy: int
    idle: int
    steal: int

    @classmethod
    def now(cls) -> CpuTimes:
        """Read the totals from ``/proc/stat`` (all zero where there is none)."""
        try:
            first = STAT.read_text().splitlines()[0].split()
        except OSError:
            return cls(0, 0, 0)
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, first[1:9])
        return cls(user + nice + system + irq + softirq, idle + iowait, steal)


def during(suite: str, before: CpuTimes, after: CpuTimes) -> list[BenchResult]:
    """The machine's busy and stolen shares of its CPU time between two readings."""
    busy, idle, steal = (
        after.busy - before.busy,
        after.idle - before.idle,
        after.steal - before.steal,
    )
    total = busy + idle + steal
    if total <= 0:
        return []
    return [
        BenchResult(
            f"machine.{suite}.busy_pct", 100 * busy / total, "%", "all processes, all CPUs"
        ),
        BenchResult(
            f"machine.{suite}.steal_pct", 100 * steal / total, "%", "CPU time the hypervisor took"
        ),
    ]
