"""Gauges and retention on a thread of their own, so the publishing loop never waits for them.

Measuring a backlog or deleting old rows takes PostgreSQL milliseconds; done between
batches it held up every row committed meanwhile (seen as the tail of publish latency).
Here it has its own connection, and a failure only waits for the next round.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import psycopg
import structlog

from outbox_relay import metrics, store
from outbox_relay.frontier import Cursor
from outbox_relay.settings import RelaySettings
from schemas.runtime import postgres

log = structlog.get_logger(__name__)

# Backlog gauges are refreshed this often.
MEASURE_INTERVAL_S = 5.0


class Housekeeper:
    """Refreshes the gauges of the slices held (``owned()``) and purges past retention."""

    def __init__(self, settings: RelaySettings, owned: Callable[[], dict[int, Cursor]]) -> None:
        self.settings = settings
        self.owned = owned
        self._stop = threading.Event()
        self._measured: set[int] = set()
        self._conn: psycopg.Connection[Any] | None = None
        self._thread = threading.Thread(target=self._run, name="inorder-housekeeping", daemon=True)

    def start(self) -> None:
        """Start the rounds."""
        self._thread.start()

    def stop(self) -> None:
        """End the rounds and close the connection."""
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        due = {self.measure: 0.0, self.purge: 0.0}
        every = {self.measure: MEASURE_INTERVAL_S, self.purge: self.settings.purge_interval_s}
        last_error = None
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                for task, at in due.items():
                    if now >= at:
                        due[task] = now + every[task]
                        task()
                last_error = None
            except psycopg.Error as exc:  # PostgreSQL down: the main loop reports it
                error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if error != last_error:
                    log.info("housekeeping_waiting", error=error)
                last_error = error
                self._close()
            self._stop.wait(max(0.05, min(due.values()) - time.monotonic()))
        self._close()

    @property
    def _db(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            url = self.settings.database_url.get_secret_value()
            self._conn = postgres.connect(url, "inorder-relay")
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            with suppress(psycopg.Error):
                self._conn.close()
            self._conn = None

    def measure(self) -> None:
        """Gauges of the slices held now; those of slices given up are removed."""
        owned = self.owned()
        found = store.backlog(self._db, owned) if owned else {}
        for slice_, backlog in found.items():
            label = str(slice_)
            metrics.BACKLOG.labels(label).set(backlog.rows)
            metrics.OLDEST_AGE.labels(label).set(backlog.oldest_age_s)
            metrics.RUNNING.labels(label).set(backlog.running)
            metrics.RUNNING_AGE.labels(label).set(backlog.oldest_running_age_s)
        for slice_ in self._measured - set(found):
            for gauge in metrics.SLICE_GAUGES:
                with suppress(KeyError):
                    gauge.remove(str(slice_))
        self._measured = set(found)
        failed, awaiting = store.failed_rows(self._db)
        metrics.FAILED_ROWS.set(failed)
        metrics.AWAITING_TOPIC_ROWS.set(awaiting)

    def purge(self) -> None:
        """Delete sent rows past retention, oldest first, a few at a time."""
        total, after = 0, 0
        while not self._stop.is_set():
            deleted, after, done = store.purge_batch(
                self._db, after, self.settings.retention_s, self.settings.purge_batch_rows
            )
            total += deleted
            if done:
                break
        if total:
            metrics.PURGED.inc(total)
            log.info("outbox_purged", rows=total, retention_s=self.settings.retention_s)
