"""The slice cursor against a model of PostgreSQL transactions: nothing skipped, nothing twice."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from outbox_relay.frontier import Cursor, Snapshot, advance

FIRST_XID = 3  # ids 0-2 are reserved by PostgreSQL


@dataclass
class Database:
    """Transactions as PostgreSQL runs them: ids in start order, rows visible once committed."""

    next_xid: int = FIRST_XID
    next_id: int = 1
    open: dict[int, list[int]] = field(default_factory=dict)  # xid -> ids of its rows
    committed: list[tuple[int, int]] = field(default_factory=list)  # (xid, id)
    rolled_back: set[tuple[int, int]] = field(default_factory=set)
    latest_finished: int = 0

    def begin(self) -> int:
        xid = self.next_xid
        self.next_xid += 1
        self.open[xid] = []
        return xid

    def insert(self, xid: int) -> None:
        self.open[xid].append(self.next_id)  # ids come from a sequence: never rolled back
        self.next_id += 1

    def finish(self, xid: int, commit: bool) -> None:
        rows = [(xid, row_id) for row_id in self.open.pop(xid)]
        if commit:
            self.committed.extend(rows)
        else:
            self.rolled_back.update(rows)
        self.latest_finished = max(self.latest_finished, xid)

    def snapshot(self) -> Snapshot:
        # As GetSnapshotData: xmax is one past the latest finished id; running ids below it
        # are listed; xmin is the oldest of them (or xmax).
        xmax = max(self.latest_finished + 1, FIRST_XID)
        running = frozenset(x for x in self.open if x < xmax)
        return Snapshot(min(running, default=xmax), xmax, running)

    def read(
        self, cursor: Cursor, limit: int, share: int = 2**62, weight: Weight = lambda _: 1
    ) -> tuple[list[tuple[int, int]], bool]:
        """The relay's query and its merge: rows of remembered transactions past their
        position and rows past the cursor, each part in (xid, id) order, limited to
        ``limit`` rows and to ``share`` of weight (its first row whatever it weighs), the
        last row kept marked where the weight left rows behind; merged, ended at the
        first mark, limited again. Returns the rows and whether more may follow them."""
        past = sorted(row for row in self.committed if row > cursor.position)
        parts = [past] + [
            sorted(row for row in self.committed if row[0] == xid and row[1] > position)
            for xid, position in cursor.running.items()
        ]
        kept: list[tuple[int, int]] = []
        marks: list[tuple[int, int]] = []
        for part in parts:
            total = 0
            for n, row in enumerate(part[:limit]):
                total += weight(row)
                if n and total > share:
                    marks.append(kept[-1])
                    break
                kept.append(row)
        merged = sorted(kept)
        if marks:
            merged = [row for row in merged if row <= min(marks)]
        taken = merged[:limit]
        return taken, bool(marks) or len(taken) >= limit


Weight = Callable[[tuple[int, int]], int]


@st.composite
def schedules(draw: st.DrawFn) -> list[tuple[str, int]]:
    """Transactions of 0-3 rows each, committed or rolled back, interleaved with reads.

    Every step is placed by a permutation; each transaction's own steps are then put
    back in their only possible order (begin, inserts, end) in the places they drew.
    """
    sizes = draw(st.lists(st.integers(0, 3), min_size=1, max_size=8))
    ends = draw(st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))
    reads = draw(st.integers(1, 8))
    tokens = [("read", -1)] * reads
    for tx, size in enumerate(sizes):
        tokens += [("begin", tx)] + [("insert", tx)] * size + [("end", tx)]
    order = draw(st.permutations(tokens))
    own: dict[int, list[str]] = {}
    for action, tx in tokens:
        if tx >= 0:
            own.setdefault(tx, []).append(action)
    placed: list[tuple[str, int]] = []
    for _, tx in order:
        if tx < 0:
            placed.append(("read", -1))
            continue
        action = own[tx].pop(0)
        if action == "end":
            action = "commit" if ends[tx] else "abort"
        placed.append((action, tx))
    return placed


def _run(
    steps: list[tuple[str, int]], limit: int, share: int = 2**62, weights: tuple[int, ...] = (1,)
) -> tuple[Database, list[tuple[int, int]]]:
    db = Database()
    cursor = Cursor()
    sent: list[tuple[int, int]] = []
    xids: dict[int, int] = {}

    def read() -> int:
        nonlocal cursor
        snapshot = db.snapshot()
        taken, cut = db.read(cursor, limit, share, lambda row: weights[row[1] % len(weights)])
        sent.extend(taken)
        cursor = advance(cursor, snapshot, taken, cut)
        return len(taken)

    for action, tx in steps:
        if action == "begin":
            xids[tx] = db.begin()
        elif action == "insert":
            db.insert(xids[tx])
        elif action in {"commit", "abort"}:
            db.finish(xids[tx], commit=action == "commit")
        else:
            read()
    for _ in range(1000):  # a cursor that never moves on would read forever
        if not read() and not any(db.snapshot().finished(x) for x in cursor.running):
            break
    return db, sent


@settings(max_examples=400, deadline=None)
@given(schedules(), st.integers(1, 4))
def test_every_committed_row_is_read_once_and_no_rolled_back_row_ever(
    steps: list[tuple[str, int]], limit: int
) -> None:
    """Any interleaving of writers, commits out of id order and rollbacks: each row once."""
    db, sent = _run(steps, limit)
    assert sorted(sent) == sorted(db.committed)
    assert not set(sent) & db.rolled_back


@settings(max_examples=400, deadline=None)
@given(
    schedules(),
    st.integers(1, 4),
    st.integers(1, 12),
    st.lists(st.integers(1, 9), min_size=1, max_size=7).map(tuple),
)
def test_a_byte_budget_cutting_any_part_skips_nothing_and_repeats_nothing(
    steps: list[tuple[str, int]], limit: int, share: int, weights: tuple[int, ...]
) -> None:
    """Parts cut by weight anywhere, rows heavier than the share: each row still once."""
    db, sent = _run(steps, limit, share, weights)
    assert sorted(sent) == sorted(db.committed)
    assert len(sent) == len(set(sent))


def test_a_long_transaction_delays_only_its_own_rows() -> None:
    """Rows of later transactions pass a long open one; its rows follow when it commits."""
    db = Database()
    long = db.begin()
    db.insert(long)
    short = db.begin()
    db.insert(short)
    db.finish(short, commit=True)
    snapshot = db.snapshot()
    taken, cut = db.read(Cursor(0, 0), 10)
    assert taken == [(short, 2)]
    cursor = advance(Cursor(0, 0), snapshot, taken, cut)
    assert cursor.position == (short, 2)
    assert cursor.running == {long: 0}
    db.finish(long, commit=True)
    snapshot = db.snapshot()
    taken, cut = db.read(cursor, 10)
    assert taken == [(long, 1)]
    assert advance(cursor, snapshot, taken, cut).running == {}


def test_a_limit_cuts_through_a_remembered_transaction_at_a_position() -> None:
    """A remembered transaction larger than the limit is read in parts, from its position."""
    cursor = Cursor(10, 5, {7: 0})
    snapshot = Snapshot(11, 11)
    moved = advance(cursor, snapshot, [(7, 1), (7, 2)], cut=True)
    assert (moved.position, moved.running) == ((10, 5), {7: 2})
    finished = advance(moved, snapshot, [(7, 3)], cut=False)
    assert finished.running == {}


def test_a_rolled_back_transaction_is_forgotten_once_finished() -> None:
    """A remembered transaction with no rows is dropped when the snapshot shows it finished."""
    cursor = Cursor(10, 5, {7: 0, 8: 0})
    assert advance(cursor, Snapshot(8, 11, frozenset({8})), [], cut=False).running == {8: 0}


def test_snapshot_text_is_parsed_as_postgresql_prints_it() -> None:
    """``xmin:xmax:xip,...`` becomes the finished() rule of pg_visible_in_snapshot."""
    snap = Snapshot.parse("10:20:12,15")
    assert (snap.xmin, snap.xmax, snap.running) == (10, 20, frozenset({12, 15}))
    assert [snap.finished(x) for x in (9, 12, 13, 19, 20)] == [True, False, True, True, False]
