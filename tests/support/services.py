"""Where the real Kafka, PostgreSQL and Redis for a test run are, and how to restart them.

Addresses come from the environment first (``make test`` exports the local stack's),
then from testcontainers when a Docker engine answers. Otherwise there are none.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STACK_SCRIPT = ROOT / "deploy" / "local" / "stack"
ENV_NAMES = ("KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL", "REDIS_URL")


class ServicesUnavailableError(RuntimeError):
    """Raised when no address is set and no Docker engine is reachable."""


@dataclass(frozen=True)
class Services:
    """Addresses of one set of real services, plus a way to restart each."""

    kafka_bootstrap: str
    database_url: str
    redis_url: str
    restart: Callable[[str], None]


def _restart_with_stack(service: str) -> None:
    subprocess.run([str(STACK_SCRIPT), "restart", service], check=True, capture_output=True)


def stack_control(action: str, service: str) -> None:
    """``stop`` or ``start`` one service of the local stack (for outage tests)."""
    if not os.environ.get("INORDER_STACK_DIR"):
        _restart_unsupported(service)
    subprocess.run([str(STACK_SCRIPT), action, service], check=True, capture_output=True)


def _restart_unsupported(service: str) -> None:
    raise ServicesUnavailableError(
        f"cannot restart {service}: services came from the environment without "
        "INORDER_STACK_DIR; run them with deploy/local/stack to use restart tests"
    )


def from_environment() -> Services | None:
    """Services named by KAFKA_BOOTSTRAP_SERVERS, DATABASE_URL and REDIS_URL, if all are set."""
    values = [os.environ.get(name) for name in ENV_NAMES]
    if not all(values):
        return None
    kafka, database, redis = (v or "" for v in values)
    local = bool(os.environ.get("INORDER_STACK_DIR"))
    restart = _restart_with_stack if local else _restart_unsupported
    return Services(kafka, database, redis, restart)


def docker_reachable() -> bool:
    """True when a Docker engine answers a ping."""
    try:
        import docker  # noqa: PLC0415 - only present with the test extras

        docker.from_env(timeout=3).ping()
    except Exception:  # noqa: BLE001 - any failure means "no engine here"
        return False
    return True


@contextmanager
def from_testcontainers() -> Iterator[Services]:
    """Start Kafka (KRaft), PostgreSQL and Redis (AOF on) in containers for the session."""
    from testcontainers.kafka import KafkaContainer  # noqa: PLC0415
    from testcontainers.postgres import PostgresContainer  # noqa: PLC0415
    from testcontainers.redis import RedisContainer  # noqa: PLC0415

    with ExitStack() as stack:
        kafka = stack.enter_context(KafkaContainer().with_kraft())
        postgres = stack.enter_context(PostgresContainer("postgres:16", driver=None))
        redis = stack.enter_context(
            RedisContainer().with_command("redis-server --appendonly yes --appendfsync everysec")
        )

        def redis_url() -> str:
            return f"redis://{redis.get_container_host_ip()}:{redis.get_exposed_port(6379)}/0"

        def restart(service: str) -> None:
            if service != "redis":
                _restart_unsupported(service)
            redis.get_wrapped_container().restart()

        yield Services(
            kafka.get_bootstrap_server(), postgres.get_connection_url(), redis_url(), restart
        )
