"""Waiting out an outage without leaving: pause the source, keep it alive, resume.

While PostgreSQL, Redis or Kafka is down the batch in hand is kept and retried; the
source is paused so nothing new arrives, but kept a member (``Source.idle``), so what
it holds is neither lost nor handed elsewhere for nothing. What was applied before the
outage is settled as the pause starts.
"""

from __future__ import annotations

from consumer import metrics
from consumer.loop.source import Source
from schemas.runtime.outages import Outages


class Pausing:
    """One consumer's pause on outages, over its source."""

    def __init__(self, source: Source, outages: Outages) -> None:
        self.source = source
        self.outages = outages

    def pause(self) -> None:
        """Settle what is done, pause the source, show it in the gauge."""
        self.source.pause()
        metrics.PAUSED.set(1)

    def resume(self) -> None:
        """The outage is over: resume the source (a no-op when nothing was paused)."""
        self.outages.recovered()
        if not self.source.paused:
            return
        self.source.resume()
        metrics.PAUSED.set(0)

    def wait(self, exc: BaseException) -> None:
        """Back off once for ``exc``, the source kept alive meanwhile (the outage's own backoff)."""
        self.outages.wait(exc, paused=True, waiting=self.source.idle)
