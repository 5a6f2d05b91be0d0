"""How relays share the slices: each live relay's fair share, and what to take or give back.

Pure, no I/O. Every relay sees the same list of live relays (from PostgreSQL), so all
agree on who gets one slice more when the slices do not divide evenly, without talking
to each other. Slices are only taken when free or when their lease has expired, and
given back by their owner, so two relays never hold one slice at once.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Plan:
    """The slices a relay should take and give back now."""

    take: tuple[int, ...]
    release: tuple[int, ...]


def share(me: str, live: Sequence[str], slices: int) -> int:
    """How many slices ``me`` should hold among the ``live`` relays (``me`` among them)."""
    members = sorted({*live, me})
    base, extra = divmod(slices, len(members))
    return base + (1 if members.index(me) < extra else 0)


def plan(
    me: str, live: Sequence[str], owned: Collection[int], available: Collection[int], slices: int
) -> Plan:
    """Take available (free or expired) slices up to the fair share, or give back the excess.

    Taking starts from the lowest slice number and giving back from the highest, so the
    slices a relay keeps are stable while membership is.
    """
    target = share(me, live, slices)
    mine = sorted(owned)
    if len(mine) > target:
        return Plan((), tuple(mine[target:]))
    wanted = [s for s in sorted(available) if s not in owned][: target - len(mine)]
    return Plan(tuple(wanted), ())
