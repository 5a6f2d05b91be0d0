"""Parking early events in Redis: one sorted set per entity, indexed per route and bucket.

Every entity falls in one of ``buckets`` buckets of its route (a CRC-32 of its id).
The bucket's index and the sets of its entities share one Redis Cluster hash tag,
``{<route>:<bucket>}``, so every script here touches keys of one slot only:

- ``<prefix>:park:{<route>:<bucket>}:<entity>``: the entity's parked events
  (member = the raw event, score = seq), with the route's park TTL;
- ``<prefix>:parkindex:{<route>:<bucket>}``: the bucket's parked entities
  (member = entity, score = first park time on the Redis server's clock);
- ``<prefix>:parkcounts:{<route>:<bucket>}``: events parked per entity of the bucket (a
  hash), and ``<prefix>:parktotal:{<route>:<bucket>}``: their sum, both kept by the park
  and removal scripts, so the parked-events gauge reads one number per bucket instead of
  every entity's set;
- ``<prefix>:parkcounted:<route>``: set once the route's counts were taken from its sets
  (parks of releases before the counts are counted on the sweeper's first gauge pass);
- ``<prefix>:parklayout``: the bucket count the keys were written with;
- ``<prefix>:parkmarks:<route>``: set once every park of the route has its mark in
  PostgreSQL (parks of releases before the marks are marked on the first batch).

A park adds the index entry and the event in one script, and a removal drops the
entry in the same script that empties the set, so the index never misses a parked
entity. An index entry can outlive its set only when the set's TTL lapses; the
sweeper clears those. On a single Redis the layout is the same.

Park times come from one clock, the server's (``TIME`` in the script, read again by the
sweeper), so a consumer or sweeper whose own clock jumped neither writes parks that are
never overdue nor sees every park as overdue. A score still in the future (written by a
release that used the consumer's clock, or by a master whose clock ran ahead before a
failover) counts as overdue: the sweeper looks at it now rather than never.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import redis
from redis.commands.core import Script

from consumer.errors import NotConfiguredError, RoutesError
from schemas.runtime.redis_client import RedisClient

if TYPE_CHECKING:
    from consumer.kinds._resources import Resources
    from consumer.settings import RouteSettings

# KEYS: set, index, bytes, counts, total. ARGV: member, seq, cap, ttl, entity, cap in bytes.
# A member already there is only kept longer. Otherwise, unless the set is at its cap in
# events or in bytes (its members' lengths, counted beside it), index the entity at the
# server's time, ZADD, count the event and its bytes and renew the TTLs. Returns the set's
# size, or -1 when refused (a set that expired leaves its counts behind: they are taken
# back and counted anew).
_PARK = """
local size = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  redis.call('EXPIRE', KEYS[3], ARGV[4])
  return size
end
if size == 0 then
  redis.call('DEL', KEYS[3])
  local stale = tonumber(redis.call('HGET', KEYS[4], ARGV[5]) or '0')
  if stale ~= 0 then
    redis.call('DECRBY', KEYS[5], stale)
    redis.call('HDEL', KEYS[4], ARGV[5])
  end
end
local held = tonumber(redis.call('GET', KEYS[3]) or '0')
if size >= tonumber(ARGV[3]) or held + #ARGV[1] > tonumber(ARGV[6]) then
  return -1
end
local now = redis.call('TIME')
redis.call('ZADD', KEYS[2], 'NX', now[1] + now[2] / 1000000, ARGV[5])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('INCRBY', KEYS[3], #ARGV[1])
redis.call('HINCRBY', KEYS[4], ARGV[5], 1)
redis.call('INCR', KEYS[5])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[3], ARGV[4])
return size + 1
"""

# KEYS: set, index, bytes, counts, total. ARGV: entity, members to remove... Uncounts
# what it removes; drops the index entry and the counts when the set is left empty (what
# the entity's count still holds then is events its set lost another way: its TTL, or a
# park of a release before the counts); returns the set's size.
_REMOVE = """
local gone, removed = 0, 0
for i = 2, #ARGV do
  local r = redis.call('ZREM', KEYS[1], ARGV[i])
  gone = gone + r * #ARGV[i]
  removed = removed + r
