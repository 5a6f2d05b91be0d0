"""The demo: the example subscription service, out-of-order and lost events, and a clean audit.

``python deploy/local/demo.py up [--entities N --events M --writers K]`` (``make demo``)
starts two relays, two consumers and a sweeper against the local stack, generates load
with a consumer restart midway (a rebalance), loses one event on purpose, waits until
everything has settled, prints a summary and leaves the processes running.
``python deploy/local/demo.py down`` (``make down``) stops them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from consumer import examples, tables
from consumer.kinds import KINDS
from consumer.kinds._audit import Audit
from consumer.kinds.steps.parking import ParkingLot
from consumer.routes import parse_routes
from producer import loadgen, migrate
from producer import subscriptions as subs
from schemas.batches import BatchItem, BatchTopics, create_batch
from schemas.runtime import logs
from schemas.runtime.redis_client import connect as connect_redis

ROOT = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("INORDER_STACK_DIR", ROOT / ".stack")) / "demo"
BIN = Path(sys.executable).parent
SCHEMA = "demo"
PREFIX = "inorder.demo"
TOPICS = {
    "INORDER_TOPICS": '["inorder.demo.events"]',
    "INORDER_DEAD_LETTER_TOPIC": "inorder.demo.dead-letters",
    "INORDER_HELD_TOPIC": "inorder.demo.held",
    "INORDER_REPUBLISH_REQUESTS_TOPIC": "inorder.demo.republish.requests",
    "INORDER_REPUBLISH_RESULTS_TOPIC": "inorder.demo.republish.results",
    "INORDER_WORK_TOPIC": "inorder.demo.batch.work",
    "INORDER_EVENTS_TOPIC": "inorder.demo.events",
}
OUTPUT_TOPIC = "inorder.demo.batch.output"
EVENTS_TOPIC = "inorder.demo.events"
# name -> (command and arguments, HTTP port or None)
PROCESSES: dict[str, tuple[tuple[str, ...], int | None]] = {
    "relay-1": (("inorder-relay",), 9400),
    "relay-2": (("inorder-relay",), 9410),
    "consumer-1": (("inorder-consumer",), 9401),
    "consumer-2": (("inorder-consumer",), 9411),
    "sweeper": (("inorder-sweeper",), 9402),
    # The example worker: items finish out of order; item-0003's first attempt always fails
    # (retried), and a few others fail for good or with an uncertain outcome.
    "worker": (
        (
            "inorder-producer",
            "worker",
            "--fail-rate",
            "0.02",
            "--uncertain-share",
            "0.5",
            "--fail-first",
            "item-0003",
        ),
        None,
    ),
}
BATCH_ROUTE = f"""
[[route]]
stream = "batch"
kind = "batch"
output_topic = "{OUTPUT_TOPIC}"
work_topic = "inorder.demo.batch.work"
max_retries = 1
"""
ROUTES = examples.PROJECTION_ROUTE + examples.STEP_ROUTE + BATCH_ROUTE


def _urls() -> tuple[str, str, str]:
    url = os.environ["DATABASE_URL"]
    return (
        f"{url}?options=-csearch_path%3D{SCHEMA}",
        os.environ["KAFKA_BOOTSTRAP_SERVERS"],
        os.environ["REDIS_URL"],
    )


def _env(group: str) -> dict[str, str]:
    db, kafka, redis_url = _urls()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INORDER_")}
    env.update(
        TOPICS,
        DATABASE_URL=db,
        KAFKA_BOOTSTRAP_SERVERS=kafka,
        REDIS_URL=redis_url,
        INORDER_ROUTES_FILE=str(STATE / "routes.toml"),
        INORDER_REDIS_KEY_PREFIX=PREFIX,
        INORDER_GROUP_ID=group,
        INORDER_SWEEPER_GROUP_ID=f"{group}-sweeper",
        INORDER_RELAY_GROUP_ID=f"{group}-relay",
        INORDER_GAP_DEADLINE_S="5",
        INORDER_REPUBLISH_BACKOFF_BASE_S="2",
        INORDER_SWEEP_INTERVAL_S="1",
        INORDER_GAUGE_INTERVAL_S="1",
        INORDER_LOG_LEVEL="INFO",
    )
    return env


def start(name: str, env: dict[str, str]) -> None:
    """Start one process in the background, logging to the demo folder."""
    (command, *arguments), port = PROCESSES[name]
    own = {"INORDER_HTTP_PORT": str(port)} if port else {}
    if name == "worker":  # a consumer group of its own
        own["INORDER_GROUP_ID"] = f"{env['INORDER_GROUP_ID']}-worker"
    with (STATE / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(  # noqa: S603 - our own console script, fixed arguments
            [str(BIN / command), *arguments],
            env={**env, **own},
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    (STATE / f"{name}.pid").write_text(str(process.pid))


def _running(pid: int) -> bool:
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False  # our own child, now reaped
    except ChildProcessError:
        pass  # started by an earlier run: not ours to reap
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stop(name: str) -> None:
    """SIGTERM one process started by the demo, and wait for it (SIGKILL after 30 s)."""
    pidfile = STATE / f"{name}.pid"
    if not pidfile.exists():
        return
    pid = int(pidfile.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pidfile.unlink(missing_ok=True)
        return
    deadline = time.monotonic() + 30
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _running(pid):
        os.kill(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)


def reset(console: Console) -> str:
    """Fresh schema, topics and parking keys; returns this run's group id."""
    db, kafka, redis_url = _urls()
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
    with psycopg.connect(db, autocommit=True) as conn:
        migrate.apply(conn, (migrate.OUTBOX, migrate.EXAMPLE))
        tables.migrate(conn)
        conn.execute(examples.BILLING_VIEW)
        conn.execute(examples.SEAT_TABLES)
    admin = AdminClient({"bootstrap.servers": kafka})
    present = admin.list_topics(timeout=10).topics
    for topic in {*(t.strip('[]"') for t in TOPICS.values()), OUTPUT_TOPIC}:
        if topic in present:
            admin.delete_topics([topic])[topic].result(timeout=30)
    client = connect_redis(redis_url)
    keys = list(client.scan_iter(match=f"{PREFIX}:*", count=1000))
    if keys:
        client.delete(*keys)
    (STATE / "routes.toml").write_text(ROUTES)
    console.print(f"[dim]fresh schema {SCHEMA!r}, topics and parking keys[/dim]")
    return f"inorder-demo-{int(time.time())}"


