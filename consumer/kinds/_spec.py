"""Checking one ``[[route]]`` table of the routes file: every problem is collected, none raised.

Each route kind parses its own settings with a ``Spec``; the defaults come from the
kind's route dataclass (``default``), so each is written once.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}\Z")


def setting(
    meaning: str, default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING
) -> Any:
    """A route dataclass field the routes file sets, with what it means (rendered in docs)."""
    return dataclasses.field(
        default=default, default_factory=factory, metadata={"setting": meaning}
    )


def settings(route_class: type) -> list[tuple[str, Any, str]]:
    """``(name, default or MISSING, meaning)`` of every routes-file setting of a dataclass."""
    return [
        (
            f.name,
            f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default,
            f.metadata["setting"],
        )
        for f in dataclasses.fields(route_class)
        if "setting" in f.metadata
    ]


def names(route_class: type) -> set[str]:
    """The routes-file settings a dataclass declares."""
    return {name for name, _, _ in settings(route_class)}


def default(route_class: type, name: str) -> Any:
    """The default a route dataclass declares for its field ``name``."""
    found = {f.name: f for f in dataclasses.fields(route_class)}[name]
    if found.default is not dataclasses.MISSING:
        return found.default
    raise KeyError(f"{route_class.__name__}.{name} has no default")


class Spec:
    """One route's settings, where it stands in the file, and the problems found so far."""

    def __init__(self, problems: list[str], where: str, values: Mapping[str, Any]) -> None:
        self.problems = problems
        self.where = where
        self.values = values

    @property
    def stream(self) -> str:
        """The route's entity stream (checked before the kind parses it)."""
        return str(self.values["stream"])

    def problem(self, text: str) -> None:
        """Note one problem, prefixed with the route it belongs to."""
        self.problems.append(f"{self.where}: {text}")

    def only(self, kind: str, known: set[str]) -> None:
        """Name every setting the kind does not know."""
        for unknown in sorted(set(self.values) - known - {"stream", "kind"}):
            self.problem(f"unknown setting {unknown!r} for a {kind} route")

    def identifier(self, name: str, value: Any) -> str:
        """``value`` if it is an SQL identifier (letters, digits, _), else a problem."""
        if not isinstance(value, str) or not IDENTIFIER.match(value):
            self.problem(f"{name} must be an SQL identifier (letters, digits, _), got {value!r}")
            return ""
        return value

    def positive(self, name: str, route_class: type) -> int:
        """A whole number >= 1, or the route class's default (with a problem if it was bad)."""
        fallback = default(route_class, name)
        value = self.values.get(name, fallback)
        if type(value) is not int or value < 1:
            self.problem(f"{name} must be a whole number >= 1, got {value!r}")
            return int(fallback)
        return value

    def flag(self, name: str, route_class: type) -> bool:
        """True or false, or the route class's default (with a problem if it was neither)."""
        fallback = default(route_class, name)
        value = self.values.get(name, fallback)
        if not isinstance(value, bool):
            self.problem(f"{name} must be true or false, got {value!r}")
            return bool(fallback)
        return value

    def topic(self, name: str, route_class: type) -> str:
        """A Kafka topic name, or the route class's default (with a problem if it was bad)."""
        fallback = default(route_class, name)
        value = self.values.get(name, fallback)
        if not isinstance(value, str) or not TOPIC.match(value):
            self.problem(f"{name} must be a Kafka topic name, got {value!r}")
            return str(fallback)
        return value

    def choice(self, name: str, choices: tuple[str, ...], route_class: type) -> str:
        """One of ``choices``, or the route class's default (with a problem if it was bad)."""
        fallback = default(route_class, name)
        value = self.values.get(name, fallback)
        if value not in choices:
            self.problem(f"{name} must be one of {', '.join(choices)}, got {value!r}")
            return str(fallback)
        return str(value)
