"""The nemesis: a seeded random schedule of faults over a pipeline whose every link can fail.

Every relay, consumer and sweeper talks to PostgreSQL and Redis through proxies of its
own and runs on a clock of its own (libfaketime reading an offset file), so any fault
can strike one program's link or clock while the others carry on. A round writes a
fresh load, strikes with one fault while it runs, heals it, waits for the pipeline to
settle and judges it as the fault suite does; the report has one row per fault kind.

Consumers and sweepers start on clocks of their own, some days behind the machine's,
and a clock jump moves one of them, ahead or back: consumers by days (a consumer
produces only letters, which this load never makes), sweepers back by days or ahead
by less than an hour. Since Kafka 4.0 a broker refuses records stamped more
than an hour ahead (``log.message.timestamp.after.max.ms``), so a program that produces
and whose clock runs further ahead can only wait as for an outage; relays keep the
machine's clock.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults import clock, firewall
from tests.faults.pipeline import Pipeline
from tests.faults.proxy import FaultProxy

PROCESSES = ("relay-1", "relay-2", "consumer-1", "consumer-2", "sweeper-1", "sweeper-2")
# The clock each process starts on: two behind the machine's, two at it, the relays' own.
CLOCKS = {
    "consumer-1": "-3d",
    "consumer-2": "+0",
    "sweeper-1": "-2d",
    "sweeper-2": "+0",
}
# Where a jump may move a clock: consumers by days either way, sweepers back by days or
# ahead by less than an hour (a broker refuses records stamped further ahead).
JUMPS = {"consumer": ("-3d", "+0", "+7d", "+30d"), "sweeper": ("-2d", "+0", "+50m")}
# How long each kind of process must freeze to be replaced (session, slice lease, lease).
REPLACED_AFTER_S = {"relay": 3, "consumer": 6, "sweeper": 3}
KINDS = (
    "kill -9",
    "paused past its timeout",
    "postgres link cut",
    "redis link blackholed",
    "links slow",
    "links lossy",
    "clock jump",
)


@dataclass
class Tally:
    """One fault kind's row of the report."""

    kind: str
    injected: int = 0
    lost: int = 0
    applied_twice: int = 0
    totals_off: int = 0
    unexplained: int = 0
    crashed: int = 0
    recovery_s: list[float] = field(default_factory=list)


@dataclass
class Links:
    """One process's proxies and clock file."""

    postgres: FaultProxy
    redis: FaultProxy
    clock: Path


class Nemesis:
    """The pipeline's processes behind proxies, and the faults it can strike them with."""

    def __init__(self, pipeline: Pipeline, folder: Path, seed: int) -> None:
        self.pipeline = pipeline
        self.rng = random.Random(seed)  # the schedule, replayable by its seed
        self.links: dict[str, Links] = {}
        self.clocks = dict(CLOCKS)
        self.can_drop = firewall.available()
        for i, name in enumerate(PROCESSES):
            self.links[name] = Links(
                FaultProxy(pipeline.db.url, seed=seed + i),
                FaultProxy(pipeline.env["REDIS_URL"], seed=seed + 100 + i),
                folder / f"{name}.faketime",
            )

    def env(self, name: str) -> dict[str, str]:
        """The settings that put ``name`` behind its proxies and on its own clock."""
        links = self.links[name]
        own = {
            "DATABASE_URL": links.postgres.address(self.pipeline.db.url),
            "REDIS_URL": links.redis.address(self.pipeline.env["REDIS_URL"]),
        }
        if not name.startswith("relay"):
            own |= clock.clock_env(links.clock, self.pipeline.env["PYTHONPATH"], self.clocks[name])
        return own

    def start(self) -> None:
        """Every process, each behind its own links."""
        for name in PROCESSES:
            self.pipeline.start(name, env=self.env(name))

    def close(self) -> None:
        """Heal and close every proxy; remove every firewall rule."""
        for links in self.links.values():
            links.postgres.close()
            links.redis.close()
        if self.can_drop:
            firewall.clear()

    # ------------------------------------------------------------ faults

    def kinds(self) -> list[str]:
        """The kinds this machine can strike with."""
        unable = set()
        if not self.can_drop:
            unable |= {"postgres link cut", "links lossy"}
        return [k for k in KINDS if k not in unable]

    @contextlib.contextmanager
    def strike(self, kind: str) -> Iterator[str]:
        """Strike with ``kind`` while inside, on a process the schedule picks; heal on leaving.

        Yields what was done, for the log. Healing runs whatever happened inside.
        """
        name = self.rng.choice(PROCESSES)
        links, hold = self.links[name], self.rng.uniform(4, 12)
        heal: Callable[[], None] = lambda: None  # noqa: E731
        if kind == "kill -9":
            self.pipeline.restart(name)
            did = f"kill -9 {name}"
        elif kind == "paused past its timeout":
            self.pipeline.pause(name)
            hold = REPLACED_AFTER_S[name.split("-")[0]] + self.rng.uniform(1, 5)
            heal, did = (lambda: self.pipeline.resume(name)), f"SIGSTOP {name} {hold:.1f}s"
        elif kind == "postgres link cut":
            hold = self.rng.uniform(10, 40)  # past the 20 s a cut takes to be noticed, or not
            dropping = firewall.dropping(links.postgres.port)
            dropping.__enter__()
            heal = lambda: dropping.__exit__(None, None, None)  # noqa: E731
            did = f"{name} cut from postgres {hold:.1f}s"
        elif kind == "redis link blackholed":
            name = self.rng.choice([n for n in PROCESSES if not n.startswith("relay")])
            links = self.links[name]  # relays have no Redis
            links.redis.blackhole()
            heal, did = links.redis.heal, f"{name} blackholed from redis {hold:.1f}s"
        elif kind == "links slow":
            for each in self.links.values():
                each.postgres.slow(0.02, 0.04)
                each.redis.slow(0.01, 0.02)
            heal, did = self._heal_all, f"every link slowed {hold:.1f}s"
        elif kind == "links lossy":
            lossy = contextlib.ExitStack()
            lossy.enter_context(firewall.dropping(links.postgres.port, 0.15))
            lossy.enter_context(firewall.dropping(links.redis.port, 0.15))
            heal, did = lossy.close, f"{name} links losing 15% {hold:.1f}s"
        elif kind == "clock jump":
            name = self.rng.choice([n for n in PROCESSES if not n.startswith("relay")])
            jumps = JUMPS[name.split("-")[0]]
            jump = self.rng.choice([j for j in jumps if j != self.clocks[name]])
            clock.jump(self.links[name].clock, jump)
            did = f"{name} clock jumped from {self.clocks[name]} to {jump}"
            self.clocks[name] = jump
        else:
            raise ValueError(kind)
        try:
            yield did
            if kind not in ("kill -9", "clock jump"):
                time.sleep(hold)
        finally:
            heal()

    def _heal_all(self) -> None:
        for links in self.links.values():
            links.postgres.heal()
            links.redis.heal()
