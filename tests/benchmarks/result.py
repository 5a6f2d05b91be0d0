"""One benchmark figure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BenchResult:
    """A measured figure, with its unit and how it was measured."""

    name: str
    value: float
    unit: str
    note: str = ""
