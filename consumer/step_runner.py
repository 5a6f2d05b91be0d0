"""Steps for one poll batch: apply what is due, park what is early, drain what became due.

Order: PostgreSQL (the applies), then Redis (parks, then removal of drained events),
and only then may the caller commit Kafka offsets.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

import structlog

from consumer import metrics
from consumer.parking import ParkingLot
from consumer.step_batch import apply_steps
from consumer.steps import Conn, Plan, StepStore, reorder_distance
from schemas import DecodeError, Event, decode

log = structlog.get_logger(__name__)

# Parked events fetched per entity and round while draining.
DRAIN_WINDOW = 500


def _by_entity(events: Sequence[Event]) -> dict[str, list[Event]]:
    grouped: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        grouped[event.entity_id].append(event)
    return dict(grouped)


def _count(route: str, plans: Mapping[str, Plan]) -> None:
    metrics.APPLIED.labels(route).inc(sum(len(p.apply) for p in plans.values()))
    stale = Counter(e.event_type for p in plans.values() for e in p.stale)
    for event_type, count in stale.items():
        metrics.STALE.labels(event_type).inc(count)


class StepRunner:
    """Runs every step route's share of a batch."""

    def __init__(self, stores: Mapping[str, StepStore], lot: ParkingLot) -> None:
        self.stores = stores
        self.lot = lot

    def process(
        self, conn: Conn, by_stream: Mapping[str, list[Event]], raw: Mapping[str, bytes]
    ) -> list[Event]:
        """Apply, park and drain; return events refused by a full parking set (to be held)."""
        held: list[Event] = []
        for stream, events in by_stream.items():
            store = self.stores.get(stream)
            if store is not None:
                held += self._route(conn, store, events, raw)
        return held

    def _route(
        self, conn: Conn, store: StepStore, events: Sequence[Event], raw: Mapping[str, bytes]
    ) -> list[Event]:
        route = store.route
        plans = apply_steps(conn, store, _by_entity(events))
        _count(route.stream, plans)
        early = [(p, e) for p in plans.values() for e in p.park]
        sizes = self.lot.park(
            route.stream, [(e.entity_id, e.seq, raw[e.event_id]) for _, e in early],
            route.max_parked, route.park_ttl_s,
        )  # fmt: skip
        held = [event for (_, event), size in zip(early, sizes, strict=True) if size < 0]
        for entity_plan, event in early:
            assert entity_plan.end is not None
            metrics.PARKED.labels(event.event_type).inc()
            metrics.REORDER_DISTANCE.observe(reorder_distance(entity_plan.end, event))
        self._hold(conn, store, held)
        advanced = self.lot.indexed(route.stream, sorted(e for e, p in plans.items() if p.apply))
        self._drain(conn, store, sorted(set(advanced) | {e.entity_id for _, e in early}))
        return held

    def drain(self, conn: Conn, stream: str, entity_ids: Sequence[str]) -> None:
        """Apply whatever parked events of these entities are due now (after a person acted)."""
        self._drain(conn, self.stores[stream], sorted(entity_ids))

    def _hold(self, conn: Conn, store: StepStore, held: Sequence[Event]) -> None:
        for event in held:
            with conn.transaction():
                newly = store.hold(conn, event.entity_id)
            if newly:
                metrics.GAPS_ESCALATED.labels(event.event_type).inc()
                log.error(
                    "entity_held", route=store.route.stream, entity=event.entity_id,
                    seq=event.seq, max_parked=store.route.max_parked,
                )  # fmt: skip

    def _drain(self, conn: Conn, store: StepStore, candidates: Sequence[str]) -> None:
        route = store.route.stream
        while candidates:
            fetched = self.lot.fetch(route, candidates, DRAIN_WINDOW)
            if not fetched:
                return
            events, members, broken = self._decode(fetched)
            plans = apply_steps(conn, store, events) if events else {}
            _count(route, plans)
            done = {
                entity: [members[id(e)] for e in plan.apply + plan.stale]
                for entity, plan in plans.items()
            }
            for entity, bad in broken.items():
                done.setdefault(entity, []).extend(bad)
            self.lot.remove(route, done)
            candidates = [
                e for e, p in plans.items() if p.apply and len(fetched[e]) == DRAIN_WINDOW
            ]

    @staticmethod
    def _decode(
        fetched: Mapping[str, list[bytes]],
    ) -> tuple[dict[str, list[Event]], dict[int, bytes], dict[str, list[bytes]]]:
        events: dict[str, list[Event]] = defaultdict(list)
        members: dict[int, bytes] = {}
        broken: dict[str, list[bytes]] = defaultdict(list)
        for entity, raws in fetched.items():
            for member in raws:
                try:
                    event = decode(member)
                except DecodeError as exc:
                    log.error(  # noqa: TRY400 - the reason says it all
                        "parked_event_unreadable", entity=entity, reason=exc.detail
                    )
                    broken[entity].append(member)
                    continue
                events[entity].append(event)
                members[id(event)] = member
        return dict(events), members, dict(broken)
