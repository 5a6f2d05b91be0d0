"""Reads past the cursors on a connection and thread of their own.

PostgreSQL spends about as long finding a batch's rows as the relay spends sending
them. Started here, the next read runs while the relay hands the current batch to
Kafka on the main thread: each read is one statement with its own snapshot, so where
it runs changes nothing about what it returns.

A read started ahead is kept until it is taken, across the relay's rounds: it is
used when it was started from the cursors asked for, and otherwise thrown away
(a slice lost, taken or not advanced since).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import psycopg

from outbox_relay import store
from outbox_relay.frontier import Cursor
from outbox_relay.store import Read
from outbox_relay.weighing import Bounds


@dataclass(frozen=True, slots=True)
class _Ahead:
    """A read started in the background, and what it was started from."""

    cursors: dict[int, Cursor]
    bounds: Bounds
    future: Future[Read]

    def serves(self, cursors: Mapping[int, Cursor], bounds: Bounds) -> bool:
        """Whether this read is the one past ``cursors`` (it may cover more slices)."""
        return bounds == self.bounds and all(
            self.cursors.get(slice_) == cursor for slice_, cursor in cursors.items()
        )


class Reader:
    """One read at a time; the connection opens with the first read.

    ``ahead`` starts a read in the background and ``take`` returns it; with no read
    ahead for the cursors asked, ``take`` reads in the calling thread (nothing to
    overlap, so no hand-over between threads to wait for).
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.Connection[Any] | None = None
        self._using = threading.Lock()  # the connection, by one read at a time
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-read")
        self._ahead: _Ahead | None = None

    def ahead(self, cursors: Mapping[int, Cursor], bounds: Bounds) -> Future[Read]:
        """Begin reading past ``cursors`` in the background, for ``take`` to return."""
        copied = dict(cursors)
        self._ahead = _Ahead(copied, bounds, self._thread.submit(self.read, copied, bounds))
        return self._ahead.future

    def take(self, cursors: Mapping[int, Cursor], bounds: Bounds) -> Read:
        """The rows past ``cursors``: read ahead when that read is for them, else read now.

        The read ahead may cover slices not asked for; their rows are the caller's to
        ignore. A read ahead for other cursors is waited for and dropped.
        """
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if ahead.serves(cursors, bounds):
                return ahead.future.result()
            wait([ahead.future])  # its error, if any, is the read below's to meet again
        return self.read(cursors, bounds)

    def read(self, cursors: Mapping[int, Cursor], bounds: Bounds) -> Read:
        """Read past ``cursors`` and return the rows."""
        with self._using:
            if self._conn is None or self._conn.closed:
                self._conn = store.connect(self._url, reading=True)
            try:
                return store.read(self._conn, cursors, bounds)
            except psycopg.OperationalError:
                self._drop()
                raise

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Wait for a read in progress, then close the connection and the thread."""
        self._ahead = None
        self._thread.shutdown(wait=True)
        with self._using:
            self._drop()
