"""The transaction-id cursor against real PostgreSQL and Kafka: open, late, rolled-back writers."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from prometheus_client import REGISTRY

import schemas
from producer import OutboxEvent, emit, emit_many
from tests.conftest import PgSchema
from tests.integration import relay_support as rs
from tests.support import libpq
from tests.support.kafka import drain, wait_until
from tests.support.services import Services

if TYPE_CHECKING:
    from outbox_relay.store import Read

REBASE = Path(schemas.__file__).parent / "outbox" / "rebase_xids.sql"


def _event(topic: str, entity: str, seq: int = 1) -> OutboxEvent:
    return OutboxEvent(
        "subscription", entity, seq, "subscription.plan_changed", rs.PAYLOAD, topic=topic
    )


def _sent_ids(services: Services, topic: str, expect: int) -> Counter[str]:
    return Counter(
        schemas.decode(m.value()).event_id
        for m in drain(services.kafka_bootstrap, topic, expect=expect)
    )


def _rows_in(read: Read) -> int:
    return sum(map(len, read.rows.values()))


def _gauge(name: str) -> float:
    return sum(s.value for m in REGISTRY.collect() for s in m.samples if s.name == name)


def test_a_long_transaction_delays_only_its_own_rows(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """Rows committed after a long open transaction go out at once; its own follow its commit."""
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics)
    with rs.running(settings), outbox.connect() as long:
        with long.transaction():
            emit(long, _event(topics.events, "long"))
            rs.write_rows(outbox, topics.events, 20, entities=20)
            wait_until(lambda: rs.count_rows(outbox, rs.SENT) == 20)
            assert rs.unsent(outbox) == 0  # the open transaction's row is not visible yet
            wait_until(lambda: _gauge("outbox_running_transactions") >= 1, timeout_s=15)
        wait_until(lambda: rs.count_rows(outbox, rs.SENT) == 21)
    assert _sent_ids(services, topics.events, 21)["subscription:long:1:1"] == 1


def test_an_early_id_committed_late_and_a_rollback(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """A transaction that took its id before others wrote is still sent; a rolled-back one never."""
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics)
    with rs.running(settings), outbox.connect() as early, outbox.connect() as doomed:
        with early.transaction():
            early.execute("SELECT pg_current_xact_id()")  # the id is taken now
            doomed.execute("SELECT 1")  # opens the transaction emit joins
            emit(doomed, _event(topics.events, "doomed"))
            rs.write_rows(outbox, topics.events, 10, entities=10)
            wait_until(lambda: rs.count_rows(outbox, rs.SENT) == 10)
            doomed.rollback()
            emit(early, _event(topics.events, "early"))
        wait_until(lambda: rs.count_rows(outbox, rs.SENT) == 11)
    sent = _sent_ids(services, topics.events, 11)
    assert sent["subscription:early:1:1"] == 1
    assert "subscription:doomed:1:1" not in sent
    assert sum(sent.values()) == 11


def test_two_relays_share_the_slices_and_a_survivor_takes_them_all(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, tmp_path: Path
) -> None:
    """Two relays hold 8 slices each; when one is killed the other takes all 16 after the lease."""
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics, lease_s=2)
    env = rs.relay_env(settings)
    first = rs.spawn(env, tmp_path / "relay.log")
    second = rs.spawn(env, tmp_path / "relay.log")
    try:
        wait_until(lambda: _owners(outbox) == {first.pid: 8, second.pid: 8}, timeout_s=30)
        first.kill()
        first.wait(timeout=30)
        wait_until(lambda: _owners(outbox) == {second.pid: 16}, timeout_s=30)
        ids = rs.write_rows(outbox, topics.events, 200, entities=50)
        wait_until(lambda: rs.unsent(outbox) == 0)
    finally:
        second.terminate()
        second.wait(timeout=60)
    assert _sent_ids(services, topics.events, 200) == Counter(ids)
    assert _owners(outbox) == {}  # a clean stop gives the slices back at once


def _owners(schema: PgSchema) -> dict[int, int]:
    """Slices held per relay process id (from the owner's ``host:pid:tag``)."""
    with schema.connect() as conn:
        rows = conn.execute(
            "SELECT split_part(owner, ':', 2)::int, count(*) FROM outbox_relay_slices"
            " WHERE owner IS NOT NULL AND lease_until > now() GROUP BY 1"
        ).fetchall()
    return dict(rows)


def test_transaction_ids_ahead_of_the_cluster_stop_start_up(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """An outbox restored from another cluster (ids ahead of its own) stops the relay: one line."""
    rs.write_rows(outbox, topics.events, 1)
    with outbox.connect() as conn:
        conn.execute("UPDATE outbox SET xid = '999999999999'")
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics)
    done = subprocess.run(
        [sys.executable, "-m", "outbox_relay"],
        env=rs.relay_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    [line] = [x for x in done.stderr.splitlines() if x.startswith("inorder-relay:")]
    assert line.startswith("inorder-relay: the outbox holds transaction id 999999999999")
    assert "rebase_xids.sql" in line
    assert rs.count_rows(outbox, rs.SENT) == 0

    with outbox.connect() as conn, conn.transaction():  # the README's way out
        conn.execute(REBASE.read_bytes())
    with rs.running(settings):
        wait_until(lambda: rs.unsent(outbox) == 0)
    assert len(_sent_ids(services, topics.events, 1)) == 1


class Writers:
    """Writers as applications run them, on their own connections, for ``seconds``.

    Each transaction is one of: plain, rolled back, taking its id early and writing
    late, or (one writer) held open for seconds. Entities are per writer, so seqs
    never collide; what committed and what rolled back is recorded by event id.
    """

    def __init__(self, schema: PgSchema, topic: str, seconds: float) -> None:
        self.schema = schema
        self.topic = topic
        self.deadline = time.monotonic() + seconds
        self.committed: set[str] = set()
        self.rolled_back: set[str] = set()
        self._lock = threading.Lock()

    def run(self, writer: int) -> None:
        rng = random.Random(writer)
        seqs: Counter[str] = Counter()
        with self.schema.connect() as conn:
            while time.monotonic() < self.deadline:
                kind = "long" if writer == 0 else rng.choice(["plain", "rollback", "early"])
                events = []
                for _ in range(rng.randint(1, 3)):
                    entity = f"w{writer}-{rng.randrange(20)}"
                    seqs[entity] += 1
                    events.append(_event(self.topic, entity, seqs[entity]))
                conn.execute("SELECT pg_current_xact_id()" if kind == "early" else "SELECT 1")
                if kind in {"early", "long"}:
                    time.sleep(rng.uniform(0.01, 0.05) if kind == "early" else 3.0)
                emit_many(conn, events)
                ids = {e.resolved_event_id for e in events}
                if kind == "rollback":
                    conn.rollback()
                    for event in events:
                        seqs[event.entity_id] -= 1
                    with self._lock:
                        self.rolled_back |= ids
                else:
                    conn.commit()
                    with self._lock:
                        self.committed |= ids


def test_writers_racing_two_relays_and_a_kill_lose_nothing(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, tmp_path: Path
) -> None:
    """Racing writers, two relays, one SIGKILLed: all committed rows out, no rolled-back row,
    duplicates only from the killed relay's slices, at most its batch in hand."""
    batch = 50
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics, read_rows=batch, lease_s=2)
    env = rs.relay_env(settings)
    victim = rs.spawn(env, tmp_path / "relay.log")
    survivor = rs.spawn(env, tmp_path / "relay.log")
    writers = Writers(outbox, topics.events, seconds=8)
    threads = [threading.Thread(target=writers.run, args=(n,)) for n in range(6)]
    try:
        wait_until(lambda: _owners(outbox) == {victim.pid: 8, survivor.pid: 8}, timeout_s=30)
        for thread in threads:
            thread.start()
        wait_until(lambda: rs.count_rows(outbox, rs.SENT) > 500, timeout_s=30, interval_s=0.02)
        with outbox.connect() as conn:
            held = {
                row[0]
                for row in conn.execute(
                    "SELECT slice FROM outbox_relay_slices WHERE owner LIKE %s",
                    (f"%:{victim.pid}:%",),
                )
            }
        victim.kill()
        victim.wait(timeout=30)
        for thread in threads:
            thread.join(60)
        wait_until(lambda: rs.unsent(outbox) == 0, timeout_s=90)
    finally:
        survivor.terminate()
        survivor.wait(timeout=60)
    sent = _sent_ids(services, topics.events, len(writers.committed))
    assert writers.rolled_back, "no transaction rolled back: the race was not tested"
    assert set(sent) == writers.committed
    twice = {event_id for event_id, n in sent.items() if n > 1}
    with outbox.connect() as conn:
        slices = dict(
            conn.execute("SELECT event_id, outbox_slice(entity_type, entity_id) FROM outbox")
        )
    assert {slices[event_id] for event_id in twice} <= held
    assert sum(sent[event_id] - 1 for event_id in twice) <= batch * len(held)


def test_rows_are_read_in_transaction_id_order_not_text_order(outbox: PgSchema) -> None:
    """Ids of different lengths (99 < 100 < 1000) are ordered as numbers when a limit cuts."""
    from outbox_relay import store  # noqa: PLC0415
    from outbox_relay.frontier import Cursor  # noqa: PLC0415
    from outbox_relay.rows import XID, named  # noqa: PLC0415

    with outbox.connect() as conn:
        with conn.transaction():
            for n in range(3):
                emit(conn, _event("t", "same", n + 1))
        conn.execute("UPDATE outbox SET xid = (ARRAY['1000', '100', '99'])[seq]::xid8")
        [slice_] = conn.execute("SELECT DISTINCT outbox_slice(entity_type, entity_id) FROM outbox")
        found = store.read(conn, {slice_[0]: Cursor()}, rs.bounds(2))
    assert [row[XID] for row in found.rows[slice_[0]]] == [99, 100]
    assert [named(row).seq for row in found.rows[slice_[0]]] == [3, 2]


@pytest.mark.parametrize("table", ["analysed", "not analysed", "grown after prepared"])
def test_a_read_takes_each_slice_from_the_index_in_order(outbox: PgSchema, table: str) -> None:
    """Reading 10 rows per slice from a 4,000-row outbox looks at about those rows only.

    Also before PostgreSQL has analysed the table, when its guess would sort every row,
    and with the read's plan made and kept while the table was empty.
    """
    from outbox_relay import store  # noqa: PLC0415
    from outbox_relay.frontier import Cursor  # noqa: PLC0415
    from outbox_relay.rows import XID  # noqa: PLC0415

    everything = {s: Cursor() for s in range(16)}
    with (
        outbox.connect(autocommit=True) as writer,
        store.connect(outbox.conninfo, reading=True) as conn,
    ):
        if table == "grown after prepared":
            for _ in range(8):  # past the custom plans: the generic one is kept from here on
                store.read(conn, everything, rs.bounds(10))
        for chunk in range(8):
            with writer.transaction():
                emit_many(writer, [_event("t", f"e{chunk}-{n}") for n in range(500)])
        if table == "analysed":
            writer.execute("ANALYZE outbox")
        with conn.transaction():
            found = store.read(conn, everything, rs.bounds(10))
            row = conn.execute(
                "SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables "
                "WHERE relid = 'outbox'::regclass"
            ).fetchone()
    assert sorted(len(rows) for rows in found.rows.values()) == [10] * 16
    assert all(rows == sorted(rows, key=lambda r: (r[XID], r[0])) for rows in found.rows.values())
    assert row is not None
    assert row[0] <= 16 * 12


def test_the_reader_reconnects_after_its_connection_is_cut(outbox: PgSchema) -> None:
    """A read whose connection was terminated fails; the next read opens a new one."""
    import psycopg  # noqa: PLC0415
    from psycopg.conninfo import make_conninfo  # noqa: PLC0415

    from outbox_relay.frontier import Cursor  # noqa: PLC0415
    from outbox_relay.reading import Reader  # noqa: PLC0415

    reader = Reader(make_conninfo(outbox.conninfo, application_name="reader-under-test"))
    try:
        with outbox.connect(autocommit=True) as conn:
            with conn.transaction():
                emit(conn, _event("t", "cut"))
            cursors = {s: Cursor() for s in range(16)}
            assert _rows_in(reader.read(cursors, rs.bounds(10))) == 1
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'reader-under-test'"
            )
            with pytest.raises(psycopg.OperationalError):
                reader.read(cursors, rs.bounds(10))
            assert _rows_in(reader.read(cursors, rs.bounds(10))) == 1
    finally:
        reader.close()


