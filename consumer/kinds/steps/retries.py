"""Retries of a step that raised, pure: whether to try again, after how long, or what then.

A handler may declare in the routes file how often its step is tried, how long to wait
between tries (exponential with jitter, capped), which exceptions are worth another try,
and what happens once the tries are spent::

    [route.handlers."seat_ledger.seats_added".retry]
    attempts = 5                     # calls in all, the first included
    backoff_s = 1.0                  # before the second call; doubled each time after
    max_backoff_s = 300.0
    on = ["TimeoutError", "httpx.HTTPStatusError"]
    then = "dead_letter"             # or "stop" (for a person) or "skip"

No I/O: the store writes what ``decide`` says, in the transaction that counted the failure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from consumer.kinds._spec import setting
from schemas import Event

# Limits of the settings: beyond them a retry is a person's job, not a timer's.
MOST_ATTEMPTS = 100
MOST_BACKOFF_S = 7 * 86_400.0


class Then(enum.StrEnum):
    """What happens to a step whose tries are spent (or whose error is not retried)."""

    STOP = "stop"  # the entity waits for a person (``inorder-admin review``)
    DEAD_LETTER = "dead_letter"  # the event goes to the dead-letter topic; the entity moves on
    SKIP = "skip"  # the entity moves on past it, recorded as skipped


@dataclass(frozen=True, slots=True)
class Retry:
    """How a handler's failing step is tried again (a table under the handler)."""

    attempts: int = setting("Calls in all, the first included, before `then` applies", 3)
    backoff_s: float = setting("Wait before the second call (seconds); doubled for each after", 1.0)
    max_backoff_s: float = setting("The longest wait between two calls (seconds)", 300.0)
    on: tuple[str, ...] = setting(
        "Exception classes worth another call, by name (`TimeoutError`) or with their "
        "module (`httpx.HTTPStatusError`); a subclass counts. Empty: every exception",
        factory=tuple,
    )
    then: Then = setting(
        "After the last call, or at once for an exception not in `on`: `stop` for a person, "
        "`dead_letter` (the event is dead-lettered and the entity moves on) or `skip` "
        "(the entity moves on; the skip is recorded)",
        Then.STOP,
    )


class Action(enum.StrEnum):
    """What one failure leads to; recorded with it in ``inorder_step_failures``."""

    RETRY = "retry"
    STOP = "stop"
    DEAD_LETTER = "dead_letter"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One failure decided: the action, the wait before the next call, and why.

    ``exhausted``: the step was given up on because its calls ran out.
    """

    action: Action
    delay_s: float = 0.0
    why: str = ""
    exhausted: bool = False


def counts(retry: Retry, error: BaseException) -> bool:
    """Whether ``error`` is worth another call under ``retry.on`` (any, when empty)."""
    if not retry.on:
        return True
    names = set()
    for cls in type(error).__mro__:
        names.add(cls.__name__)
        names.add(f"{cls.__module__}.{cls.__qualname__}")
    return any(name in names for name in retry.on)


def delay(retry: Retry, failures: int, jitter: float) -> float:
    """The wait after the ``failures``-th failed call: half fixed, half ``jitter`` in [0, 1)."""
    full = min(retry.max_backoff_s, retry.backoff_s * 2.0 ** min(failures - 1, 64))
    return full / 2 + full / 2 * jitter


def decide(retry: Retry | None, failures: int, error: BaseException, jitter: float) -> Verdict:
    """After the ``failures``-th failed call of one step: try again, or what then.

    Without a ``retry`` table the step stops for a person, as it always did.
    """
    if retry is None:
        return Verdict(Action.STOP)
    if not counts(retry, error):
        return Verdict(Action(retry.then), why=f"{type(error).__name__} is not retried")
    if failures < retry.attempts:
        return Verdict(Action.RETRY, delay(retry, failures, jitter), f"call {failures} failed")
    return Verdict(Action(retry.then), why=f"after {failures} calls", exhausted=True)


@dataclass(frozen=True, slots=True)
class Failed:
    """One failed call of a step and what it led to: ``attempt`` is its number (1: first)."""

    event: Event
    verdict: Verdict
    error: str
    attempt: int

    @property
    def reason(self) -> str:
        """Why the entity waits, stopped or moved on, as the progress row and logs say."""
        action = self.verdict.action
        if action is Action.RETRY:
            return (
                f"retrying: call {self.attempt} failed ({self.error}); "
                f"next in {self.verdict.delay_s:.1f} s"
            )
        said = f"step failed: {self.error}"
        return f"{said} ({self.verdict.why})" if self.verdict.why else said
