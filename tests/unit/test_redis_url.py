"""REDIS_URL with several cluster seed nodes: how it is read, and seeds that do not answer."""

from __future__ import annotations

import pytest
import redis

from schemas.runtime.redis_client import connect, seed_nodes
from tests.integration.relay_support import free_port


def test_one_node_is_its_own_seed() -> None:
    """A plain URL is kept as it is."""
    assert seed_nodes("redis://127.0.0.1:6379/0") == (
        "redis://127.0.0.1:6379/0",
        [("127.0.0.1", 6379)],
    )


def test_several_nodes_keep_credentials_and_database_on_the_first() -> None:
    """Credentials and the path stay; each listed node becomes a seed; no port means 6379."""
    first, nodes = seed_nodes("rediss://user:secret@a.example:7000,b.example:7001,c.example/0")
    assert first == "rediss://user:secret@a.example:7000/0"
    assert nodes == [("a.example", 7000), ("b.example", 7001), ("c.example", 6379)]


def test_seeds_that_do_not_answer_are_an_outage_not_a_crash() -> None:
    """No seed reachable: redis.ConnectionError, which every service waits out, unready."""
    url = f"redis://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/0"
    with pytest.raises(redis.ConnectionError, match="cannot be connected"):
        connect(url, socket_timeout=1, socket_connect_timeout=1)
