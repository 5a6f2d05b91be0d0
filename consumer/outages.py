"""Which dependency an exception says is down, for the processes that wait out outages."""

from __future__ import annotations

import psycopg
import redis
from confluent_kafka import KafkaException

REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError)
# Failures that mean "try again later", never "this input is bad".
DOWN = (psycopg.OperationalError, KafkaException, *REDIS_DOWN)


def dependency(exc: BaseException) -> str:
    """``postgres``, ``redis`` or ``kafka``: the service ``exc`` came from."""
    if isinstance(exc, psycopg.Error):
        return "postgres"
    if isinstance(exc, redis.RedisError):
        return "redis"
    return "kafka"
