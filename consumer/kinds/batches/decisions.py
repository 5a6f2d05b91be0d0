"""Batch reassembly decisions, pure: judge one worker result, pick a batch's branch, assemble.

Position is the only order. ``finished_at`` is kept for people and never compared.
A batch is in exactly one of four branches at any time:

1. every position 1..expected_count is done           -> assemble in position order;
2. some position is still pending                     -> wait;
3. none pending, some failed/abandoned/needs_review   -> assemble marked incomplete with
   the missing positions listed, or hold for a person (per batch, chosen at creation);
4. the manifest or a result contradicts itself        -> stop and flag inconsistent.
"""

from __future__ import annotations

import enum
import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

import orjson

from schemas.batches import MAX_BATCH_ID, BatchStatus, ItemState, OnIncomplete
from schemas.codec import field_limit

# The envelope's longest event id.
MAX_EVENT_ID = field_limit("event_id", "maxLength")

# Nothing more happens to a batch in these until a person looks.
STOPPED = (BatchStatus.INCONSISTENT, BatchStatus.HALTED)
Key = tuple[str, int]  # batch_id, position


class Branch(enum.StrEnum):
    """What a batch does next."""

    ASSEMBLE = "assemble"
    WAIT = "wait"
    INCOMPLETE = OnIncomplete.ASSEMBLE_INCOMPLETE.value
    HOLD = "hold"
    INCONSISTENT = "inconsistent"


class Verdict(enum.StrEnum):
    """What one worker result does to its position."""

    DONE = "done"
    FAILED = "failed"
    RETRY = "retry"  # a certain failure with retries left: dispatched again
    REVIEW = "needs_review"  # an uncertain failure: a person decides
    DUPLICATE = "duplicate"  # the same answer again: ignored
    STALE = "stale"  # an answer to an attempt already superseded: ignored
    INCONSISTENT = "inconsistent"


@dataclass(frozen=True, slots=True)
class Item:
    """One manifest row."""

    position: int
    item_key: str
    state: str = ItemState.PENDING
    result_ref: str | None = None
    attempts: int = 1
    error: str | None = None
    finished_at: str | None = None


@dataclass(frozen=True, slots=True)
class Result:
    """A worker's answer for one attempt at one position."""

    batch_id: str
    position: int
    item_key: str
    attempt: int
    succeeded: bool
    result_ref: str | None = None
    error: str | None = None
    uncertain: bool = False
    finished_at: str | None = None

    @classmethod
    def from_payload(cls, attempt: int, succeeded: bool, payload: Mapping[str, Any]) -> Result:
        """The result an item_succeeded or item_failed payload (already validated) reports."""
        return cls(
            payload["batch_id"],
            payload["position"],
            payload["item_key"],
            attempt,
            succeeded,
            payload.get("result_ref"),
            payload.get("error"),
            bool(payload.get("outcome_uncertain", False)),
            payload.get("finished_at"),
        )


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch's row."""

    batch_id: str
    generation: int
    expected_count: int
    digest: str
    on_incomplete: str
    status: str
    revision: int
    deadline_s: int

    @property
    def stopped(self) -> bool:
        """Inconsistent or halted: nothing more happens until a person looks."""
        return self.status in STOPPED


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a batch.accepted event asks to store."""

    batch_id: str
    generation: int
    expected_count: int
    items: Sequence[tuple[int, str, Any]]  # position, item_key, input
    on_incomplete: str
    deadline_s: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a transaction read under its batches' locks, before deciding anything."""

    batches: Mapping[str, Batch]
    rows: Mapping[Key, Item] = field(default_factory=dict)  # the positions results name
    inputs: Mapping[Key, Any] = field(default_factory=dict)  # their stored worker input
    counts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # state -> how many
    early: Sequence[Result] = ()  # results kept for the manifests now arriving, taken


@dataclass(frozen=True, slots=True)
class Judged:
    """A result's verdict, the row it leaves (unchanged when ignored), and why."""

    verdict: Verdict
    item: Item | None
    reason: str = ""

    @property
    def changed(self) -> bool:
        """Whether the row must be written."""
        return self.verdict in (Verdict.DONE, Verdict.FAILED, Verdict.RETRY, Verdict.REVIEW)


def batch_id_problem(stream: str, batch_id: str, generation: int) -> str | None:
    """Why a batch id cannot name its batch's outputs, or None.

    Its work items are ``batch_id#position`` (``MAX_BATCH_ID`` leaves room for any
    position) and its assemblies have the event id ``stream:batch_id:generation:revision``:
    both must fit the envelope's event and entity ids, with room for a billion revisions.
    """
    if len(batch_id) > MAX_BATCH_ID:
        return f"batch_id is {len(batch_id)} characters, over {MAX_BATCH_ID}"
    room = MAX_EVENT_ID - len(f"{stream}::{generation}:{10**9}")
    if len(batch_id) > room:
        return f"batch_id is {len(batch_id)} characters: its outputs' event ids leave {room}"
    return None


