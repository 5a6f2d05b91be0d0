"""Every setting that holds a secret, set at once to values with ``%``, ``/`` and ``#``:
no output of any program carries one, whether the program runs on them or refuses them.

The secret settings are read from each program's settings model, so a new one is covered
without a change here. The programs run against the local stack: PostgreSQL (which
trusts loopback, so a password in the URL is accepted and unused), Redis and Kafka (whose
plain listener refuses the SASL exchange the settings ask for, so the Kafka error paths
run too).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from consumer.settings import ConsumerSettings, SweeperSettings
from outbox_relay.settings import RelaySettings
from producer.settings import ProducerSettings
from producer.worker import WorkerSettings
from schemas.runtime.config import InorderSettings, secret_variables
from tests.conftest import PgSchema
from tests.integration import step_support as ss
from tests.integration import sweeper_support as sw
from tests.support import services as svc

ROOT = Path(__file__).resolve().parents[2]
# Made-up secrets, not credentials of anything: each setting gets its own.
SECRET = "Zq{n}Kp%/#wV{n}x"  # noqa: S105 - made up, for the test
# Secrets libraries read from the environment on their own.
ENVIRONMENT = {"PGPASSWORD": "env-pg", "OTEL_EXPORTER_OTLP_HEADERS": "env-otlp"}

SERVICES: dict[str, type[InorderSettings]] = {
    "inorder-consumer": ConsumerSettings,
    "inorder-sweeper": SweeperSettings,
    "inorder-relay": RelaySettings,
}
COMMANDS: list[tuple[str, type[InorderSettings], tuple[str, ...]]] = [
    ("inorder-admin", SweeperSettings, ("gaps", "list")),
    ("inorder-admin", SweeperSettings, ("explain", "ledger:e1")),
    ("inorder-admin", SweeperSettings, ("audit",)),
    ("inorder-producer", ProducerSettings, ("migrate",)),
    ("inorder-producer", WorkerSettings, ("worker", "worker")),
]


def _with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    user = parts.username or "inorder"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


def _secrets(
    cls: type[InorderSettings], services: svc.Services, schema: PgSchema, raw: str | None
) -> tuple[dict[str, str], list[str]]:
    """The environment setting every secret of ``cls``, and the secrets it holds.

    URLs point at the real services with the secret as password, percent-encoded (the
    program runs on them), but for the setting ``raw`` names, whose password is as
    written (the program refuses it).
    """
    env: dict[str, str] = {}
    held: list[str] = []
    for n, (field, variable) in enumerate(sorted(secret_variables(cls).items())):
        secret = SECRET.format(n=n)
        held.append(secret)
        password = secret if variable == raw else quote(secret, safe="")
        if field.endswith("database_url"):
            env[variable] = _with_password(schema.url, password)
        elif field == "redis_url":
            env[variable] = _with_password(services.redis_url, password)
        elif field == "kafka_extra":
            env[variable] = json.dumps({"sasl.oauthbearer.client.secret": secret})
        else:
            env[variable] = secret
    n = len(held)
    for variable, name in ENVIRONMENT.items():
        secret = f"{name}-" + SECRET.format(n=n)
        n += 1
        held.append(secret)
        env[variable] = f"authorization=Bearer {secret}" if "HEADERS" in variable else secret
    return env, held


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _environment(services: svc.Services, tmp: Path, **more: str) -> dict[str, str]:
    routes = tmp / "routes.toml"
    routes.write_text(ss.routes_text())
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("INORDER_", "PG", "OTEL_")) and k not in {"DATABASE_URL", "REDIS_URL"}
    }
    env.update(
        PYTHONPATH=str(ROOT),
        KAFKA_BOOTSTRAP_SERVERS=services.kafka_bootstrap,
        INORDER_ROUTES_FILE=str(routes),
        INORDER_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
        INORDER_KAFKA_SASL_MECHANISM="PLAIN",
        INORDER_KAFKA_SASL_USERNAME="someone",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{_free_port()}",
        INORDER_CREATE_TOPICS="false",
    )
    env.update(more)
    return env


def _get(port: int, path: str) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as response:
            return f"{response.status} {response.read().decode()}"
    except urllib.error.HTTPError as exc:
        return f"{exc.code} {exc.read().decode()}"
    except OSError as exc:
        return f"unreachable {exc}"


def _run_service(program: str, env: dict[str, str]) -> str:
    """Start the service, read its endpoints for a while, stop it: everything it said."""
    port = _free_port()
    process = subprocess.Popen(
        [sw.tool(program)],
        env={**env, "INORDER_HTTP_PORT": str(port)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    said: list[str] = []
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and process.poll() is None:
        time.sleep(1)
        said += [_get(port, path) for path in ("/readyz", "/healthz", "/metrics")]
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    return "\n".join([out, *said])


def _run_command(program: str, argv: tuple[str, ...], env: dict[str, str]) -> str:
    try:
        done = subprocess.run(
            [sw.tool(program), *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:  # a worker runs until stopped
        return f"{exc.stdout or ''}{exc.stderr or ''}"
    return done.stdout + done.stderr


def _shown(text: str, held: list[str]) -> list[str]:
    """Every secret that ``text`` carries: as written, percent-encoded, or a piece of it
    between the characters a URL reserves (a parser that splits it shows a piece)."""
    pieces = {
        piece
        for secret in held
        for piece in (secret, quote(secret, safe=""), *re.split(r"[%/#]", secret))
        if len(piece) >= 4  # every piece of SECRET is at least this long
    }
    return sorted(piece for piece in pieces if piece in text)


def _each_program() -> list[tuple[str, type[InorderSettings], Callable[[dict[str, str]], str]]]:
    runs: list[tuple[str, type[InorderSettings], Callable[[dict[str, str]], str]]] = [
        (p, cls, lambda env, p=p: _run_service(p, env)) for p, cls in SERVICES.items()
    ]
    runs += [
        (f"{p} {' '.join(argv)}", cls, lambda env, p=p, argv=argv: _run_command(p, argv, env))
        for p, cls, argv in COMMANDS
    ]
    return runs


def _cases() -> list[
    tuple[str, type[InorderSettings], Callable[[dict[str, str]], str], str | None]
]:
    """Each program with every password encoded, then with each URL's as written."""
    cases = []
    for name, cls, run in _each_program():
        urls = [v for f, v in sorted(secret_variables(cls).items()) if f.endswith("_url")]
        cases += [(name, cls, run, raw) for raw in (None, *urls)]
    return cases


CASES = _cases()


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("name", "cls", "run", "raw"),
    CASES,
    ids=[f"{c[0]}-{c[3] or 'encoded'}" for c in CASES],
)
def test_no_output_of_any_program_carries_a_secret(
    services: svc.Services,
    pg_schema: PgSchema,
    tmp_path: Path,
    name: str,
    cls: type[InorderSettings],
    run: Callable[[dict[str, str]], str],
    raw: str | None,
) -> None:
    """Logs, tracebacks, endpoints and command output hide every secret setting's value."""
    secret_env, held = _secrets(cls, services, pg_schema, raw)
    assert len(held) >= len(ENVIRONMENT) + 1
    said = run(_environment(services, tmp_path, **secret_env))
    assert said.strip(), name  # it ran and said something
    assert _shown(said, held) == [], said[-3000:]
    assert "Traceback" not in said, said[-3000:]
