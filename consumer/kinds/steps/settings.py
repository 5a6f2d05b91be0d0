"""The step kind's process settings: how parks are kept and how many lanes a route gets.

Composed into the consumer's settings (``Kind.process``); the generated settings tables
list them under the step kind.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.runtime.config import InorderSettings


class StepSettings(InorderSettings):
    """Parking in Redis and the lanes of step routes."""

    park_buckets: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="Buckets each step route's parked entities are spread over (Redis Cluster "
        "slots); fixed once events are parked: start-up refuses a change",
    )
    park_store_trusted: bool = Field(
        default=False,
        description="Start step routes without checking that Redis keeps parks (AOF on, no "
        "eviction): for a managed store durable another way",
    )
    park_fsync: Literal["server", "always"] = Field(
        default="server",
        description="When a park counts as stored: `server` when Redis has it in memory (with "
        "`appendfsync everysec` a machine crash loses up to its last second of parks, which "
        "the sweeper then finds and repairs from the outbox); `always` when it is on disk: "
        "start-up requires Redis `appendfsync always`, so nothing parked is lost",
    )
    step_lanes: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Lanes of every step route that does not set its own `lanes`: entities "
        "whose steps call outside PostgreSQL applied at once, each on a connection of its own",
    )
