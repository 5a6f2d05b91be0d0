"""The secured local stack as the tests see it: each principal's URLs and passwords, and
clients of the servers' administrators (Kafka and Redis ``inorder-super``, PostgreSQL's
superuser through its private socket)."""

from __future__ import annotations

import os
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg
import redis
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from schemas.security import Acl

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "deploy" / "local" / "stack"


def cluster_mode() -> bool:
    """Whether the tests run on the secured cluster (``make test-secure-cluster``)."""
    return os.environ.get("INORDER_SECURE_CLUSTER") == "1"


def secure_env() -> dict[str, str]:
    """What ``stack env --secure`` (with ``--cluster`` in the cluster mode) exports."""
    mode = ["--cluster", "--secure"] if cluster_mode() else ["--secure"]
    out = subprocess.run(
        [str(STACK), "env", *mode], capture_output=True, text=True, check=True
    ).stdout
    found = {}
    for line in out.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        found[name] = shlex.split(value)[0] if value else ""
    return found


@dataclass(frozen=True)
class Secured:
    """One test's view of the secured stack, in a PostgreSQL schema of its own."""

    env: dict[str, str]
    schema: str

    def database_url(self, principal: str) -> str:
        """The principal's URL, with the test's schema first on its search path."""
        url = self.env[f"INORDER_SECURE_DATABASE_URL_{principal.upper()}"]
        return f"{url}&options={quote(f'-c search_path={self.schema}', safe='')}"

    def redis_url(self, principal: str) -> str:
        """The principal's rediss:// URL."""
        return self.env[f"INORDER_SECURE_REDIS_URL_{principal.upper()}"]

    def kafka(self, principal: str) -> dict[str, str]:
        """The principal's Kafka settings, as the programs read them."""
        return {
            "KAFKA_BOOTSTRAP_SERVERS": self.env["INORDER_SECURE_KAFKA_BOOTSTRAP"],
            "INORDER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "INORDER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "INORDER_KAFKA_SASL_USERNAME": self.env[
                f"INORDER_SECURE_KAFKA_USER_{principal.upper()}"
            ],
            "INORDER_KAFKA_SASL_PASSWORD": self.env[
                f"INORDER_SECURE_KAFKA_PASSWORD_{principal.upper()}"
            ],
            "INORDER_KAFKA_SSL_CA_LOCATION": self.env["INORDER_SECURE_CA"],
        }

    def kafka_oauth(self, principal: str, secret: str | None = None) -> dict[str, str]:
        """The principal's Kafka settings for the OAUTHBEARER listener: OIDC client
        credentials (its password as the client secret, unless ``secret``)."""
        return {
            "KAFKA_BOOTSTRAP_SERVERS": self.env["INORDER_SECURE_KAFKA_OAUTH_BOOTSTRAP"],
            "INORDER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "INORDER_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
            "INORDER_KAFKA_OAUTH_TOKEN_ENDPOINT_URL": self.env["INORDER_SECURE_OIDC_TOKEN_URL"],
            "INORDER_KAFKA_OAUTH_CLIENT_ID": f"inorder-{principal}",
            "INORDER_KAFKA_OAUTH_CLIENT_SECRET": secret
            or self.env[f"INORDER_SECURE_KAFKA_PASSWORD_{principal.upper()}"],
            "INORDER_KAFKA_OAUTH_CA_LOCATION": self.env["INORDER_SECURE_CA"],
            "INORDER_KAFKA_SSL_CA_LOCATION": self.env["INORDER_SECURE_CA"],
        }

    def kafka_config(self, principal: str) -> dict[str, str]:
        """librdkafka properties of the principal."""
        given = self.kafka(principal)
        return {
            "bootstrap.servers": given["KAFKA_BOOTSTRAP_SERVERS"],
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": given["INORDER_KAFKA_SASL_USERNAME"],
            "sasl.password": given["INORDER_KAFKA_SASL_PASSWORD"],
            "ssl.ca.location": given["INORDER_KAFKA_SSL_CA_LOCATION"],
        }

    def kafka_admin(self) -> AdminClient:
        """Kafka's administrator (topics, ACLs)."""
        return AdminClient(self.kafka_config("super"))

    def redis_nodes(self) -> list[tuple[int, redis.Redis]]:
        """Redis's administrator on each node (the one, or every node of the cluster)."""
        ports = self.env.get("INORDER_SECURE_REDIS_PORTS", self.env["INORDER_SECURE_REDIS_PORT"])
        url = self.redis_url("super")
        scheme, rest = url.split("://", 1)
        userinfo, _, hosts = rest.rpartition("@")
        tail = hosts.split("/", 1)[1]
        return [
            (int(port), redis.Redis.from_url(f"{scheme}://{userinfo}@127.0.0.1:{port}/{tail}"))
            for port in ports.split()
        ]

    @property
    def cluster(self) -> bool:
        """Whether this is the secured cluster."""
        return self.env.get("INORDER_SECURE_CLUSTER") == "1"

    def kafka_brokers(self) -> list[str]:
        """The brokers' node ids."""
        return self.env.get("INORDER_SECURE_KAFKA_BROKERS", "1").split()

    def superuser(self) -> psycopg.Connection[tuple[object, ...]]:
        """PostgreSQL's superuser, through the private socket."""
        return psycopg.connect(
            host=self.env["INORDER_SECURE_PG_SOCKET"],
            port=self.env["INORDER_SECURE_PG_PORT"],
            user="postgres",
            dbname="inorder",
            autocommit=True,
        )

    def owner(self) -> psycopg.Connection[tuple[object, ...]]:
        """The tables' owner, over TLS."""
        return psycopg.connect(self.database_url("owner"), autocommit=True)


