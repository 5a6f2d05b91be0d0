"""The container engine for the image tests: docker or podman, found as `make image` finds it."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

from tests.support.services import ROOT

ENGINE_SCRIPT = ROOT / "deploy" / "image" / "engine"
IMAGE = os.environ.get("INORDER_IMAGE", "inorder:latest")


def find_engine() -> tuple[str | None, str]:
    """(engine, "") when one can be had, else (None, the one-line reason)."""
    found = subprocess.run(
        ["bash", "-c", f'. "{ENGINE_SCRIPT}" && pick_engine && echo "$ENGINE $CONTAINERS_CONF"'],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        return None, found.stderr.strip().splitlines()[-1] if found.stderr else "no engine"
    engine, conf = found.stdout.split()
    os.environ.setdefault("CONTAINERS_CONF", conf)
    return engine, ""


@dataclass
class Engine:
    """Runs containers of the image on the host network, and removes them afterwards."""

    command: str
    started: list[str]

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        """The engine's output for ``args``; raises with its stderr when it fails."""
        done = subprocess.run(
            [self.command, *args], capture_output=True, text=True, check=False, timeout=timeout
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{self.command} {' '.join(args[:3])}: {done.stderr.strip()}")
        return done.stdout.strip()

    def start(
        self, name: str, env: dict[str, str], *args: str, volumes: tuple[str, ...] = ()
    ) -> str:
        """A detached container of the image: host network, read-only root, uid from the image."""
        options = ["--network", "host", "--read-only", "--name", name]
        for key, value in env.items():
            options += ["-e", f"{key}={value}"]
        for volume in volumes:
            options += ["-v", volume]
        self.run("run", "-d", *options, IMAGE, *args)
        self.started.append(name)
        return name

    def stop(self, name: str, seconds: int = 5) -> tuple[int, float]:
        """SIGTERM (then SIGKILL after ``seconds``): the exit code and how long it took."""
        began = time.monotonic()
        self.run("stop", "-t", str(seconds), name, timeout=seconds + 30)
        took = time.monotonic() - began
        code = int(self.run("inspect", "--format", "{{.State.ExitCode}}", name))
        return code, took

    def remove_all(self) -> None:
        """Remove every container this engine started."""
        for name in self.started:
            self.run("rm", "-f", name, check=False)
