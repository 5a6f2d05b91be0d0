"""Lanes: the entities a poll batch applies one by one, spread over connections of their own.

An entity whose due steps call outside PostgreSQL is applied one step per transaction,
its attempt committed before the call. Those entities are independent of each other, so
each of ``size`` lanes takes the next entity from the batch's list and applies all its
steps, in seq order, on its own connection, while the other lanes do the same with other
entities. An entity is in one lane at a time; the conditional progress update still
makes one applier per seq; the batch's offsets wait for every lane (``run`` returns
only when all are done). With one lane, or no pool, everything runs on the caller's
connection, one entity after another.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

from psycopg_pool import ConnectionPool

from consumer.kinds.steps.store import Conn

T = TypeVar("T")


class Lanes:
    """Up to ``size`` entities applied at once, each lane on a pooled connection."""

    def __init__(self, size: int, pool: ConnectionPool | None = None) -> None:
        self.size = size if pool is not None else 1
        self.pool = pool
        self._executor = (
            ThreadPoolExecutor(max_workers=size, thread_name_prefix="lane")
            if pool is not None and size > 1
            else None
        )

    def run(
        self, conn: Conn, entities: Sequence[str], work: Callable[[Conn, str], T]
    ) -> dict[str, T]:
        """``work(connection, entity)`` for every entity, each once; every lane finishes.

        The first exception a lane raised is raised once all lanes stopped (what the
        others applied is committed and stays: applying again changes nothing).
        """
        if self._executor is None or self.pool is None or len(entities) <= 1:
            return {entity: work(conn, entity) for entity in entities}
        pool = self.pool
        todo = iter(entities)
        taking = threading.Lock()
        done: dict[str, T] = {}

        def lane() -> None:
            with pool.connection() as own:
                while True:
                    with taking:
                        entity = next(todo, None)
                    if entity is None:
                        return
                    done[entity] = work(own, entity)

        lanes = min(self.size, len(entities))
        # Each lane logs with the caller's bound context (route, poll batch).
        futures = [
            self._executor.submit(contextvars.copy_context().run, lane) for _ in range(lanes)
        ]
        wait(futures)
        for future in futures:
            error = future.exception()
            if error is not None:
                raise error
        return done

    def close(self) -> None:
        """Stop the lanes' threads and close their connections; later runs use the caller's."""
        executor, pool = self._executor, self.pool
        self._executor, self.pool, self.size = None, None, 1
        if executor is not None:
            executor.shutdown(wait=True)
        if pool is not None:
            pool.close()
