"""The republish-request topic: each request read, answered, and committed once answered.

Both relay roles serve it the same way; what answers a request is theirs. A request that
cannot be read, or that one answer refuses as input, is counted invalid, logged and
committed: it is never retried. An outage rewinds the requests not yet answered.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from confluent_kafka import Consumer, Message

from outbox_relay import metrics
from outbox_relay.kafka import make_request_consumer
from outbox_relay.settings import RelaySettings
from schemas import tracing
from schemas.limits import safe_text
from schemas.republish import RepublishRequest, decode_request
from schemas.runtime import kafka_watch
from schemas.runtime.redelivery import handle_each

log = structlog.get_logger(__name__)

Answer = Callable[[RepublishRequest], object]


class Requests:
    """Reads the republish-request topic and hands each request to ``answer``."""

    def __init__(self, settings: RelaySettings, answer: Answer) -> None:
        self.answer = answer
        self.consumer: Consumer = make_request_consumer(settings)

    def serve(self, wait_s: float = 0) -> None:
        """Answer what has arrived, waiting up to ``wait_s`` for the first request."""
        # Errors are logged once a minute, and a refusal shows on /readyz.
        found = self.consumer.consume(num_messages=50, timeout=wait_s)
        answerable = kafka_watch.usable(found)
        if answerable:
            handle_each(self.consumer, answerable, self._answer, _invalid, "unanswerable")

    def close(self) -> None:
        """Leave the group."""
        self.consumer.close()

    def _answer(self, message: Message) -> None:
        """Answer one request; traced, the answer is a span linked to the request's context,
        and the result carries the answer's context back to the sweeper."""
        request = decode_request(message.value())
        origin = tracing.creation_context(message.headers())
        about = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "inorder.entity": f"{request.entity_type}:{request.entity_id}",
            "inorder.request_id": request.request_id,
        }
        links = tracing.links_to([origin] if origin is not None else [], {})
        with tracing.span("republish answer", "consumer", about, links):
            self.answer(request)


def _invalid(message: Message, reason: str, detail: str) -> None:
    """Count and log a request that cannot be answered; it is never retried."""
    metrics.REPUBLISH_REQUESTS.labels("invalid").inc()
    log.error(
        "republish_request_invalid",
        reason=reason,
        detail=safe_text(detail)[:300],
        offset=message.offset(),
    )
