"""What the active sweeper does for step routes: heal, detect, escalate and repair gaps.

Each sweep reads only the overdue part of each route's park index, so its cost follows
the number of overdue gaps, not of parked entities. A gap is recorded once, asked of the
relay with backoff, and made unrecoverable (the entity held) when the relay no longer
has its seqs or the attempts run out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import structlog

from consumer import labels
from consumer.kinds._plugin import Answered, Duties, SweepReport
from consumer.kinds._resources import Resources
from consumer.kinds.steps import failures, gaps, metrics, traced, wakes
from consumer.kinds.steps.asking import Asker
from consumer.kinds.steps.drain import drain
from consumer.kinds.steps.gaps import GapStatus
from consumer.kinds.steps.parking import lot_of
from consumer.kinds.steps.plan import Progress
from consumer.kinds.steps.retention import RetentionWatch
from consumer.kinds.steps.route import StepRoute
from consumer.kinds.steps.runner import StepApplier
from schemas import DecodeError, decode, tracing
from schemas.republish import RepublishRequest, RepublishResult, backoff_delays, encode

if TYPE_CHECKING:
    from consumer.settings import SweeperSettings

log = structlog.get_logger(__name__)
# The event type recorded for a gap found by its lost parks (no parked event to name it).
LOST_PARK = "lost_park"


class StepDuties(Duties):
    """The step routes' gap repair, run by the sweeper holding the lease."""

    def __init__(self, routes: Sequence[StepRoute], tools: Resources[SweeperSettings]) -> None:
        self.tools = tools
        settings = tools.settings
        self.delays = backoff_delays(
            settings.republish_backoff_base_s,
            settings.republish_backoff_max_s,
            settings.republish_max_attempts,
        )
        self.lot = lot_of(tools)
        self.parked_cap = settings.max_message_bytes + tracing.STAMP_ROOM
        self._asker = Asker(settings)
        self._retention = RetentionWatch(tools.conn, settings.outbox_database_url)
        # Each step route started as the consumer starts it, to drain what became due.
        self.steps = {r.stream: StepApplier(r) for r in routes}
        for applier in self.steps.values():
            applier.share()  # the consumers apply these entities meanwhile
        for applier in self.steps.values():
            applier.connect(tools)

    def close(self) -> None:
        """Close the connection snapshot requests were written on, if one was opened."""
        self._asker.close()
        self._retention.close()

    # ------------------------------------------------------------------ sweeping

    def sweep(self, report: SweepReport) -> None:
        """One pass over every step route: heal, detect, escalate, request."""
        for route in self.steps:
            self._woken(route, report)
            self._heal(route, report)
            self._retry(route, report)
            self._overdue(route, report)
            self._parks_lost(route, report)

    def _retry(self, route: str, report: SweepReport) -> None:
        """Resume the entities whose failed step is due to be called again, and drain them."""
        conn, applier = self.tools.conn, self.steps[route]
        most = self.tools.settings.max_overdue_per_sweep
        for entity_id in failures.due(conn, applier.store, most):
            with conn.transaction():
                if not failures.resume(conn, applier.store, entity_id):
                    continue  # a person decided meanwhile
            report["retried"] += 1
            # The retry span: the call made again, and whatever it let drain after it.
            about = {"inorder.entity": f"{route}:{entity_id}"}
            with tracing.span("retry", "internal", about):
                drain(self.tools, applier, [entity_id])

    def _woken(self, route: str, report: SweepReport) -> None:
        """Drain the entities a person's decision (skip, review) left with steps to apply:
        the command recorded it and left the handlers to the deployment's processes."""
        applier = self.steps[route]
        for entity_id, asked_at in wakes.due(
            self.tools.conn, route, self.tools.settings.max_overdue_per_sweep
        ):
            drain(self.tools, applier, [entity_id])
            wakes.done(self.tools.conn, route, entity_id, asked_at)
            report["woken"] += 1

    def _heal(self, route: str, report: SweepReport) -> None:
        conn = self.tools.conn
        open_gaps = gaps.passed(conn, route, self.tools.settings.max_overdue_per_sweep)
        store = self.steps[route].store
        progress = store.read(conn, [g.entity_id for g in open_gaps])
        for gap in open_gaps:
            now = progress.get(gap.entity_id)
            if now is None or not gaps.healed(gap, now):
                continue
            if gap.status == GapStatus.UNRECOVERABLE:
                self._passed(gap, report)
                continue
            if not gaps.resolve(conn, gap, GapStatus.HEALED, "sweeper", "range applied"):
                continue  # a person skipped it meanwhile
            traced.healed(gap)
            seconds = (gaps.clock(conn) - gap.first_seen).total_seconds()
            metrics.GAP_HEAL_TIME.observe(seconds)
            report["healed"] += 1
            log.info("gap_healed", route=route, entity=gap.entity_id, seconds=round(seconds, 3))

    def _passed(self, gap: gaps.Gap, report: SweepReport) -> None:
        """An entity moved past a gap given up on: by a baseline snapshot, or a late answer.

        The gap is healed and the entity's hold released.
        """
        conn = self.tools.conn
        at = gaps.passed_by_snapshot(conn, gap)
        if at is None:
            by, why = "sweeper", "range applied after the gap was given up"
        else:
            by, why = "snapshot", f"moved past by the snapshot at seq {at}"
        with conn.transaction():
            if not gaps.resolve(conn, gap, GapStatus.HEALED, by, why):
                return  # a person skipped it meanwhile, and released the entity so
            self.steps[gap.route].store.release(conn, gap.entity_id)
        report["healed"] += 1
        log.info("gap_healed", route=gap.route, entity=gap.entity_id, by=by, reason=why)

    def _overdue(self, route: str, report: SweepReport) -> None:
        settings = self.tools.settings
        entities = self.lot.overdue(route, settings.gap_deadline_s, settings.max_overdue_per_sweep)
        report["overdue"] += len(entities)
        if not entities:
            return
        firsts = self.lot.fetch(route, entities, 1)
        empty = [e for e in entities if e not in firsts]
        if empty:  # index entries left behind by a crash between index and park
            self.lot.unindex_empty(route, empty)
        progress = self.steps[route].store.read(self.tools.conn, list(firsts))
        for entity_id, members in firsts.items():
            self._entity(route, entity_id, members[0], progress, report)

    def _entity(
        self,
        route: str,
        entity_id: str,
        member: bytes,
        progress: dict[str, Progress],
        report: SweepReport,
    ) -> None:
        try:
            first = decode(member, max_bytes=self.parked_cap)
        except DecodeError:
            return
        current = progress.get(entity_id, Progress(first.generation, 0))
        span = gaps.missing_range(current, first)
        if span is None:  # the next seq is parked: a drain was missed, do it now
            drain(self.tools, self.steps[route], [entity_id])
            return
        self._escalate(route, entity_id, span, first.event_type, report, parked_from=first.seq)

    def _parks_lost(self, route: str, report: SweepReport) -> None:
        """Entities whose parks are ahead of progress, quiet past the deadline, nothing parked.

        Their parks were lost (a Redis crash dropped its last writes): the missing range
        runs to the newest version they parked, and is asked of the relay like any gap.
        """
        settings = self.tools.settings
        ahead = self.steps[route].store.parked_ahead(
            self.tools.conn, settings.gap_deadline_s, settings.max_overdue_per_sweep
        )
        if not ahead:
            return
        parked = set(self.lot.indexed(route, [entity for entity, _, _ in ahead]))
        for entity_id, current, (generation, through) in ahead:
            if entity_id in parked:
                continue  # still parked: the overdue path above handles it
            start = current.last_applied + 1 if generation == current.generation else 1
            report["parks_lost"] += 1
            self._escalate(route, entity_id, (generation, start, through), LOST_PARK, report)

    def _escalate(
        self,
        route: str,
        entity_id: str,
        span: tuple[int, int, int],
        event_type: str,
        report: SweepReport,
        **detail: int,
    ) -> None:
        """Record the gap (once), keep its range current, and ask the relay when due."""
        conn = self.tools.conn
        if gaps.open_gap(conn, route, entity_id, span, event_type):
            report["escalated"] += 1
            metrics.GAPS_ESCALATED.labels(labels.event_type(event_type)).inc()
            log.error(
                "gap_escalated",
                route=route,
                entity=entity_id,
                generation=span[0],
                from_seq=span[1],
                to_seq=span[2],
                **detail,
            )
        gap = gaps.find(conn, route, entity_id)
        if gap is None or gap.status == GapStatus.UNRECOVERABLE:
            return
        if (gap.generation, gap.from_seq, gap.to_seq) != span:
            gaps.move(conn, gap, span)
        if gap.next_attempt_at <= gaps.clock(conn):
            self._request(route, gap, span, report)

    def _request(
        self, route: str, gap: gaps.Gap, span: tuple[int, int, int], report: SweepReport
    ) -> None:
        if gap.attempts >= len(self.delays):
            self._unrecoverable(gap, f"no repair after {gap.attempts} republish requests", None)
            report["unrecoverable"] += 1
            return
        request = RepublishRequest(
            gaps.request_id(gap),
            route,
            gap.entity_id,
            span[0],
            span[1],
            span[2],
            f"gap open since {gap.first_seen.isoformat()}",
        )
        topic = self.tools.settings.republish_requests_topic
        with traced.requesting(gap, topic, gap.attempts + 1) as sending:
            trace = tracing.traceparent_of(sending)
            # Claimed before it is sent: of two sweepers, only one asks for each attempt.
            delay = self.delays[gap.attempts]
            if not gaps.requested(self.tools.conn, gap, request.request_id, delay, trace):
                return
            self.tools.producer.produce(
                topic, encode(request), request.key, headers=tracing.injected()
            )
        metrics.REPUBLISH_REQUESTED.inc()
        report["requested"] += 1
        log.info(
            "republish_requested",
            route=route,
            entity=gap.entity_id,
            from_seq=span[1],
            to_seq=span[2],
            attempt=gap.attempts + 1,
        )

    def _unrecoverable(self, gap: gaps.Gap, reason: str, missing: list[int] | None) -> None:
        conn = self.tools.conn
        route = self.steps[gap.route].route
        if route.snapshot_when_unrecoverable:  # asked first: the gap's row says so after
            asked = self._asker.ask(gap.route, gap.entity_id, f"gap {gap.id}: {reason}")
            reason += "; a snapshot was requested" if asked else ""
        with conn.transaction():
            if not gaps.resolve(conn, gap, GapStatus.UNRECOVERABLE, "sweeper", reason, missing):
                return  # healed or skipped meanwhile: nothing to hold
            self.steps[gap.route].store.hold(conn, gap.entity_id)
        log.error(
            "gap_unrecoverable",
            route=gap.route,
            entity=gap.entity_id,
            from_seq=gap.from_seq,
            to_seq=gap.to_seq,
            reason=reason,
        )

    # ------------------------------------------------------------------ answers and gauges

    def answer(self, result: RepublishResult) -> Answered:
        """Seqs the relay no longer has make their gap unrecoverable.

        Only a result that answers a request the entity's open gap sent, for the generation
        it waits on, is acted on; any other is unmatched (a forgery, or one outlived by its
        gap). The answer's trace context (current while tracing) is kept on the gap for its
        span.
        """
        gap = gaps.find(self.tools.conn, result.entity_type, result.entity_id)
        if gap is None or not gaps.answers(gap, result):
            return Answered.UNMATCHED
        trace = tracing.current_traceparent()
        if trace is not None:
            gaps.answered(self.tools.conn, gap, trace)
        lost = sorted(set(result.missing) | set(result.failed))
        if gap.status == GapStatus.UNRECOVERABLE or not any(
            gap.from_seq <= s <= gap.to_seq for s in lost
        ):
            return Answered.UNCHANGED
        self._unrecoverable(gap, "the outbox no longer has these seqs", lost)
        return Answered.CHANGED

    def gauges(self, *, every: bool) -> None:
        """Gaps by status; with ``every``, also parked events now and the oldest park's age."""
        counts = gaps.status_counts(self.tools.conn)
        for status in GapStatus:
            metrics.GAPS_OPEN.labels(status).set(counts.get(status, 0))
        if not every:
            return
        parks = {stream: applier.route.park_ttl_s for stream, applier in self.steps.items()}
        self._retention.check(parks, self.tools.settings.worst_case_repair_s())
        total, oldest_age = 0, 0.0
        for stream in self.steps:
            parked, since = self.lot.totals(stream)
            total += parked
            if since is not None:  # ages on the server's clock, which wrote the park times
                oldest_age = max(oldest_age, self.lot.now(stream) - since)
        metrics.PARKED_CURRENT.set(total)
        metrics.PARKED_OLDEST_AGE.set(oldest_age)


def duties(routes: Sequence[StepRoute], tools: Resources[SweeperSettings]) -> StepDuties:
    """The step kind's duties over its routes."""
    return StepDuties(routes, tools)
