"""Batch decisions: the four branches, what each worker result does, and assembly by position."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.kinds.batches.decisions import (
    Branch,
    Item,
    Result,
    Verdict,
    assemble,
    decide,
    digest,
    judge,
    manifest_problem,
)
from schemas.batches import ItemState

KEYS = "ABCDEFGHIJ"


def _counts(**states: int) -> dict[str, int]:
    return {s: n for s, n in states.items() if n}


@pytest.mark.parametrize(
    ("expected", "counts", "on_incomplete", "flagged", "branch"),
    [
        # Branch 1: every position done.
        (5, _counts(done=5), "assemble_incomplete", False, Branch.ASSEMBLE),
        (5, _counts(done=5), "hold", False, Branch.ASSEMBLE),
        (1, _counts(done=1), "hold", False, Branch.ASSEMBLE),
        (0, {}, "hold", False, Branch.ASSEMBLE),  # the empty batch: complete at once
        # Branch 2: anything pending waits, whatever else is there.
        (5, _counts(done=4, pending=1), "assemble_incomplete", False, Branch.WAIT),
        (5, _counts(pending=5), "hold", False, Branch.WAIT),
        (5, _counts(done=2, failed=1, pending=2), "assemble_incomplete", False, Branch.WAIT),
        (4, _counts(abandoned=1, needs_review=1, pending=2), "hold", False, Branch.WAIT),
        (1, _counts(pending=1), "hold", False, Branch.WAIT),
        # Branch 3: none pending, some not done: incomplete or held, as configured.
        (5, _counts(done=4, failed=1), "assemble_incomplete", False, Branch.INCOMPLETE),
        (5, _counts(done=4, failed=1), "hold", False, Branch.HOLD),
        (5, _counts(done=3, abandoned=2), "assemble_incomplete", False, Branch.INCOMPLETE),
        (5, _counts(done=3, abandoned=2), "hold", False, Branch.HOLD),
        (2, _counts(done=1, needs_review=1), "assemble_incomplete", False, Branch.INCOMPLETE),
        (2, _counts(done=1, needs_review=1), "hold", False, Branch.HOLD),
        (3, _counts(failed=1, abandoned=1, needs_review=1), "hold", False, Branch.HOLD),
        (1, _counts(failed=1), "assemble_incomplete", False, Branch.INCOMPLETE),
        # Branch 4: flagged, or the rows do not add up to expected_count.
        (5, _counts(done=5), "assemble_incomplete", True, Branch.INCONSISTENT),
        (5, _counts(pending=5), "hold", True, Branch.INCONSISTENT),
        (5, _counts(done=4), "assemble_incomplete", False, Branch.INCONSISTENT),
        (5, _counts(done=6), "assemble_incomplete", False, Branch.INCONSISTENT),
        (0, _counts(done=1), "hold", False, Branch.INCONSISTENT),
        (2, {"done": 1, "lost": 1}, "hold", False, Branch.INCONSISTENT),
    ],
)
def test_decision_table(
    expected: int, counts: dict[str, int], on_incomplete: str, flagged: bool, branch: Branch
) -> None:
    """Each row of the decision table lands in its one branch."""
    assert decide(expected, counts, on_incomplete, flagged=flagged) is branch


def test_every_state_mix_lands_in_exactly_the_branch_its_rule_names() -> None:
    """Over every mix of states for up to 4 positions, the branch follows the seed's rules."""
    for n in range(5):
        for mix in itertools.combinations_with_replacement(list(ItemState), n):
            counts = {s: mix.count(s) for s in set(mix)}
            for on_incomplete in ("assemble_incomplete", "hold"):
                got = decide(n, counts, on_incomplete)
                if "pending" in counts:
                    assert got is Branch.WAIT
                elif counts.get("done", 0) == n:
                    assert got is Branch.ASSEMBLE
                else:
                    want = (
                        Branch.INCOMPLETE if on_incomplete == "assemble_incomplete" else Branch.HOLD
                    )
                    assert got is want


def _result(position: int = 4, key: str = "D", attempt: int = 1, **kw: object) -> Result:
    succeeded = bool(kw.pop("succeeded", True))
    ref = kw.pop("result_ref", f"s3://r/{key}" if succeeded else None)
    return Result("b", position, key, attempt, succeeded, ref, **kw)  # type: ignore[arg-type]


PENDING = Item(4, "D")
DONE = Item(4, "D", "done", "s3://r/D")


@pytest.mark.parametrize(
    ("item", "result", "max_retries", "verdict", "state"),
    [
        (PENDING, _result(), 0, Verdict.DONE, "done"),
        (PENDING, _result(succeeded=False, error="boom"), 0, Verdict.FAILED, "failed"),
        (PENDING, _result(succeeded=False, error="boom"), 2, Verdict.RETRY, "pending"),
        (PENDING, _result(succeeded=False, uncertain=True), 5, Verdict.REVIEW, "needs_review"),
        (DONE, _result(), 0, Verdict.DUPLICATE, "done"),
        (
            Item(4, "D", "failed", attempts=1),
            _result(succeeded=False),
            0,
            Verdict.DUPLICATE,
            "failed",
        ),
        (Item(4, "D", "pending", attempts=2), _result(attempt=1), 0, Verdict.STALE, "pending"),
        (Item(4, "D", "failed", attempts=1), _result(attempt=2), 0, Verdict.DONE, "done"),
        (Item(4, "D", "abandoned"), _result(), 0, Verdict.DONE, "done"),
        (Item(4, "D", "needs_review"), _result(), 0, Verdict.DONE, "done"),
        (DONE, _result(result_ref="s3://other"), 0, Verdict.INCONSISTENT, "done"),
        (DONE, _result(attempt=2), 0, Verdict.INCONSISTENT, "done"),
        (PENDING, _result(key="X"), 0, Verdict.INCONSISTENT, "pending"),
        (Item(4, "D", "failed"), _result(), 0, Verdict.INCONSISTENT, "failed"),
    ],
)
def test_what_each_result_does(
    item: Item, result: Result, max_retries: int, verdict: Verdict, state: str
) -> None:
    """A worker result's verdict and the state it leaves its position in."""
    judged = judge(item, result, 5, max_retries)
    assert judged.verdict is verdict, judged.reason
    assert judged.item is not None
    assert judged.item.state == state
    assert (judged.item.position, judged.item.item_key) == (item.position, item.item_key)


