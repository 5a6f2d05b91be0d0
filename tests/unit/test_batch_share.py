"""A batch route's share decided whole and pure: any order, repeats and cuts assemble the same."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

import schemas
from consumer.kinds.batches.decisions import Batch, Item, Key, Result, Snapshot, assemble
from consumer.kinds.batches.incoming import read
from consumer.kinds.batches.plan import MAX_REASON, Share, bounded_reason, missing_reason
from consumer.kinds.batches.route import BatchRoute
from schemas import Event, batches
from schemas.batches import BatchStatus, ItemState
from schemas.outbox import OutboxEvent
from schemas.outbox.events import check
from schemas.runtime.payloads import default_payload_schemas
from tests.integration import batch_support as bs

SCHEMAS = default_payload_schemas()
KEYS = bs.KEYS


def _manifest(batch_id: str, n: int) -> Event:
    return bs.accepted(batch_id, KEYS[:n])


def _result(batch_id: str, position: int, attempt: int, ok: bool, key: str = "") -> Event:
    return bs.result(batch_id, position, key or None, attempt=attempt, ok=ok)


class Tables:
    """The batch tables as the store keeps them, in memory, to drive shares one after another."""

    def __init__(self) -> None:
        self.batches: dict[str, Batch] = {}
        self.rows: dict[Key, Item] = {}
        self.inputs: dict[Key, object] = {}
        self.early: dict[str, dict[str, Result]] = {}

    def load(self, ids: Iterable[str], keys: Iterable[Key], take: Iterable[str]) -> Snapshot:
        wanted = {b for b in ids if b in self.batches}
        counts = {b: Counter(i.state for (x, _), i in self.rows.items() if x == b) for b in wanted}
        found = [k for k in keys if k in self.rows]
        early = [r for b in take for r in self.early.pop(b, {}).values()]
        return Snapshot(
            {b: self.batches[b] for b in wanted},
            {k: self.rows[k] for k in found},
            {k: self.inputs[k] for k in found},
            counts,
            early,
        )

    def rows_of(self, ids: Sequence[str]) -> dict[str, list[Item]]:
        return {b: [i for (x, _), i in sorted(self.rows.items()) if x == b] for b in ids}

    def write(self, share: Share) -> None:
        for m, fingerprint, problem in share.created:
            status = BatchStatus.INCONSISTENT if problem else BatchStatus.WAITING
            self.batches[m.batch_id] = Batch(
                m.batch_id, m.generation, m.expected_count, fingerprint, m.on_incomplete,
                status, 0, m.deadline_s,
            )  # fmt: skip
            for position, key, given_input in [] if problem else m.items:
                self.rows[m.batch_id, position] = Item(position, key)
                self.inputs[m.batch_id, position] = given_input or {}
        self.rows.update(share.items)
        for result, event in share.kept:
            self.early.setdefault(result.batch_id, {}).setdefault(event.event_id, result)
        for batch_id, (status, _reason, revision) in share.statuses.items():
            batch = self.batches[batch_id]
            self.batches[batch_id] = replace(
                batch, status=status, revision=batch.revision if revision is None else revision
            )

    def take(self, route: BatchRoute, events: Sequence[Event]) -> Share:
        incoming = read(route, events, SCHEMAS)
        share = Share(
            route,
            self.load(incoming.batch_ids, incoming.keys, [m.batch_id for m in incoming.manifests]),
        )
        share.take(incoming)
        share.finish(self.rows_of(share.unread))
        self.write(share)
        return share


def _cut(events: Sequence[Event], cuts: Iterable[int]) -> list[list[Event]]:
    edges = [0, *sorted(set(cuts)), len(events)]
    return [list(events[a:b]) for a, b in pairwise(edges) if a < b]


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 5),
    fails=st.sets(st.integers(1, 5)),
    data=st.data(),
)
def test_any_order_with_duplicates_and_any_cuts_assembles_once_in_position_order(
    n: int, fails: set[int], data: st.DataObject
) -> None:
    """Manifest anywhere, results in any order, twice, cut into shares: one complete assembly."""
    route = BatchRoute("batch", max_retries=1)
    events = [_manifest("b-1", n)]
    for position in range(1, n + 1):
        if position in fails:
            events += [_result("b-1", position, 1, False), _result("b-1", position, 2, True)]
        else:
            events.append(_result("b-1", position, 1, True))
    again = data.draw(st.lists(st.sampled_from(events), max_size=4))
    order = data.draw(st.permutations([*events, *again]))
    cuts = data.draw(st.lists(st.integers(1, max(1, len(order) - 1)), max_size=4))
    tables = Tables()
    outputs: list[OutboxEvent] = []
    for chunk in _cut(order, cuts):
        share = tables.take(route, chunk)
        for batch_id, counts in share.counts.items():
            stored = Counter(i.state for (b, _), i in tables.rows.items() if b == batch_id)
            assert +counts == stored  # the share's counts follow its own changes
        outputs += share.outputs
    assembled = [o for o in outputs if o.event_type == batches.ASSEMBLED]
    assert len(assembled) == 1
    payload = assembled[0].payload
    assert payload["complete"] is True
    assert [(r["position"], r["item_key"]) for r in payload["results"]] == [
        (p, KEYS[p - 1]) for p in range(1, n + 1)
    ]
    assert [r["result_ref"] for r in payload["results"]] == [
        f"r/{KEYS[p - 1]}" for p in range(1, n + 1)
    ]
    work = [o for o in outputs if o.event_type == batches.WORK_ITEM]
    assert all(o.seq == 2 and o.payload["position"] in fails for o in work)
    assert len({o.payload["position"] for o in work}) == len(work)
    assert tables.batches["b-1"].status == BatchStatus.COMPLETE
    assert not tables.early


def test_a_result_that_contradicts_a_fresh_manifest_stops_the_batch_without_dispatching() -> None:
    """Wrong item_key beside a retry in the manifest's own share: inconsistent, nothing sent."""
    route = BatchRoute("batch", max_retries=2)
    tables = Tables()
    share = tables.take(
        route,
        [_manifest("b-2", 3), _result("b-2", 1, 1, False), _result("b-2", 2, 1, True, key="Z")],
    )
    assert share.outputs == []
    assert tables.batches["b-2"].status == BatchStatus.INCONSISTENT
    assert share.inconsistent == 1
    assert [n.event for n in share.notes] == ["batch_inconsistent"]


