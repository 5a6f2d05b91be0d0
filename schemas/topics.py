"""Default topic names, defined once; every process can override them in its settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Topics:
    """The topics inorder reads and writes."""

    # Events published from the outbox.
    events: str = "inorder.events"
    # Input the consumer could not use, with the reason in headers.
    dead_letters: str = "inorder.dead-letters"
    # Events of an entity whose parking cap was reached, kept for a person.
    held: str = "inorder.held"
    # The sweeper asks the relay to re-send a range of seqs.
    republish_requests: str = "inorder.republish.requests"
    # The relay answers what it re-sent and what it no longer has.
    republish_results: str = "inorder.republish.results"
    # Assembled batches, in position order.
    batch_output: str = "inorder.batch.output"


DEFAULT_TOPICS = Topics()
