"""Where a slice's publishing stands, and how one read moves it: pure, no I/O.

Every outbox row carries the id of the transaction that wrote it. A slice's cursor is
the ``(xid, id)`` of the last row sent in that order; a read takes the rows past it,
which are exactly the rows of transactions its snapshot shows finished (PostgreSQL
shows a reader no others). A transaction still running at that moment may hold an id
below the rows taken, so the cursor would pass rows that are not visible yet: such
transactions are remembered (``running``) and their rows are read once they finish,
however long they take, while rows of everything else flow past them. A transaction
that rolled back leaves no rows and is forgotten when it finishes. This is how PgQ
batches events, with a position kept inside one transaction's rows so that a batch
limit can cut through a large transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A PostgreSQL snapshot (``pg_current_snapshot()``): which transactions had finished."""

    xmin: int
    xmax: int
    running: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        """Read the ``xmin:xmax:xip,...`` text form."""
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def finished(self, xid: int) -> bool:
        """True when transaction ``xid`` had committed or rolled back (pg_visible_in_snapshot)."""
        return xid < self.xmin or (xid < self.xmax and xid not in self.running)


@dataclass(frozen=True, slots=True)
class Cursor:
    """One slice's position: the last row sent, and transactions that were running below it.

    ``running`` maps each such transaction id to the id of the last of its rows sent
    (0 while none has been).
    """

    xid: int = 0
    id: int = 2**63 - 1
    running: Mapping[int, int] = field(default_factory=dict)

    @property
    def position(self) -> tuple[int, int]:
        """The cursor as the ``(xid, id)`` pair rows are ordered by."""
        return (self.xid, self.id)


def advance(
    cursor: Cursor, snapshot: Snapshot, taken: Sequence[tuple[int, int]], cut: bool
) -> Cursor:
    """The cursor after sending ``taken``: the rows one read returned, as ``(xid, id)``.

    The read asked for the rows of remembered transactions past their positions and
    the rows past the cursor, all in ``snapshot``; ``taken`` is an unbroken run of them
    in ``(xid, id)`` order from the first. ``cut``: the read may have left rows after the
    last one taken (a row limit or a byte budget was reached); they stay where they were.
    """
    ordered = sorted(taken)
    last = ordered[-1] if ordered and cut else None
    running = dict(cursor.running)
    for xid in cursor.running:
        if not snapshot.finished(xid):
            continue
        if last is None or xid < last[0]:
            del running[xid]  # every row it wrote has been read
        elif xid == last[0]:
            running[xid] = last[1]
    # The last row taken past the cursor, outside remembered transactions.
    position = next(
        (
            row
            for row in reversed(ordered)
            if row > cursor.position and row[0] not in cursor.running
        ),
        cursor.position,
    )
    for xid in snapshot.running:
        if xid < position[0]:
            running.setdefault(xid, 0)
    return Cursor(position[0], position[1], running)
