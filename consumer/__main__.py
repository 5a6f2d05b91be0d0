"""Entry points of ``inorder-consumer``, ``inorder-sweeper`` and ``inorder-admin``.

All three read the same settings and routes file the same way, and stop with one line
per problem (exit 2) when either cannot be used.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TypeVar

import psycopg
import redis
import structlog
from rich.console import Console

from consumer import tables
from consumer.admin import cli
from consumer.errors import (
    AdminError,
    NotConfiguredError,
    RoutesError,
    SchemaNotReadyError,
    StartupError,
)
from consumer.kinds import KINDS, Resources
from consumer.routes import Route, read_routes
from consumer.service import ConsumerService
from consumer.settings import ConsumerSettings, RouteSettings, SweeperSettings
from consumer.sweeper.service import Sweeper
from schemas.errors import TopicSettingsError
from schemas.runtime import logs, postgres, traces
from schemas.runtime.config import load_or_exit
from schemas.runtime.health import Health
from schemas.runtime.outages import down
from schemas.runtime.payloads import registry_or_exit
from schemas.runtime.process import arguments, fail, serve, stop_for_operator

_S = TypeVar("_S", bound=RouteSettings)
CONSUMER = "inorder-consumer"
SWEEPER = "inorder-sweeper"
ADMIN = "inorder-admin"
CONSUMER_SUMMARY = (
    "Reads the event topics named in the routes file and applies each event in its "
    "entity's order: last writer wins into a table, ordered steps (early events parked in "
    "Redis until their turn), or batch results put back in position order. Run as many as "
    "the topics have partitions. `inorder-consumer migrate` applies the consumer's table "
    "migrations and exits: run it as the tables' owner before consumers whose role may not "
    "create tables."
)
SWEEPER_SUMMARY = (
    "Finds gaps that outlived their deadline, asks the relay to republish what is missing, "
    "and holds an entity whose events are gone for good. Run two: one is active, the other "
    "takes over within the lease."
)
# Start-up problems that say what to fix: one line each, no traceback.
_NAMED = (RoutesError, StartupError, TopicSettingsError)


def _routes(settings: RouteSettings, program: str) -> list[Route]:
    try:
        return read_routes(settings.routes_file)
    except RoutesError as exc:
        fail(program, exc.problems)


def _problems(exc: RoutesError | StartupError | TopicSettingsError) -> list[str]:
    return exc.problems if isinstance(exc, RoutesError) else [str(exc)]


def _load(cls: type[_S], program: str) -> _S:
    """The settings, and the payload schema folder they name read once, or one line and exit.

    The batch kind then uses the same registry (``default_payload_schemas``, read once).
    """
    settings = load_or_exit(cls, program)
    registry_or_exit(settings, program)
    return settings


def migrate_main(program: str) -> None:
    """``inorder-consumer migrate``: apply the consumer's pending migrations and exit 0.

    Run it as the tables' owner before the consumers start (a migration Job); a
    consumer or sweeper whose role may not create tables then starts without DDL.
    """
    settings = _load(ConsumerSettings, program)
    routes = _routes(settings, program)
    logs.configure(settings.log_level, settings.cautions())
    sets = tables.migration_sets([KINDS[route.kind] for route in routes])
    try:
        with postgres.connect(settings.database_url, program) as conn:
            applied = tables.migrate(conn, sets)
    except psycopg.OperationalError as exc:
        fail(program, [f"cannot use PostgreSQL: {logs.first_line(exc)}"])
    except SchemaNotReadyError as exc:  # a role that may not create: not the owner's
        fail(program, [str(exc)], code=3)
    names = [f"{m.migration_set}/{m.version:04d}_{m.name}" for m in applied]
    sys.stdout.write(f"applied {len(applied)}: {', '.join(names)}\n" if names else "up to date\n")
    for line in _upgrade(settings, routes, program):
        sys.stdout.write(f"{line}\n")


def _upgrade(settings: ConsumerSettings, routes: Sequence[Route], program: str) -> list[str]:
    """Each kind's upgrade of what it keeps outside the tables (the step kind's parks)."""
    resources = Resources(settings, program)
    done: list[str] = []
    try:
        for name, kind in KINDS.items():
            mine = [r for r in routes if r.kind == name]
            if mine and kind.upgrade is not None:
                done += kind.upgrade(mine, resources)
    except RoutesError as exc:
        fail(program, exc.problems)
    except (psycopg.OperationalError, redis.ConnectionError) as exc:
        fail(program, [f"cannot connect: {logs.first_line(exc)}"])
    finally:
        resources.close()
    return done


def main(argv: list[str] | None = None) -> None:
    """Run the consumer until SIGTERM or SIGINT; exit 0 after committing the batch in hand."""
    if list(sys.argv[1:] if argv is None else argv) == ["migrate"]:
        migrate_main(CONSUMER)
        return
    arguments(CONSUMER, argv, CONSUMER_SUMMARY, ConsumerSettings)
    settings = _load(ConsumerSettings, CONSUMER)
    routes = _routes(settings, CONSUMER)
    logs.configure(settings.log_level, settings.cautions())
    log = structlog.get_logger(__name__)
    health = Health()
    try:
        service = ConsumerService(settings, routes, health)
        service.connect()
    except _NAMED as exc:
        fail(CONSUMER, _problems(exc))
    except Exception as exc:
        if not down(exc):
            stop_for_operator(CONSUMER, exc)
            raise
        # run() waits it out, unready meanwhile
        log.warning("dependency_unavailable", error=logs.first_line(exc), at="start")

    def run() -> None:
        try:
            service.run()
        except _NAMED as exc:
            fail(CONSUMER, _problems(exc))

    serve(CONSUMER, health, settings.http_host, settings.http_port, service, run)


def sweeper_main(argv: list[str] | None = None) -> None:
    """Run the gap sweeper until SIGTERM or SIGINT."""
    arguments(SWEEPER, argv, SWEEPER_SUMMARY, SweeperSettings)
    settings = _load(SweeperSettings, SWEEPER)
    if settings.redis_url is None:
        fail(SWEEPER, ["bad configuration: REDIS_URL: Field required"])
    routes = _routes(settings, SWEEPER)
    logs.configure(settings.log_level, settings.cautions())
    log = structlog.get_logger(__name__)
    health = Health()
    try:
        sweeper = Sweeper(settings, routes, health)
        sweeper.connect()
    except RoutesError as exc:
        fail(SWEEPER, exc.problems)
    except Exception as exc:
        if not down(exc):
            stop_for_operator(SWEEPER, exc)
            raise
        # run() waits it out, unready meanwhile
        log.warning("dependency_unavailable", error=logs.first_line(exc), at="start")
    serve(SWEEPER, health, settings.http_host, settings.http_port, sweeper)


def admin_main(argv: list[str] | None = None) -> None:
    """Run one operator command; exit 1 with one line when it cannot be done."""
    args = sys.argv[1:] if argv is None else argv
    cli.parse_only(args)  # usage errors first, before any connection
    settings = _load(SweeperSettings, ADMIN)
    routes = _routes(settings, ADMIN)
    logs.configure("WARNING")
    exporting = traces.configure(ADMIN)  # a review's span, when OTLP export is asked for
    try:
        cli.run(args, settings, routes, Console())
    except (AdminError, NotConfiguredError) as exc:
        fail(ADMIN, [str(exc)], code=1)
    except RoutesError as exc:
        fail(ADMIN, exc.problems)
    except (psycopg.OperationalError, redis.ConnectionError) as exc:
        fail(ADMIN, [f"cannot connect: {logs.first_line(exc)}"])
    except psycopg.errors.InsufficientPrivilege as exc:
        fail(ADMIN, [f"not allowed: {logs.first_line(exc)}"], code=1)
    except psycopg.errors.UndefinedTable as exc:
        fail(
            ADMIN,
            [
                f"{logs.first_line(exc)}: the tables are not migrated here (run "
                "`inorder-consumer migrate`, and `inorder-producer migrate` for the outbox, "
                "as their owner), or DATABASE_URL names another database or schema"
            ],
            code=1,
        )
    except psycopg.Error as exc:
        fail(ADMIN, [f"PostgreSQL refused: {logs.first_line(exc)}"], code=1)
    finally:
        traces.shutdown(exporting)


if __name__ == "__main__":
    main()
