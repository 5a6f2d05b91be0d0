"""The local cluster (three KRaft nodes, a six-node Redis Cluster): who leads, kill, restart.

Nodes are the stack's own processes, found by their pid files under the stack's
state folder; a kill is SIGKILL, a restart is ``stack up`` of the service, which
starts only the nodes that are not running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import redis
from confluent_kafka.admin import AdminClient
from redis.cluster import RedisCluster

from tests.support.services import STACK_SCRIPT


class ClusterControl:
    """Kill and restart nodes of the cluster the environment names."""

    def __init__(self, kafka_bootstrap: str, redis_client: RedisCluster) -> None:
        self.state = Path(os.environ["INORDER_STACK_DIR"])
        self.admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        self.redis = redis_client
        self.base = int(os.environ.get("INORDER_CLUSTER_PORT_BASE", "17000"))

    # ------------------------------------------------------------ kafka

    def leaders(self) -> Counter[int]:
        """Partitions led per broker id, over every topic (internal ones too)."""
        topics = self.admin.list_topics(timeout=10).topics.values()
        return Counter(p.leader for t in topics for p in t.partitions.values() if p.leader >= 0)

    def busiest_broker(self) -> int:
        """The broker leading most partitions."""
        return self.leaders().most_common(1)[0][0]

    def kill_broker(self, node: int) -> None:
        """SIGKILL one Kafka node."""
        _kill(self.state / "kafka-cluster" / str(node) / "kafka.pid")

    # ------------------------------------------------------------ redis

    def master_of(self, key: str) -> int:
        """The Redis node number (1..6) of the master serving ``key``'s slot now."""
        node = self.redis.get_node_from_key(key)
        return int(node.port) - self.base

    def kill_redis(self, number: int) -> None:
        """SIGKILL one Redis node."""
        _kill(self.state / "redis-cluster" / str(number) / "redis.pid")

    def promoted(self, old_master: int, key: str, timeout_s: float = 30) -> float:
        """Wait until another node serves ``key``'s slot as master; seconds it took."""
        started = time.monotonic()
        port = self.base + old_master
        while time.monotonic() - started < timeout_s:
            for other in range(1, 7):
                if other == old_master:
                    continue
                try:
                    node = redis.Redis(host="127.0.0.1", port=self.base + other, socket_timeout=1)
                    slots = node.execute_command("CLUSTER", "SLOTS")
                    node.close()
                except redis.RedisError:
                    continue
                slot = self.redis.keyslot(key)
                for start, end, master, *_ in slots:
                    if start <= slot <= end and int(master[1]) != port:
                        return time.monotonic() - started
            time.sleep(0.2)
        raise AssertionError(f"no replica of Redis node {old_master} promoted in {timeout_s}s")

    # ------------------------------------------------------------ both

    def restart(self, *services: str) -> None:
        """Start whatever nodes of these services are down, and wait until they serve."""
        subprocess.run(
            [str(STACK_SCRIPT), "up", *services], check=True, capture_output=True, timeout=300
        )


def _kill(pidfile: Path) -> None:
    pid = int(pidfile.read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} outlived SIGKILL")
