"""Bad input that is not a Kafka message: rows written by hand, and mistaken configuration.

Rows go in through ``psql`` (a client that is not ours) while the pipeline runs
under load; the relay marks each failed with its reason and everything behind
them flows. Every console script started with a mistake in its routes file or
settings stops with exit code 2 and one line naming the mistake.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.faults.conftest import Scale, report
from tests.faults.pipeline import Pipeline
from tests.faults.test_faults import STANDARD, start
from tests.integration.sweeper_support import tool
from tests.support.services import ROOT, Services

pytestmark = [pytest.mark.faults, pytest.mark.services, pytest.mark.timeout(600)]

ROW = (
    "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, payload, "
    "headers) VALUES (:'topic', 'subscription', '{id}', {seq}, '{type}', '{id}:{seq}', "
    "{payload}, {headers});"
)
GOOD = """'{"plan": "pro", "price_cents": 900, "status": "active"}'"""
# entity, seq, event type, payload, headers -> the reason code the relay must give.
BAD_ROWS = [
    ("bad-plan", 1, "subscription.plan_changed", """'{"plan": "platinum"}'""", "'{}'", "payload"),
    (
        "bad-price",
        1,
        "subscription.plan_changed",
        """'{"plan": "pro", "price_cents": "lots", "status": "active"}'""",
        "'{}'",
        "payload",
    ),
    (
        "bad-size",
        1,
        "subscription.noted",
        """jsonb_build_object('blob', repeat('x', 2000000))""",
        "'{}'",
        "bytes",
    ),
    (
        "bad-depth",
        1,
        "subscription.noted",
        """(repeat('{"d":', 200) || '1' || repeat('}', 200))::jsonb""",
        "'{}'",
        "deeper",
    ),
    ("bad-middle", 2, "subscription.plan_changed", """'{"plan": 7}'""", "'{}'", "payload"),
]


def psql(url: str, script: str, **variables: str) -> None:
    """Run SQL through psql, as an operator would."""
    binary = shutil.which("psql")
    assert binary, "psql is missing: deploy/local/stack up installs postgresql-client"
    sets = [arg for k, v in variables.items() for arg in ("-v", f"{k}={v}")]
    subprocess.run(
        [binary, url, "-X", "-q", "-v", "ON_ERROR_STOP=1", *sets],
        input=script,
        text=True,
        check=True,
        capture_output=True,
        timeout=60,
    )


def test_hand_written_bad_rows_are_failed_and_the_rest_flows(
    pipeline: Pipeline, scale: Scale
) -> None:
    """Bad rows by psql amid load: each failed with a reason, counted; nothing else stops."""
    start(pipeline, *STANDARD)
    started = time.monotonic()
    load = pipeline.load(scale.entities, scale.ops_per_entity, scale.rate, seed=5)
    pipeline.wait_for("load under way", lambda: load.written > scale.entities * 2)
    script = ROW.format(
        id="bad-middle", seq=1, type="subscription.plan_changed", payload=GOOD, headers="'{}'"
    )
    for entity, seq, event_type, payload, hdrs, _ in BAD_ROWS:
        script += ROW.format(id=entity, seq=seq, type=event_type, payload=payload, headers=hdrs)
    script += ROW.format(
        id="bad-middle", seq=3, type="subscription.plan_changed", payload=GOOD, headers="'{}'"
    )
    psql(pipeline.db.url, script, topic=pipeline.events_topic)
    load.join()
    pipeline.settle(timeout=180)
    with pipeline.db.connect() as conn:
        failed = dict(
            conn.execute(
                "SELECT entity_id, failure_reason FROM outbox WHERE failed_at IS NOT NULL"
            ).fetchall()
        )
        middle = conn.execute(
            "SELECT seq FROM billing_view WHERE subscription_id = 'bad-middle'"
        ).fetchone()
    assert set(failed) == {row[0] for row in BAD_ROWS}
    for entity, *_, word in BAD_ROWS:
        assert word in failed[entity], f"{entity}: {failed[entity]}"
    assert middle == (3,), "the good row after a failed one was not applied"
    assert pipeline.metric("relay-1", "outbox_rows_failed_total") == len(BAD_ROWS)
    verdict = pipeline.verdict(refused=frozenset(row[0] for row in BAD_ROWS))
    report("bad outbox rows (psql)", len(BAD_ROWS), verdict, time.monotonic() - started)
    assert verdict.clean, f"{verdict}; logs in {pipeline.logs}"
    causes = [d for d in verdict.audit["lines"] if "cause" in d]
    assert causes, "the audit did not list the failed rows"
    assert all("outbox row failed" in (d["cause"] or "") for d in causes), causes


ROUTES = {
    "unknown kind": ('[[route]]\nstream = "a"\nkind = "teleport"\n', "unknown kind 'teleport'"),
    "routed twice": ('[[route]]\nstream = "a"\nkind = "step"\n' * 2, "already routed"),
    "handler missing": (
        '[[route]]\nstream = "a"\nkind = "step"\n[route.handlers]\n"a.x" = "nope.mod:fn"\n',
        "cannot be imported",
    ),
    "table missing": (
        '[[route]]\nstream = "s"\nkind = "projection"\ntable = "no_such_table"\nkey = "id"\n'
        '[route.columns]\nplan = "plan"\n',
        "no_such_table",
    ),
    "column missing": (
        '[[route]]\nstream = "s"\nkind = "projection"\ntable = "billing_view"\n'
        'key = "subscription_id"\n[route.columns]\nno_such_column = "plan"\n',
        "no_such_column",
    ),
    "not TOML": ("route = = 1\n", "not valid TOML"),
}
SETTINGS = {
    "poll size zero": (
        "inorder-consumer",
        {"INORDER_POLL_MAX_MESSAGES": "0"},
        "INORDER_POLL_MAX_MESSAGES",
    ),
    "a name renamed": (
        "inorder-consumer",
        {"INORDER_BATCH_SIZE": "10"},
        "INORDER_BATCH_SIZE was renamed: set INORDER_POLL_MAX_MESSAGES instead",
    ),
    "a relay name renamed": (
        "inorder-relay",
        {"INORDER_BATCH_SIZE": "10"},
        "INORDER_BATCH_SIZE was renamed: set INORDER_READ_ROWS instead",
    ),
    "topics not JSON": ("inorder-consumer", {"INORDER_TOPICS": "events"}, "INORDER_TOPICS"),
    "no database": ("inorder-consumer", {"DATABASE_URL": ""}, "DATABASE_URL"),
    "database not a URL": ("inorder-relay", {"DATABASE_URL": "host=x"}, "postgresql://"),
    "port not a number": (
        "inorder-relay",
        {"DATABASE_URL": "postgresql://u:pw@127.0.0.1:five/x"},
        "port",
    ),
    "retention too short": ("inorder-relay", {"INORDER_RETENTION_S": "10"}, "worst-case"),
    "SASL incomplete": (
        "inorder-relay",
        {"INORDER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"},
        "INORDER_KAFKA_SASL",
    ),
    "unknown protocol": (
        "inorder-consumer",
        {"INORDER_KAFKA_SECURITY_PROTOCOL": "TLS"},
        "INORDER_KAFKA_SECURITY_PROTOCOL",
    ),
    "kafka extra not JSON": ("inorder-relay", {"INORDER_KAFKA_EXTRA": "{"}, "INORDER_KAFKA_EXTRA"),
    "HTTP port out of range": (
        "inorder-sweeper",
        {"INORDER_HTTP_PORT": "70000"},
        "INORDER_HTTP_PORT",
    ),
    "sweeper without Redis": ("inorder-sweeper", {"REDIS_URL": ""}, "REDIS_URL"),
    "arguments given": ("inorder-consumer", {"--verbose": ""}, "takes no arguments"),
}


def _stops_with_one_line(
    program: str, env: dict[str, str], expected: str, args: list[str] | None = None
) -> None:
    run = subprocess.run(
        [tool(program), *(args or [])],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2, f"{program} exit {run.returncode}: {run.stderr[-2000:]}"
    assert len(lines) == 1, f"expected one line, got: {lines}"
    assert lines[0].startswith(f"{program}: "), lines[0]
    assert expected in lines[0], lines[0]


@pytest.mark.parametrize("mistake", list(ROUTES))
def test_routes_file_with_a_mistake_stops_start_up(
    mistake: str, pipeline: Pipeline, tmp_path: Path
) -> None:
    """A routes file with one mistake: the consumer stops with one line naming it."""
    text, expected = ROUTES[mistake]
    routes = tmp_path / "bad-routes.toml"
    routes.write_text(text)
    env = {**pipeline.env, "INORDER_ROUTES_FILE": str(routes)}
    _stops_with_one_line("inorder-consumer", env, expected)


@pytest.mark.parametrize("mistake", list(SETTINGS))
def test_setting_with_a_mistake_stops_start_up(
    mistake: str, pipeline: Pipeline, services: Services
) -> None:
    """A setting with one mistake: the process stops with one line naming the variable."""
    program, changes, expected = SETTINGS[mistake]
    env = dict(pipeline.env)
    args = [k for k in changes if k.startswith("--")]
    for name, value in changes.items():
        if name.startswith("--"):
            continue
        if value:
            env[name] = value
        else:
            env.pop(name, None)
    _stops_with_one_line(program, env, expected, args)
