"""The same suites measured at an earlier commit, in the same run, next to today's figures.

``INORDER_BENCH_BASELINE=<commit>`` (``make bench BASELINE=<commit>``) checks the commit
out in a temporary git worktree and, before each suite runs here, runs that commit's own
suite of the same name on the same stack (its code, its migrations, its benchmark). The
two sets of figures are taken minutes apart on one machine, so their ratio is the one
to read; either figure alone moves with whatever else the machine is doing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
VARIABLE = "INORDER_BENCH_BASELINE"
OUTPUTS = ("bench-results.short.json", "bench-results.json")


class Baseline:
    """An earlier commit's tree, whose suites run in a process of their own."""

    def __init__(self, commit: str, tree: Path) -> None:
        self.commit = commit
        self.tree = tree

    def has(self, suite: str) -> bool:
        """Whether the commit had a suite of this name."""
        return (self.tree / "tests" / "benchmarks" / f"bench_{suite}.py").exists()

    def run(self, suite: str) -> dict[str, float]:
        """The commit's figures for ``suite``, by name; empty when it had no such suite."""
        if not self.has(suite):
            return {}
        # A commit from before short runs had their own file writes the usual one.
        outputs = [self.tree / name for name in OUTPUTS]
        for stale in outputs:
            stale.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": str(self.tree)}
        env.pop(VARIABLE, None)
        done = subprocess.run(
            [sys.executable, "-m", "tests.benchmarks", suite],
            cwd=self.tree,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
        written = [output for output in outputs if output.exists()]
        if done.returncode != 0 or not written:
            tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
            print(f"baseline {self.commit} {suite}: failed ({tail[0]})", file=sys.stderr)
            return {}
        figures = orjson.loads(written[0].read_bytes()).get("results", {})
        return {name: float(entry["value"]) for name, entry in figures.items()}


@contextmanager
def checked_out() -> Iterator[Baseline | None]:
    """The baseline named by ``INORDER_BENCH_BASELINE`` in a worktree, removed afterwards."""
    commit = os.environ.get(VARIABLE, "").strip()
    if not commit:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="inorder-baseline-") as parent:
        tree = Path(parent) / "tree"
        git = ["git", "-C", str(ROOT)]
        added = subprocess.run(
            [*git, "worktree", "add", "--detach", str(tree), commit],
            capture_output=True,
            text=True,
            check=False,
        )
        if added.returncode != 0:
            raise SystemExit(f"{VARIABLE}={commit}: {added.stderr.strip()}")
        try:
            yield Baseline(commit, tree)
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(tree)], check=False)
