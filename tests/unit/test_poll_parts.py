"""A poll batch in parts by decoded weight: order kept, each part within its budget."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.loop.poll import NODE_BYTES, parts, weight


class _Message:
    def __init__(self, value: bytes, n: int) -> None:
        self._value = value
        self.n = n

    def value(self) -> bytes:
        return self._value


_values = st.one_of(
    st.binary(max_size=200),
    st.integers(0, 3000).map(lambda n: b'{"a":[' + b"{}," * n + b"{}]}"),
)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(_values, max_size=60), budget=st.integers(1, 50_000))
def test_parts_keep_order_and_fit_the_budget_unless_alone(values: list[bytes], budget: int) -> None:
    """Joined, the parts are the batch in order; a part over budget holds one message only."""
    messages = [_Message(v, i) for i, v in enumerate(values)]
    found = parts(messages, budget)  # type: ignore[arg-type]
    assert [m.n for part in found for m in part] == list(range(len(values)))
    for part in found:
        assert part
        assert len(part) == 1 or sum(weight(m) for m in part) <= budget  # type: ignore[arg-type]


def test_a_megabyte_of_empty_objects_weighs_as_what_it_decodes_to() -> None:
    """300,000 ``{}``: weighed as 600,000 nodes, not as 900 KB of text."""
    value = b'{"a":[' + b"{}," * 299_999 + b"{}]}"
    assert weight(_Message(value, 0)) >= NODE_BYTES * 600_000  # type: ignore[arg-type]
    small = b'{"event_id":"e","payload":{"plan":"pro","price_cents":1}}'
    assert weight(_Message(small, 0)) < 1000  # type: ignore[arg-type]
