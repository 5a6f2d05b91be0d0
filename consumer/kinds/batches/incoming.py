"""A batch route's share of a poll batch, read: manifests, worker results, and what is refused.

Pure: each event's payload is checked against its schema and turned into a ``Manifest``
or a ``Result``; an event of the wrong type, with a payload its schema refuses or an
entity_id that does not match its position is refused with the reason, and the route's
own ``batch.assembled`` output read back is set aside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from consumer.kinds.batches.decisions import Key, Manifest, Result
from consumer.kinds.batches.route import BatchRoute
from schemas import Event, PayloadError, batches
from schemas.batches import item_entity_id
from schemas.validation import PayloadSchemas

RESULT_TYPES = (batches.SUCCEEDED, batches.FAILED)


@dataclass(slots=True)
class Incoming:
    """What a share's events ask of the route, and what it refuses or sets aside."""

    manifests: list[Manifest] = field(default_factory=list)
    results: list[tuple[Result, Event]] = field(default_factory=list)
    refused: list[tuple[Event, str]] = field(default_factory=list)
    ignored: list[Event] = field(default_factory=list)  # the route's own output read back

    @property
    def batch_ids(self) -> list[str]:
        """Every batch the share names, each once, in order."""
        named = {m.batch_id for m in self.manifests} | {r.batch_id for r, _ in self.results}
        return sorted(named)

    @property
    def keys(self) -> list[Key]:
        """The positions the share's results name."""
        return sorted({(r.batch_id, r.position) for r, _ in self.results})


def read(route: BatchRoute, events: Sequence[Event], schemas: PayloadSchemas) -> Incoming:
    """Check each event's payload; turn it into a manifest or a result, or refuse it."""
    incoming = Incoming()
    for event in events:
        kind = event.event_type
        own = event.entity_type == route.stream
        if kind == batches.ASSEMBLED and own:
            incoming.ignored.append(event)
            continue
        if kind not in ((batches.ACCEPTED,) if own else RESULT_TYPES):
            incoming.refused.append(
                (event, f"event type {kind} does not belong to {event.entity_type} events")
            )
            continue
        try:
            schemas.validate(kind, event.payload)
        except PayloadError as exc:
            incoming.refused.append((event, str(exc)))
            continue
        if kind == batches.ACCEPTED:
            incoming.manifests.append(_manifest(route, event))
            continue
        result = Result.from_payload(event.seq, kind == batches.SUCCEEDED, event.payload)
        expected = item_entity_id(result.batch_id, result.position)
        if event.entity_id != expected:
            incoming.refused.append(
                (event, f"entity_id {event.entity_id!r} is not batch_id#position ({expected!r})")
            )
            continue
        incoming.results.append((result, event))
    return incoming


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
