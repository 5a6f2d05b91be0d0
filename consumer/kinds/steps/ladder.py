"""The retry ladder of one step batch, pure: after each failure, how to try again, or give up.

A batch is first applied pipelined, many steps per call. A failure that cannot be traced
to one entity drops the pipeline (statement by statement, the failing one shows); a
``many`` call that failed is split into one step per call; a step function that raised
cuts its entity short before that step, where its failure is then decided (``failures``).
Each failure either changes the mode (each change happens at most once) or cuts a step,
so the ladder ends within the batch's step count plus ``EXTRA_TRIES`` tries.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

# Tries beyond one per event: each failed step cuts its entity short, and the two
# changes of mode (unpipelined, one step per call) happen at most once each.
EXTRA_TRIES = 3


class Failure(enum.Enum):
    """What went wrong in one try, as far as the ladder cares."""

    UNTRACED = "untraced"  # a pipelined statement failed, or the transaction is aborted
    MANY = "many"  # a call of several steps of one ``many`` function failed
    DATABASE = "database"  # any other error PostgreSQL raised
    STEP = "step"  # a step function raised: its entity and version are known


@dataclass(frozen=True, slots=True)
class Rung:
    """How the next try runs, and which entities stop before which version, and why.

    ``causes``: what cut each entity, as the caller gave it (the step's failure).
    """

    pipelined: bool = True
    single: bool = False
    limits: Mapping[str, tuple[int, int]] = field(default_factory=lambda: MappingProxyType({}))
    causes: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))


def climb(
    rung: Rung,
    failure: Failure,
    *,
    connection_lost: bool = False,
    step: tuple[str, tuple[int, int], object] | None = None,
) -> Rung | None:
    """The rung after ``failure``; None when the failure is not the batch's to handle.

    ``connection_lost``: the database error was an outage (never retried here, the loop
    pauses on it). ``step``: for ``Failure.STEP``, the entity, the failing step's version
    and its cause, which cut the entity before that version.
    """
    if failure is Failure.UNTRACED:
        return replace(rung, pipelined=False)
    if failure is Failure.MANY:
        return replace(rung, pipelined=False, single=True)
    if failure is Failure.DATABASE:
        if connection_lost or not rung.pipelined:
            return None
        return replace(rung, pipelined=False)
    if step is None:
        raise ValueError("a step failure names its entity, version and cause")
    entity_id, version, cause = step
    return replace(
        rung,
        limits=MappingProxyType({**rung.limits, entity_id: version}),
        causes=MappingProxyType({**rung.causes, entity_id: cause}),
    )


def tries(steps: int) -> int:
    """How many tries a batch of ``steps`` may take before it is called unsettled."""
    return steps + EXTRA_TRIES
