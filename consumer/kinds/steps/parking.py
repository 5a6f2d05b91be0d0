"""Parking early events in Redis: one sorted set per entity (score = seq), one index per route.

Keys: ``<prefix>:park:{<route>:<entity>}`` (the braces are a Redis Cluster hash tag,
so one entity's set lives in one slot) and ``<prefix>:parkindex:<route>`` (member =
entity, score = first park time on the consumer's clock). The index entry is added
before the event is parked and removed only after the set is seen empty, so a
crash can leave an index entry with nothing parked (the sweeper clears it), never
a parked event that the sweeper cannot find.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis

# ZADD unless the set is at its cap (a member already there may always be re-added),
# then renew the TTL. Returns the set's size, or -1 when the cap refused the event.
_PARK = """
local size = redis.call('ZCARD', KEYS[1])
if size >= tonumber(ARGV[3]) and not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return -1
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return redis.call('ZCARD', KEYS[1])
"""


class ParkingLot:
    """Redis side of parking for every step route."""

    def __init__(self, client: redis.Redis, prefix: str = "inorder") -> None:
        self.client = client
        self.prefix = prefix
        self._park = client.register_script(_PARK)

    def entity_key(self, route: str, entity_id: str) -> str:
        """The sorted set of one entity's parked events."""
        return f"{self.prefix}:park:{{{route}:{entity_id}}}"

    def index_key(self, route: str) -> str:
        """The route's index of parked entities, scored by first park time."""
        return f"{self.prefix}:parkindex:{route}"

    def park(
        self, route: str, items: Sequence[tuple[str, int, bytes]], cap: int, ttl_s: int
    ) -> list[int]:
        """Park ``(entity_id, seq, raw event)`` items; per item the set's size, or -1 if full."""
        if not items:
            return []
        now = time.time()
        with self.client.pipeline(transaction=False) as pipe:
            for entity_id in dict.fromkeys(entity for entity, _, _ in items):
                pipe.zadd(self.index_key(route), {entity_id: now}, nx=True)
            pipe.execute()
        with self.client.pipeline(transaction=False) as pipe:
            for entity_id, seq, raw in items:
                self._park(
                    keys=[self.entity_key(route, entity_id)],
                    args=[raw, seq, cap, ttl_s],
                    client=pipe,
                )
            return [int(size) for size in pipe.execute()]

    def sizes(self, route: str) -> list[tuple[str, int, float]]:
        """Every parked entity of a route: (entity, events parked, first park time)."""
        raw: Any = self.client.zrange(self.index_key(route), 0, -1, withscores=True)
        entries: list[tuple[bytes, float]] = list(raw)
        with self.client.pipeline(transaction=False) as pipe:
            for entity, _ in entries:
                pipe.zcard(self.entity_key(route, entity.decode()))
            counts = pipe.execute()
        return [
            (entity.decode(), int(n), since)
            for (entity, since), n in zip(entries, counts, strict=True)
        ]

    def parked_before(self, route: str, cutoff: float, limit: int) -> list[str]:
        """Entities of a route whose first park is older than ``cutoff`` (oldest first)."""
        raw: Any = self.client.zrangebyscore(self.index_key(route), "-inf", cutoff, 0, limit)
        return [entity.decode() for entity in raw]

    def parked_seqs(self, route: str, entity_id: str) -> list[int]:
        """The seqs parked for one entity, lowest first."""
        raw: Any = self.client.zrange(self.entity_key(route, entity_id), 0, -1, withscores=True)
        return [int(score) for _, score in raw]

    def indexed(self, route: str, entity_ids: Sequence[str]) -> list[str]:
        """The entities among ``entity_ids`` that have (or just had) something parked."""
        if not entity_ids:
            return []
        scores = self.client.zmscore(self.index_key(route), list(entity_ids))
        return [e for e, score in zip(entity_ids, scores, strict=True) if score is not None]

    def fetch(self, route: str, entity_ids: Sequence[str], limit: int) -> dict[str, list[bytes]]:
        """The lowest-seq parked events of each entity (up to ``limit`` each)."""
        if not entity_ids:
            return {}
        with self.client.pipeline(transaction=False) as pipe:
            for entity_id in entity_ids:
                pipe.zrange(self.entity_key(route, entity_id), 0, limit - 1)
            found = pipe.execute()
        return {e: list(members) for e, members in zip(entity_ids, found, strict=True) if members}

    def remove(self, route: str, members: Mapping[str, Sequence[bytes]]) -> None:
        """Remove applied or stale members; drop emptied entities from the index."""
        entities = [e for e, m in members.items() if m]
        if not entities:
            return
        with self.client.pipeline(transaction=False) as pipe:
            for entity_id in entities:
                pipe.zrem(self.entity_key(route, entity_id), *members[entity_id])
            pipe.execute()
        self.unindex_empty(route, entities)

    def unindex_empty(self, route: str, entities: Sequence[str]) -> None:
        """Drop from the route's index the entities whose parked set is empty."""
        with self.client.pipeline(transaction=False) as pipe:
            for entity_id in entities:
                pipe.zcard(self.entity_key(route, entity_id))
            sizes = pipe.execute()
        emptied = [e for e, size in zip(entities, sizes, strict=True) if size == 0]
        if emptied:
            self.client.zrem(self.index_key(route), *emptied)
            self._reindex(route, emptied)

    def _reindex(self, route: str, entities: Sequence[str]) -> None:
        # Something parked between the size check and the index removal: index it again.
        with self.client.pipeline(transaction=False) as pipe:
            for entity_id in entities:
                pipe.zcard(self.entity_key(route, entity_id))
            sizes = pipe.execute()
        now = time.time()
        for entity_id, size in zip(entities, sizes, strict=True):
            if size:
                self.client.zadd(self.index_key(route), {entity_id: now}, nx=True)


def durability_problem(client: redis.Redis, fsync: str = "server") -> str | None:
    """Why parked events could be lost in this Redis, or None when it keeps them.

    ``fsync`` is INORDER_PARK_FSYNC: with ``always`` a park must be on disk before Redis
    answers, so the server must run ``appendfsync always``.
    """
    try:
        config: Any = client.config_get("append*")
    except redis.ResponseError as exc:
        return (
            f"cannot read Redis persistence settings ({exc}); if this is a managed store "
            "with persistence on, set INORDER_PARK_STORE_TRUSTED=true"
        )
    if config.get("appendonly") != "yes":
        return (
            "Redis has AOF off (appendonly no), so parked events could be lost in a restart; "
            "turn on appendonly, or set INORDER_PARK_STORE_TRUSTED=true if the store is "
            "durable some other way"
        )
    if fsync == "always" and config.get("appendfsync") != "always":
        return (
            f"INORDER_PARK_FSYNC=always needs Redis to write every park to disk before it "
            f"answers, but appendfsync is {config.get('appendfsync')}; set appendfsync always "
            "in Redis, or INORDER_PARK_FSYNC=server to accept losing its last second in a "
            "machine crash (the sweeper repairs such losses from the outbox)"
        )
    return None
