"""structlog set-up shared by every inorder process: JSON lines on stderr."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "INFO") -> None:
    """Log JSON lines with ISO timestamps, level and event name; never pretty-print."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name if it has none), for one field."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
