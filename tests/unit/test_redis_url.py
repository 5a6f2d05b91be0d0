"""REDIS_URL with several cluster seed nodes: the URL of the first, and every node listed."""

from __future__ import annotations

from consumer.kinds.steps.connection import seed_nodes


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
