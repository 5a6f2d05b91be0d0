"""How busy the machine was while a suite ran, and how much CPU its hypervisor took.

Figures here move with everything else on the machine. On a virtual machine, CPU time
taken by the hypervisor for other guests (``steal`` in ``/proc/stat``) shows up as
longer waits everywhere, and latency tails most of all; each suite's share is written
next to its figures, so a slow run can be told from a slow change.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

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


class SessionsCpu:
    """CPU seconds this process and its PostgreSQL sessions named ``app`` (a LIKE pattern)
    have used, sampled every 0.2 s while it runs; ``between`` reads a span of it.

    The sampler's own thread is left out: its queries and reads of ``/proc`` cost about
    0.05 to 0.08 ms of CPU a step measured at 128 lanes, a twentieth of the figure.
    """

    def __init__(self, url: str, app: str) -> None:
        self.url = url
        self.app = app
        self._seen: dict[int, float] = {}
        self._first: dict[int, float] = {}
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._own = 0.0  # the sampler thread's CPU seconds, as of its last sample
        self.samples: list[tuple[float, float]] = []  # (monotonic time, CPU seconds)

    def _read(self, *, sampler: bool = False) -> None:
        """One sample; ``sampler``: taken on the sampler's own thread, whose CPU it notes."""
        for pid in backends(self.url, self.app):
            self._seen[pid] = max(cpu_s({pid}), self._seen.get(pid, 0.0))
        theirs = sum(used - self._first.get(pid, 0.0) for pid, used in self._seen.items())
        if sampler:
            self._own = time.thread_time()
        self.samples.append((time.monotonic(), time.process_time() - self._own + theirs))

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self._read(sampler=True)

    def __enter__(self) -> SessionsCpu:
        for pid in backends(self.url, self.app):  # already there: counted from now
            self._first[pid] = self._seen[pid] = cpu_s({pid})
        self._read()
        self._sampler.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._sampler.join()
        self._read()  # up to the end, not the last sample before it

    def between(self, start: float, end: float) -> float:
        """CPU seconds used from ``start`` to ``end`` (monotonic), read between samples."""
        return self._at(end) - self._at(start)

    def _at(self, when: float) -> float:
        before = [s for s in self.samples if s[0] <= when] or self.samples[:1]
        after = [s for s in self.samples if s[0] >= when] or self.samples[-1:]
        (t0, c0), (t1, c1) = before[-1], after[0]
        return c0 if t1 <= t0 else c0 + (c1 - c0) * (when - t0) / (t1 - t0)
