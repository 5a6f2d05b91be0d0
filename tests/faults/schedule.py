"""The nemesis: a seeded random schedule of faults over a pipeline whose every link can fail.

Every relay, consumer and sweeper talks to PostgreSQL and Redis through proxies of its
own, and consumers and sweepers run on clocks of their own (``tests.faults.clock``), so
any fault can strike one program's link or clock while the others carry on. The second
relay, consumer and sweeper reach Kafka through the proxy in front of the broker's
FAULTY listener: a Kafka fault strikes the three of them, as a second machine's link.
A round writes a fresh load, strikes with one fault while it runs, heals it, waits for
the pipeline to settle and judges it as the fault suite does; the report has one row
per fault kind.

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
from tests.faults.proxy import FaultProxy, kafka_faulty

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
    "kafka link cut",
    "kafka link slow",
)
# The processes that reach Kafka through the FAULTY listener's proxy (a second machine's
# link to the broker), when the stack has one.
ON_FAULTY_KAFKA = ("relay-2", "consumer-2", "sweeper-2")


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
        faulty = kafka_faulty() if self.can_drop else None
        self.kafka = None if faulty is None else FaultProxy(faulty[0], port=faulty[1], seed=seed)
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
        if self.kafka is not None and name in ON_FAULTY_KAFKA:
            own["KAFKA_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{self.kafka.port}"
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
        if self.kafka is not None:
            self.kafka.close()
        if self.can_drop:
            firewall.clear()

    # ------------------------------------------------------------ faults

    def kinds(self) -> list[str]:
        """Every kind, each of which this machine can strike with; AssertionError naming the
        ones it cannot and why (a schedule that silently left them out would pass)."""
        unable = []
        if not self.can_drop:
            unable.append("postgres link cut and links lossy: iptables is missing or refused")
        if self.kafka is None:
            unable.append(
                "kafka link cut and kafka link slow: "
                + ("the broker has no FAULTY listener" if self.can_drop else "no iptables")
            )
        assert not unable, "the nemesis cannot strike with " + "; ".join(unable)
        return list(KINDS)

    @contextlib.contextmanager
    def strike(self, kind: str) -> Iterator[str]:
        """Strike with ``kind`` while inside, on a process the schedule picks; heal on leaving.

        Yields what was done, for the log; the fault is held a while after the body, and
        healed whatever happened inside.
        """
        faults: dict[str, Callable[[contextlib.ExitStack], tuple[str, float]]] = {
            "kill -9": self._kill,
            "paused past its timeout": self._pause,
            "postgres link cut": self._cut_postgres,
            "redis link blackholed": self._blackhole_redis,
            "links slow": self._slow,
            "links lossy": self._lossy,
            "clock jump": self._jump_clock,
            "kafka link cut": self._cut_kafka,
            "kafka link slow": self._slow_kafka,
        }
        with contextlib.ExitStack() as healing:
            did, hold = faults[kind](healing)
            yield did
            time.sleep(hold)

    def _pick(self, *, with_redis: bool = False) -> str:
        """A process the fault strikes (relays have no Redis link and no clock of their own)."""
        names = [n for n in PROCESSES if not (with_redis and n.startswith("relay"))]
        return self.rng.choice(names)

    def _hold(self) -> float:
        return self.rng.uniform(4, 12)

    def _kill(self, _healing: contextlib.ExitStack) -> tuple[str, float]:
        name = self._pick()
        self.pipeline.restart(name)
        return f"kill -9 {name}", 0.0

    def _pause(self, healing: contextlib.ExitStack) -> tuple[str, float]:
        name = self._pick()
        hold = REPLACED_AFTER_S[name.split("-")[0]] + self.rng.uniform(1, 5)
        self.pipeline.pause(name)
        healing.callback(self.pipeline.resume, name)
        return f"SIGSTOP {name} {hold:.1f}s", hold

    def _cut_postgres(self, healing: contextlib.ExitStack) -> tuple[str, float]:
        name = self._pick()
        hold = self.rng.uniform(10, 40)  # past the 20 s a cut takes to be noticed, or not
        healing.enter_context(firewall.dropping(self.links[name].postgres.port))
        return f"{name} cut from postgres {hold:.1f}s", hold

    def _blackhole_redis(self, healing: contextlib.ExitStack) -> tuple[str, float]:
        name, hold = self._pick(with_redis=True), self._hold()
        proxy = self.links[name].redis
        proxy.blackhole()
        healing.callback(proxy.heal)
        return f"{name} blackholed from redis {hold:.1f}s", hold

    def _slow(self, healing: contextlib.ExitStack) -> tuple[str, float]:
        hold = self._hold()
        for links in self.links.values():
            links.postgres.slow(0.02, 0.04)
            links.redis.slow(0.01, 0.02)
        healing.callback(self._heal_all)
        return f"every link slowed {hold:.1f}s", hold

    def _lossy(self, healing: contextlib.ExitStack) -> tuple[str, float]:
        name, hold = self._pick(), self._hold()
        healing.enter_context(firewall.dropping(self.links[name].postgres.port, 0.15))
        healing.enter_context(firewall.dropping(self.links[name].redis.port, 0.15))
        return f"{name} links losing 15% {hold:.1f}s", hold

    def _jump_clock(self, _healing: contextlib.ExitStack) -> tuple[str, float]:
        name = self._pick(with_redis=True)
        jumps = JUMPS[name.split("-")[0]]
        jump = self.rng.choice([j for j in jumps if j != self.clocks[name]])
        clock.jump(self.links[name].clock, jump)
        did = f"{name} clock jumped from {self.clocks[name]} to {jump}"
        self.clocks[name] = jump
        return did, 0.0

    def _cut_kafka(self, healing: contextlib.ExitStack) -> tuple[str, float]:
        assert self.kafka is not None
        hold = self.rng.uniform(4, 20)  # within or past the consumers' 6 s session
        healing.enter_context(firewall.dropping(self.kafka.port))
        return f"{', '.join(ON_FAULTY_KAFKA)} cut from kafka {hold:.1f}s", hold

    def _slow_kafka(self, healing: contextlib.ExitStack) -> tuple[str, float]:
        assert self.kafka is not None
        hold = self._hold()
        self.kafka.slow(0.05, 0.1)
        healing.callback(self.kafka.heal)
        return f"{', '.join(ON_FAULTY_KAFKA)} slowed to kafka {hold:.1f}s", hold

    def _heal_all(self) -> None:
        for links in self.links.values():
            links.postgres.heal()
            links.redis.heal()
