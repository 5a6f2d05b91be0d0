"""What a program says of itself: the settings it reads, its help and its version.

The settings come from the program's settings model, the one that reads them: each
field's environment variable, its default and its description. The READMEs' settings
tables are rendered from the same rows (``deploy/reference.py``), so ``--help`` and the
READMEs cannot say different things.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import NamedTuple

from pydantic import AliasChoices
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from schemas.runtime.config import ENV_PREFIX, InorderSettings

DISTRIBUTION = "inorder"


class Setting(NamedTuple):
    """One setting as a user meets it: the variable, its default as text, what it means.

    ``literal``: the default is a value to write as it is (a text, a path, a JSON list),
    not a number, a switch, ``required`` or ``unset``.
    """

    variable: str
    default: str
    meaning: str
    literal: bool


def variable(name: str, info: FieldInfo) -> str:
    """The environment variable a settings field is read from."""
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    if isinstance(alias, str):
        return alias
    return f"{ENV_PREFIX}{name}".upper()


def default_text(info: FieldInfo) -> tuple[str, bool]:
    """A field's default as a user would write it (``required`` or ``unset`` where none),
    and whether it is a literal value."""
    if info.is_required():
        return "required", False
    value = info.get_default(call_default_factory=True)
    if value is PydanticUndefined or value is None:
        return "unset", False
    if isinstance(value, bool):
        return str(value).lower(), False
    if isinstance(value, list | dict):
        return json.dumps(value), True
    if isinstance(value, Path | str):
        return str(value), True
    return (f"{value:g}" if isinstance(value, float) else str(value)), False


def settings_of(
    cls: type[InorderSettings], without: Sequence[type[InorderSettings]] = ()
) -> list[Setting]:
    """The settings of ``cls`` not in ``without``: required first, then its own, then inherited.

    A field ``cls`` inherits from ``without`` but gives a default of its own (the sweeper's
    port) is listed, so each program's table shows its own defaults. Raises ``ValueError``
    for a field without a description: every setting must say what it does.
    """
    skipped = {
        name
        for base in without
        for name, info in base.model_fields.items()
        if name in cls.model_fields and default_text(cls.model_fields[name]) == default_text(info)
    }
    own = list(cls.__annotations__)
    listed = [(n, i) for n, i in cls.model_fields.items() if n not in skipped]
    listed.sort(
        key=lambda item: (
            not item[1].is_required(),
            own.index(item[0]) if item[0] in own else len(own),
        )
    )
    settings = []
    for name, info in listed:
        if not info.description:
            raise ValueError(f"{cls.__name__}.{name} has no description")
        default, literal = default_text(info)
        settings.append(Setting(variable(name, info), default, info.description, literal))
    return settings


def program_version() -> str:
    """The installed distribution's version; ``unknown`` when run from a source tree."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def settings_block(cls: type[InorderSettings]) -> str:
    """The settings ``cls`` reads, one per paragraph: variable, default, meaning."""
    lines = ["Configured by the environment. Settings, with their defaults:"]
    for setting in settings_of(cls):
        lines += ["", f"  {setting.variable}  ({setting.default})"]
        lines += textwrap.wrap(
            setting.meaning, 88, initial_indent="      ", subsequent_indent="      "
        )
    return "\n".join(lines) + "\n"


def help_text(program: str, summary: str, cls: type[InorderSettings]) -> str:
    """``--help`` of a program configured by the environment alone: what it does, what it
    reads."""
    head = f"usage: {program} [--help] [--version]\n\n{textwrap.fill(summary, 88)}\n\n"
    return head + settings_block(cls)
