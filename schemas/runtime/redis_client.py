"""Reaching the parking store: one Redis or a Redis Cluster, and whether it keeps parks.

A ``redis://`` URL names either; the server says which (``INFO cluster``), so the
same setting works for both. A cluster may be given several seed nodes,
``redis://host1:7000,host2:7000/0``, so start-up does not depend on one node.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException

from schemas.runtime.causes import reply_code

# A parking store: one Redis, or a Redis Cluster.
RedisClient = redis.Redis | RedisCluster


def seed_nodes(url: str) -> tuple[str, list[tuple[str, int]]]:
    """The URL of the first node, and every node the URL lists."""
    parts = urlsplit(url)
    credentials, _, hosts = parts.netloc.rpartition("@")
    nodes = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":") if ":" in host else (host, "", "6379")
        nodes.append((name, int(port or 6379)))
    first = f"{credentials}@{hosts.split(',')[0]}" if credentials else hosts.split(",")[0]
    return urlunsplit(parts._replace(netloc=first)), nodes


def connect(url: str, **options: Any) -> RedisClient:
    """A client for the store at ``url``: ``RedisCluster`` when it is a cluster.

    ``options`` are connection options both clients take (timeouts). Raises
    ``redis.ConnectionError`` when no listed node answers.
    """
    first, nodes = seed_nodes(url)
    if len(nodes) > 1:
        return _cluster(first, nodes, options)
    plain = redis.Redis.from_url(first, **options)
    try:
        info: Any = plain.info("cluster")
    except redis.exceptions.NoPermissionError:
        return plain  # a user without INFO: the durability check names the grant
    except BaseException:
        plain.close()
        raise
    if not info.get("cluster_enabled"):
        return plain
    plain.close()
    return _cluster(first, nodes, options)


def _cluster(first: str, nodes: list[tuple[str, int]], options: dict[str, Any]) -> RedisCluster:
    options = {k: v for k, v in options.items() if k != "health_check_interval"}
    try:
        return RedisCluster.from_url(
            first,
            startup_nodes=[ClusterNode(h, p) for h, p in nodes],  # type: ignore[no-untyped-call]
            **options,
        )
    except RedisClusterException as exc:
        # No seed answered: an outage to wait out like any other, not a crash.
        raise redis.ConnectionError(str(exc)) from exc


def each_node(client: RedisClient) -> list[tuple[str, redis.Redis]]:
    """(name, plain client) for every node that holds parks (a cluster's masters and replicas)."""
    if isinstance(client, RedisCluster):
        nodes = client.get_nodes()  # type: ignore[no-untyped-call]
        return [(node.name, client.get_redis_connection(node)) for node in nodes]
    return [("redis", client)]


def durability_problem(client: RedisClient, fsync: str = "server") -> str | None:
    """Why parked events could be lost in this store, or None when every node keeps them.

    Read from ``INFO persistence`` and ``INFO memory``, which a user without ``CONFIG``
    may run: AOF must be on and nothing evicted (``maxmemory-policy noeviction``; any
    other policy drops parked sets under memory pressure). ``fsync`` is INORDER_PARK_FSYNC:
    with ``always`` every node must run ``appendfsync always``, which only ``CONFIG GET``
    shows. A permission missing for either is named.
    """
    for name, node in each_node(client):
        who = "Redis" if name == "redis" else f"Redis node {name}"
        try:
            persistence: Any = node.info("persistence")
            memory: Any = node.info("memory")
        except redis.ResponseError as exc:
            return (
                f"cannot read whether {who} keeps parked events ({_reply_word(exc)} on INFO); "
                "grant the Redis user +info, or, for a managed store known to persist, set "
                "INORDER_PARK_STORE_TRUSTED=true"
            )
        if str(persistence.get("aof_enabled", "0")) != "1":
            return (
                f"{who} has AOF off (appendonly no), so parked events could be lost in a "
                "restart; turn on appendonly, or set INORDER_PARK_STORE_TRUSTED=true if the "
                "store is durable some other way"
            )
        policy = memory.get("maxmemory_policy", "noeviction")
        if policy != "noeviction":
            return (
                f"{who} evicts keys when memory is full (maxmemory-policy {policy}), which "
                "would drop parked events; set maxmemory-policy noeviction"
            )
        if fsync == "always":
            problem = _fsync_problem(node, who)
            if problem is not None:
                return problem
    return None


def _fsync_problem(node: redis.Redis, who: str) -> str | None:
    try:
        config: Any = node.config_get("appendfsync")
    except redis.ResponseError as exc:
        return (
            f"INORDER_PARK_FSYNC=always needs to read the appendfsync of {who} "
            f"({_reply_word(exc)} on CONFIG GET); grant the Redis user +config|get, or set "
            "INORDER_PARK_FSYNC=server"
        )
    if config.get("appendfsync") == "always":
        return None
    return (
        f"INORDER_PARK_FSYNC=always needs Redis to write every park to disk before it "
        f"answers, but {who} has appendfsync {config.get('appendfsync')}; set "
        "appendfsync always in Redis, or INORDER_PARK_FSYNC=server to accept losing "
        "its last second in a machine crash (the sweeper repairs such losses from the "
        "outbox)"
    )


def _reply_word(exc: redis.ResponseError) -> str:
    """NOPERM for a permission refused, else the reply's first word (never the rest)."""
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return "NOPERM"
    return reply_code(exc) or "refused"
