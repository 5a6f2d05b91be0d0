"""The parking layout in a real Redis (or Redis Cluster): upgrade, bucket guard, index upkeep."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import structlog

from consumer.errors import RoutesError
from consumer.kinds.steps.parking import NO_MEMORY, ParkingLot
from schemas import encode
from schemas.runtime.redis_client import RedisClient
from tests.conftest import PgSchema
from tests.integration import step_support as ss
from tests.support.redis_server import private_redis
from tests.support.services import ROOT


def _migrate(
    steps_db: PgSchema, redis_prefix: str, tmp_path: Path, **more: str
) -> subprocess.CompletedProcess[str]:
    """``inorder-consumer migrate`` as its own process, over the step route of ``ss``."""
    routes = tmp_path / "routes.toml"
    routes.write_text(ss.routes_text())
    env = {
        **os.environ,
        "DATABASE_URL": steps_db.url,
        "INORDER_ROUTES_FILE": str(routes),
        "INORDER_REDIS_KEY_PREFIX": redis_prefix.rstrip(":"),
        "PYTHONPATH": str(ROOT),
        **more,
    }
    env = {k: v for k, v in env.items() if v}
    return subprocess.run(
        [sys.executable, "-m", "consumer", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )


def test_parks_of_the_one_index_layout_are_moved_by_migrate_and_drain(
    steps_db: PgSchema, redis_client: RedisClient, redis_prefix: str, tmp_path: Path
) -> None:
    """Parks an earlier release wrote (one index per route) stay put while a consumer starts
    (it says so), move over when ``inorder-consumer migrate`` runs, and then drain."""
    prefix = redis_prefix.rstrip(":")
    old_index, old_set = f"{prefix}:parkindex:{ss.STREAM}", f"{prefix}:park:{{{ss.STREAM}:a}}"
    redis_client.zadd(old_index, {"a": 1_700_000_000.0})
    redis_client.zadd(old_set, {encode(ss.step(s)): s for s in (3, 4)})
    redis_client.expire(old_set, 600)
    with structlog.testing.capture_logs() as logs:
        run = ss.runner(redis_client, redis_prefix, ss.routes_text())
    assert [e["entities"] for e in logs if e["event"] == "parks_in_old_layout"] == [1]
    assert redis_client.exists(old_index, old_set) == 2
    done = _migrate(steps_db, redis_prefix, tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"step route {ss.STREAM}: 1 parked entities moved from 0.1.0" in done.stdout
    assert not redis_client.exists(old_index, old_set)
    assert run.lot.parked_seqs(ss.STREAM, "a") == [3, 4]
    assert run.lot.sizes(ss.STREAM) == [("a", 2, 1_700_000_000.0)]
    assert 0 < int(redis_client.ttl(run.lot.entity_key(ss.STREAM, "a"))) <= 600
    with steps_db.connect(autocommit=True) as conn:
        ss.feed(run, conn, [ss.step(1), ss.step(2)])
    assert ss.applied(steps_db) == [(1, s) for s in range(1, 5)]
    assert run.lot.sizes(ss.STREAM) == []
    again = _migrate(steps_db, redis_prefix, tmp_path)
    assert (again.returncode, again.stdout) == (0, "up to date\n")


def test_migrate_without_redis_migrates_the_tables_and_says_it_did_not_look(
    steps_db: PgSchema, redis_prefix: str, tmp_path: Path
) -> None:
    """A migration Job that owns only the tables (no Redis, or Redis refusing it) ends well,
    one line saying the old parks were not looked for."""
    unset = _migrate(steps_db, redis_prefix, tmp_path, REDIS_URL="")
    assert unset.returncode == 0, unset.stderr
    assert "parks in 0.1.0's layout not looked for (REDIS_URL is not set)" in unset.stdout
    refused = _migrate(steps_db, redis_prefix, tmp_path, REDIS_URL="redis://127.0.0.1:1/0")
    assert refused.returncode == 0, refused.stderr
    assert "not looked for (cannot connect to Redis:" in refused.stdout
    assert refused.stdout.startswith("up to date\n")


def test_a_changed_bucket_count_stops_start_up_in_one_line(
    redis_client: RedisClient, redis_prefix: str
) -> None:
    """Parks written with 16 buckets are unreadable with 8: refused, naming the value to set."""
    prefix = redis_prefix.rstrip(":")
    ParkingLot(redis_client, prefix, 16).check_layout()
    with pytest.raises(RoutesError) as refused:
        ParkingLot(redis_client, prefix, 8).check_layout()
    assert str(refused.value).endswith(
        f"INORDER_PARK_BUCKETS is 8 but the parked events under prefix {prefix!r} were "
        "written with 16; set it back to 16"
    )


def test_the_index_lists_exactly_the_entities_with_something_parked(
    redis_client: RedisClient, redis_prefix: str
) -> None:
    """Parking indexes an entity with its event; removing its last event unindexes it."""
    lot = ParkingLot(redis_client, redis_prefix.rstrip(":"))
    entities = [f"e{i}" for i in range(40)]
    sizes = lot.park(ss.STREAM, [(e, 2, encode(ss.step(2, e))) for e in entities], (10, 2**30), 600)
    assert sizes == [1] * 40
    assert sorted(e for e, _, _ in lot.sizes(ss.STREAM)) == sorted(entities)
    assert lot.indexed(ss.STREAM, ["e1", "nobody", "e39"]) == ["e1", "e39"]
    lot.remove(ss.STREAM, {e: [encode(ss.step(2, e))] for e in entities[:30]})
    assert sorted(e for e, _, _ in lot.sizes(ss.STREAM)) == sorted(entities[30:])
    oldest = lot.overdue(ss.STREAM, -60, 5)
    assert len(oldest) == 5
    assert set(oldest) <= set(entities[30:])
    assert lot.overdue(ss.STREAM, 60, 5) == []


def test_park_times_are_the_server_s_and_a_time_ahead_of_it_is_overdue(
    redis_client: RedisClient, redis_prefix: str
) -> None:
    """Parks are timed by Redis; an index entry from a clock days ahead is overdue at once."""
    lot = ParkingLot(redis_client, redis_prefix.rstrip(":"))
    server = lot.now(ss.STREAM)
    lot.park(ss.STREAM, [("now", 2, encode(ss.step(2, "now")))], (10, 2**30), 600)
    [(_, _, parked_at)] = lot.sizes(ss.STREAM)
    assert server <= parked_at <= lot.now(ss.STREAM)
    ahead = 30 * 86_400  # written by a release that used a consumer's clock, 30 days ahead
    redis_client.zadd(lot.index_key(ss.STREAM, "ahead"), {"ahead": server + ahead})
    redis_client.zadd(lot.index_key(ss.STREAM, "soon"), {"soon": server + 1})
    redis_client.zadd(lot.index_key(ss.STREAM, "old"), {"old": server - 100})
    assert lot.overdue(ss.STREAM, 60, 10) == ["old", "ahead"]
    assert lot.overdue(ss.STREAM, 60, 1) == ["old"]


def test_a_park_redis_has_no_memory_for_holds_that_entity_instead_of_raising(
    tmp_path: Path,
) -> None:
    """maxmemory reached (noeviction): the park answers NO_MEMORY for that item, others park."""
    with private_redis(tmp_path) as server:
        client = redis.Redis.from_url(server.url)
        lot = ParkingLot(client, "oom")
        assert lot.park(ss.STREAM, [("small", 2, b"x" * 100)], (10, 2**30), 600) == [1]
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 4096)
        # The first write past the limit is still taken; the next ones are refused OOM.
        lot.park(ss.STREAM, [("big", 2, b"y" * 1_000_000)], (10, 2**30), 600)
        sizes = lot.park(
            ss.STREAM, [("big", 3, b"z" * 1_000_000), ("small", 2, b"x" * 100)], (10, 2**30), 600
        )
        client.close()
    assert sizes == [NO_MEMORY, 1]  # the member already there is only kept longer