def test_results_kept_for_a_manifest_that_contradicts_itself_are_taken_and_counted() -> None:
    """Early results of a batch whose manifest is refused are counted stopped, not kept forever."""
    route = BatchRoute("batch")
    tables = Tables()
    tables.take(route, [_result("b-3", 1, 1, True), _result("b-3", 2, 1, True)])
    assert len(tables.early["b-3"]) == 2
    bad = _manifest("b-3", 2)
    items = [{"position": 1, "item_key": "A"}, {"position": 1, "item_key": "B"}]
    share = tables.take(route, [replace(bad, payload={**bad.payload, "items": items})])
    assert tables.batches["b-3"].status == BatchStatus.INCONSISTENT
    assert share.results["batch_stopped"] == 2
    assert "b-3" not in tables.early


def test_a_different_manifest_halts_an_accepted_batch_and_its_results_stop() -> None:
    """A second, different manifest halts the batch; results in the same share change nothing."""
    route = BatchRoute("batch")
    tables = Tables()
    tables.take(route, [_manifest("b-4", 2)])
    share = tables.take(route, [_manifest("b-4", 3), _result("b-4", 1, 1, True)])
    assert tables.batches["b-4"].status == BatchStatus.HALTED
    assert share.results["batch_stopped"] == 1
    assert share.items == {}
    assert [n.event for n in share.notes] == ["batch_halted"]


