"""The nemesis schedule strikes with every kind of fault, or fails saying which it cannot."""

from __future__ import annotations

import pytest

from tests.faults.schedule import KINDS, Nemesis


def _nemesis(*, can_drop: bool, faulty_kafka: bool) -> Nemesis:
    nemesis = object.__new__(Nemesis)  # no pipeline: only what kinds() reads
    nemesis.can_drop = can_drop
    nemesis.kafka = object() if faulty_kafka else None  # type: ignore[assignment]
    return nemesis


def test_with_iptables_and_the_faulty_listener_every_kind_is_struck() -> None:
    """Both there: every kind of the schedule."""
    assert _nemesis(can_drop=True, faulty_kafka=True).kinds() == list(KINDS)


@pytest.mark.parametrize(
    ("can_drop", "faulty_kafka", "named"),
    [(False, False, "iptables"), (True, False, "FAULTY listener")],
)
def test_a_kind_that_cannot_be_struck_fails_the_schedule(
    can_drop: bool, faulty_kafka: bool, named: str
) -> None:
    """No iptables, or no faulty listener: an AssertionError naming what is missing."""
    with pytest.raises(AssertionError, match=named):
        _nemesis(can_drop=can_drop, faulty_kafka=faulty_kafka).kinds()
