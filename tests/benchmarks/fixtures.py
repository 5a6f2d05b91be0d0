"""Benchmark helpers: throw-away PostgreSQL schemas, a consumer timed until it is done."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from consumer.routes import parse_routes
from consumer.service import ConsumerService
from consumer.settings import ConsumerSettings
from schemas.runtime.health import Health
from tests.support.threads import serving


@contextmanager
def temp_schema(url: str, prefix: str) -> Iterator[str]:
    """A new schema, dropped afterwards; yields a URL whose search_path is that schema."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        yield f"{url}?options=-csearch_path%3D{name}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def consume_until(settings: ConsumerSettings, url: str, done: str, want: int) -> float:
    """Seconds from starting a consumer until the query ``done`` returns ``want``."""
    service = ConsumerService(settings, parse_routes(settings.routes_file.read_text()), Health())
    started = time.perf_counter()
    with serving("bench-consumer", service.run, service.stop), psycopg.connect(url) as conn:
        while True:
            row = conn.execute(done).fetchone()
            conn.rollback()
            if row and row[0] == want:
                return time.perf_counter() - started
            time.sleep(0.05)