def metrics(port: int) -> dict[str, float]:
    """Sum of each sample name on a process's /metrics (labels added up); {} if it is down."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


LOST_ENTITY = "sub-000007"


def _lose_one_event(db: str) -> str:
    """Two more seat changes for one subscription; the relay's cursor passes the first unsent.

    Transaction id 0 marks rows written before the outbox had transaction ids, all of
    them behind every cursor: given to a new row, it makes the relay take the row as sent.
    """
    with psycopg.connect(db) as conn:
        with conn.transaction():
            version = subs.add_seats(conn, LOST_ENTITY, 3, topic=EVENTS_TOPIC)
            conn.execute(
                "UPDATE outbox SET xid = '0' WHERE entity_type = "
                "'seat_ledger' AND entity_id = %s AND generation = %s AND seq = %s",
                (LOST_ENTITY, version.generation, version.seq),
            )
        subs.add_seats(conn, LOST_ENTITY, 2, topic=EVENTS_TOPIC)
    return f"seat_ledger:{LOST_ENTITY} seq {version.seq}"


def _explain_lost(console: Console, group: str) -> None:
    """The lost entity's whole story, as `inorder-admin explain` tells it."""
    ref = f"seat_ledger:{LOST_ENTITY}"
    console.print(f"the lost event's entity, by `inorder-admin explain {ref}`:")
    sys.stdout.flush()
    admin = Path(sys.executable).with_name("inorder-admin")
    command = [str(admin), "explain", ref]
    subprocess.run(command, env=_env(group), check=False, timeout=60)  # noqa: S603 - our own script


def _lag(group: str) -> int:
    _, kafka, _ = _urls()
    reader = Consumer({"bootstrap.servers": kafka, "group.id": group})
    try:
        parts = reader.list_topics(EVENTS_TOPIC, timeout=10).topics[EVENTS_TOPIC].partitions
        tps = [TopicPartition(EVENTS_TOPIC, p) for p in parts]
        total = 0
        for tp in reader.committed(tps, timeout=10):
            _, high = reader.get_watermark_offsets(tp, timeout=10)
            total += high - max(tp.offset, 0)
        return total
    finally:
        reader.close()


