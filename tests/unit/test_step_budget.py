"""A step route's lanes against the server's connections: the verdict at and around the limit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumer.kinds.steps.budget import lane_connections, verdict


@given(
    ordinary=st.integers(1, 2000),
    reserved=st.integers(0, 10),
    lanes=st.integers(2, 256),
    awaited=st.booleans(),
)
def test_lanes_fit_exactly_when_they_and_the_consumer_fit_the_ordinary_slots(
    ordinary: int, reserved: int, lanes: int, awaited: bool
) -> None:
    """Refused exactly when the lanes' connections and the consumer's one exceed the slots."""
    found = verdict(ordinary + reserved, ordinary, "ledger", lanes, awaited=awaited)
    need = lanes * (2 if awaited else 1)
    assert (found is None) == (need + 1 <= ordinary)
    if found is not None:
        assert found.startswith(f"route ledger: {lanes} lanes hold up to {need} ")
        assert f"the server takes {ordinary} from ordinary sessions" in found
        assert f"(max_connections {ordinary + reserved})" in found


def test_at_the_limit_the_last_lane_decides() -> None:
    """With 100 slots: 99 plain lanes or 49 async ones start; one more of either does not."""
    assert verdict(103, 100, "s", 99, awaited=False) is None
    assert verdict(103, 100, "s", 100, awaited=False) is not None
    assert verdict(103, 100, "s", 49, awaited=True) is None
    assert verdict(103, 100, "s", 50, awaited=True) is not None
    assert lane_connections(50, awaited=True) == 100
