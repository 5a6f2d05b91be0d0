"""``inorder-producer``: outbox migrations, example load, example batches and an example worker."""

from __future__ import annotations

import argparse
import signal
import threading
import uuid

import psycopg
import structlog
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from producer import loadgen, migrate, snapshots
from producer.settings import ProducerSettings
from producer.worker import Worker, WorkerPlan, WorkerSettings
from schemas.batches import BatchItem, BatchTopics, create_batch
from schemas.runtime import logs, postgres
from schemas.runtime.config import load_or_exit
from schemas.runtime.process import fail, stop_for_operator
from schemas.runtime.usage import program_version, settings_block

PROGRAM = "inorder-producer"
log = structlog.get_logger(PROGRAM)


def parser() -> argparse.ArgumentParser:
    """The command line (producer/README.md's CLI reference is rendered from it)."""
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description=__doc__,
        epilog=settings_block(ProducerSettings),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"{PROGRAM} {program_version()}", help="its version"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    mig = commands.add_parser("migrate", help="create or upgrade the outbox table")
    mig.add_argument("--example", action="store_true", help="also the example service's tables")
    load = commands.add_parser("loadgen", help="write events through the example service")
    load.add_argument("--entities", type=int, default=100, help="subscriptions (default 100)")
    load.add_argument("--events", type=int, default=20, help="operations per entity (default 20)")
    load.add_argument("--writers", type=int, default=8, help="concurrent writers (default 8)")
    load.add_argument("--prefix", default="sub-", help="entity id prefix (default sub-)")
    load.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    load.add_argument("--rate", type=float, help="operations per second (default: flat out)")
    load.add_argument("--no-progress", action="store_true", help="no progress bar")
    batch = commands.add_parser("batches", help="create example batches (manifest + work items)")
    batch.add_argument("--count", type=int, default=10, help="batches (default 10)")
    batch.add_argument("--items", type=int, default=5, help="items per batch (default 5)")
    batch.add_argument("--deadline-s", type=int, help="how long each batch waits for results")
    batch.add_argument(
        "--on-incomplete",
        choices=["assemble_incomplete", "hold"],
        help="what a batch does when its deadline passes with positions missing",
    )
    snap = commands.add_parser(
        "snapshot",
        help="write each entity's current state through the outbox as a <stream>.snapshot "
        "event at its version (again: only entities that changed since)",
    )
    snap.add_argument("stream", help="the entity type, e.g. subscription")
    snap.add_argument(
        "--table",
        required=True,
        help="the entities' table (`name` or `schema.name`) with id, generation and version",
    )
    snap.add_argument("--topic", help="the events' topic (default: INORDER_EVENTS_TOPIC)")
    snap.add_argument(
        "--payload",
        default=snapshots.ROW,
        help="SQL making the payload from the row `t` (default: its columns but id, "
        "generation, version and deleted)",
    )
    snap.add_argument("--where", help='SQL filter on the row `t`, e.g. "NOT t.deleted"')
    snap.add_argument("--rate", type=float, help="entities per second (default: flat out)")
    snap.add_argument(
        "--requested",
        action="store_true",
        help="only the entities consumers asked for (a gap that can no longer be republished)",
    )
    snap.add_argument(
        "--follow",
        type=float,
        metavar="SECONDS",
        help="with --requested: keep taking new asks, looking every SECONDS, until stopped",
    )
    snap.add_argument("--no-progress", action="store_true", help="no progress bar")
    worker = commands.add_parser("worker", help="the example worker: finish items out of order")
    worker.add_argument("--max-delay-ms", type=int, default=200, help="per item (default 200)")
    worker.add_argument("--fail-rate", type=float, default=0.0, help="share of items that fail")
    worker.add_argument(
        "--uncertain-share",
        type=float,
        default=0.0,
        help="share of failures whose outcome is uncertain",
    )
    worker.add_argument(
        "--fail-first",
        nargs="*",
        default=[],
        metavar="ITEM_KEY",
        help="item keys whose first attempt fails",
    )
    return parser


def _batches(args: argparse.Namespace, conninfo: str, where: BatchTopics) -> None:
    with postgres.connect(conninfo, PROGRAM, autocommit=False) as conn:
        for n in range(args.count):
            items = [BatchItem(f"item-{i:04d}", {"n": i}) for i in range(1, args.items + 1)]
            with conn.transaction():
                create_batch(
                    conn,
                    f"batch-{uuid.uuid4().hex[:12]}-{n}",
                    items,
                    deadline_s=args.deadline_s,
                    on_incomplete=args.on_incomplete,
                    where=where,
                )
    Console(stderr=True).print(f"created {args.count} batches of {args.items} items")