end
if removed > 0 then
  redis.call('HINCRBY', KEYS[4], ARGV[1], -removed)
  redis.call('DECRBY', KEYS[5], removed)
end
local size = redis.call('ZCARD', KEYS[1])
if size == 0 then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('DEL', KEYS[3])
  local stale = tonumber(redis.call('HGET', KEYS[4], ARGV[1]) or '0')
  if stale ~= 0 then
    redis.call('DECRBY', KEYS[5], stale)
  end
  redis.call('HDEL', KEYS[4], ARGV[1])
elseif gone > 0 then
  redis.call('DECRBY', KEYS[3], gone)
end
return size
"""

# KEYS: set, counts, total. ARGV: entity. Sets the entity's count to its set's size and
# moves the total by the difference (relative, so parks meanwhile stay counted).
_RECOUNT = """
local size = redis.call('ZCARD', KEYS[1])
local had = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if size == 0 then
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  redis.call('HSET', KEYS[2], ARGV[1], size)
end
if size ~= had then
  redis.call('INCRBY', KEYS[3], size - had)
end
return size
"""
# What ``park`` answers for an item Redis had no memory for: the entity is held, as at
# its cap, and the route goes on (Redis full for one entity's events is that entity's).
NO_MEMORY = -2


# How far ahead of the server's clock a park time may be before it counts as overdue.
FUTURE_S = 5.0


# KEYS: index. ARGV: deadline, ahead, limit. The entries parked longer than the deadline,
# and those ahead of the server's clock, each with its time, on that server's clock.
_OVERDUE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local found = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]),
  'WITHSCORES', 'LIMIT', 0, ARGV[3])
local ahead = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. (now + tonumber(ARGV[2])), '+inf',
  'WITHSCORES', 'LIMIT', 0, ARGV[3])
for i = 1, #ahead do found[#found + 1] = ahead[i] end
return found
"""

# KEYS: any key of the server asked. The server's clock.
_TIME = "return redis.call('TIME')"


# A set's cap: (events, bytes).
Cap = tuple[int, int]


def _no_memory(result: Any) -> bool:
    """Whether a pipelined reply is Redis refusing a write for want of memory."""
    if isinstance(result, redis.exceptions.OutOfMemoryError):
        return True
    return isinstance(result, redis.ResponseError) and str(result).startswith("OOM")


def bucket_of(entity_id: str, buckets: int) -> int:
    """The bucket of an entity: stable across processes and releases."""
    return zlib.crc32(entity_id.encode()) % buckets


