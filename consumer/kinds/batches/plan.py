"""Batch routes, the pure plan of one transaction: accept, judge, settle, finish.

The runner loads a ``Snapshot`` under the touched batches' locks; a ``Share`` decides
over all of it at once (manifests accepted or refused, every result judged against its
row, every touched batch's branch); the batches that finish have their rows read once
(``unread``) and ``finish`` composes their assemblies and holds; then the store writes
what the ``Share`` holds in one go. No I/O: the same decisions serve the consumer, the
sweeper's expiry and ``inorder-admin``, and are tested without services.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from consumer.kinds._outcome import Outcome
from consumer.kinds.batches.decisions import (
    Batch,
    Branch,
    Item,
    Key,
    Manifest,
    Result,
    Snapshot,
    Verdict,
    assemble,
    batch_id_problem,
    decide,
    digest,
    judge,
    manifest_problem,
)
from consumer.kinds.batches.incoming import Incoming
from consumer.kinds.batches.metrics import BatchTally
from consumer.kinds.batches.route import BatchRoute
from schemas import Event, batches
from schemas.batches import BatchStatus, ItemState, OnIncomplete, WorkItem, work_item_event
from schemas.errors import InvalidEventError
from schemas.limits import safe_text
from schemas.outbox import OutboxEvent
from schemas.outbox.events import check
from schemas.runtime.payloads import default_payload_schemas

Status = tuple[str, str | None, int | None]  # status, reason, revision after an assembly


@dataclass(frozen=True, slots=True)
class Note:
    """A line the runner logs once the plan is written."""

    level: str  # info, warning or error
    event: str
    fields: Mapping[str, Any] = field(default_factory=dict)


# Positions a reason names per state; the rest are counted (the payload lists them all).
REASON_POSITIONS = 10
# The longest reason an assembly carries (``batch.assembled``'s schema says the same).
MAX_REASON = 1024


def missing_reason(items: Iterable[Item]) -> str:
    """The positions not done by state, the first few and a count (``failed: 2, 4; pending: 5``).

    Bounded whatever the batch's size: a reason is a line for a person, and the
    assembled payload's ``missing_positions`` has every one.
    """
    by_state: dict[str, list[int]] = defaultdict(list)
    for item in items:
        if item.state != ItemState.DONE:
            by_state[item.state].append(item.position)
    return "; ".join(_positions(state, p) for state, p in sorted(by_state.items()))


def bounded_reason(reason: str) -> str:
    """``reason`` made storable and cut to what an assembly may carry (an operator's words
    can hold anything, and be long)."""
    reason = safe_text(reason)
    return reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 3] + "..."


def _positions(state: str, positions: Sequence[int]) -> str:
    shown = ", ".join(map(str, positions[:REASON_POSITIONS]))
    more = len(positions) - REASON_POSITIONS
    return f"{state}: {shown}" + (f" and {more} more ({len(positions)} in all)" if more > 0 else "")


def _no_room(route: BatchRoute, held: tuple[int, int]) -> str:
    """Why a result of a batch with no manifest yet is not kept."""
    return (
        f"no manifest for its batch yet, and the route keeps {held[0]} such results "
        f"({held[1]} bytes) already: max_early_results {route.max_early_results}, "
        f"max_early_bytes {route.max_early_bytes}"
    )


class Share:
    """What one transaction decides for the batches of one route, and what it will write."""

    def __init__(self, route: BatchRoute, snapshot: Snapshot) -> None:
        self.route = route
        self.batches: dict[str, Batch] = dict(snapshot.batches)
        self.rows: dict[Key, Item] = dict(snapshot.rows)
        self.inputs: dict[Key, Any] = dict(snapshot.inputs)
        self.counts: dict[str, Counter[str]] = {b: Counter(c) for b, c in snapshot.counts.items()}
        self.early = list(snapshot.early)
        # What to write.
        self.created: list[tuple[Manifest, str, str | None]] = []
        self.items: dict[Key, Item] = {}
        self.kept: list[tuple[Result, Any]] = []  # results of unknown batches, kept early
        self.refused: list[tuple[Event, str]] = []  # results of unknown batches with no room
        self.statuses: dict[str, Status] = {}
        self.outputs: list[OutboxEvent] = []
        self.notes: list[Note] = []
        # What was decided, for the caller and the counts.
        self.decided: dict[str, Branch] = {}
        self.finishing: dict[str, tuple[Branch, str]] = {}  # branch, reason given
        self.fresh: set[str] = set()  # batches whose manifest this transaction stores
        self.results: Counter[str] = Counter()  # by verdict
        self.assembled: Counter[str] = Counter()  # complete / incomplete
        self.inconsistent = 0

    # ------------------------------------------------------------------ consumer

    def take(
        self,
        incoming: Incoming,
        held: tuple[int, int] = (0, 0),
        size: Callable[[Event], int] = lambda _: 0,
    ) -> None:
        """A poll batch's share: store manifests, judge results, settle every batch touched.

        ``held``: the results the route keeps for manifests not come yet, and their bytes;
        ``size``: an event's bytes. A result past the route's room for them is refused.
        """
        self.results["own_output"] += len(incoming.ignored)
        touched: set[str] = set()
        for manifest in sorted(incoming.manifests, key=lambda m: m.batch_id):
            if self.accept(manifest):
                touched.add(manifest.batch_id)
        unknown = [(r, e) for r, e in incoming.results if r.batch_id not in self.batches]
        count, used = held
        for result, event in unknown:
            grown = used + size(event)
            if count + 1 > self.route.max_early_results or grown > self.route.max_early_bytes:
                self.refused.append((event, _no_room(self.route, held)))
                continue
            count, used = count + 1, grown
            self.kept.append((result, event))
        self.results["early"] += len(self.kept)
        self.results["early_refused"] += len(self.refused)
        known = [r for r, _ in incoming.results if r.batch_id in self.batches]
        flags = self.answer([*self.early, *known], touched)
        self.settle(sorted(touched), flags=flags)

    def accept(self, manifest: Manifest) -> bool:
        """Store a new manifest (True); a repeat changes nothing, a different one halts."""
        m = manifest
        pairs = [(p, k) for p, k, _ in m.items]
        fingerprint = digest(m.batch_id, m.expected_count, pairs)
        existing = self.batches.get(m.batch_id)
        if existing is None:
            problem = batch_id_problem(
                self.route.stream, m.batch_id, m.generation
            ) or manifest_problem(m.expected_count, pairs)
            self.created.append((m, fingerprint, problem))
            status = BatchStatus.INCONSISTENT if problem else BatchStatus.WAITING
            self.batches[m.batch_id] = Batch(
                m.batch_id,
                m.generation,
                m.expected_count,
                fingerprint,
                m.on_incomplete,
                status,
                0,
                m.deadline_s,
            )
            if problem is not None:  # stored flagged, with the reason, by ``create``
                self._note_stop(m.batch_id, BatchStatus.INCONSISTENT, problem)
                return False
            self.fresh.add(m.batch_id)
            self.counts[m.batch_id] = Counter({ItemState.PENDING.value: len(m.items)})
            for position, key, given in m.items:
                self.rows[m.batch_id, position] = Item(position, key)
                self.inputs[m.batch_id, position] = given or {}
            return True
        if existing.digest == fingerprint and existing.generation == m.generation:
            self.results["manifest_repeated"] += 1
            return False
        if not existing.stopped:
            reason = "a different manifest arrived for a batch already accepted"
            self._stop(m.batch_id, BatchStatus.HALTED, reason)
        return False

    def answer(self, results: Sequence[Result], touched: set[str]) -> dict[str, str]:
        """Judge each result against its row, in (batch, position, attempt) order.

        Returns the batches a result contradicts, with the first reason; their retries
        are not dispatched.
        """
        live = [r for r in results if not self.batches[r.batch_id].stopped]
        self.results["batch_stopped"] += len(results) - len(live)
        flags: dict[str, str] = {}
        retries: list[tuple[str, Item]] = []
        for result in sorted(live, key=lambda r: (r.batch_id, r.position, r.attempt)):
            key = (result.batch_id, result.position)
            batch = self.batches[result.batch_id]
            judged = judge(self.rows.get(key), result, batch.expected_count, self.route.max_retries)
            self.results[judged.verdict.value] += 1
            if judged.verdict is Verdict.INCONSISTENT:
                flags.setdefault(result.batch_id, judged.reason)
                touched.add(result.batch_id)
            elif judged.changed and judged.item is not None:
                self.change(result.batch_id, judged.item)
                touched.add(result.batch_id)
                if judged.verdict is Verdict.RETRY:
                    retries.append((result.batch_id, judged.item))
        for batch_id, item in retries:
            if batch_id not in flags:
                self.dispatch(batch_id, [item])
        return flags

    # ------------------------------------------------------------------ any caller

    def change(self, batch_id: str, item: Item) -> None:
        """A position's new row; the batch's counts by state follow it."""
        key = (batch_id, item.position)
        counts = self.counts.setdefault(batch_id, Counter())
        before = self.rows.get(key)
        if before is not None:
            counts[before.state] -= 1
        counts[item.state] += 1
        self.rows[key] = self.items[key] = item

    def dispatch(self, batch_id: str, items: Sequence[Item]) -> None:
        """A new work item (attempt ``item.attempts``) for each position given."""
        generation = self.batches[batch_id].generation
        work = [
            WorkItem(
                batch_id,
                i.position,
                i.item_key,
                i.attempts,
                self.inputs.get((batch_id, i.position)) or {},
                generation,
            )
            for i in items
        ]
        where = {"stream": self.route.stream, "topic": self.route.work_topic}
        self._send(batch_id, [work_item_event(w, **where) for w in work])

    def settle(
        self,
        batch_ids: Sequence[str],
        *,
        flags: Mapping[str, str] | None = None,
        release: bool = False,
        reason: str = "",
    ) -> None:
        """Decide each batch's branch; waiting and inconsistent ones are done at once.

        ``release`` turns a hold into an incomplete assembly (an operator's decision).
        The others finish once their rows are read (``unread``, then ``finish``).
        """
        for batch_id in batch_ids:
            batch = self.batches.get(batch_id)
            flag = (flags or {}).get(batch_id)
            if (
                batch is None
                or batch.stopped
                or (batch.status == BatchStatus.COMPLETE and not flag)
            ):
                continue
            on_incomplete = OnIncomplete.ASSEMBLE_INCOMPLETE if release else batch.on_incomplete
            branch = decide(
                batch.expected_count,
                {s: n for s, n in self.counts.get(batch_id, {}).items() if n},
                on_incomplete,
                flagged=bool(flag),
            )
            self.decided[batch_id] = branch
            if branch is Branch.INCONSISTENT:
                why = flag or "the manifest's rows no longer match expected_count"
                self._stop(batch_id, BatchStatus.INCONSISTENT, why)
            elif branch is Branch.WAIT:
                if batch.status != BatchStatus.WAITING:
                    self._status(batch_id, BatchStatus.WAITING, None)
            else:
                self.finishing[batch_id] = (branch, reason)

    @property
    def unread(self) -> list[str]:
        """The finishing batches whose rows must be read before ``finish``."""
        return sorted(b for b in self.finishing if b not in self.fresh)

    def finish(self, rows: Mapping[str, Sequence[Item]]) -> None:
        """Assemble or hold each finishing batch, from its rows as this plan leaves them."""
        for batch_id, (branch, reason) in sorted(self.finishing.items()):
            batch = self.batches[batch_id]
            if batch_id in self.fresh:
                items = [self.rows[batch_id, p] for p, _, _ in self._manifest(batch_id).items]
            else:
                by_position = {i.position: i for i in rows.get(batch_id, ())}
                for (b, position), item in self.items.items():
                    if b == batch_id:
                        by_position[position] = item
                items = list(by_position.values())
            items.sort(key=lambda i: i.position)
            if branch is Branch.HOLD:
                self._hold(batch, items)
            else:
                self._assemble(batch, items, reason)
        self.finishing.clear()

    def outcome(self) -> Outcome:
        """What the transaction did, as the route's ``Outcome`` (counted by its caller)."""
        tally = BatchTally(Counter(self.results), Counter(self.assembled), self.inconsistent)
        return Outcome(tally=tally)

    # ------------------------------------------------------------------ helpers

    def stop(self, batch_id: str, reason: str) -> None:
        """Stop a batch nothing else could settle, inconsistent, for a person to look at."""
        self._stop(batch_id, BatchStatus.INCONSISTENT, reason)

    def _manifest(self, batch_id: str) -> Manifest:
        return next(m for m, _, _ in self.created if m.batch_id == batch_id)

    def _status(
        self, batch_id: str, status: str, reason: str | None, revision: int | None = None
    ) -> None:
        self.statuses[batch_id] = (status, reason, revision)
        batch = self.batches[batch_id]
        self.batches[batch_id] = replace(
            batch, status=status, revision=batch.revision if revision is None else revision
        )

    def _stop(self, batch_id: str, status: BatchStatus, reason: str) -> None:
        """Stop a batch for a person (halted or inconsistent), saying why."""
        self._status(batch_id, status, reason)
        self._note_stop(batch_id, status, reason)

    def _note_stop(self, batch_id: str, status: BatchStatus, reason: str) -> None:
        self.inconsistent += 1
        self.notes.append(
            Note(
                "error",
                f"batch_{status}",
                {"route": self.route.stream, "batch": batch_id, "reason": reason},
            )
        )

    def _hold(self, batch: Batch, items: Sequence[Item]) -> None:
        self._status(batch.batch_id, BatchStatus.HELD, missing_reason(items))
        if batch.status != BatchStatus.HELD:
            missing = [i.position for i in items if i.state != ItemState.DONE]
            self.notes.append(
                Note(
                    "warning",
                    "batch_held",
                    {"route": self.route.stream, "batch": batch.batch_id, "missing": missing},
                )
            )

    def _send(self, batch_id: str, outputs: Sequence[OutboxEvent]) -> bool:
        """Queue a batch's outputs for the outbox, checked as ``emit`` will check them.

        One that cannot be written (no check here foresaw it) stops that batch alone,
        inconsistent with the reason; the transaction and every other batch go on.
        """
        for output in outputs:
            try:
                check(output, default_payload_schemas())
            except InvalidEventError as exc:
                why = f"its {output.event_type} cannot be written: {str(exc)[:300]}"
                self._stop(batch_id, BatchStatus.INCONSISTENT, why)
                return False
        self.outputs.extend(outputs)
        return True

    def _assemble(self, batch: Batch, items: Sequence[Item], reason: str) -> None:
        now = digest(
            batch.batch_id, batch.expected_count, [(i.position, i.item_key) for i in items]
        )
        if now != batch.digest:
            reason = "the manifest changed after work started (digest mismatch)"
            self._stop(batch.batch_id, BatchStatus.HALTED, reason)
            return
        revision = batch.revision + 1
        payload = assemble(
            batch.batch_id,
            revision,
            batch.expected_count,
            items,
            bounded_reason("; ".join(x for x in (reason, missing_reason(items)) if x)),
        )
        output = OutboxEvent(
            self.route.stream,
            batch.batch_id,
            revision + 1,
            batches.ASSEMBLED,
            payload,
            generation=batch.generation,
            topic=self.route.output_topic,
        )
        if not self._send(batch.batch_id, [output]):
            return
        status = BatchStatus.COMPLETE if payload["complete"] else BatchStatus.INCOMPLETE
        self._status(batch.batch_id, status, payload.get("reason"), revision)
        self.assembled[status] += 1
        self.notes.append(
            Note(
                "info",
                "batch_assembled",
                {
                    "route": self.route.stream,
                    "batch": batch.batch_id,
                    "revision": revision,
                    "complete": payload["complete"],
                    "missing": payload["missing_positions"],
                },
            )
        )
