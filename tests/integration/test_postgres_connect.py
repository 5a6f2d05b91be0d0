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
    assert (params["keepalives_idle"], params["connect_timeout"]) == ("5", "10")
    assert params["tcp_user_timeout"] == "20000"


def test_the_server_side_bounds_are_in_force_unless_the_url_sets_its_own(
    services: Services,
) -> None:
    """The server's keepalives and timeouts are set; the URL's own statement timeout wins."""
    url = make_conninfo(services.database_url, options="-c statement_timeout=0")
    with postgres.connect(url, "inorder-relay", options="-c search_path=elsewhere") as conn:
        shown = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("statement_timeout", "lock_timeout", "tcp_keepalives_idle", "search_path")
        }
        assert conn.execute("SHOW tcp_user_timeout").fetchone() == ("20000",)
    assert shown == {
        "statement_timeout": "0",
        "lock_timeout": "30s",
        "tcp_keepalives_idle": "5",
        "search_path": "elsewhere",
    }


def test_the_url_s_own_name_and_options_are_kept(services: Services) -> None:
    """A name the URL gives stays; options passed by the caller reach the server."""
    url = make_conninfo(services.database_url, application_name="billing-relay")
    with postgres.connect(url, "inorder-relay", options="-c search_path=elsewhere") as conn:
        assert conn.execute("SHOW application_name").fetchone() == ("billing-relay",)
        assert conn.execute("SHOW search_path").fetchone() == ("elsewhere",)
