"""Every console script answers --help and --version, run as installed, with no service at all.

The help of a program configured by the environment names every setting it reads with
its default, from the same settings model the README's tables are rendered from.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from consumer.settings import ConsumerSettings, SweeperSettings
from outbox_relay.settings import RelaySettings
from producer.settings import ProducerSettings
from schemas.runtime.config import InorderSettings
from schemas.runtime.usage import settings_of

# Program -> the settings model it reads.
PROGRAMS: dict[str, type[InorderSettings]] = {
    "inorder-relay": RelaySettings,
    "inorder-consumer": ConsumerSettings,
    "inorder-sweeper": SweeperSettings,
    "inorder-producer": ProducerSettings,
    "inorder-admin": SweeperSettings,
}


def _run(program: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script as a user runs it: no service settings in its environment."""
    script = shutil.which(program, path=str(Path(sys.executable).parent))
    assert script is not None, f"{program} is not installed beside {sys.executable}"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("INORDER_") and k not in {"DATABASE_URL", "REDIS_URL"}
    }
    return subprocess.run(
        [script, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_help_exits_0_naming_every_setting_with_its_default(program: str) -> None:
    """``--help`` needs no service and lists each variable the program reads, with its default."""
    done = _run(program, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {program}")
    for setting in settings_of(PROGRAMS[program]):
        assert f"  {setting.variable}  ({setting.default})" in done.stdout


@pytest.mark.parametrize("program", sorted(PROGRAMS))
@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_exits_0_with_the_installed_version(program: str, flag: str) -> None:
    """``--version`` prints the program and the installed distribution's version."""
    if flag == "-V" and program in {"inorder-producer", "inorder-admin"}:
        flag = "--version"  # subcommand programs spell it out
    done = _run(program, flag)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{program} {version('inorder')}"


@pytest.mark.parametrize("program", ["inorder-relay", "inorder-consumer", "inorder-sweeper"])
@pytest.mark.parametrize("args", [["--verbose"], ["--help", "--version"], ["run"]])
def test_other_arguments_stop_a_service_with_one_line_naming_help(
    program: str, args: list[str]
) -> None:
    """A service takes no other argument: one line on stderr, exit 2, and where to look."""
    done = _run(program, *args)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"{program}: takes no arguments")
    assert f"`{program} --help`" in line
