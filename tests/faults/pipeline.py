"""The whole pipeline as real processes on one test's names: start, kill, load, settle, judge.

Relays, consumers and sweepers run as their console scripts against the local
stack, each logging to the test's folder and serving /metrics and /readyz on a
port of its own. The load generator writes at a steady rate from a thread. After
a fault, ``settle`` waits until every row is published, every gap closed, nothing
parked and no lag; ``verdict`` then counts lost and doubly applied events from the
effect log and runs ``inorder-admin audit`` as an operator would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import redis
from confluent_kafka import Consumer, KafkaException, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from consumer import examples, tables
from consumer.kinds.steps.parking import ParkingLot
from producer import loadgen, migrate
from producer import subscriptions as subs
from schemas.runtime.redis_client import connect as connect_redis
from tests.conftest import PgSchema, TopicFactory
from tests.faults import effects
from tests.faults.verdict import Verdict, judge
from tests.integration.relay_support import TEST_SCHEMAS, free_port
from tests.integration.sweeper_support import tool
from tests.support.services import ROOT, Services

COMMANDS = {
    "relay": ["inorder-relay"],
    "consumer": ["inorder-consumer"],
    "sweeper": ["inorder-sweeper"],
    # The example worker finishes batch items out of order, in a consumer group of its own.
    "worker": ["inorder-producer", "worker", "--max-delay-ms", "100"],
}
# The same programs of an earlier release, run from its source (``release``) by the
# entry points its pyproject names, on this machine's interpreter and libraries.
RELEASE_ENTRY_POINTS = {
    "relay": "outbox_relay.__main__:main",
    "consumer": "consumer.__main__:main",
    "sweeper": "consumer.__main__:sweeper_main",
    "producer": "producer.__main__:main",
}
STEP_STREAM = "seat_ledger"
RELEASES = Path(__file__).parent / "releases"


def unpack_release(version: str, into: Path) -> Path:
    """The source of an earlier release (its four packages), unpacked under ``into``."""
    with tarfile.open(RELEASES / f"inorder-{version}.tar.gz") as packed:
        packed.extractall(into, filter="data")
    return into / f"inorder-{version}"


def release_command(release: Path, kind: str, *arguments: str) -> list[str]:
    """The command line that runs ``kind`` of the release unpacked at ``release``."""
    module, function = RELEASE_ENTRY_POINTS[kind].split(":")
    code = f"import sys; from {module} import {function}; sys.exit({function}())"
    return [sys.executable, "-c", code, *arguments]


def release_env(env: dict[str, str], release: Path) -> dict[str, str]:
    """``env`` with the release's packages ahead of this checkout's (whose tests stay found)."""
    return {**env, "PYTHONPATH": f"{release}{os.pathsep}{ROOT}"}


class Load:
    """The load generator running in a thread; ``join`` returns its report."""

    def __init__(self, conninfo: str, plan: loadgen.LoadPlan, topic: str) -> None:
        self.written = 0
        self.report: loadgen.LoadReport | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._run, args=(conninfo, plan, topic), name="loadgen", daemon=True
        )
        self.thread.start()

    def _run(self, conninfo: str, plan: loadgen.LoadPlan, topic: str) -> None:
        try:
            self.report = loadgen.run(conninfo, plan, topic, self._advance)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by join()
            self.error = exc

    def _advance(self) -> None:
        self.written += 1

    def join(self, timeout: float = 300) -> loadgen.LoadReport:
        """Wait for the load to finish; re-raise what broke it."""
        self.thread.join(timeout)
        if self.error is not None:
            raise self.error
        assert self.report is not None, f"load still running after {timeout}s"
        return self.report


@dataclass
class Process:
    """One started process and how it ended."""

    kind: str
    popen: subprocess.Popen[bytes]
    port: int
    killed: bool = False
    env: dict[str, str] | None = None  # its own settings over the pipeline's
    paused: bool = False


def share_lag(bootstrap: str, group: str, topic: str) -> int:
    """Records of ``topic`` share group ``group`` has not acknowledged (Kafka's own tool).

    A partition the group holds no state for yet counts whole.
    """
    described = subprocess.run(
        [
            str(ROOT / "deploy/local/stack"),
            "kafka-tool",
            "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
            "--bootstrap-server",
            bootstrap,
            "--describe",
            "--group",
            group,
            "--offsets",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{group}-lag"})
    try:
        partitions = reader.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {
            p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        }
    finally:
        reader.close()
    lag = dict(ends)
    for line in described.stdout.splitlines():
        fields = line.split()
        if len(fields) == 5 and fields[1] == topic and fields[2].isdigit():
            lag[int(fields[2])] = (
                int(fields[4]) if fields[4].lstrip("-").isdigit() else ends[int(fields[2])]
            )
    if described.returncode != 0:
        raise KafkaException(f"share group lag not read: {described.stderr.strip()[-300:]}")
    return sum(max(0, n) for n in lag.values())


class Pipeline:
    """Relays, consumers and sweepers of one test, and what to do to them."""

    def __init__(
        self,
        db: PgSchema,
        services: Services,
        topic_factory: TopicFactory,
        logs: Path,
        *,
        routes: str = effects.ROUTES,
        release: Path | None = None,
        partitions: int = 6,
        **overrides: str,
    ) -> None:
        self.db = db
        self.services = services
        self.logs = logs
        self.prefix = f"fault{uuid.uuid4().hex[:8]}"
        self.events_topic = topic_factory("events", partitions=partitions)
        self.group = f"faults-{uuid.uuid4().hex[:8]}"
        routes_file = logs / "routes.toml"
        routes_file.write_text(routes)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("INORDER_")}
        self.env.update(
            PYTHONPATH=str(ROOT),
            DATABASE_URL=db.url,
            FAULT_OUTSIDE_URL=db.url,
            REDIS_URL=services.redis_url,
            KAFKA_BOOTSTRAP_SERVERS=services.kafka_bootstrap,
            INORDER_ROUTES_FILE=str(routes_file),
            INORDER_PAYLOAD_SCHEMAS=str(TEST_SCHEMAS),
            INORDER_TOPICS=json.dumps([self.events_topic]),
            INORDER_DEAD_LETTER_TOPIC=topic_factory("dlq"),
            INORDER_HELD_TOPIC=topic_factory("held"),
            INORDER_REPUBLISH_REQUESTS_TOPIC=topic_factory("requests"),
            INORDER_REPUBLISH_RESULTS_TOPIC=topic_factory("results"),
            INORDER_REDIS_KEY_PREFIX=self.prefix,
            INORDER_GROUP_ID=self.group,
            INORDER_SWEEPER_GROUP_ID=f"{self.group}-sweeper",
            INORDER_RELAY_GROUP_ID=f"{self.group}-relay",
            INORDER_CREATE_TOPICS="false",
            INORDER_GAP_DEADLINE_S="3",
            INORDER_REPUBLISH_BACKOFF_BASE_S="2",
            INORDER_REPUBLISH_COOLDOWN_S="1",
            INORDER_SWEEP_INTERVAL_S="0.5",
            INORDER_GAUGE_INTERVAL_S="1",
            INORDER_LEASE_TTL_S="3",
            # A killed consumer's partitions move on within seconds, not the default 45.
            INORDER_KAFKA_EXTRA='{"session.timeout.ms": "6000"}',
        )
        self.env.update(overrides)
        self.processes: dict[str, Process] = {}
        if release is not None:  # the release's own migrations make the outbox
            self.run_release(release, "producer", "migrate", "--example")
        with db.connect(autocommit=True) as conn:
            if release is None:
                migrate.apply(conn, (migrate.OUTBOX, migrate.EXAMPLE))
                tables.migrate(conn)
            conn.execute(examples.BILLING_VIEW)
            conn.execute(examples.SEAT_TABLES)
            conn.execute(effects.TABLE)
            conn.execute(effects.CALLS_TABLE)

    # ------------------------------------------------------------ processes

    def start(
        self, name: str, release: Path | None = None, env: dict[str, str] | None = None
    ) -> None:
        """Start ``name`` (``relay-1``, ``consumer-2``, ``worker-1`` ...) as its console script.

        With ``release``, the same program of that earlier release's source instead;
        ``env``: settings of this process's own (a proxy's address, a clock offset), kept
        when it is restarted.
        """
        own = env if env is not None else self._own_env(name)
        kind = name.split("-", maxsplit=1)[0]
        port = free_port()
        env = {**self.env, **(own or {}), "INORDER_HTTP_PORT": str(port)}
        if kind == "worker":
            env["INORDER_GROUP_ID"] = f"{self.group}-worker"
        program, *arguments = COMMANDS[kind]
        command, cwd = [tool(program), *arguments], ROOT
        if release is not None:
            command, cwd = release_command(release, kind), release
            env = release_env(env, release)
        with (self.logs / f"{name}.log").open("ab") as sink:
            popen = subprocess.Popen(command, env=env, stdout=sink, stderr=sink, cwd=cwd)
        self.processes[name] = Process(kind, popen, port, env=own)

    def _own_env(self, name: str) -> dict[str, str] | None:
        process = self.processes.get(name)
        return process.env if process is not None else None

    def run_release(self, release: Path, kind: str, *arguments: str) -> None:
        """Run one command of an earlier release to its end (``producer migrate``)."""
        done = subprocess.run(
            release_command(release, kind, *arguments),
            env=release_env(self.env, release),
            cwd=release,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{kind} {arguments} of {release.name}: {done.stderr}"

    def kill(self, name: str) -> None:
        """SIGKILL: no clean-up, no last commit."""
        process = self.processes[name]
        process.killed = True
        process.popen.kill()
        process.popen.wait(30)
        process.paused = False

    def pause(self, name: str) -> None:
        """SIGSTOP: the process, its Kafka client's threads and its timers freeze where they are."""
        process = self.processes[name]
        process.popen.send_signal(signal.SIGSTOP)
        process.paused = True

    def resume(self, name: str) -> None:
        """SIGCONT: the process goes on from where it froze, as a zombie if it was replaced."""
        process = self.processes[name]
        process.popen.send_signal(signal.SIGCONT)
        process.paused = False

    def stop(self, name: str) -> int:
        """SIGTERM and wait; the exit code."""
        process = self.processes[name]
        process.killed = True
        if process.paused:  # a frozen process never sees SIGTERM
            self.resume(name)
        process.popen.send_signal(signal.SIGTERM)
        try:
            return process.popen.wait(60)
        except subprocess.TimeoutExpired:
            process.popen.kill()
            return process.popen.wait(30)

    def restart(self, name: str) -> None:
        """kill -9, then start again."""
        self.kill(name)
        self.start(name)

    def close(self) -> None:
        """Stop every process that is still running."""
        for name, process in self.processes.items():
            if process.popen.poll() is None:
                self.stop(name)

    def crashed(self) -> list[str]:
        """Processes that ended without being told to."""
        return [
            f"{name} (exit {p.popen.returncode})"
            for name, p in self.processes.items()
            if not p.killed and p.popen.poll() is not None
        ]

    def http(self, name: str, path: str) -> tuple[int, str]:
        """GET a path of one process's HTTP server: status and body (0 when it does not answer)."""
        url = f"http://127.0.0.1:{self.processes[name].port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except OSError:
            return 0, ""

    def samples(self, names: tuple[str, ...], sample: str) -> list[tuple[dict[str, str], float]]:
        """Every value of one sample on these processes' /metrics, with its labels."""
        found = []
        for name in names:
            status, text = self.http(name, "/metrics")
            if status != 200:
                continue
            for family in text_string_to_metric_families(text):
                found += [(s.labels, s.value) for s in family.samples if s.name == sample]
        return found

    def metric(self, name: str, sample: str) -> float:
        """One sample of one process's /metrics, summed over its labels."""
        status, text = self.http(name, "/metrics")
        if status != 200:
            return 0.0
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == sample
        )

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = 60) -> None:
        """Poll ``check`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, f"{what}: not within {timeout:g}s; logs {self.logs}"
            time.sleep(0.2)

    # ------------------------------------------------------------ load

    def load(
        self, entities: int, ops: int, rate: float, *, seed: int = 1, prefix: str = "sub-"
    ) -> Load:
        """Start the load generator in a thread: ``entities`` x ``ops`` at ``rate`` ops/s."""
        plan = loadgen.LoadPlan(entities, ops, writers=4, prefix=prefix, seed=seed, rate=rate)
        return Load(self.db.conninfo, plan, self.events_topic)

    def lose_one_event(self, entity: str, *, marked: bool = False) -> tuple[int, int]:
        """A new subscription whose next seat change the relay passes unsent; its version.

        One more change follows, so the consumer parks it behind the gap until the
        sweeper has the lost one republished. ``marked``: the outbox of 0.1.0, whose
        relay passes a row already marked published.
        """
        with self.db.connect() as conn:
            subs.create_subscription(conn, entity, loadgen.PLANS[0], topic=self.events_topic)
            with conn.transaction():
                version = subs.add_seats(conn, entity, 3, topic=self.events_topic)
                sent = "published_at = now(), publish_count = 1" if marked else "xid = '0'"
                conn.execute(  # transaction id 0: behind every cursor, taken as sent
                    f"UPDATE outbox SET {sent} WHERE entity_type "  # noqa: S608
                    "= 'seat_ledger' AND entity_id = %s AND generation = %s AND seq = %s",
                    (entity, version.generation, version.seq),
                )
            subs.add_seats(conn, entity, 2, topic=self.events_topic)
        return version.generation, version.seq

    def count(self, query: str, params: tuple[Any, ...] = ()) -> int:
        """The one number a fixed counting query written by a test returns."""
        with self.db.connect() as conn:
            row = conn.execute(query, params).fetchone()
        return int(row[0]) if row else 0

    def gaps(self, statuses: tuple[str, ...] = ("open", "requested")) -> int:
        """Gaps in these states now."""
        return self.count(
            "SELECT count(*) FROM inorder_gaps WHERE status = ANY(%s)", (list(statuses),)
        )

    def parked(self) -> int:
        """Entities with parked events, read from Redis directly."""
        client = connect_redis(self.env["REDIS_URL"])
        try:
            return len(ParkingLot(client, self.prefix).sizes(STEP_STREAM))
        finally:
            client.close()

    def committed(self) -> dict[int, int]:
        """The consumer group's committed offset per partition of the events topic."""
        return {tp.partition: tp.offset for tp, _ in self._offsets()}

    @property
    def share(self) -> bool:
        """Whether the consumers read as a share group."""
        return self.env.get("INORDER_CONSUMER_MODE") == "share"

    def lag(self, topic: str | None = None, group: str | None = None) -> int:
        """Messages of a topic (the events') a group (the consumers') has not committed past
        (in share mode: not yet acknowledged)."""
        if self.share and group is None:
            return share_lag(self.services.kafka_bootstrap, self.group, topic or self.events_topic)
        return sum(high - max(tp.offset, 0) for tp, high in self._offsets(topic, group))

    def _offsets(
        self, topic: str | None = None, group: str | None = None
    ) -> list[tuple[TopicPartition, int]]:
        """Each partition's committed offset for the group, and the partition's end."""
        topic = topic or self.events_topic
        reader = Consumer(
            {"bootstrap.servers": self.services.kafka_bootstrap, "group.id": group or self.group}
        )
        try:
            meta = reader.list_topics(topic, timeout=10).topics[topic]
            tps = [TopicPartition(topic, p) for p in meta.partitions]
            return [
                (tp, reader.get_watermark_offsets(tp, timeout=10)[1])
                for tp in reader.committed(tps, timeout=10)
            ]
        finally:
            reader.close()

    def ready(self, name: str) -> bool:
        """Whether one process answers /readyz with 200."""
        return self.http(name, "/readyz")[0] == 200

    def _pending_rows(self) -> int:
        return self.count(
            "SELECT count(*) FROM outbox WHERE NOT outbox_published(outbox)"
            " AND (failed_at IS NULL OR failure_reason LIKE %s)",
            ("awaiting_topic:%",),
        )

    def settle(self, timeout: float = 120) -> None:
        """Wait until every row is published, no gap is open, nothing is parked and no lag."""

        last: dict[str, int] = {}

        def settled() -> bool:
            try:
                # In this order: every row sent, then no lag (consumers park before they
                # commit offsets), so the parked count read last includes every sent event.
                for name, count in (
                    ("rows unsent", self._pending_rows),
                    ("lag", self.lag),
                    ("gaps open", self.gaps),
                    ("entities parked", self.parked),
                ):
                    last.clear()
                    last[name] = count()
                    if last[name]:
                        return False
            except (psycopg.OperationalError, redis.ConnectionError, KafkaException):
                return False  # a service is still coming back (a broker's group coordinator too)
            return True

        try:
            self.wait_for("pipeline settled", settled, timeout)
        except AssertionError as exc:  # say what was still waiting
            raise AssertionError(f"{exc}; still {last}") from None

    def verdict(self, refused: frozenset[str] = frozenset()) -> Verdict:
        """Judge the settled pipeline: effects, totals and the audit (``refused``: the
        entities whose rows the test meant to be failed)."""
        return judge(self.db, self.env, self.crashed(), refused)