def _worker(args: argparse.Namespace) -> None:
    settings = load_or_exit(WorkerSettings, PROGRAM)
    logs.configure(settings.log_level, settings.cautions())
    plan = WorkerPlan(
        args.max_delay_ms, args.fail_rate, args.uncertain_share, frozenset(args.fail_first)
    )
    worker = Worker(settings, plan)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: worker.stop())
    worker.run()


def _loadgen(args: argparse.Namespace, conninfo: str, topic: str) -> None:
    plan = loadgen.LoadPlan(
        args.entities, args.events, args.writers, args.prefix, args.seed, rate=args.rate
    )
    console = Console(stderr=True)
    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=args.no_progress) as progress:
        task = progress.add_task("operations", total=plan.entities * plan.ops_per_entity)
        report = loadgen.run(conninfo, plan, topic, lambda: progress.advance(task))
    console.print(
        f"wrote {report.events} events from {report.operations} operations "
        f"in {report.seconds:.2f}s: {report.events_per_s:,.0f} events/s"
        + (f"; {report.retried} retried after a lost connection" if report.retried else "")
    )


def _snapshot(args: argparse.Namespace, conninfo: str, topic: str) -> None:
    plan = snapshots.Snapshot(
        args.stream,
        args.table,
        args.topic or topic,
        args.payload,
        args.where,
        args.rate,
        requested=args.requested,
    )
    if args.follow is not None:
        if not args.requested or args.follow <= 0:
            fail(PROGRAM, ["--follow needs --requested and a number of seconds"])
        _follow(plan, conninfo, args.follow)
        return
    console = Console(stderr=True)
    columns = ("{task.description}", MofNCompleteColumn(), TimeElapsedColumn())
    with (
        postgres.connect(conninfo, PROGRAM, autocommit=False) as conn,
        Progress(*columns, console=console, disable=args.no_progress) as progress,
    ):
        task = progress.add_task("entities", total=None)
        try:
            report = snapshots.take(conn, plan, lambda n: progress.advance(task, n))
        except psycopg.errors.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                raise
            fail(PROGRAM, [f"snapshot refused: {logs.first_line(exc)}"])
    console.print(
        f"{args.stream}: {report.written} snapshots written, {report.already} already "
        f"there at their version, of {report.read} entities",
        soft_wrap=True,
    )


def _follow(plan: snapshots.Snapshot, conninfo: str, every_s: float) -> None:
    """Take consumers' asks as they come, until SIGTERM or SIGINT; each taken is logged."""
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    with postgres.connect(conninfo, PROGRAM, autocommit=False) as conn:
        while not stopping.is_set():
            report = snapshots.take(conn, plan)
            if report.read:
                log.info(
                    "snapshots_taken", stream=plan.stream, written=report.written, asks=report.taken
                )
            stopping.wait(every_s)


def main(argv: list[str] | None = None) -> None:
    """Run one producer command."""
    args = parser().parse_args(argv)
    settings = load_or_exit(ProducerSettings, PROGRAM)
    logs.configure(settings.log_level, settings.cautions())
    conninfo = settings.database_url.get_secret_value()
    sets = (migrate.OUTBOX, migrate.EXAMPLE)
    try:
        with postgres.connect(conninfo, PROGRAM) as conn:
            migrate.apply(
                conn,
                sets if args.command == "loadgen" or getattr(args, "example", False) else sets[:1],
            )
        if args.command == "loadgen":
            _loadgen(args, conninfo, settings.events_topic)
        elif args.command == "batches":
            topics = BatchTopics(topic=settings.events_topic, work_topic=settings.work_topic)
            _batches(args, conninfo, topics)
        elif args.command == "worker":
            _worker(args)
        elif args.command == "snapshot":
            _snapshot(args, conninfo, settings.events_topic)
    except psycopg.OperationalError as exc:
        fail(PROGRAM, [f"cannot use PostgreSQL: {logs.first_line(exc)}"])
    except psycopg.Error as exc:  # a grant missing: one line, exit 3
        stop_for_operator(PROGRAM, exc)
        raise


if __name__ == "__main__":
    main()
