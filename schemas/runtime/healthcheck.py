"""``inorder-healthcheck``: the image's HEALTHCHECK, right for whichever program runs.

It finds the inorder service running in the container (relay, consumer or sweeper) and
asks its ``/healthz`` on loopback, at ``INORDER_HTTP_PORT`` or else that program's default
port. A container running a command or a worker (no HTTP port) is healthy while it
runs. Exit 0: healthy; 1: not.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path

# The services' default ports (INORDER_HTTP_PORT unset), as their settings define them.
DEFAULT_PORTS = {"inorder-relay": 9400, "inorder-consumer": 9401, "inorder-sweeper": 9402}


def running() -> list[list[str]]:
    """The argument vectors of the container's processes."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile
            found.append([part.decode(errors="replace") for part in raw.split(b"\0") if part])
    return found


def port(environ: Mapping[str, str], processes: Iterable[list[str]]) -> int | None:
    """The port to ask: the setting, else the default of the service found; None: none runs."""
    service = next(
        (
            Path(arg).name
            for argv in processes
            for arg in argv[:2]  # the script, or the interpreter and then the script
            if Path(arg).name in DEFAULT_PORTS
        ),
        None,
    )
    if service is None:
        return None
    given = environ.get("INORDER_HTTP_PORT", "").strip()
    return int(given) if given.isdigit() else DEFAULT_PORTS[service]


def main() -> None:
    """Ask the running service's /healthz; exit 0 when it answers 200."""
    asked = port(os.environ, running())
    if asked is None:
        raise SystemExit(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{asked}/healthz", timeout=2) as reply:
            healthy = reply.status == 200
    except OSError as exc:
        sys.stderr.write(f"inorder-healthcheck: port {asked}: {exc}\n")
        healthy = False
    raise SystemExit(0 if healthy else 1)
