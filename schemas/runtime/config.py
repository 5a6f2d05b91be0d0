"""Typed settings shared by the processes, and loading them at an entry point.

Settings are read from the environment only in entry points. Each setting's
variable is ``INORDER_<FIELD>`` unless it names another (``DATABASE_URL``,
``KAFKA_BOOTSTRAP_SERVERS``). A bad value stops start-up with one line.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import (
    AliasChoices,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from schemas.republish import worst_case_repair_s
from schemas.runtime import secrets
from schemas.runtime.logs import first_line
from schemas.runtime.urls import cautions

S = TypeVar("S", bound=BaseSettings)
ENV_PREFIX = "INORDER_"


class InorderSettings(BaseSettings):
    """Base of every settings class: frozen, ``INORDER_`` prefix, unknown variables ignored.

    ``renamed`` maps a variable an earlier release read to the one that replaced it: a
    program started with the old name set stops at once, naming the new one, rather than
    run on a default the operator meant to change.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")
    renamed: ClassVar[Mapping[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _hide_secrets(cls, data: Any) -> Any:
        """Register the value of every secret setting before any check can fail on it, so
        no line prints it: a URL's password, a password or client secret, each secret
        property of a JSON object. Secret means typed ``SecretStr`` or marked secret."""
        if isinstance(data, Mapping):
            names = {name.lower(): secret for name, (_, secret) in _names(cls).items()}
            for name, value in data.items():
                if names.get(str(name).lower()):
                    secrets.register_setting(value)
        secrets.register_environment()
        return data

    def cautions(self) -> list[str]:
        """Settings that work but are unsafe on a network, one line each, logged at start-up:
        here a database or Redis URL's (``schemas.runtime.urls``)."""
        return [line for name in type(self).model_fields for line in cautions(getattr(self, name))]


class LoggingSettings(InorderSettings):
    """How a process logs; every process has it."""

    log_level: str = Field(default="INFO", description="structlog level (JSON lines on stderr)")


class ServiceSettings(LoggingSettings):
    """What every long-running service has besides its own settings: endpoints, topic size."""

    topic_partitions: int = Field(
        default=6, ge=1, description="Partitions of the topics it creates"
    )
    topic_replication_factor: int | None = Field(
        default=None,
        ge=1,
        description="Replicas of the topics it creates; unset: 3, or one per broker when the "
        "cluster has fewer",
    )
    topic_min_insync_replicas: int | None = Field(
        default=None,
        ge=1,
        description="`min.insync.replicas` of the topics it creates; unset: a majority of the "
        "replicas less one of slack (2 of 3, 3 of 5, 1 of 1 or 2)",
    )
    http_host: str = Field(default="127.0.0.1", description="Address of the HTTP endpoints")


class RepairTimingSettings(InorderSettings):
    """How long gaps may take to repair: read by the sweeper, checked by the relay."""

    gap_deadline_s: float = Field(
        default=300.0,
        gt=0,
        description="A parked entity whose oldest park is older than this is a gap to repair",
    )
    republish_max_attempts: int = Field(
        default=5,
        ge=1,
        le=50,
        description="Republish requests sent for one gap before it is handed to a person",
    )
    republish_backoff_base_s: float = Field(
        default=30.0,
        gt=0,
        description="Wait before the first repeat of a request; it doubles each time",
    )
    republish_backoff_max_s: float = Field(
        default=3600.0, gt=0, description="The longest wait between repeats"
    )

    def worst_case_repair_s(self) -> float:
        """Longest time after a park that the sweeper may still ask for a seq."""
        return worst_case_repair_s(
            self.gap_deadline_s,
            self.republish_backoff_base_s,
            self.republish_backoff_max_s,
            self.republish_max_attempts,
        )


def _names(cls: type[BaseSettings]) -> dict[str, tuple[str, bool]]:
    """Every name an error may use for a field -> (its variable, whether it is secret)."""
    names: dict[str, tuple[str, bool]] = {}
    for field, info in cls.model_fields.items():
        alias = info.validation_alias
        choices = [str(c) for c in alias.choices] if isinstance(alias, AliasChoices) else []
        if isinstance(alias, str):
            choices = [alias]
        variable = choices[0] if choices else f"{ENV_PREFIX}{field}".upper()
        extra: Any = info.json_schema_extra
        secret = "SecretStr" in str(info.annotation) or (
            isinstance(extra, dict) and extra.get("secret") is True
        )
        for name in (field, *choices):
            names[name] = (variable, secret)
    return names


def secret_variables(cls: type[BaseSettings]) -> dict[str, str]:
    """Each secret setting of ``cls``: its field -> the variable it is read from."""
    found = {}
    for name, (variable, secret) in _names(cls).items():
        if secret and name in cls.model_fields:
            found[name] = variable
    return found


def describe(exc: ValidationError, cls: type[BaseSettings]) -> str:
    """One line naming each bad setting by its environment variable, and what is wrong.

    Values of secret settings are never shown.
    """
    names = _names(cls)
    parts = []
    for error in exc.errors():
        message = error["msg"].removeprefix("Value error, ")
        if not error["loc"]:
            parts.append(message)
            continue
        variable, secret = names.get(str(error["loc"][0]), (str(error["loc"][0]), False))
        if error["type"] == "missing":
            shown = ""
        elif secret:
            shown = " (value hidden)"
        else:
            shown = f" (got {error.get('input')!r})"
        parts.append(f"{variable}: {message}{shown}")
    return "; ".join(parts)


def describe_parse_error(exc: SettingsError, cls: type[BaseSettings]) -> str:
    """One line for a variable that should hold JSON and does not; its value is never shown."""
    found = re.search(r'field "(\w+)"', str(exc))
    field = found.group(1) if found else "?"
    variable, _ = _names(cls).get(field, (f"{ENV_PREFIX}{field}".upper(), False))
    cause = first_line(exc.__cause__ or exc)
    return f"{variable}: not valid JSON ({cause}); write a JSON list or object"


def renamed_in(cls: type[BaseSettings], environ: Mapping[str, str]) -> str | None:
    """One line naming every variable set under a name ``cls`` no longer reads, or None."""
    old = [
        f"{name} was renamed: set {new} instead"
        for name, new in sorted(getattr(cls, "renamed", {}).items())
        if name in environ
    ]
    return "; ".join(old) or None


def load_or_exit(cls: type[S], program: str) -> S:
    """Read ``cls`` from the environment or stop with exit code 2 and one line saying why."""
    line = renamed_in(cls, os.environ)
    if line is not None:
        sys.stderr.write(secrets.redact(f"{program}: bad configuration: {line}\n"))
        raise SystemExit(2)
    try:
        return cls()
    except ValidationError as exc:
        line = describe(exc, cls)
    except SettingsError as exc:
        line = describe_parse_error(exc, cls)
    sys.stderr.write(secrets.redact(f"{program}: bad configuration: {line}\n"))
    raise SystemExit(2)
