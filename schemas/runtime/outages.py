"""Waiting out a dependency that is down: which one it is, backoff, readiness, one log line.

The relay, the consumer and the sweeper all pause this way: a failure marks the
process unready naming the dependency, logs ``<dependency>_unavailable`` with the
retry delay, and waits (beating the heartbeat) until the next try; the first
success afterwards clears readiness and logs ``<program>_resumed``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import psycopg
import redis
import structlog
from confluent_kafka import KafkaError, KafkaException

from schemas.errors import InorderError
from schemas.runtime.backoff import Backoff
from schemas.runtime.causes import REDIS_OUTAGES, Cause, cause, reply_code
from schemas.runtime.health import Health
from schemas.runtime.logs import first_line

log = structlog.get_logger(__name__)

# Failures that mean "try again later", never "this input is bad" (Redis's include a
# Cluster failover in progress: CLUSTERDOWN, TRYAGAIN, a slot with no master yet).
DOWN = (psycopg.OperationalError, KafkaException, *REDIS_OUTAGES)
DEPENDENCIES = ("postgres", "redis", "kafka")
_WORD_START = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")  # OSError: os_error


def down(exc: BaseException) -> bool:
    """Whether ``exc`` is a dependency that cannot serve now: an error class of ``DOWN``, or
    a reply that says so (a Redis ``MISCONF`` on a full disk, ``OOM``, ``LOADING``).

    What a dependency refuses for good (a password, a permission) is not down, and
    neither is anything else: a loop that waits on ``down`` stops on those.
    """
    if isinstance(exc, DOWN) or getattr(exc, "dependency", None) in DEPENDENCIES:
        return True  # inorder's own outage of a named dependency (a schema not migrated)
    ours = isinstance(exc, psycopg.Error | KafkaException | redis.RedisError)
    return ours and cause(exc) is Cause.OUTAGE


def waited_out(exc: BaseException) -> bool:
    """Whether a loop waits ``exc`` out rather than stopping on it.

    Outages are waited out. So is a dependency's error that the cause table gives to an
    input but that no input's barrier caught (a statement timeout on the process's own
    bookkeeping, say): it belongs to no one input, and trying again later is what the
    process did before it had a cause table. What only the operator can fix stops it.
    """
    found = cause(exc)
    return found is Cause.OUTAGE or (found is Cause.INPUT and isinstance(exc, DOWN))


def reason(exc: BaseException) -> str:
    """A short code for why a dependency failed, for ``/readyz``: never the error's text.

    The text may name hosts, users, roles or databases; the log line has it. The code is
    the SQLSTATE, the Kafka error's name, the Redis reply's first word or the error's class
    (inorder's own without ``Error``: ``schema_not_ready``).
    """
    if isinstance(exc, psycopg.Error):
        if exc.sqlstate:
            return f"sqlstate_{exc.sqlstate}"
        return "connection_failed" if isinstance(exc, psycopg.OperationalError) else "client_error"
    if isinstance(exc, KafkaException):
        err = exc.args[0] if exc.args else None
        name = err.name() if isinstance(err, KafkaError) else ""
        return name.strip("_").lower() or "kafka_error"
    if type(exc) is redis.ResponseError:  # subclasses have the reply's word as their class
        return (reply_code(exc) or "error_reply").lower()
    name = _WORD_START.sub("_", type(exc).__name__).lower()
    return name.removesuffix("_error") if isinstance(exc, InorderError) else name


def dependency(exc: BaseException) -> str:
    """``postgres``, ``redis`` or ``kafka``: the service ``exc`` came from."""
    named = getattr(exc, "dependency", None)
    if named in DEPENDENCIES:
        return str(named)
    if isinstance(exc, psycopg.Error):
        return "postgres"
    if isinstance(exc, redis.RedisError | redis.exceptions.RedisClusterException):
        return "redis"
    return "kafka"


class Outages:
    """One process's way of waiting out outages; ``stopping`` ends a wait early."""

    def __init__(self, name: str, health: Health, stopping: Callable[[], bool]) -> None:
        self.name = name
        self.health = health
        self.stopping = stopping
        self.backoff = Backoff()

    def wait(
        self,
        exc: BaseException,
        *,
        on: str | None = None,
        waiting: Callable[[float], None] | None = None,
        **context: object,
    ) -> str:
        """Mark ``on`` (by default the dependency ``exc`` came from) down and wait the next delay.

        ``waiting(deadline)`` replaces the plain sleep when the process has something to
        keep alive meanwhile (a consumer polls to stay in its group); it is called until
        the delay has passed or the process is stopping. Returns the dependency's name.
        """
        name = on or dependency(exc)
        delay, detail = self.backoff.failed(), first_line(exc)
        self.health.blocked(name, reason(exc))
        log.warning(f"{name}_unavailable", error=detail, retry_in_s=delay, **context)
        if waiting is None:
            self.health.sleep(delay, self.stopping)
        else:
            self.health.wait(delay, self.stopping, waiting)
        return name

    def recovered(self) -> bool:
        """A try worked: clear readiness and the backoff; True if an outage just ended."""
        if not self.backoff.failures:
            return False
        self.backoff.succeeded()
        for name in DEPENDENCIES:
            self.health.cleared(name)
        log.info(f"{self.name}_resumed")
        return True