def _settled(db: str, group: str) -> bool:
    # In this order: every row sent (so it is in Kafka), then no lag (a consumer parks before
    # it commits the offset, so every sent event is applied or parked by now), then nothing
    # parked, no gap open and no batch waiting.
    with psycopg.connect(db) as conn:
        unsent = conn.execute(
            "SELECT count(*) FROM outbox WHERE NOT outbox_published(outbox)"
            " AND (failed_at IS NULL OR failure_reason LIKE 'awaiting_topic:%')"
        ).fetchone()
    if unsent != (0,) or _lag(group) != 0:
        return False
    with psycopg.connect(db) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM inorder_gaps WHERE status IN ('open', 'requested')), "
            "(SELECT count(*) FROM inorder_batches WHERE status = 'waiting')"
        ).fetchone()
    _, _, redis_url = _urls()
    client = connect_redis(redis_url)
    try:
        parked = len(
            ParkingLot(client, PREFIX).sizes("seat_ledger")
        )  # read directly, not the gauge
    finally:
        client.close()
    return row == (0, 0) and parked == 0


def _summary(db: str, produced: int, peak: float, lost: str, audit: Any) -> Table:
    totals: dict[str, float] = {}
    for name in ("consumer-1", "consumer-2"):
        for key, value in metrics(PROCESSES[name][1] or 0).items():
            totals[key] = totals.get(key, 0.0) + value
    with psycopg.connect(db) as conn:
        gaps = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'healed'), "
            "max(extract(epoch FROM resolved_at - first_seen)) FROM inorder_gaps"
        ).fetchone() or (0, 0, None)
        batches: dict[str, int] = dict(
            conn.execute("SELECT status, count(*) FROM inorder_batches GROUP BY status").fetchall()
        )
    parked_now = metrics(9402).get("events_parked_current", 0.0)
    table = Table(title="inorder demo")
    table.add_column("what")
    table.add_column("value", justify="right")
    rows: list[tuple[str, object]] = [
        ("events produced (outbox rows)", produced),
        ("events consumed", int(totals.get("events_consumed_total", 0))),
        ("events applied", int(totals.get("events_applied_total", 0))),
        ("stale or duplicate (no-ops)", int(totals.get("events_stale_total", 0))),
        ("parked: peak / now", f"{int(peak)} / {int(parked_now)}"),
        ("event lost on purpose", lost),
        ("gaps escalated / healed", f"{gaps[0]} / {gaps[1]}"),
        ("time to heal (detection to healed)", f"{gaps[2] or 0:.1f} s"),
        ("dead letters", int(totals.get("events_dead_lettered_total", 0))),
        (
            "batches: complete / incomplete / other",
            f"{batches.get('complete', 0)} / {batches.get('incomplete', 0)} / "
            f"{sum(batches.values()) - batches.get('complete', 0) - batches.get('incomplete', 0)}",
        ),
        (
            "audit",
            f"{audit.entities} entities, {len(audit.divergences)} divergences, "
            f"{len(audit.unexplained)} unexplained",
        ),
    ]
    for what, shown in rows:
        table.add_row(what, str(shown))
    return table


def _start_all(console: Console) -> tuple[str, dict[str, str]]:
    """Stop an earlier demo, reset its data, start every process; the group and environment."""
    STATE.mkdir(parents=True, exist_ok=True)
    for name in PROCESSES:
        stop(name)
        (STATE / f"{name}.log").unlink(missing_ok=True)
    group = reset(console)
    env = _env(group)
    for name in PROCESSES:
        start(name, env)
    console.print("started 2 relays, 2 consumers, a sweeper and a worker; generating load")
    return group, env


def _load(
    args: argparse.Namespace, console: Console, db: str, env: dict[str, str]
) -> tuple[float, str]:
    """Load with a consumer restart midway (a rebalance); the parked peak and the lost event."""
    plan = loadgen.LoadPlan(args.entities, args.events, args.writers, prefix="sub-", seed=7)
    peak = [0.0]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.5):
            peak[0] = max(peak[0], metrics(9402).get("events_parked_current", 0.0))

    def rebalance() -> None:
        time.sleep(1.0)
        stop("consumer-2")  # leaves the group: its partitions move to consumer-1
        start("consumer-2", env)  # and joins again

    threading.Thread(target=sample, daemon=True).start()
    _batches(db, args.batches)
    mover = threading.Thread(target=rebalance, daemon=True)
    mover.start()
    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("operations", total=plan.entities * plan.ops_per_entity)
        report = loadgen.run(db, plan, EVENTS_TOPIC, lambda: progress.advance(task))
    mover.join()
    lost = _lose_one_event(db)
    console.print(
        f"wrote {report.events} events at {report.events_per_s:,.0f}/s; lost {lost} on purpose"
    )
    sampling.set()
    return peak[0], lost


