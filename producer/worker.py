"""An example batch worker: takes work items, finishes them out of order, reports via the outbox.

Each poll's items get a random finishing delay, so results come back in an order
unrelated to position, as real parallel workers' do. A result is written to the
outbox in its own transaction; its identity is the work item's (position and
attempt), so a work item seen twice after a restart is reported once.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
import structlog
from confluent_kafka import Message
from pydantic import Field

from schemas import DEFAULT_TOPICS, DecodeError, PayloadError, decode
from schemas.batches import STREAM, WORK_ITEM, WorkItem, result_event
from schemas.errors import DuplicateEventError
from schemas.outbox import emit
from schemas.runtime import kafka_clients, postgres
from schemas.runtime.causes import Cause, cause
from schemas.runtime.config import LoggingSettings
from schemas.runtime.kafka_settings import KafkaClientSettings
from schemas.runtime.logs import first_line
from schemas.runtime.payloads import default_payload_schemas
from schemas.runtime.urls import PostgresUrl

log = structlog.get_logger(__name__)


class WorkerSettings(KafkaClientSettings, LoggingSettings):
    """Where the example worker reads items and writes results."""

    database_url: PostgresUrl
    work_topic: str = Field(
        default=DEFAULT_TOPICS.batch_work, min_length=1, description="Work items to take"
    )
    events_topic: str = Field(
        default=DEFAULT_TOPICS.events,
        min_length=1,
        description="The topic the consumer's batch route reads (written into each result's "
        "outbox row)",
    )
    group_id: str = Field(default="inorder-worker", description="The workers' consumer group")
    batch_stream: str = Field(default=STREAM, description="entity_type of the batch manifests")


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """How the example worker behaves: delays, and which items fail."""

    max_delay_ms: int = 200
    fail_rate: float = 0.0
    # Of the failures, the share whose outcome is uncertain (as after a time-out).
    uncertain_share: float = 0.0
    # Item keys whose first attempt fails for sure (to show a retry).
    fail_first: frozenset[str] = field(default_factory=frozenset)
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class Finish:
    """When (seconds from now) and how one item finishes."""

    after_s: float
    item: WorkItem
    error: str | None = None
    uncertain: bool = False


def plan_finishes(items: Sequence[WorkItem], plan: WorkerPlan, rng: random.Random) -> list[Finish]:
    """Each item's delay and outcome, in the order they finish (pure, given ``rng``)."""
    finishes = []
    for item in items:
        after = rng.uniform(0, plan.max_delay_ms / 1000)
        if item.attempt == 1 and item.item_key in plan.fail_first:
            finishes.append(Finish(after, item, "failed on purpose (first attempt)"))
        elif rng.random() < plan.fail_rate:
            uncertain = rng.random() < plan.uncertain_share
            error = "timed out; the write may have happened" if uncertain else "input rejected"
            finishes.append(Finish(after, item, error, uncertain))
        else:
            finishes.append(Finish(after, item))
    return sorted(finishes, key=lambda f: f.after_s)


def work_item(message: Message) -> WorkItem | None:
    """The work item a message carries, or None for anything else."""
    try:
        event = decode(message.value())
    except DecodeError as exc:
        log.warning("work_item_unreadable", reason=exc.reason, offset=message.offset())
        return None
    if event.event_type != WORK_ITEM:
        return None
    try:
        default_payload_schemas().validate(WORK_ITEM, event.payload)
    except PayloadError as exc:
        log.warning("work_item_unreadable", reason="payload_schema", detail=exc.detail[:300])
        return None
    p = event.payload
    return WorkItem(
        p["batch_id"],
        p["position"],
        p["item_key"],
        event.seq,
        p.get("input") or {},
        event.generation,
    )


class Worker:
    """Consumes work items until ``stop``; commits a poll's offsets once all its results are in."""

    def __init__(self, settings: WorkerSettings, plan: WorkerPlan) -> None:
        self.settings = settings
        self.plan = plan
        self.rng = random.Random(plan.seed)  # noqa: S311 (simulated delays, not security)
        self.reported = 0
        self._stopping = False

    def stop(self) -> None:
        """Finish the items in hand, then return from ``run``."""
        self._stopping = True

    def run(self) -> None:
        """Work until ``stop``."""
        consumer = kafka_clients.consumer(self.settings, "inorder-worker", self.settings.group_id)
        consumer.subscribe([self.settings.work_topic])
        try:
            with postgres.connect(
                self.settings.database_url, "inorder-worker", autocommit=False
            ) as conn:
                while not self._stopping:
                    messages = [m for m in consumer.consume(100, 0.2) if m.error() is None]
                    if messages:
                        self.handle(conn, messages)
                        consumer.commit(asynchronous=False)
        finally:
            consumer.close()

    def handle(self, conn: psycopg.Connection[Any], messages: Sequence[Message]) -> None:
        """Finish every item of one poll, each after its delay, and report it."""
        items = [i for i in map(work_item, messages) if i is not None]
        started = time.monotonic()
        for finish in plan_finishes(items, self.plan, self.rng):
            time.sleep(max(0.0, started + finish.after_s - time.monotonic()))
            try:
                self._report(conn, finish)
            except Exception as exc:  # the barrier: one item's result refused, the rest go on
                if cause(exc) is not Cause.INPUT:
                    raise
                log.error(  # noqa: TRY400 - expected bad input; a traceback adds nothing
                    "work_result_refused", batch=finish.item.batch_id, error=first_line(exc)
                )

    def _report(self, conn: psycopg.Connection[Any], finish: Finish) -> None:
        item = finish.item
        done_at = datetime.now(UTC).isoformat()
        event = result_event(
            item,
            result_ref=None if finish.error else f"results/{item.batch_id}/{item.item_key}",
            error=finish.error,
            outcome_uncertain=finish.uncertain,
            finished_at=done_at,
            stream=self.settings.batch_stream,
            topic=self.settings.events_topic,
        )
        try:
            with conn.transaction():
                emit(conn, event)
        except DuplicateEventError:
            return  # reported before a restart
        self.reported += 1
