"""A share group as the loop's source: each record acknowledged once its effect is durable.

Every member of a share group reads every partition; the broker hands each record to
one member at a time under an acquisition lock, and counts its deliveries. So:

- a record is acknowledged ACCEPT only once its effect is durable (``done``, or
  ``release`` for one a lane carried);
- a record the loop still holds near the end of its lock (a dependency down, a slow
  lane) is RELEASE-d, so another member gets it, unless it is on its last delivery:
  then ``letter`` dead-letters it first (the broker would archive it), and it is
  accepted only once its letter is in Kafka;
- while paused on an outage the member stops acquiring (it leaves the subscription once
  nothing is in hand) and joins again on resume, so an outage costs a record at most one
  delivery;
- a new share group starts at the latest offset: the group is set to start at the
  earliest through the admin API, or one line says that it could not be.

Acknowledgements go with the next poll, or with a commit when the member falls idle.
The client takes no new poll while a record of the last one is unacknowledged, so the
member takes nothing new while a lane still carries one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
from confluent_kafka import AcknowledgeType, KafkaException, Message, ShareConsumer

from consumer import metrics
from consumer.loop.share_group import GroupTerms, configure
from schemas.runtime import kafka_clients
from schemas.runtime.health import Health

if TYPE_CHECKING:
    from consumer.settings import ConsumerSettings

log = structlog.get_logger(__name__)

# How long a member with records in hand waits before looking again (a lane finishing).
IN_HAND_WAIT_S = 0.01
# The acknowledgements of done records are committed at least this often.
COMMIT_INTERVAL_S = 0.1

Key = tuple[str, int, int]
# Dead-letters records on their last delivery; returns those whose letters are in Kafka.
Letter = Callable[[Sequence[Message]], Sequence[Message]]


def key(message: Message) -> Key:
    """Where the record sits: topic, partition, offset."""
    return (message.topic() or "", message.partition() or 0, message.offset() or 0)


@dataclass(slots=True)
class InHand:
    """One acquired record, until it is acknowledged."""

    message: Message
    acquired: float
    held: bool = False


class ShareGroup:
    """A ``Source`` over a Kafka share group (KIP-932)."""

    def __init__(
        self,
        settings: ConsumerSettings,
        topics: Sequence[str],
        health: Health,
        letter: Letter | None = None,
    ) -> None:
        self.settings = settings
        self.topics = list(topics)
        self.health = health
        self.letter = letter or (lambda _messages: [])
        self.terms = GroupTerms()
        self._consumer: ShareConsumer | None = None
        self._in_hand: dict[Key, InHand] = {}
        self._subscribed = False
        self._acked = False
        self._next_commit = 0.0
        self.paused = False

    @property
    def _kafka(self) -> ShareConsumer:
        if self._consumer is None:
            raise KafkaException("Kafka share consumer not started")
        return self._consumer

    # ------------------------------------------------------------------ membership

    def start(self) -> None:
        """Set the group's terms (start at the earliest), create the member, subscribe."""
        self.terms = configure(self.settings, self.settings.group_id)
        self._consumer = kafka_clients.share_consumer(
            self.settings,
            "inorder-consumer",
            self.settings.group_id,
            fixed={
                "max.poll.records": min(
                    self.settings.share_max_poll_records, self.settings.poll_max_messages
                )
            },
        )
        self._subscribe()
        metrics.SOURCE.labels("share", "share").set(1)
        self.health.cleared("assignment")

    def _subscribe(self) -> None:
        self._kafka.subscribe(self.topics)
        self._subscribed = True
        self._note()

    def close(self) -> None:
        """Hand back what is still in hand, commit the acknowledgements and leave."""
        if self._consumer is None:
            return
        self._hand_back(list(self._in_hand.values()), "close")
        try:
            self._consumer.commit_sync(10)
        except KafkaException as exc:
            log.warning("share_acknowledgement_failed", error=str(exc.args[0]))
        self._consumer.close()

    # ------------------------------------------------------------------ records

    def take(self, most: int, wait_s: float, linger_s: float) -> list[Message]:
        """The next records; none while the last poll's are still in hand, or while paused.

        Records whose locks run out are handed back by ``tick``, once per poll.
        """
        if self._in_hand or self.paused:
            time.sleep(min(wait_s, IN_HAND_WAIT_S))
            return []
        if not self._subscribed:
            self._subscribe()
        messages = list(self._kafka.poll(wait_s) or [])
        self._acked = False
        now = time.monotonic()
        for message in messages:
            if message.error() is not None:
                continue
            self._in_hand[key(message)] = InHand(message, now)
            metrics.SHARE_ACQUIRED.labels(self._delivery(message)).inc()
        metrics.SHARE_IN_HAND.set(len(self._in_hand))
        return messages

    def _delivery(self, message: Message) -> str:
        count = message.delivery_count() or 1
        if count >= self.terms.delivery_limit:
            return "last"
        return "again" if count > 1 else "first"

    def tick(self) -> None:
        """Hand back records whose locks run out; keep the note on ``/readyz`` current."""
        self._expire()

    def ours(self, message: Message) -> bool:
        """True while the record is acquired by this member and not yet acknowledged."""
        return key(message) in self._in_hand

    def done(self, messages: Sequence[Message]) -> None:
        """Accept every record whose effect is durable (a held one once it is released)."""
        for message in messages:
            entry = self._in_hand.get(key(message))
            if entry is not None and not entry.held:
                self._ack(entry, AcknowledgeType.ACCEPT)

    def hold(self, message: Message) -> None:
        """A lane carries the record's work past its batch: accept it on ``release``."""
        entry = self._in_hand.get(key(message))
        if entry is not None:
            entry.held = True

    def release(self, message: Message) -> None:
        """The carried work is durable: accept the record (if it is still in hand)."""
        entry = self._in_hand.get(key(message))
        if entry is not None:
            self._ack(entry, AcknowledgeType.ACCEPT)

    def settle(self, *, idle: bool) -> None:
        """Commit the acknowledgements now when idle or when records wait on none; else
        they go with the next poll."""
        now = time.monotonic()
        if not self._acked or (not idle and now < self._next_commit and not self._in_hand):
            return
        try:
            self._kafka.commit_async()
        except KafkaException as exc:
            log.warning("share_acknowledgement_failed", error=str(exc.args[0]))
            return
        self._acked = False
        self._next_commit = now + COMMIT_INTERVAL_S

    # ------------------------------------------------------------------ outages

    def pause(self) -> None:
        """An outage: commit what is done; the records in hand are kept while their locks last."""
        self.paused = True
        self.settle(idle=True)

    def resume(self) -> None:
        """The outage is over: acquire again (joining again if the member left)."""
        self.paused = False

    def idle(self, deadline: float) -> None:
        """While paused: hand back records whose locks run out; leave once nothing is in hand."""
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        self._expire()
        if not self._in_hand and self._subscribed and self._consumer is not None:
            self.settle(idle=True)
            self._consumer.unsubscribe()
            self._subscribed = False
            self._note()

    # ------------------------------------------------------------------ locks

    def _expire(self) -> None:
        """Records acquired longer than the lock allows, less the margin, are handed back."""
        if not self._in_hand:
            return
        # A lock the group set shorter than the settings knew still leaves two thirds.
        margin = min(self.settings.share_lock_margin_ms / 1000, self.terms.lock_s / 3)
        cutoff = time.monotonic() - (self.terms.lock_s - margin)
        expiring = [e for e in self._in_hand.values() if e.acquired <= cutoff]
        if expiring:
            self._hand_back(expiring, "outage" if self.paused else "lock")
        self._note()

    def _hand_back(self, entries: list[InHand], why: str) -> None:
        """RELEASE each record so another member gets it; one on its last delivery is
        dead-lettered first and accepted once its letter is in Kafka."""
        last = {key(e.message): e.message for e in entries if self._delivery(e.message) == "last"}
        lettered = {key(m) for m in self.letter(list(last.values()))} if last else set()
        for entry in entries:
            where = key(entry.message)
            if where in lettered:
                self._ack(entry, AcknowledgeType.ACCEPT)
            elif where in last:
                # The broker archives it when its lock runs out: said, counted, paged on.
                metrics.SHARE_UNLETTERED.inc()
                log.error(
                    "share_record_unlettered",
                    topic=entry.message.topic(),
                    partition=entry.message.partition(),
                    offset=entry.message.offset(),
                )
                self._ack(entry, AcknowledgeType.RELEASE)
            else:
                metrics.SHARE_RELEASED.labels(why).inc()
                self._ack(entry, AcknowledgeType.RELEASE)
        if entries:
            log.warning("share_records_released", records=len(entries), why=why)

    def _ack(self, entry: InHand, kind: AcknowledgeType) -> None:
        self._kafka.acknowledge(entry.message, kind)
        self._in_hand.pop(key(entry.message), None)
        self._acked = True
        metrics.SHARE_IN_HAND.set(len(self._in_hand))

    def _note(self) -> None:
        state = "acquiring" if self._subscribed and not self.paused else "not acquiring"
        self.health.note(
            "source",
            f"share group {self.settings.group_id} ({state}; {len(self._in_hand)} in hand; "
            f"lock {self.terms.lock_s:g} s; delivery limit {self.terms.delivery_limit})",
        )
