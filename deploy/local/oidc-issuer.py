#!/usr/bin/env python3
"""The secured stack's OIDC token issuer: the client credentials grant, over HTTPS.

What Kafka's OAUTHBEARER listener needs from an identity provider, and no more: each
program's client id and secret (the stack's credentials) buy an RS256 access token whose
``sub`` is the client id, so Kafka's ACLs for ``User:<client id>`` apply as they do to the
SCRAM principals. The signing key's public half is written as a JWKS file, which the
broker reads (``sasl.oauthbearer.jwks.endpoint.url=file:...``), and is served at
``/jwks`` beside ``/.well-known/openid-configuration``.

Runs on Debian's python3 with its python3-jwt and python3-cryptography packages;
deploy/local/secure.sh starts it (``stack up --secure``).
"""

from __future__ import annotations

import argparse
import base64
import hmac
import json
import ssl
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote

import jwt
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from jwt.algorithms import RSAAlgorithm

TOKEN_LIFETIME_S = 600


class Issuer:
    """Signs tokens for known clients; knows its public key set."""

    def __init__(self, key_file: Path, clients_file: Path, issuer: str, audience: str) -> None:
        self.key = load_pem_private_key(key_file.read_bytes(), password=None)
        self.kid = uuid.uuid5(uuid.NAMESPACE_URL, key_file.read_text()).hex[:16]
        self.issuer, self.audience = issuer, audience
        self.clients = {}
        for line in clients_file.read_text().splitlines():
            client, _, secret = line.partition("=")
            if client:
                self.clients[client] = secret

    def jwks(self) -> dict[str, object]:
        """The public key set."""
        key = json.loads(RSAAlgorithm.to_jwk(self.key.public_key()))
        key.update({"kid": self.kid, "use": "sig", "alg": "RS256"})
        return {"keys": [key]}

    def token(self, client: str, secret: str, scope: str) -> dict[str, object] | None:
        """An access token for ``client``, or None when its secret is not the one known."""
        known = self.clients.get(client)
        if known is None or not hmac.compare_digest(known.encode(), secret.encode()):
            return None
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": client,
            "aud": self.audience,
            "iat": now,
            "exp": now + TOKEN_LIFETIME_S,
            "jti": uuid.uuid4().hex,
        }
        if scope:  # only as asked: Kafka refuses an empty scope claim
            claims["scope"] = scope
        signed = jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": self.kid})
        return {"access_token": signed, "token_type": "Bearer", "expires_in": TOKEN_LIFETIME_S}


def handler(issuer: Issuer) -> type[BaseHTTPRequestHandler]:
    """The HTTP handler serving ``issuer``."""

    class Handler(BaseHTTPRequestHandler):
        # A client silent for this long is cut; each is served in a thread of its own, its
        # TLS handshake too, so one that never speaks holds up no other.
        timeout = 10

        def setup(self) -> None:
            super().setup()  # the socket's timeout is set here
            self.connection.do_handshake()

        def do_GET(self) -> None:
            if self.path == "/jwks":
                self._json(200, issuer.jwks())
            elif self.path == "/.well-known/openid-configuration":
                base = issuer.issuer
                self._json(
                    200,
                    {
                        "issuer": base,
                        "token_endpoint": f"{base}/token",
                        "jwks_uri": f"{base}/jwks",
                        "grant_types_supported": ["client_credentials"],
                        "token_endpoint_auth_methods_supported": [
                            "client_secret_basic",
                            "client_secret_post",
                        ],
                    },
                )
            else:
                self._json(404, {"error": "not_found"})

        def do_POST(self) -> None:
            if self.path != "/token":
                self._json(404, {"error": "not_found"})
                return
            length = min(int(self.headers.get("Content-Length") or 0), 65536)
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
            if form.get("grant_type") != "client_credentials":
                self._json(400, {"error": "unsupported_grant_type"})
                return
            client, secret = form.get("client_id", ""), form.get("client_secret", "")
            basic = self.headers.get("Authorization", "")
            answer = None
            if basic.startswith("Basic "):
                pair = base64.b64decode(basic[6:]).decode()
                client, _, secret = pair.partition(":")
                # RFC 6749 2.3.1 form-encodes both before Basic; some clients send them raw.
                answer = issuer.token(unquote(client), unquote(secret), form.get("scope", ""))
            answer = answer or issuer.token(client, secret, form.get("scope", ""))
            if answer is None:
                self.log_message("refused client %s", client[:64])
                self._json(401, {"error": "invalid_client"})
                return
            self.log_message("token for %s", client)
            self._json(200, answer)

        def _json(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

    return Handler


def main() -> None:
    """Write the JWKS file; then serve, unless --jwks-only."""
    args = argparse.ArgumentParser(description=__doc__)
    args.add_argument("--port", type=int, required=True)
    args.add_argument("--cert", type=Path, required=True, help="server certificate and key (PEM)")
    args.add_argument("--signing-key", type=Path, required=True, help="RSA private key (PEM)")
    args.add_argument("--clients", type=Path, required=True, help="client_id=secret lines")
    args.add_argument("--audience", default="kafka")
    args.add_argument("--jwks-out", type=Path, required=True)
    args.add_argument("--jwks-only", action="store_true")
    given = args.parse_args()
    issuer = Issuer(
        given.signing_key, given.clients, f"https://127.0.0.1:{given.port}", given.audience
    )
    given.jwks_out.write_text(json.dumps(issuer.jwks()))
    if given.jwks_only:
        return
    server = ThreadingHTTPServer(("127.0.0.1", given.port), handler(issuer))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(given.cert)
    # The handshake is each connection's own, in its thread (Handler.setup): made in the
    # accepting loop, one silent client would stop every other.
    server.socket = context.wrap_socket(
        server.socket, server_side=True, do_handshake_on_connect=False
    )
    sys.stderr.write(f"oidc issuer serving on https://127.0.0.1:{given.port}\n")
    sys.stderr.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
