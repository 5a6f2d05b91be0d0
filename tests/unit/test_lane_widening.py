"""How many connections busy lanes open at once: never past the lanes, one left to the pool."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumer.kinds.steps.lanes import lacking, widening


@given(busy=st.integers(0, 400), size=st.integers(1, 256), opened=st.integers(0, 256))
def test_the_pool_opens_what_busy_lanes_lack_but_one_and_never_past_the_lanes(
    busy: int, size: int, opened: int
) -> None:
    """Opened plus what is asked stays under the busy lanes (capped at ``size``) by one."""
    more = lacking(busy, size, opened)
    assert more >= 0
    if more:
        assert opened + more == min(busy, size) - 1
    else:
        assert opened >= min(busy, size) - 1


def test_one_busy_lane_is_left_to_the_pool() -> None:
    """A single busy lane asks nothing ahead; 128 busy of 128 with none open ask 127."""
    assert lacking(1, 128, 0) == 0
    assert lacking(128, 128, 0) == 127
    assert lacking(300, 128, 100) == 27


@given(
    busy=st.integers(0, 400),
    size=st.integers(1, 256),
    opened=st.integers(0, 256),
    kept=st.booleans(),
)
def test_widening_opens_what_lacks_and_sets_the_pool_back_to_its_floor(
    busy: int, size: int, opened: int, kept: bool
) -> None:
    """The minimum is raised by what lacks (or to a kept floor) and set back to the floor
    after: none, or every lane's connection when they are kept open."""
    opened = min(opened, size)
    floor = size if kept else 0
    sizes = widening(busy, size, opened, floor)
    more = lacking(busy, size, opened)
    if not more:
        assert sizes is None
        return
    assert sizes is not None
    raised, back = sizes
    assert back == floor
    assert raised <= size
    assert raised == (size if kept else more)
