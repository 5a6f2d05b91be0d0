"""Secrets never printed: URLs refused without their values, every registered value redacted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import quote, unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict
from redis.connection import parse_url

from consumer.settings import SweeperSettings
from schemas.runtime import process, secrets
from schemas.runtime.config import load_or_exit

# Made-up passwords with every character a URL reserves, not credentials of anything.
NASTY = ["pa%ss-x1", "pa/ss-x2", "pa#ss-x3", "pa@ss-x4", "pa?ss-x5", "p%2/#@?:[]-x6", "sp ace-x7"]
BASE = {
    "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
    "INORDER_ROUTES_FILE": "routes.toml",
    "DATABASE_URL": "postgresql://inorder@127.0.0.1:5432/inorder",
    "REDIS_URL": "redis://127.0.0.1:6379/0",
}


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    secrets.forget_all()
    yield
    secrets.forget_all()


def _load(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], **env: str) -> str:
    for name, value in {**BASE, **env}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as stopped:
        load_or_exit(SweeperSettings, "inorder-sweeper")
    assert stopped.value.code == 2
    return capsys.readouterr().err


def _pieces(password: str) -> set[str]:
    """The parts a misparsed URL could show: the password split at each reserved character."""
    pieces = {password}
    for mark in "%/#@?: []":
        pieces |= {part for part in password.split(mark) if len(part) >= 3}
    return pieces


@pytest.mark.parametrize("password", NASTY)
@pytest.mark.parametrize(
    ("variable", "template"),
    [
        ("DATABASE_URL", "postgresql://svc:{}@127.0.0.1:5432/inorder"),
        ("REDIS_URL", "redis://svc:{}@127.0.0.1:6379/0"),
        ("REDIS_URL", "redis://svc:{}@127.0.0.1:7001,127.0.0.1:7002/0"),
    ],
)
def test_an_unencoded_password_stops_start_up_in_one_line_without_it(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    password: str,
    variable: str,
    template: str,
) -> None:
    """A reserved character in a URL's password: one line naming the variable, no piece of it."""
    err = _load(monkeypatch, capsys, **{variable: template.format(password)})
    assert err.count("\n") == 1
    assert err.startswith(f"inorder-sweeper: bad configuration: {variable}: ")
    assert "percent-encode" in err or "% must start" in err
    assert "(value hidden)" in err
    assert not [piece for piece in _pieces(password) if piece in err]


@pytest.mark.parametrize("password", NASTY)
def test_an_encoded_password_is_read_back_whole_by_each_library(password: str) -> None:
    """Percent-encoded, any password passes the check and libpq and redis-py decode it whole."""
    encoded = quote(password, safe="")
    pg = f"postgresql://svc:{encoded}@127.0.0.1:5432/inorder"
    rd = f"redis://svc:{encoded}@127.0.0.1:6379/0"
    secrets.check_userinfo(pg)
    secrets.check_userinfo(rd)
    assert conninfo_to_dict(pg)["password"] == password
    assert parse_url(rd)["password"] == password  # type: ignore[no-untyped-call]


@given(st.text(min_size=1, max_size=40))
def test_any_password_encoded_passes_and_its_raw_form_is_found(password: str) -> None:
    """Fuzz: quote() makes every text a valid userinfo, and url_password finds it as written."""
    encoded = quote(password, safe="")
    url = f"redis://user:{encoded}@host:6379/0"
    secrets.check_userinfo(url)
    assert secrets.url_password(url) == encoded
    assert unquote(encoded) == password


@pytest.mark.parametrize("password", NASTY)
def test_every_form_of_a_registered_password_is_redacted(password: str) -> None:
    """As written, encoded and decoded: each is replaced in any text, the longest first."""
    secrets.register_url(f"postgresql://svc:{quote(password, safe='')}@h/db")
    for form in (password, quote(password, safe="")):
        assert secrets.redact(f"error near {form}!") == f"error near {secrets.HIDDEN}!"


def test_log_lines_are_redacted_in_every_field() -> None:
    """The processor hides a secret in the event, in nested fields and in an exception."""
    secrets.register("hunter2-x9")
    event = {
        "event": "failed with hunter2-x9",
        "nested": {"list": ["a hunter2-x9 b"]},
        "exc": ValueError("bad hunter2-x9"),
        "count": 3,
    }
    out = secrets.processor(None, "error", event)
    assert "hunter2-x9" not in json.dumps(out)
    assert out["count"] == 3


def test_the_secret_librdkafka_properties_are_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """sasl.password, OAUTHBEARER secrets and key passwords given as extra properties are hidden."""
    for name, value in BASE.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("INORDER_KAFKA_SASL_PASSWORD", "sasl-pw-x1")
    monkeypatch.setenv(
        "INORDER_KAFKA_EXTRA",
        json.dumps(
            {
                "sasl.oauthbearer.client.secret": "oauth-x2",
                "ssl.key.password": "keypw-x3",
                "client.id": "not-secret",
            }
        ),
    )
    load_or_exit(SweeperSettings, "inorder-sweeper")
    text = secrets.redact("sasl-pw-x1 oauth-x2 keypw-x3 not-secret")
    assert text == " ".join([secrets.HIDDEN] * 3 + ["not-secret"])


UNCAUGHT = """
import threading
from schemas.runtime import logs
from schemas.runtime.config import load_or_exit
from consumer.settings import SweeperSettings
import structlog
logs.configure()
settings = load_or_exit(SweeperSettings, "inorder-sweeper")
structlog.get_logger("t").error("boom", url=settings.redis_url.get_secret_value())
def fail():
    raise RuntimeError("thread saw " + settings.database_url.get_secret_value())
thread = threading.Thread(target=fail)
thread.start()
thread.join()
try:
    raise ValueError("bad " + settings.redis_url.get_secret_value())
except ValueError:
    structlog.get_logger("t").exception("caught")
raise RuntimeError("main saw " + settings.database_url.get_secret_value())
"""


@pytest.mark.parametrize("password", NASTY)
def test_uncaught_tracebacks_and_logged_exceptions_never_print_a_password(password: str) -> None:
    """A process that logs and dies with its URLs in the errors prints neither password."""
    encoded = quote(password, safe="")
    env = {
        **os.environ,
        **BASE,
        "DATABASE_URL": f"postgresql://svc:{encoded}@127.0.0.1:5432/inorder",
        "REDIS_URL": f"redis://svc:{encoded}@127.0.0.1:6379/0",
    }
    done = subprocess.run(
        [sys.executable, "-c", UNCAUGHT], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "main saw" in done.stderr
    assert "thread saw" in done.stderr
    assert '"caught"' in done.stderr
    assert password not in done.stderr
    assert encoded not in done.stderr


def test_a_line_a_program_stops_with_hides_every_registered_secret(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """process.fail writes its lines redacted, whatever a caller put in them."""
    secrets.register("s3cr%t/pa#ss")
    with pytest.raises(SystemExit) as stopped:
        process.fail(
            "inorder-test", ["cannot connect as app:s3cr%t/pa#ss@db", "s3cr%25t%2Fpa%23ss"]
        )
    err = capsys.readouterr().err
    assert stopped.value.code == 2
    assert "s3cr" not in err
    assert err.count(secrets.HIDDEN) == 2
