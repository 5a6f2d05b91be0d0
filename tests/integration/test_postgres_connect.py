"""The factory's connections against a real PostgreSQL: named, bounded, JSON decoded."""

from __future__ import annotations

from psycopg.conninfo import make_conninfo

from schemas.runtime import postgres
from tests.support.services import Services


def test_a_connection_carries_its_program_and_the_bounds(services: Services) -> None:
    """pg_stat_activity names the program; keepalives and the connect timeout are in force."""
    with postgres.connect(services.database_url, "inorder-relay") as conn:
        row = conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        ).fetchone()
        assert row == ("inorder-relay",)
        params = conn.info.get_parameters()
        assert conn.autocommit
        assert conn.execute("SELECT '{\"a\": [1, 2]}'::jsonb").fetchone() == ({"a": [1, 2]},)
    assert (params["keepalives_idle"], params["connect_timeout"]) == ("30", "10")


def test_the_url_s_own_name_and_options_are_kept(services: Services) -> None:
    """A name the URL gives stays; options passed by the caller reach the server."""
    url = make_conninfo(services.database_url, application_name="billing-relay")
    with postgres.connect(url, "inorder-relay", options="-c search_path=elsewhere") as conn:
        assert conn.execute("SHOW application_name").fetchone() == ("billing-relay",)
        assert conn.execute("SHOW search_path").fetchone() == ("elsewhere",)
