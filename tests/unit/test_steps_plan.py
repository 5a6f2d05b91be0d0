"""The pure step decision: apply in order, park early, ignore stale, start a new generation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.kinds.steps import Handler, StepRoute
from consumer.kinds.steps.metrics import REORDER_DISTANCE
from consumer.kinds.steps.plan import Progress, plan, reorder_distance
from consumer.routes import parse_routes
from schemas import Event


def _e(seq: int, generation: int = 1, entity: str = "s1") -> Event:
    return Event(f"{entity}:{generation}:{seq}", "l.x", "l", entity, generation, seq, "t", "t", {})


def _seqs(events: list[Event]) -> list[tuple[int, int]]:
    return [e.version for e in events]


def test_seed_example_six_then_eight_then_seven() -> None:
    """Applied up to 6: 8 parks; then 7 applies (and 8 is due)."""
    parked = plan(Progress(1, 6), [_e(8)])
    assert (_seqs(parked.apply), _seqs(parked.park)) == ([], [(1, 8)])
    now = plan(Progress(1, 6), [_e(7), _e(8)])
    assert _seqs(now.apply) == [(1, 7), (1, 8)]
    assert now.end == Progress(1, 8)


def test_duplicates_and_old_seqs_are_stale() -> None:
    """Seqs already applied, and second copies in one batch, are stale."""
    result = plan(Progress(1, 5), [_e(3), _e(6), _e(6), _e(5)])
    assert _seqs(result.apply) == [(1, 6)]
    assert sorted(_seqs(result.stale)) == [(1, 3), (1, 5), (1, 6)]


def test_new_generation_starts_over_and_old_one_is_stale() -> None:
    """A newer generation starts over at seq 1; old-generation events after it are stale."""
    result = plan(Progress(1, 9), [_e(10), _e(1, 2), _e(2, 2)])
    assert _seqs(result.apply) == [(1, 10), (2, 1), (2, 2)]
    assert result.end == Progress(2, 2)
    late = plan(result.end, [_e(11), _e(12, 1)])
    assert (_seqs(late.apply), _seqs(late.stale)) == ([], [(1, 11), (1, 12)])


def test_newer_generation_without_its_first_seq_parks() -> None:
    """A newer generation's seq 3 waits for its seq 1 and 2."""
    result = plan(Progress(1, 4), [_e(3, 2)])
    assert _seqs(result.park) == [(2, 3)]
    assert reorder_distance(Progress(1, 4), _e(3, 2)) == 3


def test_stopped_entity_applies_nothing_and_parks_the_rest() -> None:
    """An entity waiting for a person parks its due events instead of applying them."""
    result = plan(Progress(1, 4, stopped=True), [_e(5), _e(6), _e(2)])
    assert (_seqs(result.apply), _seqs(result.park), _seqs(result.stale)) == (
        [],
        [(1, 5), (1, 6)],
        [(1, 2)],
    )


@given(
    order=st.permutations(list(range(1, 31))),
    duplicates=st.lists(st.integers(1, 30), max_size=15),
    cuts=st.lists(st.integers(1, 44), max_size=8, unique=True),
    data=st.data(),
)
def test_any_permutation_with_duplicates_applies_each_step_once_in_order(
    order: list[int], duplicates: list[int], cuts: list[int], data: st.DataObject
) -> None:
    """Delivered in any order with duplicates, in batches, with parking: 1..30 once, in order."""
    delivered = data.draw(st.permutations(order + duplicates))
    progress = Progress(1, 0)
    parked: dict[int, Event] = {}
    applied: list[int] = []
    bounds = sorted({c for c in cuts if c < len(delivered)})
    for start, end in zip([0, *bounds], [*bounds, len(delivered)], strict=True):
        batch = plan(progress, [_e(s) for s in delivered[start:end]])
        applied += [e.seq for e in batch.apply]
        progress = batch.end or progress
        parked.update({e.seq: e for e in batch.park})
        while True:  # drain, as the runner does after every batch
            drained = plan(progress, list(parked.values()))
            for event in drained.apply + drained.stale:
                parked.pop(event.seq, None)
            if not drained.apply:
                break
            applied += [e.seq for e in drained.apply]
            progress = drained.end or progress
    assert applied == list(range(1, 31))
    assert parked == {}


def test_step_route_is_parsed_with_handlers_and_flags() -> None:
    """Handlers may be a 'module:function' string or a table with external/idempotent."""
    [route] = parse_routes(
        '[[route]]\nstream = "seat_ledger"\nkind = "step"\nmax_parked = 50\n'
        '[route.handlers]\n"seat_ledger.seats_added" = "billing.steps:add"\n'
        '[route.handlers."seat_ledger.closed"]\nfunction = "billing.mail:bye"\nexternal = true\n'
    )
    assert route == StepRoute(
        "seat_ledger",
        {
            "seat_ledger.seats_added": Handler("billing.steps:add"),
            "seat_ledger.closed": Handler("billing.mail:bye", external=True),
        },
        max_parked=50,
    )


