"""An entity's turn on the lanes' event loop, for a route with ``async def`` steps.

A lane thread that hands each run of awaited steps to the event loop and waits for it
costs a thread per lane, woken once a run: at 128 lanes the loop's thread competes for
the interpreter with 128 others. So on such a route a lane's turn is a coroutine on
that loop, and an entity whose queued events are all awaited steps is read and run
there (``awaited.read_and_run``) with no thread at all. Only what needs a blocking
connection goes to a lane's thread, and the turn awaits it there: what the run could
not settle on its own (a step that raised, was claimed elsewhere, found a call
unfinished, or the steps after a gap), an entity whose Redis may hold parks of it, and
every chunk with other events, a drain or consumers sharing entities, which is applied
from the start as a thread's turn applies it.

The decisions here are pure: which chunks the loop takes, whether a run finished the
entity's turn, and what is left of a chunk when the loop's part failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from consumer.kinds.steps.awaited import Read
from consumer.kinds.steps.handlers import Handlers
from consumer.kinds.steps.plan import Plan
from consumer.kinds.steps.single import Became
from schemas import Event


def takes(handlers: Handlers, shared: bool, events: Sequence[Event]) -> bool:
    """Whether the loop runs these events itself: all awaited steps, of an entity no other
    consumer may run (an entity's lock is a blocking connection's)."""
    return bool(events) and not shared and all(handlers.awaited(e) for e in events)


class Next(Enum):
    """What a turn does once the loop read and ran the entity."""

    AGAIN = "again"  # nothing ran: the chunk is applied from the start on a thread
    ON = "on"  # the run's last step and what is behind it are settled on a thread
    AFTER = "after"  # all applied; Redis may hold parks of the entity to drain
    DONE = "done"  # all applied, nothing to park or drain: the turn is over


def next_after(read: Read | None, done: Plan) -> Next:
    """What is left once the loop's run ended; a run that finished the chunk puts its last
    step into ``done`` (applied) and where the entity stood before (``done.start``)."""
    if read is None or read.ran is None:
        return Next.AGAIN
    ran = read.ran
    if ran.came is not Became.APPLIED or ran.pending:
        return Next.ON
    done.apply.append(ran.event)
    done.start = read.progress
    return Next.AFTER if read.progress.parked_ahead else Next.DONE


def split(events: Sequence[Event], done: Plan) -> tuple[Plan, list[Event]]:
    """When a turn's part raised for its input: what it settled (the steps it applied,
    the failures it decided, a stop), to count, and the chunk's other events in order,
    copies included, to apply again from the start (the stale are found again)."""
    settled = Plan(apply=list(done.apply), failed=list(done.failed), stopped=done.stopped)
    applied = {id(e) for e in done.apply}
    return settled, [e for e in events if id(e) not in applied]
