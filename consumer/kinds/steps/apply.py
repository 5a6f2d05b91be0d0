"""Applying a poll batch of step events: one transaction for most, one by one for external calls."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial

import psycopg
import structlog

from consumer.kinds.steps import awaited, made
from consumer.kinds.steps.entity_lock import entity_held
from consumer.kinds.steps.errors import (
    ManyFailedError,
    PipelinedError,
    StepFailedError,
    StepsUnsettledError,
)
from consumer.kinds.steps.failures import failed
from consumer.kinds.steps.handlers import Handlers
from consumer.kinds.steps.ladder import Failure, Rung, climb, tries
from consumer.kinds.steps.lanes import Lanes
from consumer.kinds.steps.plan import (
    Events,
    Plan,
    Progress,
    claimed,
    copies_apart,
    firsts,
    plan,
    share,
    taken,
)
from consumer.kinds.steps.retries import Action
from consumer.kinds.steps.rollback import roll_back_scripts
from consumer.kinds.steps.single import (
    ALONE,
    Became,
    Carried,
    Chain,
    drive,
    next_opening,
    one_step,
    scripted,
)
from consumer.kinds.steps.store import Conn, StepStore
from consumer.kinds.steps.transaction import pipelined_transaction, plain_transaction
from schemas import Event

log = structlog.get_logger(__name__)


def _apply_together(
    conn: Conn,
    store: StepStore,
    handlers: Handlers,
    events: Events,
    skip: set[str],
    rung: Rung,
) -> dict[str, Plan]:
    """One transaction: load the locked progress, decide the share (pure), write.

    Entities whose due steps include an external call are added to ``skip``; an entity
    in the rung's ``limits`` applies only the steps before its limit; the rung says
    whether the transaction is pipelined and whether each step gets its own call.
    """
    # Pipelined, the whole transaction takes two round trips: BEGIN with the locks, then
    # the claims, the functions' statements, the log and COMMIT. (Unless a function reads
    # a result: that takes one more.)
    with pipelined_transaction(conn) if rung.pipelined else plain_transaction(conn) as sync:
        progress = store.lock(conn, firsts(events), sync)
        baseline = store.route.baseline
        decided = share(progress, events, rung.limits, skip, handlers.alone, baseline=baseline)
        skip |= decided.one_by_one
        if rung.pipelined:  # decided under the locks: every claim applies, or the batch fails
            store.advance(conn, decided.claims)
            won = {entity_id for entity_id, _, _ in decided.claims}
        else:
            won = store.claim_many(conn, decided.claims)
        applies, applied = claimed(decided, won)
        handlers.run(conn, applies, pipelined=rung.pipelined, single=rung.single)
        store.record(conn, applied)
    return decided.plans


def _stop(conn: Conn, store: StepStore, entity_id: str, seq: int, reason: str) -> str:
    """Stop the entity before ``seq`` for a person, in its own transaction; the reason."""
    with conn.transaction():
        store.stop(conn, entity_id, seq, reason)
    log.error("step_stopped", route=store.route.stream, entity=entity_id, seq=seq, reason=reason)
    return reason


def _apply_single(
    conn: Conn,
    store: StepStore,
    handlers: Handlers,
    start: Progress,
    event: Event,
    carried: Carried = ALONE,
) -> Became:
    """One step in its own transaction; an external call is recorded, committed, before it.

    ``carried``: the openings sent with closings (``single.drive``).
    """
    external, idempotent = handlers.external(event), handlers.idempotent(event)
    exchange = one_step(store, start, event, external=external, idempotent=idempotent)
    return drive(conn, handlers, exchange, carried)


def _unfinished(conn: Conn, store: StepStore, handlers: Handlers, event: Event) -> str:
    """Stop the entity before ``event``, whose earlier call never finished; the reason."""
    entry = handlers.entry(event)
    assert entry is not None
    reason = (
        f"needs_review: an earlier call of {entry[0].function} may have taken "
        "effect; confirm it before the step is retried"
    )
    return _stop(conn, store, event.entity_id, event.seq, reason)


def _went_on(
    conn: Conn, store: StepStore, handlers: Handlers, done: Plan, ran: awaited.Ran
) -> bool:
    """Settle what came of ``ran.event``: whether the lane goes on past it (it applied, or
    its failure moved the entity on); else it parks, and ``ran.pending`` behind it."""
    event, came = ran.event, ran.came
    if isinstance(came, StepFailedError):  # rolled back: retried later, stopped, moved on
        failure = failed(conn, store, handlers, event, came.error)
        done.settle(failure)
        if failure.verdict.action in (Action.SKIP, Action.DEAD_LETTER):
            return True
    elif came is Became.UNFINISHED_CALL:
        done.stopped = _unfinished(conn, store, handlers, event)
    if came is not Became.APPLIED:
        done.park += [event, *ran.pending]  # it waits too, for a person or the next try
        return False
    done.apply.append(event)
    return True


def apply_alone(
    conn: Conn,
    store: StepStore,
    handlers: Handlers,
    lanes: Lanes,
    entity_id: str,
    events: Sequence[Event],
) -> Plan:
    """Apply an entity's due steps in separate transactions, in order.

    Its progress is read (and its row made) once; each step's claim then moves it on
    only from where the previous step left it, so a step another consumer took first
    is found by the claim, not by reading again.
    """
    done = Plan()
    pending = copies_apart(events, done)  # a version delivered twice: the first copy counts
    with entity_held(conn, store.route.stream, entity_id, shared=store.shared) as held:
        if not held:  # another consumer runs the entity now: it drains these after
            done.end = store.made(conn, firsts({entity_id: pending})[entity_id])
            done.park += pending
            return done
        at = _read(conn, store, handlers, lanes, entity_id, pending, done)
        return _apply_pending(conn, store, handlers, lanes, pending, done, at)


def apply_read(
    conn: Conn,
    store: StepStore,
    handlers: Handlers,
    lanes: Lanes,
    read: awaited.Read,
    done: Plan,
) -> Plan:
    """``apply_alone`` going on from an entity the loop read and ran (``looped``): its
    last step settled here, and the steps behind it applied one by one."""
    ran = read.ran
    assert ran is not None  # a read with no run is planned from the start
    at = (read.progress, None, ran)
    return _apply_pending(conn, store, handlers, lanes, ran.pending, done, at)


# Where an entity's steps start from: its progress as read, the opening the read carried
# (answered) and the run the loop drove with the read (``_read``).
Start = tuple[Progress, Chain | None, awaited.Ran | None]


def _read(
    conn: Conn,
    store: StepStore,
    handlers: Handlers,
    lanes: Lanes,
    entity_id: str,
    pending: list[Event],
    done: Plan,
) -> Start:
    """Where the entity stands before its first step (the earliest of ``pending``); with
    that step's opening when it was guessed and stood (``made``), or, the step awaited,
    the run the loop drove from it (``awaited.read_and_run``)."""
    first = firsts({entity_id: pending})[entity_id]
    lane = scripted(conn)  # a lane's connection: its steps go as scripts
    if lane and handlers.awaited(first):  # read on the loop, with the run from there
        looped = lanes.awaiting(
            partial(
                awaited.read_and_run,
                store=store,
                handlers=handlers,
                first=first,
                pending=pending,
                done=done,
            )
        )
        if looped is not None:
            return looped.progress, None, looped.ran
    if lane:  # read with the first step's opening, guessed (``made``)
        progress, chain = made.read(conn, store, handlers, first, pending)
        return progress, chain, None
    return store.made(conn, first), None, None


def _apply_pending(
    conn: Conn,
    store: StepStore,
    handlers: Handlers,
    lanes: Lanes,
    pending: list[Event],
    done: Plan,
    at: Start,
) -> Plan:
    """``apply_alone`` past its copies, from where ``at`` found the entity (with the
    opening sent with the read, or a run driven from it): each step claimed from there.

    On a lane's connection the read carries the first step's opening, guessed
    (``made``), and a step's closing the next step's (the step due once it applied,
    ``single.next_opening``): one round trip before each call, not two. An entity whose
    first step is ``async def`` is read on the loop, with that step's opening, and its
    run driven there in the same hand-over (``awaited.read_and_run``).
    """
    # The plan once the last step applied, made to carry its opening with that step's
    # closing: the loop goes on from there (the same progress and events) and uses it.
    upcoming: Plan | None = None
    # The opening the last closing carried (or the read, guessed): answered or, failed,
    # rolled back.
    chain: Chain | None = None
    read_run: awaited.Ran | None  # a run the loop drove with the read, settled first
    try:
        progress, chain, read_run = at
        # A lane's connection (its steps go as scripts): idle, or in the opening its read
        # carried.
        lane = chain is not None or scripted(conn)
        # Where it stood, with its park mark: whether Redis may hold parks of it to drain.
        done.start = progress
        while pending or read_run is not None:
            came: Became | StepFailedError
            if read_run is not None:  # driven by the loop with the read
                ran, read_run = read_run, None
                progress, pending, event, came = ran.progress, ran.pending, ran.event, ran.came
            else:
                step_plan = (
                    plan(progress, pending, baseline=store.route.baseline)
                    if upcoming is None
                    else upcoming
                )
                upcoming = None
                nxt, pending = taken(step_plan, pending, done)
                if nxt is None:
                    break
                event = nxt
                answered = None if chain is None else chain.replies
                chain = None
                if handlers.awaited(event):  # it, and the awaited steps after it, on the loop
                    drive_run = partial(
                        awaited.run,
                        store=store,
                        handlers=handlers,
                        due=awaited.Due(progress, event, pending),
                        done=done,
                    )
                    ran = lanes.awaiting(drive_run)
                    progress, pending, event = ran.progress, ran.pending, ran.event
                    came = ran.came
                else:
                    if lane and pending:
                        after = replace(
                            progress, generation=event.generation, last_applied=event.seq
                        )
                        upcoming = plan(after, pending, baseline=store.route.baseline)
                        chain = next_opening(store, handlers, after, upcoming, awaited=False)
                    try:
                        carried = Carried(answered, chain)
                        came = _apply_single(conn, store, handlers, progress, event, carried)
                    except StepFailedError as raised:
                        came = raised
            if not _went_on(
                conn, store, handlers, done, awaited.Ran(progress, pending, event, came)
            ):
                break
            # Where the claim left the entity: no need to read it again for the next step.
            progress = replace(progress, generation=event.generation, last_applied=event.seq)
        return done
    finally:
        if chain is not None and chain.replies is not None:
            roll_back_scripts(conn)  # a next step carried but not driven


def apply_steps(
    conn: Conn,
    store: StepStore,
    handlers: Handlers,
    events: Events,
    lanes: Lanes,
    *,
    defer: bool = False,
) -> tuple[dict[str, Plan], list[str]]:
    """Apply every entity's due steps; each entity's plan (applied, to park, stale).

    Entities with an external call are applied one by one after the rest, in ``lanes``;
    with ``defer`` they are not applied here but named in the second value, without a
    plan, for the caller to give to a lane of their own (``apply_alone``).

    A function that raises rolls the batch back; the batch is applied again with that
    entity's earlier steps only, and the failure is decided (``failures.failed``): the
    entity waits for a retry or a person at the failing seq, or moves on past it.
    A ``many`` call that raises is first run again one step per call to find that step.
    How to try again after each failure is ``ladder.climb``'s to decide.
    """
    skip: set[str] = set()  # entities with an external call: applied one by one after
    rung = Rung()
    for _ in range(tries(sum(map(len, events.values())))):
        try:
            plans = _apply_together(conn, store, handlers, events, skip, rung)
            break
        except (PipelinedError, psycopg.errors.InFailedSqlTransaction):
            climbed = climb(rung, Failure.UNTRACED)
        except ManyFailedError:
            climbed = climb(rung, Failure.MANY)
        except psycopg.Error as exc:
            lost = isinstance(exc, psycopg.OperationalError)
            climbed = climb(rung, Failure.DATABASE, connection_lost=lost)
            if climbed is None:
                raise
        except StepFailedError as failure:
            cut = (failure.entity_id, failure.event.version, failure)
            climbed = climb(rung, Failure.STEP, step=cut)
        assert climbed is not None
        rung = climbed
    else:
        # Cannot happen (every try cuts a step or changes mode); the barrier bisects it.
        raise StepsUnsettledError("step functions kept failing after every step was cut")
    for entity_id, cause in rung.causes.items():
        assert isinstance(cause, StepFailedError)  # the only cause this ladder is given
        plans[entity_id].settle(failed(conn, store, handlers, cause.event, cause.error))
    due = sorted(entity_id for entity_id in skip if plans[entity_id].apply)
    if defer:
        for entity_id in due:
            del plans[entity_id]
        return plans, due
    plans.update(
        lanes.run(
            conn,
            due,
            lambda lane, entity_id: apply_alone(
                lane, store, handlers, lanes, entity_id, events[entity_id]
            ),
        )
    )
    return plans, []
