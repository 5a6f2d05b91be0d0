"""A lane's turn on the event loop, its pure decisions: which chunks, what is left after a run."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from consumer.kinds.steps import looped
from consumer.kinds.steps.awaited import Ran, Read
from consumer.kinds.steps.errors import StepFailedError
from consumer.kinds.steps.handlers import Handlers
from consumer.kinds.steps.plan import Plan, Progress
from consumer.kinds.steps.route import Handler
from consumer.kinds.steps.single import Became
from schemas import Event

WHEN = "2026-12-06T10:00:00Z"


def _event(seq: int, event_type: str = "ledger.awaited", copy: int = 0) -> Event:
    return Event(f"a:{seq}:{copy}", event_type, "ledger", "a", 1, seq, WHEN, WHEN, {})


def _called(conn: Any, event: Event) -> None:
    """A plain step function."""


async def _awaited(aconn: Any, event: Event) -> None:
    """An ``async def`` step function."""


HANDLERS = Handlers(
    {
        "ledger.awaited": (Handler("tests:awaited"), _awaited),
        "ledger.added": (Handler("tests:called"), _called),
    }
)
AT = Progress(1, 2)


def _read(came: Became | StepFailedError, pending: list[Event], at: Progress = AT) -> Read:
    return Read(at, Ran(at, pending, _event(3), came))


def test_the_loop_takes_a_chunk_of_awaited_steps_only_of_an_entity_no_one_shares() -> None:
    """All awaited and not shared: taken; a plain step, sharing or no events: a thread's."""
    awaited = [_event(1), _event(2)]
    assert looped.takes(HANDLERS, False, awaited)
    assert not looped.takes(HANDLERS, True, awaited)
    assert not looped.takes(HANDLERS, False, [*awaited, _event(3, "ledger.added")])
    assert not looped.takes(HANDLERS, False, [_event(1, "ledger.unknown")])
    assert not looped.takes(HANDLERS, False, [])


def test_a_run_that_applied_every_step_ends_the_turn_unless_parks_may_wait() -> None:
    """Applied, nothing behind: its last step joins what applied, and the turn is over; with
    a park mark ahead of where it stood, Redis is asked after (on a thread)."""
    done = Plan(apply=[_event(1), _event(2)])
    assert looped.next_after(_read(Became.APPLIED, []), done) is looped.Next.DONE
    assert [e.seq for e in done.apply] == [1, 2, 3]
    assert done.start == AT
    marked = Progress(1, 2, parked=(1, 9))
    done = Plan()
    assert looped.next_after(_read(Became.APPLIED, [], marked), done) is looped.Next.AFTER
    assert ([e.seq for e in done.apply], done.start) == ([3], marked)
    assert looped.next_after(_read(Became.APPLIED, [], Progress(1, 9, parked=(1, 9))), Plan()) is (
        looped.Next.DONE
    )


def test_a_run_that_left_anything_unsettled_goes_on_on_a_thread_with_nothing_counted() -> None:
    """Behind the last step, steps not yet due; or the last step raised, was claimed
    elsewhere, found a call unfinished: the thread settles it, from the run."""
    failed = StepFailedError("a", _event(3), ValueError("no"))
    for came, pending in [
        (Became.APPLIED, [_event(5)]),
        (Became.CLAIMED_ELSEWHERE, []),
        (Became.UNFINISHED_CALL, [_event(4)]),
        (failed, []),
    ]:
        done = Plan()
        assert looped.next_after(_read(came, pending), done) is looped.Next.ON
        assert (done.apply, done.start) == ([], None)


def test_nothing_read_or_no_run_applies_the_chunk_again_from_the_start() -> None:
    """No row came, or the guessed opening did not stand: the thread applies it all."""
    done = Plan()
    assert looped.next_after(None, done) is looped.Next.AGAIN
    assert looped.next_after(Read(AT, None), done) is looped.Next.AGAIN
    assert done.apply == []


@given(
    seqs=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    data=st.data(),
)
def test_after_a_failure_what_applied_is_counted_and_all_else_goes_again_in_order(
    seqs: list[int], data: st.DataObject
) -> None:
    """Any chunk with copies, any of its events applied: those counted once, every other
    event (a copy of an applied one too) applied again, in the order it came."""
    events = [_event(seq, copy=i) for i, seq in enumerate(seqs)]
    applied = data.draw(st.lists(st.sampled_from(events), unique_by=id))
    done = Plan(apply=applied, stale=list(events[:1]), stopped="needs_review")
    settled, rest = looped.split(events, done)
    assert settled.apply == applied
    assert (settled.stale, settled.stopped) == ([], "needs_review")
    assert rest == [e for e in events if all(e is not a for a in applied)]
