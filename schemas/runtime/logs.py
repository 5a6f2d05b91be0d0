"""structlog set-up shared by every inorder process: JSON lines on stderr."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import structlog

from schemas.runtime import secrets


def configure(level: str = "INFO", cautions: Sequence[str] = ()) -> None:
    """Log JSON lines with ISO timestamps, level and event name; never pretty-print.

    Every registered secret is redacted from each line, and from uncaught exceptions'
    tracebacks (``schemas.runtime.secrets``). Each of ``cautions`` (settings that work but
    are unsafe on a network) is logged once, as ``insecure_setting``.
    """
    secrets.install_hooks()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            secrets.processor,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    log = structlog.get_logger("inorder.settings")
    for line in cautions:
        log.warning("insecure_setting", detail=line)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name if it has none), for one field."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
