"""Lost packets on one loopback port: iptables rules the harness removes even when a test fails.

Both directions of every connection to ``port`` lose packets (all of them for a cut
link, a share of them for a lossy one), so the program's TCP sees what a real cut or
lossy link shows it: unacknowledged data and silent keepalives. Rules match only the
loopback interface and carry a comment, so ``clear`` removes any left behind by a run
that was killed.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator

TAG = "inorder-nemesis"


def available() -> bool:
    """Whether rules can be added here (iptables present and permitted)."""
    if shutil.which("iptables") is None:
        return False
    return (
        subprocess.run(["iptables", "-S", "INPUT"], capture_output=True, check=False).returncode
        == 0
    )


def _rules(port: int, probability: float) -> list[list[str]]:
    lossy = (
        []
        if probability >= 1
        else ["-m", "statistic", "--mode", "random", "--probability", f"{probability:.3f}"]
    )
    return [
        [
            "INPUT",
            "-i",
            "lo",
            "-p",
            "tcp",
            direction,
            str(port),
            *lossy,
            "-m",
            "comment",
            "--comment",
            TAG,
            "-j",
            "DROP",
        ]
        for direction in ("--dport", "--sport")
    ]


@contextlib.contextmanager
def dropping(port: int, probability: float = 1.0) -> Iterator[None]:
    """Drop this share of the packets to and from ``port`` on loopback while inside."""
    rules = _rules(port, probability)
    added: list[list[str]] = []
    try:
        for rule in rules:
            subprocess.run(["iptables", "-I", *rule], check=True, capture_output=True)
            added.append(rule)
        yield
    finally:
        for rule in added:
            subprocess.run(["iptables", "-D", *rule], check=False, capture_output=True)


def clear() -> None:
    """Remove every rule this harness added (a run killed midway leaves them)."""
    listed = subprocess.run(
        ["iptables", "-S", "INPUT"], capture_output=True, text=True, check=False
    )
    for line in listed.stdout.splitlines():
        if TAG in line and line.startswith("-A "):
            rule = line[3:].replace(f'"{TAG}"', TAG).split()
            subprocess.run(["iptables", "-D", *rule], check=False, capture_output=True)
