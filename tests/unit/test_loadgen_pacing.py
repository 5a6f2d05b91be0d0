"""The load generator's pacing: start times 1/rate apart, no burst after a stall."""

from __future__ import annotations

import pytest

from producer import loadgen


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(loadgen.time, "monotonic", fake.monotonic)
    monkeypatch.setattr(loadgen.time, "sleep", fake.sleep)
    return fake


def test_callers_start_one_interval_apart(clock: _Clock) -> None:
    """At 10 operations/s, back-to-back callers wait 0.1 s each after the first."""
    pacer = loadgen.Pacer(10)
    for _ in range(4):
        pacer.wait()
    assert clock.slept == [0.1, 0.1, 0.1]


def test_no_burst_after_a_stall(clock: _Clock) -> None:
    """After a long stall (a database outage) callers do not rush to catch up."""
    pacer = loadgen.Pacer(10)
    pacer.wait()
    clock.now += 30  # stalled for 30 s
    for _ in range(3):
        pacer.wait()
    assert clock.slept == [0.1, 0.1]


def test_no_rate_means_no_waiting(clock: _Clock) -> None:
    """Without a rate the writers go flat out."""
    pacer = loadgen.Pacer(None)
    for _ in range(5):
        pacer.wait()
    assert clock.slept == []
