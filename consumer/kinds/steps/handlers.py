"""Calling the users' step functions: the one module that does, and that reads what they raise.

The order of the calls is ``plan.calls``'s (pure); what a failure means for the batch is
``ladder.climb``'s. Here a function's own failure becomes ``StepFailedError`` naming the
step, or ``ManyFailedError`` for a ``many`` call of several steps; a lost connection
stays what it is.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

import psycopg

from consumer.kinds.steps.errors import ManyFailedError, PipelinedError, StepFailedError
from consumer.kinds.steps.plan import calls
from consumer.kinds.steps.route import Entry
from schemas import Event

Conn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]
AsyncFunction = Callable[[AsyncConn, Event], Awaitable[None]]


class Handlers:
    """One step route's functions, imported at start-up, by event type."""

    def __init__(self, functions: Mapping[str, Entry]) -> None:
        self.functions = functions
        # Known once, asked of every event of every poll batch.
        self.awaited_types = frozenset(
            t for t, (_, f) in functions.items() if inspect.iscoroutinefunction(f)
        )
        self._alone = self.awaited_types | {t for t, (h, _) in functions.items() if h.external}

    def entry(self, event: Event) -> Entry | None:
        """The function (and its handler settings) an event's type is applied by, if any."""
        return self.functions.get(event.event_type)

    def external(self, event: Event) -> bool:
        """True when the event's function acts outside PostgreSQL."""
        entry = self.functions.get(event.event_type)
        return entry is not None and entry[0].external

    def idempotent(self, event: Event) -> bool:
        """True unless the event's function acts outside PostgreSQL and may not be called
        twice for one step."""
        entry = self.functions.get(event.event_type)
        return entry is None or entry[0].idempotent

    def awaited(self, event: Event) -> bool:
        """True when the event's function is ``async def`` (awaited on an async connection)."""
        return event.event_type in self.awaited_types

    def alone(self, event: Event) -> bool:
        """True when the event's step is applied in a transaction of its own, in a lane."""
        return event.event_type in self._alone

    async def run_async(self, aconn: AsyncConn, event: Event) -> None:
        """Await the ``async def`` function of one step; its failure as ``StepFailedError``."""
        function = cast(AsyncFunction, self.functions[event.event_type][1])
        try:
            await function(aconn, event)
        except psycopg.OperationalError:
            raise
        except Exception as exc:  # a user function's failure, reported upward
            raise StepFailedError(event.entity_id, event, exc) from exc

    def run(
        self,
        conn: Conn,
        applies: Mapping[str, Sequence[Event]],
        *,
        pipelined: bool = False,
        single: bool = False,
    ) -> None:
        """Call the functions of every entity's due steps, in ``calls`` order.

        In pipeline mode a database error may belong to another statement, so it becomes
        ``PipelinedError`` and the batch is tried again unpipelined.
        """
        for (handler, function), events in calls(applies, self.functions, single=single):
            try:
                function(conn, events if handler.many else events[0])
            except psycopg.OperationalError:
                raise
            except Exception as exc:  # a user function's failure, reported upward
                if pipelined and isinstance(exc, psycopg.Error):
                    raise PipelinedError(str(exc)) from exc
                if len(events) > 1:
                    raise ManyFailedError(f"{handler.function}: {exc!r}") from exc
                raise StepFailedError(events[0].entity_id, events[0], exc) from exc
