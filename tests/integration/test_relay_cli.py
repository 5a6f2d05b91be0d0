"""inorder-relay start-up: configuration mistakes stop it with one line saying what to fix."""

from __future__ import annotations

import os
import subprocess
import sys


def _relay(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("INORDER_")}
    base.update(DATABASE_URL="postgresql://x@127.0.0.1:1/x", KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1")
    return subprocess.run(
        [sys.executable, "-m", "outbox_relay", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_retention_shorter_than_gap_repair_is_refused() -> None:
    """A retention the consumer's gap repair could outlast stops start-up, saying why."""
    done = _relay(INORDER_RETENTION_S="600")
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("inorder-relay: bad configuration: INORDER_RETENTION_S=600 ")
    assert "worst-case gap repair time of 1230s" in line


def test_bad_values_are_named_one_line_each() -> None:
    """Several bad settings are all named on one line."""
    done = _relay(INORDER_READ_ROWS="0", INORDER_KAFKA_SECURITY_PROTOCOL="TLS")
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "INORDER_READ_ROWS: Input should be greater than or equal to 1 (got '0')" in line
    assert "INORDER_KAFKA_SECURITY_PROTOCOL" in line


def test_arguments_are_refused() -> None:
    """The relay is configured by the environment; arguments are a mistake it names."""
    done = _relay("--batch-size", "10")
    assert done.returncode == 2
    assert "takes no arguments" in done.stderr
