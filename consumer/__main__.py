"""Entry points of ``inorder-consumer``, ``inorder-sweeper`` and ``inorder-admin``."""

from __future__ import annotations

import sys

import psycopg
import redis
import structlog
from rich.console import Console

from consumer import admin, admin_cli
from consumer.batch_admin import BatchAdminError
from consumer.errors import RoutesError, StoreNotDurableError
from consumer.routes import Route, parse_routes
from consumer.service import ConsumerService
from consumer.settings import ConsumerSettings, SweeperSettings
from consumer.sweeper import Sweeper
from schemas import logs
from schemas.config import load_or_exit
from schemas.health import Health, run_until_stopped

CONSUMER = "inorder-consumer"


def _fail(program: str, lines: list[str]) -> None:
    for line in lines:
        sys.stderr.write(f"{program}: {line}\n")
    raise SystemExit(2)


def _routes(settings: ConsumerSettings, program: str) -> list[Route]:
    try:
        text = settings.routes_file.read_text()
    except OSError as exc:
        _fail(program, [f"cannot read INORDER_ROUTES_FILE {settings.routes_file}: {exc.strerror}"])
    try:
        return parse_routes(text, str(settings.routes_file))
    except RoutesError as exc:
        _fail(program, exc.problems)
    raise AssertionError("unreachable")


def _no_arguments(program: str, argv: list[str] | None) -> None:
    if sys.argv[1:] if argv is None else argv:
        _fail(program, ["takes no arguments; it is configured by the environment"])


def main(argv: list[str] | None = None) -> None:
    """Run the consumer until SIGTERM or SIGINT; exit 0 after committing the batch in hand."""
    _no_arguments(CONSUMER, argv)
    settings = load_or_exit(ConsumerSettings, CONSUMER)
    routes = _routes(settings, CONSUMER)
    logs.configure(settings.log_level)
    log = structlog.get_logger(__name__)
    health = Health()
    try:
        service = ConsumerService(settings, routes, health)
        service.connect_postgres()
        service.connect_redis()
    except RoutesError as exc:
        _fail(CONSUMER, exc.problems)
    except StoreNotDurableError as exc:
        _fail(CONSUMER, [str(exc)])
    except (psycopg.OperationalError, redis.ConnectionError, redis.TimeoutError) as exc:
        log.warning("dependency_unavailable", error=logs.first_line(exc), at="start")

    def run() -> None:
        try:
            service.run()
        except RoutesError as exc:
            _fail(CONSUMER, exc.problems)
        except StoreNotDurableError as exc:
            _fail(CONSUMER, [str(exc)])

    run_until_stopped(CONSUMER, health, settings.http_host, settings.http_port, run, service.stop)


SWEEPER = "inorder-sweeper"


def sweeper_main(argv: list[str] | None = None) -> None:
    """Run the gap sweeper until SIGTERM or SIGINT."""
    _no_arguments(SWEEPER, argv)
    settings = load_or_exit(SweeperSettings, SWEEPER)
    if settings.redis_url is None:
        _fail(SWEEPER, ["bad configuration: REDIS_URL: Field required"])
    routes = _routes(settings, SWEEPER)
    logs.configure(settings.log_level)
    log = structlog.get_logger(__name__)
    health = Health()
    try:
        sweeper = Sweeper(settings, routes, health)
        sweeper.connect()
    except RoutesError as exc:
        _fail(SWEEPER, exc.problems)
        return
    except (psycopg.OperationalError, redis.ConnectionError) as exc:
        _fail(SWEEPER, [f"cannot start: {logs.first_line(exc)}"])
        return
    log.info("sweeper_started", holder=sweeper.io.lease.holder)
    run_until_stopped(
        SWEEPER, health, settings.http_host, settings.http_port, sweeper.run, sweeper.stop
    )


ADMIN = "inorder-admin"


def admin_main(argv: list[str] | None = None) -> None:
    """Run one operator command; exit 1 with one line when it cannot be done."""
    args = sys.argv[1:] if argv is None else argv
    admin_cli.parse_only(args)  # usage errors first, before any connection
    settings = load_or_exit(SweeperSettings, ADMIN)
    logs.configure("WARNING")
    try:
        admin_cli.run(args, settings, Console())
    except (admin.AdminError, BatchAdminError) as exc:
        sys.stderr.write(f"{ADMIN}: {exc}\n")
        raise SystemExit(1) from None
    except RoutesError as exc:
        _fail(ADMIN, exc.problems)
    except (psycopg.OperationalError, redis.ConnectionError) as exc:
        _fail(ADMIN, [f"cannot connect: {logs.first_line(exc)}"])


if __name__ == "__main__":
    main()
