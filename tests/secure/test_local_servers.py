"""The secured stack's own servers: each presents a certificate of its own, and the OIDC
issuer serves while a client that never speaks holds a connection."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import urllib.request
from urllib.parse import urlsplit

import pytest

from tests.secure import stack

pytestmark = [pytest.mark.secure, pytest.mark.timeout(120)]


def _subject(port: str, *starttls: str) -> str:
    """The subject of the certificate the server on ``port`` presents."""
    shown = subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", *starttls],
        input="",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    subject = subprocess.run(
        ["openssl", "x509", "-noout", "-subject"],
        input=shown.stdout,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return subject.stdout.strip().replace(" ", "")


def test_each_server_presents_a_certificate_of_its_own() -> None:
    """PostgreSQL, Redis, Kafka and the issuer: four names; only Kafka's is a super user."""
    env = stack.secure_env()
    oidc = str(urlsplit(env["INORDER_SECURE_OIDC_TOKEN_URL"]).port)
    subjects = {
        "postgres": _subject(env["INORDER_SECURE_PG_PORT"], "-starttls", "postgres"),
        "redis": _subject(env["INORDER_SECURE_REDIS_PORT"]),
        "kafka": _subject(env["INORDER_SECURE_KAFKA_PORT"]),
        "oidc": _subject(oidc),
    }
    assert subjects == {name: f"subject=CN=inorder-{name}" for name in subjects}


def test_the_issuer_serves_beside_a_client_that_never_speaks() -> None:
    """A TCP connection that never starts its TLS handshake holds up no token."""
    env = stack.secure_env()
    url = env["INORDER_SECURE_OIDC_TOKEN_URL"]
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname or "", parts.port or 443), timeout=5):
        context = ssl.create_default_context(cafile=env["INORDER_SECURE_CA"])
        request = urllib.request.Request(  # noqa: S310 - the stack's own https URL
            url,
            data=(
                "grant_type=client_credentials&client_id=inorder-relay&client_secret="
                + urllib.parse.quote(env["INORDER_SECURE_KAFKA_PASSWORD_RELAY"], safe="")
            ).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5, context=context) as response:  # noqa: S310
            assert response.status == 200
            answer = json.loads(response.read())
    assert answer["token_type"] == "Bearer"  # noqa: S105 - a token type, no secret
