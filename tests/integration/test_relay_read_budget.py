"""The relay's byte budget against real PostgreSQL and Kafka: reads load no more, skip nothing.

Rows are written by SQL, as a producer writing through its own ORM would, with payloads
of a chosen size (a type made up for the tests, whose schema takes any object).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Producer

import schemas
from outbox_relay import resend, store
from outbox_relay.frontier import Cursor, advance
from outbox_relay.rows import ID, XID, Row, named
from outbox_relay.weighing import unmarked
from schemas.republish import RepublishRequest, RepublishResult, decode_result, encode
from tests.conftest import PgSchema
from tests.integration import relay_support as rs
from tests.support.kafka import drain, wait_until
from tests.support.services import Services

_EVERYTHING = {s: Cursor() for s in range(16)}


def _insert(conn: psycopg.Connection[Any], topic: str, entity: str, seqs: range, pad: int) -> None:
    """Rows of one entity, one per seq, each payload ``pad`` characters and a little more."""
    conn.execute(
        "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, payload)"
        " SELECT %(topic)s, 'doc', %(entity)s, s, 'doc.written', %(entity)s || '-' || s,"
        "        jsonb_build_object('pad', repeat('x', %(pad)s))"
        "   FROM generate_series(%(first)s::bigint, %(last)s::bigint) s",
        {"topic": topic, "entity": entity, "pad": pad, "first": seqs[0], "last": seqs[-1]},
    )


def _payload_bytes(rows: list[Row]) -> int:
    payloads = (named(row).payload for row in rows)
    return sum(len(payload.encode()) for payload in payloads if payload is not None)


def _rows_per_slice(conn: psycopg.Connection[Any]) -> dict[int, int]:
    found = conn.execute(
        "SELECT outbox_slice(entity_type, entity_id), count(*) FROM outbox GROUP BY 1"
    )
    return dict(found.fetchall())


def test_a_read_loads_at_most_its_budget_and_names_the_slices_it_cut(outbox: PgSchema) -> None:
    """3 MB of 10 KB rows over 16 slices, a 200 KB budget: under 200 KB loaded, cut slices named."""
    with outbox.connect(autocommit=True) as conn:
        for n in range(64):
            _insert(conn, "t", f"e{n}", range(1, 6), 10_000)
        counts = _rows_per_slice(conn)
        with store.connect(outbox.conninfo, reading=True) as reader:
            found = store.read(reader, _EVERYTHING, rs.bounds(500, 200_000))
    loaded = [row for rows in found.rows.values() for row in rows]
    assert _payload_bytes(loaded) <= 200_000
    assert loaded, "every slice takes at least its first row"
    assert found.cut == {s for s, n in counts.items() if len(found.rows.get(s, [])) < n}
    assert found.cut == set(counts)


def test_a_row_larger_than_its_share_is_read_alone_so_its_slice_still_moves(
    outbox: PgSchema,
) -> None:
    """A 100 KB row against a 4 KB share of the budget: the read takes it, alone, and cuts there."""
    with outbox.connect(autocommit=True) as conn:
        _insert(conn, "t", "big", range(1, 4), 100_000)
        [(slice_,)] = conn.execute("SELECT DISTINCT outbox_slice('doc', 'big')").fetchall()
        with store.connect(outbox.conninfo, reading=True) as reader:
            found = store.read(reader, _EVERYTHING, rs.bounds(500, 64_000))
    assert [named(row).seq for row in found.rows[slice_]] == [1]
    assert found.cut == {slice_}


def test_a_row_longer_than_any_message_is_not_loaded(outbox: PgSchema) -> None:
    """A row whose text is over the largest message comes without its payload; the next one with."""
    with outbox.connect(autocommit=True) as conn:
        _insert(conn, "t", "huge", range(1, 2), 300_000)
        _insert(conn, "t", "huge", range(2, 3), 1_000)
        with store.connect(outbox.conninfo, reading=True) as reader:
            found = store.read(reader, _EVERYTHING, rs.bounds(500, 2**30, row_bytes=100_000))
    [rows] = found.rows.values()
    assert [(named(row).seq, named(row).payload is None) for row in rows] == [(1, True), (2, False)]
    assert not found.cut


def test_budgeted_reads_past_open_and_late_transactions_take_every_row_once(
    outbox: PgSchema,
) -> None:
    """Reads cut by bytes at every row, a transaction open across them: each row read once."""
    seen: list[tuple[int, int]] = []
    cursors = dict(_EVERYTHING)
    bounds = rs.bounds(7, 16 * 6_000)  # a share of about one 5 KB row per part

    def read_all(reader: psycopg.Connection[Any]) -> None:
        while True:
            found = store.read(reader, cursors, bounds)
            for slice_, cursor in list(cursors.items()):
                rows = found.rows.get(slice_, [])[: bounds.rows]
                taken = [(row[XID], row[ID]) for row in rows]
                cut = len(rows) >= bounds.rows or slice_ in found.cut
                cursors[slice_] = advance(cursor, found.snapshot, taken, cut)
                seen.extend(taken)
            if not found.rows:
                return

    with (
        outbox.connect(autocommit=True) as writer,
        outbox.connect() as long,
        store.connect(outbox.conninfo, reading=True) as reader,
    ):
        _insert(long, "t", "late", range(1, 13), 5_000)  # open: its xid is below what follows
        for n in range(64):  # rows in every slice, the open transaction's own among them
            _insert(writer, "t", f"early{n}", range(1, 3), 5_000)
        read_all(reader)
        [(late,)] = writer.execute("SELECT outbox_slice('doc', 'late')").fetchall()
        assert cursors[late].running, "the open transaction is remembered behind the cursor"
        long.commit()
        for n in range(12):
            _insert(writer, "t", f"after{n}", range(1, 4), 5_000)
        read_all(reader)
        read_all(reader)
        everything = writer.execute("SELECT xid::text::bigint, id FROM outbox").fetchall()
    assert Counter(seen) == Counter(everything)
    assert not any(c.running for c in cursors.values())


def test_the_relay_sends_every_row_once_in_order_within_a_small_budget(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """640 KB of rows through 64 KB reads: each sent once in seq order; an oversized row fails."""
    with outbox.connect(autocommit=True) as conn:
        for n in range(10):
            _insert(conn, topics.events, f"d{n}", range(1, 9), 8_000)
        _insert(conn, topics.events, "d0", range(9, 10), 70_000)
        _insert(conn, topics.events, "d0", range(10, 11), 100)
    settings = rs.settings_for(
        outbox,
        services.kafka_bootstrap,
        topics,
        read_bytes=64 * 1024,
        max_message_bytes=50_000,
    )
    with rs.running(settings):
        wait_until(lambda: rs.unsent(outbox) == 0)
    with outbox.connect() as conn:
        failed = conn.execute(
            "SELECT entity_id, seq, failure_reason FROM outbox WHERE failed_at IS NOT NULL"
        ).fetchall()
    assert [(e, s, r.split(":")[0]) for e, s, r in failed] == [("d0", 9, "too_large")]
    order: dict[str, list[int]] = defaultdict(list)
    for message in drain(services.kafka_bootstrap, topics.events, expect=81):
        event = schemas.decode(message.value())
        order[event.entity_id].append(event.seq)
    assert order == {f"d{n}": list(range(1, 9)) + ([10] if n == 0 else []) for n in range(10)}


def test_a_republish_answer_covers_what_the_budget_holds_and_the_rest_is_asked_again(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """20 rows of 10 KB, a 64 KB budget: each answer covers a prefix, no seq called missing."""
    with outbox.connect(autocommit=True) as conn:
        _insert(conn, topics.events, "r", range(1, 21), 10_000)
        conn.execute("UPDATE outbox SET failed_at = now(), failure_reason = 'x' WHERE seq = 18")
    settings = rs.settings_for(
        outbox, services.kafka_bootstrap, topics, read_bytes=64 * 1024, republish_cooldown_s=0
    )
    answers: list[RepublishResult] = []
    with rs.running(settings):
        wait_until(lambda: rs.unsent(outbox) == 0)
        producer = Producer({"bootstrap.servers": services.kafka_bootstrap})
        first = 1
        for n in range(20):
            request = RepublishRequest(f"q{n}", "doc", "r", 1, first, 20, "gap")
            producer.produce(topics.requests, encode(request), request.key)
            assert producer.flush(30) == 0
            [*_, message] = drain(services.kafka_bootstrap, topics.results, expect=n + 1)
            answers.append(decode_result(message.value()))
            if answers[-1].to_seq == 20:
                break
            first = answers[-1].to_seq + 1
    assert len(answers) > 1
    assert answers[0].to_seq < 20
    covered = [seq for a in answers for seq in range(a.from_seq, a.to_seq + 1)]
    assert covered == list(range(1, 21))
    assert [seq for a in answers for seq in a.resent] == [s for s in range(1, 21) if s != 18]
    assert [seq for a in answers for seq in a.failed] == [18]
    assert not any(a.missing for a in answers)


def test_a_claim_of_listed_rows_loads_at_most_the_budget_and_the_rest_follow(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """20 listed rows of 10 KB: one claim holds under 64 KB; the relay sends all of them again."""
    with outbox.connect(autocommit=True) as conn:
        _insert(conn, topics.events, "l", range(1, 21), 10_000)
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics, read_bytes=64 * 1024)
    with rs.running(settings):
        wait_until(lambda: rs.unsent(outbox) == 0)
    with outbox.connect() as conn:
        conn.execute("INSERT INTO outbox_resend SELECT id FROM outbox")
        params = rs.bounds(500, 64 * 1024).params()
        claimed, cut = unmarked(conn.execute(resend._CLAIM, params).fetchall())
        conn.rollback()
        conn.execute("INSERT INTO outbox_resend SELECT id FROM outbox")
        conn.commit()
    assert 0 < len(claimed) < 20
    assert cut
    assert _payload_bytes(claimed) <= 64 * 1024
    with rs.running(settings):
        wait_until(lambda: rs.count_rows(outbox, "id IN (SELECT id FROM outbox_resend)") == 0)
    seqs = Counter(
        schemas.decode(m.value()).seq
        for m in drain(services.kafka_bootstrap, topics.events, expect=40)
    )
    assert seqs == Counter(dict.fromkeys(range(1, 21), 2))


def test_a_row_whose_headers_are_longer_than_any_message_loads_neither(outbox: PgSchema) -> None:
    """Rows written before the size check with 2 MB of headers: read without payload or headers."""
    with outbox.connect(autocommit=True) as conn:
        for seq in range(1, 6):
            _insert(conn, "t", "wide", range(seq, seq + 1), 10)
        conn.execute(  # as rows written before the size rule hold them
            "UPDATE outbox SET headers = jsonb_build_object('big', repeat(id::text, 1000000)) "
            "WHERE seq < 5"
        )
        with store.connect(outbox.conninfo, reading=True) as reader:
            found = store.read(reader, _EVERYTHING, rs.bounds(500, 2**30, row_bytes=100_000))
    [rows] = found.rows.values()
    assert [(named(r).seq, named(r).payload, named(r).headers) for r in rows[:4]] == [
        (seq, None, None) for seq in range(1, 5)
    ]
    assert named(rows[4]).payload is not None


def test_rows_of_ten_megabytes_stay_within_the_relays_shipped_memory_limit(
    outbox: PgSchema, topics: rs.RelayTopics, services: Services, tmp_path: Path
) -> None:
    """40 rows of 10 MB headers (written before their check) and 40 of 10 MB payloads, then a
    valid row: each failed too_large, the valid one sent, the relay's VmHWM under 512 MiB."""
    with outbox.connect() as conn:  # one transaction: no row is sent before it is changed
        for n in range(40):
            _insert(conn, topics.events, f"wide-{n}", range(1, 2), 10)
        conn.execute(  # as rows written before the size rule hold them
            "UPDATE outbox SET headers = jsonb_build_object('h', repeat('y', 10000000))"
        )
        for n in range(40):
            _insert(conn, topics.events, f"big-{n}", range(1, 2), 10_000_000)
        _insert(conn, topics.events, "light", range(1, 2), 10)
        conn.commit()
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics)
    process = rs.spawn(rs.relay_env(settings), tmp_path / "relay.log")
    try:
        light = "entity_id = 'light' AND " + rs.SENT
        wait_until(lambda: rs.count_rows(outbox, light) == 1, timeout_s=180)
        wait_until(lambda: rs.count_rows(outbox, "failed_at IS NOT NULL") == 80, timeout_s=60)
        status = Path(f"/proc/{process.pid}/status").read_text()
    finally:
        process.terminate()
        process.wait(30)
    sent = drain(services.kafka_bootstrap, topics.events, expect=1)
    assert [schemas.decode(m.value()).entity_id for m in sent] == ["light"]
    reasons = rs.count_rows(outbox, "failure_reason LIKE 'too_large:%'")
    peak_kib = next(
        int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM")
    )
    print(f"relay peak RSS {peak_kib // 1024} MiB")
    assert reasons == 80
    assert peak_kib < 512 * 1024, f"peak RSS {peak_kib // 1024} MiB"
