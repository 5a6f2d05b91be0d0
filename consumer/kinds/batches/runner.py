"""A batch route at work: store manifests, apply worker results, decide, assemble, dispatch again.

Everything of one poll batch happens in one PostgreSQL transaction, under the touched
batches' locks: the manifest rows, the results, the decision, and the outputs (the
``batch.assembled`` revisions and re-dispatched work items) written to the consumer's
own outbox, so a decision and its output commit together or not at all.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
import structlog

from consumer.deadletter import BATCH_REJECTED
from consumer.kinds._base import Conn, Links, Outcome, Refusal
from consumer.kinds.batches.decisions import (
    Branch,
    Item,
    Judged,
    Result,
    Verdict,
    assemble,
    decide,
    digest,
    judge,
    manifest_problem,
)
from consumer.kinds.batches.route import BatchRoute
from consumer.kinds.batches.store import Batch, BatchStore, Manifest
from schemas import Event, PayloadError, batches
from schemas.batches import (
    BatchStatus,
    ItemState,
    OnIncomplete,
    WorkItem,
    item_entity_id,
    work_item_event,
)
from schemas.outbox import OutboxEvent, emit_many
from schemas.validation import default_payload_schemas

log = structlog.get_logger(__name__)
RESULT_TYPES = (batches.SUCCEEDED, batches.FAILED)


@dataclass(slots=True)
class BatchTally:
    """What one transaction did, counted into metrics once it committed."""

    results: Counter[str] = field(default_factory=Counter)  # by verdict
    assembled: Counter[str] = field(default_factory=Counter)  # complete / incomplete
    inconsistent: int = 0
    refused: list[tuple[Event, str]] = field(default_factory=list)
    ignored: list[Event] = field(default_factory=list)  # the route's own output read back

    def outcome(self) -> Outcome:
        """What the transaction did, as the route's ``Outcome`` (counted by its caller)."""
        return Outcome(
            batch_results=Counter(self.results),
            batches_assembled=Counter(self.assembled),
            batches_inconsistent=self.inconsistent,
        )


def _missing_reason(items: Iterable[Item]) -> str:
    by_state: dict[str, list[int]] = defaultdict(list)
    for item in items:
        if item.state != ItemState.DONE:
            by_state[item.state].append(item.position)
    return "; ".join(f"{state}: {', '.join(map(str, p))}" for state, p in sorted(by_state.items()))