def _batches(db: str, count: int) -> None:
    """Batches of 10 items, for the worker to finish out of order and the consumer to assemble."""
    where = BatchTopics(topic=EVENTS_TOPIC, work_topic=TOPICS["INORDER_WORK_TOPIC"])
    with psycopg.connect(db) as conn:
        for n in range(count):
            items = [BatchItem(f"item-{i:04d}", {"n": i}) for i in range(1, 11)]
            with conn.transaction():
                create_batch(conn, f"demo-batch-{n:03d}", items, where=where, deadline_s=60)


def _settle(args: argparse.Namespace, console: Console, db: str, group: str) -> tuple[bool, float]:
    """Wait until everything is applied and healed; also the parked peak meanwhile."""
    deadline = time.monotonic() + args.settle_s
    peak = 0.0
    with console.status("waiting until every event is applied and the gap has healed"):
        while not _settled(db, group):
            peak = max(peak, metrics(9402).get("events_parked_current", 0.0))
            if time.monotonic() > deadline:
                console.print(f"[red]not settled after {args.settle_s}s; logs in {STATE}[/red]")
                return False, peak
            time.sleep(0.5)
    return True, peak


def _report(console: Console, db: str, peak: float, lost: str) -> tuple[int, Any]:
    with psycopg.connect(db) as outbox, psycopg.connect(db, autocommit=True) as views:
        produced = outbox.execute("SELECT count(*) FROM outbox").fetchone()[0]  # type: ignore[index]
        audit = Audit(outbox, views, KINDS).run(parse_routes(ROUTES))
    # Alike causes counted together: numbers (generations, ranges) are left out.
    causes = Counter(re.sub(r"\d+", "N", d.cause) for d in audit.divergences if d.cause)
    if causes:
        table = Table("likely cause", "divergences", title="explained divergences")
        for cause, n in causes.most_common():
            table.add_row(cause, str(n))
        console.print(table)
    if audit.unexplained:
        table = Table("stream", "entity", "divergence", title="[red]unexplained divergences[/red]")
        for d in audit.unexplained[:50]:
            table.add_row(d.route, d.entity_id, d.detail)
        console.print(table)
    console.print(_summary(db, produced, peak, lost, audit))
    for name, (_, port) in PROCESSES.items():
        if port is None:
            continue
        console.print(
            f"  {name:<11} http://127.0.0.1:{port}/metrics   log {STATE / (name + '.log')}"
        )
    console.print("still running; `make down` stops them")
    return produced, audit


def up(args: argparse.Namespace, console: Console) -> int:
    """Run the whole scenario; 0 when everything settled and the audit is clean."""
    db, _, _ = _urls()
    group, env = _start_all(console)
    started = time.monotonic()
    peak, lost = _load(args, console, db, env)
    settled, settling_peak = _settle(args, console, db, group)
    peak = max(peak, settling_peak)
    seconds = time.monotonic() - started
    produced, audit = _report(console, db, peak, lost)
    _explain_lost(console, group)
    if args.summary_json:
        figures = {
            "events": produced,
            "seconds_to_settled": seconds,
            "settled": settled,
            "unexplained": len(audit.unexplained),
        }
        Path(args.summary_json).write_text(json.dumps(figures))
    return 0 if not audit.unexplained and settled else 1


def main() -> None:
    """up or down."""
    parser = argparse.ArgumentParser(prog="demo", description=__doc__)
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("--entities", type=int, default=200)
    parser.add_argument("--events", type=int, default=25, help="operations per entity")
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--batches", type=int, default=20, help="batches of 10 items")
    parser.add_argument("--settle-s", type=float, default=120.0)
    parser.add_argument("--summary-json", help="also write the key figures to this file")
    args = parser.parse_args()
    logs.configure("WARNING")
    console = Console()
    if args.command == "down":
        for name in PROCESSES:
            stop(name)
        return
    sys.exit(up(args, console))


if __name__ == "__main__":
    main()
