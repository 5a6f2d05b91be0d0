"""The step kind's part of ``inorder-consumer migrate``: parks moved out of 0.1.0's layout.

0.1.0 kept one park index per route; later releases spread each route's parks over
buckets. The move runs here once, as the tables' migrations do, never on the consumer's
or the sweeper's path (a consumer finding parks left in the old layout says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import redis

from consumer.kinds.steps.parking import lot_of
from consumer.kinds.steps.route import StepRoute
from schemas.runtime.logs import first_line

if TYPE_CHECKING:
    from consumer.kinds._resources import Resources
    from consumer.settings import RouteSettings


def upgrade(routes: Sequence[StepRoute], resources: Resources[RouteSettings]) -> list[str]:
    """Check the park layout and move every route's 0.1.0 parks; one line per route moved.

    A migration run without Redis (no ``REDIS_URL``, or one its credentials cannot use:
    a Job that only owns the tables) says in one line that it did not look, and the
    tables' migrations stand; a consumer that later finds old parks says so.
    """
    if resources.settings.redis_url is None:
        return [_NOT_LOOKED.format(why="REDIS_URL is not set")]
    try:
        lot = lot_of(resources)
        lot.check_layout()
        done = []
        for route in routes:
            moved = lot.adopt_legacy(route.stream)
            if moved:
                done.append(f"step route {route.stream}: {moved} parked entities moved from 0.1.0")
    except redis.ConnectionError as exc:  # an authentication refused is one too
        return [_NOT_LOOKED.format(why=f"cannot connect to Redis: {first_line(exc)}")]
    return done


_NOT_LOOKED = "step routes: parks in 0.1.0's layout not looked for ({why})"
