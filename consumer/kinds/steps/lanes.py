"""Lanes: the entities a poll batch applies one by one, spread over connections of their own.

An entity whose due steps call outside PostgreSQL, or are ``async def``, is applied one
step per transaction. Those entities are independent of each other, so each of
``size`` lanes takes the next entity from the batch's list and applies all its steps,
in seq order, on its own connection, while the other lanes do the same with other
entities. An entity is in one lane at a time; the conditional progress update still
makes one applier per seq; the batch's offsets wait for every lane (``run`` returns
only when all are done). With one lane, or no pool, everything runs on the caller's
connection, one entity after another.

An ``async def`` step runs on the lanes' event loop (one thread, started on first use),
on a pooled async connection, while its lane waits for it: the lanes' async steps are
awaited concurrently. A route with such steps may instead run each entity's turn as a
coroutine on that loop (``spawn``), up to ``size`` at once, with no thread of its own:
what it must do on a blocking connection it hands to a lane's thread (``blocking``).

Left to themselves the lanes' pools open a connection when a lane first needs one and
close it after ten idle minutes; ``keep_open`` opens every one the lanes may hold at
once and keeps them (a session's start and first step cost its backend about as much
CPU as a dozen steps after them).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from consumer.kinds.steps.store import Conn
from schemas.runtime import postgres

T = TypeVar("T")
AsyncConn = psycopg.AsyncConnection[Any]


def _enter(context: contextvars.Context) -> None:
    """Take the caller's context variables (its bound log context) into this task's."""
    for var, value in context.items():
        var.set(value)


def lacking(busy: int, size: int, opened: int) -> int:
    """How many connections to open at once for ``busy`` lanes of ``size``, the pool having
    ``opened`` (open or opening).

    Left to itself a pool opens one connection at a time, as a lane waits for it, so 128
    lanes took over a second to get theirs while their entities waited. Raising its
    minimum by this many queues the openings together on its workers; setting it back at
    once lets idle ones close as before. One is left to the pool's own growth, which may
    be opening one now: the lanes never hold more than ``size``.
    """
    return max(0, min(busy, size) - opened - 1)


def widening(busy: int, size: int, opened: int, floor: int) -> tuple[int, int] | None:
    """The minimum to raise the pool to, so that it opens what ``busy`` lanes lack
    (``lacking``), and the one to set back right after: ``floor``, the connections kept
    open (``keep_open``), else none. None when nothing lacks."""
    more = lacking(busy, size, opened)
    return (max(more, floor), floor) if more else None


class Lanes:
    """Up to ``size`` entities applied at once, each lane on a pooled connection."""

    def __init__(
        self,
        size: int,
        pool: ConnectionPool | None = None,
        *,
        dsn: str | None = None,
        program: str = "inorder-lanes",
    ) -> None:
        self.size = size if pool is not None else 1
        self.pool = pool
        self._executor = (
            ThreadPoolExecutor(max_workers=size, thread_name_prefix="lane")
            if pool is not None and size > 1
            else None
        )
        # Where async steps connect (None: this route cannot await a step).
        self.dsn = dsn
        self._program = program
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._apool: AsyncConnectionPool | None = None
        self._lock = threading.Lock()  # the event loop's start, and the count of busy lanes
        self._busy = 0  # tasks submitted and not finished
        self._turns: asyncio.Semaphore | None = None  # coroutine turns running at once
        self._spawned = 0  # coroutine turns running or waiting (counted on the loop only)
        # The connections each pool keeps open, idle or not (``keep_open``): the threads',
        # and the event loop's.
        self._floor = 0
        self._afloor = 0

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

    @property
    def parallel(self) -> bool:
        """Whether entities can be applied on lanes of their own (more than one, and a pool)."""
        return self._executor is not None and self.pool is not None

    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the next free lane and return at once (``connection`` inside it)."""
        if self._executor is None:
            raise RuntimeError("these lanes run on the caller's connection: nothing to submit")
        with self._lock:
            self._busy += 1
            busy = self._busy
        self._widen(busy)

        def run() -> None:
            try:
                task()
            finally:
                with self._lock:
                    self._busy -= 1

        self._executor.submit(contextvars.copy_context().run, run)

    def keep_open(self, *, threads: bool, awaited: bool, wait_s: float) -> bool:
        """Open a connection for every lane and keep them open, idle or not: the threads'
        (``threads``), the event loop's (``awaited``). Waits up to ``wait_s`` for them all;
        False when some were still opening then (they go on opening)."""
        pool = self.pool
        if pool is None or self._executor is None:
            return True  # one lane, on the caller's connection
        size, deadline = self.size, time.monotonic() + wait_s
        if threads:
            self._floor = size
            pool.resize(size, size)
        if awaited and self.dsn is not None:
            loop, apool = self._async()
            self._afloor = size

            async def fill() -> None:
                await apool.resize(size, size)
                await apool.wait(max(0.0, deadline - time.monotonic()))

            try:
                asyncio.run_coroutine_threadsafe(fill(), loop).result()
            except PoolTimeout:
                return False
        try:
            if threads:
                pool.wait(max(0.0, deadline - time.monotonic()))
        except PoolTimeout:
            return False
        return True

    def _widen(self, busy: int) -> None:
        """Open at once, on the pool's workers, the connections ``busy`` lanes lack
        (``lacking``)."""
        pool = self.pool
        if pool is None:
            return
        sizes = widening(busy, self.size, pool.get_stats()["pool_size"], self._floor)
        if sizes is not None:
            pool.resize(sizes[0], self.size)
            pool.resize(sizes[1], self.size)

    def connection(self) -> AbstractContextManager[Conn]:
        """A pooled connection for a submitted task; ``PoolTimeout`` while none can be had."""
        if self.pool is None:
            raise RuntimeError("these lanes have no connections of their own")
        return self.pool.connection()

    def awaiting(self, work: Callable[[AsyncConn], Awaitable[T]]) -> T:
        """``await work(async connection)`` on the lanes' event loop; this lane waits for it."""
        loop, apool = self._async()
        context = contextvars.copy_context()

        async def step() -> T:
            _enter(context)  # the lane's bound log context
            async with apool.connection() as aconn:
                return await work(aconn)

        return asyncio.run_coroutine_threadsafe(step(), loop).result()

    @property
    def looped(self) -> bool:
        """Whether turns may run as coroutines (``spawn``): lanes of their own, and a
        database for the loop's connections."""
        return self.parallel and self.dsn is not None

    def spawn(self, turn: Callable[[], Awaitable[None]]) -> None:
        """Run ``turn()`` on the lanes' event loop, after the ``size`` turns before it
        that still run; return at once. It logs with the caller's bound context."""
        loop, apool = self._async()
        room = self._turns
        assert room is not None  # made with the loop
        context = contextvars.copy_context()

        async def run() -> None:
            _enter(context)
            self._spawned += 1
            try:
                # As ``_widen`` for the threads' pool: the connections the turns waiting
                # and running lack, opened together.
                opened = apool.get_stats()["pool_size"]
                sizes = widening(self._spawned, self.size, opened, self._afloor)
                if sizes is not None:
                    await apool.resize(sizes[0], self.size)
                    await apool.resize(sizes[1], self.size)
                async with room:
                    await turn()
            finally:
                self._spawned -= 1

        asyncio.run_coroutine_threadsafe(run(), loop)

    def aconnection(self) -> AbstractAsyncContextManager[AsyncConn]:
        """A pooled async connection for a turn on the loop."""
        _, apool = self._async()
        return apool.connection()

    async def blocking(self, work: Callable[[Conn], T]) -> T:
        """``work(connection)`` on a lane's thread and pooled connection, awaited by a turn
        on the loop (which goes on with other turns meanwhile)."""
        executor, pool = self._executor, self.pool
        if executor is None or pool is None:
            raise RuntimeError("these lanes have no threads of their own")

        def run() -> T:
            with pool.connection() as conn:
                return work(conn)

        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(executor, context.run, run)

    def _async(self) -> tuple[asyncio.AbstractEventLoop, AsyncConnectionPool]:
        with self._lock:
            if self._loop is None or self._apool is None:
                if self.dsn is None:
                    raise RuntimeError("async def steps need a database to connect to")
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="lanes-async", daemon=True)
                thread.start()
                apool = postgres.async_pool(self.dsn, self._program, self.size)
                asyncio.run_coroutine_threadsafe(apool.open(), loop).result()
                self._loop, self._thread, self._apool = loop, thread, apool
                self._turns = asyncio.Semaphore(self.size)
            return self._loop, self._apool

    def close(self) -> None:
        """Stop the lanes' threads and close their connections; later runs use the caller's."""
        executor, pool = self._executor, self.pool
        self._executor, self.pool, self.size = None, None, 1
        if executor is not None:
            executor.shutdown(wait=True)
        if pool is not None:
            pool.close()
        with self._lock:
            loop, thread, apool = self._loop, self._thread, self._apool
            self._loop = self._thread = self._apool = None
            self._turns = None
        if loop is not None and apool is not None:
            asyncio.run_coroutine_threadsafe(apool.close(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join()
        if loop is not None:
            loop.close()
