"""How busy the machine was while a suite ran, and how much CPU its hypervisor took.

Figures here move with everything else on the machine. On a virtual machine, CPU time
taken by the hypervisor for other guests (``steal`` in ``/proc/stat``) shows up as
longer waits everywhere, and latency tails most of all; each suite's share is written
next to its figures, so a slow run can be told from a slow change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.benchmarks.result import BenchResult

STAT = Path("/proc/stat")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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


def cpu_s(pids: set[int]) -> float:
    """CPU seconds used so far by these processes (user + system), from /proc."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


def backends(url: str, app: str) -> set[int]:
    """The PostgreSQL backends of the sessions named ``app`` (a LIKE pattern)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s", (app,)
        ).fetchall()
    return {row[0] for row in rows}
