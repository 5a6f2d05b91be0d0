"""The routes' connections against the server's: the verdict at and around the limit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumer.kinds._connections import lane_connections, verdict


@given(
    ordinary=st.integers(1, 2000),
    reserved=st.integers(0, 10),
    held=st.dictionaries(
        st.sampled_from(["ledger", "seats", "mail"]), st.integers(1, 512), min_size=1
    ),
)
def test_routes_fit_exactly_when_they_and_the_consumer_fit_the_ordinary_slots(
    ordinary: int, reserved: int, held: dict[str, int]
) -> None:
    """Refused exactly when the routes' connections and the consumer's one exceed the
    slots; the refusal names each route's share, the total and the server's figures."""
    found = verdict(ordinary + reserved, ordinary, held)
    need = sum(held.values())
    assert (found is None) == (need + 1 <= ordinary)
    if found is not None:
        assert found.startswith(f"the routes' lanes hold up to {need} PostgreSQL connections")
        for stream, count in held.items():
            assert f"{stream} {count}" in found
        assert f"the server takes {ordinary} from ordinary sessions" in found
        assert f"(max_connections {ordinary + reserved})" in found


def test_at_the_limit_the_last_lane_decides() -> None:
    """With 100 slots: 99 plain lanes or 49 async ones start; one more of either does not."""
    assert verdict(103, 100, {"s": lane_connections(99, awaited=False)}) is None
    assert verdict(103, 100, {"s": lane_connections(100, awaited=False)}) is not None
    assert verdict(103, 100, {"s": lane_connections(49, awaited=True)}) is None
    assert verdict(103, 100, {"s": lane_connections(50, awaited=True)}) is not None
    assert verdict(103, 100, {"a": 50, "b": 49}) is None
    assert verdict(103, 100, {"a": 50, "b": 50}) is not None
