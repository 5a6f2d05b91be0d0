"""Loading typed settings at an entry point: one clear line instead of a traceback."""

from __future__ import annotations

import sys
from typing import TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

S = TypeVar("S", bound=BaseSettings)


def describe(exc: ValidationError) -> str:
    """One line naming each bad setting (by its environment variable) and what is wrong."""
    parts = []
    for error in exc.errors():
        name = ".".join(str(p) for p in error["loc"]).upper() or "settings"
        value = "" if error["type"] == "missing" else f" (got {error.get('input')!r})"
        parts.append(f"{name}: {error['msg']}{value}")
    return "; ".join(parts)


def load_or_exit(cls: type[S], program: str) -> S:
    """Read ``cls`` from the environment or stop with exit code 2 and one line saying why."""
    try:
        return cls()
    except ValidationError as exc:
        sys.stderr.write(f"{program}: bad configuration: {describe(exc)}\n")
        raise SystemExit(2) from None
