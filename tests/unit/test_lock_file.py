"""The image's lock file: every runtime dependency pinned within pyproject's bounds, hashed."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "deploy" / "requirements.lock"


def _pins() -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) of every pin in the lock file."""
    pins: dict[str, tuple[str, int]] = {}
    for block in re.split(r"\n(?=[a-z0-9])", LOCK.read_text()):
        found = re.match(r"([A-Za-z0-9_.-]+)==([^ \\\n]+)", block)
        if found:
            pins[canonicalize_name(found.group(1))] = (found.group(2), block.count("--hash="))
    return pins


def _dependencies() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in project["dependencies"]]


def test_every_dependency_is_pinned_within_its_bounds_with_hashes() -> None:
    """pip --require-hashes installs exactly these; each satisfies pyproject.toml."""
    pins = _pins()
    for requirement in _dependencies():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in the lock file: run make lock"
        version, hashes = pins[name]
        assert requirement.specifier.contains(version), (name, version, requirement.specifier)
        assert hashes >= 1, name
        for extra in requirement.extras:  # psycopg[binary,pool]: psycopg-binary, -pool
            assert canonicalize_name(f"{name}-{extra}") in pins, (name, extra)
    assert all(hashes >= 1 for _, hashes in pins.values())


def test_every_dependency_has_an_upper_bound_on_its_major_release() -> None:
    """A new major release is taken on purpose, never by an image build."""
    unbounded = [
        r.name
        for r in _dependencies()
        if not any(s.operator in ("<", "<=", "~=", "==") for s in r.specifier)
    ]
    assert unbounded == []


def test_the_image_installs_from_the_lock_file_with_hashes_required() -> None:
    """The Dockerfile installs the lock with --require-hashes, then the project alone."""
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "--require-hashes --no-deps -r requirements.lock" in dockerfile
    assert "-r build-backend.lock" in dockerfile
    assert "pip install --no-deps --no-build-isolation ." in dockerfile
    ignored = (ROOT / ".dockerignore").read_text()
    assert "!deploy/requirements.lock" in ignored
    assert "!deploy/build-backend.lock" in ignored


def test_the_build_backend_is_pinned_with_hashes_within_pyproject_s_requirement() -> None:
    """setuptools, which builds the project in the image, is never fetched unpinned."""
    text = (ROOT / "deploy" / "build-backend.lock").read_text()
    found = re.search(r"^setuptools==(\S+) \\\n((?:\s+--hash=sha256:\w+ ?\\?\n?)+)", text, re.M)
    assert found, "setuptools is not pinned in deploy/build-backend.lock: run make lock"
    system = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    [wanted] = [Requirement(r) for r in system["requires"] if r.startswith("setuptools")]
    assert wanted.specifier.contains(found.group(1)), (found.group(1), wanted.specifier)
    assert found.group(2).count("--hash=sha256:") >= 1