class ParkingLot:
    """Redis side of parking for every step route."""

    def __init__(self, client: RedisClient, prefix: str = "inorder", buckets: int = 16) -> None:
        self.client = client
        self.prefix = prefix
        self.buckets = buckets
        self._park = Script(client, _PARK)
        self._remove = Script(client, _REMOVE)
        self._recount = Script(client, _RECOUNT)
        self._overdue = Script(client, _OVERDUE)
        self._time = Script(client, _TIME)

    def _tag(self, route: str, entity_id: str) -> str:
        return f"{{{route}:{bucket_of(entity_id, self.buckets)}}}"

    def entity_key(self, route: str, entity_id: str) -> str:
        """The sorted set of one entity's parked events."""
        return f"{self.prefix}:park:{self._tag(route, entity_id)}:{entity_id}"

    def bytes_key(self, route: str, entity_id: str) -> str:
        """The count of the bytes one entity has parked (beside its set, in its slot)."""
        return f"{self.prefix}:parkbytes:{self._tag(route, entity_id)}:{entity_id}"

    def _keys(self, route: str, entity_id: str) -> list[str]:
        tag = self._tag(route, entity_id)
        return [
            self.entity_key(route, entity_id),
            self.index_key(route, entity_id),
            self.bytes_key(route, entity_id),
            f"{self.prefix}:parkcounts:{tag}",
            f"{self.prefix}:parktotal:{tag}",
        ]

    def index_key(self, route: str, entity_id: str) -> str:
        """The index of the entity's bucket, scored by first park time."""
        return f"{self.prefix}:parkindex:{self._tag(route, entity_id)}"

    def _tags(self, route: str) -> list[str]:
        """The hash tag of each bucket of a route."""
        return [f"{{{route}:{b}}}" for b in range(self.buckets)]

    def index_keys(self, route: str) -> list[str]:
        """Every bucket index of a route."""
        return [f"{self.prefix}:parkindex:{tag}" for tag in self._tags(route)]

    def counted_key(self, route: str) -> str:
        """Set once the route's counts were taken from its sets."""
        return f"{self.prefix}:parkcounted:{route}"

    def layout_key(self) -> str:
        """Where the bucket count the keys were written with is kept."""
        return f"{self.prefix}:parklayout"

    def marks_key(self, route: str) -> str:
        """Set once every park of ``route`` has its mark in PostgreSQL."""
        return f"{self.prefix}:parkmarks:{route}"

    def marks_complete(self, route: str) -> bool:
        """True once ``marked`` was called for ``route``."""
        return bool(self.client.exists(self.marks_key(route)))

    def marked(self, route: str) -> None:
        """Record that every park of ``route`` has its mark."""
        self.client.set(self.marks_key(route), "1")

    def check_layout(self) -> None:
        """Record the bucket count, or refuse one that differs from the stored one.

        Keys written with another count would sit in buckets nobody reads, so a change
        needs an empty lot (``inorder-admin parked top`` shows none) and the stored key
        deleted.
        """
        wanted = str(self.buckets)
        self.client.set(self.layout_key(), wanted, nx=True)
        raw: Any = self.client.get(self.layout_key())
        stored = raw.decode() if raw is not None else wanted
        if stored != wanted:
            raise RoutesError(
                [
                    f"INORDER_PARK_BUCKETS is {wanted} but the parked events under prefix "
                    f"{self.prefix!r} were written with {stored}; set it back to {stored}"
                ]
            )

    def legacy(self, route: str) -> int:
        """Entities still parked in 0.1.0's one-index layout (``adopt_legacy`` moves them)."""
        return int(self.client.zcard(f"{self.prefix}:parkindex:{route}"))

    def adopt_legacy(self, route: str) -> int:
        """Move parks kept in 0.1.0's one-index layout; returns entities moved.

        That layout had ``<prefix>:parkindex:<route>`` and ``<prefix>:park:{<route>:<entity>}``.
        Each entity is copied (seqs, first park time, TTL) before its old keys are
        deleted, so a crash midway leaves it in both layouts and the next call finishes it.
        """
        old_index = f"{self.prefix}:parkindex:{route}"
        moved = 0
        while True:
            entries: Any = self.client.zrange(old_index, 0, 499, withscores=True)
            if not entries:
                return moved
            for raw_entity, since in entries:
                entity_id = raw_entity.decode()
                old_key = f"{self.prefix}:park:{{{route}:{entity_id}}}"
                members: Any = self.client.zrange(old_key, 0, -1, withscores=True)
                ttl: Any = self.client.ttl(old_key)
                if members:
                    key = self.entity_key(route, entity_id)
                    self.client.zadd(key, dict(members))
                    self.client.zadd(self.index_key(route, entity_id), {entity_id: since}, nx=True)
                    if ttl > 0:
                        self.client.expire(key, ttl)
                self.client.delete(old_key)
                self.client.zrem(old_index, entity_id)
                moved += 1

    def park(
        self, route: str, items: Sequence[tuple[str, int, bytes]], cap: Cap, ttl_s: int
    ) -> list[int]:
        """Park ``(entity_id, seq, raw event)`` items; per item the set's size, -1 when it is
        full (``cap``: events, bytes), ``NO_MEMORY`` when Redis had no room for it."""
        calls = [
            (self._keys(route, entity_id), [raw, seq, cap[0], ttl_s, entity_id, cap[1]])
            for entity_id, seq, raw in items
        ]
        results = self._scripted(self._park, calls, out_of_memory=NO_MEMORY)
        return [int(size) for size in results]

    def remove(self, route: str, members: Mapping[str, Sequence[bytes]]) -> None:
        """Remove applied or stale members; drop emptied entities from the index."""
        calls = [
            (self._keys(route, entity_id), [entity_id, *gone])
            for entity_id, gone in members.items()
            if gone
        ]
        self._scripted(self._remove, calls)

    def unindex_empty(self, route: str, entities: Sequence[str]) -> None:
        """Drop from the index the entities whose parked set is empty (its TTL lapsed)."""
        calls = [(self._keys(route, e), [e]) for e in entities]
        self._scripted(self._remove, calls)

    def _scripted(
        self,
        script: Script,
        calls: Sequence[tuple[list[str], list[Any]]],
        *,
        out_of_memory: int | None = None,
    ) -> list[Any]:
        """Run ``script`` once per call in one pipeline, by SHA.

        ``out_of_memory``: what a call Redis refused for want of memory (OOM) answers,
        instead of raising as any other error does.

        A restarted server or a promoted replica may not have the script: on NOSCRIPT it
        is loaded (on every master of a cluster) and the whole pipeline run again, which
        is safe because both scripts are idempotent. The command is sent as such because
        redis-py's cluster pipeline has no ``evalsha`` method (it routes EVALSHA by key).
        """
        if not calls:
            return []
        for attempt in range(2):
            with self.client.pipeline(transaction=False) as pipe:
                for keys, args in calls:
                    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
                results: list[Any] = pipe.execute(raise_on_error=False)
            if attempt == 0 and any(isinstance(r, redis.exceptions.NoScriptError) for r in results):
                self.client.script_load(script.script)
                continue
            break
        if out_of_memory is not None:
            results = [out_of_memory if _no_memory(r) else r for r in results]
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results

    def now(self, route: str) -> float:
        """The clock of the Redis server that keeps the route's first bucket."""
        [(seconds, micros)] = self._scripted(self._time, [([self.index_keys(route)[0]], [])])
        return int(seconds) + int(micros) / 1_000_000

    def _index_entries(self, route: str) -> list[tuple[str, float]]:
        """(entity, first park time) over every bucket, oldest first."""
        with self.client.pipeline(transaction=False) as pipe:
            for key in self.index_keys(route):
                pipe.zrange(key, 0, -1, withscores=True)
            found: list[Any] = pipe.execute()
        entries = [(entity.decode(), float(since)) for bucket in found for entity, since in bucket]
        return sorted(entries, key=lambda entry: entry[1])

    def sizes(self, route: str) -> list[tuple[str, int, float]]:
        """Every parked entity of a route: (entity, events parked, first park time)."""
        entries = self._index_entries(route)
        with self.client.pipeline(transaction=False) as pipe:
            for entity, _ in entries:
                pipe.zcard(self.entity_key(route, entity))
            counts = pipe.execute()
        return [(entity, int(n), since) for (entity, since), n in zip(entries, counts, strict=True)]

    def recount(self, route: str, entities: Sequence[str]) -> None:
        """Take each entity's count from its set (and the totals by the difference)."""
        calls = []
        for entity in entities:
            set_key, _, _, counts, total = self._keys(route, entity)
            calls.append(([set_key, counts, total], [entity]))
        self._scripted(self._recount, calls)

    def totals(self, route: str) -> tuple[int, float | None]:
        """Events parked over the route, and its oldest park time, from one counter and
        the index's first entry per bucket (no entity's set is read).

        The first call for a route counts every parked entity from its sets (parks of a
        release before the counts), then marks the route counted. A total below zero
        (events counted out that were never counted in) has the route counted again.
        """
        if not self.client.exists(self.counted_key(route)):
            self._recount_all(route)
            self.client.set(self.counted_key(route), "1")
        total, oldest = self._read_totals(route)
        if total < 0:
            self._recount_all(route)
            total, oldest = self._read_totals(route)
        return max(total, 0), oldest

    def _recount_all(self, route: str) -> None:
        """Take the count of every entity the route's indexes hold from its set."""
        self.recount(route, [entity for entity, _ in self._index_entries(route)])

    def _read_totals(self, route: str) -> tuple[int, float | None]:
        """The sum of the route's bucket totals (negative if any is), and its oldest park."""
        with self.client.pipeline(transaction=False) as pipe:
            for tag in self._tags(route):
                pipe.get(f"{self.prefix}:parktotal:{tag}")
                pipe.zrange(f"{self.prefix}:parkindex:{tag}", 0, 0, withscores=True)
            found: list[Any] = pipe.execute()
        totals = [int(raw or 0) for raw in found[0::2]]
        firsts = [float(first[0][1]) for first in found[1::2] if first]
        total = -1 if any(n < 0 for n in totals) else sum(totals)
        return total, min(firsts, default=None)

    def overdue(self, route: str, deadline_s: float, limit: int) -> list[str]:
        """Up to ``limit`` entities of a route parked longer than ``deadline_s``, oldest first.

        Ages are read on the server's clock; a park time in the future counts as overdue.
        """
        calls = [([key], [deadline_s, FUTURE_S, limit]) for key in self.index_keys(route)]
        entries = [
            (bucket[i].decode(), float(bucket[i + 1]))
            for bucket in self._scripted(self._overdue, calls)
            for i in range(0, len(bucket), 2)
        ]
        return [entity for entity, _ in sorted(entries, key=lambda entry: entry[1])[:limit]]

    def parked_seqs(self, route: str, entity_id: str) -> list[int]:
        """The seqs parked for one entity, lowest first."""
        raw: Any = self.client.zrange(self.entity_key(route, entity_id), 0, -1, withscores=True)
        return [int(score) for _, score in raw]

    def indexed(self, route: str, entity_ids: Sequence[str]) -> list[str]:
        """The entities among ``entity_ids`` that have (or just had) something parked."""
        if not entity_ids:
            return []
        by_index: dict[str, list[str]] = defaultdict(list)
        for entity_id in entity_ids:
            by_index[self.index_key(route, entity_id)].append(entity_id)
        with self.client.pipeline(transaction=False) as pipe:
            for key, entities in by_index.items():
                pipe.zmscore(key, entities)
            found = pipe.execute()
        present = {
            entity
            for entities, scores in zip(by_index.values(), found, strict=True)
            for entity, score in zip(entities, scores, strict=True)
            if score is not None
        }
        return [e for e in entity_ids if e in present]

    def fetch(self, route: str, entity_ids: Sequence[str], limit: int) -> dict[str, list[bytes]]:
        """The lowest-seq parked events of each entity (up to ``limit`` each)."""
        if not entity_ids:
            return {}
        with self.client.pipeline(transaction=False) as pipe:
            for entity_id in entity_ids:
                pipe.zrange(self.entity_key(route, entity_id), 0, limit - 1)
            found = pipe.execute()
        return {e: list(members) for e, members in zip(entity_ids, found, strict=True) if members}


def lot_of(resources: Resources[RouteSettings]) -> ParkingLot:
    """Parked events under the consumers' key prefix and bucket count (their settings)."""
    try:
        client = resources.redis
    except NotConfiguredError:
        raise RoutesError(["the routes file has step routes: set REDIS_URL for parking"]) from None
    settings = resources.settings
    return ParkingLot(client, settings.redis_key_prefix, settings.park_buckets)
