"""Batches through the outbox: the manifest, the work items, and the workers' results.

A batch is three entity streams named after the batch route's stream (``batch`` by
default):

- ``batch``: one entity per batch (entity_id = batch_id). seq 1 is ``batch.accepted``,
  which carries the manifest; seq 2, 3, ... are the consumer's ``batch.assembled``
  revisions.
- ``batch_item``: one entity per position (entity_id = ``batch_id#position``); seq is
  the attempt, so a re-dispatched item is a new event of the same entity.
- ``batch_result``: the worker's answer for one attempt of one position, with the
  same entity_id and seq as the work item it answers.

``create_batch`` writes the manifest and every work item in the caller's transaction,
so no worker can see an item of a batch whose manifest is not committed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from schemas import DEFAULT_TOPICS
from schemas.errors import InvalidEventError
from schemas.outbox import OutboxEvent, emit_many

STREAM = "batch"
ACCEPTED = "batch.accepted"
WORK_ITEM = "batch.work_item"
SUCCEEDED = "batch.item_succeeded"
FAILED = "batch.item_failed"
ASSEMBLED = "batch.assembled"
# So that ``batch_id#position`` stays within the envelope's 256-character entity_id.
MAX_BATCH_ID = 240


class OnIncomplete(enum.StrEnum):
    """What a batch with missing positions does (``batch.accepted``'s ``on_incomplete``)."""

    ASSEMBLE_INCOMPLETE = "assemble_incomplete"
    HOLD = "hold"


class BatchStatus(enum.StrEnum):
    """Where one batch stands (``inorder_batches.status``)."""

    WAITING = "waiting"
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    HELD = "held"
    INCONSISTENT = "inconsistent"
    HALTED = "halted"


class ItemState(enum.StrEnum):
    """Where one position stands (``inorder_batch_items.state``)."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"
    ABANDONED = "abandoned"
    NEEDS_REVIEW = "needs_review"


class Action(enum.StrEnum):
    """A person's decision about a batch (``inorder_batch_actions.action``)."""

    RELEASE_INCOMPLETE = "release_incomplete"
    CONFIRMED_APPLIED = "confirmed_applied"
    RETRIED = "retried"


def item_stream(stream: str) -> str:
    """The entity stream of a batch stream's work items."""
    return f"{stream}_item"


def result_stream(stream: str) -> str:
    """The entity stream of a batch stream's worker results."""
    return f"{stream}_result"


def item_entity_id(batch_id: str, position: int) -> str:
    """The entity id of one position's work items and results."""
    return f"{batch_id}#{position}"


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One input item: its stable key and what the worker needs (opaque to inorder)."""

    item_key: str
    input: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One attempt at one position, as handed to a worker."""

    batch_id: str
    position: int
    item_key: str
    attempt: int
    input: Mapping[str, Any] = field(default_factory=dict)
    generation: int = 1


def work_item_event(
    item: WorkItem, *, stream: str = STREAM, topic: str = DEFAULT_TOPICS.batch_work
) -> OutboxEvent:
    """The outbox event that hands ``item`` to a worker."""
    payload: dict[str, Any] = {
        "batch_id": item.batch_id,
        "position": item.position,
        "item_key": item.item_key,
    }
    if item.input:
        payload["input"] = dict(item.input)
    return OutboxEvent(
        item_stream(stream),
        item_entity_id(item.batch_id, item.position),
        item.attempt,
        WORK_ITEM,
        payload,
        generation=item.generation,
        topic=topic,
    )


def result_event(
    item: WorkItem,
    *,
    result_ref: str | None = None,
    error: str | None = None,
    outcome_uncertain: bool = False,
    finished_at: str | None = None,
    stream: str = STREAM,
    topic: str = DEFAULT_TOPICS.events,
) -> OutboxEvent:
    """The worker's answer for ``item``: success with ``result_ref``, or failure with ``error``."""
    payload: dict[str, Any] = {
        "batch_id": item.batch_id,
        "position": item.position,
        "item_key": item.item_key,
    }
    if result_ref is not None:
        event_type, payload["result_ref"] = SUCCEEDED, result_ref
    else:
        event_type = FAILED
        payload["error"] = error or "failed"
        payload["outcome_uncertain"] = outcome_uncertain
    if finished_at is not None:
        payload["finished_at"] = finished_at
    return OutboxEvent(
        result_stream(stream),
        item_entity_id(item.batch_id, item.position),
        item.attempt,
        event_type,
        payload,
        generation=item.generation,
        topic=topic,
    )


@dataclass(frozen=True, slots=True)
class BatchTopics:
    """Where a batch's events go: its stream name, the consumer's topic, the workers' topic."""

    stream: str = STREAM
    topic: str = DEFAULT_TOPICS.events
    work_topic: str = DEFAULT_TOPICS.batch_work


def batch_events(
    batch_id: str,
    items: Sequence[BatchItem],
    *,
    deadline_s: int | None = None,
    on_incomplete: OnIncomplete | str | None = None,
    where: BatchTopics = BatchTopics(),
) -> list[OutboxEvent]:
    """A new batch's events: the manifest, then one work item per position 1..n (pure)."""
    if not batch_id or len(batch_id) > MAX_BATCH_ID:
        raise InvalidEventError(f"batch_id must be 1..{MAX_BATCH_ID} characters")
    work = [
        WorkItem(batch_id, position, item.item_key, 1, item.input)
        for position, item in enumerate(items, start=1)
    ]
    manifest: dict[str, Any] = {
        "expected_count": len(work),
        "items": [_manifest_entry(w) for w in work],
    }
    if deadline_s is not None:
        manifest["deadline_s"] = deadline_s
    if on_incomplete is not None:
        manifest["on_incomplete"] = str(on_incomplete)
    accepted = OutboxEvent(where.stream, batch_id, 1, ACCEPTED, manifest, topic=where.topic)
    return [
        accepted,
        *(work_item_event(w, stream=where.stream, topic=where.work_topic) for w in work),
    ]


def create_batch(
    conn: psycopg.Connection[Any],
    batch_id: str,
    items: Sequence[BatchItem],
    *,
    deadline_s: int | None = None,
    on_incomplete: OnIncomplete | str | None = None,
    where: BatchTopics = BatchTopics(),
) -> None:
    """Write a batch's manifest and its work items (positions 1..n) in the caller's transaction.

    Positions follow the order of ``items`` and are never reassigned. An empty batch is
    allowed: it is assembled at once as complete with no results.
    """
    emit_many(
        conn,
        batch_events(
            batch_id, items, deadline_s=deadline_s, on_incomplete=on_incomplete, where=where
        ),
    )


def _manifest_entry(item: WorkItem) -> dict[str, Any]:
    entry: dict[str, Any] = {"position": item.position, "item_key": item.item_key}
    if item.input:
        entry["input"] = dict(item.input)
    return entry
