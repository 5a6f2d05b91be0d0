"""A lane's run of ``async def`` steps, driven on the lanes' event loop.

A lane hands the loop not one awaited step at a time but the run of them: the step it
took, then each next step due while that one is awaited too, on one async connection
and in one hand-over between the lane's thread and the loop. Each closing carries the
next step's opening, as on the lane's own connection, so a step takes one round trip
of its own besides its function's. The run ends at the first step that did not apply
(it raised, was claimed elsewhere, found an unfinished call) or that is not awaited,
or when nothing more is due: that last step and where the entity stood before it go
back to the lane, which settles it as it settles a step it drove itself.

An entity whose first due step is awaited is read on the loop too (``read_and_run``),
its first opening guessed and sent with the read, as the lane's own read does for its
steps: the lane's thread then waits through the whole entity, its connection unused.
A lane's turn that is itself a coroutine on the loop (``looped``) reads and runs its
entity the same way (``read_entity``), with no thread waiting.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from consumer.kinds.steps import made
from consumer.kinds.steps.errors import StepFailedError
from consumer.kinds.steps.handlers import Handlers
from consumer.kinds.steps.lanes import AsyncConn
from consumer.kinds.steps.plan import Plan, Progress, copies_apart, firsts, plan, taken
from consumer.kinds.steps.rollback import roll_back_scripts_async
from consumer.kinds.steps.single import (
    Became,
    Carried,
    Chain,
    Replies,
    drive_async,
    next_opening,
    one_step,
)
from consumer.kinds.steps.store import StepStore
from schemas import Event


@dataclass(frozen=True, slots=True)
class Ran:
    """The run's last step, what came of it, where the entity stood before it, what is left.

    Every step before ``event`` applied (``done.apply`` has them); ``came`` is what
    became of ``event``, or the failure its function raised.
    """

    progress: Progress
    pending: list[Event]
    event: Event
    came: Became | StepFailedError


@dataclass(frozen=True, slots=True)
class Due:
    """Where a run starts: the entity's progress, the awaited step due from it and the
    events behind that step; ``answered``, its opening, when the read sent it."""

    progress: Progress
    event: Event
    pending: list[Event]
    answered: Replies | None = None


async def run(aconn: AsyncConn, store: StepStore, handlers: Handlers, due: Due, done: Plan) -> Ran:
    """Drive ``due.event`` and the awaited steps due after it."""
    baseline = store.route.baseline
    progress, event, pending, answered = due.progress, due.event, due.pending, due.answered
    chain: Chain | None = None
    try:
        while True:
            after = replace(progress, generation=event.generation, last_applied=event.seq)
            upcoming = plan(after, pending, baseline=baseline) if pending else None
            chain = next_opening(store, handlers, after, upcoming, awaited=True)
            external, idempotent = handlers.external(event), handlers.idempotent(event)
            exchange = one_step(store, progress, event, external=external, idempotent=idempotent)
            try:
                came = await drive_async(aconn, handlers, exchange, Carried(answered, chain))
            except StepFailedError as raised:
                return Ran(progress, pending, event, raised)
            if came is not Became.APPLIED or chain is None or upcoming is None:
                return Ran(progress, pending, event, came)
            done.apply.append(event)
            progress = after
            answered, chain = chain.replies, None
            nxt, pending = taken(upcoming, pending, done)
            assert nxt is not None  # the chain was made for it
            event = nxt
    finally:
        if chain is not None and chain.replies is not None:
            await roll_back_scripts_async(aconn)  # a next step carried but not driven


@dataclass(frozen=True, slots=True)
class Read:
    """An entity read on the loop: where it stood and, when the opening of its first
    step, guessed, stood, the run driven from there (else None: the lane plans it)."""

    progress: Progress
    ran: Ran | None


async def read_and_run(
    aconn: AsyncConn,
    store: StepStore,
    handlers: Handlers,
    first: Event,
    pending: list[Event],
    done: Plan,
) -> Read | None:
    """Read the entity whose first step (``first``, the earliest of ``pending``) is
    awaited on the loop, with that step's opening (``made.read_async``), and drive the run
    from it when the opening stood: one hand-over and one round trip before the first
    call. None: no row came, and the lane reads it itself."""
    got = await made.read_async(aconn, store, handlers, first, pending)
    if got is None:
        return None
    progress, chain = got
    if chain is None or chain.replies is None:
        return Read(progress, None)
    try:
        event, rest = taken(plan(progress, pending, baseline=store.route.baseline), pending, done)
        assert event is first  # the opening was guessed for it
    except BaseException:
        await roll_back_scripts_async(aconn)
        raise
    due = Due(progress, event, rest, chain.replies)
    return Read(progress, await run(aconn, store, handlers, due, done))


async def read_entity(
    aconn: AsyncConn, store: StepStore, handlers: Handlers, events: list[Event], done: Plan
) -> Read | None:
    """``read_and_run`` for one entity's events, every one an awaited step, past their
    copies (stale, into ``done``), from the earliest: a lane's turn on the loop."""
    pending = copies_apart(events, done)
    entity_id = pending[0].entity_id
    first = firsts({entity_id: pending})[entity_id]
    return await read_and_run(aconn, store, handlers, first, pending, done)
