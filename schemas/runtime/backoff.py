"""Retry pacing for dependencies that are down: exponential, capped, reset on success."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Backoff:
    """Delays 0.5 s, 1 s, 2 s ... up to ``max_s`` while failures repeat."""

    base_s: float = 0.5
    max_s: float = 30.0
    failures: int = 0

    def failed(self) -> float:
        """Count a failure and return how long to wait before the next try."""
        delay: float = min(self.max_s, self.base_s * 2.0**self.failures)
        self.failures += 1
        return delay

    def succeeded(self) -> None:
        """A try worked: the next failure starts from ``base_s`` again."""
        self.failures = 0
