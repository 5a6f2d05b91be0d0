"""The least-privilege matrix: every table the migrations make is granted, protocol topics
are written only by the programs the protocol names, and nobody may create."""

from __future__ import annotations

import re
from pathlib import Path

from schemas.security import (
    CONSUMER_TABLES,
    PRODUCER_COLUMNS,
    RELAY_TABLES,
    KafkaNames,
    Roles,
    kafka_acls,
    postgres_grants,
)

ROOT = Path(__file__).resolve().parents[2]
NAMES = KafkaNames(["ev"], "dlq", "held", "req", "res", "cg", "sg", "rg")


def _tables(folder: Path) -> set[str]:
    text = "\n".join(path.read_text() for path in sorted(folder.glob("*.sql")))
    return set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", text))


def test_every_consumer_table_the_migrations_make_is_granted() -> None:
    """A table added by a consumer migration without a grant would stop the consumers."""
    made = _tables(ROOT / "consumer" / "migrations")
    assert made == set(CONSUMER_TABLES)


def test_every_relay_table_of_the_outbox_migrations_is_granted() -> None:
    """The outbox's own tables: the outbox, the relay's bookkeeping, snapshot requests."""
    made = _tables(ROOT / "schemas" / "outbox" / "migrations")
    assert made == {"outbox", "outbox_snapshot_requests", "outbox_writers", *RELAY_TABLES}


def test_the_producer_inserts_only_its_own_columns() -> None:
    """Never the id, the transaction id, the relay's marks or failures."""
    grants = postgres_grants(Roles(), "s")
    [insert] = [g for g in grants if g.startswith("GRANT INSERT (")]
    assert insert.endswith("ON s.outbox TO inorder_producer")
    assert not {"id", "xid", "failed_at", "failure_reason", "published_at"} & set(PRODUCER_COLUMNS)
    assert not any("CREATE" in g or "ALL PRIVILEGES" in g for g in grants)
    assert not any("inorder_producer" in g and "UPDATE" in g and "outbox " in g for g in grants)


def test_protocol_topics_are_written_only_by_the_programs_the_protocol_names() -> None:
    """Results by the relay alone; requests by the sweeper and admin; nobody creates topics."""
    acls = kafka_acls(NAMES)
    writers = {
        topic: {a.principal for a in acls if a.name == topic and a.operation == "write"}
        for topic in ("res", "req", "ev", "dlq", "held")
    }
    assert writers["res"] == {NAMES.relay}
    assert writers["req"] == {NAMES.sweeper, NAMES.admin}
    assert writers["ev"] == {NAMES.relay, NAMES.admin}
    assert writers["held"] == {NAMES.consumer}
    assert not any(a.operation in ("create", "alter", "delete", "all") for a in acls)
    readers = {a.principal for a in acls if a.name == "res" and a.operation == "read"}
    assert readers == {NAMES.sweeper}


def test_without_batch_routes_only_the_producer_writes_the_outbox() -> None:
    """The consumers and a worker role get outbox inserts only when a batch route needs them."""
    plain = postgres_grants(Roles(), "s")
    assert not any("inorder_worker" in g for g in plain)
    [insert] = [g for g in plain if g.startswith("GRANT INSERT (")]
    assert insert.endswith("TO inorder_producer")
    batches = postgres_grants(Roles(), "s", batch_streams=["batch"])
    [insert] = [g for g in batches if g.startswith("GRANT INSERT (")]
    grantees = set(insert.split(" TO ")[1].split(", "))
    assert grantees == {
        "inorder_producer",
        "inorder_consumer",
        "inorder_sweeper",
        "inorder_admin",
        "inorder_worker",
    }
    assert any(g.endswith("outbox_id_seq TO " + insert.split(" TO ")[1]) for g in batches)
    worker = [g for g in batches if "inorder_worker" in g]
    assert not any("UPDATE" in g or "DELETE" in g or "SELECT, " in g for g in worker)


def test_the_relay_writes_every_topic_an_outbox_row_may_name_and_workers_only_read_work() -> None:
    """Events, batch outputs and work items are the relay's; a worker reads work, writes none."""
    names = KafkaNames(["ev"], "dlq", "held", "req", "res", "cg", "sg", "rg", ["out"], ["work"])
    acls = kafka_acls(names)
    relay_writes = {a.name for a in acls if a.principal == names.relay and a.operation == "write"}
    assert relay_writes == {"ev", "out", "work", "res"}
    worker = {(a.resource, a.name, a.operation) for a in acls if a.principal == names.worker}
    assert worker == {
        ("topic", "work", "read"),
        ("topic", "work", "describe"),
        ("group", "inorder-worker", "read"),
    }
    assert not any(a.principal == names.worker for a in kafka_acls(NAMES))
    readers = {a.principal for a in acls if a.name == "out" and a.operation == "read"}
    assert readers == set()
