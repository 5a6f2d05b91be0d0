"""Whether a Redis keeps parks, read by a user without CONFIG; a missing permission is named."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from schemas.runtime.redis_client import connect, durability_problem
from tests.support.redis_server import PrivateRedis, private_redis

pytestmark = pytest.mark.services

PASSWORD = "durability-test-pw"  # noqa: S105 - a private throw-away server's user


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateRedis]:
    with private_redis(tmp_path) as running:
        yield running


def _as(server: PrivateRedis, user: str, *rules: str) -> redis.Redis:
    admin = redis.Redis.from_url(server.url)
    admin.acl_setuser(user, enabled=True, passwords=[f"+{PASSWORD}"], reset=True)
    admin.execute_command("ACL", "SETUSER", user, "~*", "&*", *rules)
    admin.close()
    client = connect(f"redis://{user}:{PASSWORD}@127.0.0.1:{server.port}/0")
    assert isinstance(client, redis.Redis)
    return client


def test_a_user_without_config_is_checked_through_info(server: PrivateRedis) -> None:
    """+@all -@admin (no CONFIG): AOF on and noeviction are read from INFO, no problem."""
    client = _as(server, "parker", "+@all", "-@admin", "+info")
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.config_get("appendonly")
    assert durability_problem(client) is None


def test_a_user_that_cannot_run_info_is_told_which_grant_is_missing(
    server: PrivateRedis,
) -> None:
    """No INFO either: one line naming +info, and never the reply's text."""
    client = _as(server, "blind", "+@all", "-@admin", "-info")
    problem = durability_problem(client)
    assert problem is not None
    assert "NOPERM on INFO" in problem
    assert "grant the Redis user +info" in problem
    assert "blind" not in problem


def test_fsync_always_needs_config_get_and_names_it(server: PrivateRedis) -> None:
    """INORDER_PARK_FSYNC=always reads appendfsync: without CONFIG GET, +config|get is named."""
    client = _as(server, "parker", "+@all", "-@admin", "+info")
    problem = durability_problem(client, "always")
    assert problem is not None
    assert "grant the Redis user +config|get" in problem
    allowed = _as(server, "reader", "+@all", "-@admin", "+info", "+config|get")
    assert "has appendfsync no" in (durability_problem(allowed, "always") or "")


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl", "allkeys-random"])
def test_a_store_that_evicts_is_refused(server: PrivateRedis, policy: str) -> None:
    """Any maxmemory-policy but noeviction could drop parked sets: refused, naming the fix."""
    admin = redis.Redis.from_url(server.url)
    admin.config_set("maxmemory-policy", policy)
    client = _as(server, "parker", "+@all", "-@admin", "+info")
    problem = durability_problem(client)
    assert problem is not None
    assert f"maxmemory-policy {policy}" in problem
    assert "set maxmemory-policy noeviction" in problem
    admin.config_set("maxmemory-policy", "noeviction")
    assert durability_problem(client) is None
    admin.close()


def test_aof_off_is_read_from_info(server: PrivateRedis) -> None:
    """appendonly no, seen by a user without CONFIG: the AOF line, as for an admin."""
    admin = redis.Redis.from_url(server.url)
    admin.config_set("appendonly", "no")
    client = _as(server, "parker", "+@all", "-@admin", "+info")
    assert "has AOF off (appendonly no)" in (durability_problem(client) or "")
    admin.close()
