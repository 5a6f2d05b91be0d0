"""The step batch's retry ladder, pure: every failure mix ends, cut at each first failing step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.kinds.steps.ladder import EXTRA_TRIES, Failure, Rung, climb, tries

ENTITIES = ("a", "b", "c", "d")


def _try(
    rung: Rung, steps: dict[str, int], faulty: set[tuple[str, int]], many: bool
) -> tuple[Failure, tuple[str, tuple[int, int], str] | None] | None:
    """How one try of the batch fails under ``rung`` (None: it commits), as apply_steps sees it.

    Pipelined, a failing statement cannot be traced; a ``many`` call cannot say which of
    its steps failed; one step per call names the first failing step in call order.
    """
    failing = sorted(
        (entity, seq)
        for entity, count in steps.items()
        for seq in range(1, count + 1)
        if (entity, seq) in faulty and (1, seq) < rung.limits.get(entity, (1, count + 1))
    )
    if not failing:
        return None
    if rung.pipelined:
        return Failure.UNTRACED, None
    if many and not rung.single:
        return Failure.MANY, None
    entity, seq = failing[0]
    return Failure.STEP, (entity, (1, seq), f"step {seq} failed")


@settings(max_examples=400, deadline=None)
@given(
    steps=st.dictionaries(st.sampled_from(ENTITIES), st.integers(1, 6), min_size=1),
    faults=st.sets(st.tuples(st.sampled_from(ENTITIES), st.integers(1, 6)), max_size=10),
    many=st.booleans(),
)
def test_every_mix_of_failures_settles_within_the_tries(
    steps: dict[str, int], faults: set[tuple[str, int]], many: bool
) -> None:
    """Whatever steps fail, the batch commits in time with each entity cut at its first failure."""
    rung = Rung()
    for _ in range(tries(sum(steps.values()))):
        failed = _try(rung, steps, faults, many)
        if failed is None:
            break
        failure, step = failed
        climbed = climb(rung, failure, step=step)
        assert climbed is not None
        rung = climbed
    else:
        raise AssertionError(f"unsettled after {tries(sum(steps.values()))} tries: {rung}")
    first = {}
    for entity, seq in sorted(faults):
        if entity in steps and seq <= steps[entity]:
            first.setdefault(entity, (1, seq))
    assert dict(rung.limits) == first
    assert set(rung.causes) == set(first)


@given(st.lists(st.sampled_from(list(Failure)), max_size=12))
def test_the_mode_only_ever_steps_down(failures: list[Failure]) -> None:
    """Once unpipelined or one step per call, a batch never goes back (no try repeats a mode)."""
    rung = Rung()
    for n, failure in enumerate(failures):
        step = (f"e{n}", (1, n + 1), "boom") if failure is Failure.STEP else None
        climbed = climb(rung, failure, step=step)
        if climbed is None:
            assert failure is Failure.DATABASE
            assert not rung.pipelined
            return
        assert climbed.pipelined <= rung.pipelined
        assert climbed.single >= rung.single
        assert set(rung.limits) <= set(climbed.limits)
        rung = climbed


def test_a_database_error_is_retried_unpipelined_once_and_an_outage_never() -> None:
    """Pipelined, an error is tried again unpipelined; then, or on an outage, it rises."""
    unpipelined = climb(Rung(), Failure.DATABASE)
    assert unpipelined == Rung(pipelined=False)
    assert climb(unpipelined, Failure.DATABASE) is None
    assert climb(Rung(), Failure.DATABASE, connection_lost=True) is None


def test_a_later_failure_of_the_same_entity_cuts_it_earlier() -> None:
    """A step failing before an entity's earlier cut moves the cut and its cause."""
    rung = climb(Rung(pipelined=False), Failure.STEP, step=("a", (1, 5), "five"))
    assert rung is not None
    rung = climb(rung, Failure.STEP, step=("a", (1, 2), "two"))
    assert rung is not None
    assert (dict(rung.limits), dict(rung.causes)) == ({"a": (1, 2)}, {"a": "two"})


def test_tries_leave_room_for_both_mode_changes_and_one_more() -> None:
    """A batch of n steps gets n tries for cuts plus the two mode changes and a spare."""
    assert tries(10) == 10 + EXTRA_TRIES == 13
