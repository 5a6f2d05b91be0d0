"""The service URLs a process is given: ``DATABASE_URL`` and ``REDIS_URL``.

Each is read by its own library's parser inside the setting's validator, so what is
accepted is what the library will use. A password is registered as a secret before any
check, and no error shows the value. What cannot work (a reserved character left
unencoded, a certificate file that is not there) stops start-up naming the fix; what works
but can be read or altered on the way (``sslmode`` short of ``verify-full``, a password
sent to Redis unencrypted) is a caution, logged once at start-up.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from pydantic import AfterValidator, AliasChoices, Field, SecretStr
from redis.connection import parse_url

from schemas.runtime import secrets
from schemas.runtime.redis_client import seed_nodes

SAFE_SSLMODE = "verify-full"
_PG_FILES = ("sslrootcert", "sslcert", "sslkey", "sslcrl")


def loopback(host: str) -> bool:
    """Whether ``host`` never leaves the machine: a loopback address, localhost or a socket."""
    if not host or host.startswith("/") or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def postgres_parameters(url: str) -> dict[str, str]:
    """libpq's reading of ``url``, with the TLS variables libpq would add from the environment."""
    given = {name: str(value) for name, value in conninfo_to_dict(url).items()}
    for name, variable in (("sslmode", "PGSSLMODE"), ("sslrootcert", "PGSSLROOTCERT")):
        if name not in given and os.environ.get(variable):
            given[name] = os.environ[variable]
    return given


def check_postgres(url: str) -> None:
    """Refuse a ``postgresql://`` URL libpq would misread or that cannot connect as written."""
    secrets.register_url(url)
    if not url.startswith(("postgresql://", "postgres://")):
        raise ValueError("must be a postgresql:// URL, e.g. postgresql://user@host:5432/db")
    secrets.check_userinfo(url)
    try:
        given = postgres_parameters(url)  # libpq's own reading of it
    except psycopg.Error:
        raise ValueError(
            "not a URL libpq can read: a % must start a two-digit hex escape (%25 for %)"
        ) from None
    parts = urlsplit(url)
    if "," not in parts.netloc:  # one host: its port must be a number
        try:
            _ = parts.port
        except ValueError:
            raise ValueError("the port after host: must be a number from 1 to 65535") from None
    for name in _PG_FILES:
        if name in given and not Path(given[name]).expanduser().is_file():
            raise ValueError(f"{name}: no file at {given[name]}")
    if ("sslcert" in given) != ("sslkey" in given):
        raise ValueError("a client certificate needs both sslcert and sslkey")
    if given.get("sslmode", "").startswith("verify") and "sslrootcert" not in given:
        default = Path("~/.postgresql/root.crt").expanduser()
        if not default.is_file():
            raise ValueError(
                f"sslmode={given['sslmode']} needs the server's CA: set sslrootcert=PATH "
                "(or sslrootcert=system for the system's store)"
            )


def postgres_cautions(url: str) -> list[str]:
    """One line if the connection can be read or redirected on the way to a remote server."""
    given = postgres_parameters(url)
    hosts = given.get("host", "").split(",")
    mode = given.get("sslmode", "prefer")
    if mode == SAFE_SSLMODE or all(loopback(host) for host in hosts):
        return []
    return [
        f"DATABASE_URL: sslmode is {mode}, so the connection to PostgreSQL can be read or "
        f"redirected on the way; set sslmode={SAFE_SSLMODE} and sslrootcert"
    ]


def cautions(value: object) -> list[str]:
    """The cautions of any setting's value that is a PostgreSQL or Redis URL."""
    url = value.get_secret_value() if isinstance(value, SecretStr) else None
    if not isinstance(url, str):
        return []
    if url.startswith(("postgresql://", "postgres://")):
        return postgres_cautions(url)
    if url.startswith(("redis://", "rediss://")):
        return redis_cautions(url)
    return []


def _postgres_url(value: SecretStr) -> SecretStr:
    check_postgres(value.get_secret_value())
    return value


# The DATABASE_URL setting: a postgresql:// URL, kept secret in logs and reprs.
PostgresUrl = Annotated[
    SecretStr,
    AfterValidator(_postgres_url),
    Field(
        validation_alias=AliasChoices("DATABASE_URL", "INORDER_DATABASE_URL"),
        description="PostgreSQL, as a postgresql:// URL (libpq's parameters, sslmode ...)",
    ),
]


def _optional_postgres_url(value: SecretStr | None) -> SecretStr | None:
    return None if value is None else _postgres_url(value)


# A second PostgreSQL URL a program may be given (the producer's database), read and kept
# secret as DATABASE_URL is.
OptionalPostgresUrl = Annotated[SecretStr | None, AfterValidator(_optional_postgres_url)]


def check_redis(url: str) -> None:
    """Refuse a ``redis://`` or ``rediss://`` URL redis-py would misread."""
    secrets.register_url(url)
    if not url.startswith(("redis://", "rediss://")):
        raise ValueError(
            "must be a redis:// or rediss:// URL, e.g. redis://host:6379/0, or for a cluster "
            "redis://host1:7000,host2:7000"
        )
    secrets.check_userinfo(url)
    try:
        first, _ = seed_nodes(url)
        options = parse_url(first)  # type: ignore[no-untyped-call]  # redis-py's own reading
    except ValueError:
        raise ValueError(
            "not a URL Redis's client can read: each node must be host:port with a numeric "
            "port, and the database a number"
        ) from None
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        path = options.get(name)
        if path and not Path(path).is_file():
            raise ValueError(f"{name}: no file at {path}")


def redis_cautions(url: str) -> list[str]:
    """One line if a password goes to a remote Redis unencrypted, or if TLS is asked for
    with the server's certificate or name left unchecked."""
    first, nodes = seed_nodes(url)
    if all(loopback(host) for host, _ in nodes):
        return []
    if url.startswith("rediss://"):
        options = parse_url(first)  # type: ignore[no-untyped-call]
        unchecked = []
        if str(options.get("ssl_cert_reqs", "required")).lower() in ("none", "optional"):
            unchecked.append(f"ssl_cert_reqs={options['ssl_cert_reqs']}")
        if options.get("ssl_check_hostname") is False:
            unchecked.append("ssl_check_hostname=false")
        if not unchecked:
            return []
        return [
            f"REDIS_URL: {' and '.join(unchecked)} turns off checking whom the TLS connection "
            "reaches, so it can be redirected on the way; drop it (and set ssl_ca_certs)"
        ]
    if not secrets.url_password(url):
        return []
    return [
        "REDIS_URL: redis:// sends the password and every parked event unencrypted; "
        "use rediss:// (TLS)"
    ]


def _redis_url(value: SecretStr | None) -> SecretStr | None:
    if value is not None:
        check_redis(value.get_secret_value())
    return value


# The REDIS_URL setting, kept secret (it may hold a password).
RedisUrl = Annotated[
    SecretStr | None,
    AfterValidator(_redis_url),
    Field(
        default=None,
        validation_alias=AliasChoices("REDIS_URL", "INORDER_REDIS_URL"),
        description="Where parked events live: one Redis or a Redis Cluster (any node, or "
        "several separated by commas); required when the routes file has a step route",
    ),
]
