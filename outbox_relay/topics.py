"""Which topics outbox rows may be sent to: a legal name, allowed, and known to the cluster.

A row naming a topic that does not exist would otherwise wait in the producer for the
topic's metadata (``message.timeout.ms``) and fail as if Kafka were down, holding every
slice of the batch back each time it is tried. Here such a row is refused before it is
produced, and marked failed with the reason. The cluster's topic list is asked again
whenever a batch names a topic not seen yet, so a topic created after the relay started
is found by the first row that names it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from confluent_kafka import Producer

from outbox_relay.errors import RowProblem

# Kafka's legal topic names (``Topic.validate`` in the broker).
LEGAL = re.compile(r"[A-Za-z0-9._-]{1,249}")
METADATA_TIMEOUT_S = 5.0


def name_problem(topic: str, allowed: frozenset[str] | None) -> RowProblem | None:
    """Why no row may name ``topic``, whatever the cluster holds (pure)."""
    if LEGAL.fullmatch(topic) is None or topic in (".", ".."):
        return RowProblem("bad_topic", f"{topic[:60]!r} is not a legal Kafka topic name")
    if allowed is not None and topic not in allowed:
        return RowProblem("topic_not_allowed", f"{topic!r} is not in INORDER_ALLOWED_TOPICS")
    return None


class TopicCheck:
    """Names the topics of a batch that no row can be sent to."""

    def __init__(self, producer: Producer, allowed: Iterable[str] | None = None) -> None:
        self._producer = producer
        self._allowed = frozenset(allowed) if allowed is not None else None
        self._known: frozenset[str] = frozenset()

    def problems(self, topics: Iterable[str]) -> Mapping[str, RowProblem]:
        """Each of ``topics`` that cannot be written, and why (``KafkaException`` while down).

        A topic not seen before is looked up in a fresh topic list (one request for all
        of them), so a topic created a moment ago is never refused.
        """
        found: dict[str, RowProblem] = {}
        unseen = []
        for topic in set(topics):
            problem = name_problem(topic, self._allowed)
            if problem is not None:
                found[topic] = problem
            elif topic not in self._known:
                unseen.append(topic)
        if unseen:
            # All topics, never the ones named: asking for a topic by name can create it.
            self._known = frozenset(self._producer.list_topics(timeout=METADATA_TIMEOUT_S).topics)
            for topic in unseen:
                if topic not in self._known:
                    detail = f"topic {topic!r} does not exist in the cluster"
                    found[topic] = RowProblem("unknown_topic", detail)
        return found
