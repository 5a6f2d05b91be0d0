"""The routes file (TOML): which kind of handling each entity stream gets. Parsing only, no I/O.

Each ``[[route]]`` table names its ``stream`` (the events' entity_type) and its
``kind``; the kind's own module (``consumer.kinds``) reads the rest, and documents
it. Every problem in the file is reported, each naming the route and what to fix.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from consumer.errors import RoutesError
from consumer.kinds import KINDS, Kind, Route, Spec

STREAM = re.compile(r"[a-z][a-z0-9_]{0,62}\Z")

__all__ = ["Route", "parse_routes", "read_routes"]


def _route(problems: list[str], index: int, values: Any, kinds: Mapping[str, Kind]) -> Route | None:
    where = f"route {index + 1}"
    if not isinstance(values, Mapping):
        problems.append(f"{where}: must be a table ([[route]])")
        return None
    stream = values.get("stream")
    if not isinstance(stream, str) or not STREAM.match(stream):
        problems.append(
            f"{where}: stream must be an entity_type like 'subscription', got {stream!r}"
        )
        return None
    where = f"route {index + 1} ({stream})"
    kind = kinds.get(values.get("kind"))  # type: ignore[arg-type]
    if kind is None:
        problems.append(
            f"{where}: unknown kind {values.get('kind')!r}; use one of {', '.join(kinds)}"
        )
        return None
    return kind.parse(Spec(problems, where, values))


def parse_routes(
    text: str, source: str = "routes file", kinds: Mapping[str, Kind] = KINDS
) -> list[Route]:
    """Parse and check a routes file; ``RoutesError`` lists every problem found."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RoutesError([f"{source}: not valid TOML ({exc})"]) from exc
    problems: list[str] = []
    specs = doc.get("route")
    if not isinstance(specs, list) or not specs:
        raise RoutesError([f"{source}: no [[route]] tables; route at least one stream"])
    for unknown in sorted(set(doc) - {"route"}):
        problems.append(f"{source}: unknown top-level key {unknown!r}")
    routes: list[Route] = []
    seen: dict[str, int] = {}
    for index, values in enumerate(specs):
        route = _route(problems, index, values, kinds)
        if route is None:
            continue
        for stream in route.streams:
            if stream in seen:
                problems.append(
                    f"route {index + 1} ({route.stream}): stream {stream} already routed by "
                    f"route {seen[stream] + 1}; a stream has exactly one route"
                )
            seen[stream] = index
        routes.append(route)
    for kind in kinds.values():
        if kind.together is not None:
            problems += kind.together([r for r in routes if r.kind == kind.name])
    if problems:
        raise RoutesError(problems)
    return routes


def read_routes(path: Path, kinds: Mapping[str, Kind] = KINDS) -> list[Route]:
    """Read and parse the routes file at ``path``; ``RoutesError`` if it cannot be read or used."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise RoutesError([f"cannot read INORDER_ROUTES_FILE {path}: {exc.strerror}"]) from exc
    return parse_routes(text, str(path), kinds)
