"""A lane's first read of an entity, sent with the opening of the step it most likely applies.

A lane reads (or makes) an entity's progress before it plans the entity's steps, and
the first step's opening then waits for that plan: two round trips before the first
call. Where an entity's events arrive one at a time, as they do when its steps are
spread over time, every step pays both.

The step due is nearly always the earliest event the lane holds, one past where the
entity stands. So, when the plan from that start applies that event first, its opening
is sent in the same script as the read, each statement conditional on the guess: the
attempt is recorded only while the entity stands there (an attempt recorded for a step
that is not due would later read as a call cut short), and the claim moves the
progress only from there. What the opening answered then decides, not what the read
did (another applier may move the entity between the two): an attempt recorded, or a
claim made without one, stands for the step's own opening (``single.Carried``), the
step driven from the guessed start. Otherwise nothing was written: the guessed
transaction is rolled back and the step, planned from the read, sends its own opening.

An entity whose first step is ``async def`` is read on the lanes' event loop instead
(``read_async``), on the async connection its run of awaited steps then goes on with:
the read carries that step's opening as the lane's read carries its own steps'.
"""

from __future__ import annotations

from dataclasses import replace

from consumer.kinds.steps import script
from consumer.kinds.steps.handlers import Handlers
from consumer.kinds.steps.lanes import AsyncConn
from consumer.kinds.steps.plan import Progress, plan
from consumer.kinds.steps.rollback import roll_back_scripts, roll_back_scripts_async
from consumer.kinds.steps.single import Chain, opening
from consumer.kinds.steps.store import Conn, StepStore
from schemas import Event
from schemas.snapshot import is_snapshot


def _start(first: Event) -> Progress:
    """Where the entity is guessed to stand: one seq before ``first``."""
    return Progress(first.generation, first.seq - 1)


def guessed(
    store: StepStore,
    handlers: Handlers,
    first: Event,
    pending: list[Event],
    *,
    awaited: bool = False,
) -> Chain | None:
    """The opening of ``first`` from one seq before it, conditional on the entity standing
    there; None unless the plan of ``pending`` from there applies ``first`` first, or when
    ``first`` is not opened where the read is sent (``awaited``: on the loop's async
    connection, where an ``async def`` step opens; else on the lane's own)."""
    if handlers.awaited(first) != awaited or is_snapshot(first):
        return None
    start = _start(first)
    due = plan(start, pending, baseline=store.route.baseline)
    if not due.apply or due.apply[0] is not first:
        return None
    external, idempotent = handlers.external(first), handlers.idempotent(first)
    return Chain(
        opening(store, start, first, external=external, idempotent=idempotent, guessed=True)
    )


def _parts(chain: Chain | None, store: StepStore, first: Event) -> list[script.Part]:
    """The read's script: the progress, then the guessed opening (if any)."""
    return [store.made_query(first), *(chain.opening.parts() if chain is not None else [])]


def _stood(chain: Chain | None, done: script.Answers) -> bool:
    """Whether the guessed opening stood (its replies then set on ``chain``): an attempt
    recorded, or a claim made where the step records none."""
    if chain is None or done.error is not None:
        return False
    fresh, claimed = chain.opening.replies(done.rows[1:])
    recorded = fresh is not None if chain.opening.attempt is not None else claimed is not None
    if recorded:
        chain.replies = (fresh, claimed)
    return recorded


def read(
    conn: Conn, store: StepStore, handlers: Handlers, first: Event, pending: list[Event]
) -> tuple[Progress, Chain | None]:
    """The entity's progress, its row made if missing, from ``first`` (the earliest of
    ``pending``); with ``first``'s opening, guessed, answered in the same script when it
    stands (``Chain.replies`` set: the connection is then in that step's transaction, to
    be driven or rolled back) and the progress then the guessed start."""
    chain = guessed(store, handlers, first, pending)
    done = script.answers(conn, _parts(chain, store, first))
    if not done.rows:  # the read itself failed
        assert done.error is not None
        roll_back_scripts(conn)
        raise done.error
    row = done.rows[0]
    if _stood(chain, done):
        # The park mark as read (none read: the row under a lock, in the step's
        # transaction, which moved only its progress).
        parked = store.made_from(conn, first, row).parked
        return replace(_start(first), parked=parked), chain
    roll_back_scripts(conn)  # nothing guessed was written
    return store.made_from(conn, first, row), None


async def read_async(
    aconn: AsyncConn, store: StepStore, handlers: Handlers, first: Event, pending: list[Event]
) -> tuple[Progress, Chain | None] | None:
    """``read`` on the loop's ``aconn``, guessing the opening of ``first``, an ``async def``
    step; None, with nothing left open, when no row came (made meanwhile by another
    transaction): the lane then reads it under a lock, as ``read`` does."""
    chain = guessed(store, handlers, first, pending, awaited=True)
    done = await script.answers_async(aconn, _parts(chain, store, first))
    if not done.rows:
        assert done.error is not None
        await roll_back_scripts_async(aconn)
        raise done.error
    row = done.rows[0]
    if row is None:
        await roll_back_scripts_async(aconn)
        return None
    progress = store.made_row(row)
    if _stood(chain, done):
        return replace(_start(first), parked=progress.parked), chain
    await roll_back_scripts_async(aconn)
    return progress, None
