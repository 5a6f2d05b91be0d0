"""A scratch schema (and Redis key prefix) for one test or one arrival order, removed after."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from schemas.runtime import postgres
from schemas.runtime.redis_client import RedisClient

PROGRAM = "inorder-testing"


@contextmanager
def scratch(
    database_url: str, client: RedisClient | None = None
) -> Iterator[tuple[psycopg.Connection[Any], str]]:
    """A connection to a new schema, and a Redis key prefix, both removed afterwards."""
    name = f"inorder_scratch_{uuid.uuid4().hex[:12]}"
    with postgres.connect(database_url, PROGRAM) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        with postgres.connect(database_url, PROGRAM, options=f"-c search_path={name}") as conn:
            yield conn, name
    finally:
        with postgres.connect(database_url, PROGRAM) as admin:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))
        if client is not None:
            keys = list(client.scan_iter(match=f"{name}:*", count=1000))
            if keys:
                client.delete(*keys)
