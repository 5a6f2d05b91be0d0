"""Secured transports: every option reaches its library, what cannot work stops, risks warn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from pydantic import ValidationError

from schemas.runtime import logs, secrets
from schemas.runtime.config import describe
from schemas.runtime.kafka_settings import KafkaClientSettings
from schemas.runtime.urls import PostgresUrl, RedisUrl


class _Settings(KafkaClientSettings):
    database_url: PostgresUrl
    redis_url: RedisUrl


@pytest.fixture(autouse=True)
def base(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("PGSSLMODE", "PGSSLROOTCERT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "b1:9093")
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@127.0.0.1/db")
    yield
    secrets.forget_all()


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return path


def _problem() -> str:
    with pytest.raises(ValidationError) as caught:
        _Settings()
    return describe(caught.value, _Settings)


def test_oauthbearer_with_oidc_client_credentials_reaches_librdkafka(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OAUTHBEARER's endpoint, client, scope and CA become librdkafka's oidc method."""
    monkeypatch.setenv("INORDER_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("INORDER_KAFKA_SASL_MECHANISM", "OAUTHBEARER")
    monkeypatch.setenv("INORDER_KAFKA_OAUTH_TOKEN_ENDPOINT_URL", "https://idp/token")
    monkeypatch.setenv("INORDER_KAFKA_OAUTH_CLIENT_ID", "relay")
    monkeypatch.setenv("INORDER_KAFKA_OAUTH_CLIENT_SECRET", "oidc-x1")
    monkeypatch.setenv("INORDER_KAFKA_OAUTH_SCOPE", "kafka")
    monkeypatch.setenv("INORDER_KAFKA_OAUTH_CA_LOCATION", __file__)
    config = _Settings().kafka_config()
    assert config == {
        "bootstrap.servers": "b1:9093",
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
        "sasl.oauthbearer.client.id": "relay",
        "sasl.oauthbearer.client.secret": "oidc-x1",
        "sasl.oauthbearer.scope": "kafka",
        "https.ca.location": __file__,  # the token endpoint's CA, apart from the brokers'
    }
    assert secrets.redact("oidc-x1") == secrets.HIDDEN


def test_oauthbearer_without_its_credentials_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """OAUTHBEARER with part of the OIDC settings, or none and no extra config, stops start-up."""
    monkeypatch.setenv("INORDER_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("INORDER_KAFKA_SASL_MECHANISM", "OAUTHBEARER")
    assert "INORDER_KAFKA_OAUTH_CLIENT_SECRET" in _problem()
    monkeypatch.setenv("INORDER_KAFKA_OAUTH_CLIENT_ID", "relay")
    assert "INORDER_KAFKA_OAUTH_TOKEN_ENDPOINT_URL" in _problem()
    monkeypatch.delenv("INORDER_KAFKA_OAUTH_CLIENT_ID")
    monkeypatch.setenv("INORDER_KAFKA_EXTRA", json.dumps({"sasl.oauthbearer.config": "sub=x"}))
    assert _Settings().kafka_config()["sasl.oauthbearer.config"] == "sub=x"


def test_security_protocol_and_mechanism_may_come_from_the_extra_properties(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """security.protocol in INORDER_KAFKA_EXTRA is used unless the setting names one."""
    extra = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}
    monkeypatch.setenv("INORDER_KAFKA_EXTRA", json.dumps(extra))
    assert "INORDER_KAFKA_SASL_USERNAME" in _problem()
    extra |= {"sasl.username": "u", "sasl.password": "extra-pw-x1"}
    monkeypatch.setenv("INORDER_KAFKA_EXTRA", json.dumps(extra))
    assert _Settings().kafka_config()["security.protocol"] == "sasl_ssl"
    monkeypatch.setenv("INORDER_KAFKA_SECURITY_PROTOCOL", "SSL")
    assert _Settings().kafka_config()["security.protocol"] == "ssl"


def test_mtls_files_reach_librdkafka_and_must_exist(
    monkeypatch: pytest.MonkeyPatch, pem: Path, tmp_path: Path
) -> None:
    """A client certificate and key, a CA: passed on; a missing file or half a pair is named."""
    monkeypatch.setenv("INORDER_KAFKA_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("INORDER_KAFKA_SSL_CA_LOCATION", str(pem))
    monkeypatch.setenv("INORDER_KAFKA_SSL_CERTIFICATE_LOCATION", str(pem))
    assert "needs both" in _problem()
    monkeypatch.setenv("INORDER_KAFKA_SSL_KEY_LOCATION", str(tmp_path / "missing.key"))
    assert f"INORDER_KAFKA_SSL_KEY_LOCATION: no file at {tmp_path}" in _problem()
    monkeypatch.setenv("INORDER_KAFKA_SSL_KEY_LOCATION", str(pem))
    monkeypatch.setenv("INORDER_KAFKA_SSL_KEY_PASSWORD", "keypw-x1")
    config = _Settings().kafka_config()
    assert config["ssl.certificate.location"] == config["ssl.key.location"] == str(pem)
    assert config["ssl.key.password"] == "keypw-x1"
    monkeypatch.setenv("INORDER_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT")
    assert "set SSL or SASL_SSL" in _problem()


def test_sasl_plaintext_works_but_is_a_caution(monkeypatch: pytest.MonkeyPatch) -> None:
    """SASL_PLAINTEXT is accepted with one caution line; SASL_SSL has none."""
    monkeypatch.setenv("INORDER_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("INORDER_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("INORDER_KAFKA_SASL_USERNAME", "relay")
    monkeypatch.setenv("INORDER_KAFKA_SASL_PASSWORD", "pw-x1")
    (line,) = _Settings().cautions()
    assert "SASL_PLAINTEXT" in line
    assert "use SASL_SSL" in line
    monkeypatch.setenv("INORDER_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    assert _Settings().cautions() == []


@pytest.mark.parametrize(
    ("url", "cautioned"),
    [
        ("postgresql://u@db.example/x", True),
        ("postgresql://u@db.example/x?sslmode=require", True),
        ("postgresql://u@db.example/x?sslmode=verify-ca&sslrootcert={pem}", True),
        ("postgresql://u@db.example/x?sslmode=verify-full&sslrootcert={pem}", False),
        ("postgresql://u@127.0.0.1/x", False),
        ("postgresql://u@localhost/x?sslmode=disable", False),
        ("postgresql://u@[::1]:5432/x", False),
        ("postgresql://u@127.0.0.1,db.example/x", True),
        ("postgresql:///x?host=/var/run/postgresql", False),
    ],
)
def test_sslmode_short_of_verify_full_to_a_remote_server_is_a_caution(
    monkeypatch: pytest.MonkeyPatch, pem: Path, url: str, cautioned: bool
) -> None:
    """libpq's default (prefer) can be downgraded; only verify-full, or loopback, is quiet."""
    monkeypatch.setenv("DATABASE_URL", url.format(pem=pem))
    lines = _Settings().cautions()
    assert bool(lines) is cautioned
    assert all("set sslmode=verify-full" in line for line in lines)


def test_pgsslmode_from_the_environment_counts(monkeypatch: pytest.MonkeyPatch, pem: Path) -> None:
    """PGSSLMODE and PGSSLROOTCERT are what libpq would use when the URL is silent."""
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@db.example/x")
    monkeypatch.setenv("PGSSLMODE", "verify-full")
    monkeypatch.setenv("PGSSLROOTCERT", str(pem))
    assert _Settings().cautions() == []


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("postgresql://u@h/x?sslrootcert=/nonexistent/ca.pem", "sslrootcert: no file at"),
        ("postgresql://u@h/x?sslcert={pem}", "needs both sslcert and sslkey"),
        ("postgresql://u@h/x?sslmode=verify-full", "set sslrootcert=PATH"),
        ("postgresql://u@h/x?sslmode=verify-ca", "set sslrootcert=PATH"),
    ],
)
def test_postgres_tls_that_cannot_work_stops_start_up(
    monkeypatch: pytest.MonkeyPatch, pem: Path, tmp_path: Path, url: str, named: str
) -> None:
    """A certificate file that is not there, half a client pair, verify with no CA: named."""
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.postgresql/root.crt
    monkeypatch.setenv("DATABASE_URL", url.format(pem=pem))
    problem = _problem()
    assert problem.startswith("DATABASE_URL: ")
    assert named in problem
    assert "(value hidden)" in problem


@pytest.mark.parametrize(
    ("url", "cautioned"),
    [
        ("redis://:pw-x1@cache.example:6379/0", True),
        ("redis://user:pw-x1@10.0.0.5:6379,10.0.0.6:6379/0", True),
        ("rediss://user:pw-x1@cache.example:6379/0", False),
        ("redis://cache.example:6379/0", False),
        ("redis://user:pw-x1@127.0.0.1:6379/0", False),
    ],
)
def test_a_password_sent_to_a_remote_redis_in_clear_is_a_caution(
    monkeypatch: pytest.MonkeyPatch, url: str, cautioned: bool
) -> None:
    """redis:// with a password to a remote host warns; rediss:// or loopback does not."""
    monkeypatch.setenv("REDIS_URL", url)
    lines = _Settings().cautions()
    assert bool(lines) is cautioned
    assert all("rediss://" in line for line in lines)


def test_rediss_certificate_files_must_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rediss:// URL naming a CA file that is not there stops start-up naming it."""
    monkeypatch.setenv("REDIS_URL", "rediss://u:p@h:6380/0?ssl_ca_certs=/nonexistent/ca.pem")
    assert "ssl_ca_certs: no file at /nonexistent/ca.pem" in _problem()


def test_cautions_are_logged_once_each_at_start_up(capsys: pytest.CaptureFixture[str]) -> None:
    """configure logs each caution as one insecure_setting JSON line."""
    structlog.reset_defaults()
    logs.configure("INFO", ["first caution", "second caution"])
    try:
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    finally:
        structlog.reset_defaults()
    assert [(line["event"], line["detail"]) for line in lines] == [
        ("insecure_setting", "first caution"),
        ("insecure_setting", "second caution"),
    ]


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("rediss://u:pw-x1@cache.example:6380/0?ssl_cert_reqs=none", "ssl_cert_reqs=none"),
        ("rediss://u:pw-x1@cache.example:6380/0?ssl_cert_reqs=optional", "ssl_cert_reqs=optional"),
        ("rediss://u:pw-x1@cache.example:6380/0?ssl_check_hostname=false", "ssl_check_hostname"),
        ("rediss://u:pw-x1@cache.example:6380/0", None),
        ("rediss://u:pw-x1@cache.example:6380/0?ssl_cert_reqs=required", None),
        ("rediss://u:pw-x1@127.0.0.1:6380/0?ssl_cert_reqs=none", None),
    ],
)
def test_redis_tls_with_verification_off_is_a_caution(
    monkeypatch: pytest.MonkeyPatch, url: str, named: str | None
) -> None:
    """rediss:// that checks neither certificate nor name, to a remote host, says so once."""
    monkeypatch.setenv("REDIS_URL", url)
    lines = _Settings().cautions()
    assert len(lines) == (named is not None)
    assert all(named in line and "can be redirected" in line for line in lines)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        (
            {"INORDER_KAFKA_EXTRA": '{"enable.ssl.certificate.verification": "false"}'},
            "enable.ssl.certificate.verification=false",
        ),
        (
            {"INORDER_KAFKA_EXTRA": '{"ssl.endpoint.identification.algorithm": "none"}'},
            "ssl.endpoint.identification.algorithm=none",
        ),
        (
            {"INORDER_KAFKA_OAUTH_TOKEN_ENDPOINT_URL": "http://idp.example/token"},
            "INORDER_KAFKA_OAUTH_TOKEN_ENDPOINT_URL is http://",
        ),
        ({"INORDER_KAFKA_OAUTH_TOKEN_ENDPOINT_URL": "http://127.0.0.1:8080/token"}, None),
        ({"INORDER_KAFKA_OAUTH_TOKEN_ENDPOINT_URL": "https://idp.example/token"}, None),
        ({"INORDER_KAFKA_EXTRA": '{"enable.ssl.certificate.verification": "true"}'}, None),
    ],
)
def test_kafka_settings_that_turn_verification_off_are_a_caution(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: str | None
) -> None:
    """A broker certificate or name left unchecked, a token endpoint over http: one line."""
    monkeypatch.setenv("INORDER_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("INORDER_KAFKA_SASL_MECHANISM", "OAUTHBEARER")
    monkeypatch.setenv("INORDER_KAFKA_OAUTH_CLIENT_ID", "relay")
    monkeypatch.setenv("INORDER_KAFKA_OAUTH_CLIENT_SECRET", "secret-x1")
    monkeypatch.setenv("INORDER_KAFKA_OAUTH_TOKEN_ENDPOINT_URL", "https://idp.example/token")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    lines = _Settings().cautions()
    assert len(lines) == (named is not None), lines
    assert all(named in line for line in lines)
