"""The sweeper's Redis lease: one holder at a time, renewal, takeover after expiry, release."""

from __future__ import annotations

import time

import redis

from consumer.sweeper.lease import Lease


def test_only_one_holder_until_it_lapses_or_is_released(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    """A second contender waits while the holder renews, and takes over once it stops."""
    key = f"{redis_prefix}lease"
    first, second = Lease(redis_client, key, 600), Lease(redis_client, key, 600)
    assert first.keep()
    assert not second.keep()
    for _ in range(3):  # renewals keep it past its TTL
        time.sleep(0.3)
        assert first.keep()
        assert not second.keep()
    time.sleep(0.8)  # the holder stopped renewing: the lease lapses
    assert second.keep()
    assert not first.keep()
    second.release()
    assert first.keep()
    assert redis_client.get(key) == first.holder.encode()


def test_release_does_not_drop_someone_elses_lease(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    """A lapsed holder that releases late leaves the new holder's lease in place."""
    key = f"{redis_prefix}lease"
    old, new = Lease(redis_client, key, 200), Lease(redis_client, key, 5000)
    assert old.keep()
    time.sleep(0.4)
    assert new.keep()
    old.release()
    assert redis_client.get(key) == new.holder.encode()
