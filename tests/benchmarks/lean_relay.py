"""The least a relay woken by NOTIFY can do: the relay benchmark's latency yardstick.

``python -m tests.benchmarks.lean_relay DATABASE_URL BOOTSTRAP TOPIC`` listens on the
outbox channel and, on each notification, reads the rows with an id past the last one
it saw on that same connection and produces each row's event id (keyed by entity) to
``TOPIC`` with the relay's delivery settings, then waits for Kafka to acknowledge them.
It prints ``ready`` once it listens and runs until SIGTERM.

It keeps no cursor, takes no lease, builds no envelope and does not order by
transaction: a row committed after a row with a higher id is skipped. That is wrong for
a relay and harmless with the one writing session the benchmark runs, and it makes
this chain a lower bound: every step it takes, from the commit's wake-up to the append,
a correct relay takes too. Run beside the relay on the same commits, it shows how much
of the relay's delay the machine imposes on any relay at that moment.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

import psycopg
from confluent_kafka import Producer

from outbox_relay.service import NOTIFY_CHANNEL

WAIT_S = 0.2


def main(url: str, bootstrap: str, topic: str) -> None:
    """Relay the outbox's new rows to ``topic`` until SIGTERM."""
    stopping = False

    def stop(_signal: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 0,
            "compression.type": "lz4",
        }
    )
    producer.list_topics(topic, timeout=10)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        found = conn.execute("SELECT coalesce(max(id), 0) FROM outbox").fetchone()
        last = found[0] if found else 0
        print("ready", flush=True)
        while not stopping:
            for _ in conn.notifies(timeout=WAIT_S, stop_after=1):
                pass
            rows = conn.execute(
                "SELECT id, event_id::text, entity_id FROM outbox WHERE id > %s ORDER BY id",
                (last,),
            ).fetchall()
            for _, event_id, entity_id in rows:
                producer.produce(topic, event_id.encode(), entity_id.encode())
            if rows:
                last = rows[-1][0]
                producer.flush(10)


if __name__ == "__main__":
    main(*sys.argv[1:4])
