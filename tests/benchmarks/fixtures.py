"""Benchmark helpers: throw-away schemas, a consumer timed until done, services as processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

from consumer.routes import parse_routes
from consumer.service import ConsumerService
from consumer.settings import ConsumerSettings
from schemas.runtime.health import Health
from tests.support.threads import serving


def delete_topics(bootstrap: str, prefix: str) -> None:
    """Delete every topic whose name starts with ``prefix``: the suite's and its services'.

    A relay or consumer started by a suite creates its request, result and dead-letter
    topics next to the suite's; left behind, thousands of them slowed the broker (its
    heap and collections) for every run after.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [name for name in admin.list_topics(timeout=30).topics if name.startswith(prefix)]
    if names:
        for future in admin.delete_topics(names).values():
            future.result(timeout=30)


@contextmanager
def fresh_topic(bootstrap: str, prefix: str, partitions: int) -> Iterator[str]:
    """A new topic named ``prefix`` and a random tail, deleted with its services' at the end."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=30)
    try:
        yield name
    finally:
        delete_topics(bootstrap, name)


@contextmanager
def temp_schema(url: str, prefix: str) -> Iterator[str]:
    """A new schema, dropped afterwards; yields a URL whose search_path is that schema."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        yield f"{url}?options=-csearch_path%3D{name}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def consumer_settings(url: str, topic: str, routes: Path, **more: object) -> ConsumerSettings:
    """A benchmark consumer's settings: its own group, the stack's services, ``more`` on top."""
    given: dict[str, object] = {
        "DATABASE_URL": url,
        "KAFKA_BOOTSTRAP_SERVERS": os.environ["KAFKA_BOOTSTRAP_SERVERS"],
        "routes_file": routes,
        "topics": [topic],
        "group_id": f"bench-{uuid.uuid4().hex[:8]}",
        "create_topics": False,
        "http_port": 0,
        "dead_letter_topic": f"{topic}.dlq",
        "held_topic": f"{topic}.held",
        "poll_timeout_ms": 100,
    }
    if "REDIS_URL" in os.environ:
        given["REDIS_URL"] = os.environ["REDIS_URL"]
    return ConsumerSettings(**{**given, **more})  # type: ignore[arg-type]


def consume_until(settings: ConsumerSettings, url: str, done: str, want: int) -> float:
    """Seconds from starting a consumer until the query ``done`` returns ``want``."""
    service = ConsumerService(settings, parse_routes(settings.routes_file.read_text()), Health())
    started = time.perf_counter()
    with serving("bench-consumer", service.run, service.stop), psycopg.connect(url) as conn:
        while True:
            row = conn.execute(done).fetchone()
            conn.rollback()
            if row and row[0] == want:
                return time.perf_counter() - started
            time.sleep(0.05)


@dataclass(frozen=True, slots=True)
class Pipeline:
    """Names shared by the writer, the relay and the consumer of one benchmark."""

    url: str
    bootstrap: str
    topic: str
    folder: Path


def pipeline_env(pipe: Pipeline, port: int, **extra: str) -> dict[str, str]:
    """Environment for one of the services: the pipeline's names, logs at WARNING only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INORDER_")}
    env.update(
        DATABASE_URL=pipe.url,
        KAFKA_BOOTSTRAP_SERVERS=pipe.bootstrap,
        INORDER_HTTP_PORT=str(port),
        INORDER_LOG_LEVEL="WARNING",
        INORDER_REPUBLISH_REQUESTS_TOPIC=f"{pipe.topic}.requests",
        INORDER_REPUBLISH_RESULTS_TOPIC=f"{pipe.topic}.results",
        INORDER_RELAY_GROUP_ID=f"{pipe.topic}.relay",
        **extra,
    )
    return env


@contextmanager
def service_process(
    module: str, env: dict[str, str], port: int
) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m module`` running until the block ends, once its /readyz answers."""
    process = subprocess.Popen([sys.executable, "-m", module], env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{module} did not become ready") from None
                time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        process.wait(30)