def test_a_read_ahead_serves_only_the_cursors_it_was_started_from(outbox: PgSchema) -> None:
    """``take`` returns the read started ahead from the same cursors, and reads anew otherwise."""
    from outbox_relay.frontier import Cursor  # noqa: PLC0415
    from outbox_relay.reading import Reader  # noqa: PLC0415

    reader = Reader(outbox.conninfo)
    everything = {s: Cursor() for s in range(16)}
    try:
        with outbox.connect(autocommit=True) as conn:
            with conn.transaction():
                emit(conn, _event("t", "before"))
            early = reader.ahead(everything, rs.bounds(10)).result()
            with conn.transaction():
                emit(conn, _event("t", "after"))
            half = {s: everything[s] for s in range(8)}
            assert reader.take(half, rs.bounds(10)) is early  # the read ahead covers more: still it
            assert _rows_in(early) == 1
            reader.ahead(everything, rs.bounds(10)).result()
            moved = everything | {0: Cursor(xid=1, id=1)}
            assert _rows_in(reader.take(moved, rs.bounds(10))) == 2  # other cursors: read again
            reader.ahead(everything, rs.bounds(10)).result()
            assert _rows_in(reader.take(everything, rs.bounds(5))) == 2  # other bounds: read again
            assert _rows_in(reader.take(everything, rs.bounds(10))) == 2  # nothing ahead: read now
    finally:
        reader.close()


def test_the_lease_heartbeat_is_one_round_trip(outbox: PgSchema, tmp_path: Path) -> None:
    """Renewing a relay's leases and looking at who holds what is one Sync, not five round trips."""
    from outbox_relay import leases  # noqa: PLC0415

    with outbox.connect(autocommit=True) as conn:
        leases.take(conn, "relay-a", [0, 1, 2], 10)
        leases.take(conn, "relay-b", [3], 10)
        conn.execute("UPDATE outbox_relay_slices SET owner = 'relay-b' WHERE slice = 1")
        lines, (held, seen) = libpq.traced(
            conn, tmp_path / "trace", lambda: leases.heartbeat(conn, "relay-a", [0, 1, 2], 10)
        )
        lease_left = conn.execute(
            "SELECT bool_and(lease_until > now() + interval '9 s') FROM outbox_relay_slices"
            " WHERE slice IN (0, 2)"
        ).fetchone()
    assert libpq.sent(lines).count("Sync") == 1
    assert held == {0, 2}
    assert lease_left == (True,)
    assert seen.live == ["relay-a"]
    assert seen.owned == {0, 2}
    assert seen.available == set(range(4, 16))
    assert seen.slices == 16
