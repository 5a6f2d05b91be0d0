"""Which of the scripts' statements each connection has prepared on its server session."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any


class Prepared:
    """Which statements each connection has prepared (forgotten with the connection)."""

    def __init__(self) -> None:
        # None: some were lost, and which are left is to be read from the server.
        self._by_conn: weakref.WeakKeyDictionary[Any, set[str] | None] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()  # lanes on threads share this registry

    def ready(self, conn: Any) -> set[str] | None:
        """The statements ``conn`` has prepared (a copy); None when not known."""
        with self._lock:
            names = self._by_conn.get(conn, set())
            return None if names is None else set(names)

    def add(self, conn: Any, names: Sequence[str]) -> None:
        """Note that ``conn`` prepared ``names``."""
        if names:
            with self._lock:
                known = self._by_conn.get(conn, set())
                self._by_conn[conn] = None if known is None else known | set(names)

    def known(self, conn: Any, names: Sequence[str]) -> None:
        """``conn`` has prepared ``names`` and no other (as the server said)."""
        with self._lock:
            self._by_conn[conn] = set(names)

    def forget(self, conn: Any) -> None:
        """``conn`` lost some of its prepared statements: which are left is not known."""
        with self._lock:
            self._by_conn[conn] = None


PREPARED = Prepared()
