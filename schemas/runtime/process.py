"""The life of every inorder process: arguments, health server, signals, the main loop.

``serve`` is what each entry point ends with: the health and metrics endpoints in a
thread, SIGTERM and SIGINT turned into ``stop()``, and ``run()`` until it returns.
"""

from __future__ import annotations

import ctypes
import gc
import signal
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, Protocol

import structlog

from schemas.runtime import secrets, traces
from schemas.runtime.causes import Cause, cause
from schemas.runtime.config import InorderSettings
from schemas.runtime.endpoints import serve as serve_http
from schemas.runtime.health import Health
from schemas.runtime.logs import first_line
from schemas.runtime.usage import help_text, program_version

# Youngest-generation collections every 50,000 allocations instead of 700: a batch makes
# thousands of short-lived objects, none in cycles, and collecting them every 700 took a
# third of the relay's time (measured).
GC_THRESHOLDS = (50_000, 20, 20)

# glibc's malloc hands the top of its heap back to the kernel once 128 KiB of it is free,
# and takes it back page by page, each page a fault, on the next batch. A batch of rows
# or events and its messages is tens of megabytes: kept, the pages are reused instead.
# Faulting them back in was a tenth of the relay's time (measured).
M_TRIM_THRESHOLD, M_TOP_PAD = -1, -2  # mallopt parameters (malloc.h)
HEAP_KEPT_BYTES = 64 * 2**20  # free heap kept before any is given back
HEAP_GROWTH_BYTES = 16 * 2**20  # extra heap taken each time it grows


class Service(Protocol):
    """A long-running process: ``run`` until ``stop`` is called, then return."""

    def run(self) -> None:
        """Do the work until ``stop``."""

    def stop(self) -> None:
        """Finish what is in hand and make ``run`` return."""


def fail(program: str, lines: Sequence[str], code: int = 2) -> NoReturn:
    """Stop with one line per problem on stderr, each naming the program; any secret the
    settings registered is hidden, as in every log line."""
    for line in lines:
        sys.stderr.write(f"{program}: {secrets.redact(line)}\n")
    raise SystemExit(code)


def arguments(
    program: str, argv: Sequence[str] | None, summary: str, settings: type[InorderSettings]
) -> None:
    """Services are configured by the environment only: they answer ``--help`` (what they do
    and the settings they read, with defaults) and ``--version``, both exit 0; any other
    argument stops start-up."""
    given = list(sys.argv[1:] if argv is None else argv)
    if given in (["--help"], ["-h"]):
        sys.stdout.write(help_text(program, summary, settings))
        raise SystemExit(0)
    if given in (["--version"], ["-V"]):
        sys.stdout.write(f"{program} {program_version()}\n")
        raise SystemExit(0)
    if given:
        fail(
            program,
            [
                f"takes no arguments but --help and --version; it is configured by the "
                f"environment (`{program} --help` lists the settings)"
            ],
        )


def serve(
    program: str,
    health: Health,
    host: str,
    port: int,
    service: Service,
    run: Callable[[], None] | None = None,
) -> None:
    """Serve the endpoints, make SIGTERM and SIGINT call ``service.stop``, and run it.

    ``run`` replaces ``service.run`` when the entry point wraps it (to turn start-up
    errors into one line). A port that cannot be bound stops start-up with one line.
    """
    try:
        server = serve_http(health, host, port)
    except OSError as exc:
        fail(
            program,
            [
                f"cannot serve health and metrics on {host}:{port} ({exc.strerror}); "
                "set INORDER_HTTP_PORT"
            ],
        )
    log = structlog.get_logger(program)

    def on_signal(signum: int, _frame: object) -> None:
        log.info(f"{program.removeprefix('inorder-')}_stopping", signal=signal.Signals(signum).name)
        service.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    exporting = traces.configure(program)
    settle_heap()
    log.info("http_serving", host=host, port=server.server_address[1])
    try:
        (run or service.run)()
    except Exception as exc:
        stop_for_operator(program, exc)
        raise
    finally:
        traces.shutdown(exporting)
        server.shutdown()


def stop_for_operator(program: str, exc: BaseException) -> None:
    """Exit 3 with one line when only the operator can fix ``exc``; else return.

    A grant missing or taken away, a table dropped: said once, at start-up or later,
    instead of retrying for ever or printing a traceback.
    """
    if cause(exc) is Cause.OPERATOR:
        fix = "only a change of configuration, grants or schema can fix this"
        fail(program, [f"stopped: {first_line(exc)}; {fix}"], code=3)


def settle_heap() -> None:
    """Keep the garbage collector off the start-up heap, and collect the young less often.

    Everything alive once a service is built (modules, settings, handlers, clients) lives
    as long as the process: frozen, a full collection no longer walks it. Unfrozen, one
    took about 26 ms in the consumer, a pause added to every event in flight. Memory a
    batch frees is kept for the next one (``keep_freed_heap``).
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    keep_freed_heap()


def keep_freed_heap() -> bool:
    """Have glibc's malloc keep freed memory for reuse; False where malloc is not glibc's."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(
        mallopt(M_TRIM_THRESHOLD, HEAP_KEPT_BYTES) and mallopt(M_TOP_PAD, HEAP_GROWTH_BYTES)
    )