def manifest_problem(expected_count: int, items: Sequence[tuple[int, str]]) -> str | None:
    """Why a manifest cannot be used (duplicate or out-of-range positions), or None."""
    counts = Counter(position for position, _ in items)
    duplicates = sorted(p for p, n in counts.items() if n > 1)
    if duplicates:
        return f"duplicate positions in the manifest: {duplicates[:10]}"
    above = sorted(p for p in counts if p > expected_count or p < 1)
    if above:
        return f"positions outside 1..{expected_count} in the manifest: {above[:10]}"
    if len(counts) != expected_count:
        # The first ten gaps only: a count of 2^31 with a few items must not build 2^31 of them.
        missing = islice((p for p in range(1, expected_count + 1) if p not in counts), 10)
        return f"the manifest has no item for positions {list(missing)}"
    return None


def digest(batch_id: str, expected_count: int, items: Iterable[tuple[int, str]]) -> str:
    """A fingerprint of what must never change once work started: ids, count, positions, keys."""
    canonical = orjson.dumps([batch_id, expected_count, sorted(items)])
    return hashlib.sha256(canonical).hexdigest()


def judge(item: Item | None, result: Result, expected_count: int, max_retries: int) -> Judged:
    """What ``result`` does to its position's row ``item`` (None: no such position)."""
    if item is None:
        return Judged(
            Verdict.INCONSISTENT,
            None,
            f"result for position {result.position} above expected_count {expected_count}",
        )
    if result.item_key != item.item_key:
        return Judged(
            Verdict.INCONSISTENT,
            item,
            f"position {item.position}: result names item_key {result.item_key!r}, "
            f"the manifest {item.item_key!r}",
        )
    if result.attempt < item.attempts:
        return Judged(Verdict.STALE, item, f"attempt {result.attempt} superseded")
    if result.attempt == item.attempts and item.state != ItemState.PENDING:
        return _answered_again(item, result)
    if item.state == ItemState.DONE:
        return Judged(
            Verdict.INCONSISTENT,
            item,
            f"position {item.position} is done at attempt {item.attempts}; "
            f"attempt {result.attempt} was never dispatched",
        )
    return _answer(item, result, max_retries)


def _answered_again(item: Item, result: Result) -> Judged:
    """A second answer for the attempt that already answered."""
    if item.state == ItemState.DONE:
        if result.succeeded and result.result_ref == item.result_ref:
            return Judged(Verdict.DUPLICATE, item)
        return Judged(
            Verdict.INCONSISTENT,
            item,
            f"position {item.position} is already done with {item.result_ref!r}; "
            f"a second, different result arrived for attempt {result.attempt}",
        )
    if not result.succeeded:
        return Judged(Verdict.DUPLICATE, item)
    if item.state in (ItemState.ABANDONED, ItemState.NEEDS_REVIEW):
        # Late news that the work did finish: the position is done after all.
        return _answer(item, result, 0)
    return Judged(
        Verdict.INCONSISTENT,
        item,
        f"position {item.position} attempt {result.attempt} reported both failure and success",
    )


def _answer(item: Item, result: Result, max_retries: int) -> Judged:
    base = replace(item, attempts=result.attempt, finished_at=result.finished_at)
    if result.succeeded:
        return Judged(
            Verdict.DONE, replace(base, state=ItemState.DONE, result_ref=result.result_ref)
        )
    failed = replace(base, error=result.error, result_ref=None)
    if result.uncertain:
        return Judged(Verdict.REVIEW, replace(failed, state=ItemState.NEEDS_REVIEW))
    if result.attempt <= max_retries:
        return Judged(
            Verdict.RETRY, replace(failed, state=ItemState.PENDING, attempts=result.attempt + 1)
        )
    return Judged(Verdict.FAILED, replace(failed, state=ItemState.FAILED))


def decide(
    expected_count: int, counts: Mapping[str, int], on_incomplete: str, *, flagged: bool = False
) -> Branch:
    """Exactly one branch for a batch whose positions are in ``counts`` (state -> how many)."""
    if flagged or sum(counts.values()) != expected_count or set(counts) - set(ItemState):
        return Branch.INCONSISTENT
    if counts.get(ItemState.PENDING, 0):
        return Branch.WAIT
    if counts.get(ItemState.DONE, 0) == expected_count:
        return Branch.ASSEMBLE
    return Branch.INCOMPLETE if on_incomplete == OnIncomplete.ASSEMBLE_INCOMPLETE else Branch.HOLD


def assemble(
    batch_id: str, revision: int, expected_count: int, items: Iterable[Item], reason: str = ""
) -> dict[str, Any]:
    """The ``batch.assembled`` payload: done positions in position order, the rest listed missing.

    Nothing moves to fill a gap: result ``i`` keeps its position, and a batch with any
    missing position says ``complete: false``.
    """
    ordered = sorted(items, key=lambda i: i.position)
    results = [
        {"position": i.position, "item_key": i.item_key, "result_ref": i.result_ref}
        for i in ordered
        if i.state == ItemState.DONE
    ]
    missing = [i.position for i in ordered if i.state != ItemState.DONE]
    payload: dict[str, Any] = {
        "batch_id": batch_id,
        "revision": revision,
        "expected_count": expected_count,
        "complete": not missing and len(results) == expected_count,
        "results": results,
        "missing_positions": missing,
    }
    if reason:
        payload["reason"] = reason
    return payload
