"""How every program reaches Kafka: addresses and every security option librdkafka takes.

SASL is PLAIN, SCRAM or OAUTHBEARER (OIDC client credentials, or anything librdkafka reads
from ``INORDER_KAFKA_EXTRA``); TLS may present a client certificate (mTLS) and trust a CA
file. What cannot work stops start-up naming the fix; what works but exposes a secret on
the wire is named by ``cautions``, logged once at start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, SecretStr, model_validator

from schemas.runtime.config import InorderSettings
from schemas.runtime.urls import loopback

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
GroupProtocol = Literal["classic", "consumer"]
# Properties of the classic group protocol that a consumer of the new one (KIP-848)
# refuses: the broker keeps the group's timeouts and assigns its partitions.
CLASSIC_ONLY = (
    "partition.assignment.strategy",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "group.protocol.type",
)
# What only a consumer in a group reads; a producer's configuration leaves them out.
GROUP_PROPERTIES = ("group.protocol", "group.remote.assignor")
Mechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


class KafkaClientSettings(InorderSettings):
    """How to reach Kafka, including the security options librdkafka takes."""

    kafka_bootstrap_servers: str = Field(
        validation_alias=AliasChoices("KAFKA_BOOTSTRAP_SERVERS", "INORDER_KAFKA_BOOTSTRAP_SERVERS"),
        min_length=1,
        description="Kafka brokers, host:port[,host:port...]",
    )
    kafka_security_protocol: Protocol | None = Field(
        default=None,
        description="librdkafka `security.protocol`; unset: what INORDER_KAFKA_EXTRA says, "
        "else PLAINTEXT",
    )
    kafka_sasl_mechanism: Mechanism | None = Field(
        default=None, description="librdkafka `sasl.mechanism`; needed with SASL"
    )
    kafka_sasl_username: str | None = Field(default=None, description="PLAIN and SCRAM")
    kafka_sasl_password: SecretStr | None = Field(default=None, description="PLAIN and SCRAM")
    kafka_oauth_token_endpoint_url: str | None = Field(
        default=None,
        description="OAUTHBEARER: the OIDC token endpoint (client credentials grant)",
    )
    kafka_oauth_client_id: str | None = Field(default=None, description="OAUTHBEARER: client id")
    kafka_oauth_client_secret: SecretStr | None = Field(
        default=None, description="OAUTHBEARER: client secret"
    )
    kafka_oauth_scope: str | None = Field(default=None, description="OAUTHBEARER: scope, if any")
    kafka_oauth_ca_location: str | None = Field(
        default=None,
        description="OAUTHBEARER: CA bundle for the token endpoint's HTTPS when the system "
        "store lacks its CA",
    )
    kafka_ssl_ca_location: str | None = Field(
        default=None,
        description="CA bundle for SSL and SASL_SSL when the system store lacks the broker's CA",
    )
    kafka_ssl_certificate_location: str | None = Field(
        default=None, description="mTLS: this client's certificate (PEM)"
    )
    kafka_ssl_key_location: str | None = Field(
        default=None, description="mTLS: this client's private key (PEM)"
    )
    kafka_ssl_key_password: SecretStr | None = Field(
        default=None, description="mTLS: the private key's password, if it has one"
    )
    kafka_group_protocol: GroupProtocol | None = Field(
        default=None,
        description="librdkafka `group.protocol` of every consumer group: `classic`, or "
        "`consumer` (KIP-848, Kafka 4); unset: what INORDER_KAFKA_EXTRA says, else classic",
    )
    kafka_group_remote_assignor: Literal["uniform", "range"] | None = Field(
        default=None,
        description="With the `consumer` group protocol: the broker's assignor "
        "(`group.remote.assignor`); unset: the broker's default",
    )
    # Hidden in error messages: it may hold credentials (sasl.oauthbearer.config ...).
    kafka_extra: dict[str, str] = Field(
        default_factory=dict,
        json_schema_extra={"secret": True},
        description="Any other librdkafka property, as a JSON object; the settings above win",
    )

    @property
    def protocol(self) -> str:
        """The security protocol in force: the setting, else the extra property, else plain."""
        chosen = self.kafka_security_protocol or self.kafka_extra.get("security.protocol")
        return (chosen or "PLAINTEXT").upper()

    @property
    def mechanism(self) -> str | None:
        """The SASL mechanism in force: the setting, else the extra property."""
        chosen = self.kafka_sasl_mechanism or self.kafka_extra.get("sasl.mechanism")
        return chosen.upper() if chosen else None

    @property
    def group_protocol(self) -> str:
        """The group protocol in force: the setting, else the extra property, else classic."""
        chosen = self.kafka_group_protocol or self.kafka_extra.get("group.protocol")
        return (chosen or "classic").lower()

    def group_config(self, assignor: str | None) -> dict[str, str]:
        """The group protocol's properties; ``assignor``: the classic protocol's client-side one."""
        if self.group_protocol == "classic":
            return {"partition.assignment.strategy": assignor} if assignor else {}
        config = {"group.protocol": "consumer"}
        remote = self.kafka_group_remote_assignor or self.kafka_extra.get("group.remote.assignor")
        if remote:
            config["group.remote.assignor"] = remote
        return config

    @model_validator(mode="after")
    def _security_can_work(self) -> Self:
        problems = [*self._sasl_problems(), *self._tls_problems(), *self._group_problems()]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _sasl_problems(self) -> list[str]:
        if not self.protocol.startswith("SASL"):
            return []
        mechanism = self.mechanism
        if mechanism is None:
            return [
                f"INORDER_KAFKA_SECURITY_PROTOCOL is {self.protocol}: set "
                "INORDER_KAFKA_SASL_MECHANISM (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER)"
            ]
        if mechanism == "OAUTHBEARER":
            oidc = (self.kafka_oauth_token_endpoint_url, self.kafka_oauth_client_id)
            given = any(oidc) or self.kafka_oauth_client_secret is not None
            complete = all(oidc) and self.kafka_oauth_client_secret is not None
            unsecured = "sasl.oauthbearer.config" in self.kafka_extra or (
                self.kafka_extra.get("sasl.oauthbearer.method", "").lower() == "oidc"
            )
            if (given and not complete) or not (complete or unsecured):
                return [
                    "SASL OAUTHBEARER: set INORDER_KAFKA_OAUTH_TOKEN_ENDPOINT_URL, "
                    "INORDER_KAFKA_OAUTH_CLIENT_ID and INORDER_KAFKA_OAUTH_CLIENT_SECRET"
                ]
            return []
        has_user = self.kafka_sasl_username or "sasl.username" in self.kafka_extra
        has_password = self.kafka_sasl_password or "sasl.password" in self.kafka_extra
        if not (has_user and has_password):
            return [
                f"SASL {mechanism}: set INORDER_KAFKA_SASL_USERNAME and INORDER_KAFKA_SASL_PASSWORD"
            ]
        return []

    def classic_only(self) -> list[str]:
        """The classic group protocol's properties INORDER_KAFKA_EXTRA sets (``CLASSIC_ONLY``)."""
        return [name for name in CLASSIC_ONLY if name in self.kafka_extra]

    def _group_problems(self) -> list[str]:
        protocol = self.group_protocol
        if protocol not in ("classic", "consumer"):
            return [
                f"group.protocol {protocol!r}: set INORDER_KAFKA_GROUP_PROTOCOL to "
                "classic or consumer"
            ]
        if protocol == "classic":
            if self.kafka_group_remote_assignor:
                return [
                    "INORDER_KAFKA_GROUP_REMOTE_ASSIGNOR needs the consumer group protocol: "
                    "set INORDER_KAFKA_GROUP_PROTOCOL=consumer or unset it"
                ]
            return []
        refused = self.classic_only()
        if refused:
            return [
                f"INORDER_KAFKA_EXTRA sets {', '.join(refused)}, which the consumer group "
                "protocol does not take (the broker keeps the group's timeouts and "
                "assignment): remove it, or use the classic protocol"
            ]
        return []

    def _tls_problems(self) -> list[str]:
        problems = []
        files = {
            "INORDER_KAFKA_SSL_CA_LOCATION": self.kafka_ssl_ca_location,
            "INORDER_KAFKA_OAUTH_CA_LOCATION": self.kafka_oauth_ca_location,
            "INORDER_KAFKA_SSL_CERTIFICATE_LOCATION": self.kafka_ssl_certificate_location,
            "INORDER_KAFKA_SSL_KEY_LOCATION": self.kafka_ssl_key_location,
        }
        for variable, path in files.items():
            if path and not Path(path).is_file():
                problems.append(f"{variable}: no file at {path}")
        if bool(self.kafka_ssl_certificate_location) != bool(self.kafka_ssl_key_location):
            problems.append(
                "mTLS needs both INORDER_KAFKA_SSL_CERTIFICATE_LOCATION and "
                "INORDER_KAFKA_SSL_KEY_LOCATION"
            )
        tls_files = any(files.values())
        if tls_files and not self.protocol.endswith("SSL"):
            problems.append(
                f"TLS files are set but INORDER_KAFKA_SECURITY_PROTOCOL is {self.protocol}: "
                "set SSL or SASL_SSL"
            )
        return problems

    def cautions(self) -> list[str]:
        """What works but is unsafe on a network: one line each, logged at start-up."""
        lines = super().cautions()
        if self.protocol == "SASL_PLAINTEXT":
            lines.append(
                "INORDER_KAFKA_SECURITY_PROTOCOL is SASL_PLAINTEXT: the SASL exchange and every "
                "event cross the network unencrypted; use SASL_SSL"
            )
        extra = {k: v.strip().lower() for k, v in self.kafka_extra.items()}
        if extra.get("enable.ssl.certificate.verification") in ("false", "0"):
            lines.append(
                "INORDER_KAFKA_EXTRA: enable.ssl.certificate.verification=false accepts any "
                "broker certificate, so the connection can be redirected on the way; drop it "
                "and set INORDER_KAFKA_SSL_CA_LOCATION"
            )
        if extra.get("ssl.endpoint.identification.algorithm") == "none":
            lines.append(
                "INORDER_KAFKA_EXTRA: ssl.endpoint.identification.algorithm=none accepts a "
                "certificate issued for any name; drop it (the default checks the broker's name)"
            )
        endpoint = self.kafka_oauth_token_endpoint_url or ""
        host = urlsplit(endpoint).hostname or ""
        if endpoint.lower().startswith("http://") and not loopback(host):
            lines.append(
                "INORDER_KAFKA_OAUTH_TOKEN_ENDPOINT_URL is http://: the client secret and the "
                "tokens cross the network unencrypted; use https://"
            )
        return lines

    def kafka_config(self) -> dict[str, str]:
        """librdkafka properties for any client of this cluster."""
        config = {k: v for k, v in self.kafka_extra.items() if k not in GROUP_PROPERTIES}
        config["bootstrap.servers"] = self.kafka_bootstrap_servers
        config["security.protocol"] = self.protocol.lower()
        if self.kafka_sasl_mechanism:
            config["sasl.mechanism"] = self.kafka_sasl_mechanism
        if self.kafka_sasl_username:
            config["sasl.username"] = self.kafka_sasl_username
        if self.kafka_sasl_password:
            config["sasl.password"] = self.kafka_sasl_password.get_secret_value()
        if self.kafka_oauth_token_endpoint_url:
            config["sasl.oauthbearer.method"] = "oidc"
            config["sasl.oauthbearer.token.endpoint.url"] = self.kafka_oauth_token_endpoint_url
        if self.kafka_oauth_client_id:
            config["sasl.oauthbearer.client.id"] = self.kafka_oauth_client_id
        if self.kafka_oauth_client_secret:
            secret = self.kafka_oauth_client_secret.get_secret_value()
            config["sasl.oauthbearer.client.secret"] = secret
        if self.kafka_oauth_scope:
            config["sasl.oauthbearer.scope"] = self.kafka_oauth_scope
        optional = {
            "ssl.ca.location": self.kafka_ssl_ca_location,
            "ssl.certificate.location": self.kafka_ssl_certificate_location,
            "ssl.key.location": self.kafka_ssl_key_location,
            "https.ca.location": self.kafka_oauth_ca_location,
        }
        config.update({name: value for name, value in optional.items() if value})
        if self.kafka_ssl_key_password:
            config["ssl.key.password"] = self.kafka_ssl_key_password.get_secret_value()
        return config
