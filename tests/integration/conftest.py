"""Fixtures of the consumer's integration tests: the example projection table and its routes file.

A module that needs another routes file defines its own ``routes`` fixture.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import PgSchema
from tests.integration import consumer_support as cs


@pytest.fixture
def view(pg_schema: PgSchema) -> PgSchema:
    """The test's schema with the example billing_view projection table in it."""
    cs.create_view(pg_schema)
    return pg_schema


@pytest.fixture
def routes(tmp_path: Path) -> Path:
    """A routes file with the example projection route."""
    path = tmp_path / "routes.toml"
    path.write_text(cs.ROUTES)
    return path
