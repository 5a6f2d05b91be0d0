"""The step kind's start-up check: parks go only to a Redis that keeps them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from consumer.kinds.steps.errors import StoreNotDurableError
from schemas.runtime.redis_client import durability_problem

if TYPE_CHECKING:
    from consumer.kinds._resources import Resources
    from consumer.settings import RouteSettings


def check(resources: Resources[RouteSettings]) -> None:
    """Connect Redis and refuse one that can lose parks (``StoreNotDurableError``).

    With no ``REDIS_URL`` the step routes say so themselves when they are connected.
    ``INORDER_PARK_STORE_TRUSTED`` skips the check for a store durable another way.
    """
    settings = resources.settings
    if settings.redis_url is None:
        return
    client = resources.redis
    client.ping()
    problem = durability_problem(client, settings.park_fsync)
    if problem is not None and not settings.park_store_trusted:
        raise StoreNotDurableError(problem)
