"""Reads past the cursors on a connection and thread of their own.

PostgreSQL spends about as long finding a batch's rows as the relay spends sending
them. Started here, the next read runs while the relay hands the current batch to
Kafka on the main thread: each read is one statement with its own snapshot, so where
it runs changes nothing about what it returns.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psycopg

from outbox_relay import store
from outbox_relay.frontier import Cursor
from outbox_relay.store import Read


class Reader:
    """One read at a time; the connection opens with the first read.

    ``start`` reads in the background, ``read`` in the calling thread (nothing to overlap,
    so no hand-over between threads to wait for).
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.Connection[Any] | None = None
        self._using = threading.Lock()  # the connection, by one read at a time
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-read")

    def start(self, cursors: Mapping[int, Cursor], limit: int) -> Future[Read]:
        """Begin reading past ``cursors``; the future holds the read or the error it met."""
        return self._thread.submit(self.read, dict(cursors), limit)

    def read(self, cursors: Mapping[int, Cursor], limit: int) -> Read:
        """Read past ``cursors`` and return the rows."""
        with self._using:
            if self._conn is None or self._conn.closed:
                self._conn = store.connect(self._url)
            try:
                return store.read(self._conn, cursors, limit)
            except psycopg.OperationalError:
                self._drop()
                raise

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Wait for a read in progress, then close the connection and the thread."""
        self._thread.shutdown(wait=True)
        with self._using:
            self._drop()
