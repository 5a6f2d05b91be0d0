"""The fuzz cases say truthfully what the codec makes of them."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from consumer import deadletter
from consumer.kinds.projection.errors import PROJECTION_REJECTED
from schemas import DecodeError, decode
from tests.faults import mutations

CONSUMER_REASONS = {deadletter.UNKNOWN_STREAM, PROJECTION_REJECTED}


def test_every_case_decodes_or_fails_as_it_claims() -> None:
    """Codec-level cases fail with their reason; valid and consumer-level cases decode."""
    cases = mutations.cases(3_000, 500, seed=3)
    for case in cases:
        if case.expected == mutations.APPLIED or case.expected in CONSUMER_REASONS:
            decode(case.value)
            continue
        with pytest.raises(DecodeError) as caught:
            decode(case.value)
        assert caught.value.reason == case.expected, f"{case.kind}: {caught.value}"


def test_cases_cover_every_kind_and_are_unique() -> None:
    """Each mutation kind appears, case ids are unique apart from deliberate duplicates."""
    cases = mutations.cases(3_000, 500, seed=5)
    kinds = Counter(c.kind for c in cases)
    assert set(mutations.kinds(random.Random(0))) <= set(kinds)
    twice = {c.fid for c in cases if c.kind == "valid, sent twice"}
    assert twice
    for fid, n in Counter(c.fid for c in cases).items():
        assert n == (2 if fid in twice else 1)
    assert sum(1 for c in cases if c.expected != mutations.APPLIED) == 3_000
