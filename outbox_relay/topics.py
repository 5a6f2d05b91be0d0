"""Which topics outbox rows may be sent to: a legal name, allowed, and known to the cluster.

A row naming a topic that does not exist would otherwise wait in the producer for the
topic's metadata (``message.timeout.ms``) and fail as if Kafka were down, holding every
slice of the batch back each time it is tried. Here the topics of a batch are checked
before anything is produced. An illegal or disallowed name, or one of the republish
protocol's topics, fails its rows at once. A legal name the cluster does not have sets
its rows aside at once (``awaiting_topic``): the cursors pass them, so no slice waits
for a topic, and ``missing_topics`` sends them by themselves once it appears, or fails
them ``unknown_topic`` when it has not within ``INORDER_UNKNOWN_TOPIC_GRACE_S``. The
cluster's topic list is asked again whenever a batch names a topic not known yet, so a
topic created meanwhile is found by the next batch that names it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import structlog
from confluent_kafka import Producer

from outbox_relay.errors import RowProblem

log = structlog.get_logger(__name__)

# Rows set aside for a topic the cluster does not have yet (``missing_topics`` sends them
# once it has), and the reason they are failed with when it never came within the grace.
AWAITING_TOPIC = "awaiting_topic"
AWAITING_LIKE = f"{AWAITING_TOPIC}:%"  # their failure_reason, as a LIKE pattern
UNKNOWN_TOPIC = "unknown_topic"
# Kafka's legal topic names (``Topic.validate`` in the broker).
LEGAL = re.compile(r"[A-Za-z0-9._-]{1,249}")
METADATA_TIMEOUT_S = 5.0
# Missing topics remembered at most (each said once in the log).
MAX_REMEMBERED = 10_000


def name_problem(
    topic: str, allowed: frozenset[str] | None, reserved: frozenset[str] = frozenset()
) -> RowProblem | None:
    """Why no row may name ``topic``, whatever the cluster holds (pure).

    ``reserved``: the republish protocol's topics. The relay may write its results, so a
    row naming one would have the relay speak the protocol for whoever wrote the row; no
    allow list lets it.
    """
    if LEGAL.fullmatch(topic) is None or topic in (".", ".."):
        return RowProblem("bad_topic", f"{topic[:60]!r} is not a legal Kafka topic name")
    if topic in reserved:
        return RowProblem(
            "protocol_topic", f"{topic!r} carries republish requests or results, not events"
        )
    if allowed is not None and topic not in allowed:
        return RowProblem("topic_not_allowed", f"{topic!r} is not in INORDER_ALLOWED_TOPICS")
    return None


@dataclass(frozen=True, slots=True)
class TopicVerdict:
    """A batch's topics no row can be sent to now: each with the problem its rows get."""

    refused: Mapping[str, RowProblem] = field(default_factory=dict)


class TopicCheck:
    """Names the topics of a batch that no row can be sent to, or not yet."""

    def __init__(
        self,
        producer: Producer,
        allowed: Iterable[str] | None,
        grace_s: float,
        reserved: Iterable[str] = (),
    ) -> None:
        self._producer = producer
        self._allowed = frozenset(allowed) if allowed is not None else None
        self._reserved = frozenset(reserved)
        self._grace_s = grace_s
        self._known: frozenset[str] = frozenset()
        self._said: set[str] = set()

    def present(self, topics: Iterable[str]) -> set[str]:
        """Which of ``topics`` the cluster has now (one fresh topic list).

        All topics are listed, never the ones named: asking for a topic by name can
        create it.
        """
        self._known = frozenset(self._producer.list_topics(timeout=METADATA_TIMEOUT_S).topics)
        return {topic for topic in topics if topic in self._known}

    def check(self, topics: Iterable[str]) -> TopicVerdict:
        """Each of ``topics`` that cannot be written yet or ever (``KafkaException`` while down).

        A topic not seen before is looked up in a fresh topic list (one request for all
        of them), so a topic created a moment ago is found. One still missing sets its
        rows aside (``awaiting_topic``) until it appears.
        """
        refused: dict[str, RowProblem] = {}
        unseen = []
        for topic in set(topics):
            problem = name_problem(topic, self._allowed, self._reserved)
            if problem is not None:
                refused[topic] = problem
            elif topic not in self._known:
                unseen.append(topic)
        if not unseen:
            return TopicVerdict(refused)
        found = self.present(unseen)
        for topic in unseen:
            if topic in found:
                self._said.discard(topic)
                continue
            refused[topic] = RowProblem(
                AWAITING_TOPIC,
                f"topic {topic!r} does not exist in the cluster, or the relay may not describe "
                f"it; the row is sent once it does (failed {UNKNOWN_TOPIC} if it has not "
                f"within {self._grace_s:g}s)",
            )
            if topic not in self._said:
                if len(self._said) > MAX_REMEMBERED:
                    self._said.clear()
                self._said.add(topic)
                log.warning(
                    "topic_missing",
                    topic=topic,
                    failing_rows_in_s=self._grace_s,
                    hint="create it, or, with ACLs on, let this relay's principal write it "
                    "(a topic a principal may not describe is not listed to it)",
                )
        return TopicVerdict(refused)
