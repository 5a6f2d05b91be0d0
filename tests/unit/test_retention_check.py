"""The relays' retention against the longest park plus the worst-case gap repair."""

from __future__ import annotations

import pytest

from consumer.kinds.steps.retention import shortfall
from consumer.kinds.steps.route import StepRoute
from outbox_relay.settings import RelaySettings
from schemas.runtime.config import RepairTimingSettings


@pytest.mark.parametrize(
    ("retentions", "parks", "repair_s", "short"),
    [
        ([], {"ledger": 100}, 10.0, False),  # no relay has said: nothing to check
        ([1000.0], {}, 10.0, False),  # no step route parks
        ([1000.0], {"ledger": 100}, 10.0, False),
        ([110.0], {"ledger": 100}, 10.0, True),  # equal: a row could go as it is needed
        ([1000.0, 50.0], {"ledger": 100}, 10.0, True),  # the shortest relay counts
        ([200.0], {"ledger": 100, "mail": 300}, 10.0, True),  # the longest park counts
    ],
)
def test_a_retention_not_longer_than_the_longest_park_plus_repair_is_named(
    retentions: list[float], parks: dict[str, int], repair_s: float, short: bool
) -> None:
    """Short: one line naming the retention, the route, its TTL, the repair and the fix."""
    line = shortfall(retentions, parks, repair_s)
    assert (line is not None) is short
    if line is not None:
        route, ttl = max(parks.items(), key=lambda item: item[1])
        assert f"keeps sent rows {min(retentions):g} s" in line
        assert f"route {route}'s park_ttl_s ({ttl} s)" in line
        assert f"set INORDER_RETENTION_S above {ttl + repair_s:g}" in line
        assert "\n" not in line


def test_the_defaults_agree() -> None:
    """The relay's default retention outlives the default park TTL plus the default repair."""
    retention = RelaySettings.model_fields["retention_s"].default
    park = StepRoute.__dataclass_fields__["park_ttl_s"].default
    repair = RepairTimingSettings.model_construct().worst_case_repair_s()
    assert shortfall([retention], {"r": park}, repair) is None
