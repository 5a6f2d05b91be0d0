"""A lane's run of ``async def`` steps, driven on the lanes' event loop.

A lane hands the loop not one awaited step at a time but the run of them: the step it
took, then each next step due while that one is awaited too, on one async connection
and in one hand-over between the lane's thread and the loop. Each closing carries the
next step's opening, as on the lane's own connection, so a step takes one round trip
of its own besides its function's. The run ends at the first step that did not apply
(it raised, was claimed elsewhere, found an unfinished call) or that is not awaited,
or when nothing more is due: that last step and where the entity stood before it go
back to the lane, which settles it as it settles a step it drove itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from consumer.kinds.steps.errors import StepFailedError
from consumer.kinds.steps.handlers import Handlers
from consumer.kinds.steps.lanes import AsyncConn
from consumer.kinds.steps.plan import Plan, Progress, plan, taken
from consumer.kinds.steps.rollback import roll_back_scripts_async
from consumer.kinds.steps.single import Became, Carried, Chain, drive_async, next_opening, one_step
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


async def run(
    aconn: AsyncConn,
    store: StepStore,
    handlers: Handlers,
    progress: Progress,
    event: Event,
    pending: list[Event],
    done: Plan,
) -> Ran:
    """Drive ``event`` (awaited, due from ``progress``) and the awaited steps due after it."""
    baseline = store.route.baseline
    answered = None
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
