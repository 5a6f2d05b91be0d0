"""A benchmark suite run in rounds: medians on both sides, the baseline's run before each."""

from __future__ import annotations

import types
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.benchmarks import __main__ as bench
from tests.benchmarks.result import BenchResult, median_figures, medians


def test_each_figure_is_the_median_of_its_rounds() -> None:
    """The middle value is reported, not the mean, with the unit and note of the first."""
    rounds = [
        [BenchResult("emit", 100.0, "rows/s", "x200"), BenchResult("many", 5.0, "rows/s")],
        [BenchResult("emit", 400.0, "rows/s", "x200"), BenchResult("many", 7.0, "rows/s")],
        [BenchResult("emit", 110.0, "rows/s", "x200"), BenchResult("many", 6.0, "rows/s")],
    ]
    assert medians(rounds) == [
        BenchResult("emit", 110.0, "rows/s", "x200; median of 3 rounds"),
        BenchResult("many", 6.0, "rows/s", "median of 3 rounds"),
    ]


def test_one_round_is_reported_as_measured() -> None:
    """A suite measured once keeps its figures and notes unchanged."""
    once = [BenchResult("relay", 3.0, "ms", "p99")]
    assert medians([once]) == once


def test_a_figure_missing_from_a_round_is_the_median_of_the_others() -> None:
    """A figure only some rounds produced is the median of those, named once."""
    rounds = [
        [BenchResult("a", 1.0, "x")],
        [BenchResult("a", 3.0, "x"), BenchResult("b", 9.0, "x")],
    ]
    assert medians(rounds) == [
        BenchResult("a", 2.0, "x", "median of 2 rounds"),
        BenchResult("b", 9.0, "x"),
    ]


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=9))
def test_the_baselines_figures_are_the_medians_of_theirs(values: list[float]) -> None:
    """Read back by name, the baseline's figure is the median of its rounds, as ours is."""
    ours = medians([[BenchResult("f", v, "x")] for v in values])[0].value
    assert median_figures([{"f": v} for v in values]) == {"f": ours}
    assert min(values) <= ours <= max(values)


def test_rounds_alternate_with_the_baseline_and_report_medians(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A suite asking for three rounds runs after the baseline's each time; both report medians."""
    order: list[str] = []
    figures = iter([10.0, 30.0, 20.0])
    theirs = iter([1.0, 5.0, 3.0])
    suite = types.SimpleNamespace(
        ROUNDS=3,
        run=lambda: order.append("ours") or [BenchResult("emit", next(figures), "rows/s")],
    )

    class Baseline:
        commit = "abc"

        def run(self, name: str) -> dict[str, float]:
            order.append("theirs")
            return {"emit": next(theirs)}

    class CheckedOut:
        def __enter__(self) -> Baseline:
            return Baseline()

        def __exit__(self, *exc: object) -> None:
            return None

    written: dict[str, Any] = {}
    monkeypatch.setattr(bench, "SUITES", ("emit",))
    monkeypatch.setattr(bench.importlib, "import_module", lambda name: suite)
    monkeypatch.setattr(bench, "checked_out", CheckedOut)
    monkeypatch.setattr(bench, "during", lambda *args: [])
    monkeypatch.setattr(bench, "OUTPUT", tmp_path / "out.json")
    monkeypatch.setattr(
        bench,
        "_merge",
        lambda results, then, commit: written.update(results=results, then=then) or {},
    )
    bench.main(["emit"])
    assert order == ["theirs", "ours"] * 3
    assert written["results"] == [BenchResult("emit", 20.0, "rows/s", "median of 3 rounds")]
    assert written["then"] == {"emit": 3.0}
