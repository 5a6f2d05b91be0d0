"""``inorder-producer``: apply the outbox migrations, or generate load with the example service."""

from __future__ import annotations

import argparse
import sys

import psycopg
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from producer import loadgen, migrate
from producer.settings import ProducerSettings
from schemas import logs
from schemas.config import load_or_exit

PROGRAM = "inorder-producer"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    mig = commands.add_parser("migrate", help="create or upgrade the outbox table")
    mig.add_argument("--example", action="store_true", help="also the example service's tables")
    load = commands.add_parser("loadgen", help="write events through the example service")
    load.add_argument("--entities", type=int, default=100, help="subscriptions (default 100)")
    load.add_argument("--events", type=int, default=20, help="operations per entity (default 20)")
    load.add_argument("--writers", type=int, default=8, help="concurrent writers (default 8)")
    load.add_argument("--prefix", default="sub-", help="entity id prefix (default sub-)")
    load.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    load.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _loadgen(args: argparse.Namespace, conninfo: str, topic: str) -> None:
    plan = loadgen.LoadPlan(args.entities, args.events, args.writers, args.prefix, args.seed)
    console = Console(stderr=True)
    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=args.no_progress) as progress:
        task = progress.add_task("operations", total=plan.entities * plan.ops_per_entity)
        report = loadgen.run(conninfo, plan, topic, lambda: progress.advance(task))
    console.print(
        f"wrote {report.events} events from {report.operations} operations "
        f"in {report.seconds:.2f}s: {report.events_per_s:,.0f} events/s"
    )


def main(argv: list[str] | None = None) -> None:
    """Run one producer command."""
    args = _parser().parse_args(argv)
    settings = load_or_exit(ProducerSettings, PROGRAM)
    logs.configure(settings.log_level)
    conninfo = settings.database_url.get_secret_value()
    sets = (migrate.OUTBOX, migrate.EXAMPLE)
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            migrate.apply(conn, sets if args.command == "loadgen" or args.example else sets[:1])
        if args.command == "loadgen":
            _loadgen(args, conninfo, settings.events_topic)
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0]
        sys.stderr.write(f"{PROGRAM}: cannot use PostgreSQL: {first}\n")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
