"""One benchmark figure, and the figure a suite run several times in a row reports."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class BenchResult:
    """A measured figure, with its unit and how it was measured."""

    name: str
    value: float
    unit: str
    note: str = ""


def medians(rounds: Sequence[Sequence[BenchResult]]) -> list[BenchResult]:
    """Each figure's median over the rounds that measured it, in the first order seen.

    With more than one round the note says how many the median is of.
    """
    values: dict[str, list[float]] = {}
    first: dict[str, BenchResult] = {}
    for results in rounds:
        for result in results:
            first.setdefault(result.name, result)
            values.setdefault(result.name, []).append(result.value)
    merged = []
    for name, result in first.items():
        taken = values[name]
        if len(taken) == 1:
            merged.append(result)
            continue
        note = "; ".join(filter(None, (result.note, f"median of {len(taken)} rounds")))
        merged.append(replace(result, value=statistics.median(taken), note=note))
    return merged


def median_figures(rounds: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """``medians`` for figures read back by name (a baseline commit's)."""
    named = [
        [BenchResult(name, value, "") for name, value in figures.items()] for figures in rounds
    ]
    return {result.name: result.value for result in medians(named)}