def test_result_for_position_above_expected_count_is_inconsistent() -> None:
    """A result for a position the manifest does not have flags the batch."""
    judged = judge(None, _result(position=6, key="F"), 5, 0)
    assert judged.verdict is Verdict.INCONSISTENT
    assert "above expected_count 5" in judged.reason


def test_retries_stop_after_max_retries() -> None:
    """A certain failure is dispatched again max_retries times, then the position fails."""
    item = PENDING
    verdicts = []
    for attempt in (1, 2, 3):
        judged = judge(item, _result(attempt=attempt, succeeded=False), 5, 2)
        verdicts.append(judged.verdict)
        assert judged.item is not None
        item = judged.item
    assert verdicts == [Verdict.RETRY, Verdict.RETRY, Verdict.FAILED]
    assert item.attempts == 3


@pytest.mark.parametrize(
    ("expected", "items", "problem"),
    [
        (3, [(1, "A"), (2, "B"), (3, "C")], None),
        (0, [], None),
        (3, [(1, "A"), (2, "B"), (2, "C")], "duplicate positions"),
        (2, [(1, "A"), (2, "B"), (3, "C")], "outside 1..2"),
        (3, [(1, "A"), (2, "B")], "no item for positions [3]"),
        (1, [(0, "A")], "outside 1..1"),
        # The largest count a column holds, with one item: named at once, nothing built per count.
        (2**31 - 1, [(2, "B")], "no item for positions [1, 3, 4, 5, 6, 7, 8, 9, 10, 11]"),
    ],
)
def test_manifest_problems(
    expected: int, items: list[tuple[int, str]], problem: str | None
) -> None:
    """A manifest with duplicate, out-of-range or missing positions is named as such."""
    found = manifest_problem(expected, items)
    assert found == problem if problem is None else problem in (found or "")


def test_digest_covers_keys_and_positions_only() -> None:
    """The digest changes with an item key, a position or the count, not with row order."""
    base = digest("b", 2, [(1, "A"), (2, "B")])
    assert digest("b", 2, [(2, "B"), (1, "A")]) == base
    assert digest("b", 2, [(1, "A"), (2, "X")]) != base
    assert digest("b", 3, [(1, "A"), (2, "B")]) != base
    assert digest("c", 2, [(1, "A"), (2, "B")]) != base


def test_incomplete_assembly_never_shifts_a_result() -> None:
    """With position 4 failed, E stays fifth, and 4 is listed missing."""
    items = [Item(p, k, "done", f"r/{k}") for p, k in enumerate("ABCDE", 1)]
    items[3] = replace(items[3], state="failed", result_ref=None)
    payload = assemble("b", 1, 5, items)
    assert payload["complete"] is False
    assert payload["missing_positions"] == [4]
    assert [(r["position"], r["item_key"]) for r in payload["results"]] == [
        (1, "A"),
        (2, "B"),
        (3, "C"),
        (5, "E"),
    ]


def test_empty_batch_assembles_complete_with_no_results() -> None:
    """The empty batch's output is complete with no results and nothing missing."""
    assert assemble("b", 1, 0, []) == {
        "batch_id": "b",
        "revision": 1,
        "expected_count": 0,
        "complete": True,
        "results": [],
        "missing_positions": [],
    }


@st.composite
def _finishing(draw: st.DrawFn) -> tuple[int, list[Result]]:
    """A batch size, and its results in a random order with random duplicates and finish times."""
    n = draw(st.integers(1, 10))
    seconds = draw(st.lists(st.integers(0, 59), min_size=n, max_size=n))
    results = [
        Result("b", p, KEYS[p - 1], 1, True, f"r/{p}", finished_at=f"2026-11-30T10:00:{s:02d}Z")
        for p, s in zip(range(1, n + 1), seconds, strict=True)
    ]
    repeats = draw(st.lists(st.sampled_from(results), max_size=n))
    return n, draw(st.permutations(results + repeats))


@given(_finishing())
def test_any_completion_order_assembles_by_position(case: tuple[int, list[Result]]) -> None:
    """Whatever order results (and their duplicates) arrive in, the output is by position."""
    n, arrivals = case
    rows = {p: Item(p, KEYS[p - 1]) for p in range(1, n + 1)}
    for result in arrivals:
        judged = judge(rows[result.position], result, n, 0)
        assert judged.verdict in (Verdict.DONE, Verdict.DUPLICATE)
        assert judged.item is not None
        rows[result.position] = judged.item
    counts = {"done": sum(1 for i in rows.values() if i.state == "done")}
    assert decide(n, counts, "hold") is Branch.ASSEMBLE
    payload = assemble("b", 1, n, rows.values())
    assert payload["complete"] is True
    assert [r["position"] for r in payload["results"]] == list(range(1, n + 1))
    assert [r["item_key"] for r in payload["results"]] == list(KEYS[:n])
