"""Retries of a failing step, the pure part: the schedule, the exceptions counted, the settings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.errors import RoutesError
from consumer.kinds.steps import Handler
from consumer.kinds.steps.retries import (
    MOST_BACKOFF_S,
    Action,
    Failed,
    Retry,
    Then,
    counts,
    decide,
    delay,
)
from consumer.routes import parse_routes
from schemas import Event
from tests.unit.test_batch_contract import _check_values

RETRIES = st.builds(
    Retry,
    attempts=st.integers(1, 100),
    backoff_s=st.floats(0.001, 3600),
    max_backoff_s=st.floats(0.001, MOST_BACKOFF_S),
    then=st.sampled_from(list(Then)),
)


class FlakyServiceError(TimeoutError):
    """A user's own error class under a standard one."""


@given(RETRIES, st.integers(1, 200), st.floats(0, 1, exclude_max=True))
def test_each_failure_before_the_last_waits_within_its_jittered_capped_backoff(
    retry: Retry, failures: int, jitter: float
) -> None:
    """Calls before the last are retried after half to all of min(cap, base * 2^(n-1))."""
    verdict = decide(retry, failures, TimeoutError(), jitter)
    if failures >= retry.attempts:
        assert (verdict.action, verdict.exhausted) == (Action(retry.then), True)
        return
    full = min(retry.max_backoff_s, retry.backoff_s * 2 ** (failures - 1))
    assert verdict.action is Action.RETRY
    assert not verdict.exhausted
    assert full / 2 <= verdict.delay_s <= full
    assert verdict.delay_s <= retry.max_backoff_s


@given(RETRIES, st.floats(0, 1, exclude_max=True))
def test_the_unjittered_half_never_shrinks_from_one_failure_to_the_next(
    retry: Retry, jitter: float
) -> None:
    """The schedule's floor grows (or stays at the cap) as failures add up."""
    floors = [delay(retry, n, 0.0) for n in range(1, 70)]
    assert floors == sorted(floors)
    assert delay(retry, 3, jitter) >= floors[2]


def test_exceptions_count_by_name_module_or_base_class() -> None:
    """``on`` names a class bare or with its module; a subclass counts; empty takes all."""
    assert counts(Retry(on=("TimeoutError",)), FlakyServiceError())
    assert counts(Retry(on=(f"{__name__}.FlakyServiceError",)), FlakyServiceError())
    assert counts(Retry(on=("builtins.OSError",)), ConnectionError())
    assert not counts(Retry(on=("TimeoutError",)), ValueError())
    assert counts(Retry(), KeyError())


def test_an_error_not_counted_does_what_then_says_at_once() -> None:
    """An exception outside ``on`` is not retried, even with calls left."""
    verdict = decide(Retry(attempts=9, on=("TimeoutError",), then=Then.SKIP), 1, ValueError(), 0.5)
    assert (verdict.action, verdict.exhausted) == (Action.SKIP, False)
    assert "ValueError is not retried" in verdict.why


def test_without_a_retry_table_a_failure_stops_for_a_person() -> None:
    """A handler with no ``retry`` stops its entity at the first failure, as before."""
    verdict = decide(None, 1, TimeoutError(), 0.0)
    assert (verdict.action, verdict.why) == (Action.STOP, "")
    event = Event("e", "ledger.added", "ledger", "a", 1, 3, "t", "t", {})
    failed = Failed(event, verdict, "TimeoutError()", 1)
    assert failed.reason == "step failed: TimeoutError()"


def test_every_action_is_the_failures_table_s_check() -> None:
    """The migrations' CHECK on inorder_step_failures.led_to allows exactly the actions."""
    assert _check_values("led_to") == set(Action)
    assert {str(t) for t in Then} < set(Action)


STEP = """
[[route]]
stream = "ledger"
kind = "step"
[route.handlers."ledger.added"]
function = "billing.steps:add"
{flags}
[route.handlers."ledger.added".retry]
{retry}
"""


def test_a_retry_table_is_parsed_with_its_defaults() -> None:
    """Unset settings of a handler's retry table take the documented defaults."""
    [route] = parse_routes(STEP.format(flags="", retry='on = ["TimeoutError"]\nthen = "skip"'))
    assert route.handlers["ledger.added"] == Handler(  # type: ignore[attr-defined]
        "billing.steps:add", retry=Retry(on=("TimeoutError",), then=Then.SKIP)
    )


@pytest.mark.parametrize(
    ("flags", "retry", "problem"),
    [
        ("", "attempts = 0", "attempts in retry of handler ledger.added must be"),
        ("", "attempts = 101", "attempts in retry of handler ledger.added must be"),
        ("", 'attempts = "3"', "attempts in retry of handler ledger.added must be"),
        ("", "backoff_s = 0", "backoff_s in retry of handler ledger.added must be"),
        ("", "max_backoff_s = 604801", "max_backoff_s in retry"),
        ("", "backoff_s = nan", "backoff_s in retry"),
        ("", 'on = "TimeoutError"', "on in retry of handler ledger.added must be a list"),
        ("", 'on = [""]', "on in retry of handler ledger.added must be a list"),
        ("", 'then = "ignore"', "then in retry of handler ledger.added must be one of"),
        ("", "tries = 3", "unknown setting 'tries' in retry of handler ledger.added"),
        ("external = true", "", "is external and not idempotent"),
    ],
)
def test_each_retry_mistake_is_named(flags: str, retry: str, problem: str) -> None:
    """A wrong retry table is refused at start-up, naming the setting and the handler."""
    with pytest.raises(RoutesError) as caught:
        parse_routes(STEP.format(flags=flags, retry=retry))
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_an_external_idempotent_handler_may_be_retried() -> None:
    """A second call that is harmless (idempotent) may be made by the retry timer."""
    [route] = parse_routes(STEP.format(flags="external = true\nidempotent = true", retry=""))
    assert route.handlers["ledger.added"].retry == Retry()  # type: ignore[attr-defined]


def test_a_retry_that_is_not_a_table_is_named() -> None:
    """``retry = 3`` instead of a table is refused by name."""
    table = '[route.handlers."ledger.added".retry]'
    text = STEP.format(flags="retry = 3", retry="").split(table)[0]
    with pytest.raises(RoutesError) as caught:
        parse_routes(text)
    assert any("retry of handler ledger.added must be a table" in p for p in caught.value.problems)