def test_a_hold_lists_the_missing_positions_and_a_release_assembles_them_missing() -> None:
    """With on_incomplete hold a failed position holds the batch; released, it is listed missing."""
    route = BatchRoute("batch", on_incomplete="hold")
    tables = Tables()
    tables.take(route, [_manifest("b-5", 3), _result("b-5", 1, 1, True)])
    share = tables.take(route, [_result("b-5", 2, 1, False), _result("b-5", 3, 1, True)])
    assert tables.batches["b-5"].status == BatchStatus.HELD
    assert share.statuses["b-5"][1] == "failed: 2"
    assert [n.event for n in share.notes] == ["batch_held"]
    release = Share(route, tables.load(["b-5"], [], []))
    release.settle(["b-5"], release=True, reason="released by ops")
    release.finish(tables.rows_of(release.unread))
    tables.write(release)
    [out] = release.outputs
    assert out.payload["complete"] is False
    assert out.payload["missing_positions"] == [2]
    assert out.payload["reason"] == "released by ops; failed: 2"
    assert tables.rows["b-5", 2].state == ItemState.FAILED


_STATES = st.sampled_from([s for s in ItemState if s != ItemState.DONE] + [ItemState.DONE])


@settings(max_examples=60, deadline=None)
@given(
    states=st.lists(_STATES, min_size=1, max_size=3000),
    said=st.text(max_size=2000),
)
@example(states=[ItemState.FAILED], said="released by a\x00b")  # a NUL no text column holds
def test_an_assembly_of_any_size_passes_the_checks_emit_makes(
    states: list[ItemState], said: str
) -> None:
    """Up to 3,000 positions in any states, any operator's reason: the output is writable."""
    items = [Item(p, f"k{p}", state=s) for p, s in enumerate(states, start=1)]
    reason = "; ".join(x for x in (said, missing_reason(items)) if x)
    payload = assemble("b-1", 1, len(items), items, bounded_reason(reason))
    output = OutboxEvent("batch", "b-1", 2, batches.ASSEMBLED, payload)
    check(output, SCHEMAS)  # raises InvalidEventError when it is not
    assert len(missing_reason(items)) <= 1024


def test_the_reason_bound_is_the_assembly_schema_s() -> None:
    """MAX_REASON is batch.assembled's own maxLength for reason."""
    schema = orjson.loads(
        (Path(schemas.__file__).parent / "json/payloads/batch.assembled.schema.json").read_bytes()
    )
    assert schema["properties"]["reason"]["maxLength"] == MAX_REASON


@settings(max_examples=200)
@given(
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=len(KEYS)),
    held=st.tuples(st.integers(0, 6), st.integers(0, 200)),
    most=st.tuples(st.integers(1, 8), st.integers(1, 300)),
)
def test_results_before_their_manifest_are_kept_only_within_the_routes_room(
    sizes: list[int], held: tuple[int, int], most: tuple[int, int]
) -> None:
    """Kept or refused, never both, never past either bound; a refusal says which bound."""
    route = BatchRoute("batch", max_early_results=most[0], max_early_bytes=most[1])
    events = [_result("nomanifest", p, 1, True) for p in range(1, len(sizes) + 1)]
    size = dict(zip((e.event_id for e in events), sizes, strict=True))
    share = Share(route, Snapshot({}))
    share.take(read(route, events, SCHEMAS), held, lambda e: size[e.event_id])
    kept = [e.event_id for _, e in share.kept]
    refused = [e.event_id for e, _ in share.refused]
    assert sorted(kept + refused) == sorted(size)
    assert held[0] + len(kept) <= max(held[0], most[0])
    assert held[1] + sum(size[k] for k in kept) <= max(held[1], most[1])
    assert all("max_early_results" in why for _, why in share.refused)
    # First come, first kept: a refused result would not have fitted where it came.
    count, used = held
    for event in events:
        fits = count + 1 <= most[0] and used + size[event.event_id] <= most[1]
        assert (event.event_id in kept) == fits
        if fits:
            count, used = count + 1, used + size[event.event_id]
