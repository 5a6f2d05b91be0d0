"""Debezium beside the local stack: its Kafka Connect worker's REST API, and one outbox
connector per test, removed with its replication slot and publication afterwards."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from tests.support.docs import DEBEZIUM, example

WAIT_S = 60


class Connect:
    """A Kafka Connect worker, by its REST address."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    @classmethod
    def local(cls) -> Connect:
        """The local stack's worker (``stack up debezium``), at INORDER_CONNECT_PORT."""
        return cls(f"http://127.0.0.1:{os.environ.get('INORDER_CONNECT_PORT', '18083')}")

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One REST call; its JSON answer (None when it has none)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - the local worker's http address
            self.url + path, data, {"Content-Type": "application/json"}, method=method
        )
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
            text = answer.read()
        return json.loads(text) if text else None

    def state(self, name: str) -> tuple[str, list[str]]:
        """The connector's state and its tasks' (with a task's error, if failed)."""
        status = self.call("GET", f"/connectors/{name}/status")
        tasks = [f"{t['state']} {t.get('trace', '')[:400]}".strip() for t in status["tasks"]]
        return status["connector"]["state"], tasks

    def wait_running(self, name: str) -> None:
        """Until the connector and its task run; AssertionError with the task's error."""
        deadline = time.monotonic() + WAIT_S
        state: tuple[str, list[str]] = ("", [])
        while time.monotonic() < deadline:
            with suppress(urllib.error.HTTPError):  # not there yet
                state = self.state(name)
            if state[0] == "RUNNING" and state[1] and all(t == "RUNNING" for t in state[1]):
                return
            if any(t.startswith("FAILED") for t in state[1]):
                break
            time.sleep(0.5)
        raise AssertionError(f"connector {name} is not running: {state}")


def documented_config() -> dict[str, str]:
    """The connector as the Debezium page shows it (its table, converters and router)."""
    return dict(json.loads(example("debezium-connector", DEBEZIUM)))


def documented_settings() -> dict[str, str]:
    """The INORDER_* settings the Debezium page shows, by name."""
    found = {}
    for line in example("debezium-settings", DEBEZIUM).splitlines():
        name, _, value = line.split("#")[0].strip().partition("=")
        if name:
            found[name] = value.strip().strip("'")
    return found


def outbox_config(
    database_url: str, schema: str, name: str, replacement: str, **extra: str
) -> dict[str, str]:
    """The documented connector on this database's schema, under names of its own.

    Only changes from the connector's start are sent (``snapshot.mode`` ``no_data``):
    rows written before it are, to Kafka, never written.
    """
    db = conninfo_to_dict(database_url)
    config = documented_config()
    table = config["table.include.list"].rpartition(".")[2]
    return {
        **config,
        "database.hostname": str(db.get("host", "127.0.0.1")),
        "database.port": str(db.get("port", 5432)),
        "database.user": str(db.get("user", "")),
        "database.password": str(db.get("password", "")),
        "database.dbname": str(db.get("dbname", "")),
        "topic.prefix": name,
        "table.include.list": f"{schema}.{table}",
        "slot.name": name,
        "publication.name": name,
        "publication.autocreate.mode": "filtered",
        "snapshot.mode": "no_data",
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "3",
        "transforms.outbox.route.topic.replacement": replacement,
        **extra,
    }


@contextmanager
def outbox_connector(connect: Connect, database_url: str, config: dict[str, str]) -> Iterator[str]:
    """The connector added and running for the block; then removed, its slot dropped."""
    name = config["slot.name"]
    connect.call("POST", "/connectors", {"name": name, "config": config})
    try:
        connect.wait_running(name)
        yield name
    finally:
        connect.call("DELETE", f"/connectors/{name}")
        _drop_slot(database_url, name)


def _drop_slot(database_url: str, name: str) -> None:
    """Drop the connector's slot (once its walsender lets go) and its publication."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (name,)
            ).fetchone()
            if row is None:
                break
            if not row[0]:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
                break
            time.sleep(0.5)
        conn.execute(f'DROP PUBLICATION IF EXISTS "{name}"')
