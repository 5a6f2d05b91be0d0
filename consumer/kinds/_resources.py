"""What a program lends the route kinds: its settings and its connections, in one holder.

The consumer, the sweeper, ``inorder-admin`` and the test kit each make one
``Resources`` and pass it to every applier, duty and command. A connection is opened
the first time a kind asks for it, under the program's name, and opened again after
``lost`` (an outage closed it); ``close`` closes what was opened here. A caller that
already holds a connection lends it (``conn=``, ``redis=``): it is used, never closed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import psycopg
from confluent_kafka import Producer
from pydantic import ValidationError

from consumer.errors import NotConfiguredError, StartupError
from schemas.runtime import kafka_clients, postgres
from schemas.runtime.config import InorderSettings, describe
from schemas.runtime.redis_client import RedisClient
from schemas.runtime.redis_client import connect as connect_redis

if TYPE_CHECKING:
    from consumer.settings import RouteSettings

S_co = TypeVar("S_co", bound="RouteSettings", covariant=True)
P = TypeVar("P", bound=InorderSettings)
Conn = psycopg.Connection[Any]


class Resources(Generic[S_co]):
    """Settings, PostgreSQL, Redis and a producer, each opened on first use."""

    def __init__(
        self,
        settings: S_co,
        program: str,
        *,
        carry: bool = False,
        conn: Conn | None = None,
        redis: RedisClient | None = None,
        producer: Callable[[], Producer] | None = None,
    ) -> None:
        self._settings = settings
        self.program = program
        # True in the consumer's loop, which collects work an applier carries past its
        # poll batch (``Outcome.deferred``); elsewhere every share is finished in place.
        self.carry = carry
        self._lent = {id(c) for c in (conn, redis) if c is not None}
        self._conn = conn
        self._redis = redis
        self._producer: Producer | None = None
        self._make_producer = producer
        self._parts: dict[type[InorderSettings], InorderSettings] = {}

    @property
    def settings(self) -> S_co:
        """The program's settings."""
        return self._settings

    def part(self, model: type[P]) -> P:
        """A kind's own process settings: the program's when they include them, else read
        from the environment once (``StartupError`` with one line saying what to fix)."""
        if isinstance(self._settings, model):
            return self._settings
        found = self._parts.get(model)
        if found is None:
            try:
                found = self._parts[model] = model()
            except ValidationError as exc:
                raise StartupError(f"bad configuration: {describe(exc, model)}") from None
        return cast(P, found)

    @property
    def conn(self) -> Conn:
        """The consumer's database, autocommit (open a transaction where one is needed)."""
        if self._conn is None or self._conn.closed:
            url = self._settings.database_url
            if url is None:
                raise NotConfiguredError("set INORDER_DATABASE_URL: routes keep their state there")
            self._conn = postgres.connect(url, self.program)
        return self._conn

    @property
    def has_conn(self) -> bool:
        """Whether a database connection is open now (without opening one)."""
        return self._conn is not None and not self._conn.closed

    @property
    def redis(self) -> RedisClient:
        """Redis under the program's settings (``NotConfiguredError`` when none is set)."""
        if self._redis is None:
            url = self._settings.redis_url
            if url is None:
                raise NotConfiguredError("set INORDER_REDIS_URL: step routes park events in Redis")
            self._redis = connect_redis(
                url.get_secret_value(),
                socket_timeout=10,
                socket_connect_timeout=5,
                health_check_interval=30,
            )
        return self._redis

    @property
    def has_redis(self) -> bool:
        """Whether Redis is connected now (without connecting)."""
        return self._redis is not None

    @property
    def producer(self) -> Producer:
        """An idempotent producer under the program's name; the caller flushes."""
        if self._producer is None:
            make = self._make_producer
            self._producer = (
                make() if make else kafka_clients.producer(self._settings, self.program)
            )
        return self._producer

    def lost(self, dependency: str | None) -> None:
        """Forget a connection an outage broke: the next use opens a new one."""
        if dependency == "postgres" and self._conn is not None:
            if id(self._conn) not in self._lent:
                self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Close what was opened here (a lent connection is its owner's to close)."""
        if self._producer is not None:
            self._producer.flush(10)
        for opened in (self._conn, self._redis):
            if opened is not None and id(opened) not in self._lent:
                opened.close()
        self._conn = self._redis = None
