"""inorder as a user installs it: run by a fresh virtualenv holding only the built wheel.

``make test-installed`` builds the wheel, installs it into a new virtualenv in an empty
folder, and runs this file there (its own folder is not importable as the repository).
Each step prints one line; any failure stops with the step's output.

Steps: every program's ``--help`` and ``--version``; ``inorder-producer migrate``; an
application emitting its own event type with a schema folder; ``inorder-relay`` and
``inorder-consumer`` with a routes file projecting that type, until the row is there; an
application module named ``schemas`` beside inorder failing with one line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from importlib.metadata import version
from pathlib import Path

import psycopg

HERE = Path.cwd()
BIN = Path(sys.executable).parent
PROGRAMS = (
    "inorder-relay",
    "inorder-consumer",
    "inorder-sweeper",
    "inorder-admin",
    "inorder-producer",
)


def step(what: str, done: subprocess.CompletedProcess[str], expect: int = 0) -> str:
    if done.returncode != expect:
        sys.exit(f"FAILED {what}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
    print(f"ok  {what}")
    return done.stdout + done.stderr


def run(*argv: str, env: dict[str, str] | None = None, expect: int = 0, what: str = "") -> str:
    done = subprocess.run(
        argv, env=env, cwd=HERE, capture_output=True, text=True, timeout=120, check=False
    )
    return step(what or " ".join(argv), done, expect)


def programs() -> None:
    """Every console script answers --help and --version."""
    for program in PROGRAMS:
        out = run(str(BIN / program), "--help", what=f"{program} --help")
        assert "usage" in out.lower() or "DATABASE_URL" in out, out
        out = run(str(BIN / program), "--version", what=f"{program} --version")
        assert version("inorder") in out, out


def project(url: str, topic: str, env: dict[str, str]) -> None:
    """The relay and a consumer with a routes file project the emitted event."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE orders_view (order_id text PRIMARY KEY, total_cents bigint,"
            " generation bigint NOT NULL, seq bigint NOT NULL)"
        )
    (HERE / "routes.toml").write_text(
        '[[route]]\nstream = "order"\nkind = "projection"\ntable = "orders_view"\n'
        'key = "order_id"\n[route.columns]\ntotal_cents = "total_cents"\n'
    )
    services = {
        **env,
        "INORDER_ROUTES_FILE": str(HERE / "routes.toml"),
        "INORDER_TOPICS": f'["{topic}"]',
        "INORDER_GROUP_ID": f"{topic}.consumer",
        "INORDER_RELAY_GROUP_ID": f"{topic}.relay",
        "INORDER_REPUBLISH_REQUESTS_TOPIC": f"{topic}.requests",
        "INORDER_REPUBLISH_RESULTS_TOPIC": f"{topic}.results",
        "INORDER_DEAD_LETTER_TOPIC": f"{topic}.dlq",
        "INORDER_HELD_TOPIC": f"{topic}.held",
        "INORDER_REDIS_KEY_PREFIX": f"{topic}:",
        "INORDER_HTTP_PORT": "0",
    }
    started = [
        subprocess.Popen(
            [str(BIN / program)],
            env=services,
            cwd=HERE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for program in ("inorder-relay", "inorder-consumer")
    ]
    try:
        deadline = time.monotonic() + 90
        row = None
        while row is None and time.monotonic() < deadline:
            if any(p.poll() is not None for p in started):
                break
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT total_cents, seq FROM orders_view").fetchone()
            time.sleep(0.5)
    finally:
        for process in started:
            process.send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=60)[0] for p in started]
    if row != (1200, 1):
        sys.exit(f"FAILED relay and consumer: projection row {row}\n" + "\n".join(outputs))
    codes = [p.returncode for p in started]
    if codes != [0, 0]:
        sys.exit(f"FAILED relay and consumer stopping: exit {codes}\n" + "\n".join(outputs))
    print("ok  inorder-relay and inorder-consumer with a routes file: the row is projected")


def shadowed() -> None:
    """An application module named schemas beside inorder fails with one line saying so."""
    app = HERE / "shadowing-app"
    app.mkdir()
    (app / "schemas.py").write_text("SCHEMA = 1\n")
    done = subprocess.run(
        [str(BIN / "python"), "-c", "import producer"],
        cwd=app,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    if done.returncode == 0 or "hides inorder's package" not in last:
        sys.exit(f"FAILED an application module named schemas: {done.stderr}")
    print(f"ok  an application module named schemas: {last}")


def main() -> None:
    """Every step, in the empty folder this runs in."""
    assert not any((HERE / p).exists() for p in ("schemas", "producer", "consumer")), HERE
    programs()
    base = os.environ["DATABASE_URL"]
    schema = f"installed_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    url = f"{base}?options=-csearch_path%3D{schema}"
    topic = f"installed.{schema}"
    env = {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "DATABASE_URL": url,
        "KAFKA_BOOTSTRAP_SERVERS": os.environ["KAFKA_BOOTSTRAP_SERVERS"],
        "REDIS_URL": os.environ["REDIS_URL"],
        "INORDER_PAYLOAD_SCHEMAS": str(HERE / "event-schemas"),
        "INORDER_LOG_LEVEL": "WARNING",
    }
    try:
        run(str(BIN / "inorder-producer"), "migrate", env=env, what="inorder-producer migrate")
        (HERE / "event-schemas").mkdir()
        (HERE / "event-schemas" / "order.created.schema.json").write_text(
            '{"type": "object", "required": ["total_cents"],'
            ' "properties": {"total_cents": {"type": "integer"}}}'
        )
        (HERE / "app.py").write_text(
            textwrap.dedent(
                f"""
                import os, psycopg
                from producer import InvalidEventError, OutboxEvent, emit
                with psycopg.connect(os.environ["DATABASE_URL"]) as conn, conn.transaction():
                    emit(conn, OutboxEvent("order", "o-1", 1, "order.created",
                                           {{"total_cents": 1200}}, topic="{topic}"))
                    try:
                        emit(conn, OutboxEvent("order", "o-1", 2, "order.shipped", {{}}))
                    except InvalidEventError as exc:
                        assert "INORDER_PAYLOAD_SCHEMAS" in str(exc), exc
                    else:
                        raise SystemExit("a type without a schema was written")
                """
            )
        )
        run(str(BIN / "python"), "app.py", env=env, what="emit of an own type with a schema folder")
        project(url, topic, env)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    shadowed()


if __name__ == "__main__":
    main()
