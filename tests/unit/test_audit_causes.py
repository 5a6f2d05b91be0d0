"""Why a step was not applied: the audit's explanations, first match wins."""

from __future__ import annotations

import pytest

from consumer.kinds.steps.inspect import step_cause


@pytest.mark.parametrize(
    ("state", "generation", "seq", "unpublished", "failure", "cause"),
    [
        (None, 1, 3, True, None, "not published yet"),
        (None, 1, 3, False, "bad payload", "outbox row failed: bad payload"),
        # A failed row is also unpublished; the failure is what explains it.
        (None, 1, 3, True, "bad payload", "outbox row failed: bad payload"),
        (
            (2, False, None, None, None),
            1,
            3,
            False,
            None,
            "generation 1 superseded by re-creation (2)",
        ),
        (
            (1, False, 3, "needs_review: x", None),
            1,
            4,
            False,
            None,
            "stopped for review at 3: needs_review: x",
        ),
        ((1, False, None, None, "unrecoverable 3..3"), 1, 4, False, None, "gap unrecoverable 3..3"),
        ((1, True, None, None, None), 1, 4, False, None, "entity held"),
        ((1, False, None, None, None), 1, 4, False, None, None),
        (None, 1, 4, False, None, None),
    ],
)
def test_each_known_state_explains_a_missing_step(
    state: tuple | None,
    generation: int,
    seq: int,
    unpublished: bool,
    failure: str | None,
    cause: str | None,
) -> None:
    """Each state that accounts for a missing step is named; anything else is unexplained."""
    assert step_cause(state, generation, seq, unpublished, failure) == cause