class BatchRunner:
    """The batch routes of one consumer, sweeper or inorder-admin."""

    def __init__(self, routes: Sequence[BatchRoute]) -> None:
        self.routes = {r.stream: r for r in routes}
        self.stores = {r.stream: BatchStore(r.stream) for r in routes}
        self._schemas = default_payload_schemas()

    # ------------------------------------------------------------------ consumer

    def process(
        self, conn: psycopg.Connection[Any], by_stream: Mapping[str, Sequence[Event]]
    ) -> BatchTally:
        """Apply every batch route's events of one poll batch, in one transaction."""
        outcome = BatchTally()
        with conn.transaction():
            for stream, route in self.routes.items():
                events = [*by_stream.get(stream, ()), *by_stream.get(route.result_stream, ())]
                if events:
                    self._route(conn, route, events, outcome)
        return outcome

    def _route(
        self,
        conn: psycopg.Connection[Any],
        route: BatchRoute,
        events: Sequence[Event],
        outcome: BatchTally,
    ) -> None:
        store = self.stores[route.stream]
        manifests, results = self._read(route, events, outcome)
        batch_ids = [m.batch_id for m in manifests] + [r.batch_id for r, _ in results]
        store.lock(conn, batch_ids)
        known = store.batches(conn, batch_ids)
        touched: set[str] = set()
        created: list[str] = []
        for manifest in sorted(manifests, key=lambda m: m.batch_id):
            if self._accept(conn, route, manifest, known, outcome):
                created.append(manifest.batch_id)
                touched.add(manifest.batch_id)
        known.update(store.batches(conn, created))
        pending = store.take_early(conn, created) + [r for r, _ in results]
        unknown = [(r, e) for r, e in results if r.batch_id not in known]
        store.keep_early(
            conn,
            [
                (r.batch_id, e.event_id, r.attempt, e.event_type, dict(e.payload))
                for r, e in unknown
            ],
        )
        outcome.results["early"] += len(unknown)
        usable = [r for r in pending if r.batch_id in known]
        flags = self._apply(conn, route, known, usable, touched, outcome)
        self.settle(conn, route, sorted(touched), outcome, flags=flags)

    def _read(
        self, route: BatchRoute, events: Sequence[Event], outcome: BatchTally
    ) -> tuple[list[Manifest], list[tuple[Result, Event]]]:
        """Check each event's payload; turn it into a manifest or a result, or refuse it."""
        manifests: list[Manifest] = []
        results: list[tuple[Result, Event]] = []
        for event in events:
            kind = event.event_type
            wanted = (batches.ACCEPTED,) if event.entity_type == route.stream else RESULT_TYPES
            if kind == batches.ASSEMBLED and event.entity_type == route.stream:
                outcome.results["own_output"] += 1  # an output read back: nothing to do
                outcome.ignored.append(event)
                continue
            if kind not in wanted:
                outcome.refused.append(
                    (event, f"event type {kind} does not belong to {event.entity_type} events")
                )
                continue
            try:
                self._schemas.validate(kind, event.payload)
            except PayloadError as exc:
                outcome.refused.append((event, str(exc)))
                continue
            if kind == batches.ACCEPTED:
                manifests.append(self._manifest(route, event))
                continue
            result = Result.from_payload(event.seq, kind == batches.SUCCEEDED, event.payload)
            if event.entity_id != item_entity_id(result.batch_id, result.position):
                outcome.refused.append(
                    (
                        event,
                        f"entity_id {event.entity_id!r} is not batch_id#position "
                        f"({item_entity_id(result.batch_id, result.position)!r})",
                    )
                )
                continue
            results.append((result, event))
        return manifests, results

    @staticmethod
    def _manifest(route: BatchRoute, event: Event) -> Manifest:
        payload = event.payload
        return Manifest(
            event.entity_id,
            event.generation,
            payload["expected_count"],
            [(i["position"], i["item_key"], i.get("input")) for i in payload["items"]],
            payload.get("on_incomplete", route.on_incomplete),
            payload.get("deadline_s", route.deadline_s),
        )

    def _accept(
        self,
        conn: psycopg.Connection[Any],
        route: BatchRoute,
        manifest: Manifest,
        known: dict[str, Batch],
        outcome: BatchTally,
    ) -> bool:
        """Store a new manifest (True); a repeat changes nothing, a different one halts."""
        store = self.stores[route.stream]
        pairs = [(p, k) for p, k, _ in manifest.items]
        fingerprint = digest(manifest.batch_id, manifest.expected_count, pairs)
        existing = known.get(manifest.batch_id)
        if existing is None:
            problem = manifest_problem(manifest.expected_count, pairs)
            store.create(conn, manifest, fingerprint, problem)
            if problem is not None:
                outcome.inconsistent += 1
                log.error(
                    "batch_inconsistent",
                    route=route.stream,
                    batch=manifest.batch_id,
                    reason=problem,
                )
                return False
            return True
        if existing.digest == fingerprint and existing.generation == manifest.generation:
            outcome.results["manifest_repeated"] += 1
            return False
        if not existing.stopped:
            reason = "a different manifest arrived for a batch already accepted"
            store.set_status(conn, manifest.batch_id, BatchStatus.HALTED, reason)
            known[manifest.batch_id] = replace(existing, status=BatchStatus.HALTED)
            outcome.inconsistent += 1
            log.error("batch_halted", route=route.stream, batch=manifest.batch_id, reason=reason)
        return False

    def _apply(
        self,
        conn: psycopg.Connection[Any],
        route: BatchRoute,
        known: Mapping[str, Batch],
        results: Sequence[Result],
        touched: set[str],
        outcome: BatchTally,
    ) -> dict[str, str]:
        """Judge each result against its row; write the rows that changed. Returns flags."""
        store = self.stores[route.stream]
        live = [r for r in results if not known[r.batch_id].stopped]
        outcome.results["batch_stopped"] += len(results) - len(live)
        live.sort(key=lambda r: (r.batch_id, r.position, r.attempt))
        rows = store.items(conn, [(r.batch_id, r.position) for r in live])
        changed: dict[tuple[str, int], Item] = {}
        retries: list[tuple[str, Item]] = []
        flags: dict[str, str] = {}
        for result in live:
            key = (result.batch_id, result.position)
            batch = known[result.batch_id]
            judged: Judged = judge(rows.get(key), result, batch.expected_count, route.max_retries)
            outcome.results[judged.verdict.value] += 1
            if judged.verdict is Verdict.INCONSISTENT:
                flags.setdefault(result.batch_id, judged.reason)
                touched.add(result.batch_id)
            elif judged.changed and judged.item is not None:
                rows[key] = changed[key] = judged.item
                touched.add(result.batch_id)
                if judged.verdict is Verdict.RETRY:
                    retries.append((result.batch_id, judged.item))
        store.write_items(conn, [(b, item) for (b, _), item in sorted(changed.items())])
        self.dispatch(conn, route, known, [(b, i) for b, i in retries if b not in flags])
        return flags

    def dispatch(
        self,
        conn: psycopg.Connection[Any],
        route: BatchRoute,
        known: Mapping[str, Batch],
        items: Sequence[tuple[str, Item]],
    ) -> None:
        """Write a new work item (attempt ``item.attempts``) for each position given."""
        if not items:
            return
        store = self.stores[route.stream]
        by_batch: dict[str, list[Item]] = defaultdict(list)
        for batch_id, item in items:
            by_batch[batch_id].append(item)
        events: list[OutboxEvent] = []
        for batch_id, group in sorted(by_batch.items()):
            inputs = store.inputs(conn, batch_id, [i.position for i in group])
            generation = known[batch_id].generation
            events += [
                self._work_item(
                    route,
                    WorkItem(
                        batch_id,
                        i.position,
                        i.item_key,
                        i.attempts,
                        inputs.get(i.position, {}),
                        generation,
                    ),
                )
                for i in group
            ]
        emit_many(conn, events, schemas=self._schemas)

    @staticmethod
    def _work_item(route: BatchRoute, item: WorkItem) -> OutboxEvent:
        return work_item_event(item, stream=route.stream, topic=route.work_topic)

    # ------------------------------------------------------------------ decisions

    def settle(
        self,
        conn: psycopg.Connection[Any],
        route: BatchRoute,
        batch_ids: Sequence[str],
        outcome: BatchTally,
        *,
        flags: Mapping[str, str] | None = None,
        release: bool = False,
        reason: str = "",
    ) -> dict[str, Branch]:
        """Decide each batch's branch and act on it; the batches' locks must be held.

        ``release`` turns a hold into an incomplete assembly (an operator's decision).
        """
        store = self.stores[route.stream]
        known = store.batches(conn, batch_ids)
        counts = store.counts(conn, batch_ids)
        decided: dict[str, Branch] = {}
        for batch_id in batch_ids:
            batch = known.get(batch_id)
            flag = (flags or {}).get(batch_id)
            if (
                batch is None
                or batch.stopped
                or (batch.status == BatchStatus.COMPLETE and not flag)
            ):
                continue
            on_incomplete = OnIncomplete.ASSEMBLE_INCOMPLETE if release else batch.on_incomplete
            branch = decide(
                batch.expected_count, counts.get(batch_id, {}), on_incomplete, flagged=bool(flag)
            )
            decided[batch_id] = branch
            self._act(conn, route, batch, branch, flag, reason, outcome)
        return decided

    def _act(
        self,
        conn: psycopg.Connection[Any],
        route: BatchRoute,
        batch: Batch,
        branch: Branch,
        flag: str | None,
        reason: str,
        outcome: BatchTally,
    ) -> None:
        store = self.stores[route.stream]
        if branch is Branch.INCONSISTENT:
            why = flag or "the manifest's rows no longer match expected_count"
            store.set_status(conn, batch.batch_id, BatchStatus.INCONSISTENT, why)
            outcome.inconsistent += 1
            log.error("batch_inconsistent", route=route.stream, batch=batch.batch_id, reason=why)
        elif branch is Branch.WAIT:
            if batch.status != BatchStatus.WAITING:
                store.set_status(conn, batch.batch_id, BatchStatus.WAITING, None)
        elif branch is Branch.HOLD:
            items = store.all_items(conn, batch.batch_id)
            store.set_status(conn, batch.batch_id, BatchStatus.HELD, _missing_reason(items))
            if batch.status != BatchStatus.HELD:
                log.warning(
                    "batch_held",
                    route=route.stream,
                    batch=batch.batch_id,
                    missing=[i.position for i in items if i.state != ItemState.DONE],
                )
        else:
            self._assemble(conn, route, batch, reason, outcome)

    def _assemble(
        self,
        conn: psycopg.Connection[Any],
        route: BatchRoute,
        batch: Batch,
        reason: str,
        outcome: BatchTally,
    ) -> None:
        store = self.stores[route.stream]
        items = store.all_items(conn, batch.batch_id)
        now = digest(
            batch.batch_id, batch.expected_count, [(i.position, i.item_key) for i in items]
        )
        if now != batch.digest:
            why = "the manifest changed after work started (digest mismatch)"
            store.set_status(conn, batch.batch_id, BatchStatus.HALTED, why)
            outcome.inconsistent += 1
            log.error("batch_halted", route=route.stream, batch=batch.batch_id, reason=why)
            return
        revision = batch.revision + 1
        missing = _missing_reason(items)
        payload = assemble(
            batch.batch_id,
            revision,
            batch.expected_count,
            items,
            "; ".join(x for x in (reason, missing) if x),
        )
        emit_many(
            conn,
            [
                OutboxEvent(
                    route.stream,
                    batch.batch_id,
                    revision + 1,
                    batches.ASSEMBLED,
                    payload,
                    generation=batch.generation,
                    topic=route.output_topic,
                )
            ],
            schemas=self._schemas,
        )
        status = BatchStatus.COMPLETE if payload["complete"] else BatchStatus.INCOMPLETE
        store.set_status(conn, batch.batch_id, status, payload.get("reason"), revision=revision)
        outcome.assembled[status] += 1
        log.info(
            "batch_assembled",
            route=route.stream,
            batch=batch.batch_id,
            revision=revision,
            complete=payload["complete"],
            missing=payload["missing_positions"],
        )

    # ------------------------------------------------------------------ sweeper

    def expire(self, conn: psycopg.Connection[Any], route: str, limit: int) -> BatchTally:
        """Past their deadline, waiting batches stop waiting: pending positions are abandoned."""
        outcome = BatchTally()
        store = self.stores[route]
        with conn.transaction():
            overdue = store.overdue(conn, limit)
            if overdue:
                store.lock(conn, overdue)
                waiting = [
                    b
                    for b, row in store.batches(conn, overdue).items()
                    if row.status == BatchStatus.WAITING
                ]
                outcome.results["abandoned"] += store.abandon_pending(conn, waiting)
                self.settle(conn, self.routes[route], waiting, outcome, reason="deadline passed")
        return outcome


class BatchApplier:
    """One batch route in the consumer: its share of a poll batch in one transaction."""

    def __init__(self, route: BatchRoute) -> None:
        self.route = route
        self.runner = BatchRunner([route])

    def connect(self, links: Links) -> None:
        """Nothing to check: the batch tables and the outbox come with the migrations."""

    def apply(self, conn: Conn, events: Sequence[Event], raw: Mapping[str, bytes]) -> Outcome:
        """Store manifests, apply results, decide and assemble; refused events are named."""
        done = self.runner.process(conn, {self.route.stream: events})
        refused = [Refusal(event, BATCH_REJECTED, reason) for event, reason in done.refused]
        # Every other event was taken into its batch's state (a repeated answer changes
        # nothing, which is the point): counted applied like any route's; the route's
        # own output read back is stale.
        aside = {id(event) for event, _ in done.refused} | {id(e) for e in done.ignored}
        outcome = done.outcome()
        outcome.applied = [event for event in events if id(event) not in aside]
        outcome.stale = done.ignored
        outcome.refused = refused
        return outcome