@contextmanager
def secured() -> Iterator[Secured]:
    """A schema of the test's own, made and dropped by the owner."""
    env = secure_env()
    schema = f"t_{uuid.uuid4().hex[:10]}"
    found = Secured(env, schema)
    with found.owner() as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield found
    finally:
        with found.owner() as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def create_topics(admin: AdminClient, names: list[str]) -> None:
    """Create each topic (3 partitions; 1 replica, or 3 on the cluster) and wait."""
    replicas = 3 if cluster_mode() else 1
    for future in admin.create_topics([NewTopic(n, 3, replicas) for n in names]).values():
        future.result(30)


_OPERATIONS = {
    "read": AclOperation.READ,
    "write": AclOperation.WRITE,
    "describe": AclOperation.DESCRIBE,
    "describe_configs": AclOperation.DESCRIBE_CONFIGS,
    "idempotent_write": AclOperation.IDEMPOTENT_WRITE,
}
_RESOURCES = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP}
_RESOURCES["cluster"] = ResourceType.BROKER


def binding(acl: Acl) -> AclBinding:
    """The confluent-kafka binding of one ACL."""
    return AclBinding(
        _RESOURCES[acl.resource],
        acl.name,
        ResourcePatternType.PREFIXED if acl.prefixed else ResourcePatternType.LITERAL,
        acl.principal,
        "*",
        _OPERATIONS[acl.operation],
        AclPermissionType.ALLOW,
    )


def apply_acls(admin: AdminClient, acls: list[Acl]) -> list[AclBinding]:
    """Create every binding; return them, to delete afterwards."""
    bindings = [binding(acl) for acl in acls]
    for future in admin.create_acls(bindings).values():
        future.result(30)
    return bindings


def delete_acls(admin: AdminClient, bindings: list[AclBinding]) -> None:
    """Delete the bindings ``apply_acls`` made."""
    filters = [
        AclBindingFilter(
            b.restype,
            b.name,
            b.resource_pattern_type,
            b.principal,
            b.host,
            b.operation,
            b.permission_type,
        )
        for b in bindings
    ]
    for future in admin.delete_acls(filters).values():
        future.result(30)


def program_env(
    secured: Secured, principal: str, *, oauth: bool = False, **settings: str
) -> dict[str, str]:
    """A program's environment: its own PostgreSQL, Redis and Kafka credentials (SCRAM, or
    with ``oauth`` OIDC client credentials on the OAUTHBEARER listener)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INORDER_", "PG"))}
    env.update(secured.kafka_oauth(principal) if oauth else secured.kafka(principal))
    env["DATABASE_URL"] = secured.database_url(principal)
    if f"INORDER_SECURE_REDIS_URL_{principal.upper()}" in secured.env:
        env["REDIS_URL"] = secured.redis_url(principal)
    env["PYTHONPATH"] = str(ROOT)
    env.update(settings)
    return env
