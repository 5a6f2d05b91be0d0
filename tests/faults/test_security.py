"""Security: event data never becomes SQL, secrets never reach logs or /metrics.

The static half of the first check is ruff's S608 (SQL built by string formatting),
enabled for every package; the image's non-root user is checked in
``tests/unit/test_deploy_manifests.py``.
"""

from __future__ import annotations

import contextlib
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from psycopg.types.json import Jsonb

from producer import subscriptions as subs
from tests.conftest import PgSchema, TopicFactory
from tests.faults import effects
from tests.faults.pipeline import Pipeline
from tests.support.services import Services, stack_control

pytestmark = [pytest.mark.faults, pytest.mark.services, pytest.mark.timeout(600)]

SQL_STRINGS = [
    "x'; DROP TABLE billing_view; --",
    "Robert'); DELETE FROM outbox; --",
    "1 OR 1=1",
    "$$; SELECT pg_sleep(30); $$",
    "\\'; TRUNCATE inorder_step_log; --",
    "%s %(x)s {0} {{}}",
    '"quoted"."ident"',
    "E'\\x41' || chr(65)",
    "/* comment */ UNION SELECT * FROM pg_shadow --",
]
NOTES = """
CREATE TABLE notes (note_id text PRIMARY KEY, generation bigint NOT NULL, seq bigint NOT NULL,
                    title text, body text)
"""
NOTE_ROUTE = """
[[route]]
stream = "note"
kind = "projection"
table = "notes"
key = "note_id"
[route.columns]
title = "title"
body = "body"
"""