def test_reorder_distance_is_what_its_metric_help_says() -> None:
    """8 arriving after 6 is distance 1, as event_reorder_distance's help (and README) state."""
    assert reorder_distance(Progress(1, 6), _e(8)) == 1
    assert reorder_distance(Progress(1, 6), _e(7)) == 0
    assert "8 after 6 is 1" in REORDER_DISTANCE.describe()[0].documentation


@pytest.mark.parametrize(
    ("progress", "ahead"),
    [
        (Progress(1, 4), False),
        (Progress(1, 4, parked=(1, 4)), False),
        (Progress(1, 4, parked=(1, 3)), False),
        (Progress(1, 4, parked=(1, 6)), True),
        (Progress(1, 4, parked=(2, 1)), True),
        (Progress(2, 1, parked=(1, 9)), False),
    ],
)
def test_parked_ahead_compares_generation_first_then_seq(progress: Progress, ahead: bool) -> None:
    """A mark is ahead only when newer than what was applied; no mark is never ahead."""
    assert progress.parked_ahead is ahead


def _snapshot(seq: int, generation: int = 1) -> Event:
    return Event(f"snap:{seq}", "l.snapshot", "l", "s1", generation, seq, "t", "t", {})


def _run(delivered: list[Event], cuts: list[int], *, baseline: bool) -> list[Event]:
    """Feed ``delivered`` in batches with parking and draining, as the runner does."""
    progress = Progress(1, 0)
    parked: dict[int, Event] = {}
    applied: list[Event] = []
    bounds = sorted({c for c in cuts if c < len(delivered)})
    for start, end in zip([0, *bounds], [*bounds, len(delivered)], strict=True):
        batch = plan(progress, delivered[start:end], baseline=baseline)
        applied += batch.apply
        progress = batch.end or progress
        parked.update({id(e): e for e in batch.park})
        while True:
            drained = plan(progress, list(parked.values()), baseline=baseline)
            for event in drained.apply + drained.stale:
                parked.pop(id(event), None)
            if not drained.apply:
                break
            applied += drained.apply
            progress = drained.end or progress
    assert parked == {}
    return applied


@given(
    snapshot_at=st.integers(1, 20),
    duplicates=st.lists(st.integers(1, 20), max_size=8),
    cuts=st.lists(st.integers(1, 30), max_size=6, unique=True),
    baseline=st.booleans(),
    data=st.data(),
)
def test_a_snapshot_is_ignored_or_moves_the_entity_on_but_never_takes_a_step_s_place(
    snapshot_at: int, duplicates: list[int], cuts: list[int], baseline: bool, data: st.DataObject
) -> None:
    """Shuffled, duplicated: no baseline, no effect; baseline: one jump, steps in order around."""
    events = [_e(s) for s in range(1, 21)] + [_e(s) for s in duplicates]
    delivered = data.draw(st.permutations([*events, _snapshot(snapshot_at)]))
    applied = _run(delivered, cuts, baseline=baseline)
    snapshots = [e for e in applied if e.event_type == "l.snapshot"]
    steps = [e.seq for e in applied if e.event_type != "l.snapshot"]
    if not baseline:
        assert (snapshots, steps) == ([], list(range(1, 21)))
        return
    assert [e.version for e in applied] == sorted(e.version for e in applied)
    assert len(snapshots) <= 1
    skipped_to = snapshots[0].seq if snapshots else 0
    assert steps == [s for s in range(1, 21) if s > skipped_to or s < _jumped_from(applied)]
    assert len(set(steps)) == len(steps)


def _jumped_from(applied: list[Event]) -> int:
    """The first seq after the steps applied before the snapshot (all of them, if none came)."""
    before = []
    for event in applied:
        if event.event_type == "l.snapshot":
            return (before[-1] if before else 0) + 1
        before.append(event.seq)
    return 10**9


def test_a_baseline_snapshot_waits_while_its_entity_is_stopped() -> None:
    """Stopped for a person, an entity parks a newer snapshot rather than jumping past the stop."""
    result = plan(Progress(1, 4, stopped=True), [_snapshot(9)], baseline=True)
    assert (_seqs(result.apply), _seqs(result.park)) == ([], [(1, 9)])
    stale = plan(Progress(1, 9), [_snapshot(9), _snapshot(3)], baseline=True)
    assert _seqs(stale.stale) == [(1, 3), (1, 9)]
