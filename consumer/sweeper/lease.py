"""A Redis lease: one holder at a time, renewed while alive, taken over when it lapses."""

from __future__ import annotations

import os
import socket
import uuid

from schemas.runtime.redis_client import RedisClient

# Renew only a lease we still hold; a lapsed one may already be someone else's.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class Lease:
    """Holds ``key`` for ``ttl_ms`` at a time; ``keep`` must be called well within the TTL."""

    def __init__(self, client: RedisClient, key: str, ttl_ms: int) -> None:
        self.client = client
        self.key = key
        self.ttl_ms = ttl_ms
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self.held = False

    def keep(self) -> bool:
        """Take the lease if it is free, renew it if ours; True while we hold it."""
        if self.held and self._renew(keys=[self.key], args=[self.holder, self.ttl_ms]):
            return True
        self.held = bool(self.client.set(self.key, self.holder, nx=True, px=self.ttl_ms))
        return self.held

    def release(self) -> None:
        """Give the lease up at once, so a standby need not wait for it to lapse."""
        if self.held:
            self._release(keys=[self.key], args=[self.holder])
            self.held = False