def test_sql_looking_strings_are_stored_verbatim(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """SQL in ids, payload fields and headers reaches every table exactly as written."""
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(NOTES)
    pipe = Pipeline(
        pg_schema, services, topic_factory, tmp_path, routes=effects.ROUTES + NOTE_ROUTE
    )
    try:
        for name in ("relay-1", "consumer-1", "sweeper-1"):
            pipe.start(name)
        with pipe.db.connect() as conn:
            for text in SQL_STRINGS:
                subs.create_subscription(conn, text, "pro", topic=pipe.events_topic)
                subs.add_seats(conn, text, 2, topic=pipe.events_topic)
            # The tests' own event types (tests/payload_schemas): plain SQL, as any language may.
            conn.cursor().executemany(
                "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, "
                "payload, headers) VALUES (%s, %s, %s, 1, %s, %s, %s, %s)",
                [
                    (
                        pipe.events_topic,
                        stream,
                        text,
                        f"{stream}.written",
                        f"{stream} {i} {text}",
                        Jsonb({"title": text, "body": text}),
                        Jsonb({"x-note": text}),
                    )
                    for stream in ("note", "unrouted")
                    for i, text in enumerate(SQL_STRINGS)
                ],
            )
            conn.commit()
        pipe.settle(timeout=120)
        with pipe.db.connect() as conn:

            def column(query: str) -> set[str]:
                return {row[0] for row in conn.execute(query).fetchall()}

            assert set(SQL_STRINGS) <= column("SELECT subscription_id FROM billing_view")
            assert set(SQL_STRINGS) <= column("SELECT subscription_id FROM seat_totals")
            assert set(SQL_STRINGS) <= column("SELECT entity_id FROM inorder_step_log")
            assert column("SELECT note_id FROM notes") == set(SQL_STRINGS)
            assert column("SELECT title FROM notes WHERE title = body") == set(SQL_STRINGS)
            dead = "SELECT entity_id FROM inorder_dead_letters WHERE entity_type = 'unrouted'"
            assert column(dead) == set(SQL_STRINGS)
            seats = dict(conn.execute("SELECT subscription_id, seats FROM seat_totals").fetchall())
            assert all(seats[text] == 3 for text in SQL_STRINGS)  # 1 at creation + 2
        verdict = pipe.verdict()
        assert verdict.clean, verdict
    finally:
        pipe.close()


# Markers to search the logs for, not credentials of anything: every character a URL
# reserves is in them, so a URL that misread one would show a piece of it somewhere.
SECRET_PASSWORD = "pw%/#@?:-4f9a-SECRET"  # noqa: S105
REDIS_PASSWORD = "rd%/#@?:-77c1-SECRET"  # noqa: S105
SASL_PASSWORD = "sasl%/#@?-91be-SECRET"  # noqa: S105
REDIS_USER = "inorder-secrets-test"


def _with_password(url: str, user: str, password: str) -> str:
    scheme, rest = url.split("://", 1)
    host = rest.rpartition("@")[2]
    return f"{scheme}://{user}:{quote(password, safe='')}@{host}"


def test_secrets_never_in_logs_or_metrics(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """Passwords with / ? # @ % in every URL and SASL: in no log, /metrics or /readyz body."""
    pipe = Pipeline(pg_schema, services, topic_factory, tmp_path, INORDER_LOG_LEVEL="DEBUG")
    # The local PostgreSQL trusts loopback, so its password is carried but not checked;
    # Redis checks its own: an ACL user made for this test.
    pipe.env["DATABASE_URL"] = _with_password(pg_schema.url, "inorder", SECRET_PASSWORD)
    admin = redis.Redis.from_url(services.redis_url)
    admin.acl_setuser(
        REDIS_USER,
        enabled=True,
        passwords=[f"+{REDIS_PASSWORD}"],
        keys=["*"],
        channels=["*"],
        commands=["+@all"],
        reset=True,
    )
    pipe.env["REDIS_URL"] = _with_password(services.redis_url, REDIS_USER, REDIS_PASSWORD)
    bodies = []
    try:
        for name in ("relay-1", "consumer-1", "sweeper-1"):
            pipe.start(name)
        load = pipe.load(10, 5, 100)
        load.join()
        pipe.settle(timeout=120)
        # Errors are where secrets leak: take PostgreSQL away and bring it back.
        stack_control("stop", "postgres")
        try:
            pipe.wait_for("consumer unready", lambda: pipe.http("consumer-1", "/readyz")[0] == 503)
            bodies += [pipe.http(name, "/readyz")[1] for name in pipe.processes]
            time.sleep(2)
        finally:
            stack_control("start", "postgres")
        pipe.settle(timeout=120)
        # A consumer whose Redis password is refused.
        pipe.start(
            "consumer-3",
            env={"REDIS_URL": _with_password(services.redis_url, REDIS_USER, REDIS_PASSWORD[1:])},
        )
        # A consumer that cannot authenticate to Kafka: SASL against a plaintext listener.
        pipe.env.update(
            INORDER_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
            INORDER_KAFKA_SASL_MECHANISM="PLAIN",
            INORDER_KAFKA_SASL_USERNAME="svc-inorder",
            INORDER_KAFKA_SASL_PASSWORD=SASL_PASSWORD,
        )
        pipe.start("consumer-2")
        time.sleep(5)
        pages = []
        for name in pipe.processes:
            port = pipe.processes[name].port
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
                pages.append(page.read().decode())
            with contextlib.suppress(OSError):
                bodies.append(pipe.http(name, "/readyz")[1])
    finally:
        pipe.close()
        admin.acl_deluser(REDIS_USER)
        admin.close()
    logs = {p.name: p.read_text(errors="replace") for p in tmp_path.glob("*.log")}
    assert any("postgres_unavailable" in text for text in logs.values()), "no error was logged"
    assert "invalid username-password" in logs["consumer-3.log"], "no refused password was logged"
    for secret in (SECRET_PASSWORD, REDIS_PASSWORD, SASL_PASSWORD):
        for form in (secret, quote(secret, safe=""), secret[1:], quote(secret[1:], safe="")):
            leaked = [name for name, text in logs.items() if form in text]
            assert not leaked, f"{form} in {leaked}"
            assert not any(form in page for page in pages)
            assert not any(form in body for body in bodies)
