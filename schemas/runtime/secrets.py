"""Secret values a process was given, and redacting them from whatever it prints.

Settings register each secret as they validate it: a URL's password (as written, decoded
and encoded), a SASL password, a librdkafka property that names a secret. The log
processor and the exception hooks replace every registered value, wherever it appears
in a line, with ``HIDDEN``: in an event field, an error's text or a traceback's frames.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import traceback
from collections.abc import Iterable, Mapping, MutableMapping
from types import TracebackType
from typing import Any
from urllib.parse import quote, unquote

HIDDEN = "(hidden)"
MIN_LENGTH = 3  # shorter values would redact ordinary words; no real secret is this short
# librdkafka properties whose values are secrets (sasl.password, ssl.key.password,
# sasl.oauthbearer.client.secret, sasl.oauthbearer.config, ssl.key.pem ...).
SECRET_PROPERTY = re.compile(r"password|secret|oauthbearer\.config|key\.pem|token", re.I)
# RFC 3986 userinfo: unreserved, sub-delims, ':' and percent-escapes, nothing else.
_USERINFO = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:]|%[0-9A-Fa-f]{2})*")

_lock = threading.Lock()
_values: set[str] = set()
_pattern: re.Pattern[str] | None = None


def register(*values: str | None) -> None:
    """Hide each value (and its URL-encoded and decoded forms) from now on."""
    global _pattern  # noqa: PLW0603 - one registry per process, read by every log line
    forms = set()
    for value in values:
        if value and len(value) >= MIN_LENGTH:
            forms |= {value, quote(value, safe=""), unquote(value)}
    with _lock:
        if forms - _values:
            _values.update(form for form in forms if len(form) >= MIN_LENGTH)
            longest_first = sorted(_values, key=len, reverse=True)
            _pattern = re.compile("|".join(map(re.escape, longest_first)))


def forget_all() -> None:
    """Drop every registered value (tests)."""
    global _pattern  # noqa: PLW0603
    with _lock:
        _values.clear()
        _pattern = None


def redact(text: str) -> str:
    """``text`` with every registered value replaced by ``HIDDEN``."""
    pattern = _pattern
    return text if pattern is None else pattern.sub(HIDDEN, text)


def url_password(url: str) -> str | None:
    """The password of a URL as written, found the way a person reads it: after the first
    ``:`` of what lies between ``://`` and the last ``@``. None when there is none."""
    _, sep, rest = url.partition("://")
    userinfo, at, _ = rest.rpartition("@")
    if not sep or not at:
        return None
    _, colon, password = userinfo.partition(":")
    return password if colon else None


def check_userinfo(url: str) -> None:
    """Refuse a URL whose user or password holds a character a URL reserves, unencoded.

    Such a URL parses to another host, port or database than meant, and the part of the
    password read as a host ends up in error messages. The error never holds the value.
    """
    _, sep, rest = url.partition("://")
    userinfo, at, _ = rest.rpartition("@")
    if sep and at and not _USERINFO.fullmatch(userinfo):
        raise ValueError(
            "the user or password holds a character a URL reserves (/ ? # @ % [ ] or a "
            "space): percent-encode it, e.g. urllib.parse.quote(password, safe='')"
        )


def register_url(url: str) -> None:
    """Hide the password of ``url``, however it is written."""
    password = url_password(url)
    if password:
        register(password)


def register_setting(value: object) -> None:
    """Hide a secret setting's value, whatever its shape: a URL's password (a URL holding
    none hides nothing: its host and database are no secret), any other string whole,
    the secret properties of a mapping."""
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    if isinstance(value, str):
        if "://" in value:
            register_url(value)
        else:
            register(value)
    elif isinstance(value, Mapping):
        register_properties({str(k): str(v) for k, v in value.items()})


# Variables the libraries read themselves that may hold secrets: libpq's password, and
# the OTLP exporter's headers (an authorization token, as "name=value,...").
_ENVIRONMENT = ("PGPASSWORD",)
_HEADERS = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")


def register_environment(environ: Mapping[str, str] | None = None) -> None:
    """Hide the secrets the libraries read from the environment on their own."""
    given = os.environ if environ is None else environ
    register(*(given.get(name) for name in _ENVIRONMENT))
    for name in _HEADERS:
        for pair in given.get(name, "").split(","):
            register(pair.partition("=")[2].strip())


def register_properties(properties: MutableMapping[str, str] | dict[str, str]) -> None:
    """Hide the values of librdkafka properties that name secrets."""
    register(*(value for name, value in properties.items() if SECRET_PROPERTY.search(name)))


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: _scrub(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(item) for item in value]
    if isinstance(value, BaseException):
        return redact(f"{type(value).__name__}: {value}")
    return value


def processor(_logger: object, _method: str, event: MutableMapping[str, Any]) -> Any:
    """structlog processor: every string in the event (tracebacks too) redacted."""
    if _pattern is None:
        return event
    return {key: _scrub(value) for key, value in event.items()}


def _print_redacted(lines: Iterable[str]) -> None:
    sys.stderr.write(redact("".join(lines)))
    sys.stderr.flush()


def _excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    _print_redacted(traceback.format_exception(kind, value, tb))


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    lines = traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback)
    _print_redacted([f"Exception in thread {name}:\n", *lines])


def install_hooks() -> None:
    """Print uncaught exceptions, in the main thread or any other, redacted."""
    sys.excepthook = _excepthook
    threading.excepthook = _thread_excepthook
